"""Writing an export folder, whatever its format: the destination checked (new, empty, or with
--overwrite an export of the same format), and its files written whole or not at all."""

import contextlib
import os
import pathlib
import shutil
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from jaxformer import checkpoint, files
from jaxformer.errors import reason


def check_destination(out: str | os.PathLike, kind: files.Kind, overwrite: bool) -> None:
  """A one-line CheckpointError naming what `out` holds unless it is new, empty, or (with
  `overwrite`) an export of the same `kind`. In a training workdir, every later command would
  load the export instead of the newer checkpoints; over an export of another format, the
  folder would load as neither."""
  found = files.describe(out)
  if found == files.PARTIAL:  # a stopped write of some export: the next one replaces it
    return
  if found == kind and not overwrite:
    raise checkpoint.CheckpointError(f'{out}: is {found} already: pass --overwrite to replace '
                                     'it.')
  if found not in (files.MISSING, files.EMPTY, kind):
    raise checkpoint.CheckpointError(files.misplaced(out, found, 'a new or empty folder for '
                                                     'the export'))


def prepare(out: str | os.PathLike, kind: files.Kind, overwrite: bool) -> pathlib.Path:
  """The export folder (check_destination), created if needed; a one-line error if it cannot
  be."""
  check_destination(out, kind, overwrite)
  out = pathlib.Path(out)
  try:
    out.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise checkpoint.CheckpointError(f'{out}: cannot create the export folder ({reason(e)}).'
                                     ) from None
  return out


@contextlib.contextmanager
def written_whole(out: pathlib.Path, params: Any, spm_model: bytes) -> Iterator[pathlib.Path]:
  """A temporary folder beside `out` to write the export of `params` into, which becomes `out`
  once all is written: by one rename when `out` is empty (prepare made it), else by moving its
  files in while `out` holds files.UNFINISHED, so that a process killed meanwhile leaves an
  export every reader calls unfinished and the next export replaces. One writer at a time (a
  second export into `out` meanwhile is a CheckpointError naming the first). Checks the space
  first. On a full disk, or any failure, the temporary folder goes, `out` keeps what it had,
  and an `out` left empty is removed."""
  size = sum(np.asarray(leaf).nbytes for leaf in jax.tree.leaves(params)) + len(spm_model)
  tmp = out.parent / f'.{out.name}.partial'  # the lock makes it this writer's own
  with files.locked(out.parent, out.name, f'writing {out.name}'):
    try:
      files.check_space(out, size, 'the export')
      shutil.rmtree(tmp, ignore_errors=True)  # (a killed writer's)
      tmp.mkdir()
      yield tmp
      if not any(out.iterdir()):
        out.rmdir()
        os.rename(tmp, out)
        return
      unfinished = out / files.UNFINISHED
      unfinished.touch()
      for written in tmp.iterdir():
        move(written, out / written.name)
      unfinished.unlink()
    except Exception as e:
      shutil.rmtree(tmp, ignore_errors=True)  # before the free space is measured
      if out.is_dir() and not any(out.iterdir()):
        out.rmdir()
      if files.disk_full(e):
        raise files.no_space(out, 'the export', size) from None
      raise
    finally:
      shutil.rmtree(tmp, ignore_errors=True)


def move(written: pathlib.Path, into: pathlib.Path) -> None:
  """One written file of an export into its folder (os.replace: atomic for each file)."""
  os.replace(written, into)
