"""The errors a user can fix (JaxformerError; DataError for input), whose message says what is
wrong and how to go on, and how every command reports them: one line, no traceback (exit_code).
Standard library only: the client of `jaxformer serve` imports it without jax."""

import os
import sys
from collections.abc import Callable


def reason(e: BaseException) -> str:
  """What went wrong, for a message: an OSError's words without its errno and path (`Is a
  directory`, not `[Errno 21] Is a directory: 'x'`), any other error's own text."""
  return getattr(e, 'strerror', None) or str(e)


class JaxformerError(Exception):
  """Bad input, settings, data or checkpoints, or a run that cannot go on; see the message."""


class DataError(JaxformerError, ValueError):
  """Bad or missing input data; the message says what, where, and what to do."""


class TrainingError(JaxformerError, RuntimeError):
  """Training cannot go on (e.g. a non-finite loss); the message says where and what to do."""


def exit_code(command: Callable[[], int]) -> int:
  """`command`'s exit status, with what every `jaxformer` command does on the way out: a
  JaxformerError printed as one line (status 1), Ctrl-C as 'interrupted' (130), and a reader
  that went away (`jaxformer translate < f | head -3`) quietly (1)."""
  try:
    return command()
  except JaxformerError as e:
    print(f'error: {e}', file=sys.stderr)
    return 1
  except KeyboardInterrupt:  # on its own line: a progress bar may be cut short
    print('\ninterrupted', file=sys.stderr)
    return 130
  except BrokenPipeError:
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit either
    return 1
