"""What the training loop watches and reports: the metrics sink (TensorBoard, metrics.jsonl, the
progress bar), the one-step-late metric reader, the save clock and preemption signals.
`trainer.train_and_evaluate` puts them together.
"""

import collections
import contextlib
import json
import logging
import os
import pathlib
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import tqdm
from flax import traverse_util

from jaxformer.errors import reason

Array = jax.Array


# --- what the user sees ---------------------------------------------------------------------------


class _NoWriter:
  """Stands in for the TensorBoard writer where the tensorboard package is not installed."""

  def __getattr__(self, name: str) -> Callable[..., None]:
    return lambda *args, **kwargs: None


class _EventFile:
  """A TensorBoard event file, written with tensorboard's own record writer and summary protos.
  flax's writer goes through TensorFlow, whose import would cost every training process seconds
  and memory (docs/benchmarks-log.md); this writes the same events without it."""

  def __init__(self, folder: pathlib.Path):
    # pylint: disable=g-import-not-at-top  (tensorboard is optional on a GPU image)
    from tensorboard.compat.proto import event_pb2
    from tensorboard.plugins.hparams import summary_v2 as hparams_summary
    from tensorboard.plugins.scalar import summary_v2 as scalar_summary
    from tensorboard.plugins.text import summary_v2 as text_summary
    from tensorboard.summary.writer.record_writer import RecordWriter
    self._event, self._hparams = event_pb2.Event, hparams_summary.hparams_pb
    self._scalar, self._text = scalar_summary.scalar_pb, text_summary.text_pb
    folder.mkdir(parents=True, exist_ok=True)
    name = f'events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}'
    self._file = open(folder / name, 'wb')  # noqa: SIM115  (closed by close())
    self._records = RecordWriter(self._file)
    self._write(self._event(file_version='brain.Event:2'))

  def _write(self, event: Any, step: int = 0) -> None:
    event.wall_time, event.step = time.time(), step
    self._records.write(event.SerializeToString())

  def scalar(self, tag: str, value: float, step: int) -> None:
    self._write(self._event(summary=self._scalar(tag, value)), step)

  def text(self, tag: str, text: str, step: int) -> None:
    self._write(self._event(summary=self._text(tag, text)), step)

  def hparams(self, hparams: dict[str, Any]) -> None:
    """Nested settings, flattened to dotted names (as flax's writer does)."""
    flat = traverse_util.flatten_dict(hparams, sep='.')
    self._write(self._event(summary=self._hparams(flat)))

  def flush(self) -> None:
    self._file.flush()

  def close(self) -> None:
    self._file.close()


def _tensorboard_writer(folder: pathlib.Path) -> Any:
  """The run's TensorBoard event file; without the tensorboard package (a GPU image may lack
  it), a warning and no events (metrics.jsonl still gets every record). A folder that cannot be
  written is MetricsSink's to say."""
  try:
    return _EventFile(folder)
  except ImportError as e:
    logging.getLogger(__name__).warning('no TensorBoard events (%s); metrics.jsonl has them '
                                        'all.', e)
    return _NoWriter()


def open_records(path: pathlib.Path) -> Any:
  """`path`, a file of one JSON record per line, opened to append. A last line cut short (a run
  killed while writing it) is first moved to PATH.torn with a warning, so that the next record
  starts a line of its own instead of being glued to it."""
  try:
    with open(path, 'rb+') as f:
      end = f.seek(0, os.SEEK_END)
      f.seek(max(0, end - 2**20))  # a record is far shorter than the last MiB
      tail = f.read()
      if tail and not tail.endswith(b'\n'):
        torn = tail[tail.rfind(b'\n') + 1:]
        with open(path.with_name(path.name + '.torn'), 'ab') as aside:
          aside.write(torn + b'\n')
        f.truncate(end - len(torn))
        logging.getLogger(__name__).warning(
            '%s: its last line was cut short (%d bytes, a run killed while writing it); moved '
            'to %s.torn', path, len(torn), path.name)
  except FileNotFoundError:
    pass
  return open(path, 'a', encoding='utf-8')  # noqa: SIM115  (the caller closes it)


class MetricsSink:
  """TensorBoard, metrics.jsonl and the progress bar of a run, on process 0; a no-op on the
  other processes (clu's `create_default_writer` does the same).

  A record that cannot be written (a disk that filled, a read-only folder) is one warning, and
  that writer stops while training goes on: the metrics are a report of the run, and the
  checkpoints, which the run cannot do without, say for themselves when they cannot be saved."""

  def __init__(self, workdir: pathlib.Path, *, enabled: bool, start_step: int, total_steps: int):
    self.enabled = enabled
    # On a terminal the bar redraws in place. Written to a file (a cluster job's log, nohup)
    # every redraw stays, up to ten a second over a run of days: there it redraws once a minute,
    # unless tqdm's own TQDM_MININTERVAL says otherwise.
    in_place = sys.stderr.isatty() or 'TQDM_MININTERVAL' in os.environ
    interval = {} if in_place else {'mininterval': 60, 'maxinterval': 60}
    self.progress = tqdm.tqdm(total=total_steps, initial=start_step, desc='training',
                              unit='step', disable=not enabled, dynamic_ncols=True, **interval)
    self._writer: Any = _NoWriter()
    self._file: Any = None
    if enabled:
      self._guarded('TensorBoard events', lambda: setattr(
          self, '_writer', _tensorboard_writer(workdir / 'tensorboard')))
      self._guarded('metrics.jsonl', lambda: setattr(
          self, '_file', open_records(workdir / 'metrics.jsonl')))

  def _guarded(self, what: str, write: Callable[[], Any]) -> None:
    """`write()`; an OSError stops the writer of `what` with one warning."""
    try:
      write()
    except OSError as e:
      logging.getLogger(__name__).warning('no more %s: %s (%s); training goes on', what,
                                          e.filename or 'cannot write', reason(e))
      lost = self._file if what == 'metrics.jsonl' else self._writer
      with contextlib.suppress(OSError, AttributeError):  # (the same error again)
        lost.close()
      if what == 'metrics.jsonl':
        self._file = None
      else:
        self._writer = _NoWriter()

  def start(self, step: int, facts: dict[str, Any], line: str, hparams: dict[str, Any]) -> None:
    """The run's facts: metrics.jsonl's 'run' record, TensorBoard text and hparams."""
    if self.enabled:
      self._record({'step': step, 'split': 'run', **facts})
      self._guarded('TensorBoard events', lambda: (self._writer.text('run', line, step),
                                                   self._writer.hparams(hparams)))

  def scalars(self, step: int, prefix: str, values: dict[str, float]) -> None:
    """Scalars as `prefix/name` in TensorBoard and one metrics.jsonl record."""
    if self.enabled:
      values = {name: float(value) for name, value in values.items()}

      def events():
        for name, value in values.items():
          self._writer.scalar(f'{prefix}/{name}', value, step)
        self._writer.flush()
      self._guarded('TensorBoard events', events)
      self._record({'step': step, 'split': prefix, **values})

  def text(self, step: int, tag: str, text: str) -> None:
    """Markdown text in TensorBoard's text tab."""
    if self.enabled:
      self._guarded('TensorBoard events', lambda: self._writer.text(tag, text, step))

  def _record(self, record: dict[str, Any]) -> None:
    if self._file is not None:
      self._guarded('metrics.jsonl', lambda: (self._file.write(json.dumps(record) + '\n'),
                                              self._file.flush()))

  def close(self) -> None:
    """Closes the progress bar and the writers."""
    self.progress.close()
    if self.enabled:
      for close in (self._writer.close, self._file and self._file.close):
        if close:
          with contextlib.suppress(OSError):  # (its warning was given at the write)
            close()

  def __enter__(self) -> 'MetricsSink':
    return self

  def __exit__(self, *exc: Any) -> None:
    self.close()


# --- where a run's time goes ---------------------------------------------------------------------


class Stopwatch:
  """Wall seconds of a run by part: `with watch('eval'): ...` adds the block's time to 'eval'.
  The train loop times its steps, its first step (which compiles) and each periodic action, so
  that a run says how much of its time the device spent on steps and what stalled it; a part
  may lie within another (an evaluation's 'translations' within its 'eval')."""

  def __init__(self):
    self.seconds: collections.Counter = collections.Counter()
    self._start = time.monotonic()

  @contextlib.contextmanager
  def __call__(self, part: str):
    start = time.monotonic()
    try:
      yield
    finally:
      self.seconds[part] += time.monotonic() - start

  def report(self, steps: int) -> dict[str, float]:
    """{'total_s', each part's '<part>_s', and 'steps_per_s': the steps after the first over
    the run's time after it}, rounded to milliseconds."""
    total = time.monotonic() - self._start
    after_first = total - self.seconds['first_step']
    out = {'total_s': total, **{f'{part}_s': s for part, s in sorted(self.seconds.items())}}
    if steps > 1 and after_first > 0:
      out['steps_per_s'] = (steps - 1) / after_first
    return {key: round(value, 3) for key, value in out.items()}


# --- the save clock ------------------------------------------------------------------------------


def clock_ran_out(since: float, every_secs: float | None, now: float | None = None) -> bool:
  """Whether `every_secs` passed since `since` (monotonic seconds); never when it is None."""
  return every_secs is not None and (time.monotonic() if now is None else now) - since >= \
      every_secs


# --- preemption -----------------------------------------------------------------------------------


class Interrupts:
  """Within `with` (a command's whole run): Ctrl-C (SIGINT) raises KeyboardInterrupt where the
  main thread is, as Python's own handler does, and is never lost. Python drops an exception
  raised inside a gc callback (jax runs one at every collection), a `__del__` or a weakref
  callback, and reports it to `sys.unraisablehook`: a Ctrl-C landing there was lost and the run
  trained on. Here the hook sees the dropped KeyboardInterrupt and sends SIGINT to the main
  thread again 10 ms later (once more if it lands in the hook itself). `.seen` stays set until
  exit, and PreemptionGuard raises on entry if it is (`interrupted`), so an interrupted run
  never trains. The previous handler and hook come back on exit.
  """

  def __init__(self):
    self.seen = False
    self._previous: Any = None
    self._previous_hook: Any = None

  def _handle(self, signum: int, frame: Any) -> None:  # pylint: disable=unused-argument
    self.seen = True
    raise KeyboardInterrupt

  def _unraisable(self, unraisable: Any) -> None:
    if not isinstance(unraisable.exc_value, KeyboardInterrupt):
      self._previous_hook(unraisable)
      return
    while True:  # the SIGINT sent again may land here, in the hook, where it is dropped too
      try:
        again = threading.Timer(0.01, signal.pthread_kill,  # to the main thread: a sleep ends
                                (threading.main_thread().ident, signal.SIGINT))
        again.daemon = True
        again.start()
        return
      except KeyboardInterrupt:
        continue  # (a busy host can take 10 ms to start a thread): send it once more

  def __enter__(self) -> 'Interrupts':
    self.seen = False
    self._previous = signal.signal(signal.SIGINT, self._handle)
    self._previous_hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
    return self

  def __exit__(self, kind: type | None, error: BaseException | None, traceback: Any) -> None:
    interrupted, self.seen = self.seen, False
    signal.signal(signal.SIGINT, self._previous)
    sys.unraisablehook = self._previous_hook
    if interrupted and isinstance(error, Exception):
      # Library code that turned the KeyboardInterrupt into an error of its own (sentencepiece
      # reading the vocabulary's sample: a RuntimeError; a pool's worker): still the interrupt.
      raise KeyboardInterrupt from error


def interrupted() -> bool:
  """Whether the Interrupts that handles SIGINT now (a command's) has seen a Ctrl-C."""
  owner = getattr(signal.getsignal(signal.SIGINT), '__self__', None)
  return isinstance(owner, Interrupts) and owner.seen


class PreemptionGuard:
  """Within `with`: SIGTERM and SIGINT only record their name in `.signal` (the loop saves and
  stops at the next step boundary); the previous handlers come back on exit."""

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.signal: str | None = None
    self._previous: dict[int, Any] = {}

  def _record(self, signum: int, frame: Any) -> None:  # pylint: disable=unused-argument
    self.signal = signal.Signals(signum).name

  def __enter__(self) -> 'PreemptionGuard':
    if interrupted():  # a Ctrl-C before training that something swallowed
      raise KeyboardInterrupt
    self._previous = {sig: signal.signal(sig, self._record) for sig in self.SIGNALS}
    return self

  def __exit__(self, *exc: Any) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


# --- the one-step-late metric reader --------------------------------------------------------------


class NonFiniteLoss(RuntimeError):
  """A step's loss or gradient was not finite (and skipping was off)."""

  def __init__(self, step: int, loss: float):
    super().__init__(f'non-finite loss ({loss}) at step {step}')
    self.step, self.loss = step, loss


class MetricReader:
  """Holds the device metrics of dispatched steps and reads them later, so that the device
  always has the next step queued; sums them per logging interval.

  A step with a non-finite loss raises NonFiniteLoss, or with skip_nonfinite is counted in
  `.skipped` and reported through `on_skip(step, skipped)`.
  """

  KEYS = ('loss', 'accuracy', 'grad_norm', 'tokens')

  def __init__(self, *, skip_nonfinite: bool, on_skip: Callable[[int, int], None]):
    self.skip_nonfinite, self.on_skip = skip_nonfinite, on_skip
    self.skipped = 0
    self._pending: list[tuple[int, dict[str, Array]]] = []
    self._interval: collections.Counter = collections.Counter()
    self._lr = 0.0
    self._interval_start = time.monotonic()

  def push(self, step: int, metrics: dict[str, Array]) -> None:
    """Queues a dispatched step's metrics, still on the device, for `read`."""
    self._pending.append((step, metrics))

  def read(self, keep: int = 0) -> int:
    """Reads every pending step but the newest `keep` (waiting for the device only for those:
    the loop keeps a few steps in flight, so that the device always has work queued while the
    host reads); returns how many it read."""
    count = max(len(self._pending) - keep, 0)
    for _ in range(count):
      step, metrics = self._pending.pop(0)
      metrics = jax.device_get(jax.tree.map(lambda x: x[0], metrics))  # device 0's copy
      if metrics['nonfinite']:
        if not self.skip_nonfinite:
          raise NonFiniteLoss(step, float(metrics['loss']))
        self.skipped += 1
        self.on_skip(step, self.skipped)
        self._interval.update(steps=1)  # it ran; its non-finite metrics are not averaged
      else:
        self._interval.update({key: float(metrics[key]) for key in self.KEYS}, steps=1, kept=1)
      self._lr = float(metrics['lr'])
    return count

  def interval(self) -> dict[str, float]:
    """Means over the steps read since the last call whose loss was finite (none when every
    step was skipped), rates, the latest lr; starts a new one."""
    seconds, kept = time.monotonic() - self._interval_start, self._interval['kept']
    values = {key: self._interval[key] / kept for key in ('loss', 'accuracy', 'grad_norm')
              if kept}
    values.update(lr=self._lr, tokens_per_s=self._interval['tokens'] / seconds,
                  steps_per_s=self._interval['steps'] / seconds, skipped_updates=self.skipped)
    self._interval.clear()
    self._interval_start = time.monotonic()
    return values
