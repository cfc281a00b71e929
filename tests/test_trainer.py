"""jaxformer.trainer: the loop, its actions, resuming, guards, preemption and several hosts."""

import gc
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time
import types

import jax
import numpy as np
import pytest
from helpers import (
  CFG,
  TESTS,
  TEXT,
  hold_lock,
  sigint_inside_a_gc_callback,
  start_worker,
  synthetic_text,
  text_files,
  train_command,
  train_settings,
)
from helpers import poison_third_batch as _poison_third_batch
from helpers import train_settings as _tc

from jaxformer import (checkpoint, cli, config, data, files, monitor, optim, resume, trainer,
                       translation, validation)


def _due(step, tc, *, evaluating, save_signal=False) -> set[str]:
  """The names of the trainer's periodic actions due after `step`."""
  actions = trainer.periodic_actions(tc, log_metrics=print, save=print,
                                     evaluate=print if evaluating else None)
  return {a.name for a in trainer.due(actions, step, tc.num_steps, save_signal=save_signal)}


def test_due_logs_evaluates_and_saves_on_their_schedules_and_at_the_end():
  tc = train_settings(num_steps=10, log_every_steps=2, eval_every_steps=5,
                      checkpoint_every_steps=4)
  plan = {step: _due(step, tc, evaluating=True) for step in range(1, 11)}
  assert [s for s, d in plan.items() if 'log' in d] == [2, 4, 6, 8, 10]
  assert [s for s, d in plan.items() if 'eval' in d] == [5, 10]
  assert [s for s, d in plan.items() if 'save' in d] == [4, 8, 10]
  assert not plan[1] and plan[2]
  assert 'eval' not in _due(5, tc, evaluating=False)  # no validation set
  assert 'save' in _due(3, tc, evaluating=True, save_signal=True)  # the clock, or preemption
  assert _due(3, tc, evaluating=True, save_signal=True) == {'save'}
  untimed = train_settings(num_steps=10, checkpoint_every_steps=None)
  assert [s for s in range(1, 11) if 'save' in _due(s, untimed, evaluating=False)] == [10]


def test_with_checkpoint_steps_to_average_the_count_saves_only_the_averaged_ones():
  """Saves by the count only from the first of the last average_last (520 of 40, 80, ..., 640
  and the last, 650), by the clock (its timed saves) only before it."""
  tc = train_settings(num_steps=650, checkpoint_every_steps=40, average_last=5,
                      checkpoint_steps_to_average=True, checkpoint_every_secs=600.0)
  assert tc.step_checkpoints_from() == 520
  assert [s for s in range(1, 651) if 'save' in _due(s, tc, evaluating=False)] == [
      520, 560, 600, 640, 650]
  guard, long_ago = types.SimpleNamespace(signal=None), time.monotonic() - 601
  assert trainer._agree(guard, long_ago, tc, 519) == (False, True)
  assert trainer._agree(guard, long_ago, tc, 520) == (False, False)
  assert trainer._agree(guard, time.monotonic(), tc, 100) == (False, False)
  assert trainer._agree(types.SimpleNamespace(signal='SIGTERM'), long_ago, tc, 600) == (
      True, False)  # a stop signal still saves at once
  assert train_settings(checkpoint_steps_to_average=True, average_last=0
                        ).step_checkpoints_from() is None  # nothing averaged: off


def test_saving_only_the_averaged_checkpoints_averages_the_same_params(tmp_path):
  """The setting changes which checkpoints are written, not the run: the average of the last 3
  equals the one of a run that saved every 2 steps."""
  averages = []
  for name, only in (('all', False), ('averaged', True)):
    summary = trainer.train(CFG, _tc(num_steps=10, average_last=3,
                                     checkpoint_steps_to_average=only), tmp_path / name, TEXT)
    steps = sorted(int(p.name) for p in (tmp_path / name / 'checkpoints').iterdir())
    assert steps == ([6, 8, 10] if only else [2, 4, 6, 8, 10])
    averages.append(checkpoint.load(summary['averaged'])[0])
  assert jax.tree.all(jax.tree.map(np.array_equal, *averages))


def test_each_action_of_a_run_works_alone(tmp_path):
  """The loop's actions are a Run's methods: log, evaluate, save and stop, each called here by
  hand on a run of the tiny model."""
  tc = _tc(num_steps=3, patience=1)
  validation = synthetic_text(40, seed=1)
  pipeline = data.pipeline.build(tmp_path, CFG, tc, TEXT, validation)
  run = trainer.Run.start(CFG, tc, tmp_path, pipeline, config.OptimConfig())
  assert [a.name for a in run.actions()] == ['log', 'eval', 'save']
  batches = pipeline.device_batches()
  with run.sink:
    for step in (1, 2):
      run.train_step(step, *next(batches))
    run.sink.progress.update(run.reader.read())
    run.log(2)
    assert set(run.summary['train']) >= {'loss', 'lr', 'tokens_per_s'}
    run.evaluate(2)
    assert run.summary['eval']['tokens'] > 0 and not run.stop_early
    run.save(2)
    run.evaluate(2)  # no better: out of patience (1)
    assert run.stop_early
    run.stop(2, None)
  batches.close()
  run.finish_saves()
  assert run.summary['stopped_early'] and run.manager.all_steps() == [2]
  assert run.finish()['step'] == 2


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


def test_the_validation_compiles_ahead_and_saves_leave_the_loop_at_once(tmp_path, monkeypatch):
  """Run.compile_ahead compiles the eval step and the search of the sentences an evaluation
  translates in a background thread, from shapes alone: the evaluation then compiles nothing.
  A save copies the state on the device and writes it from a background thread: the loop goes
  on at once (here: while the write is held), and a write's error reaches the loop at the
  next save."""
  cfg = CFG.replace(dropout_rate=0.125)  # programs of its own in this process
  tc = _tc(num_steps=2, sample_translations=2, bleu_sentences=0, keep_train_state=1)
  pipeline = data.pipeline.build(tmp_path, cfg, tc, TEXT, synthetic_text(20, seed=1))
  run = trainer.Run.start(cfg, tc, tmp_path, pipeline, config.OptimConfig())
  run.compile_ahead()
  run._compiler.shutdown(wait=True)  # pylint: disable=protected-access
  search = run.translator(None)._search  # pylint: disable=protected-access  (the run's one)
  compiled = (len(run.p_eval_step), len(search))
  assert compiled[0] == 1 and compiled[1] >= 1  # (on CPU: a program per length bucket)
  batches = pipeline.device_batches()
  with run.sink:
    run.train_step(1, *next(batches))
    run.evaluate(1)
    assert (len(run.p_eval_step), len(search)) == compiled
    held, written = threading.Event(), []
    save = resume.save

    def held_save(*args, **kwargs):
      held.wait(timeout=60)
      written.append(args[1])
      return save(*args, **kwargs)
    monkeypatch.setattr(resume, 'save', held_save)
    run.save(1)
    assert written == []  # the loop has it back before the write
    held.set()
    run.wait_for_save()
    assert written == [1]

    def full_disk(*args, **kwargs):
      raise files.no_space(tmp_path, 'checkpoint 2', 1)
    monkeypatch.setattr(resume, 'save', full_disk)
    run.save(2)  # (the error is the background thread's)
    with pytest.raises(files.DiskFullError):
      run.save(3)
  batches.close()
  run.finish_saves()
  assert run.manager.all_steps() == [1]


def test_a_run_has_one_translator_and_later_evaluations_compile_nothing(tmp_path, monkeypatch):
  """Validation BLEU and sample translations reuse the run's translator (over each
  evaluation's params: one search program): beam search is compiled at the first evaluation
  only."""
  made, compiled = [], []
  translate = translation.Translator.translate

  def spy(self, sentences, progress=False):
    made.append(self) if self not in made else None
    out = translate(self, sentences, progress)
    compiled.append(len(self._search))  # pylint: disable=protected-access
    return out

  monkeypatch.setattr(translation.Translator, 'translate', spy)
  trainer.train(CFG, _tc(num_steps=6, eval_every_steps=2, bleu_sentences=6,
                         sample_translations=2), tmp_path, TEXT, synthetic_text(20, seed=9))
  assert len({id(t._search) for t in made}) == 1 and len(compiled) == 3  # steps 2, 4, 6
  assert compiled[0] > 0 and compiled[1:] == [compiled[0]] * 2, compiled


def test_a_second_run_in_the_process_traces_nothing_again(tmp_path):
  """The model's init, the pmapped steps and the beam search are made once per process for a
  config: a second run of it (a sweep, a notebook) reuses their compiled programs (before,
  every run traced them afresh: 8.5 s of a 9 s tiny run)."""
  def run(name: str) -> None:
    trainer.train(CFG, _tc(num_steps=2, eval_every_steps=2, bleu_sentences=4), tmp_path / name,
                  TEXT, synthetic_text(20, seed=9))
  run('first')
  traced = []

  def listener(event: str, duration: float, **kwargs) -> None:
    if event.endswith('jaxpr_trace_duration'):
      traced.append(kwargs.get('fun_name', event))
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    run('second')
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert traced == []


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


def _wait_for(predicate, process, seconds=240):
  deadline = time.monotonic() + seconds
  while not predicate():
    assert process.poll() is None, process.communicate()[0][-3000:]
    assert time.monotonic() < deadline, 'timed out'
    time.sleep(0.2)


@pytest.mark.slow
def test_sigterm_saves_and_a_rerun_resumes(tmp_path):
  src, tgt = text_files(tmp_path)
  workdir = tmp_path / 'w'
  process = subprocess.Popen(train_command(workdir, src, tgt, '--num-steps', '100000'),
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
  resumed = subprocess.run(train_command(workdir, src, tgt, '--num-steps', str(saved + 2)),
                           capture_output=True, text=True, timeout=300)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f'resumed from step {saved}' in resumed.stderr
  assert f'"step": {saved + 2}' in resumed.stdout


def test_ctrl_c_while_the_data_is_prepared_ends_the_run_before_training(tmp_path):
  """Ctrl-C while the token caches are built, landing in a gc callback as it can in jax's: the
  command ends 'interrupted' with 130 and trains nothing (it had dropped the Ctrl-C and trained
  on)."""
  src, tgt = text_files(tmp_path)
  workdir = tmp_path / 'w'
  command = train_command(workdir, src, tgt, '--num-steps', '4')
  code = (f'import os, sys\nsys.path.insert(0, {str(TESTS)!r})\n'
          'from helpers import sigint_inside_a_gc_callback\nfrom jaxformer import cli\n'
          f'sigint_inside_a_gc_callback(lambda: os.path.exists({str(workdir / "spm.model")!r}))\n'
          f"sys.exit(cli.main(['train', *{command[2:]!r}]))")
  done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300)
  assert (done.returncode, done.stderr.splitlines()[-1]) == (130, 'interrupted'), done.stderr
  assert 'Traceback' not in done.stderr and 'Exception ignored' not in done.stderr
  assert (workdir / 'spm.model').exists() and not (workdir / 'metrics.jsonl').exists()


def test_ctrl_c_while_training_saves_and_ends_interrupted(tmp_path, capsys, caplog):
  src, tgt = text_files(tmp_path)
  workdir = tmp_path / 'w'
  metrics = workdir / 'metrics.jsonl'
  callback = sigint_inside_a_gc_callback(
      lambda: metrics.exists() and metrics.read_text().count('\n') >= 3)  # 2 steps logged
  try:
    status = cli.main(['train', *train_command(workdir, src, tgt, '--num-steps', '1000')[2:]])
  finally:
    gc.callbacks.remove(callback)
  assert status == 130 and capsys.readouterr().err.splitlines()[-1] == 'interrupted'
  saved = int(caplog.text.split('SIGINT received: saved step ')[1].split()[0])
  assert 2 <= saved < 1000 and max(checkpoint.make_manager(workdir / 'checkpoints').all_steps()) \
      == saved


def test_a_damaged_cache_and_a_long_validation_source_through_the_command(tmp_path, capsys):
  """Data the run did not build itself, through the installed command: token caches cut short
  are rebuilt with a warning (it was an IndexError), and a validation source longer than the
  training sources is evaluated (it crashed the first evaluation)."""
  long_source = ' '.join((TEXT.src[0].split() * 20)[:45])
  for name, lines in {'s.txt': [s.split()[0] for s in TEXT.src[:600]], 't.txt': TEXT.tgt[:600],
                      'vs.txt': [long_source], 'vt.txt': TEXT.tgt[:1]}.items():
    (tmp_path / name).write_text('\n'.join(lines) + '\n')
  argv = ['--config', str(TESTS / 'tiny_config.py'), '--workdir', str(tmp_path / 'w'),
          '--source', 'text', *(f'--{flag}={tmp_path / name}' for flag, name in (
              ('train-src', 's.txt'), ('train-tgt', 't.txt'), ('eval-src', 'vs.txt'),
              ('eval-tgt', 'vt.txt'))), '--eval-every-steps', '2']
  assert cli.main(['train', *argv, '--num-steps', '2']) == 0  # in-process: builds the caches
  capsys.readouterr()
  for tokens in (tmp_path / 'w' / 'cache').glob('tokens-*/tgt_tokens.bin'):
    tokens.write_bytes(tokens.read_bytes()[:-10])
  jaxformer = pathlib.Path(sys.executable).with_name('jaxformer')
  done = subprocess.run([str(jaxformer), 'train', *argv, '--num-steps', '4'], capture_output=True,
                        text=True, timeout=300)
  assert done.returncode == 0 and 'Traceback' not in done.stderr, done.stderr[-3000:]
  assert done.stderr.count('the token cache is damaged (tgt_tokens.bin has') == 2
  evaluations = [json.loads(line) for line in (tmp_path / 'w' / 'metrics.jsonl').open()
                 if '"split": "eval"' in line]
  assert [record['step'] for record in evaluations] == [2, 4]


@pytest.mark.slow
def test_kill_9_during_saves_leaves_a_restorable_workdir(tmp_path):
  src, tgt = text_files(tmp_path)
  workdir = tmp_path / 'w'
  process = subprocess.Popen(
      train_command(workdir, src, tgt, '--num-steps', '100000', '--checkpoint-every-steps', '1'),
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  checkpoints = workdir / 'checkpoints'
  _wait_for(lambda: checkpoints.is_dir() and len(os.listdir(checkpoints)) >= 4, process)
  process.kill()  # SIGKILL, most likely in the middle of an asynchronous save
  process.communicate(timeout=60)
  found = checkpoint.restore_latest(checkpoint.make_manager(checkpoints), with_data=True)
  assert found is not None and found[0] >= 1
  resumed = subprocess.run(train_command(workdir, src, tgt, '--num-steps', str(found[0] + 1)),
                           capture_output=True, text=True, timeout=300)
  assert resumed.returncode == 0, resumed.stderr[-3000:]


@pytest.mark.slow
def test_two_hosts_checkpoint_together_and_resume(tmp_path):
  """Both processes of a jax.distributed cluster save each checkpoint; a rerun resumes both."""
  workdir = tmp_path / 'w'

  def run_cluster(steps: int) -> list[str]:
    with socket.socket() as s:
      s.bind(('localhost', 0))
      port = str(s.getsockname()[1])
    hosts = [start_worker('train', str(i), port, str(workdir), str(steps), tmp_path=tmp_path)
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


def test_nan_guard_stops_and_names_the_step(tmp_path, monkeypatch):
  """The error names the last good checkpoint even when its save is still being written as
  the loss is found not finite: step 2's background save is held until then (on a loaded
  host it could take that long; the error said "none (no save yet)")."""
  _poison_third_batch(monkeypatch)
  found, save = threading.Event(), resume.save

  def held_save(*args, **kwargs):
    assert found.wait(60)
    return save(*args, **kwargs)

  class Found(monitor.NonFiniteLoss):
    def __init__(self, *args):
      super().__init__(*args)
      found.set()
  monkeypatch.setattr(resume, 'save', held_save)
  monkeypatch.setattr(monitor, 'NonFiniteLoss', Found)
  with pytest.raises(trainer.TrainingError,
                     match=r'non-finite loss \(nan\) at step 3\. The last good checkpoint is '
                           r'.*checkpoints/2'):
    trainer.train(CFG, _tc(num_steps=4), tmp_path, TEXT)


def test_skip_nonfinite_skips_and_counts(tmp_path, monkeypatch):
  _poison_third_batch(monkeypatch)
  summary = trainer.train(CFG, _tc(num_steps=4, skip_nonfinite=True), tmp_path, TEXT)
  assert summary['skipped_updates'] == 1 and summary['step'] == 4
  params, *_ = checkpoint.load(tmp_path)
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(params))
  # The interval of the skipped step 3 averages step 4 alone: metrics.jsonl stays valid JSON
  # (before: its loss was NaN, which JSON has no word for).
  def strict(word):
    raise AssertionError(f'{word} in metrics.jsonl')
  records = [json.loads(line, parse_constant=strict)
             for line in (tmp_path / 'metrics.jsonl').open()]
  train_losses = {r['step']: r['loss'] for r in records if r['split'] == 'train'}
  assert sorted(train_losses) == [2, 4] and all(np.isfinite(list(train_losses.values())))


def test_logged_lr_is_the_rate_applied_after_a_skipped_update(tmp_path, monkeypatch):
  """Step 3 is skipped: the optimiser's count stays at 2, so steps 3 and 4 both log (and step 4
  applies) the schedule at count 2, not at state.step."""
  _poison_third_batch(monkeypatch)
  trainer.train(CFG, _tc(num_steps=4, skip_nonfinite=True, log_every_steps=1), tmp_path, TEXT)
  logged = {r['step']: r['lr'] for r in map(json.loads, (tmp_path / 'metrics.jsonl').open())
            if r['split'] == 'train'}
  schedule = optim.lrate_schedule(CFG.d_model, config.OptimConfig().warmup_steps)
  expected = {1: schedule(0), 2: schedule(1), 3: schedule(2), 4: schedule(2)}
  assert logged == pytest.approx({k: float(v) for k, v in expected.items()}, rel=1e-6)


def test_hosts_agree_every_n_steps_and_at_the_end():
  settings = _tc(num_steps=25, host_sync_every_steps=10)
  assert [s for s in range(1, 26) if trainer.host_sync_due(s, settings, 2)] == [10, 20, 25]
  assert all(trainer.host_sync_due(s, settings, 1) for s in range(1, 26))  # one host: free


def test_patience_counts_evaluations_without_a_better_loss():
  patience = trainer.Patience(2)
  assert [patience.update(loss) for loss in (3.0, 2.5, 2.6, 2.4, 2.4, 2.5)] == [
      False, False, False, False, False, True]
  assert patience.best == 2.4 and patience.since == 2
  assert not any(trainer.Patience(None).update(9.0) for _ in range(5))  # off


def test_patience_stops_early_saves_and_averages(tmp_path, monkeypatch):
  """Validation losses 3.0, 2.5, 2.6, 2.7: with patience 2 the run stops after the 4th
  evaluation (step 4 of 10), saves that step though no save was due, and averages."""
  losses = iter([3.0, 2.5, 2.6, 2.7, 2.8])
  monkeypatch.setattr(validation, 'metrics', lambda *a: {'loss': next(losses)})
  summary = trainer.train(CFG, _tc(num_steps=10, eval_every_steps=1, checkpoint_every_steps=3,
                                   patience=2, average_last=2), tmp_path, TEXT,
                          synthetic_text(20, seed=9))
  assert summary['stopped_early'] and summary['step'] == 4 and summary['eval'] == {'loss': 2.7}
  assert sorted(int(p.name) for p in (tmp_path / 'checkpoints').iterdir()) == [3, 4]
  assert summary['averaged'].endswith('average-last2')
  evals = [json.loads(line)['step'] for line in (tmp_path / 'metrics.jsonl').open()
           if json.loads(line)['split'] == 'eval']
  assert evals == [1, 2, 3, 4]


def test_a_second_run_on_a_workdir_in_use_stops_naming_the_first(tmp_path, capsys):
  """Two runs on one workdir both trained before, the second from step 0 beside the first,
  mixing their checkpoints; now the second stops at once with one line."""
  first = hold_lock(tmp_path, 'a training run')
  try:
    with pytest.raises(files.InUseError, match=rf'^{tmp_path} is in use: a training '
                       rf'run by pid {first.pid} on \S+ holds it\. Wait for that to end'):
      trainer.train(CFG, _tc(), tmp_path, TEXT)
    assert not (tmp_path / 'checkpoints').exists() and not (tmp_path / 'spm.model').exists()
  finally:
    first.kill()  # kill -9: the kernel frees its lock
    first.wait()
  with files.locked(tmp_path, 'run', 'a training run'):
    pass


# --- fine-tuning (--init-from) and the optimiser's settings on resume ---------------------------
