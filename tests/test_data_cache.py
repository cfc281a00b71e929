"""jaxformer.data.cache: the token cache, filtering and its failures."""

import re
import subprocess
import sys

import numpy as np
import pytest
from helpers import WORDS, synthetic_text

from jaxformer import data, files
from jaxformer.data import DataError


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


def test_dropped_pairs_are_reported_as_a_warning(tokenizer, caplog, tmp_path):
  text = data.ParallelText(['the man', ''], ['der mann', 'die frau'], 'one-empty')
  data.tokenize_corpus(text, tokenizer, max_len=32)
  assert 'one-empty: read 2 pairs, kept 1, dropped 1 empty and 0 longer than 32 tokens: 50.00% ' \
      'of the pairs lost.' in [r.getMessage() for r in caplog.records if r.levelname == 'WARNING']
  long = data.ParallelText(['the man', 'the man ' * 20, 'a'], ['der mann'] * 3, 'one-long')
  caplog.clear()
  data.tokenize_corpus(long, tokenizer, max_len=16, cache_dir=tmp_path)
  assert [r.getMessage() for r in caplog.records if r.levelname == 'WARNING'] == [
      'one-long: read 3 pairs, kept 2, dropped 0 empty and 1 longer than 16 tokens: 33.33% of '
      'the pairs lost (raise train.row_len, and model.max_len where it is shorter, to keep the '
      'long ones).']


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
  with pytest.raises(files.DiskFullError, match=r'no space on /\S* for the token cache'):
    data.tokenize_corpus(text, tokenizer, max_len=64, cache_dir=tmp_path)
  monkeypatch.setattr(data.cache._Sink, 'add', failing(KeyboardInterrupt()))
  with pytest.raises(KeyboardInterrupt):
    data.tokenize_corpus(text, tokenizer, max_len=64, cache_dir=tmp_path)
  assert list(tmp_path.iterdir()) == []
  monkeypatch.undo()
  (tmp_path / f'tokens-x{data.cache._PARTIAL}killed').mkdir()  # left by a kill -9 # pylint: disable=protected-access
  corpus = data.tokenize_corpus(text, tokenizer, max_len=64, cache_dir=tmp_path)
  assert [p.name for p in tmp_path.iterdir()] == [f'tokens-{corpus.fingerprint}']


def _truncate(folder):
  tokens = folder / 'tgt_tokens.bin'
  tokens.write_bytes(tokens.read_bytes()[:-10])


def _shorten_offsets(folder):
  offsets = np.load(folder / 'src_offsets.npy')
  np.save(folder / 'src_offsets.npy', offsets[:-3])


@pytest.mark.parametrize('damage,what', [
    (_truncate, r'tgt_tokens\.bin has \d+ bytes, its offsets say \d+'),
    (_shorten_offsets, r'src_offsets\.npy does not hold 200 pairs'),
    (lambda folder: (folder / 'counts.json').write_text('{"kept": '), r'Expecting value'),
    (lambda folder: (folder / 'src_tokens.bin').unlink(), r'\[Errno 2\] No such file'),
])
def test_a_damaged_token_cache_is_found_and_rebuilt(tokenizer, tmp_path, caplog, damage, what):
  """A cache cut short by a full disk, edited or half deleted: its files are checked against
  each other when it is mapped, and it is made again from the text, with a warning that says
  what was wrong (before: an IndexError deep in packing, or a batch of wrong tokens)."""
  text = synthetic_text(200, seed=5)
  names = ('src_tokens', 'src_offsets', 'tgt_tokens', 'tgt_offsets')
  corpus = data.tokenize_corpus(text, tokenizer, max_len=64, cache_dir=tmp_path)
  first = {name: np.array(getattr(corpus, name)) for name in names}  # not the maps
  del corpus
  [folder] = tmp_path.glob('tokens-*')
  damage(folder)
  again = data.tokenize_corpus(text, tokenizer, max_len=64, cache_dir=tmp_path)
  assert re.search(rf'the token cache is damaged \({what}.*\): rebuilding it', caplog.text)
  for name in names:
    np.testing.assert_array_equal(first[name], getattr(again, name))
