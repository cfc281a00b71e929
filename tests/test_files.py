"""jaxformer.files: a full disk during a checkpoint save or an export is one line naming the
filesystem, and leaves nothing half-written."""

import errno
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
from collections import namedtuple

import pytest
import safetensors
import safetensors.numpy
from helpers import CFG, TEXT, one_line_error, train_command

from jaxformer import checkpoint, cli, export, files

# The errors the writing libraries raised on a 7 MB tmpfs that filled (copied from their output).
_ORBAX = ('RESOURCE_EXHAUSTED: Error writing "step/0" in OCDBT database at local file "/mnt/w/'
          'checkpoints/2.orbax-checkpoint-tmp/train.orbax-checkpoint-tmp/ocdbt.process_0/": Failed '
          'writing: "/mnt/w/checkpoints/2.orbax-checkpoint-tmp/train.orbax-checkpoint-tmp/ocdbt.'
          'process_0/d/b9aa8d34": Failed to write 117566 bytes to file 16: No space left on device')
_SAFETENSORS = 'Error while serializing: I/O error: No space left on device (os error 28)'
_Usage = namedtuple('_Usage', 'total used free')


def _free(monkeypatch, free: int) -> None:
  monkeypatch.setattr(shutil, 'disk_usage', lambda path: _Usage(10**9, 10**9 - free, free))


def test_disk_full_is_recognised_in_every_form_the_writers_give_it():
  wrapped = RuntimeError('save failed')
  wrapped.__cause__ = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
  for error in (OSError(errno.ENOSPC, 'x'), OSError(errno.EDQUOT, 'x'), ValueError(_ORBAX),
                safetensors.SafetensorError(_SAFETENSORS), wrapped):
    assert files.disk_full(error), error
  for error in (OSError(errno.EACCES, 'Permission denied'), ValueError('RESOURCE_EXHAUSTED: '
                'out of memory'), RuntimeError('Event loop is closed')):
    assert not files.disk_full(error), error


def test_mount_point_is_the_filesystem_of_the_nearest_existing_folder(tmp_path):
  df = subprocess.run(['df', '--output=target', str(tmp_path)], capture_output=True, text=True,
                      check=True)
  assert files.mount_point(tmp_path / 'not' / 'yet') == pathlib.Path(df.stdout.split()[-1])


def test_a_full_disk_stops_training_at_the_save_with_nothing_written(tmp_path, monkeypatch,
                                                                      capsys):
  """Checked before orbax writes a byte: one line naming the filesystem, no partial step."""
  src, tgt = tmp_path / 'train.src', tmp_path / 'train.tgt'
  src.write_text('\n'.join(TEXT.src) + '\n')
  tgt.write_text('\n'.join(TEXT.tgt) + '\n')
  _free(monkeypatch, 12 * 10**5)  # the tiny model and its Adam moments: about 0.7 MB (+1 MB)
  assert cli.main(['train', *train_command(tmp_path / 'w', src, tgt)[2:]]) == 1
  (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith('error')]
  assert re.fullmatch(r'error: \S+/checkpoints: no space on /\S* for checkpoint 6 \(about [\d.]+ '
                      r'MB\): 1.2 MB free\. Nothing was written; .*', line), line
  assert os.listdir(tmp_path / 'w' / 'checkpoints') == []


def test_a_disk_that_fills_during_a_save_leaves_no_unfinished_checkpoint(tmp_path, monkeypatch):
  manager = checkpoint.make_manager(tmp_path / 'checkpoints')
  unfinished = tmp_path / 'checkpoints' / '2.orbax-checkpoint-tmp'

  def fills(*args, **kwargs):
    unfinished.mkdir()
    raise ValueError(_ORBAX)
  monkeypatch.setattr(manager, 'save', fills)
  with pytest.raises(files.DiskFullError, match=r'no space on .* for checkpoint 2'):
    checkpoint.save(manager, 2, params={'w': CFG.d_model}, meta={})
  assert not unfinished.exists()


def test_an_export_that_does_not_fit_is_one_line_and_leaves_no_folder(workdir, tmp_path):
  """Through the command: the space is checked before any file is written."""
  code = ('import shutil, sys\nfrom collections import namedtuple\n'
          "shutil.disk_usage = lambda path: namedtuple('U', 'total used free')(9e9, 9e9, 1000)\n"
          'from jaxformer import cli\n'
          f"sys.exit(cli.main(['export', '--model', {str(workdir)!r}, {str(tmp_path / 'out')!r}]))")
  done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
  assert done.returncode == 1 and 'Traceback' not in done.stderr, done.stderr
  (line,) = done.stderr.strip().splitlines()
  assert line.startswith(f'error: {tmp_path / "out"}: no space on /') and ': 0.0 MB free.' in line
  assert sorted(os.listdir(tmp_path)) == ['.out.lock']


def test_an_export_that_fills_the_disk_keeps_the_previous_export(workdir, tmp_path, monkeypatch,
                                                                  capsys):
  """The files are written beside the folder and replace its files only when all are written."""
  out = tmp_path / 'out'
  assert cli.main(['export', '--model', str(workdir), str(out)]) == 0
  before = {name: (out / name).read_bytes() for name in export.FILES}

  def fills(tensors, path):
    path.write_bytes(b'half')
    raise safetensors.SafetensorError(_SAFETENSORS)
  monkeypatch.setattr(safetensors.numpy, 'save_file', fills)
  monkeypatch.setattr(files, 'check_space', lambda *args: None)  # as if it filled meanwhile
  capsys.readouterr()
  assert cli.main(['export', '--model', str(workdir), str(out), '--overwrite']) == 1
  assert 'no space on' in capsys.readouterr().err
  assert {name: (out / name).read_bytes() for name in export.FILES} == before
  assert sorted(os.listdir(tmp_path)) == ['.out.lock', 'out']


def test_describe_says_what_a_path_is(tmp_path, workdir):
  (tmp_path / 'file').write_text('x')
  os.mkfifo(tmp_path / 'fifo')
  (tmp_path / 'empty').mkdir()
  (tmp_path / 'other').mkdir()
  (tmp_path / 'other' / 'notes.txt').write_text('x')
  (tmp_path / 'fresh').mkdir()  # a run that wrote its vocabulary, no checkpoint yet
  (tmp_path / 'fresh' / 'spm.model').write_bytes(b'')
  (tmp_path / 'ct2').mkdir()
  for name in ('config.json', 'model.bin'):
    (tmp_path / 'ct2' / name).write_text('{}')
  export.save(tmp_path / 'exported', *checkpoint.load(workdir)[:3], step=4)
  found = {name: files.describe(tmp_path / name) for name in
           ('nowhere', 'file', 'fifo', 'empty', 'other', 'fresh', 'ct2', 'exported')}
  assert found == {'nowhere': files.MISSING, 'file': 'a file', 'fifo': 'a FIFO (a pipe)',
                   'empty': files.EMPTY, 'other': 'a folder', 'fresh': files.WORKDIR,
                   'ct2': files.CTRANSLATE2, 'exported': files.EXPORT}
  assert files.describe(workdir) == files.WORKDIR
  assert files.describe(workdir / 'checkpoints') == files.CHECKPOINTS
  assert files.describe(workdir / 'average-last2') == files.CHECKPOINTS
  with pytest.raises(checkpoint.CheckpointError, match='fresh: a training workdir with no '
                     'checkpoint yet'):
    checkpoint.load(tmp_path / 'fresh')
  with pytest.raises(checkpoint.CheckpointError, match='fifo: is a FIFO'):
    export.load_model(tmp_path / 'fifo')


def test_an_export_replaces_an_export_of_its_format_only_when_asked(workdir, tmp_path, capsys):
  out = tmp_path / 'exported'
  assert cli.main(['export', '--model', str(workdir), str(out)]) == 0
  before = (out / 'config.json').read_text()
  assert cli.main(['export', '--model', str(workdir / 'checkpoints'), str(out)]) == 1
  assert capsys.readouterr().err.strip().endswith('is an exported model already: pass '
                                                  '--overwrite to replace it.')
  assert (out / 'config.json').read_text() == before
  assert cli.main(['export', '--model', str(workdir / 'average-last2'), str(out),
                   '--overwrite']) == 0
  assert export.load_model(out)[3] == 4 and sorted(p.name for p in out.iterdir()) == sorted(
      export.FILES)


@pytest.fixture
def small_disk(tmp_path):
  """mount(size, read_only=False, fill=None): a tmpfs of `size` in tmp_path, unmounted after;
  `fill(folder)` writes into it before it is made read-only. A real full or read-only disk
  needs root (CI runs as root)."""
  if os.geteuid() != 0:
    pytest.skip('mounting a small tmpfs needs root')
  mounted = []

  def mount(size: str, read_only: bool = False, fill=None) -> pathlib.Path:
    where = tmp_path / f'disk{len(mounted)}'
    where.mkdir()
    subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs', str(where)],
                   check=True)
    mounted.append(where)
    if fill:
      fill(where)
    if read_only:
      subprocess.run(['mount', '-o', 'remount,ro', str(where)], check=True)
    return where
  yield mount
  for where in mounted:
    subprocess.run(['umount', '-l', str(where)], check=True)


def test_a_read_only_workdir_is_one_line_from_average_train_and_eval_output(workdir, tmp_path,
                                                                           small_disk):
  disk = small_disk('8m', read_only=True,
                    fill=lambda d: shutil.copytree(workdir, d / 'w', symlinks=True))
  assert one_line_error('average', '--workdir', str(disk / 'w'), '--last', '2') == (
      f'error: {disk}/w/.averaging.lock: cannot write the lock of averaging on {disk} '
      '(Read-only file system).')
  src, tgt = tmp_path / 's.txt', tmp_path / 't.txt'
  src.write_text('\n'.join(TEXT.src) + '\n')
  tgt.write_text('\n'.join(TEXT.tgt) + '\n')
  assert one_line_error('train', *train_command(disk / 'w', src, tgt)[2:]) == (
      f'error: {disk}/w/.run.lock: cannot write the lock of a training run on {disk} '
      '(Read-only file system).')
  (tmp_path / 'few.txt').write_text('the man sees a dog\nthe dog\n')
  evaluate = ['eval', '--model', str(disk / 'w'), '--src', str(tmp_path / 'few.txt'), '--ref',
              str(tmp_path / 'few.txt')]
  done = subprocess.run([str(pathlib.Path(sys.executable).with_name('jaxformer')), *evaluate],
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0 and 'hypotheses not kept' in done.stdout  # eval only reads
  assert one_line_error(*evaluate, '--output', str(disk / 'w' / 'hyps.txt')) == (
      f'error: {disk}/w/hyps.txt: cannot write the hypotheses on {disk} (Read-only file '
      'system).')


def test_a_vocabulary_that_does_not_fit_leaves_no_record_behind(tmp_path, small_disk):
  """The vocabulary's record is written, then the vocabulary does not fit: one line, and
  neither file (nor a temporary one) is left to be mistaken for a vocabulary next time."""
  disk = small_disk('16k')
  src, tgt = tmp_path / 's.txt', tmp_path / 't.txt'
  src.write_text('\n'.join(TEXT.src) + '\n')
  tgt.write_text('\n'.join(TEXT.tgt) + '\n')
  line = one_line_error('train', *train_command(disk / 'w', src, tgt)[2:])
  assert re.fullmatch(rf'error: {disk}/w/spm\.model: no space on {disk} for the vocabulary: '
                      r'[\d.]+ MB free\. Nothing was written; .*', line), line
  assert sorted(p.name for p in (disk / 'w').iterdir()) == ['.prepare.lock', '.run.lock']


def test_metrics_on_a_full_disk_are_one_warning_and_training_goes_on(tmp_path, small_disk,
                                                                    caplog):
  from jaxformer import monitor  # pylint: disable=g-import-not-at-top
  disk = small_disk('4k', fill=lambda d: (d / 'w').mkdir())
  (disk / 'w' / 'filler').write_bytes(b'x' * 4096)  # (a write that fills the disk may not fail)
  with monitor.MetricsSink(disk / 'w', enabled=True, start_step=0, total_steps=2) as sink:
    sink.start(0, {'backend': 'cpu'}, 'a run', {'model': {'d_model': 8}})
    sink.scalars(1, 'train', {'loss': 1.0})
  lost = [r.getMessage() for r in caplog.records if r.levelname == 'WARNING']
  assert any(m.startswith('no more metrics.jsonl') and 'No space left on device' in m
             for m in lost), lost
  assert len(lost) <= 2, lost  # one per writer, not one per record


def _entry_point(*argv: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
  """The installed command's entry point, in a process of its own."""
  return subprocess.run([sys.executable, '-m', 'jaxformer', *argv], cwd=cwd, input='a b\n',
                        capture_output=True, text=True, timeout=300)


def test_records_written_by_other_tools_fail_where_read_in_one_line(workdir, tmp_path):
  """A field another tool (or a hand) wrote wrongly, in an export's config.json and a
  workdir's recipe.json: exit 1, one line naming the file and the field, no traceback."""
  assert cli.main(['export', '--model', str(workdir), str(tmp_path / 'e')]) == 0
  config = json.loads((tmp_path / 'e' / 'config.json').read_text())
  resumed = tmp_path / 'w'
  (resumed / 'checkpoints' / '40').mkdir(parents=True)
  (tmp_path / 'train.en').write_text('a b\n')
  (tmp_path / 'train.de').write_text('c d\n')
  cases = [
      ('e/config.json', json.dumps({**config, 'step': None}), ['translate', '--model', 'e'],
       'e/config.json: "step" must be an integer, got null.'),
      ('e/config.json', json.dumps({**config, 'model': []}), ['translate', '--model', 'e'],
       'e/config.json: "model" must be an object, got [].'),
      ('e/config.json', '{"model": ', ['translate', '--model', 'e'],
       "e/config.json: cannot read the export's settings (Expecting value: line 1 column 11 "
       '(char 10)).'),
      ('w/recipe.json', json.dumps({'train': None, 'model': {}, 'optim': {}, 'rules': []}),
       ['train', '--workdir', 'w', '--train-src', 'train.en', '--train-tgt', 'train.de'],
       'w/recipe.json: "train" must be an object, got null.'),
  ]
  for name, content, argv, message in cases:
    (tmp_path / name).write_text(content)
    result = _entry_point(*argv, cwd=tmp_path)
    assert result.returncode == 1 and 'Traceback' not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == f'error: {message}'
    if name == 'e/config.json':
      (tmp_path / name).write_text(json.dumps(config))
  assert _entry_point('translate', '--model', 'e', cwd=tmp_path).returncode == 0  # put back: fine


def test_fields_are_checked_by_kind():
  record = {'n': 3, 'flag': True, 'text': 'x', 'none': None}
  assert files.field(record, 'n', int, 'f.json') == 3
  assert files.field(record, 'missing', int, 'f.json', default=0) == 0
  assert files.field(record, 'none', (str, type(None)), 'f.json') is None
  with pytest.raises(files.RecordError, match=r'^f\.json: "flag" must be an integer, got true\.$'):
    files.field(record, 'flag', int, 'f.json')
  with pytest.raises(files.RecordError, match=r'^f\.json: "missing" is missing\.$'):
    files.field(record, 'missing', int, 'f.json')
