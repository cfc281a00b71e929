"""The tests' one fault-injection mechanism: a fault at a named point of jaxformer, injected
deterministically into a whole command, with nothing of it in the package.

  python tests/faults.py POINT jaxformer-arguments...

runs `jaxformer jaxformer-arguments...` in this process with the fault at POINT (patched in
before the command starts; 'none' for none), exits with the command's status, and ends stderr
with one line 'compiled N': the programs XLA compiled (jax records an event for each program
it compiles or loads from the compilation cache, and another for each it loaded).

POINTS: where the fault is, what it stands for.
"""

import errno
import os
import signal
import sys
import tempfile


def _refuse(*args, **kwargs):
  raise OSError(errno.EROFS, os.strerror(errno.EROFS))


def _cache_read_only() -> None:
  """compilation.enable_cache's first write fails: a read-only cache folder."""
  tempfile.TemporaryFile = _refuse


def _cache_full() -> None:
  """jax's cache fails to store every program: a disk that filled after the cache was opened."""
  from jax._src import lru_cache  # pylint: disable=g-import-not-at-top

  def full(self, key, value):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
  lru_cache.LRUCache.put = full


def _ctrl_c_in_vocabulary_sample() -> None:
  """Ctrl-C (SIGINT, in the main thread) after the 100th sentence sentencepiece reads of the
  vocabulary's sample, inside sentencepiece's trainer."""
  from jaxformer.data import tokenizer  # pylint: disable=g-import-not-at-top
  read = tokenizer.sample

  def interrupted(*args):
    for count, sentence in enumerate(read(*args)):
      if count == 100:
        signal.raise_signal(signal.SIGINT)
      yield sentence
  tokenizer.sample = interrupted


def _killed_mid_export_move() -> None:
  """The process killed (as by kill -9: no cleanup) after an export moved its first file into
  a folder that held an export already."""
  from jaxformer.formats import folders  # pylint: disable=g-import-not-at-top
  move, moved = folders.move, []

  def killed(*args):
    if moved:
      os._exit(137)  # pylint: disable=protected-access
    moved.append(move(*args))
  folders.move = killed


POINTS = {'none': lambda: None, 'cache-read-only': _cache_read_only, 'cache-full': _cache_full,
          'ctrl-c-in-vocabulary-sample': _ctrl_c_in_vocabulary_sample,
          'killed-mid-export-move': _killed_mid_export_move}


def main() -> int:
  import jax  # pylint: disable=g-import-not-at-top
  from jax._src import dispatch  # pylint: disable=g-import-not-at-top
  events = []
  jax.monitoring.register_event_duration_secs_listener(lambda event, _, **kw: events.append(event))
  jax.monitoring.register_event_listener(lambda event, **kw: events.append(event))
  POINTS[sys.argv[1]]()
  from jaxformer import cli  # pylint: disable=g-import-not-at-top
  status = cli.main(sys.argv[2:])
  compiled = (events.count(dispatch.BACKEND_COMPILE_EVENT)
              - events.count('/jax/compilation_cache/cache_hits'))
  print(f'compiled {compiled}', file=sys.stderr)
  return status


if __name__ == '__main__':
  sys.exit(main())
