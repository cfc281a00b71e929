"""Where sentence pairs come from: tensorflow-datasets WMT14, line-aligned text files, or any
in-memory list (the embedded demo corpus). Every source returns a `ParallelText`."""

import dataclasses
import gzip
import os
import pathlib

from tqdm import tqdm


class DataError(ValueError):
  """Bad or missing input data; the message says what, where, and what to do."""


@dataclasses.dataclass(frozen=True)
class ParallelText:
  """Line-aligned source and target sentences, and a string naming where they came from."""
  src: list[str]
  tgt: list[str]
  origin: str

  def __post_init__(self):
    if len(self.src) != len(self.tgt):
      raise DataError(f'{self.origin}: {len(self.src)} source but {len(self.tgt)} target lines.')

  def __len__(self) -> int:
    return len(self.src)


# ---------------------------------------------------------------------------------------------
# Text files.


def read_lines(path: str | os.PathLike) -> list[str]:
  """The lines of a UTF-8 text file (plain or .gz), without line ends.

  Only '\\n' ends a line ('\\r\\n' is normalised); tabs and other characters are text. Raises
  DataError for a missing or empty file and for bytes that are not UTF-8 (with file:line).
  """
  path = pathlib.Path(path)
  if not path.is_file():
    raise DataError(f'{path}: no such file.')
  opener = gzip.open if path.suffix == '.gz' else open
  try:
    with opener(path, 'rb') as f:
      data = f.read()
  except (OSError, EOFError) as e:
    raise DataError(f'{path}: cannot read ({e}).') from None
  if not data:
    raise DataError(f'{path}: the file is empty.')
  raw_lines = data.split(b'\n')
  if raw_lines[-1] == b'':  # the final newline ends the last line; it does not start a new one
    raw_lines.pop()
  return [decode_line(raw, f'{path}:{number}') for number, raw in enumerate(raw_lines, start=1)]


def decode_line(raw: bytes, where: str) -> str:
  """A line's UTF-8 text without its line end ('\n' or '\r\n'); DataError naming `where`
  (e.g. file:line) for bytes that are not UTF-8."""
  try:
    return raw.removesuffix(b'\n').removesuffix(b'\r').decode('utf-8')
  except UnicodeDecodeError as e:
    raise DataError(f'{where}: not valid UTF-8 (byte {e.start}: {e.reason}); re-encode it as '
                    'UTF-8.') from None


def read_parallel_text(src_path: str | os.PathLike, tgt_path: str | os.PathLike) -> ParallelText:
  """Two line-aligned files; raises DataError when their line counts differ."""
  src, tgt = read_lines(src_path), read_lines(tgt_path)
  if len(src) != len(tgt):
    raise DataError(f'{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: '
                    'the files must be line-aligned.')
  return ParallelText(src, tgt, origin=f'{src_path}|{tgt_path}')


# ---------------------------------------------------------------------------------------------
# tensorflow-datasets.

WMT14 = {'de': 'wmt14_translate/de-en', 'fr': 'wmt14_translate/fr-en'}
# newstest2013 is the validation split and newstest2014 (3003 segments) the test split.
SPLITS = ('train', 'validation', 'test')


def prepare_command(name: str, data_dir: str | None) -> str:
  """The shell command that downloads and prepares a tfds dataset (needs internet)."""
  where = f' --data_dir={data_dir}' if data_dir else ''
  return f'tfds build {name}{where}'


def load_tfds(name: str, split: str, *, src_key: str, tgt_key: str,
              data_dir: str | None = None, download: bool = False) -> ParallelText:
  """Reads a prepared tfds translation dataset, picking the source/target fields by name.

  tfds's supervised keys for wmt14_translate are (de|fr, en): pass src_key='en' for EN->DE/FR.
  Without `download`, a dataset that is not prepared raises DataError at once with the command
  that prepares it, instead of letting tfds start a download (which hangs when offline).
  """
  import tensorflow_datasets as tfds  # imported here: slow, and only this source needs it

  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError:
    raise DataError(f'tfds dataset {name!r} not found in {data_dir or "the default data dir"}.'
                    ) from None
  if download:
    builder.download_and_prepare()
  elif not builder.is_prepared():
    raise DataError(
        f'tfds dataset {name} is not prepared in {builder.data_dir}. Prepare it once (needs '
        f'internet, hours for WMT14 train): {prepare_command(name, data_dir)} '
        f'(or pass --download).')
  splits = builder.info.splits
  if splits and split not in splits:
    raise DataError(f'{name} has no split {split!r}; it has {sorted(splits)}.')
  src, tgt = [], []
  dataset = builder.as_dataset(split=split, shuffle_files=False)
  for example in tqdm(tfds.as_numpy(dataset), desc=f'reading {name} {split}',
                      total=splits[split].num_examples if split in splits else None, unit='pairs'):
    src.append(example[src_key].decode('utf-8'))
    tgt.append(example[tgt_key].decode('utf-8'))
  return ParallelText(src, tgt, origin=f'tfds:{name}:{split}')


def load_wmt14(target_language: str, split: str, *, data_dir: str | None = None,
               download: bool = False) -> ParallelText:
  """WMT14 EN->DE (target_language='de') or EN->FR ('fr')."""
  if target_language not in WMT14:
    raise DataError(f'WMT14 target language must be one of {sorted(WMT14)}, '
                    f'got {target_language!r}.')
  return load_tfds(WMT14[target_language], split, src_key='en', tgt_key=target_language,
                   data_dir=data_dir, download=download)
