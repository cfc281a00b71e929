"""experiments/gpu_check.py (`make gpu-check`): it passes on this CPU, and its checks fail on
what is broken."""

import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'experiments'))
import gpu_check  # noqa: E402

from jaxformer import train  # noqa: E402

CPU_CFG = gpu_check.CPU_CFG  # the checks' model without a GPU: one layer


@pytest.mark.slow
def test_gpu_check_passes_on_cpu():
  """The whole check, as `make gpu-check` runs it, in a process with the tests' compile settings
  (at XLA's level 1 instead it took 12-17% more CPU: its compiles cost more than its steps), with
  200 bfloat16 training steps instead of 300: on this CPU the one-layer model's loss goes 3.85 ->
  0.79 in 200 (0.68 at level 1; the bound is half the first, 1.93)."""
  run = subprocess.run([sys.executable, str(ROOT / 'experiments' / 'gpu_check.py'),
                        '--steps', '200', '--fused-steps', '5'], capture_output=True, text=True,
                       timeout=900)
  assert run.returncode == 0, run.stderr[-3000:]
  out = run.stdout
  assert out.startswith('cpu: ') and 'no GPU: jax runs on cpu' in out and 'one-layer' in out
  rows = re.findall(r'^(.+?)\s{2,}(pass|FAIL)\s', out, flags=re.M)
  assert [name for name, _ in rows] == [
      'devices', 'fused attention == einsum', 'fused attention trains, packed rows',
      'training, bfloat16 fast path', 'cached == uncached decoding',
      'checkpoint save/restore/average']
  assert {result for _, result in rows} == {'pass'}
  assert '6 passed, 0 failed' in out


def test_the_table_fails_what_failed_and_skips_what_needs_it(monkeypatch, capsys):
  """A check that raises is a FAIL row with its error; the rows that need the trained model are
  not run; the exit status is 1 (the checks themselves fail on broken kernels below)."""
  def broken(message):
    def check(*args):
      raise AssertionError(message)
    return check
  monkeypatch.setattr(gpu_check, 'check_fused_attention', broken('rows of 64: relative error'))
  monkeypatch.setattr(gpu_check, 'check_fused_training', lambda *args: 'rows of 64 trained')
  monkeypatch.setattr(gpu_check, 'check_training', broken('loss 3.67 -> 3.60 in 10 steps'))
  for name in ('check_decoding', 'check_checkpoints'):
    monkeypatch.setattr(gpu_check, name, broken('must not run without a trained model'))
  assert gpu_check.main(['--steps', '10']) == 1
  out = capsys.readouterr().out
  assert re.search(r'^fused attention == einsum\s+FAIL\s+AssertionError: rows of 64: relative', out,
                   flags=re.M)
  assert re.search(r'^fused attention trains, packed rows\s+pass\s+rows of 64 trained', out,
                   flags=re.M)
  assert re.search(r'^training, bfloat16 fast path\s+FAIL\s+AssertionError: loss', out, flags=re.M)
  assert re.search(r'^cached == uncached decoding\s+FAIL\s+not run: training failed', out,
                   flags=re.M)
  assert '2 passed, 4 failed' in out


@pytest.mark.slow
def test_gpu_check_fails_attention_that_scales_its_output_and_too_little_training(monkeypatch):
  fused = jax.nn.dot_product_attention
  monkeypatch.setattr(jax.nn, 'dot_product_attention', lambda *a, **k: 1.5 * fused(*a, **k))
  with pytest.raises(AssertionError, match=r'^rows of 64: relative error to float32: logits'):
    gpu_check.check_fused_attention((64,), CPU_CFG)
  monkeypatch.undo()
  with pytest.raises(AssertionError, match=r'^loss \S+ -> \S+ in 2 steps'):
    gpu_check.check_training(2, CPU_CFG)  # (bfloat16 steps, the tests' compile settings: 0.7 s)


def test_gpu_check_fails_non_finite_attention_gradients(monkeypatch):
  """Fused attention whose outputs are right but whose gradients are NaN, as cuDNN's on packed
  rows of 64 were on an H100: the fused check fails."""
  fused = jax.nn.dot_product_attention

  def nan_gradients(q, *args, **kwargs):  # d/dq sqrt(0 * q) = inf * 0 = NaN; its value is 0
    return fused(q, *args, **kwargs) + jnp.sqrt(0 * q)
  monkeypatch.setattr(jax.nn, 'dot_product_attention', nan_gradients)
  with pytest.raises(AssertionError, match=r'rows of 64: relative error to float32: logits '
                     r'\S+ \(einsum .*gradients nan'):
    gpu_check.check_fused_attention((64,), CPU_CFG)
  models, step = [], train.train_step  # the attention of each model the check trains
  monkeypatch.setattr(train, 'train_step', lambda *args, config, **kwargs: models.append(
      config.execution.attention) or step(*args, config=config, **kwargs))
  with pytest.raises(AssertionError, match=r'^rows of 64 \(XLA\): non-finite from step 1$'):
    gpu_check.check_fused_training(1, (64,), CPU_CFG)  # and training through it stops at once
  assert models == ['fused']  # einsum, the comparison, is not trained for a failed width
