"""jaxformer.errors: every command's way out."""

import gzip

import pytest

from jaxformer import errors, files


def test_a_users_error_is_one_line_and_status_1(capsys):
  def fails() -> int:
    raise errors.DataError('train.en:3: not valid UTF-8.')
  assert errors.exit_code(fails) == 1
  assert capsys.readouterr().err == 'error: train.en:3: not valid UTF-8.\n'
  assert issubclass(errors.DataError, (errors.JaxformerError, ValueError))


def test_ctrl_c_is_interrupted_and_130_and_other_errors_go_on(capsys):
  def interrupted() -> int:
    raise KeyboardInterrupt
  assert errors.exit_code(interrupted) == 130
  assert capsys.readouterr().err == '\ninterrupted\n'
  assert errors.exit_code(lambda: 0) == 0

  def bug() -> int:
    raise RuntimeError('a bug: its traceback is wanted')
  with pytest.raises(RuntimeError, match='a bug'):
    errors.exit_code(bug)


def test_an_errors_reason_is_its_words_without_errno_or_path(tmp_path):
  """Messages said `[Errno 21] Is a directory: '...'` (the path twice) in some places and the
  words alone in others; `reason` is the one way now."""
  with pytest.raises(OSError) as raised:
    open(tmp_path, encoding='utf-8')  # noqa: SIM115  (a folder)
  assert str(raised.value).startswith('[Errno 21]')
  assert errors.reason(raised.value) == 'Is a directory'
  assert errors.reason(gzip.BadGzipFile("Not a gzipped file (b'ga')")) == \
      "Not a gzipped file (b'ga')"  # (an OSError without words of the system's)
  assert errors.reason(ValueError('bad value')) == 'bad value'
  with pytest.raises(files.RecordError, match=rf'^{tmp_path}: cannot read the record \(Is a '
                     r'directory\)\.$'):
    files.read_record(tmp_path, 'the record')
