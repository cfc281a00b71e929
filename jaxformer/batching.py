"""Requests given to one model together (`jaxformer serve`'s): a thread takes every request
that queued while the last search ran and those its clients send next, and searches those of
one kind and search as one request (protocol.merged), which the Translator sorts into length
buckets. Each request gets what it would alone: a sentence's search does not depend on its
batch (tests/test_serving.py). Standard library only, besides jaxformer.protocol.
"""

import concurrent.futures
import queue
import threading
import time
import typing
from typing import Any

from jaxformer import protocol
from jaxformer.errors import JaxformerError
from jaxformer.settings import DecodingConfig


class Key(typing.NamedTuple):
  """What requests must share to be searched together."""
  kind: type                         # protocol.TranslateRequest or protocol.ScoreRequest
  decoding: DecodingConfig | None    # the search (None for scores)
  nbest: int | None
  alone: object | None = None        # a sampling request's own (its keys follow its first_index)


def key_of(request: protocol.Request, base: DecodingConfig) -> Key:
  """The key of `request` on a model that searches with `base`."""
  if isinstance(request, protocol.ScoreRequest):
    return Key(protocol.ScoreRequest, None, None)
  decoding = request.decoding(base)
  return Key(protocol.TranslateRequest, decoding, request.nbest,
             object() if decoding.sampling else None)


class _Job(typing.NamedTuple):
  key: Key
  request: protocol.Request
  future: concurrent.futures.Future


class Batcher:
  """One model's requests, searched together (the module's docstring): up to max_batch
  sentences a search, waiting at most batch_wait seconds for more (_gather). `model` has
  `run(request)` and `decoding` (a Translator)."""

  def __init__(self, model: Any, max_batch: int, batch_wait: float):
    self.model, self.max_batch, self.batch_wait = model, max_batch, batch_wait
    self._queue: queue.Queue = queue.Queue()
    self._thread = threading.Thread(target=self._run, name='batcher', daemon=True)
    self._thread.start()

  def close(self) -> None:
    """Ends the thread once the requests queued before are answered."""
    self._queue.put(None)
    self._thread.join()

  def submit(self, request: protocol.Request) -> concurrent.futures.Future:
    """A future of the request's results (Translator.run's)."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    self._queue.put(_Job(key_of(request, self.model.decoding), request, future))
    return future

  def _run(self) -> None:
    expected, deadline = 1, 0.0
    while (job := self._queue.get()) is not None:
      jobs = self._gather(job, expected, deadline)
      start = time.monotonic()
      groups: dict[Key, list[_Job]] = {}
      for job in jobs:
        if job.future.set_running_or_notify_cancel():  # (not one that stopped waiting)
          groups.setdefault(job.key, []).append(job)
      for group in groups.values():
        self._answer(group)
      # The clients just answered come back (a closed loop), beside those who queued meanwhile.
      expected = len(jobs) + self._queue.qsize()
      end = time.monotonic()
      deadline = end + min(self.batch_wait, (end - start) / 2)

  def _gather(self, first: _Job, expected: int, deadline: float) -> list[_Job]:
    """`first` and the requests queued behind it, up to max_batch sentences; until `expected`
    are gathered (those the last search answered, and those that queued while it ran), it waits
    for more until `deadline` (time.monotonic: the last search's end + batch_wait, at most half
    its time). Without the wait, clients that send again as soon as they are answered split
    into two groups that take turns: the first to come back starts a search, and the others
    queue behind it."""
    jobs, sentences = [first], len(first.request.src)
    while sentences < self.max_batch:
      wait = deadline - time.monotonic() if len(jobs) < expected else 0.0
      try:
        job = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
      except queue.Empty:
        break
      if job is None:
        self._queue.put(None)  # (seen at the top, after these)
        break
      jobs.append(job)
      sentences += len(job.request.src)
    return jobs

  def _answer(self, group: list[_Job]) -> None:
    """One search for the group's requests; each alone when together they fail as a request
    (one bad prefix: its error, the others' answers)."""
    try:
      found = self.model.run(protocol.merged([job.request for job in group]))
    except JaxformerError as e:
      if len(group) > 1:
        for job in group:
          self._answer([job])
      else:
        group[0].future.set_exception(e)
      return
    except Exception as e:  # pylint: disable=broad-exception-caught
      for job in group:
        job.future.set_exception(e)
      return
    counts = [len(job.request.src) for job in group]
    if len(found) != sum(counts):  # a merge that would not come apart as it went in
      error = RuntimeError(f'the search of {sum(counts)} sentences gave {len(found)} answers')
      for job in group:
        job.future.set_exception(error)
      return
    start = 0
    for job, count in zip(group, counts):
      job.future.set_result(found[start:start + count])
      start += count
