"""jaxformer.parallel: prefetching, and pmap over 8 devices or 2 processes equal to one."""

import logging
import pathlib
import socket
import subprocess
import threading

import jax
import numpy as np
import pytest
from helpers import assert_trees_equal, start_worker

from jaxformer import parallel


class _Counter:
  """Batches {'x': i} for i = 1..n, with a state; raises at `fail_at`."""

  def __init__(self, n, fail_at=None):
    self.i, self.n, self.fail_at = 0, n, fail_at

  def __iter__(self):
    return self

  def __next__(self):
    if self.i == self.fail_at:
      raise ValueError(f'bad batch {self.i}')
    if self.i == self.n:
      raise StopIteration
    self.i += 1
    return {'x': np.full((jax.local_device_count(), 2), self.i, np.int32)}

  def get_state(self):
    return {'row': self.i}


def _prefetch_threads():
  return [t for t in threading.enumerate() if t.name == 'prefetch']


def test_prefetch_keeps_order_and_states_and_stops_its_thread():
  got = [(int(batch['x'][0, 0]), state) for batch, state in parallel.prefetch(_Counter(5))]
  assert got == [(i, {'row': i}) for i in range(1, 6)]
  stream = parallel.prefetch(_Counter(100), size=2)
  batch, _ = next(stream)
  assert isinstance(batch['x'], jax.Array) and batch['x'].shape == (jax.local_device_count(), 2)
  stream.close()
  assert not _prefetch_threads()


def test_prefetch_raises_the_iterators_error_at_its_batch():
  stream = parallel.prefetch(_Counter(10, fail_at=3))
  assert [int(b['x'][0, 0]) for _, (b, _) in zip(range(3), stream)] == [1, 2, 3]
  with pytest.raises(ValueError, match='bad batch 3'):
    next(stream)
  assert not _prefetch_threads()


def _finish(process: subprocess.Popen) -> None:
  output, _ = process.communicate(timeout=300)
  assert process.returncode == 0, output[-3000:]


def _load_npz(path) -> dict:
  with np.load(path) as f:
    return dict(f)


def test_a_step_traces_once_for_the_state_it_returns():
  """replicate() lays the state out as pmap returns it: the second step reuses the first's
  program (with flax's default mesh axis name, every run traced and compiled its step twice)."""
  traces = []

  def step(state, batch):
    traces.append(1)
    return {'w': state['w'] + jax.lax.psum(batch, parallel.AXIS)}

  p_step = jax.pmap(step, axis_name=parallel.AXIS, donate_argnums=0)
  state = parallel.replicate({'w': np.zeros(3, np.float32)})
  for _ in range(3):
    state = p_step(state, parallel.shard(np.ones((jax.local_device_count(), 3), np.float32)))
  assert len(traces) == 1
  np.testing.assert_array_equal(parallel.unreplicate(state)['w'], 3 * jax.local_device_count())


def test_a_state_goes_to_the_devices_and_back_compiling_nothing(caplog):
  """replicate() gives each device the host's copy and unreplicate() reads the first device's
  buffer: no program per array shape (flax's replicate stacked the copies on a device and x[0]
  read one back, both compiled at every run's start and first save); the same values, dtypes
  and PRNG key come back."""
  state = {'w': np.arange(6, dtype=np.float32).reshape(2, 3), 'step': 7,
           'b': jax.device_put(np.ones(4, np.int32))}
  key, devices = jax.random.key(1), jax.local_device_count()
  with jax.log_compiles(True), caplog.at_level(logging.DEBUG):
    replicated = parallel.replicate(state)
    back = parallel.unreplicate(replicated)
  assert not [r.getMessage() for r in caplog.records if 'compil' in r.getMessage().lower()]
  assert replicated['w'].shape == (devices, 2, 3)
  assert replicated['w'].sharding.spec == jax.P(parallel.AXIS)
  assert replicated['step'].dtype == np.int32 and back['step'].shape == ()
  assert back['step'] == 7 and back['w'].dtype == np.float32
  np.testing.assert_array_equal(back['w'], state['w'])
  np.testing.assert_array_equal(back['b'], np.ones(4, np.int32))
  keys = parallel.replicate(key)
  assert keys.shape == (devices,)
  np.testing.assert_array_equal(jax.random.key_data(keys)[0], jax.random.key_data(key))


@pytest.fixture(scope='module')
def one_process(tmp_path_factory) -> pathlib.Path:
  """The params after 3 steps of one process with 8 devices: pmap over 8, over 1 and over 2 (fed
  like the two hosts below), and jax.jit over an 8-device mesh (tests/distributed_worker.py)."""
  folder = tmp_path_factory.mktemp('one_process')
  _finish(start_worker('devices', str(folder), tmp_path=folder))
  return folder


@pytest.mark.slow
def test_eight_devices_equal_one_device_on_the_same_global_batch(one_process):
  """pmap over 8 devices, pmap on 1 and jax.jit over an 8-device mesh (parallel.data_mesh,
  shard_rows) give the same params after 3 steps of the same global batches."""
  eight = _load_npz(one_process / 'devices8.npz')
  assert_trees_equal(eight, _load_npz(one_process / 'devices1.npz'), atol=1e-5, rtol=0)
  assert_trees_equal(eight, _load_npz(one_process / 'jit8.npz'), atol=1e-5, rtol=0)


@pytest.mark.slow
def test_two_processes_equal_one_process(tmp_path, one_process):
  with socket.socket() as s:
    s.bind(('localhost', 0))
    port = str(s.getsockname()[1])
  hosts = [start_worker('host', str(i), port, str(tmp_path / 'hosts.npz'), tmp_path=tmp_path)
           for i in range(2)]
  for process in hosts:
    _finish(process)
  assert_trees_equal(_load_npz(tmp_path / 'hosts.npz'), _load_npz(one_process / 'hosts2.npz'),
                     atol=1e-5, rtol=0)
