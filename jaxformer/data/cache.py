"""Tokenise a corpus once, filter it (with counts), and cache the ids on disk as flat arrays."""

import dataclasses
import hashlib
import itertools
import json
import logging
import os
import pathlib
import shutil
import tempfile

import numpy as np
from tqdm import tqdm

from jaxformer.data.sources import DataError, ParallelText
from jaxformer.data.tokenizer import EOS_ID, Tokenizer

log = logging.getLogger(__name__)
_CHUNK = 50_000  # sentences per sentencepiece call (and per progress-bar tick)
_FORMAT = 1      # bump when the on-disk layout changes


@dataclasses.dataclass(frozen=True)
class TokenizedCorpus:
  """Token ids of kept pairs, EOS included, as flat arrays with offsets (pair i is
  tokens[offsets[i]:offsets[i + 1]]), and the counts of what was read and dropped."""
  src_tokens: np.ndarray
  src_offsets: np.ndarray
  tgt_tokens: np.ndarray
  tgt_offsets: np.ndarray
  counts: dict[str, int]  # read, kept, empty, too_long

  def __len__(self) -> int:
    return len(self.src_offsets) - 1

  @property
  def src_lengths(self) -> np.ndarray:
    return np.diff(self.src_offsets)

  @property
  def tgt_lengths(self) -> np.ndarray:
    return np.diff(self.tgt_offsets)

  def pair(self, i: int) -> tuple[np.ndarray, np.ndarray]:
    """Source and target ids of kept pair i."""
    return (self.src_tokens[self.src_offsets[i]:self.src_offsets[i + 1]],
            self.tgt_tokens[self.tgt_offsets[i]:self.tgt_offsets[i + 1]])


def _fingerprint(text: ParallelText, tokenizer: Tokenizer, max_len: int) -> str:
  digest = hashlib.sha256(f'{_FORMAT}|{max_len}|{len(text)}|'.encode())
  digest.update(tokenizer.model_proto)
  for side in (text.src, text.tgt):
    for start in range(0, len(side), _CHUNK):
      digest.update('\n'.join(side[start:start + _CHUNK]).encode('utf-8', 'surrogatepass'))
      digest.update(b'\x00')
  return digest.hexdigest()[:20]


def _flatten(ids: list[list[int]], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
  """Ragged ids, each followed by EOS, as (flat tokens, offsets)."""
  lengths = np.fromiter((len(x) + 1 for x in ids), dtype=np.int64, count=len(ids))
  offsets = np.zeros(len(ids) + 1, np.int64)
  np.cumsum(lengths, out=offsets[1:])
  tokens = np.full(offsets[-1], EOS_ID, dtype)
  body = np.ones(offsets[-1], bool)
  body[offsets[1:] - 1] = False  # the EOS slots
  tokens[body] = np.fromiter(itertools.chain.from_iterable(ids), dtype=dtype,
                             count=int(body.sum()))
  return tokens, offsets


def tokenize_corpus(text: ParallelText, tokenizer: Tokenizer, max_len: int,
                    cache_dir: str | os.PathLike | None = None) -> TokenizedCorpus:
  """Tokenises both sides, appends EOS, and drops (and counts) empty and over-long pairs.

  A pair is empty when either side is blank, and too long when either side exceeds max_len
  tokens with its EOS. With `cache_dir`, the result is stored under a fingerprint of the text,
  the tokenizer model and max_len, and later calls with the same inputs load it instead.
  """
  if len(text) == 0:
    raise DataError(f'{text.origin}: no sentence pairs.')
  cache_path = None
  if cache_dir is not None:
    cache_path = pathlib.Path(cache_dir) / f'tokens-{_fingerprint(text, tokenizer, max_len)}'
    if (cache_path / 'counts.json').exists():
      return _load(cache_path)

  dtype = np.uint16 if tokenizer.vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
  kept_src, kept_tgt = [], []
  counts = {'read': len(text), 'kept': 0, 'empty': 0, 'too_long': 0}
  with tqdm(total=len(text), desc=f'tokenising {text.origin}', unit='pairs') as bar:
    for start in range(0, len(text), _CHUNK):
      src = tokenizer.encode(text.src[start:start + _CHUNK])
      tgt = tokenizer.encode(text.tgt[start:start + _CHUNK])
      for s, t in zip(src, tgt):
        if not s or not t:
          counts['empty'] += 1
        elif max(len(s), len(t)) + 1 > max_len:
          counts['too_long'] += 1
        else:
          kept_src.append(s)
          kept_tgt.append(t)
      bar.update(len(src))
  counts['kept'] = len(kept_src)
  report = log.warning if counts['kept'] < counts['read'] else log.info
  report('%s: read %d pairs, kept %d, dropped %d empty and %d longer than %d tokens.',
         text.origin, counts['read'], counts['kept'], counts['empty'], counts['too_long'],
         max_len)
  if not kept_src:
    raise DataError(f'{text.origin}: all {len(text)} pairs were dropped '
                    f'({counts["empty"]} empty, {counts["too_long"]} longer than {max_len}).')
  corpus = TokenizedCorpus(*_flatten(kept_src, dtype), *_flatten(kept_tgt, dtype),
                           counts=counts)
  if cache_path is not None:
    _save(corpus, cache_path)
  return corpus


_ARRAYS = ('src_tokens', 'src_offsets', 'tgt_tokens', 'tgt_offsets')


def _save(corpus: TokenizedCorpus, path: pathlib.Path) -> None:
  """Writes into a temporary folder, then renames it: a crash never leaves half a cache."""
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = pathlib.Path(tempfile.mkdtemp(dir=path.parent, prefix=path.name + '.'))
  for name in _ARRAYS:
    np.save(tmp / f'{name}.npy', getattr(corpus, name))
  (tmp / 'counts.json').write_text(json.dumps(corpus.counts))
  try:
    os.replace(tmp, path)
  except OSError:  # another process cached the same corpus first
    shutil.rmtree(tmp, ignore_errors=True)


def _load(path: pathlib.Path) -> TokenizedCorpus:
  arrays = {name: np.load(path / f'{name}.npy', mmap_mode='r') for name in _ARRAYS}
  counts = json.loads((path / 'counts.json').read_text())
  log.info('loaded %d tokenised pairs from %s', counts['kept'], path)
  return TokenizedCorpus(**arrays, counts=counts)
