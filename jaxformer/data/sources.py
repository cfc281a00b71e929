"""Where sentence pairs come from: tensorflow-datasets WMT14, line-aligned text files, or any
in-memory list (the embedded demo corpus).

Every source is a `PairSource`: it streams its pairs in chunks (never the whole corpus as
Python objects), says how many pairs it has, and gives a fingerprint of its content that
caches and checkpoints record. `ParallelText` holds pairs in memory (validation and test sets);
`TextFiles` and `TfdsSplit` stream training corpora of any size.
"""

import dataclasses
import hashlib
import itertools
import logging
import os
import pathlib
from collections.abc import Iterator
from typing import Any, Protocol

from tqdm import tqdm

from jaxformer.config import WMT14_DIRECTIONS
from jaxformer.errors import DataError
from jaxformer.text import check_readable, line_blocks, raw_blocks, read_lines


Chunk = tuple[list[str], list[str]]  # aligned source and target sentences


class PairSource(Protocol):
  """Line-aligned sentence pairs, streamed."""
  origin: str  # names where they come from, in messages

  def __len__(self) -> int:
    """The number of pairs."""

  def side(self, index: int) -> Iterator[str]:
    """The source (0) or target (1) sentences in order."""

  def chunks(self, size: int) -> Iterator[Chunk]:
    """The pairs in order, `size` at a time."""

  def fingerprint(self) -> str:
    """A short hex digest that changes when the pairs change."""


@dataclasses.dataclass(frozen=True)
class ParallelText(PairSource):
  """Line-aligned source and target sentences in memory, and a string naming their origin."""
  src: list[str]
  tgt: list[str]
  origin: str

  def __post_init__(self):
    if len(self.src) != len(self.tgt):
      raise DataError(f'{self.origin}: {len(self.src)} source but {len(self.tgt)} target lines.')

  def __len__(self) -> int:
    return len(self.src)

  def side(self, index: int) -> Iterator[str]:
    return iter((self.src, self.tgt)[index])

  def chunks(self, size: int) -> Iterator[Chunk]:
    for start in range(0, len(self), size):
      yield self.src[start:start + size], self.tgt[start:start + size]

  def fingerprint(self) -> str:
    digest = hashlib.sha256(f'{len(self)}|'.encode())
    for src, tgt in self.chunks(50_000):
      for side in (src, tgt):
        digest.update('\n'.join(side).encode('utf-8', 'surrogatepass') + b'\x00')
    return digest.hexdigest()[:20]


# ---------------------------------------------------------------------------------------------
# Text files.

def _count_and_hash(path: pathlib.Path) -> tuple[int, bytes]:
  """(lines, sha256 of the bytes) in one pass, without decoding."""
  lines, digest, last = 0, hashlib.sha256(), b''
  for block in raw_blocks(path):
    lines += block.count(b'\n')
    digest.update(block)
    last = block
  if not last:
    raise DataError(f'{path}: the file is empty.')
  return lines + (not last.endswith(b'\n')), digest.digest()


class TextFiles(PairSource):
  """Two line-aligned UTF-8 text files (plain or .gz), streamed: memory does not grow with
  their size. Their line counts are compared before any pair is read."""

  def __init__(self, src_path: str | os.PathLike, tgt_path: str | os.PathLike):
    self.paths = pathlib.Path(src_path), pathlib.Path(tgt_path)
    for path in self.paths:  # counted and hashed, then read
      check_readable(path, passes=2)
    self.origin = f'{src_path}|{tgt_path}'
    self._summary: tuple[int, str] | None = None

  def _summarise(self) -> tuple[int, str]:
    """(pairs, fingerprint), from one pass over both files' bytes."""
    if self._summary is None:
      (src_lines, src_hash), (tgt_lines, tgt_hash) = map(_count_and_hash, self.paths)
      if src_lines != tgt_lines:
        raise DataError(f'{self.paths[0]} has {src_lines} lines but {self.paths[1]} has '
                        f'{tgt_lines}: the files must be line-aligned.')
      self._summary = src_lines, hashlib.sha256(src_hash + tgt_hash).hexdigest()[:20]
    return self._summary

  def __len__(self) -> int:
    return self._summarise()[0]

  def fingerprint(self) -> str:
    return self._summarise()[1]

  def side(self, index: int) -> Iterator[str]:
    return itertools.chain.from_iterable(line_blocks(self.paths[index]))

  def chunks(self, size: int) -> Iterator[Chunk]:
    len(self)  # the line counts agree
    src, tgt = self.side(0), self.side(1)
    while chunk := (list(itertools.islice(src, size)), list(itertools.islice(tgt, size))):
      if not chunk[0]:
        return
      yield chunk

  def read(self) -> ParallelText:
    """All pairs in memory."""
    return read_parallel_text(*self.paths)


def read_parallel_text(src_path: str | os.PathLike, tgt_path: str | os.PathLike) -> ParallelText:
  """Two line-aligned files in memory; raises DataError when their line counts differ."""
  src, tgt = read_lines(src_path), read_lines(tgt_path)
  if len(src) != len(tgt):
    raise DataError(f'{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: '
                    'the files must be line-aligned.')
  return ParallelText(src, tgt, origin=f'{src_path}|{tgt_path}')


# ---------------------------------------------------------------------------------------------
# tensorflow-datasets.

WMT14 = {'de': 'wmt14_translate/de-en', 'fr': 'wmt14_translate/fr-en'}  # by non-English side
# newstest2013 is the validation split and newstest2014 (3003 segments) the test split.
SPLITS = ('train', 'validation', 'test')


def prepare_command(name: str, data_dir: str | None) -> str:
  """The shell command that downloads and prepares a tfds dataset (needs internet). Through
  tfds's Python API: tensorflow-datasets 4.9.10's own `tfds build` command does not start
  without apache-beam, which these datasets do not need."""
  where = f', data_dir={str(data_dir)!r}' if data_dir else ''
  return (f'python -c "import tensorflow_datasets as tfds; '
          f'tfds.builder({name!r}{where}).download_and_prepare()"')


WMT_EXTRA = "pip install 'jaxformer[wmt]'"  # (make install brings it)


def require_tfds() -> Any:
  """tensorflow_datasets, imported here (slow, and only WMT14 needs it); DataError naming the
  install command when this install lacks it (the core install has no TensorFlow)."""
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise DataError(f'WMT14 is read through tensorflow-datasets, which this install lacks: '
                    f'{WMT_EXTRA} (the make targets install it).') from None
  return tfds


def _not_a_variant_folder(record: logging.LogRecord) -> bool:
  return not str(record.msg).startswith('Variant folder')


def _is_prepared(builder: Any) -> bool:
  """builder.is_prepared() without tfds's warning that the dataset's folder lacks its files
  ("Variant folder ... has no dataset_info.json", even where there is no folder): where it is
  not prepared, the DataError says so, with the command that prepares it."""
  absl = logging.getLogger('absl')
  absl.addFilter(_not_a_variant_folder)
  try:
    return builder.is_prepared()
  finally:
    absl.removeFilter(_not_a_variant_folder)


class TfdsSplit(PairSource):
  """A split of a prepared tfds translation dataset, streamed, with the source and target
  fields picked by name (tfds's supervised keys for wmt14_translate are (de|fr, en): pass
  src_key='en' for EN->DE/FR).

  Without `download`, a dataset that is not prepared raises DataError at once with the command
  that prepares it, instead of letting tfds start a download (which hangs when offline).
  """

  def __init__(self, name: str, split: str, *, src_key: str, tgt_key: str,
               data_dir: str | None = None, download: bool = False):
    tfds = require_tfds()
    try:
      self._builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
      raise DataError(f'tfds dataset {name!r} not found in '
                      f'{data_dir or "the default data dir"}.') from None
    if download:
      self._builder.download_and_prepare()
    elif not _is_prepared(self._builder):
      raise DataError(
          f'tfds dataset {name} is not prepared in {self._builder.data_dir}. Prepare it once '
          f'(needs internet, hours for WMT14 train): {prepare_command(name, data_dir)} '
          f'(or pass --download).')
    splits = self._builder.info.splits
    if splits and split not in splits:
      raise DataError(f'{name} has no split {split!r}; it has {sorted(splits)}.')
    self.name, self.split, self.keys = name, split, (src_key, tgt_key)
    self.origin = f'tfds:{name}:{split}'
    self._length = splits[split].num_examples if split in splits else None

  def __len__(self) -> int:
    if self._length is None:  # a dataset without split metadata (tfds's mock data)
      self._length = sum(len(src) for src, _ in self.chunks(4096))
    return self._length

  def fingerprint(self) -> str:
    """tfds datasets are immutable per version: its name, version, split and size."""
    info = self._builder.info
    split = info.splits.get(self.split)
    key = (f'{self.name}|{info.version}|{self.split}|{len(self)}|'
           f'{split.num_bytes if split else 0}|{self.keys}')
    return hashlib.sha256(key.encode()).hexdigest()[:20]

  def chunks(self, size: int) -> Iterator[Chunk]:
    tfds = require_tfds()
    dataset = self._builder.as_dataset(split=self.split, shuffle_files=False).batch(size)
    with tqdm(desc=f'reading {self.origin}', total=self._length, unit='pairs') as bar:
      for batch in tfds.as_numpy(dataset):
        chunk = tuple([text.decode('utf-8') for text in batch[key]] for key in self.keys)
        bar.update(len(chunk[0]))
        yield chunk

  def side(self, index: int) -> Iterator[str]:
    return itertools.chain.from_iterable(chunk[index] for chunk in self.chunks(4096))

  def read(self) -> ParallelText:
    """All pairs in memory."""
    src, tgt = [], []
    for chunk_src, chunk_tgt in self.chunks(4096):
      src += chunk_src
      tgt += chunk_tgt
    return ParallelText(src, tgt, origin=self.origin)


def load_tfds(name: str, split: str, *, src_key: str, tgt_key: str,
              data_dir: str | None = None, download: bool = False) -> ParallelText:
  """A split of a prepared tfds translation dataset in memory (see TfdsSplit)."""
  return TfdsSplit(name, split, src_key=src_key, tgt_key=tgt_key, data_dir=data_dir,
                   download=download).read()


def wmt14_dataset(source_language: str, target_language: str) -> str:
  """The tfds dataset of a WMT14 direction; DataError for a direction it does not have."""
  if (source_language, target_language) not in WMT14_DIRECTIONS:
    directions = ', '.join(f'{src}->{tgt}' for src, tgt in WMT14_DIRECTIONS)
    raise DataError(f'WMT14 has no {source_language}->{target_language} direction: it has '
                    f'{directions}.')
  return WMT14[target_language if source_language == 'en' else source_language]


def wmt14(target_language: str, split: str, *, source_language: str = 'en',
          data_dir: str | None = None, download: bool = False) -> TfdsSplit:
  """WMT14 in one of its four directions (WMT14_DIRECTIONS; by default from English), streamed."""
  return TfdsSplit(wmt14_dataset(source_language, target_language), split,
                   src_key=source_language, tgt_key=target_language, data_dir=data_dir,
                   download=download)


def load_wmt14(target_language: str, split: str, *, source_language: str = 'en',
               data_dir: str | None = None, download: bool = False) -> ParallelText:
  """WMT14 in one of its four directions, in memory (validation and test sets)."""
  return wmt14(target_language, split, source_language=source_language, data_dir=data_dir,
               download=download).read()
