"""Pack tokenised pairs into fixed-shape rows and serve them as resumable, sharded batches.

A row of length L holds several whole pairs on each side: their tokens, segment ids (1, 2, ...
in the row; 0 = padding) and positions restarting at 0. Every batch has the same shape, so the
train step compiles once, and every host steps in lockstep.

An epoch is planned lazily, a block of pairs at a time: the epoch's shuffled order is cut into
blocks of BLOCK pairs, and a block's rows are planned only when the batches reach it, so that
neither an epoch boundary nor a resume waits for the whole epoch's plan.
"""

import concurrent.futures
import dataclasses
import functools
import math
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.data.cache import TokenizedCorpus

Batch = dict[str, np.ndarray]
WINDOW = 4096       # pairs packed together (first fit within a window)
BLOCK = 64 * WINDOW  # at most this many pairs planned at once (vectorised across windows)
AHEAD = 2            # blocks planned ahead of the batches
OPEN_ROWS = 128    # rows of a window that can still take pairs
_NO_ROW = np.iinfo(np.int32).max


@functools.cache
def _planner() -> concurrent.futures.ThreadPoolExecutor:
  """The one thread that plans blocks ahead of the batches, shared by every PackedBatches of the
  process; started by the first that plans ahead, not when the module is imported."""
  return concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix='packing-plan')


@functools.partial(jax.jit, static_argnums=(2, 3))
def _first_fit(src: jax.Array, tgt: jax.Array, src_len: int, tgt_len: int
               ) -> tuple[jax.Array, jax.Array]:
  """First fit of each window's pairs (a row of `src` / `tgt`: [windows, pairs] lengths in
  packing order, 0 for no pair), all windows at once: each pair goes into the oldest of the
  window's OPEN_ROWS open rows where both its sides fit, or else starts a new row, which takes
  the place of the fullest open row.

  Returns:
    ([windows, pairs] row of each pair, numbered from 0 in each window; [windows] row counts).
  """
  windows = src.shape[0]
  slots = jnp.arange(OPEN_ROWS)

  def place(carry, lengths):
    src_fill, tgt_fill, slot_row, num_rows = carry             # [W, OPEN_ROWS] each; [W]
    s, t = (x[:, None] for x in lengths)                       # [W, 1]
    fits = (src_fill <= src_len - s) & (tgt_fill <= tgt_len - t)
    candidates = jnp.where(fits, slot_row, _NO_ROW)
    new = (candidates.min(1) == _NO_ROW) & (s[:, 0] > 0)        # [W]
    fullness = jnp.where(slot_row == _NO_ROW, jnp.inf, src_fill / src_len + tgt_fill / tgt_len)
    slot = jnp.where(new, fullness.argmax(1), candidates.argmin(1))
    hit = slots == slot[:, None]                               # [W, OPEN_ROWS]
    opened = hit & new[:, None]
    slot_row = jnp.where(opened, num_rows[:, None], slot_row)
    src_fill = jnp.where(opened, 0, src_fill) + jnp.where(hit, s, 0)
    tgt_fill = jnp.where(opened, 0, tgt_fill) + jnp.where(hit, t, 0)
    row = jnp.where(hit, slot_row, -1).max(1)
    return (src_fill, tgt_fill, slot_row, num_rows + new), row

  open_rows = (windows, OPEN_ROWS)
  init = (jnp.zeros(open_rows, jnp.int32), jnp.zeros(open_rows, jnp.int32),
          jnp.full(open_rows, _NO_ROW, jnp.int32), jnp.zeros(windows, jnp.int32))
  (*_, num_rows), rows = jax.lax.scan(place, init, (src.T, tgt.T))
  return rows.T, num_rows


def _best_first_fit(src: np.ndarray, tgt: np.ndarray, src_len: int, tgt_len: int
                    ) -> tuple[np.ndarray, np.ndarray]:
  """Each window packed by first fit in its given order and in decreasing size (first-fit
  decreasing), keeping whichever needs fewer rows: neither wins everywhere when both sides must
  fit. Computed with XLA on the host CPU (off the GIL, so a thread can plan ahead); the number
  of windows is padded to a power of two, so that few shapes are ever compiled."""
  windows = len(src)
  order = np.argsort(-(src / src_len + tgt / tgt_len), axis=1, kind='stable')
  by_size = np.take_along_axis(src, order, 1), np.take_along_axis(tgt, order, 1)
  padded = 1 << (windows - 1).bit_length()
  none = np.zeros((padded - windows, src.shape[1]), np.int32)
  stack = lambda a, b: np.concatenate([a, none, b, none])  # noqa: E731
  cpu = jax.local_devices(backend='cpu')[0]
  rows, num_rows = jax.device_get(_first_fit(
      jax.device_put(stack(src, by_size[0]), cpu), jax.device_put(stack(tgt, by_size[1]), cpu),
      src_len, tgt_len))
  in_order, decreasing = rows[:windows], np.empty_like(rows[:windows])
  np.put_along_axis(decreasing, order, rows[padded:padded + windows], 1)
  sorted_wins = num_rows[padded:padded + windows] < num_rows[:windows]
  return (np.where(sorted_wins[:, None], decreasing, in_order),
          np.where(sorted_wins, num_rows[padded:padded + windows], num_rows[:windows]))


def pack_rows(src_lengths: np.ndarray, tgt_lengths: np.ndarray, src_len: int, tgt_len: int,
              rng: np.random.Generator | None = None, window: int = WINDOW) -> np.ndarray:
  """Assigns each pair to a row of src_len source and tgt_len target tokens, packing each
  window of `window` pairs apart (see _best_first_fit). With `rng`, rows are shuffled within
  each window.

  Returns:
    [num_pairs] row ids, numbered from 0 without gaps, window after window.
  """
  n = len(src_lengths)
  if n and (src_lengths.max() > src_len or tgt_lengths.max() > tgt_len):
    raise ValueError(f'a pair is longer than the rows ({src_len} source, {tgt_len} target '
                     'tokens)')
  window = min(window, 1 << max(n - 1, 0).bit_length())  # a small corpus: a short scan
  windows = -(-n // window)
  padded = lambda x: np.concatenate(  # noqa: E731
      [x.astype(np.int32), np.zeros(windows * window - n, np.int32)]).reshape(windows, window)
  rows, num_rows = _best_first_fit(padded(src_lengths), padded(tgt_lengths), src_len, tgt_len)
  if rng is not None:
    for w in range(windows):
      rows[w] = rng.permutation(num_rows[w])[np.minimum(rows[w], num_rows[w] - 1)]
  first_row = np.concatenate([[0], np.cumsum(num_rows)[:-1]])
  return (rows + first_row[:, None]).reshape(-1)[:n].astype(np.int64)


@dataclasses.dataclass(frozen=True)
class _BlockPlan:
  """Where every pair of one block goes: its pairs sorted by row (in order within a row), each
  pair's rank in its row, and each row's first pair."""
  pairs: np.ndarray       # corpus indices, grouped by row, in row order
  row: np.ndarray         # aligned with `pairs`: the row of each
  segment: np.ndarray     # 1-based rank of the pair in its row
  row_begin: np.ndarray   # [num_rows + 1]: pairs[row_begin[r]:row_begin[r + 1]] are in row r

  @property
  def num_rows(self) -> int:
    return len(self.row_begin) - 1


def _fill(out: np.ndarray, segment_out: np.ndarray, position_out: np.ndarray,
          tokens: np.ndarray, offsets: np.ndarray, pairs: np.ndarray, rows: np.ndarray,
          segments: np.ndarray) -> None:
  """Writes the pairs (sorted by row, in order within a row) into `out`'s rows (`rows`: the
  row of each), with their segment ids and positions. A row's pairs fill its first slots in
  order, so the pairs' tokens laid end to end are exactly the row-major order of the filled
  slots: one gather and three boolean-mask writes, no Python loop over pairs or tokens."""
  begin = offsets[pairs]
  lengths = offsets[pairs + 1] - begin
  first = np.cumsum(lengths) - lengths               # where each pair starts among the copied
  pair = np.repeat(np.arange(len(pairs)), lengths)   # the pair of each copied token
  within = np.arange(len(pair)) - first[pair]
  filled = np.arange(out.shape[1]) < np.bincount(rows, lengths, len(out))[:, None]
  out[filled] = tokens[begin[pair] + within]
  segment_out[filled] = segments[pair]
  position_out[filled] = within


class PackedBatches(Iterator[Batch]):
  """Seeded, resumable, host-sharded batches of packed rows.

  Each batch is a dict of int32 arrays [num_devices, rows_per_device, src_len] (src,
  src_segments, src_positions) and [num_devices, rows_per_device, tgt_len] (tgt_in: the
  targets shifted right within each segment, starting with 0; tgt_out, tgt_segments,
  tgt_positions; and float32 weights, 1 on real target tokens); the segments and positions are
  `jaxformer.layout.Layout`'s fields, which the model reads (`Layout.of`). Host `process_index` of
  `process_count` reads the pairs i with i % process_count == process_index. Epochs are
  reshuffled with (seed, epoch) and planned a block at a time; with num_epochs=None the stream
  is endless and rows run on from one epoch into the next, otherwise the last batch is
  completed with empty rows.
  """

  def __init__(self, corpus: TokenizedCorpus, *, src_len: int, tgt_len: int,
               rows_per_device: int, num_devices: int = 1, seed: int = 0, shuffle: bool = True,
               num_epochs: int | None = None, process_index: int = 0, process_count: int = 1):
    self.corpus = corpus
    self.src_len, self.tgt_len = src_len, tgt_len
    self.rows_per_device, self.num_devices = rows_per_device, num_devices
    self.seed, self.shuffle, self.num_epochs = seed, shuffle, num_epochs
    self.shard = np.arange(process_index, len(corpus), process_count, dtype=np.int32)
    if not len(self.shard):
      raise ValueError(f'host {process_index} of {process_count} has no pairs '
                       f'({len(corpus)} in all).')
    self._lengths = (corpus.src_lengths.astype(np.int32),  # 4 bytes a pair and side
                     corpus.tgt_lengths.astype(np.int32))
    self._epoch, self._block, self._row = 0, 0, 0
    self._order: tuple[int, np.ndarray] | None = None
    self._plan: tuple[tuple[int, int], _BlockPlan] | None = None
    self._ahead: dict[tuple[int, int], concurrent.futures.Future] = {}

  @property
  def blocks_per_epoch(self) -> int:
    """How many blocks of at most `BLOCK` pairs this host's epoch is planned in."""
    return -(-len(self.shard) // BLOCK)

  @property
  def block_size(self) -> int:
    """Pairs per block: at most BLOCK, the same for all (within one): a short last block would
    leave its successor's planner little time."""
    return -(-len(self.shard) // self.blocks_per_epoch)

  # --- state -----------------------------------------------------------------------------------

  STATE_KEYS = ('epoch', 'block', 'row', 'seed', 'shard_size', 'corpus', 'src_len', 'tgt_len')

  @staticmethod
  def corpus_id(corpus: TokenizedCorpus) -> int:
    """The corpus's fingerprint as a 28-bit int (0 for a corpus without one): it survives jax's
    32-bit all-gather between hosts."""
    return int(corpus.fingerprint[:7] or '0', 16)

  def get_state(self) -> dict[str, Any]:
    """A small JSON-serialisable position in the stream (ints, STATE_KEYS), with what it is a
    position in: the seed, this host's pair count, the corpus and the row lengths."""
    return {'epoch': self._epoch, 'block': self._block, 'row': self._row, 'seed': self.seed,
            'shard_size': len(self.shard), 'corpus': self.corpus_id(self.corpus),
            'src_len': self.src_len, 'tgt_len': self.tgt_len}

  # What a saved position says of its stream, by the words a changed one is reported in.
  IDENTITY = {'seed': 'seed', 'shard_size': 'training pairs per host', 'corpus': 'corpus id',
              'src_len': 'source row length', 'tgt_len': 'target row length'}

  def changes(self, state: dict[str, Any]) -> list[str]:
    """'what old -> new' for each way the stream of `state` (a get_state) differs from this
    one: another seed, corpus, host share or row length."""
    now = self.get_state()
    return [f'{name} {state.get(key)} -> {now[key]}' for key, name in self.IDENTITY.items()
            if state.get(key) != now[key]]

  def set_state(self, state: dict[str, Any]) -> None:
    """Continues from a `get_state` of an iterator over the same corpus and settings."""
    if changed := self.changes(state):
      raise ValueError(f'data state is for other data or settings ({", ".join(changed)}).')
    self._epoch, self._block, self._row = (int(state[k]) for k in ('epoch', 'block', 'row'))

  # --- planning --------------------------------------------------------------------------------

  def _epoch_order(self, epoch: int) -> np.ndarray:
    if self._order is None or self._order[0] != epoch:
      order = np.random.default_rng([self.seed, epoch]).permutation(self.shard) \
          if self.shuffle else self.shard
      self._order = epoch, order
    return self._order[1]

  def _plan_block(self, epoch: int, block: int) -> _BlockPlan:
    pairs = self._epoch_order(epoch)[block * self.block_size:(block + 1) * self.block_size]
    src_lengths, tgt_lengths = self._lengths[0][pairs], self._lengths[1][pairs]
    rng = np.random.default_rng([self.seed, epoch, block]) if self.shuffle else None
    row = pack_rows(src_lengths, tgt_lengths, self.src_len, self.tgt_len, rng)
    by_row = np.argsort(row, kind='stable')
    row = row[by_row]
    row_begin = np.searchsorted(row, np.arange(row[-1] + 2))
    return _BlockPlan(pairs=pairs[by_row], row=row,
                      segment=np.arange(len(row)) - row_begin[row] + 1, row_begin=row_begin)

  def _block_plan(self, epoch: int, block: int) -> _BlockPlan:
    """The plan of (epoch, block); the next AHEAD blocks' are started in the background, so
    that the batches never wait for a plan at a block or epoch boundary."""
    if self._plan is None or self._plan[0] != (epoch, block):
      future = self._ahead.pop((epoch, block), None)
      self._plan = (epoch, block), (future.result() if future else
                                    self._plan_block(epoch, block))
      wanted, (e, b) = [], (epoch, block)
      for _ in range(AHEAD):
        e, b = (e, b + 1) if b + 1 < self.blocks_per_epoch else (e + 1, 0)
        if self.num_epochs is None or e < self.num_epochs:
          wanted.append((e, b))
      self._ahead = {key: self._ahead.get(key) or _planner().submit(self._plan_block, *key)
                     for key in wanted}
    return self._plan[1]

  def rows_in_epoch(self, epoch: int = 0) -> int:
    """The rows of one epoch (plans every block of it: for validation sets and benchmarks)."""
    return sum(self._block_plan(epoch, block).num_rows for block in range(self.blocks_per_epoch))

  # --- batches ---------------------------------------------------------------------------------

  def __next__(self) -> Batch:
    return self.assemble(self.advance())

  def advance(self) -> list[tuple[_BlockPlan, slice, slice]]:
    """Moves past the next batch and returns what it holds: (plan, its pairs, their batch
    rows) pieces, for `assemble`. Cheap and sequential; assembling is the costly part and can
    run on other threads (parallel.prefetch does)."""
    rows = self.num_devices * self.rows_per_device
    pieces, filled = [], 0
    while filled < rows:
      if self.num_epochs is not None and self._epoch >= self.num_epochs:
        if filled == 0:
          raise StopIteration
        break  # the rest of the last batch stays empty
      plan = self._block_plan(self._epoch, self._block)
      take = min(rows - filled, plan.num_rows - self._row)
      begin, end = plan.row_begin[self._row], plan.row_begin[self._row + take]
      pieces.append((plan, slice(begin, end), slice(filled, filled + take)))
      filled += take
      self._row += take
      if self._row == plan.num_rows:
        self._block, self._row = self._block + 1, 0
        if self._block == self.blocks_per_epoch:
          self._epoch, self._block = self._epoch + 1, 0
    return pieces

  def assemble(self, pieces: list[tuple[_BlockPlan, slice, slice]]) -> Batch:
    """The batch of `advance`'s pieces (thread-safe)."""
    batch = self._zeros()
    for piece in pieces:
      self._write(batch, *piece)
    return self._finish(batch)

  def empty_batch(self) -> Batch:
    """A batch of the same shapes holding no pairs (all padding, weights 0)."""
    return self._finish(self._zeros())

  def _zeros(self) -> Batch:
    rows = self.num_devices * self.rows_per_device
    return {f'{side}_{key}': np.zeros((rows, length), np.int32)
            for side, length in (('src', self.src_len), ('tgt', self.tgt_len))
            for key in ('tokens', 'segments', 'positions')}

  def _write(self, batch: Batch, plan: _BlockPlan, pairs: slice, rows: slice) -> None:
    corpus, segments = self.corpus, plan.segment[pairs]
    row = plan.row[pairs] - plan.row[pairs.start]  # 0 for the first of these rows
    for side, tokens, offsets in (('src', corpus.src_tokens, corpus.src_offsets),
                                  ('tgt', corpus.tgt_tokens, corpus.tgt_offsets)):
      _fill(batch[f'{side}_tokens'][rows], batch[f'{side}_segments'][rows],
            batch[f'{side}_positions'][rows], tokens, offsets, plan.pairs[pairs], row, segments)

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


def row_lengths(corpus: TokenizedCorpus, row_len: int, multiple: int = 8,
                also: TokenizedCorpus | None = None) -> tuple[int, int]:
  """(src_len, tgt_len): the side with more tokens in all gets row_len, the other its share.

  The share is at least that side's longest sentence, in `corpus` and in `also` (the
  validation pairs, packed into the same rows), so both sides fill alike, and is rounded up to
  `multiple` (within row_len): accelerators' kernels want aligned shapes (cuDNN's flash
  attention takes even lengths only), at a cost of at most `multiple` - 1 padding slots a row.
  """
  src_total, tgt_total = int(corpus.src_lengths.sum()), int(corpus.tgt_lengths.sum())
  corpora = [corpus] if also is None or not len(also) else [corpus, also]

  def share(fraction: float, side: str) -> int:
    longest = max(int(getattr(c, side).max()) for c in corpora)
    return min(row_len, math.ceil(max(longest, row_len * fraction) / multiple) * multiple)

  if src_total <= tgt_total:
    return share(src_total / tgt_total, 'src_lengths'), row_len
  return row_len, share(tgt_total / src_total, 'tgt_lengths')


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
