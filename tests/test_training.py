"""The training loop: resume, averaging, checkpoint errors, the NaN guard, many devices and hosts,
and preemption."""

import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import synthetic_text, train_settings as _tc
from jaxformer import checkpoint, config, data, train, trainer, translation
from jaxformer.model import Transformer

TESTS = pathlib.Path(__file__).resolve().parent
ROOT = TESTS.parent
TEXT = synthetic_text(1500)
CFG = config.tiny(vocab_size=400)


def _assert_trees_equal(a, b, **tolerance):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    if tolerance:
      np.testing.assert_allclose(x, y, **tolerance)
    else:
      np.testing.assert_array_equal(x, y)


@pytest.fixture(scope='module')
def trained(tmp_path_factory) -> pathlib.Path:
  """6 steps with checkpoints at 2, 4 and 6, the last 3 averaged, validation at the end."""
  workdir = tmp_path_factory.mktemp('trained')
  summary = trainer.train(CFG, _tc(average_last=3, bleu_sentences=8, sample_translations=3),
                          workdir, TEXT, synthetic_text(50, seed=9))
  assert summary['step'] == 6 and summary['averaged'].endswith('average-last3')
  assert 0 < summary['eval']['accuracy'] < 1 and summary['eval']['perplexity'] > 1
  assert 0 <= summary['eval']['bleu'] <= 100
  return workdir


def test_workdir_holds_logs_checkpoints_and_vocabulary(trained):
  assert sorted(os.listdir(trained / 'checkpoints')) == ['2', '4', '6']
  lines = (trained / 'metrics.jsonl').read_text().splitlines()
  assert len(lines) == 5  # the run's facts, train at steps 2, 4, 6 and one evaluation
  assert set(json.loads(lines[-1])) == {'step', 'split', 'loss', 'perplexity', 'accuracy',
                                        'tokens', 'bleu'}
  assert any(p.name.startswith('events.out.tfevents') for p in (trained / 'tensorboard').iterdir())
  _, _, spm_model, step = checkpoint.load(trained)
  assert spm_model == (trained / 'spm.model').read_bytes() and step == 6


def test_first_record_says_where_and_how_the_run_computes(trained):
  """The device line's facts: backend, devices, processes, dtype, attention and the batch."""
  facts = json.loads((trained / 'metrics.jsonl').read_text().splitlines()[0])
  src_len, tgt_len = facts['row_lengths']
  rows = data.rows_per_device(1024, max(src_len, tgt_len), 1)  # tokens_per_batch 1024, 1 CPU
  assert facts == {
      'step': 0, 'split': 'run', 'devices': 'cpu: 1 × cpu, 1 process', 'backend': 'cpu',
      'device_count': 1, 'process_count': 1, 'dtype': 'float32', 'attention': 'einsum',
      'remat': False, 'source_tokens_per_update': rows * src_len,
      'target_tokens_per_update': rows * tgt_len, 'accum_steps': 1, 'rows_per_device': rows,
      'row_lengths': [src_len, tgt_len]}
  line = trainer.describe_run(facts)
  assert line.startswith('cpu: 1 × cpu, 1 process; compute float32, einsum attention; ')
  assert f'{rows * tgt_len:,} target token slots per update (1 micro-batch of {rows} rows' in line
  # TensorBoard: the same line as text at step 0, and the settings as hparams.
  from tensorboard.backend.event_processing import event_accumulator  # noqa  (slow import)
  events = event_accumulator.EventAccumulator(str(trained / 'tensorboard'),
                                              size_guidance={'tensors': 0})
  events.Reload()
  text = events.Tensors('run')[0]
  assert text.step == 0 and text.tensor_proto.string_val == [line.encode()]
  assert '_hparams_/session_start_info' in events.Tags()['tensors']


def test_each_evaluation_writes_sample_translations_to_tensorboard(trained):
  from tensorboard.backend.event_processing import event_accumulator  # noqa  (slow import)
  events = event_accumulator.EventAccumulator(str(trained / 'tensorboard'),
                                              size_guidance={'tensors': 0})
  events.Reload()
  (samples,) = events.Tensors('samples')  # one evaluation, at the last step
  table = samples.tensor_proto.string_val[0].decode().splitlines()
  assert samples.step == 6 and table[:2] == ['| source | hypothesis | reference |', '|---|---|---|']
  validation = synthetic_text(50, seed=9)
  translator = translation.Translator.from_checkpoint(str(trained / 'checkpoints'))
  hypotheses = translator.translate(validation.src[:3])
  assert table[2:] == [f'| {s} | {h} | {r} |' for s, h, r in
                       zip(validation.src, hypotheses, validation.tgt)]


def test_a_run_has_one_translator_and_later_evaluations_compile_nothing(tmp_path, monkeypatch):
  """Validation BLEU and sample translations reuse the run's translator: beam search is
  compiled at the first evaluation only."""
  made, compiled = [], []
  translate = translation.Translator.translate

  def spy(self, sentences, progress=False):
    made.append(self) if self not in made else None
    out = translate(self, sentences, progress)
    compiled.append(self._search._cache_size())  # pylint: disable=protected-access
    return out

  monkeypatch.setattr(translation.Translator, 'translate', spy)
  trainer.train(CFG, _tc(num_steps=6, eval_every_steps=2, bleu_sentences=6,
                         sample_translations=2), tmp_path, TEXT, synthetic_text(20, seed=9))
  assert len(made) == 1 and len(compiled) == 3  # evaluations at steps 2, 4 and 6
  assert compiled[0] > 0 and compiled[1:] == [compiled[0]] * 2, compiled


def test_resuming_with_other_row_lengths_is_a_data_change(trained, tmp_path):
  workdir = tmp_path / 'w'
  shutil.copytree(trained, workdir)
  with pytest.raises(trainer.TrainingError, match=r'the training data changed since the checkpoint '
                     r'\(.*row length 64 -> 72.*\): .* or pass --reset-data'):
    trainer.train(CFG, _tc(num_steps=8, row_len=72), workdir, TEXT)


def test_describe_run_names_the_fast_path_and_accumulation():
  facts = {'devices': 'gpu: 8 × NVIDIA H100 80GB HBM3, 1 process', 'dtype': 'bfloat16',
           'attention': 'fused', 'remat': True, 'source_tokens_per_update': 198_400,
           'target_tokens_per_update': 204_800, 'accum_steps': 4, 'rows_per_device': 25,
           'row_lengths': [248, 256]}
  assert trainer.describe_run(facts) == (
      'gpu: 8 × NVIDIA H100 80GB HBM3, 1 process; compute bfloat16, fused attention, remat; '
      '198,400 source + 204,800 target token slots per update (4 micro-batches of 25 rows per '
      'device, rows of 248 / 256 tokens)')


def test_a_run_that_requires_an_accelerator_refuses_cpu_before_any_work(tmp_path):
  settings = _tc(require_accelerator=True)
  with pytest.raises(trainer.TrainingError, match=r'needs a GPU.*--allow-cpu'):
    trainer.train(CFG, settings, tmp_path / 'w', TEXT)
  assert not (tmp_path / 'w').exists()
  trainer.check_backend(settings, backend='gpu')  # a GPU (or TPU) backend passes
  trainer.check_backend(settings, backend='tpu')
  trainer.check_backend(_tc(), backend='cpu')  # small runs train on CPU as before


def test_resume_continues_exactly(trained, tmp_path):
  """6 steps straight equal 3 steps, a stop, and 3 more from the checkpoint (data included)."""
  trainer.train(CFG, _tc(num_steps=3, checkpoint_every_steps=3), tmp_path, TEXT)
  summary = trainer.train(CFG, _tc(num_steps=6), tmp_path, TEXT)
  assert summary['step'] == 6
  manager = checkpoint.make_manager(trained / 'checkpoints')
  straight = checkpoint.restore(manager, 6, with_data=True)
  resumed = checkpoint.restore(checkpoint.make_manager(tmp_path / 'checkpoints'), 6,
                               with_data=True)
  _assert_trees_equal(straight['params'], resumed['params'])
  assert straight['data'] == resumed['data']


def test_only_the_newest_checkpoints_keep_the_optimiser_state(trained):
  """Resume needs the newest (keep_train_state=2 by default); averaging needs params only."""
  steps = trained / 'checkpoints'
  assert [(steps / str(s) / 'train').exists() for s in (2, 4, 6)] == [False, True, True]
  assert all((steps / str(s) / 'params').is_dir() for s in (2, 4, 6))
  manager = checkpoint.make_manager(steps)
  template = jax.device_get(train.create_train_state(CFG, jax.random.key(0)))
  step, _ = checkpoint.restore_latest(manager, train={'opt_state': template.opt_state,
                                                      'step': 0, 'rng': np.zeros(2, np.uint32)})
  assert step == 6


def test_average_is_the_mean_and_loads_for_decoding(trained):
  manager = checkpoint.make_manager(trained / 'checkpoints')
  expected = jax.tree.map(lambda *xs: np.mean(np.stack(xs), axis=0),
                          *[checkpoint.restore(manager, s)['params'] for s in (2, 4, 6)])
  _assert_trees_equal(checkpoint.average_checkpoints(trained, 3), expected, rtol=1e-6)
  params, cfg, _, step = checkpoint.load(trained / 'average-last3')
  _assert_trees_equal(params, expected, rtol=1e-6)
  assert cfg == CFG and step == 6
  logits = Transformer(cfg).apply({'params': params}, jnp.ones((1, 5), jnp.int32),
                                  jnp.zeros((1, 3), jnp.int32))
  assert logits.shape == (1, 3, 400) and bool(jnp.all(jnp.isfinite(logits)))
  with pytest.raises(checkpoint.CheckpointError, match='only 3'):
    checkpoint.average_checkpoints(trained, 5)


def test_average_command_saves_a_loadable_checkpoint(trained, capsys):
  from jaxformer import cli
  assert cli.main(['average', '--workdir', str(trained), '--last', '2']) == 0
  assert 'average-last2' in capsys.readouterr().out
  params, _, _, _ = checkpoint.load(trained / 'average-last2')
  manager = checkpoint.make_manager(trained / 'checkpoints')
  expected = jax.tree.map(lambda a, b: (a + b) / 2, checkpoint.restore(manager, 4)['params'],
                          checkpoint.restore(manager, 6)['params'])
  _assert_trees_equal(params, expected, rtol=1e-6)
  assert cli.main(['average', '--workdir', str(trained / 'nowhere'), '--last', '2']) == 1
  assert capsys.readouterr().err.startswith('error: ')


def test_incompatible_config_or_vocabulary_is_named(trained, tmp_path):
  workdir = tmp_path / 'w'
  shutil.copytree(trained, workdir)
  with pytest.raises(checkpoint.CheckpointError, match=r'd_ff: checkpoint 64, now 128'):
    trainer.train(CFG.replace(d_ff=128), _tc(num_steps=8), workdir, TEXT)
  other = synthetic_text(300, seed=5)
  (workdir / 'spm.model').unlink()
  data.train_tokenizer(other.src, workdir / 'spm.model', 400)
  with pytest.raises(checkpoint.CheckpointError, match='sentencepiece vocabulary differs'):
    trainer.train(CFG, _tc(num_steps=8), workdir, TEXT)


def test_resumes_with_the_fast_path_and_remat(trained, tmp_path):
  """Execution fields (bf16, fused attention, remat) may differ from the checkpoint's run."""
  workdir = tmp_path / 'w'
  shutil.copytree(trained, workdir)
  summary = trainer.train(CFG.run_as(remat=True), _tc(num_steps=8, fast_path=True), workdir,
                          TEXT)
  assert summary['step'] == 8 and np.isfinite(summary['train']['loss'])
  _, saved_config, _, step = checkpoint.load(workdir)
  assert step == 8 and saved_config == CFG.run_as(remat=True)  # as given, not as run (bf16)


def test_a_damaged_checkpoint_falls_back_to_the_previous_one(trained, tmp_path, caplog):
  workdir = tmp_path / 'w'
  shutil.copytree(trained, workdir)
  for path in (workdir / 'checkpoints' / '6' / 'params').rglob('*'):
    if path.is_file():
      path.write_bytes(b'garbage')
  manager = checkpoint.make_manager(workdir / 'checkpoints')
  step, _ = checkpoint.restore_latest(manager)
  assert step == 4
  assert 'checkpoints/6 cannot be restored' in caplog.text
  for step_dir in ('2', '4'):
    shutil.rmtree(workdir / 'checkpoints' / step_dir / 'params')
  with pytest.raises(checkpoint.CheckpointError, match='none of the checkpoints'):
    checkpoint.restore_latest(checkpoint.make_manager(workdir / 'checkpoints'))


# --- many devices, many hosts -------------------------------------------------------------------


def _worker(*args: str, tmp_path: pathlib.Path) -> subprocess.Popen:
  env = dict(os.environ, WORKER_TMP=str(tmp_path))
  env.pop('XLA_FLAGS', None)
  return subprocess.Popen([sys.executable, str(TESTS / 'distributed_worker.py'), *args],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(process: subprocess.Popen) -> None:
  output, _ = process.communicate(timeout=300)
  assert process.returncode == 0, output[-3000:]


def _load_npz(path) -> dict:
  with np.load(path) as f:
    return dict(f)


@pytest.mark.slow
def test_eight_devices_equal_one_device_on_the_same_global_batch(tmp_path):
  _finish(_worker('devices', '8', str(tmp_path / 'eight.npz'), tmp_path=tmp_path))
  _finish(_worker('devices', '1', str(tmp_path / 'one.npz'), tmp_path=tmp_path))
  _assert_trees_equal(_load_npz(tmp_path / 'eight.npz'), _load_npz(tmp_path / 'one.npz'),
                      atol=1e-5, rtol=0)


@pytest.mark.slow
def test_two_processes_equal_one_process(tmp_path):
  with socket.socket() as s:
    s.bind(('localhost', 0))
    port = str(s.getsockname()[1])
  hosts = [_worker('host', str(i), port, str(tmp_path / 'hosts.npz'), tmp_path=tmp_path)
           for i in range(2)]
  for process in hosts:
    _finish(process)
  _finish(_worker('hosts2', str(tmp_path / 'one.npz'), tmp_path=tmp_path))
  _assert_trees_equal(_load_npz(tmp_path / 'hosts.npz'), _load_npz(tmp_path / 'one.npz'),
                      atol=1e-5, rtol=0)


# --- preemption and kill -9 ---------------------------------------------------------------------


def _train_command(workdir: pathlib.Path, src: pathlib.Path, tgt: pathlib.Path,
                   *extra: str) -> list[str]:
  return [sys.executable, str(ROOT / 'experiments' / 'train.py'), '--config',
          str(TESTS / 'tiny_config.py'), '--workdir', str(workdir), '--source', 'text',
          '--train-src', str(src), '--train-tgt', str(tgt), *extra]


def _text_files(tmp_path):
  src, tgt = tmp_path / 'train.src', tmp_path / 'train.tgt'
  src.write_text('\n'.join(TEXT.src) + '\n')
  tgt.write_text('\n'.join(TEXT.tgt) + '\n')
  return src, tgt


def _wait_for(predicate, process, seconds=240):
  deadline = time.monotonic() + seconds
  while not predicate():
    assert process.poll() is None, process.communicate()[0][-3000:]
    assert time.monotonic() < deadline, 'timed out'
    time.sleep(0.2)


@pytest.mark.slow
def test_sigterm_saves_and_a_rerun_resumes(tmp_path):
  src, tgt = _text_files(tmp_path)
  workdir = tmp_path / 'w'
  process = subprocess.Popen(_train_command(workdir, src, tgt, '--num-steps', '100000'),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  metrics = workdir / 'metrics.jsonl'
  _wait_for(lambda: metrics.exists() and metrics.read_text().count('\n') >= 2, process)
  process.send_signal(signal.SIGTERM)
  output, _ = process.communicate(timeout=120)
  assert process.returncode == 0, output[-3000:]
  assert 'SIGTERM received: saved step' in output
  saved = int(output.split('SIGTERM received: saved step ')[1].split()[0])
  steps = checkpoint.make_manager(workdir / 'checkpoints').all_steps()
  assert max(steps) == saved
  resumed = subprocess.run(_train_command(workdir, src, tgt, '--num-steps', str(saved + 2)),
                           capture_output=True, text=True, timeout=300)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f'resumed from step {saved}' in resumed.stderr
  assert f'"step": {saved + 2}' in resumed.stdout


@pytest.mark.slow
def test_kill_9_during_saves_leaves_a_restorable_workdir(tmp_path):
  src, tgt = _text_files(tmp_path)
  workdir = tmp_path / 'w'
  process = subprocess.Popen(
      _train_command(workdir, src, tgt, '--num-steps', '100000', '--checkpoint-every-steps', '1'),
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  checkpoints = workdir / 'checkpoints'
  _wait_for(lambda: checkpoints.is_dir() and len(os.listdir(checkpoints)) >= 4, process)
  process.kill()  # SIGKILL, most likely in the middle of an asynchronous save
  process.communicate(timeout=60)
  found = checkpoint.restore_latest(checkpoint.make_manager(checkpoints), with_data=True)
  assert found is not None and found[0] >= 1
  resumed = subprocess.run(_train_command(workdir, src, tgt, '--num-steps', str(found[0] + 1)),
                           capture_output=True, text=True, timeout=300)
  assert resumed.returncode == 0, resumed.stderr[-3000:]


def test_train_entry_point_reports_bad_input_in_one_line(tmp_path):
  (tmp_path / 'a.src').write_text('one\ntwo\n')
  (tmp_path / 'a.tgt').write_text('eins\n')
  result = subprocess.run(_train_command(tmp_path / 'w', tmp_path / 'a.src', tmp_path / 'a.tgt'),
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == (
      f'error: {tmp_path / "a.src"} has 2 lines but {tmp_path / "a.tgt"} has 1: the files must '
      'be line-aligned.')


@pytest.mark.slow
def test_two_hosts_checkpoint_together_and_resume(tmp_path):
  """Both processes of a jax.distributed cluster save each checkpoint; a rerun resumes both."""
  workdir = tmp_path / 'w'

  def run_cluster(steps: int) -> list[str]:
    with socket.socket() as s:
      s.bind(('localhost', 0))
      port = str(s.getsockname()[1])
    hosts = [_worker('train', str(i), port, str(workdir), str(steps), tmp_path=tmp_path)
             for i in range(2)]
    outputs = [p.communicate(timeout=300)[0] for p in hosts]
    for p, output in zip(hosts, outputs):
      assert p.returncode == 0, output[-3000:]
    return outputs

  outputs = run_cluster(4)
  # One process prepared the data (vocabulary and both caches); the other loaded them.
  joined = ''.join(outputs)
  assert joined.count('training a 400-piece vocabulary') == 1, joined[-3000:]
  assert joined.count('read 400 pairs, kept') == 1 and joined.count('read 40 pairs, kept') == 1
  manager = checkpoint.make_manager(workdir / 'checkpoints')
  assert manager.all_steps() == [2, 4]
  hosts = checkpoint.restore(manager, 4, with_data=True)['data']['hosts']
  assert len(hosts) == 2 and hosts[0]['shard_size'] + hosts[1]['shard_size'] == 400
  outputs = run_cluster(6)
  assert all('resumed from step 4' in output for output in outputs)
  params, _, _, step = checkpoint.load(workdir / 'average-last2')
  assert step == 6 and all(np.all(np.isfinite(x)) for x in jax.tree.leaves(params))
