"""What the sections share: timing, the matmul peak, peak RSS and random full batches."""

import contextlib
import fcntl
import pathlib
import resource
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]


def peak_rss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


@contextlib.contextmanager
def turn(lock: str | None, *, compiling: bool = False):
  """Bench processes that share one GPU, through the file `lock` (None: no lock): they compile
  side by side (compiling: a shared lock) and time in turn, never while one of them compiles
  (an exclusive lock). XLA's autotuning runs kernels on the GPU as it compiles."""
  if lock is None:
    yield
    return
  with open(lock, 'a', encoding='utf-8') as file:
    fcntl.flock(file, fcntl.LOCK_SH if compiling else fcntl.LOCK_EX)  # released on close
    yield


def median_time(fn, runs: int) -> tuple[float, float]:
  """(compile + first run, median of `runs` more), each ended with block_until_ready."""
  start = time.perf_counter()
  jax.block_until_ready(fn())
  first = time.perf_counter() - start
  times = []
  for _ in range(runs):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return first, statistics.median(times)


def matmul_peak(dtype: Any, sizes: tuple[int, ...], *, seconds: float = 0.1) -> dict:
  """FLOP/s of square jnp.dot in `dtype` on one device on random operands (constant ones can
  run faster than real data); the peak is the best size's. Per size: the median of 5 samples,
  after one more as warm-up. On a GPU each sample is `seconds` of products queued back to back
  (one call's dispatch is not a small product's time, and the clocks rise under load); a CPU's
  runtime may overlap queued products, so there a sample is one."""
  results = {}
  dot = jax.jit(jnp.dot)
  for n in sizes:
    a, b = jax.random.normal(jax.random.key(n), (2, n, n), dtype)
    _, one = median_time(lambda a=a, b=b: dot(a, b), runs=1)  # compiled first
    reps = max(1, int(seconds / one)) if jax.default_backend() == 'gpu' else 1
    def queued(a=a, b=b, reps=reps):  # each product's output freed as the next is queued
      for _ in range(reps):
        out = dot(a, b)
      return out
    _, median = median_time(queued, runs=5)  # the first of its runs warms up
    results[str(n)] = round(2 * n ** 3 * reps / median / 1e9, 1)
  return {'dtype': jnp.dtype(dtype).name, 'gflops_by_size': results,
          'peak_gflops': max(results.values())}


def random_batch(num_devices: int, rows: int, length: int, vocab: int) -> dict:
  """Full rows (one segment each) of random tokens: the packed batch at 100% efficiency."""
  rng = np.random.default_rng(0)
  shape = (num_devices, rows, length)
  tokens = rng.integers(3, vocab, size=shape).astype(np.int32)
  positions = np.broadcast_to(np.arange(length, dtype=np.int32), shape).copy()
  ones = np.ones(shape, np.int32)
  return {'src': tokens, 'tgt_in': tokens, 'tgt_out': tokens, 'weights': ones.astype(np.float32),
          'src_segments': ones, 'tgt_segments': ones, 'src_positions': positions,
          'tgt_positions': positions}
