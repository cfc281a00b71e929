"""Device and host plumbing: jax.distributed, replication, prefetching, cross-host agreement."""

import collections
import concurrent.futures
import queue
import threading
from collections.abc import Generator, Iterator
from typing import Any

import jax
import numpy as np
from flax import jax_utils
from jax.experimental import multihost_utils

AXIS = 'batch'  # pmap's axis name, and the mesh axis of the arrays it takes and returns


def replicate(tree: Any, devices: list[jax.Device] | None = None) -> Any:
  """A copy of `tree` on each local device (or each of `devices`), stacked on a new leading
  axis: pmap's layout. The copies lie on a mesh of axis AXIS, as a pmap's outputs do, so that
  the state a step returns matches the one it was given and the step's first compiled program
  serves every later call (with flax's default axis name, the second step traced and compiled
  the whole train step again). Each device gets the host's copy of an array: stacking copies
  on a device (flax's jax_utils.replicate) compiles a program per array shape, at every run's
  start; PRNG keys, which have no host copy, are stacked so."""
  devices = devices or jax.local_devices()
  sharding = jax.NamedSharding(jax.sharding.Mesh(np.array(devices), (AXIS,)), jax.P(AXIS))

  def one(x: Any) -> jax.Array:
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      return jax_utils.replicate(x, devices, axis_name=AXIS)
    host = np.asarray(x)[None]
    return jax.make_array_from_callback((len(devices), *host.shape[1:]), sharding,
                                        lambda _: host)
  return jax.tree.map(one, tree)


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> None:
  """Joins a multi-host cluster through jax.distributed (arguments None: auto-detect, e.g. on
  SLURM or Cloud TPU). Call once, before anything else touches jax devices."""
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id)


def unreplicate(tree: Any) -> Any:
  """The first device's copy of a pmap-replicated tree, as host numpy arrays (read from that
  device's buffer: indexing the arrays would compile a program per shape)."""
  def first(x: Any) -> Any:  # [1, ...]
    if isinstance(x, jax.Array):
      return min(x.addressable_shards, key=lambda s: s.index[0].start or 0).data
    return np.asarray(x)[:1]
  return jax.tree.map(lambda x: x[0, ...], jax.device_get(jax.tree.map(first, tree)))


def shard(batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
  """Puts a host batch [local devices, ...] on the local devices, one slice each (for pmap)."""
  mesh = jax.sharding.Mesh(np.array(jax.local_devices()), (AXIS,))
  sharding = jax.NamedSharding(mesh, jax.P(AXIS))
  return jax.tree.map(lambda x: jax.device_put(x, sharding), batch)


def data_mesh(axis_name: str = 'data') -> jax.sharding.Mesh:
  """A one-axis mesh over every device of every process: data parallelism under `jax.jit`, the
  alternative to pmap (see `shard_rows`)."""
  return jax.make_mesh((jax.device_count(),), (axis_name,),
                       axis_types=(jax.sharding.AxisType.Auto,))  # XLA partitions the step


def replicate_on(tree: Any, mesh: jax.sharding.Mesh) -> Any:
  """`tree` (e.g. a TrainState) with every array copied to every device of `mesh`."""
  return jax.device_put(tree, jax.NamedSharding(mesh, jax.P()))


def shard_rows(batch: dict[str, np.ndarray], mesh: jax.sharding.Mesh) -> dict[str, jax.Array]:
  """This process's rows of a batch ([rows, ...] arrays) as global arrays whose rows are split
  over the mesh's first axis, for `jax.jit(train.train_step)`. The step then computes on the
  global batch: the loss over every process's real tokens, as pmap's psum does."""
  sharding = jax.NamedSharding(mesh, jax.P(mesh.axis_names[0]))
  return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), batch)


def prefetch(batches: Iterator[dict[str, np.ndarray]], size: int = 2, workers: int = 3
             ) -> Generator[tuple[dict[str, jax.Array], Any], None, None]:
  """Makes and transfers the next `size` batches in background threads while steps run.

  Yields (device batch, the iterator's state just after that batch), so that a checkpoint
  records the consumed position, not the prefetched one. An iterator with `advance()` and
  `assemble(pieces)` (data.PackedBatches) is advanced in order by one thread and its batches
  are assembled and transferred by `workers` threads at once (numpy's gathers release the GIL);
  any other iterator is read by one thread. An error in the iterator is raised here, at the
  batch it stopped. Close the generator to stop the threads.
  """
  advance = getattr(batches, 'advance', lambda: next(batches))
  assemble = getattr(batches, 'assemble', lambda batch: batch)
  pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix='prefetch-assemble')
  ready: queue.Queue = queue.Queue(maxsize=size)
  stop = threading.Event()

  def put(item: Any) -> bool:
    while not stop.is_set():
      try:
        ready.put(item, timeout=0.1)
        return True
      except queue.Full:
        pass
    return False

  def produce() -> None:
    try:
      while True:
        pieces = advance()
        job = pool.submit(lambda pieces=pieces: shard(assemble(pieces)))
        if not put((job, batches.get_state())):
          return
    except StopIteration:
      put(StopIteration())
    except Exception as e:  # pylint: disable=broad-except  (re-raised in the consumer)
      put(e)

  thread = threading.Thread(target=produce, name='prefetch', daemon=True)
  thread.start()
  try:
    while True:
      item = ready.get()
      if isinstance(item, StopIteration):
        return
      if isinstance(item, Exception):
        raise item
      job, state = item
      yield job.result(), state
  finally:
    stop.set()
    thread.join()
    pool.shutdown(wait=True, cancel_futures=True)


def devices_line() -> str:
  """Where jax computes, e.g. 'gpu: 8 × NVIDIA H100 80GB HBM3, 1 process' (all processes'
  devices; kinds listed apart when they differ)."""
  kinds = collections.Counter(device.device_kind for device in jax.devices())
  listed = ', '.join(f'{count} × {kind}' for kind, count in kinds.items())
  processes = jax.process_count()
  return f'{jax.default_backend()}: {listed}, {processes} process{"es" if processes > 1 else ""}'


def all_hosts(values: np.ndarray) -> np.ndarray:
  """values from every process, stacked on a new leading axis (a no-op with one process)."""
  if jax.process_count() == 1:
    return np.asarray(values)[None]
  return np.asarray(multihost_utils.process_allgather(np.asarray(values)))

