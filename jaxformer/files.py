"""A full disk, said in one line: what did not fit, on which filesystem, with how much free.

Checkpoints and exports check the space they need before writing (`check_space`); a disk that
fills while they write (another process, a quota) is recognised in whatever form the writing
library reports it (`disk_full`: an OSError, tensorstore's RESOURCE_EXHAUSTED, safetensors'
error) and reported the same way.
"""

import errno
import os
import pathlib
import shutil

from jaxformer.errors import JaxformerError

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_FULL_TEXTS = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT))


class DiskFullError(JaxformerError, OSError):
  """No space left for what was being written; nothing half-written was left behind."""


def mount_point(path: str | os.PathLike) -> pathlib.Path:
  """The filesystem `path` is on (the nearest existing folder's mount point)."""
  path = pathlib.Path(path).absolute()
  while not path.exists():
    path = path.parent
  while not os.path.ismount(path):
    path = path.parent
  return path


def disk_full(error: BaseException) -> bool:
  """Whether `error`, or one it was raised from, says the disk or the quota is full."""
  while error is not None:
    if isinstance(error, OSError) and error.errno in _FULL_ERRNOS:
      return True
    if any(text in str(error) for text in _FULL_TEXTS):
      return True
    error = error.__cause__ or error.__context__
  return False


def no_space(path: str | os.PathLike, what: str, needed: int | None = None) -> DiskFullError:
  """The one-line error: `what` did not fit on `path`'s filesystem."""
  disk = mount_point(path)
  free = shutil.disk_usage(disk).free
  size = f' (about {needed / 1e6:,.1f} MB)' if needed else ''
  return DiskFullError(f'{path}: no space on {disk} for {what}{size}: {free / 1e6:,.1f} MB free. '
                       'Nothing was written; free some space, or write elsewhere.')


def check_space(path: str | os.PathLike, needed: int, what: str) -> None:
  """DiskFullError before any byte is written, if `path`'s filesystem has less than `needed`
  bytes (plus 1 MB of slack) free."""
  if shutil.disk_usage(mount_point(path)).free < needed + 2**20:
    raise no_space(path, what, needed)
