"""Tokenise a corpus once, filter it (with counts), and cache the ids on disk as flat arrays.

Pairs are streamed a chunk at a time: sentencepiece encodes each chunk on every core, the ids
go straight into arrays, and with a cache folder they are appended to its files as they are
made, so memory does not grow with the corpus. A cache is written into a temporary folder and
renamed into place when complete; a failed or interrupted write leaves nothing behind.
"""

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

from jaxformer import files
from jaxformer.data.sources import DataError, PairSource
from jaxformer.data.tokenizer import EOS_ID, Tokenizer

log = logging.getLogger(__name__)
_CHUNK = 50_000  # pairs per sentencepiece call (and per progress-bar tick)
_FORMAT = 2      # bump when the on-disk layout changes
_PARTIAL = '.partial-'  # a cache folder being written


@dataclasses.dataclass(frozen=True)
class TokenizedCorpus:
  """Token ids of kept pairs, EOS included, as flat arrays with offsets (pair i is
  tokens[offsets[i]:offsets[i + 1]]), the counts of what was read and dropped, and the
  fingerprint of the source text, tokenizer and length limit it was made from."""
  src_tokens: np.ndarray
  src_offsets: np.ndarray
  tgt_tokens: np.ndarray
  tgt_offsets: np.ndarray
  counts: dict[str, int]  # read, kept, empty, too_long
  fingerprint: str = ''

  def __len__(self) -> int:
    return len(self.src_offsets) - 1

  @property
  def src_lengths(self) -> np.ndarray:
    """[pairs] source tokens of each kept pair, EOS included."""
    return np.diff(self.src_offsets)

  @property
  def tgt_lengths(self) -> np.ndarray:
    """[pairs] target tokens of each kept pair, EOS included."""
    return np.diff(self.tgt_offsets)

  def pair(self, i: int) -> tuple[np.ndarray, np.ndarray]:
    """Source and target ids of kept pair i."""
    return (self.src_tokens[self.src_offsets[i]:self.src_offsets[i + 1]],
            self.tgt_tokens[self.tgt_offsets[i]:self.tgt_offsets[i + 1]])


def corpus_fingerprint(text: PairSource, tokenizer: Tokenizer, max_len: int) -> str:
  """What a tokenised corpus depends on: the text, the vocabulary and the length limit."""
  key = f'{_FORMAT}|{max_len}|{text.fingerprint()}|'.encode() + tokenizer.model_proto
  return hashlib.sha256(key).hexdigest()[:20]


def _ids(ids: list[list[int]], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
  """Ragged ids as (flat tokens, lengths), without EOS."""
  lengths = np.fromiter(map(len, ids), np.int64, len(ids))
  return np.fromiter(itertools.chain.from_iterable(ids), dtype, int(lengths.sum())), lengths


def _with_eos(tokens: np.ndarray, lengths: np.ndarray, keep: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
  """The kept sequences' tokens, each followed by EOS, and their lengths with it."""
  kept_tokens = np.repeat(keep, lengths)
  out_lengths = (lengths[keep] + 1).astype(np.int32)  # kept until the end: 4 bytes a pair
  out = np.full(int(out_lengths.sum()), EOS_ID, tokens.dtype)
  body = np.ones(len(out), bool)
  body[np.cumsum(out_lengths) - 1] = False  # the EOS slots
  out[body] = tokens[kept_tokens]
  return out, out_lengths


class _Sink:
  """Where tokenised chunks go: files in a folder (the cache), or lists in memory."""

  def __init__(self, folder: pathlib.Path | None):
    self.files = None if folder is None else {
        side: open(folder / f'{side}_tokens.bin', 'wb') for side in ('src', 'tgt')}  # noqa: SIM115
    self.tokens: dict[str, list[np.ndarray]] = {'src': [], 'tgt': []}
    self.lengths: dict[str, list[np.ndarray]] = {'src': [], 'tgt': []}

  def add(self, side: str, tokens: np.ndarray, lengths: np.ndarray) -> None:
    if self.files is None:
      self.tokens[side].append(tokens)
    else:
      self.files[side].write(tokens.tobytes())
    self.lengths[side].append(lengths)

  def close(self) -> None:
    for f in (self.files or {}).values():
      f.close()


def _offsets(lengths: list[np.ndarray]) -> np.ndarray:
  offsets = np.zeros(sum(map(len, lengths)) + 1, np.int64)
  np.cumsum(np.concatenate(lengths), out=offsets[1:])
  return offsets


def tokenize_corpus(text: PairSource, tokenizer: Tokenizer, max_len: int,
                    cache_dir: str | os.PathLike | None = None) -> TokenizedCorpus:
  """Tokenises both sides, appends EOS, and drops (and counts) empty and over-long pairs.

  A pair is empty when either side is blank, and too long when either side exceeds max_len
  tokens with its EOS. With `cache_dir`, the result is stored under a fingerprint of the text,
  the tokenizer model and max_len, and later calls with the same inputs map it from disk
  instead (memory-mapped: processes share its pages).
  """
  if len(text) == 0:
    raise DataError(f'{text.origin}: no sentence pairs.')
  fingerprint = corpus_fingerprint(text, tokenizer, max_len)
  if cache_dir is None:
    return _tokenize(text, tokenizer, max_len, None, fingerprint)
  path = pathlib.Path(cache_dir) / f'tokens-{fingerprint}'
  if (path / 'counts.json').exists():
    try:
      return _load(path, fingerprint)
    except DataError as e:  # truncated, edited or half-deleted: made again from the text
      log.warning('%s: rebuilding it', e)
      shutil.rmtree(path, ignore_errors=True)
  _write_cache(text, tokenizer, max_len, path, fingerprint)
  return _load(path, fingerprint)


def _report(origin: str, counts: dict[str, int], max_len: int) -> None:
  """One line, before training, of what the corpus keeps (said by the process that tokenises
  it): a warning with the share lost and the settings that keep them when pairs were
  dropped."""
  line = (f'{origin}: read {counts["read"]} pairs, kept {counts["kept"]}, dropped '
          f'{counts["empty"]} empty and {counts["too_long"]} longer than {max_len} tokens')
  if counts['kept'] == counts['read']:
    log.info('%s.', line)
    return
  lost = 1 - counts['kept'] / counts['read']
  keep = (' (raise train.row_len, and model.max_len where it is shorter, to keep the long ones)'
          if counts['too_long'] else '')
  log.warning('%s: %.2f%% of the pairs lost%s.', line, 100 * lost, keep)


def _tokenize(text: PairSource, tokenizer: Tokenizer, max_len: int, folder: pathlib.Path | None,
              fingerprint: str) -> TokenizedCorpus | None:
  """Streams the pairs through sentencepiece into `folder` (or memory); the corpus in memory,
  or None when written to `folder`."""
  dtype = np.uint16 if tokenizer.vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
  counts = {'read': 0, 'kept': 0, 'empty': 0, 'too_long': 0}
  sink = _Sink(folder)
  try:
    with tqdm(total=len(text), desc=f'tokenising {text.origin}', unit='pairs') as bar:
      for src, tgt in text.chunks(_CHUNK):
        (src_tokens, src_lengths), (tgt_tokens, tgt_lengths) = (
            _ids(tokenizer.encode(src), dtype), _ids(tokenizer.encode_target(tgt), dtype))
        empty = (src_lengths == 0) | (tgt_lengths == 0)
        too_long = ~empty & (np.maximum(src_lengths, tgt_lengths) + 1 > max_len)
        keep = ~(empty | too_long)
        counts['read'] += len(src)
        counts['empty'] += int(empty.sum())
        counts['too_long'] += int(too_long.sum())
        counts['kept'] += int(keep.sum())
        sink.add('src', *_with_eos(src_tokens, src_lengths, keep))
        sink.add('tgt', *_with_eos(tgt_tokens, tgt_lengths, keep))
        bar.update(len(src))
  finally:
    sink.close()
  _report(text.origin, counts, max_len)
  if not counts['kept']:
    raise DataError(f'{text.origin}: all {counts["read"]} pairs were dropped '
                    f'({counts["empty"]} empty, {counts["too_long"]} longer than {max_len}).')
  offsets = {side: _offsets(sink.lengths[side]) for side in ('src', 'tgt')}
  if folder is not None:
    for side in ('src', 'tgt'):
      np.save(folder / f'{side}_offsets.npy', offsets[side])
    (folder / 'counts.json').write_text(json.dumps({**counts, 'dtype': np.dtype(dtype).name}))
    return None
  return TokenizedCorpus(np.concatenate(sink.tokens['src']), offsets['src'],
                         np.concatenate(sink.tokens['tgt']), offsets['tgt'], counts, fingerprint)


def _write_cache(text: PairSource, tokenizer: Tokenizer, max_len: int, path: pathlib.Path,
                 fingerprint: str) -> None:
  """Writes the cache into a temporary folder, then renames it: a crash, an interruption or a
  full disk never leaves half a cache. A folder left by a killed process is removed by the
  next writer (data.pipeline makes writers of one workdir take turns)."""
  what = 'the token cache (about 2 bytes per token)'
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f'tokens-*{_PARTIAL}*'):
      shutil.rmtree(stale, ignore_errors=True)
    tmp = pathlib.Path(tempfile.mkdtemp(dir=path.parent, prefix=path.name + _PARTIAL))
  except OSError as e:  # a read-only or full disk
    raise files.cannot_write(path.parent, what, e) from None
  try:
    _tokenize(text, tokenizer, max_len, tmp, fingerprint)
    files.respect_umask(tmp)
    os.replace(tmp, path)
  except OSError as e:
    shutil.rmtree(tmp, ignore_errors=True)
    if (path / 'counts.json').exists() and not files.disk_full(e):  # another process was first
      return
    raise files.cannot_write(path.parent, what, e) from None
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise


def _load(path: pathlib.Path, fingerprint: str) -> TokenizedCorpus:
  """The cache in `path`, memory-mapped, after checking its files against each other (pair
  count, offsets, token file sizes); DataError naming what is wrong when they disagree."""
  try:
    counts = json.loads((path / 'counts.json').read_text())
    dtype = np.dtype(counts.pop('dtype'))
    arrays = {}
    for side in ('src', 'tgt'):
      offsets = np.load(path / f'{side}_offsets.npy', mmap_mode='r').view(np.ndarray)
      tokens = path / f'{side}_tokens.bin'
      size = tokens.stat().st_size
      if len(offsets) != counts['kept'] + 1 or offsets[0] != 0 or np.any(np.diff(offsets) < 0):
        raise ValueError(f'{side}_offsets.npy does not hold {counts["kept"]} pairs')
      if size != offsets[-1] * dtype.itemsize:
        raise ValueError(f'{tokens.name} has {size} bytes, its offsets say '
                         f'{offsets[-1] * dtype.itemsize}')
      # Plain array views of the maps: indexing a np.memmap goes through its subclass's Python
      # hooks, which cost a third of a batch's assembly.
      arrays[f'{side}_offsets'] = offsets
      arrays[f'{side}_tokens'] = np.memmap(tokens, dtype, mode='r').view(np.ndarray) \
          if size else np.zeros(0, dtype)
  except (OSError, ValueError, KeyError, TypeError) as e:  # json's errors are ValueErrors
    raise DataError(f'{path}: the token cache is damaged ({e})') from None
  log.info('loaded %d tokenised pairs from %s', counts['kept'], path)
  return TokenizedCorpus(**arrays, counts=counts, fingerprint=fingerprint)
