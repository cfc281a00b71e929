"""Pack tokenised pairs into fixed-shape rows and serve them as resumable, sharded batches.

A row of length L holds several whole pairs on each side: their tokens, segment ids (1, 2, ...
in the row; 0 = padding) and positions restarting at 0. Every batch has the same shape, so the
train step compiles once, and every host steps in lockstep.
"""

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from jaxformer.data.cache import TokenizedCorpus

Batch = dict[str, np.ndarray]


def _first_fit(src_lengths: np.ndarray, tgt_lengths: np.ndarray, src_len: int,
               tgt_len: int) -> np.ndarray:
  """The row of each pair when each goes into the first row where both its sides fit."""
  src_fill = np.zeros(len(src_lengths), np.int64)
  tgt_fill = np.zeros(len(src_lengths), np.int64)
  row, num_rows = np.empty(len(src_lengths), np.int64), 0
  for i, (s, t) in enumerate(zip(src_lengths.tolist(), tgt_lengths.tolist())):
    fits = np.flatnonzero((src_fill[:num_rows] <= src_len - s) &
                          (tgt_fill[:num_rows] <= tgt_len - t))
    k = fits[0] if len(fits) else num_rows
    num_rows = max(num_rows, k + 1)
    src_fill[k] += s
    tgt_fill[k] += t
    row[i] = k
  return row


def pack_rows(src_lengths: np.ndarray, tgt_lengths: np.ndarray, src_len: int, tgt_len: int,
              rng: np.random.Generator | None = None, window: int = 4096) -> np.ndarray:
  """Assigns each pair to a row of src_len source and tgt_len target tokens.

  Pairs are packed a window at a time by first fit, once in the given order and once in
  decreasing size (first-fit decreasing); the window keeps whichever needs fewer rows. Neither
  wins everywhere when both sides must fit. With `rng`, rows are shuffled within each window.

  Returns:
    [num_pairs] row ids, numbered from 0 without gaps.
  """
  if len(src_lengths) and (src_lengths.max() > src_len or tgt_lengths.max() > tgt_len):
    raise ValueError(f'a pair is longer than the rows ({src_len} source, {tgt_len} target '
                     'tokens)')
  rows = np.empty(len(src_lengths), np.int64)
  first_row = 0
  for begin in range(0, len(src_lengths), window):
    src, tgt = src_lengths[begin:begin + window], tgt_lengths[begin:begin + window]
    in_order = _first_fit(src, tgt, src_len, tgt_len)
    decreasing = np.argsort(-(src / src_len + tgt / tgt_len), kind='stable')
    by_size = np.empty_like(in_order)
    by_size[decreasing] = _first_fit(src[decreasing], tgt[decreasing], src_len, tgt_len)
    best = by_size if by_size.max() < in_order.max() else in_order
    num_rows = int(best.max()) + 1
    if rng is not None:
      best = rng.permutation(num_rows)[best]
    rows[begin:begin + window] = first_row + best
    first_row += num_rows
  return rows


def _starts_in_row(lengths: np.ndarray, row: np.ndarray, row_begin: np.ndarray) -> np.ndarray:
  """Where each pair starts in its row; pairs sorted by row, in order within a row."""
  begins = np.cumsum(lengths) - lengths
  return begins - begins[row_begin[row]]


@dataclasses.dataclass(frozen=True)
class _EpochPlan:
  """Where every pair of one epoch goes: pairs sorted by row, and each row's first pair."""
  pairs: np.ndarray       # corpus indices, grouped by row, in row order
  row: np.ndarray         # aligned with `pairs`: the row of each
  src_start: np.ndarray   # aligned with `pairs`
  tgt_start: np.ndarray
  segment: np.ndarray     # 1-based rank of the pair in its row
  row_begin: np.ndarray   # [num_rows + 1]: pairs[row_begin[r]:row_begin[r + 1]] are in row r

  @property
  def num_rows(self) -> int:
    return len(self.row_begin) - 1


def _fill(out: np.ndarray, tokens: np.ndarray, offsets: np.ndarray, pairs: np.ndarray,
          dest: np.ndarray, segments: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Copies each pair's tokens to out.flat[dest:...]; returns the flat slots, segments and
  positions written (all vectorised: no Python loop over tokens)."""
  lengths = offsets[pairs + 1] - offsets[pairs]
  total = int(lengths.sum())
  first = np.cumsum(lengths) - lengths               # where each pair starts among the copied
  within = np.arange(total) - np.repeat(first, lengths)
  source = np.repeat(offsets[pairs], lengths) + within
  slots = np.repeat(dest, lengths) + within
  out.flat[slots] = tokens[source]
  return slots, np.repeat(segments, lengths), within


class PackedBatches(Iterator[Batch]):
  """Seeded, resumable, host-sharded batches of packed rows.

  Each batch is a dict of int32 arrays [num_devices, rows_per_device, src_len] (src,
  src_segments, src_positions) and [num_devices, rows_per_device, tgt_len] (tgt_in: the
  targets shifted right within each segment, starting with 0; tgt_out, tgt_segments,
  tgt_positions; and float32 weights, 1 on real target tokens). Host `process_index` of
  `process_count` reads the pairs i with i % process_count == process_index. Epochs are
  reshuffled with (seed, epoch); with num_epochs=None the stream is endless and rows run on
  from one epoch into the next, otherwise the last batch is completed with empty rows.
  """

  def __init__(self, corpus: TokenizedCorpus, *, src_len: int, tgt_len: int,
               rows_per_device: int, num_devices: int = 1, seed: int = 0, shuffle: bool = True,
               num_epochs: int | None = None, process_index: int = 0, process_count: int = 1):
    self.corpus = corpus
    self.src_len, self.tgt_len = src_len, tgt_len
    self.rows_per_device, self.num_devices = rows_per_device, num_devices
    self.seed, self.shuffle, self.num_epochs = seed, shuffle, num_epochs
    self.shard = np.arange(process_index, len(corpus), process_count)
    if not len(self.shard):
      raise ValueError(f'host {process_index} of {process_count} has no pairs '
                       f'({len(corpus)} in all).')
    self._epoch, self._row = 0, 0
    self._plan: tuple[int, _EpochPlan] | None = None

  # --- state -----------------------------------------------------------------------------------

  def get_state(self) -> dict[str, Any]:
    """A small JSON-serialisable position in the stream."""
    return {'epoch': self._epoch, 'row': self._row, 'seed': self.seed,
            'shard_size': len(self.shard)}

  def set_state(self, state: dict[str, Any]) -> None:
    """Continues from a `get_state` of an iterator over the same corpus and settings."""
    if (state['seed'], state['shard_size']) != (self.seed, len(self.shard)):
      raise ValueError(
          f'data state is for seed {state["seed"]} and {state["shard_size"]} pairs per host, '
          f'but this iterator has seed {self.seed} and {len(self.shard)}.')
    self._epoch, self._row = int(state['epoch']), int(state['row'])

  # --- planning --------------------------------------------------------------------------------

  def _epoch_plan(self, epoch: int) -> _EpochPlan:
    if self._plan is None or self._plan[0] != epoch:
      rng = np.random.default_rng([self.seed, epoch]) if self.shuffle else None
      order = self.shard if rng is None else rng.permutation(self.shard)
      src_lengths, tgt_lengths = self.corpus.src_lengths[order], self.corpus.tgt_lengths[order]
      row = pack_rows(src_lengths, tgt_lengths, self.src_len, self.tgt_len, rng)
      by_row = np.argsort(row, kind='stable')
      row = row[by_row]
      row_begin = np.searchsorted(row, np.arange(row[-1] + 2))
      self._plan = (epoch, _EpochPlan(
          pairs=order[by_row], row=row,
          src_start=_starts_in_row(src_lengths[by_row], row, row_begin),
          tgt_start=_starts_in_row(tgt_lengths[by_row], row, row_begin),
          segment=np.arange(len(row)) - row_begin[row] + 1, row_begin=row_begin))
    return self._plan[1]

  def rows_in_epoch(self, epoch: int = 0) -> int:
    return self._epoch_plan(epoch).num_rows

  # --- batches ---------------------------------------------------------------------------------

  def __next__(self) -> Batch:
    rows = self.num_devices * self.rows_per_device
    batch = self._zeros()
    filled = 0
    while filled < rows:
      if self.num_epochs is not None and self._epoch >= self.num_epochs:
        if filled == 0:
          raise StopIteration
        break  # the rest of the last batch stays empty
      plan = self._epoch_plan(self._epoch)
      take = min(rows - filled, plan.num_rows - self._row)
      begin, end = plan.row_begin[self._row], plan.row_begin[self._row + take]
      out_row = plan.row[begin:end] - self._row + filled  # the batch row of each pair
      self._write(batch, plan, slice(begin, end), out_row)
      filled += take
      self._row += take
      if self._row == plan.num_rows:
        self._epoch, self._row = self._epoch + 1, 0
    return self._finish(batch)

  def empty_batch(self) -> Batch:
    """A batch of the same shapes holding no pairs (all padding, weights 0)."""
    return self._finish(self._zeros())

  def _zeros(self) -> Batch:
    rows = self.num_devices * self.rows_per_device
    return {f'{side}_{key}': np.zeros((rows, length), np.int32)
            for side, length in (('src', self.src_len), ('tgt', self.tgt_len))
            for key in ('tokens', 'segments', 'positions')}

  def _write(self, batch: Batch, plan: _EpochPlan, pairs: slice, out_row: np.ndarray) -> None:
    corpus, segments = self.corpus, plan.segment[pairs]
    for side, tokens, offsets, start, length in (
        ('src', corpus.src_tokens, corpus.src_offsets, plan.src_start, self.src_len),
        ('tgt', corpus.tgt_tokens, corpus.tgt_offsets, plan.tgt_start, self.tgt_len)):
      slots, segs, positions = _fill(batch[f'{side}_tokens'], tokens, offsets, plan.pairs[pairs],
                                     out_row * length + start[pairs], segments)
      batch[f'{side}_segments'].flat[slots] = segs
      batch[f'{side}_positions'].flat[slots] = positions

  def _finish(self, batch: Batch) -> Batch:
    batch['src'] = batch.pop('src_tokens')
    batch['tgt_out'] = batch.pop('tgt_tokens')
    tgt_in = np.zeros_like(batch['tgt_out'])
    tgt_in[:, 1:] = batch['tgt_out'][:, :-1]
    tgt_in[batch['tgt_positions'] == 0] = 0  # every segment (and padding) starts from 0
    batch['tgt_in'] = tgt_in
    batch['weights'] = (batch['tgt_segments'] > 0).astype(np.float32)
    return {key: value.reshape(self.num_devices, self.rows_per_device, -1)
            for key, value in batch.items()}


def row_lengths(corpus: TokenizedCorpus, row_len: int, multiple: int = 1) -> tuple[int, int]:
  """(src_len, tgt_len): the side with more tokens in all gets row_len, the other its share.

  The share is rounded up to `multiple` and is at least that side's longest sentence, so both
  sides fill alike. Rounding to 8 aligns shapes for accelerators but can cost up to ~3% of
  padding on the shorter side.
  """
  src_total, tgt_total = int(corpus.src_lengths.sum()), int(corpus.tgt_lengths.sum())

  def share(fraction: float, longest: int) -> int:
    return min(row_len, max(int(longest), math.ceil(row_len * fraction / multiple) * multiple))

  if src_total <= tgt_total:
    return share(src_total / tgt_total, corpus.src_lengths.max()), row_len
  return row_len, share(tgt_total / src_total, corpus.tgt_lengths.max())


def rows_per_device(tokens_per_batch: int, row_len: int, global_devices: int) -> int:
  """Rows per device so that one global batch holds about tokens_per_batch slots per side."""
  rows = tokens_per_batch // (row_len * global_devices)
  if rows < 1:
    raise ValueError(f'tokens_per_batch={tokens_per_batch} is less than one row of {row_len} '
                     f'tokens on each of {global_devices} devices.')
  return rows


def padding_efficiency(batches: Iterator[Batch], num_batches: int) -> tuple[float, float]:
  """The fraction of real (non-padding) slots on each side over the next num_batches."""
  real, slots = np.zeros(2), np.zeros(2)
  for _ in range(num_batches):
    batch = next(batches)
    real += [np.count_nonzero(batch['src_segments']), np.count_nonzero(batch['tgt_segments'])]
    slots += [batch['src_segments'].size, batch['tgt_segments'].size]
  src, tgt = real / slots
  return float(src), float(tgt)
