"""jax's persistent compilation cache, switched on for the programs jaxformer compiles.

Each process compiles its searches (one per length bucket) and its train and eval steps afresh,
which on a small model costs far more than running them. jax can keep compiled programs on disk
and load them in the next process; `enable_cache` turns that on with the settings jaxformer's
programs need:

- every program is kept, however quickly it compiled (jax's default keeps only those that took
  a second, which leaves out every search of a small model);
- the folder is bounded in size, least recently used programs going first. The bound also makes
  jax take a file lock around each read and write, which is what lets processes running at once
  share one folder (without it, a reader may see a half-written entry);
- a folder that cannot be written is one warning line, and the process compiles as it would
  without the cache. So is a disk that fills later, within `one_line_cache_errors` (jax's own
  warning, one per program, is replaced by one line), which the commands run in.

The `jaxformer` command and the experiments scripts call it with a per-user folder
(`cli.compilation_cache_dir`); the library itself reads no environment and changes nothing
of the process's beyond jax's cache settings.
"""

import contextlib
import logging
import os
import pathlib
import re
import tempfile
import warnings
from collections.abc import Iterator

import jax
from jax.experimental.compilation_cache import compilation_cache

log = logging.getLogger(__name__)

MAX_BYTES = 2**30  # room for many models' programs; the least recently used go first
_JAX_CACHE_ERROR = re.compile(r'Error (reading|writing) persistent compilation cache entry')


def enable_cache(path: str | os.PathLike, *, max_bytes: int = MAX_BYTES) -> bool:
  """Keeps this process's compiled programs in `path` and loads them from there, as described
  above. True when the cache is on; False (after one warning line) when `path` cannot be
  written, and the process then compiles everything itself."""
  path = pathlib.Path(path).expanduser()
  try:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)  # a cache is code: the user's alone
    with tempfile.TemporaryFile(dir=path) as probe:  # read-only, full, or not a folder
      probe.write(b'\0' * 4096)
      probe.flush()
      os.fsync(probe.fileno())
  except OSError as e:
    log.warning('compilation cache off: cannot write %s (%s); this run compiles everything '
                'itself', path, e.strerror or e)
    return False
  if jax.config.jax_compilation_cache_dir not in (None, str(path)):
    compilation_cache.reset_cache()  # jax opened another folder already: open this one next
  jax.config.update('jax_compilation_cache_dir', str(path))
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  jax.config.update('jax_persistent_cache_min_entry_size_bytes', -1)
  jax.config.update('jax_compilation_cache_max_size', max_bytes)
  return True


@contextlib.contextmanager
def one_line_cache_errors() -> Iterator[None]:
  """Within: jax's warning for a cache entry it cannot read or write is said once, in one line
  (the process's warnings.showwarning wraps the previous one, which comes back on exit)."""
  previous = warnings.showwarning
  warnings.showwarning = _OneLineCacheErrors(previous)
  try:
    yield
  finally:
    warnings.showwarning = previous


class _OneLineCacheErrors:
  """A warnings.showwarning: jax turns an entry it cannot read or write (a disk filled since, a
  lock timeout) into a Python warning, one per program and several lines each; this says it
  once, in one line, and hands every other warning on."""

  def __init__(self, show):
    self.show, self.said = show, False

  def __call__(self, message, category, filename, lineno, file=None, line=None):
    if not _JAX_CACHE_ERROR.match(str(message)):
      return self.show(message, category, filename, lineno, file, line)
    if not self.said:
      self.said = True
      reason = re.sub(r'^\[Errno \d+\] ', '', str(message).rsplit(': ', 1)[-1])
      log.warning('compilation cache: %s; this run compiles what it cannot load or store',
                  reason)
    return None
