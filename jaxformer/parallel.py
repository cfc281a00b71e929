"""Device and host plumbing: jax.distributed, replication, prefetching, cross-host agreement."""

import collections
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from flax import jax_utils
from jax.experimental import multihost_utils

replicate = jax_utils.replicate


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> None:
  """Joins a multi-host cluster through jax.distributed (arguments None: auto-detect, e.g. on
  SLURM or Cloud TPU). Call once, before anything else touches jax devices."""
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id)


def unreplicate(tree: Any) -> Any:
  """The first device's copy of a pmap-replicated tree, as host numpy arrays."""
  return jax.device_get(jax.tree.map(lambda x: x[0], tree))


def prefetch(batches: Iterator[dict[str, np.ndarray]], size: int = 2
             ) -> Iterator[tuple[dict[str, jax.Array], Any]]:
  """Puts the next `size` batches on the local devices ahead of use. Yields (device batch,
  the iterator's state just after that batch), so a checkpoint records the consumed position,
  not the prefetched one."""
  states: collections.deque = collections.deque()

  def with_states():
    for batch in batches:
      states.append(batches.get_state())
      yield batch

  for batch in jax_utils.prefetch_to_device(with_states(), size):
    yield batch, states.popleft()


def all_hosts(values: np.ndarray) -> np.ndarray:
  """values from every process, stacked on a new leading axis (a no-op with one process)."""
  if jax.process_count() == 1:
    return np.asarray(values)[None]
  return np.asarray(multihost_utils.process_allgather(np.asarray(values)))


def any_host(flag: bool) -> bool:
  """True on every process if `flag` is True on any (so that all hosts decide alike)."""
  return bool(all_hosts(np.array([flag])).any())
