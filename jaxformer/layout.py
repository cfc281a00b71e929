"""Where each pair lies in a packed row: the contract between data.packing, which fills rows
with several pairs, and the model, which masks attention by it. Per side, segment ids (0 for
padding, then 1, 2, ... for the pairs of a row) and positions that restart at 0 for each pair.
A packed batch carries the four arrays under `Layout`'s field names (`Layout.of` reads them);
a field left None means one sentence per row. `first_fit` and `packed` lay out a few thousand
pairs on the host (translation's scores); data.packing packs a training corpus.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Layout:
  """The segment ids and positions [B, S] of the source and [B, T] of the target."""

  src_segments: Array | None = None
  src_positions: Array | None = None
  tgt_segments: Array | None = None
  tgt_positions: Array | None = None

  @classmethod
  def of(cls, batch: Mapping[str, Any]) -> 'Layout':
    """The layout a batch carries (a packed batch: all four; a plain one: none)."""
    return cls(**{name: batch.get(name) for name in FIELDS})

  def source(self, src: Array) -> tuple[Array, Array]:
    """(segments, positions) of source tokens [B, S]: without a layout, the non-padding
    tokens are one segment and positions count from 0."""
    segments = (src != 0).astype(jnp.int32) if self.src_segments is None else self.src_segments
    return segments, _positions(src, self.src_positions)

  def target(self, tgt_in: Array) -> tuple[Array, Array]:
    """(segments, positions) of decoder inputs [B, T]: without a layout, every position is in
    the one segment, padding too, which needs no mask (it comes after the real tokens, which the
    causal mask already hides from it)."""
    segments = jnp.ones_like(tgt_in) if self.tgt_segments is None else self.tgt_segments
    return segments, _positions(tgt_in, self.tgt_positions)


FIELDS = tuple(field.name for field in dataclasses.fields(Layout))
jax.tree_util.register_dataclass(Layout, data_fields=list(FIELDS), meta_fields=[])


def _positions(tokens: Array, positions: Array | None) -> Array:
  return jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape) if positions is None \
      else positions


# --- packing a few thousand pairs on the host (translation's scores) ----------------------------

OPEN_ROWS = 16  # the last rows opened that can still take the next pair (data.packing's name)


def first_fit(lengths: list[tuple[int, int]], width: int) -> list[list[int]]:
  """Rows of `width` tokens a side for pairs of these (source, target) lengths: the pairs'
  indices in each row, longest targets first, each pair in the first row with room on both
  sides among the last OPEN_ROWS opened (first fit over a window, as data.packing packs training
  rows; not its pack_rows, a jitted program that a score call would compile first, for pairs
  that number thousands, not millions)."""
  order = sorted(range(len(lengths)), key=lambda i: (-lengths[i][1], -lengths[i][0]))
  rows: list[list[int]] = []
  room: list[list[int]] = []  # [source, target] tokens left in each row
  for i in order:
    src, tgt = lengths[i]
    fits = next((r for r in range(max(0, len(rows) - OPEN_ROWS), len(rows))
                 if room[r][0] >= src and room[r][1] >= tgt), None)
    if fits is None:
      fits = len(rows)
      rows.append([])
      room.append([width, width])
    rows[fits].append(i)
    room[fits][0] -= src
    room[fits][1] -= tgt
  return rows


def packed(rows: list[list[tuple[list[int], list[int]]]], size: int, width: int
           ) -> tuple[np.ndarray, np.ndarray, Layout]:
  """(source ids, target ids, their Layout), each [size, width], of rows of pairs (each side's
  ids, EOS included), a row's pairs in order; rows after the given ones are padding."""
  sides = [{key: np.zeros((size, width), np.int32) for key in ('ids', 'segments', 'positions')}
           for _ in range(2)]  # the source's, the target's
  for r, row in enumerate(rows):
    for side, out in enumerate(sides):
      start = 0
      for segment, pair in enumerate(row, 1):
        where = slice(start, start + len(pair[side]))
        out['ids'][r, where] = pair[side]
        out['segments'][r, where] = segment
        out['positions'][r, where] = np.arange(len(pair[side]))
        start += len(pair[side])
  src, tgt = sides
  return src['ids'], tgt['ids'], Layout(src['segments'], src['positions'], tgt['segments'],
                                        tgt['positions'])
