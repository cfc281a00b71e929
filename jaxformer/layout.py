"""Where each pair lies in a packed row: the contract between data.packing, which fills rows
with several pairs, and the model, which masks attention by it. Per side, segment ids (0 for
padding, then 1, 2, ... for the pairs of a row) and positions that restart at 0 for each pair.
A packed batch carries the four arrays under `Layout`'s field names (`Layout.of` reads them);
a field left None means one sentence per row.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

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
