"""jaxformer.shapes: a call's batches and the shapes they are searched in."""

import os
import threading

import jax
import numpy as np

from jaxformer import shapes, translation


def test_a_calls_batches_are_even_and_longest_first():
  """Nine sentences in batches of at most four: three of three (one shape), not 4 + 4 + 1 (a
  second program for a batch of one row); 70 in 18 batches of 4 and 3."""
  lengths = [3, 9, 1, 4, 4, 8, 2, 7, 5]
  batches = shapes.groups(list(range(9)), lengths, 4, 1)
  assert [len(b) for b in batches] == [3, 3, 3]
  assert [lengths[i] for b in batches for i in b] == sorted(lengths, reverse=True)
  sizes = [len(b) for b in shapes.groups(list(range(70)), [1] * 70, 4, 1)]
  assert len(sizes) == 18 and sum(sizes) == 70 and {max(sizes), min(sizes)} == {4, 3}
  assert [len(b) for b in shapes.groups(list(range(5)), [1] * 5, 32, 2)] == [3, 2]  # shared
  assert shapes.groups([], [], 32, 2) == []


def test_batches_that_run_at_once_are_each_others_peers():
  batches = [[0, 1, 2], [3, 4]]
  assert shapes.peers(batches, batches[1], workers=2) == batches
  assert shapes.peers(batches, batches[1], workers=1) == [[3, 4]]
  # their one shape: the most rows (3 -> 4) and the longest sentence's bucket (20 -> 32)
  assert shapes.shape([20, 5, 9], 3, 32, 256, fixed=False) == (4, 32)
  assert shapes.shape([20], 3, 32, 256, fixed=True) == (32, 256)
  assert shapes.shape([300], 1, 32, 256, fixed=False) == (1, 256)
  assert [shapes.bucket(n) for n in (1, 8, 9, 64, 65)] == [8, 8, 16, 64, 128]


def test_run_batches_keeps_the_order_and_passes_each_its_peers():
  batches = [[0, 1], [2, 3], [4]]
  seen, lock = [], threading.Lock()

  def run(chosen, peers):
    with lock:
      seen.append((tuple(chosen), len(peers)))
    return sum(chosen)
  out = list(shapes.run_batches(batches, 3, run, progress=False, desc='x'))
  assert out == [([0, 1], 1), ([2, 3], 5), ([4], 4)]
  assert sorted(seen) == [((0, 1), 3), ((2, 3), 3), ((4,), 3)]
  seen.clear()
  assert [r for _, r in shapes.run_batches(batches, 2, run, False, 'x')] == [1, 5, 4]
  assert {n for _, n in seen} == {1}  # more batches than workers: each its own shape


def test_calls_share_their_threads():
  seen, meeting = set(), threading.Barrier(2, timeout=60)

  def run(chosen, peers):  # each call's first two batches run at once, on two threads
    seen.add(threading.current_thread())
    if chosen[0] < 2:
      meeting.wait()
    return chosen[0]
  for _ in range(3):  # threads of their own would be six
    assert [r for _, r in shapes.run_batches([[0], [1], [2], [3]], 2, run, False, 'x')] == [
        0, 1, 2, 3]
  assert len(seen) == 2 and all(t.name.startswith('jaxformer-batch') for t in seen)
  seen.clear()
  list(shapes.run_batches([[5]], 2, run, False, 'x'))  # one batch: the caller's thread
  assert seen == {threading.current_thread()}


def test_padded_fills_rows_and_unused_rows_with_zeros():
  np.testing.assert_array_equal(shapes.padded([[5, 6, 1], [7, 1]], (3, 4)),
                                [[5, 6, 1, 0], [7, 1, 0, 0], [0, 0, 0, 0]])


def test_default_workers_are_the_cores_on_cpu_and_one_on_an_accelerator(monkeypatch):
  assert shapes.default_workers() == min(len(os.sched_getaffinity(0)), 8)
  monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: set(range(64)))
  assert shapes.default_workers() == shapes.MAX_WORKERS == 8
  assert translation.default_workers is shapes.default_workers  # (its old home)
  monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
  assert shapes.default_workers() == 1
  assert shapes.fixed_shapes_on() and not shapes.fixed_shapes_on('cpu')
