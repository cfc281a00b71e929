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

import concurrent.futures
import contextlib
import logging
import os
import pathlib
import re
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import jax
from jax.experimental.compilation_cache import compilation_cache

from jaxformer.errors import reason

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
                'itself', path, reason(e))
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


# --- compiled programs, ahead of their first call ---------------------------------------------


FIRSTS = 4  # first arguments (weights) whose keys a Programs remembers


def _key(args: Any) -> Any:
  """What a program takes of `args`: their tree, each array's shape, dtype and sharding, any
  other leaf itself."""
  leaves, tree = jax.tree.flatten(args)
  return tree, tuple((x.shape, x.dtype, getattr(x, 'sharding', None))
                     if hasattr(x, 'shape') else x for x in leaves)


class Programs:
  """A jitted (or pmapped) function's compiled programs, one per argument shapes and static
  arguments, each compiled once, counted and timed in the log. The first argument is the
  params (or the train state), which the log line leaves out.

  `compile(*args, **static)` compiles the program for these arguments (arrays, or
  jax.ShapeDtypeStruct's of the same shardings) without running it: called in a background
  thread, it takes a program's compile off the path of its first call (a run's first
  validation compiles while the train step does). A call, from any thread, waits for a
  compile of its program already under way rather than compiling it twice. `compiled` holds
  (description, seconds) per program, in the order they were compiled."""

  def __init__(self, name: str, transformed: Any):
    self.name, self.transformed = name, transformed  # jax.jit(...) or jax.pmap(...)
    self.compiled: list[tuple[str, float]] = []
    self._programs: dict[Any, concurrent.futures.Future] = {}
    self._firsts: list[tuple[Any, int]] = []  # (first argument, its key's number), latest first
    self._first_keys: dict[Any, int] = {}  # a first argument's key -> its number
    self._lock = threading.Lock()

  def __call__(self, *args: Any, **static: Any) -> Any:
    return self.compile(*args, **static)(*args)

  def __len__(self) -> int:
    """How many programs it has compiled."""
    return len(self.compiled)

  def _first_key(self, first: Any) -> int:
    """The first argument's part of a program's key (a number for each of its keys),
    remembered for the last few objects given: the same weights come with every call of a
    Translator's search, and reading and hashing their hundreds of leaves at each call cost
    more than a lookup should beside a one-sentence search (docs/benchmarks-log.md)."""
    with self._lock:
      number = next((n for seen, n in self._firsts if seen is first), None)
    if number is None:
      key = _key(first)
      with self._lock:
        number = self._first_keys.setdefault(key, len(self._first_keys))
        self._firsts = [(first, number), *self._firsts[:FIRSTS - 1]]
    return number

  def compile(self, *args: Any, **static: Any) -> Callable[..., Any]:
    """The compiled program for `args` (shapes and dtypes) and `static`, compiled now if no
    call or compile has done it yet."""
    key = (self._first_key(args[0]), _key(args[1:]), tuple(sorted(static.items())))
    with self._lock:
      future, owner = self._programs.get(key), False
      if future is None:
        future = self._programs[key] = concurrent.futures.Future()
        owner = True
    if owner:
      try:
        start = time.perf_counter()
        future.set_result(self.transformed.lower(*args, **static).compile())
      except BaseException as e:  # the waiting callers get it too
        future.set_exception(e)
        with self._lock:
          del self._programs[key]  # a later call tries again
        raise
      seconds = time.perf_counter() - start
      arrays = [x for x in jax.tree.leaves(args[1:]) if getattr(x, 'shape', ())]  # (not params)
      shapes = ', '.join(dict.fromkeys('x'.join(map(str, x.shape)) for x in arrays))
      what = f'{self.name} [{shapes}]' + ''.join(f' {k}={v}' for k, v in sorted(static.items())
                                                 if v is not None)
      self.compiled.append((what, seconds))
      log.info('compiled %s in %.1f s', what, seconds)
    return future.result()
