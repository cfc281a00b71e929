"""jaxformer.data.packing: packed rows, epochs, shards and resumable state."""

import collections
import threading

import numpy as np
import pytest

from jaxformer import data


def _segments(batch, side):
  """Every (tokens) segment in a batch, with its row, as tuples."""
  key = 'src' if side == 'src' else 'tgt_out'
  tokens = batch[key].reshape(-1, batch[key].shape[-1])
  segments = batch[f'{side}_segments'].reshape(tokens.shape)
  found = []
  for r in range(tokens.shape[0]):
    for s in range(1, segments[r].max() + 1):
      found.append(tuple(tokens[r][segments[r] == s]))
  return found


def _batches(corpus, **kwargs):
  settings = dict(src_len=64, tgt_len=64, rows_per_device=3, num_devices=2, seed=0)
  settings.update(kwargs)
  return data.PackedBatches(corpus, **settings)


def test_every_pair_appears_once_per_epoch(corpus):
  seen = collections.Counter()
  for batch in _batches(corpus, num_epochs=1):
    assert batch['src'].shape == (2, 3, 64) and batch['tgt_in'].shape == (2, 3, 64)
    seen.update(zip(_segments(batch, 'src'), _segments(batch, 'tgt')))
  expected = collections.Counter(
      (tuple(s), tuple(t)) for s, t in (corpus.pair(i) for i in range(len(corpus))))
  assert seen == expected


def test_rows_are_well_formed(corpus):
  for batch in _batches(corpus, num_epochs=1, src_len=40, tgt_len=64):
    for side, key in (('src', 'src'), ('tgt', 'tgt_out')):
      segments, positions = batch[f'{side}_segments'], batch[f'{side}_positions']
      tokens = batch[key]
      assert np.all((tokens == 0) == (segments == 0)), 'padding and segment 0 must coincide'
      assert np.all(positions[segments == 0] == 0)
      real = segments > 0
      # Segments are contiguous runs 1, 2, ...; positions count up from 0 in each.
      prev_seg = np.concatenate([np.zeros_like(segments[..., :1]), segments[..., :-1]], -1)
      prev_pos = np.concatenate([np.full_like(positions[..., :1], -1), positions[..., :-1]], -1)
      starts = real & (segments != prev_seg)
      assert np.all(positions[starts] == 0)
      assert np.all(positions[real & ~starts] == prev_pos[real & ~starts] + 1)
      assert np.all(np.diff(np.where(real, segments, 10**6), axis=-1)[real[..., :-1]] >= 0)
      # Every segment ends with EOS.
      last = real & (np.concatenate([segments[..., 1:], np.zeros_like(segments[..., :1])], -1)
                     != segments)
      assert np.all(tokens[last] == data.EOS_ID)
    tgt_starts = batch['tgt_positions'] == 0
    assert np.all(batch['tgt_in'][tgt_starts] == 0)
    shifted = batch['tgt_out'][..., :-1]
    assert np.all(batch['tgt_in'][..., 1:][~tgt_starts[..., 1:]] == shifted[~tgt_starts[..., 1:]])
    np.testing.assert_array_equal(batch['weights'], batch['tgt_segments'] > 0)
    assert batch['weights'].dtype == np.float32


def test_same_seed_same_batches_other_seed_other_batches(corpus):
  a = [next(_batches(corpus, seed=1)) for _ in range(1)]
  b = [next(_batches(corpus, seed=1)) for _ in range(1)]
  c = next(_batches(corpus, seed=2))
  np.testing.assert_array_equal(a[0]['src'], b[0]['src'])
  assert not np.array_equal(a[0]['src'], c['src'])


def test_resume_from_state_gives_the_same_next_batches(corpus):
  stream = _batches(corpus)
  rows_per_epoch = stream.rows_in_epoch(0)
  k = rows_per_epoch // 6 + 1  # far enough to cross into the next epoch below
  for _ in range(k):
    next(stream)
  state = stream.get_state()
  expected = [next(stream) for _ in range(k)]
  assert stream.get_state()['epoch'] >= 1, 'the test should cross an epoch boundary'
  resumed = _batches(corpus)
  resumed.set_state(state)
  for want in expected:
    got = next(resumed)
    for key in want:
      np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_state_from_other_settings_is_refused(corpus):
  state = _batches(corpus, seed=1).get_state()
  with pytest.raises(ValueError, match='seed 1'):
    _batches(corpus, seed=2).set_state(state)


def test_host_shards_are_disjoint_and_cover(corpus):
  shards = [_batches(corpus, process_index=i, process_count=3).shard for i in range(3)]
  together = np.concatenate(shards)
  assert len(together) == len(set(together.tolist())) == len(corpus)
  first = next(_batches(corpus, process_index=0, process_count=3))
  second = next(_batches(corpus, process_index=1, process_count=3))
  assert not set(_segments(first, 'src')) & set(_segments(second, 'src'))


def test_padding_efficiency_counts_real_slots():
  batch = {'src_segments': np.array([[[1, 1, 0, 0]]]), 'tgt_segments': np.array([[[1, 2, 2, 0]]])}
  assert data.padding_efficiency(iter([batch, batch]), 2) == (0.5, 0.75)


def test_rows_per_device_and_row_lengths(corpus):
  assert data.rows_per_device(25000, 256, 8) == 12
  with pytest.raises(ValueError, match='less than one row'):
    data.rows_per_device(1000, 256, 8)
  src_len, tgt_len = data.row_lengths(corpus, 64)
  assert max(src_len, tgt_len) == 64
  assert min(data.row_lengths(corpus, 64, multiple=8)) % 8 == 0
  assert src_len >= corpus.src_lengths.max() and tgt_len >= corpus.tgt_lengths.max()


def test_pack_rows_fits_every_row():
  rng = np.random.default_rng(0)
  src, tgt = rng.integers(1, 30, 5000), rng.integers(1, 30, 5000)
  rows = data.pack_rows(src, tgt, 64, 72, rng=np.random.default_rng(1), window=1000)
  assert np.all(np.bincount(rows, weights=src) <= 64)
  assert np.all(np.bincount(rows, weights=tgt) <= 72)
  assert np.array_equal(np.unique(rows), np.arange(rows.max() + 1))
  assert src.sum() / ((rows.max() + 1) * 64) > 0.97  # the source side binds


@pytest.mark.slow
def test_multi30k_tokenises_and_packs_at_least_97_percent_real_tokens(tmp_path, shared_data):
  folder = shared_data / 'multi30k'
  text = data.read_parallel_text(folder / 'train.en', folder / 'train.de')
  assert len(text) == 29000
  assert '\t' in text.tgt[7365]  # line 7366 holds a literal TAB: text, not a separator
  tokenizer = data.train_tokenizer(text.src + text.tgt, tmp_path / 'spm.model', vocab_size=8000)
  corpus = data.tokenize_corpus(text, tokenizer, max_len=256, cache_dir=tmp_path)
  assert corpus.counts == {'read': 29000, 'kept': 29000, 'empty': 0, 'too_long': 0}
  src_len, tgt_len = data.row_lengths(corpus, 256)
  stream = data.PackedBatches(corpus, src_len=src_len, tgt_len=tgt_len, rows_per_device=4)
  src_efficiency, tgt_efficiency = data.padding_efficiency(stream, stream.rows_in_epoch(0) // 4)
  assert src_efficiency >= 0.97 and tgt_efficiency >= 0.97, (src_efficiency, tgt_efficiency)


def test_blocks_and_epochs_are_planned_ahead_in_the_background(corpus, monkeypatch):
  """Every plan but the first is made on the planning thread before the batches reach it, so
  that neither a block nor an epoch boundary waits for one."""
  monkeypatch.setattr(data.packing, 'BLOCK', 128)
  threads = []
  plan = data.PackedBatches._plan_block  # pylint: disable=protected-access

  def recording(self, epoch, block):
    threads.append((epoch, block, threading.current_thread().name))
    return plan(self, epoch, block)

  monkeypatch.setattr(data.PackedBatches, '_plan_block', recording)
  stream = data.PackedBatches(corpus, src_len=64, tgt_len=64, rows_per_device=8)
  assert stream.blocks_per_epoch == 5  # 600 pairs
  for _ in range(30):  # about two epochs
    next(stream)
  assert stream.get_state()['epoch'] >= 1
  assert threads[0] == (0, 0, 'MainThread')
  assert [t[:2] for t in threads[1:]] == [(e, b) for e in range(3) for b in range(5)][1:len(
      threads)] and all(name.startswith('packing-plan') for *_, name in threads[1:])


def test_rows_are_multiples_of_8_within_row_len(corpus):
  src_len, tgt_len = data.row_lengths(corpus, 64)
  assert src_len % 8 == 0 and tgt_len % 8 == 0 and max(src_len, tgt_len) == 64
  assert data.row_lengths(corpus, 61) in ((61, 61), (56, 61), (61, 56))  # never above row_len
  exact = data.row_lengths(corpus, 64, multiple=1)  # the shares before rounding
  assert all(0 <= rounded - share < 8 for share, rounded in zip(exact, (src_len, tgt_len)))
