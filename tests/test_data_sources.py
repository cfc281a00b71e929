"""jaxformer.data.sources: text files, tfds WMT14 and their bad inputs."""

import gzip
import os
import pathlib
import subprocess
import sys

import pytest

from jaxformer import data
from jaxformer import text as text_lib
from jaxformer.data import DataError, sources


def test_read_lines_keeps_tabs_and_normalises_crlf(tmp_path):
  path = tmp_path / 'a.txt'
  path.write_bytes(b'one\ttwo\r\nthree\x0bfour\n\nfive')
  assert data.read_lines(path) == ['one\ttwo', 'three\x0bfour', '', 'five']


def test_a_byte_order_mark_is_dropped_from_every_text_the_user_gives(tmp_path):
  """Sources and references alike (scoring read it as part of the first word: a different
  BLEU, silently), plain or .gz, and on stdin; only at the very start of the file."""
  (tmp_path / 'ref.txt').write_bytes('\ufeffDer Hund\r\n\ufeffschläft\n'.encode())
  with gzip.open(tmp_path / 'src.txt.gz', 'wb') as f:
    f.write('\ufeffThe dog\nsleeps\n'.encode())
  assert data.read_lines(tmp_path / 'ref.txt') == ['Der Hund', '\ufeffschläft']
  text = data.read_parallel_text(tmp_path / 'src.txt.gz', tmp_path / 'ref.txt')
  assert (text.src, text.tgt) == (['The dog', 'sleeps'], ['Der Hund', '\ufeffschläft'])
  assert list(sources.TextFiles(tmp_path / 'src.txt.gz', tmp_path / 'ref.txt').side(0)) == \
      ['The dog', 'sleeps']
  lines = ['\ufeffThe dog'.encode(), '\ufeffsleeps'.encode()]  # stdin's reader
  assert list(text_lib.decoded([lines], 'stdin')) == [['The dog', '\ufeffsleeps']]


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


@pytest.fixture
def tensorflow():
  """(tensorflow, tensorflow_datasets), imported by the tests that use them: importing
  TensorFlow takes 4 s, which every pytest worker paid at collection when it was this module's."""
  return pytest.importorskip('tensorflow'), pytest.importorskip('tensorflow_datasets')


PAIRS = [('Hello world.', 'Hallo Welt.'), ('The house is red.', 'Das Haus ist rot.')]


WMT14_FAKE = {'de': {'en': ['Hello world.', 'The house is red.'],
                     'de': ['Hallo Welt.', 'Das Haus ist rot.']},
              'fr': {'en': ['Hello world.', 'The house is red.'],
                     'fr': ['Bonjour le monde.', 'La maison est rouge.']}}


@pytest.mark.parametrize('source,target', [('en', 'de'), ('de', 'en'), ('en', 'fr'),
                                           ('fr', 'en')])
def test_wmt14_reads_all_four_directions(source, target, tensorflow):
  """tfds's supervised keys are (de|fr, en): the loader selects fields by name, either way
  round, from the dataset of the non-English language."""
  tf, tfds = tensorflow
  other = target if source == 'en' else source

  def as_dataset(builder, *args, **kwargs):
    del args, kwargs
    assert builder.name == 'wmt14_translate' and builder.builder_config.name == f'{other}-en'
    return tf.data.Dataset.from_tensor_slices(WMT14_FAKE[other])

  with tfds.testing.mock_data(as_dataset_fn=as_dataset):
    # Under the mock nothing is prepared on disk; download_and_prepare is a no-op.
    text = data.load_wmt14(target, 'test', source_language=source, download=True)
  assert text.src == WMT14_FAKE[other][source] and text.tgt == WMT14_FAKE[other][target]
  assert text.origin == f'tfds:wmt14_translate/{other}-en:test'


def test_a_locally_stored_tfds_dataset_goes_through_the_real_loader(tmp_path, tensorflow):
  tf, tfds = tensorflow
  features = tfds.features.FeaturesDict({'en': tfds.features.Text(),
                                         'fr': tfds.features.Text()})
  examples = {'en': ['one', 'two', 'three'], 'fr': ['un', 'deux', 'trois']}
  tfds.dataset_builders.store_as_tfds_dataset(
      name='tiny_translate', version='1.0.0', features=features,
      split_datasets={'train': tf.data.Dataset.from_tensor_slices(examples)},
      data_dir=tmp_path, disable_shuffling=True)
  text = data.load_tfds('tiny_translate', 'train', src_key='en', tgt_key='fr',
                        data_dir=str(tmp_path))
  assert list(zip(text.src, text.tgt)) == [('one', 'un'), ('two', 'deux'), ('three', 'trois')]
  with pytest.raises(DataError, match="has no split 'test'"):
    data.load_tfds('tiny_translate', 'test', src_key='en', tgt_key='fr', data_dir=str(tmp_path))


@pytest.mark.timeout(120)
def test_unprepared_wmt14_fails_fast_with_the_prepare_command(tmp_path):
  """Offline, a tfds download would retry for minutes; we must stop at once instead."""
  code = ('from jaxformer import data\n'
          f'data.load_wmt14("de", "train", data_dir={str(tmp_path)!r})\n')
  result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          timeout=110)
  assert result.returncode != 0
  assert 'DataError: tfds dataset wmt14_translate/de-en is not prepared' in result.stderr
  assert sources.prepare_command('wmt14_translate/de-en', tmp_path) in result.stderr
  assert not any(tmp_path.rglob('downloads')), 'nothing may be downloaded'


def test_the_prepare_command_runs_up_to_the_download(tmp_path):
  """The command the error prints builds the dataset's tfds builder in that folder; only its
  last call, the download, is left out here (tfds 4.9.10's `tfds build`, named before, stopped
  with a traceback: it needs apache-beam)."""
  command = sources.prepare_command('wmt14_translate/de-en', tmp_path)
  assert command.endswith('.download_and_prepare()"')
  offline = command.replace('.download_and_prepare()', '.data_dir, end=chr(10))')
  offline = offline.replace('tfds.builder(', 'print(tfds.builder(')
  result = subprocess.run(offline.replace('python ', f'{sys.executable} ', 1), shell=True,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.strip() == str(tmp_path / 'wmt14_translate' / 'de-en' / '1.0.0')


def test_a_direction_wmt14_lacks_is_a_clear_error():
  with pytest.raises(DataError, match='^WMT14 has no en->es direction: it has en->de, de->en, '
                     'en->fr, fr->en.$'):
    data.load_wmt14('es', 'train')
  with pytest.raises(DataError, match='no de->fr direction'):
    data.load_wmt14('fr', 'train', source_language='de')


_NUMBERED = ''.join(f'line {i}\n' for i in range(9000)).encode()


def _damaged_gz(path):
  whole = gzip.compress(b'a line of text\n' * 2000)
  path.write_bytes(whole[:20] + b'\xff' * 40 + whole[60:])
  return path


@pytest.mark.parametrize('make,message', [
    (lambda p: p.mkdir() or p, r': is a folder, not a file\.$'),
    (lambda p: os.mkfifo(p) or p, r': is a FIFO \(a pipe\), which can be read only once, and this '
                                  r'file is read 2 times: write it to a regular file first\.$'),
    (lambda p: _damaged_gz(p.with_suffix('.gz')), r'\.gz: cannot read \(Error -3 while '
                                                  r'decompressing data'),
    (lambda p: p.with_suffix('.gz').write_bytes(gzip.compress(_NUMBERED)[:2000]) and
     p.with_suffix('.gz'), r'\.gz: cannot read \(Compressed file ended before'),
    (lambda p: p.with_suffix('.gz').write_bytes(b'plain text, not gzip\n') and
     p.with_suffix('.gz'), r"\.gz: cannot read \(Not a gzipped file"),
    (lambda p: pathlib.Path(''), r"^an empty path \(or '\.', the current folder\) was given"),
])
def test_every_kind_of_unreadable_path_says_what_it_is(tmp_path, make, message):
  """A folder, a FIFO where two passes are needed, a damaged, truncated or false .gz, an empty
  name: each a one-line DataError that says what the path is (before: "no such file" for the
  first two, zlib's traceback for a damaged .gz)."""
  path = make(tmp_path / 'train')
  good = tmp_path / 'good.de'
  good.write_text('ein satz\n')
  with pytest.raises(DataError, match=message):
    len(data.TextFiles(path, good))


def test_a_fifo_is_read_where_one_pass_is_enough(tmp_path):
  """Validation and test files are read once: a FIFO (e.g. bash's <(zcat f.gz)) works there."""
  fifo = tmp_path / 'fifo'
  os.mkfifo(fifo)
  writer = subprocess.Popen(['sh', '-c', f'printf "one\\ntwo\\n" > {fifo}'])
  assert data.read_lines(fifo) == ['one', 'two']
  writer.wait(timeout=10)
