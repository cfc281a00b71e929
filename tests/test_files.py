"""jaxformer.files: a full disk during a checkpoint save or an export is one line naming the
filesystem, and leaves nothing half-written."""

import errno
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
from helpers import CFG, TEXT, train_command

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
  assert cli.main(['export', '--model', str(workdir), str(out)]) == 1
  assert 'no space on' in capsys.readouterr().err
  assert {name: (out / name).read_bytes() for name in export.FILES} == before
  assert sorted(os.listdir(tmp_path)) == ['.out.lock', 'out']
