"""experiments/gpu_check.py: a new host's checks fail on what is broken (tests/test_makefile.py
runs `make gpu-check` whole)."""

import pathlib
import re
import sys

import jax
import jax.numpy as jnp
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'experiments'))
import gpu_check  # noqa: E402


@pytest.mark.slow
def test_gpu_check_fails_what_is_broken(monkeypatch, capsys):
  """Fused attention that scales its output, and too few steps to learn: both fail, the
  checks that need the trained model not run, and exit status 1."""
  fused = jax.nn.dot_product_attention
  monkeypatch.setattr(jax.nn, 'dot_product_attention', lambda *a, **k: 1.5 * fused(*a, **k))
  assert gpu_check.main(['--steps', '10', '--fused-steps', '1']) == 1
  out = capsys.readouterr().out
  assert re.search(r'^fused attention == einsum\s+FAIL\s+AssertionError: rows of 64: relative', out,
                   flags=re.M)
  # A step from init is within the training row's 2% of einsum's loss even at 1.5x: that row
  # passes here (its failure: test_gpu_check_fails_non_finite_attention_gradients).
  assert re.search(r'^training, bfloat16 fast path\s+FAIL\s+AssertionError: loss', out, flags=re.M)
  assert re.search(r'^cached == uncached decoding\s+FAIL\s+not run', out, flags=re.M)
  assert '2 passed, 4 failed' in out


def test_gpu_check_fails_non_finite_attention_gradients(monkeypatch):
  """Fused attention whose outputs are right but whose gradients are NaN, as cuDNN's on packed
  rows of 64 were on an H100: the fused check fails."""
  fused = jax.nn.dot_product_attention

  def nan_gradients(q, *args, **kwargs):  # d/dq sqrt(0 * q) = inf * 0 = NaN; its value is 0
    return fused(q, *args, **kwargs) + jnp.sqrt(0 * q)
  monkeypatch.setattr(jax.nn, 'dot_product_attention', nan_gradients)
  with pytest.raises(AssertionError, match=r'rows of 64: relative error to float32: logits '
                     r'\S+ \(einsum .*gradients nan'):
    gpu_check.check_fused_attention()
  with pytest.raises(AssertionError, match=r'^rows of 64 \(XLA\): non-finite from step 1$'):
    gpu_check.check_fused_training(1, (64,))  # and training through it stops at once
