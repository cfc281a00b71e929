"""The data path offline: text sources and their bad inputs, the tokenizer, the cache, packing."""

import collections
import gzip
import json
import pathlib
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from jaxformer import data
from jaxformer.data import DataError
from helpers import WORDS, synthetic_text


@pytest.fixture(scope='module')
def tokenizer(tmp_path_factory):
  text = synthetic_text(2000)
  return data.train_tokenizer(text.src + text.tgt, tmp_path_factory.mktemp('spm') / 'spm.model',
                              vocab_size=400)


@pytest.fixture(scope='module')
def corpus(tokenizer):
  return data.tokenize_corpus(synthetic_text(600, seed=1), tokenizer, max_len=64)


# --- text files and bad input ---------------------------------------------------------------


def test_read_lines_keeps_tabs_and_normalises_crlf(tmp_path):
  path = tmp_path / 'a.txt'
  path.write_bytes(b'one\ttwo\r\nthree\x0bfour\n\nfive')
  assert data.read_lines(path) == ['one\ttwo', 'three\x0bfour', '', 'five']


def test_read_lines_reads_gzip(tmp_path):
  path = tmp_path / 'a.txt.gz'
  with gzip.open(path, 'wb') as f:
    f.write('Grüße\nzwei\n'.encode())
  assert data.read_lines(path) == ['Grüße', 'zwei']


def test_empty_and_missing_files_are_clear_errors(tmp_path):
  (tmp_path / 'empty.txt').write_bytes(b'')
  with pytest.raises(DataError, match=r'empty\.txt: the file is empty'):
    data.read_lines(tmp_path / 'empty.txt')
  with pytest.raises(DataError, match=r'nope\.txt: no such file'):
    data.read_lines(tmp_path / 'nope.txt')


def test_non_utf8_names_file_and_line(tmp_path):
  path = tmp_path / 'latin1.txt'
  path.write_bytes('fine\nstill fine\nGr\xfc\xdfe\n'.encode('latin-1'))
  with pytest.raises(DataError, match=r'latin1\.txt:3: not valid UTF-8'):
    data.read_lines(path)


def test_mismatched_line_counts_name_both_files(tmp_path):
  (tmp_path / 'a.en').write_text('x\ny\nz\n')
  (tmp_path / 'a.de').write_text('x\ny\n')
  with pytest.raises(DataError, match=r'a\.en has 3 lines but .*a\.de has 2'):
    data.read_parallel_text(tmp_path / 'a.en', tmp_path / 'a.de')


def test_empty_and_over_long_pairs_are_counted_not_lost(tokenizer):
  long = ' '.join(['garden'] * 80)
  text = data.ParallelText(['the man', '', 'a dog', long, '   ', 'the cat'],
                           ['der mann', 'die frau', '', 'das haus', 'x', 'die katze'], 'bad')
  corpus = data.tokenize_corpus(text, tokenizer, max_len=32)
  assert corpus.counts == {'read': 6, 'kept': 2, 'empty': 3, 'too_long': 1}
  assert len(corpus) == 2
  assert tokenizer.decode([corpus.pair(1)[1]]) == ['die katze']


def test_all_pairs_dropped_is_an_error(tokenizer):
  with pytest.raises(DataError, match=r'all 1 pairs were dropped \(1 empty'):
    data.tokenize_corpus(data.ParallelText([''], ['x'], 'blank'), tokenizer, max_len=32)


# --- tokenizer --------------------------------------------------------------------------------


def test_tokenizer_is_deterministic_and_reused(tmp_path):
  text = synthetic_text(500, seed=3)
  texts = text.src + text.tgt
  a = data.train_tokenizer(texts, tmp_path / 'a.model', vocab_size=300, seed=5)
  b = data.train_tokenizer(texts, tmp_path / 'b.model', vocab_size=300, seed=5)
  assert (tmp_path / 'a.model').read_bytes() == (tmp_path / 'b.model').read_bytes()
  before = (tmp_path / 'a.model').stat().st_mtime_ns
  again = data.train_tokenizer(texts, tmp_path / 'a.model', vocab_size=300, seed=5)
  assert (tmp_path / 'a.model').stat().st_mtime_ns == before and again.vocab_size == 300
  assert a.vocab_size == b.vocab_size == 300


def test_a_vocabulary_trained_on_other_data_is_a_clear_error(tmp_path):
  """spm.model.json records the corpus, sample, seed and size: a workdir's vocabulary is never
  silently reused for another corpus."""
  text = synthetic_text(500, seed=3)
  data.train_tokenizer(text, tmp_path / 'spm.model', vocab_size=300, seed=5)
  assert json.loads((tmp_path / 'spm.model.json').read_text())['corpus'] == text.fingerprint()
  for other, change in ((dict(texts=synthetic_text(500, seed=4)), 'corpus'),
                        (dict(seed=6), 'seed 5 -> 6'), (dict(vocab_size=320), 'vocab_size'),
                        (dict(sample_size=100), 'sample_size')):
    settings = dict(texts=text, vocab_size=300, seed=5) | other
    with pytest.raises(DataError, match=rf'spm\.model was trained on other data or settings '
                       rf'\(.*{change}.*\): use a new workdir'):
      data.train_tokenizer(settings.pop('texts'), tmp_path / 'spm.model', **settings)


def test_vocabulary_training_threads_do_not_change_the_model(tmp_path, monkeypatch):
  """sentencepiece trains on every core; the model file is the same with one."""
  text = synthetic_text(3000, seed=3)
  data.train_tokenizer(text, tmp_path / 'many.model', vocab_size=400)
  monkeypatch.setattr(data.tokenizer.os, 'sched_getaffinity', lambda pid: {0})
  data.train_tokenizer(text, tmp_path / 'one.model', vocab_size=400)
  assert (tmp_path / 'many.model').read_bytes() == (tmp_path / 'one.model').read_bytes()


def test_a_streamed_source_samples_the_same_sentences_as_its_list(tmp_path):
  """A PairSource (streamed side by side) gives the model its list of sentences gives."""
  text = synthetic_text(3000, seed=3)
  (tmp_path / 'a.en').write_text('\n'.join(text.src) + '\n')
  (tmp_path / 'a.de').write_text('\n'.join(text.tgt) + '\n')
  files = data.TextFiles(tmp_path / 'a.en', tmp_path / 'a.de')
  data.train_tokenizer(files, tmp_path / 'files.model', vocab_size=400, sample_size=2500)
  data.train_tokenizer(text.src + text.tgt, tmp_path / 'list.model', vocab_size=400,
                       sample_size=2500)
  assert (tmp_path / 'files.model').read_bytes() == (tmp_path / 'list.model').read_bytes()


def test_tokenizer_round_trips_and_has_fixed_special_ids(tokenizer):
  texts = ['the small dog walks under the red house', 'Grüße, €5 😀 — new words too']
  ids = tokenizer.encode(texts)
  assert data.UNK_ID not in {i for row in ids for i in row}  # byte fallback, never unk
  assert tokenizer.decode([row + [data.EOS_ID, 7, 7] for row in ids]) == texts
  assert (data.PAD_ID, data.EOS_ID, data.UNK_ID) == (0, 1, 2)


def test_tokenizer_rejects_a_file_that_is_not_a_model(tmp_path):
  (tmp_path / 'bad.model').write_text('not a model')
  with pytest.raises(DataError, match='not a sentencepiece model'):
    data.Tokenizer(tmp_path / 'bad.model')


@pytest.mark.parametrize('vocab_size,message', [
    (5000, r'^vocab_size=5000 is more pieces than sentencepiece can make of these 600 sentences '
           r'\(at most \d+\): lower vocab_size, or train on more text\.$'),
    (100, r'^vocab_size=100 is too small: the 256 byte-fallback pieces, the special ids and the '
          r'characters of this text need at least \d+: raise vocab_size\.$')])
def test_vocabulary_sizes_sentencepiece_cannot_make_say_what_to_change(tmp_path, vocab_size,
                                                                       message):
  text = synthetic_text(300, seed=2)
  with pytest.raises(DataError, match=message):
    data.train_tokenizer(text.src + text.tgt, tmp_path / 'spm.model', vocab_size)
  assert not list(tmp_path.iterdir())  # no model, no temporary file left behind


_RACE = """
import pathlib, sys, time
sys.path.insert(0, {tests!r})
from helpers import WORDS, synthetic_text
from jaxformer import data
text = synthetic_text(400, seed=11)
go = pathlib.Path({go!r})
(go.parent / f'ready-{{sys.argv[1]}}').touch()
while not go.exists():
  time.sleep(0.001)
for round in range(25):  # the same 25 models, one after another, in every worker
  tokenizer = data.train_tokenizer(text.src + text.tgt, go.parent / f'spm-{{round}}.model', 300)
  print(round, tokenizer.vocab_size, len(tokenizer.model_proto))
"""


def test_hosts_training_the_vocabulary_at_once_never_see_half_a_model(tmp_path):
  """Six processes train the same 25 models into the same paths, released together (as hosts
  sharing a workdir do): each reads every model whole, and only the models are left."""
  tests = str(pathlib.Path(__file__).resolve().parent)
  code = _RACE.format(tests=tests, go=str(tmp_path / 'go'))
  workers = [subprocess.Popen([sys.executable, '-c', code, str(i)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(6)]
  deadline = time.monotonic() + 120
  while len(list(tmp_path.glob('ready-*'))) < 6 and time.monotonic() < deadline:
    time.sleep(0.05)  # every worker imported and waiting at the start line
  (tmp_path / 'go').touch()
  results = [w.communicate(timeout=300) for w in workers]
  assert all(w.returncode == 0 for w in workers), [err[-800:] for _, err in results]
  expected = '\n'.join(f'{r} 300 {(tmp_path / f"spm-{r}.model").stat().st_size}'
                       for r in range(25))
  assert [out.strip() for out, _ in results] == [expected] * 6
  assert {p.name for p in tmp_path.iterdir() if not p.name.startswith('ready-')} == {
      'go', *(f'spm-{r}.model{ext}' for r in range(25) for ext in ('', '.json'))}  # nothing
  # temporary left


def test_a_tokenizer_from_checkpoint_bytes_caches_like_one_from_a_file(tokenizer, tmp_path):
  """Its model bytes are kept on the object (a checkpoint's tokenizer has no file to read)."""
  assert tokenizer.model_proto == tokenizer.path.read_bytes()
  loaded = data.Tokenizer.from_bytes(tokenizer.model_proto)
  text = synthetic_text(200, seed=6)
  from_bytes = data.tokenize_corpus(text, loaded, max_len=64, cache_dir=tmp_path)
  from_file = data.tokenize_corpus(text, tokenizer, max_len=64, cache_dir=tmp_path)
  assert len(list(tmp_path.glob('tokens-*'))) == 1  # the same fingerprint: one cache
  np.testing.assert_array_equal(from_bytes.tgt_tokens, from_file.tgt_tokens)


# --- cache ------------------------------------------------------------------------------------


def test_cache_stores_once_and_reloads_identically(tokenizer, tmp_path, monkeypatch):
  text = synthetic_text(300, seed=4)
  first = data.tokenize_corpus(text, tokenizer, max_len=64, cache_dir=tmp_path)
  assert len(list(tmp_path.glob('tokens-*'))) == 1
  monkeypatch.setattr(tokenizer, 'encode', lambda *a, **k: pytest.fail('re-tokenised'))
  second = data.tokenize_corpus(text, tokenizer, max_len=64, cache_dir=tmp_path)
  for name in ('src_tokens', 'src_offsets', 'tgt_tokens', 'tgt_offsets'):
    np.testing.assert_array_equal(getattr(first, name), getattr(second, name))
  assert first.counts == second.counts
  monkeypatch.undo()
  changed = data.ParallelText(text.src[:-1] + ['a new line'], text.tgt, text.origin)
  data.tokenize_corpus(changed, tokenizer, max_len=64, cache_dir=tmp_path)
  assert len(list(tmp_path.glob('tokens-*'))) == 2  # different text, different cache


def test_corpus_layout_appends_eos(tokenizer, corpus):
  src, tgt = corpus.pair(0)
  assert src[-1] == tgt[-1] == data.EOS_ID
  assert data.EOS_ID not in src[:-1]
  assert corpus.src_tokens.dtype == np.uint16


# --- packing ----------------------------------------------------------------------------------


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


# --- real data --------------------------------------------------------------------------------


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


def test_dropped_pairs_are_reported_as_a_warning(tokenizer, caplog):
  text = data.ParallelText(['the man', ''], ['der mann', 'die frau'], 'one-empty')
  data.tokenize_corpus(text, tokenizer, max_len=32)
  assert 'one-empty: read 2 pairs, kept 1, dropped 1 empty and 0 longer than 32 tokens.' in [
      r.getMessage() for r in caplog.records if r.levelname == 'WARNING']


def test_decoded_text_is_always_one_line(tokenizer):
  newline_bytes = [tokenizer._sp.piece_to_id(f'<0x{b:02X}>') for b in (0x0A, 0x0D, 0x0B)]
  ids = tokenizer.encode(['the man'])[0]
  text = tokenizer.decode([ids + newline_bytes + ids])[0]
  assert text.splitlines() == [text] and text.startswith('the man')


# --- scale ------------------------------------------------------------------------------------


# VmHWM: this process's own peak (ru_maxrss would carry the forking parent's over exec).
_MEMORY_CHILD = """
import re, sys
from jaxformer import data
text = data.TextFiles(sys.argv[1], sys.argv[2])
corpus = data.tokenize_corpus(text, data.Tokenizer(sys.argv[3]), 64, sys.argv[4])
print(len(corpus), re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read())[1])
"""


@pytest.mark.slow
def test_tokenising_memory_does_not_grow_with_the_corpus(tokenizer, tmp_path):
  """Text is streamed and ids go to the cache as they are made: tripling the corpus adds no
  more than a few hundred bytes a pair (its lengths and offsets, 16 bytes a pair per side, and
  the allocator's slack), where Python lists of ids took ~2 KB."""
  rng = np.random.default_rng(0)
  words = np.array(WORDS)
  peaks = {}
  for pairs in (100_000, 300_000):
    for side, vocab in (('en', words[:16]), ('de', words[16:])):
      lengths = rng.integers(3, 20, pairs)
      tokens = rng.choice(vocab, lengths.sum())
      lines = np.split(tokens, np.cumsum(lengths)[:-1])
      (tmp_path / f'{pairs}.{side}').write_text('\n'.join(map(' '.join, lines)) + '\n')
    out = subprocess.run([sys.executable, '-c', _MEMORY_CHILD, str(tmp_path / f'{pairs}.en'),
                          str(tmp_path / f'{pairs}.de'), str(tokenizer.path),
                          str(tmp_path / f'cache{pairs}')], capture_output=True, text=True,
                         check=True)
    kept, peaks[pairs] = map(int, out.stdout.split())
    assert kept == pairs
  grown = (peaks[300_000] - peaks[100_000]) * 1024 / 200_000
  assert grown < 400, f'{grown:.0f} bytes more per pair ({peaks} KiB)'


def test_a_failed_or_interrupted_cache_write_leaves_nothing(tokenizer, tmp_path, monkeypatch):
  text = synthetic_text(300, seed=2)
  original = data.cache._Sink.add  # pylint: disable=protected-access

  def failing(error):
    def add(self, *args):
      original(self, *args)
      raise error
    return add

  monkeypatch.setattr(data.cache._Sink, 'add', failing(OSError(28, 'No space left on device')))
  with pytest.raises(DataError, match='no space left on the device for the token cache'):
    data.tokenize_corpus(text, tokenizer, max_len=64, cache_dir=tmp_path)
  monkeypatch.setattr(data.cache._Sink, 'add', failing(KeyboardInterrupt()))
  with pytest.raises(KeyboardInterrupt):
    data.tokenize_corpus(text, tokenizer, max_len=64, cache_dir=tmp_path)
  assert list(tmp_path.iterdir()) == []
  monkeypatch.undo()
  (tmp_path / f'tokens-x{data.cache._PARTIAL}killed').mkdir()  # left by a kill -9 # pylint: disable=protected-access
  corpus = data.tokenize_corpus(text, tokenizer, max_len=64, cache_dir=tmp_path)
  assert [p.name for p in tmp_path.iterdir()] == [f'tokens-{corpus.fingerprint}']


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


_PREPARE_CHILD = """
import logging, sys
logging.basicConfig(level=logging.INFO)
sys.path.insert(0, sys.argv[2])
from helpers import synthetic_text
from jaxformer import data
data.pipeline.prepare(__import__('pathlib').Path(sys.argv[1]), synthetic_text(3000, seed=4),
                      None, vocab_size=300, max_len=64, sample_size=10_000, seed=0)
"""


def test_processes_sharing_a_workdir_prepare_it_once(tmp_path):
  """The workdir's lock: of three processes started together, one trains the vocabulary and
  tokenises; the others wait for it, then load."""
  tests = pathlib.Path(__file__).parent
  workers = [subprocess.Popen([sys.executable, '-c', _PREPARE_CHILD, str(tmp_path), str(tests)],
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
  logs = ''.join(w.communicate(timeout=120)[1] for w in workers)
  assert all(w.returncode == 0 for w in workers), logs[-2000:]
  assert logs.count('training a 300-piece vocabulary') == 1, logs[-2000:]
  assert logs.count('read 3000 pairs, kept') == 1
  assert len(list((tmp_path / 'cache').iterdir())) == 1


def test_workdirs_on_separate_disks_prepare_the_same_data(tmp_path):
  """One process per host prepares its own disk's workdir: the same vocabulary file and the
  same cache, so hosts agree without sharing files."""
  text = synthetic_text(3000, seed=4)
  prepared = [data.pipeline.prepare(tmp_path / host, text, None, vocab_size=300, max_len=64,
                                    sample_size=2000, seed=0) for host in ('a', 'b')]
  assert (tmp_path / 'a' / 'spm.model').read_bytes() == (tmp_path / 'b' / 'spm.model').read_bytes()
  (_, a, _), (_, b, _) = prepared
  assert a.fingerprint == b.fingerprint
  for name in ('src_tokens', 'src_offsets', 'tgt_tokens', 'tgt_offsets'):
    np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
