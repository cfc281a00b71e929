"""XLA:CPU's stand-ins for two reductions of the search: the same results as jnp.argmax and
jax.lax.top_k, computed as vectorised reductions, because XLA:CPU runs the originals as
scalar loops or a one-threaded sort per row (measured in docs/BENCHMARKS.md). decode.py uses
them on every backend, so that the search is one program whatever it runs on.
"""

import jax
import jax.numpy as jnp

Array = jax.Array


def argmax(x: Array) -> Array:
  """jnp.argmax over the last axis of x [N, V] (ties to the lower index; int32; in range for
  a row holding NaN too) as two vectorised reductions: the maximum, then the lowest index
  holding it, because XLA:CPU lowers argmax's (value, index) reduction to a scalar loop
  (measured in docs/BENCHMARKS.md)."""
  most = jnp.max(x, axis=-1, keepdims=True)
  vocab = x.shape[-1]
  return jnp.min(jnp.where(x == most, jnp.arange(vocab, dtype=jnp.int32), vocab - 1),
                 axis=-1)


BLOCK = 32  # entries per block of `top_k`'s first pass


def top_k(x: Array, k: int) -> tuple[Array, Array]:
  """jax.lax.top_k over the last axis of x [N, V] (values, then indices; ties to the lower
  index), through block maxima when rows are long.

  XLA:CPU's TopK sorts each row on one thread (about 5 ns an entry), while a max over blocks
  of BLOCK entries is a vectorised reduction. The k largest entries lie in the k blocks with
  the largest maxima, so TopK runs on the V / BLOCK maxima and then on those k blocks' entries,
  kept in index order so that ties resolve as before. Short rows go to TopK directly.
  """
  n, vocab = x.shape
  if vocab < 64 * BLOCK:
    return jax.lax.top_k(x, k)
  maxima = jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, BLOCK), (1, BLOCK),
                                 [(0, 0), (0, -vocab % BLOCK)])  # [N, ceil(V / BLOCK)]
  blocks = jnp.sort(jax.lax.top_k(maxima, k)[1], axis=-1)  # [N, k]
  # A short last block is read from an earlier start; the entries before it belong to the
  # block before, which may be chosen as well, and are masked out here.
  starts = jnp.minimum(blocks * BLOCK, vocab - BLOCK)[:, :, None]
  indices = (starts + jnp.arange(BLOCK)).reshape(n, k * BLOCK)
  own = indices >= jnp.repeat(blocks * BLOCK, BLOCK, axis=-1)
  top, where = jax.lax.top_k(jnp.where(own, jnp.take_along_axis(x, indices, axis=1), -jnp.inf),
                             k)
  return top, jnp.take_along_axis(indices, where, axis=1)
