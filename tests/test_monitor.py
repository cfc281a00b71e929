"""jaxformer.monitor: the loop's metric reader, sink, save clock and preemption guard."""

import json
import os
import gc
import itertools
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tqdm.std
from helpers import sigint_inside_a_gc_callback

from jaxformer import monitor


def test_the_save_clock():
  assert monitor.clock_ran_out(100.0, 600.0, now=700.0)
  assert not monitor.clock_ran_out(100.0, 600.0, now=699.9)
  assert not monitor.clock_ran_out(0.0, None, now=1e9)


def test_preemption_guard_records_the_signal_and_restores_the_handlers():
  before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
  with monitor.PreemptionGuard() as guard:
    assert guard.signal is None
    os.kill(os.getpid(), signal.SIGTERM)  # handled: recorded, the process goes on
    assert guard.signal == 'SIGTERM'
  assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def _metrics(loss: float, tokens: float = 10.0, nonfinite: float = 0.0) -> dict:
  """One step's metrics as pmap returns them: a leading device axis."""
  values = {'loss': loss, 'accuracy': 0.5, 'grad_norm': 2.0, 'tokens': tokens, 'lr': 1e-3,
            'nonfinite': nonfinite}
  return {key: np.array([value, value]) for key, value in values.items()}


def test_reader_reads_late_and_averages_each_interval():
  reader = monitor.MetricReader(skip_nonfinite=False, on_skip=lambda *_: None)
  assert reader.read() == 0
  reader.push(1, _metrics(4.0))
  reader.push(2, _metrics(2.0, tokens=30.0))
  assert reader.read() == 2 and reader.read() == 0
  interval = reader.interval()
  assert interval['loss'] == 3.0 and interval['accuracy'] == 0.5 and interval['lr'] == 1e-3
  assert interval['tokens_per_s'] > 0 and interval['skipped_updates'] == 0
  reader.push(3, _metrics(1.0))
  reader.read()
  assert reader.interval()['loss'] == 1.0  # a new interval


def test_reader_stops_on_a_non_finite_loss_or_counts_skips():
  reader = monitor.MetricReader(skip_nonfinite=False, on_skip=lambda *_: None)
  reader.push(7, _metrics(float('nan'), nonfinite=1.0))
  with pytest.raises(monitor.NonFiniteLoss, match=r'non-finite loss \(nan\) at step 7'):
    reader.read()
  skips = []
  reader = monitor.MetricReader(skip_nonfinite=True, on_skip=lambda *a: skips.append(a))
  for step in (1, 2, 3):
    reader.push(step, _metrics(float('nan') if step != 2 else 1.0, nonfinite=float(step != 2)))
  reader.read()
  assert skips == [(1, 1), (3, 2)] and reader.interval()['skipped_updates'] == 2


def test_sink_writes_on_process_zero_only(tmp_path):
  (tmp_path / 'main').mkdir()
  (tmp_path / 'other').mkdir()
  for name, enabled in (('main', True), ('other', False)):
    with monitor.MetricsSink(tmp_path / name, enabled=enabled, start_step=0, total_steps=4) as sink:
      sink.start(0, {'backend': 'cpu'}, 'cpu line', {'model': 'x'})
      sink.scalars(2, 'train', {'loss': np.float32(1.5)})
      sink.text(2, 'samples', '| a |')
  records = [json.loads(line) for line in
             (tmp_path / 'main' / 'metrics.jsonl').read_text().splitlines()]
  assert records == [{'step': 0, 'split': 'run', 'backend': 'cpu'},
                     {'step': 2, 'split': 'train', 'loss': 1.5}]
  assert (tmp_path / 'main' / 'tensorboard').is_dir()
  assert os.listdir(tmp_path / 'other') == []


def test_the_bar_redraws_once_a_minute_where_stderr_is_a_file(tmp_path, monkeypatch, capsys):
  """A run whose stderr is not a terminal (captured here, as a cluster job's log is): 600 steps
  a second apart on tqdm's clock draw the bar about once a minute, not at each step; tqdm's
  TQDM_MININTERVAL, where set, chooses instead (the startup bench reads the bar's counts)."""
  clock = itertools.count()  # one second a reading
  monkeypatch.setattr(tqdm.std, 'time', lambda: float(next(clock)))
  with monitor.MetricsSink(tmp_path, enabled=True, start_step=0, total_steps=600) as sink:
    for _ in range(600):
      sink.progress.update(1)
  draws = capsys.readouterr().err.count('training:')
  assert 5 <= draws <= 30, draws
  code = ('import pathlib; from jaxformer import monitor\n'
          f'sink = monitor.MetricsSink(pathlib.Path({str(tmp_path)!r}), enabled=True, '
          'start_step=0, total_steps=1)\n'
          'print(sink.progress.mininterval, sink.progress.maxinterval)')
  environ = {k: v for k, v in os.environ.items() if not k.startswith('TQDM_')}
  for env, intervals in (({}, '60 60'), ({'TQDM_MININTERVAL': '0.5'}, '0.5 10.0')):
    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          env={**environ, **env}, check=True)
    assert done.stdout.split() == intervals.split(), (env, done.stdout)  # (tqdm's own setting)


def test_sink_writes_tensorboard_events_without_importing_tensorflow(tmp_path):
  """TensorBoard reads back the scalars, text and hparams of a process that never imported
  TensorFlow (whose import cost each training process ~5 s and ~600 MB)."""
  code = ('import sys; from jaxformer import monitor\n'
          f'with monitor.MetricsSink(__import__("pathlib").Path({str(tmp_path)!r}), enabled=True, '
          'start_step=0, total_steps=4) as sink:\n'
          '  sink.start(0, {"backend": "cpu"}, "cpu line", {"model": {"d_model": 32}, "x": "y"})\n'
          '  sink.scalars(2, "train", {"loss": 1.5})\n'
          '  sink.text(2, "samples", "| a |")\n'
          'print(sorted(m for m in sys.modules if m.startswith("tensorflow")))')
  done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
  assert done.stdout.strip() == '[]', done.stdout
  from tensorboard.backend.event_processing import event_accumulator  # noqa  (slow import)
  from tensorboard.plugins.hparams import plugin_data_pb2  # noqa
  events = event_accumulator.EventAccumulator(str(tmp_path / 'tensorboard'),
                                              size_guidance={'tensors': 0})
  events.Reload()
  def values(tag: str) -> list[tuple[int, list]]:
    return [(e.step, list(e.tensor_proto.float_val or e.tensor_proto.string_val))
            for e in events.Tensors(tag)]
  assert values('train/loss') == [(2, [1.5])]
  assert values('run') == [(0, [b'cpu line'])] and values('samples') == [(2, [b'| a |'])]
  content = events.SummaryMetadata('_hparams_/session_start_info').plugin_data.content
  hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
  assert (hparams['model.d_model'].number_value, hparams['x'].string_value) == (32, 'y')


def test_sink_without_tensorboard_writes_metrics_and_warns(tmp_path, monkeypatch, caplog):
  """Without the tensorboard package (a GPU image may lack it) the run goes on: a warning, no
  event files, every record still in metrics.jsonl."""
  monkeypatch.setitem(sys.modules, 'tensorboard.summary.writer.record_writer', None)  # no import
  with monitor.MetricsSink(tmp_path, enabled=True, start_step=0, total_steps=4) as sink:
    sink.start(0, {'backend': 'cpu'}, 'cpu line', {'model': 'x'})
    sink.scalars(2, 'train', {'loss': 1.5})
    sink.text(2, 'samples', '| a |')
  assert [json.loads(line)['step'] for line in
          (tmp_path / 'metrics.jsonl').read_text().splitlines()] == [0, 2]
  assert not (tmp_path / 'tensorboard').exists()
  assert 'no TensorBoard events' in caplog.text


def _seconds_to_ctrl_c_inside_a_gc_callback() -> float:
  """How long 30 s of sleeping lasts after SIGINT's handler ran inside a gc callback (the
  KeyboardInterrupt must arrive: pytest.raises)."""
  callback = sigint_inside_a_gc_callback()
  start = time.monotonic()
  try:
    with pytest.raises(KeyboardInterrupt):
      gc.collect()
      # Cut short about 10 ms in: the signal goes to this (the main) thread. Short sleeps: a
      # signal landing just before a sleep starts (on a busy host) is handled when it ends.
      while time.monotonic() < start + 30:
        time.sleep(0.1)
  finally:
    gc.callbacks.remove(callback)
  return time.monotonic() - start


def test_ctrl_c_inside_a_gc_callback_arrives_just_after_it():
  """Python's own handler raised KeyboardInterrupt inside the callback, where it was printed
  and lost (the run went on); under Interrupts it arrives once the callback has returned."""
  before, hook = signal.getsignal(signal.SIGINT), sys.unraisablehook
  with monitor.Interrupts() as interrupts:
    assert _seconds_to_ctrl_c_inside_a_gc_callback() < 10
    assert interrupts.seen
    with pytest.raises(KeyboardInterrupt), monitor.PreemptionGuard():  # so it never trains
      pass
  assert signal.getsignal(signal.SIGINT) == before and not interrupts.seen
  assert sys.unraisablehook is hook
  with monitor.PreemptionGuard():  # the process's next run (library use) trains
    pass


def test_ctrl_c_sent_again_is_not_lost_when_it_lands_in_the_hook(monkeypatch):
  """On a busy host the re-sent SIGINT can arrive while the hook still starts its timer thread,
  where an exception is dropped as well: the hook sends it once more."""
  started = []

  def start_late(timer):  # the first timer's signal arrives inside its own start()
    started.append(timer)
    if len(started) == 1:
      signal.raise_signal(signal.SIGINT)
    threading.Thread.start(timer)
  monkeypatch.setattr(threading.Timer, 'start', start_late)
  with monitor.Interrupts():
    assert _seconds_to_ctrl_c_inside_a_gc_callback() < 10
  assert len(started) >= 2


def test_a_record_file_cut_short_is_set_aside_not_glued_to(tmp_path, caplog):
  """A run killed while writing metrics.jsonl leaves half a line; the next run's first record
  starts a line of its own, the torn bytes go to metrics.jsonl.torn, and a warning says so."""
  path = tmp_path / 'metrics.jsonl'
  path.write_text('{"step": 1}\n{"step": 2, "lo')
  with monitor.open_records(path) as f:
    f.write('{"step": 3}\n')
  assert [json.loads(line) for line in path.read_text().splitlines()] == [{'step': 1},
                                                                         {'step': 3}]
  assert (tmp_path / 'metrics.jsonl.torn').read_text() == '{"step": 2, "lo\n'
  assert 'its last line was cut short (15 bytes' in caplog.text
  caplog.clear()
  with monitor.open_records(path) as f:  # a whole file: nothing set aside
    f.write('{"step": 4}\n')
  with monitor.open_records(tmp_path / 'new.jsonl') as f:
    f.write('{"step": 1}\n')
  assert len(path.read_text().splitlines()) == 3 and not caplog.text


def test_the_stopwatch_sums_each_part_and_rates_the_steps_after_the_first(monkeypatch):
  """A run's 'time': each part's wall seconds, and the steps after the first (which compiles)
  over the run's time after it."""
  clock = iter([0.0, 0.0, 5.0, 5.0, 7.0, 7.0, 8.0, 10.0])
  monkeypatch.setattr(monitor.time, 'monotonic', lambda: next(clock))
  watch = monitor.Stopwatch()  # starts at 0
  with watch('first_step'):  # 0 -> 5
    pass
  with watch('steps'):  # 5 -> 7
    pass
  with watch('eval'):  # 7 -> 8
    pass
  assert watch.report(steps=5) == {'total_s': 10.0, 'eval_s': 1.0, 'first_step_s': 5.0,
                                   'steps_s': 2.0, 'steps_per_s': 0.8}
