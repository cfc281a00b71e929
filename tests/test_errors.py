"""jaxformer.errors: every command's way out."""

import pytest

from jaxformer import errors


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
