"""What a path is, and a full disk, each said in one line.

`describe` names what a path holds (a training workdir, a checkpoint folder, an export, a file,
a FIFO, nothing) for every command that takes a model or a workdir, so that a wrong path is
refused with what it is rather than with what it is not.

Checkpoints and exports check the space they need before writing (`check_space`); a disk that
fills while they write (another process, a quota) is recognised in whatever form the writing
library reports it (`disk_full`: an OSError, tensorstore's RESOURCE_EXHAUSTED, safetensors'
error) and reported the same way.
"""

import contextlib
import enum
import errno
import fcntl
import json
import logging
import os
import pathlib
import shutil
import socket
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any

from jaxformer.errors import JaxformerError, reason

log = logging.getLogger(__name__)

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_FULL_TEXTS = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT))


class Kind(enum.StrEnum):
  """What a path holds (`describe`); each value is how messages say it."""
  MISSING = 'missing'
  FILE = 'a file'
  FIFO = 'a FIFO (a pipe)'
  DEVICE = 'a device or a socket'
  EXPORT = 'an exported model'
  CTRANSLATE2 = 'a CTranslate2 model'
  HUGGINGFACE = 'a Hugging Face model'
  WORKDIR = 'a training workdir'
  CHECKPOINTS = 'a checkpoint folder'
  EMPTY = 'an empty folder'
  FOLDER = 'a folder'
  PARTIAL = ('an unfinished export (its writing was stopped; export into it again, with or '
             'without --overwrite)')


# (the names other modules use)
MISSING, EMPTY, FOLDER, PARTIAL = Kind.MISSING, Kind.EMPTY, Kind.FOLDER, Kind.PARTIAL
# The file an export writes into an existing folder before it moves its files in, and removes
# after: a folder that still holds it is an export whose writing was stopped (PARTIAL).
UNFINISHED = '.jaxformer-unfinished'

WORKDIR, CHECKPOINTS, EXPORT, CTRANSLATE2, HUGGINGFACE = (
    Kind.WORKDIR, Kind.CHECKPOINTS, Kind.EXPORT, Kind.CTRANSLATE2, Kind.HUGGINGFACE)
# The file beside config.json that tells an export of another format from jaxformer's own
# (whose is params.safetensors); jaxformer.formats' registry checks that each format has one.
EXPORT_MARKERS = {'model.bin': Kind.CTRANSLATE2, 'model.safetensors': Kind.HUGGINGFACE,
                  'pytorch_model.bin': Kind.HUGGINGFACE}


def describe(path: str | os.PathLike) -> Kind:
  """What `path` is: MISSING, FILE, FIFO, DEVICE, PARTIAL (an export stopped while its files
  moved in: UNFINISHED), EXPORT (a config.json of jaxformer's;
  `formats.native.load` says what else it lacks), CTRANSLATE2 or HUGGINGFACE (EXPORT_MARKERS, or a
  model's folder in the Hub's download cache: models--ORG--NAME), WORKDIR
  (checkpoints/, or the vocabulary a run writes first), CHECKPOINTS (numbered step folders, e.g.
  WORKDIR/average-last5), EMPTY, or FOLDER (anything else)."""
  path = pathlib.Path(path)
  if not path.exists():
    return Kind.MISSING
  if not path.is_dir():
    return Kind.FILE if path.is_file() else Kind.FIFO if path.is_fifo() else Kind.DEVICE
  if (path / UNFINISHED).exists():
    return Kind.PARTIAL
  if (path / 'snapshots').is_dir() and (path / 'refs').is_dir():  # the Hub's download cache
    return HUGGINGFACE
  if (path / 'config.json').is_file():
    return next((kind for marker, kind in EXPORT_MARKERS.items() if (path / marker).is_file()),
                EXPORT)
  if (path / 'checkpoints').is_dir() or (path / 'spm.model').is_file():
    return WORKDIR
  children = list(path.iterdir())
  if any(child.name.isdigit() and child.is_dir() for child in children):
    return CHECKPOINTS
  return Kind.FOLDER if children else Kind.EMPTY


class WorkdirError(JaxformerError, ValueError):
  """A path that cannot be a training workdir."""


def check_workdir(workdir: str | os.PathLike) -> None:
  """A one-line WorkdirError when `workdir` is a file, or a model that is no training workdir
  (an export, a checkpoint folder), which a run's checkpoints would turn into something no
  command reads as either."""
  found = describe(workdir)
  if found not in (MISSING, EMPTY, WORKDIR, FOLDER):
    raise WorkdirError(misplaced(workdir, found, 'a training workdir'))


def make_workdir(workdir: str | os.PathLike) -> pathlib.Path:
  """`workdir` (check_workdir), created if needed; a one-line WorkdirError when it cannot be."""
  check_workdir(workdir)
  workdir = pathlib.Path(workdir)
  try:
    workdir.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise WorkdirError(f'{workdir}: cannot be the workdir ({reason(e)}).') from None
  return workdir


def has_checkpoints(workdir: str | os.PathLike) -> bool:
  """Whether a training workdir has saved a checkpoint (a numbered step folder) to resume."""
  return any(path.name.isdigit() for path in (pathlib.Path(workdir) / 'checkpoints').glob('*'))


def misplaced(path: str | os.PathLike, found: str, wanted: str) -> str:
  """The one line for `path`, which is `found` (describe's words) where `wanted` belongs."""
  there = 'does not exist' if found == MISSING else f'is {found}'
  return f'{path}: {there}, where {wanted} belongs.'


class WriteError(JaxformerError, OSError):
  """A file that could not be written (a read-only disk or folder, no permission); nothing
  half-written was left behind."""


class DiskFullError(WriteError):
  """No space left for what was being written; nothing half-written was left behind."""


class InUseError(JaxformerError):
  """A folder whose lock another process holds."""


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


def cannot_write(path: str | os.PathLike, what: str, error: OSError) -> JaxformerError:
  """The one-line error for an OSError while writing `what` at `path`: a full disk or quota
  (DiskFullError, with the space free), a read-only disk or no permission (WriteError, naming
  the filesystem), or anything else the system said."""
  if disk_full(error):
    return no_space(path, what)
  return WriteError(f'{path}: cannot write {what} on {mount_point(path)} '
                    f'({reason(error)}).')


def respect_umask(path: str | os.PathLike) -> None:
  """Gives `path` the permissions a file (or folder) made with open() would have: tempfile
  makes its files readable by their owner only."""
  mask = os.umask(0)
  os.umask(mask)
  os.chmod(path, (0o777 if os.path.isdir(path) else 0o666) & ~mask)


def check_output(path: str | os.PathLike, what: str) -> None:
  """WriteError, in one line, when `what` could not be written to the file `path` (no such
  folder, or a folder at its place): called before the work that fills it, not after."""
  path = pathlib.Path(path)
  if path.is_dir():
    raise WriteError(f'{path}: a folder, where the file for {what} belongs.')
  if not path.parent.is_dir():
    raise WriteError(f'{path.parent}: no such folder for {what}.')


def write_atomically(path: str | os.PathLike, content: bytes, what: str) -> None:
  """Writes `content` to `path` whole or not at all: a temporary file of this writer's own
  beside it, flushed to disk, then renamed into place (readers never see half a file, and
  processes writing the same file at once never share a temporary one). A failure is
  cannot_write's one line, and the temporary file goes."""
  path = pathlib.Path(path)
  partial = None
  try:
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f'.{path.name}.',
                                     suffix='.partial', delete=False) as f:
      partial = f.name
      f.write(content)
      f.flush()
      os.fsync(f.fileno())
    respect_umask(partial)
    os.replace(partial, path)
    partial = None
  except OSError as e:
    raise cannot_write(path, what, e) from None
  finally:
    if partial is not None:
      with contextlib.suppress(OSError):
        os.unlink(partial)


@contextlib.contextmanager
def locked(folder: str | os.PathLike, name: str, what: str, *, wait: bool = False
           ) -> Iterator[None]:
  """Holds the lock `folder`/.`name`.lock for `what` ('a training run', 'averaging') while the
  block runs. Another holder: with `wait`, this waits for it (saying so); without, InUseError
  names the process that holds it. The lock is flock's: the kernel releases it when its holder
  exits, even on kill -9, so a lock left by a killed run never blocks. A lock file that cannot
  be made (a read-only or full disk) is cannot_write's one line."""
  path = pathlib.Path(folder) / f'.{name}.lock'
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, 'a+', encoding='utf-8')  # noqa: SIM115  (closed below)
  except OSError as e:
    raise cannot_write(path, f'the lock of {what}', e) from None
  with f:
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      f.seek(0)
      holder = f.read().strip() or 'another process'
      if not wait:
        raise InUseError(f'{folder} is in use: {what} by {holder} holds it. Wait for that to '
                         'end, or use another folder.') from None
      log.info('waiting for %s to finish %s (%s)', holder, what, path)
      fcntl.flock(f, fcntl.LOCK_EX)
    try:
      f.seek(0)
      f.truncate()
      f.write(f'pid {os.getpid()} on {socket.gethostname()}\n')
      f.flush()
    except OSError as e:  # a disk that filled: the lock holds, its note does not
      log.warning('%s: cannot note the lock\'s holder (%s)', path, reason(e))
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


# --- records other tools (or hands) may have written ------------------------------------------


class RecordError(JaxformerError, ValueError):
  """A JSON record jaxformer reads but did not just write (an export's config.json, a
  workdir's recipe.json, a vocabulary's record, a checkpoint's meta), damaged or edited: the
  message names the file and the field."""


_REQUIRED = object()
_JSON_NAMES = {int: 'an integer', float: 'a number', str: 'a string', bool: 'true or false',
               dict: 'an object', list: 'a list', type(None): 'null'}


def near(model: str | os.PathLike, name: str) -> pathlib.Path | None:
  """The file `name` (e.g. recipe.json) of the training workdir that a model folder is or lies
  in (WORKDIR, WORKDIR/average-last5, WORKDIR/checkpoints/N); None where there is none (an
  exported folder, a run without such a file)."""
  folder = pathlib.Path(model).absolute()
  return next((candidate / name for candidate in (folder, folder.parent, folder.parent.parent)
               if (candidate / name).is_file()), None)


def record_near(model: str | os.PathLike, name: str) -> tuple[pathlib.Path, dict] | None:
  """The record `name` that `near` finds, read (read_record), with its path, or None."""
  path = near(model, name)
  return path and (path, read_record(path, f'the {name} record'))


def read_record(path: str | os.PathLike, what: str) -> dict[str, Any]:
  """The JSON object in `path` (`what` it is, for the message); RecordError if the file cannot
  be read or holds no JSON object. Its fields are read with `field`."""
  try:
    value = json.loads(pathlib.Path(path).read_text(encoding='utf-8'))
  except (OSError, UnicodeDecodeError, ValueError) as e:
    raise RecordError(f'{path}: cannot read {what} ({reason(e)}).') from None
  if not isinstance(value, dict):
    raise RecordError(f'{path}: {what} must be a JSON object, got {json.dumps(value)[:60]}.')
  return value


def field(record: Mapping[str, Any], name: str, kind: type | tuple[type, ...], where: str,
          default: Any = _REQUIRED) -> Any:
  """record[name] when it is of `kind` (a bool is no number), `default` when it is absent (if
  one is given); else a RecordError naming `where` (the file) and the field, so that a value
  another tool wrote fails where it is read, in one line, not later in a traceback."""
  if name not in record:
    if default is _REQUIRED:
      raise RecordError(f'{where}: "{name}" is missing.')
    return default
  value, kinds = record[name], kind if isinstance(kind, tuple) else (kind,)
  if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
    names = ' or '.join(_JSON_NAMES.get(k, k.__name__) for k in kinds)
    raise RecordError(f'{where}: "{name}" must be {names}, got {json.dumps(value)[:60]}.')
  return value

