"""A call's sentences in batches, and the shapes the batches are searched or scored in: few
programs to compile, since on a CPU a compile costs more than a batch's search, and on an
accelerator seconds. Translator (jaxformer.translation) runs the batches this module makes.
"""

import concurrent.futures
import functools
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

MAX_WORKERS = 8  # each batch in flight holds a decoding cache of its own: memory grows with them


def default_workers() -> int:
  """Batches searched side by side: on CPU one per core this process may use, at most
  MAX_WORKERS, since XLA:CPU runs a small model's search on little more than one core
  (measured in docs/benchmarks-log.md); elsewhere one, as an accelerator runs one program at a
  time."""
  if jax.default_backend() != 'cpu':
    return 1
  cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()
  return min(cores or 1, MAX_WORKERS)


def fixed_shapes_on(backend: str | None = None) -> bool:
  """Whether searches and scores on `backend` (default: jax's) take one shape, batch_size rows
  of the model's max_len tokens, whatever the batch holds. On an accelerator a program's
  compile costs seconds (XLA autotunes its kernels) and padding costs little, so one program
  for every batch of every call, the run's validations included, beats a program per length
  bucket; a CPU compiles in a fraction of that and pays for every padded row and column, so
  there a batch is cut to its length bucket (bucket) and rows (rows)."""
  return (backend or jax.default_backend()) != 'cpu'


def bucket(length: int) -> int:
  """Lengths are padded to powers of two (at least 8): few compiled programs."""
  return max(8, 1 << (length - 1).bit_length())


def rows(sentences: int, batch_size: int) -> int:
  """A batch's rows: its sentences padded to a power of two, at most batch_size. A search costs
  what its rows cost, finished or padding, so one sentence (a server's request, a terminal's
  line) is searched in one row, not in batch_size."""
  return min(batch_size, 1 << (sentences - 1).bit_length())


def shape(lengths: Sequence[int], count: int, batch_size: int, max_len: int, fixed: bool
          ) -> tuple[int, int]:
  """(rows, width) of a batch of `count` sequences whose longest has max(lengths) tokens."""
  if fixed:
    return batch_size, max_len
  return rows(count, batch_size), min(bucket(max(lengths)), max_len)


def padded(ids: list[list[int]], to: tuple[int, int]) -> np.ndarray:
  """ids in an int32 array of shape `to`, padded with 0 (the batch's unused rows too)."""
  out = np.zeros(to, np.int32)
  for r, row in enumerate(ids):
    out[r, :len(row)] = row
  return out


def groups(todo: list[int], lengths: list[int], batch_size: int, workers: int
           ) -> list[list[int]]:
  """`todo`'s indices in batches of at most batch_size, longest first (the longest start
  first, so that workers finish together); fewer sentences than the workers' batches are
  shared among the workers, so that none idles (a server's few requests). The batches are
  as even as can be (sizes one apart): a short last batch would be a program of its own
  rows and often its own length bucket, whose compile costs more than a batch's search."""
  if not todo:  # nothing to search (blank lines, or pairs all too long): no batch at all
    return []
  todo = sorted(todo, key=lambda i: -lengths[i])
  size = min(batch_size, -(-len(todo) // workers))
  return [part.tolist() for part in np.array_split(todo, -(-len(todo) // size))]


def peers(batches: list[list[int]], chosen: list[int], workers: int) -> list[list[int]]:
  """The batches whose shape the batch `chosen` takes, the largest rows and length bucket
  among them: all of a call's batches where they all run at once (no more of them than the
  workers), so that a call of a few sentences (a training run's samples, a server's requests
  shared among the workers) compiles one program rather than one a batch, and the padding
  costs little beside them, as the largest batch sets the wait; else its own."""
  return batches if len(batches) <= workers else [chosen]


def run_batches(batches: list[list[int]], workers: int,
                run: Callable[[list[int], list[list[int]]], Any], progress: bool, desc: str,
                count: Callable[[list[int]], int] = len) -> Iterator[tuple[list[int], Any]]:
  """run(batch, its peers) over `batches` by `workers` threads side by side (`_pool`); (batch,
  its result) in their order. The progress bar counts `count(batch)` for each (sentences)."""
  of = [peers(batches, chosen, workers) for chosen in batches]
  if min(workers, len(batches)) <= 1:
    yield from _in_order(batches, map(run, batches, of), progress, desc, count)
    return
  futures = [_pool(workers).submit(run, chosen, peers) for chosen, peers in zip(batches, of)]
  try:
    yield from _in_order(batches, (future.result() for future in futures), progress, desc,
                         count)
  finally:  # an error, or a caller that stops early: no batch is started after it, and those
    for future in futures:  # under way end before the call returns
      future.cancel()
    concurrent.futures.wait(futures)


def _in_order(batches: list[list[int]], results: Iterator[Any], progress: bool, desc: str,
              count: Callable[[list[int]], int]) -> Iterator[tuple[list[int], Any]]:
  """(batch, its result) in the batches' order, the progress bar counting each."""
  with tqdm(total=sum(map(count, batches)), desc=desc, unit='sent', disable=not progress) as bar:
    for chosen, result in zip(batches, results):
      yield chosen, result
      bar.update(count(chosen))


@functools.cache
def _pool(workers: int) -> concurrent.futures.ThreadPoolExecutor:
  """The threads of every call of the process that runs `workers` batches side by side, started
  by the first that needs them: a server's request of a few sentences would otherwise start
  threads of its own, which costs a share of its search (docs/benchmarks-log.md). Calls at
  once (a server's) queue their batches on the same threads."""
  return concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix='jaxformer-batch')
