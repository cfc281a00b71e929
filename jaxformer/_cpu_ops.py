"""XLA:CPU's stand-ins for the search's reductions: the same results as jnp.argmax and
jax.lax.top_k (and a row's maximum beside its top k), computed as vectorised reductions,
because XLA:CPU runs the originals as scalar loops or a one-threaded sort per row (measured in
docs/BENCHMARKS.md). decode.py uses them on every backend, so that the search is one program
whatever it runs on.
"""

import jax
import jax.numpy as jnp

Array = jax.Array


def argmax(x: Array) -> Array:
  """jnp.argmax over the last axis of x [N, V] (ties to the lower index; int32; in range for
  a row holding NaN too), as vectorised reductions, because XLA:CPU lowers argmax's (value,
  index) reduction to a scalar loop (measured in docs/BENCHMARKS.md). Long rows go through
  block maxima (`_blocks`): one pass over x, where a maximum and then the lowest index holding
  it are two, and the logits of a step are its largest array."""
  vocab = x.shape[-1]
  if vocab < 8 * BLOCK:
    return _first(x, jnp.max(x, axis=-1, keepdims=True))
  maxima = _blocks(x)  # [N, ceil(V / BLOCK)]
  most = jnp.max(maxima, axis=-1, keepdims=True)
  block = _first(maxima, most)[:, None]  # the first block holding the maximum
  indices, own = _entries(block, vocab)  # [N, BLOCK]
  return jnp.min(jnp.where((jnp.take_along_axis(x, indices, axis=1) == most) & own, indices,
                           vocab - 1), axis=-1)


def _first(x: Array, most: Array) -> Array:
  """The lowest index of each row of x [N, V] holding its `most` [N, 1] (V - 1 if none does:
  a row holding NaN)."""
  vocab = x.shape[-1]
  return jnp.min(jnp.where(x == most, jnp.arange(vocab, dtype=jnp.int32), vocab - 1), axis=-1)


BLOCK = 32  # entries per block of `argmax`'s and `top_k`'s first pass


def _short(vocab: int, k: int) -> bool:
  """Whether top_k's rows are too short for blocks to pay: fewer than 16 blocks, or than 2k
  (measured in docs/benchmarks-log.md)."""
  return vocab < max(16, 2 * k) * BLOCK


def _blocks(x: Array) -> Array:
  """The maximum of each block of BLOCK entries of x [N, V]'s rows: [N, ceil(V / BLOCK)]."""
  return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, BLOCK), (1, BLOCK),
                               [(0, 0), (0, -x.shape[-1] % BLOCK)])


def _entries(blocks: Array, vocab: int) -> tuple[Array, Array]:
  """(indices [N, k * BLOCK] of the entries of blocks [N, k], in order; whether each is its
  block's own). A short last block is read from an earlier start; the entries before it
  belong to the block before, which may be chosen as well, and are masked out."""
  n, k = blocks.shape
  starts = jnp.minimum(blocks * BLOCK, vocab - BLOCK)[:, :, None]
  indices = (starts + jnp.arange(BLOCK)).reshape(n, k * BLOCK)
  return indices, indices >= jnp.repeat(blocks * BLOCK, BLOCK, axis=-1)


def top_k(x: Array, k: int) -> tuple[Array, Array]:
  """jax.lax.top_k over the last axis of x [N, V] (values, then indices; ties to the lower
  index), through block maxima when rows are long.

  XLA:CPU's TopK sorts each row on one thread (about 5 ns an entry), while a max over blocks
  of BLOCK entries is a vectorised reduction. The k largest entries lie in the k blocks with
  the largest maxima, so TopK runs on the V / BLOCK maxima and then on those k blocks' entries,
  kept in index order so that ties resolve as before. Short rows go to TopK directly.
  """
  if _short(x.shape[-1], k):
    return jax.lax.top_k(x, k)
  return _top_k_of_blocks(x, _blocks(x), k)


def top_k_and_max(x: Array, k: int, fill: float) -> tuple[Array, Array, Array]:
  """(top_k's values and indices of x [N, V] with its first entry (padding) at `fill`, and x's
  maximum [N, 1]). For long rows the block maxima of `top_k` give the maximum as well (block
  0's recomputed without the first entry), so neither takes a pass of its own over x."""
  if _short(x.shape[-1], k):
    return (*top_k(x.at[:, 0].set(fill), k), jnp.max(x, axis=-1, keepdims=True))
  maxima = _blocks(x)
  first = jnp.maximum(jnp.max(x[:, 1:BLOCK], axis=-1), fill)  # block 0's, padding at fill
  return (*_top_k_of_blocks(x, maxima.at[:, 0].set(first), k, fill),
          jnp.max(maxima, axis=-1, keepdims=True))


def _top_k_of_blocks(x: Array, maxima: Array, k: int, fill: float | None = None
                     ) -> tuple[Array, Array]:
  """top_k of x given its block maxima [N, ceil(V / BLOCK)]; with `fill`, x's first entry read
  as fill."""
  blocks = jnp.sort(jax.lax.top_k(maxima, k)[1], axis=-1)  # [N, k]
  indices, own = _entries(blocks, x.shape[-1])
  entries = jnp.take_along_axis(x, indices, axis=1)
  if fill is not None:
    entries = jnp.where(indices == 0, fill, entries)
  top, where = jax.lax.top_k(jnp.where(own, entries, -jnp.inf), k)
  return top, jnp.take_along_axis(indices, where, axis=1)
