"""UTF-8 text a line at a time: files (plain or .gz) and streams read with file:line errors, and
translations written a line each or in Moses n-best form.

The one text reader of every command and corpus (jaxformer.data.sources reads its files here).
It imports nothing beyond the standard library, so that `jaxformer translate --server` (a client
of `jaxformer serve`) reads its input as every other command does without importing jax.
"""

import codecs
import collections
import contextlib
import gzip
import itertools
import os
import pathlib
import select
import sys
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from jaxformer.errors import DataError, JaxformerError, reason


def decode_line(raw: bytes, where: str) -> str:
  """A line's UTF-8 text without its line end (LF or CR LF); DataError naming `where`
  (e.g. file:line) for bytes that are not UTF-8."""
  try:
    return raw.removesuffix(b'\n').removesuffix(b'\r').decode('utf-8')
  except UnicodeDecodeError as e:
    raise DataError(f'{where}: not valid UTF-8 (byte {e.start}: {e.reason}); re-encode it as '
                    'UTF-8.') from None


_BLOCK = 1 << 22  # bytes read at a time


def _open(path: pathlib.Path):
  return gzip.open(path, 'rb') if path.suffix == '.gz' else open(path, 'rb')  # noqa: SIM115


def check_readable(path: pathlib.Path, *, passes: int = 1) -> None:
  """DataError saying what `path` is when it is not a file this reader can read `passes` times:
  a missing path, an empty name, a folder, a device or socket, or (for more than one pass) a
  FIFO, whose lines can be read only once."""
  if str(path) == '.':  # pathlib's name for '' too
    raise DataError("an empty path (or '.', the current folder) was given where a file belongs.")
  if not path.exists():
    raise DataError(f'{path}: no such file.')
  if path.is_dir():
    raise DataError(f'{path}: is a folder, not a file.')
  if path.is_fifo() and passes > 1:
    raise DataError(f'{path}: is a FIFO (a pipe), which can be read only once, and this file is '
                    f'read {passes} times: write it to a regular file first.')
  if not (path.is_file() or path.is_fifo()):
    raise DataError(f'{path}: is not a regular file (a device or a socket).')
  if not os.access(path, os.R_OK):
    raise DataError(f'{path}: permission denied.')


def raw_blocks(path: pathlib.Path) -> Iterator[bytes]:
  """The file's bytes in blocks that end at a line end (the last block: at the file's end)."""
  check_readable(path)
  rest = b''
  try:
    with _open(path) as f:
      while block := f.read(_BLOCK):
        block = rest + block
        cut = block.rfind(b'\n') + 1
        rest = block[cut:]
        if cut:
          yield block[:cut]
  except (OSError, EOFError, zlib.error) as e:  # zlib's: a damaged .gz
    raise DataError(f'{path}: cannot read ({reason(e)}).') from None
  if rest:
    yield rest


def line_blocks(path: pathlib.Path) -> Iterator[list[str]]:
  """The file's lines, a block at a time, without line ends. Only '\\n' ends a line ('\\r\\n' is
  normalised); a UTF-8 byte-order mark at the start of the file is dropped (an editor's mark,
  not text: kept, it would be part of the first word of a source, or of a reference that BLEU
  then fails to match); tabs and other characters are text. DataError (with file:line) for an
  empty file and for bytes that are not UTF-8."""
  lines_before = 0
  for block in raw_blocks(path):
    if not lines_before:
      block = block.removeprefix(codecs.BOM_UTF8)
    try:
      text = block.decode('utf-8')
    except UnicodeDecodeError as e:  # find the line, and say where
      line = lines_before + block.count(b'\n', 0, e.start)
      decode_line(block.split(b'\n')[line - lines_before], f'{path}:{line + 1}')
      raise  # not reached: decode_line raised
    lines = text.replace('\r\n', '\n').split('\n')
    if lines[-1] == '':  # the final newline ends the last line; it does not start a new one
      lines.pop()
    lines_before += len(lines)
    yield lines
  if not lines_before:
    raise DataError(f'{path}: the file is empty.')


def read_lines(path: str | os.PathLike) -> list[str]:
  """The lines of a UTF-8 text file (plain or .gz), without line ends (see line_blocks)."""
  return list(itertools.chain.from_iterable(line_blocks(pathlib.Path(path))))


def arrived(fd: int, size: int) -> Iterator[list[bytes]]:
  """The lines read from file descriptor `fd`, in lists of those that have arrived (at most
  `size`; the last line's end may be missing). A list waits for its first line only: a program
  that writes a line and waits for its translation gets it (a terminal, a co-process through
  pipes), and the lines of a file or of a fast writer still come `size` at a time."""
  ready: collections.deque[bytes] = collections.deque()
  pending, ended = b'', False
  while ready or not ended:
    if ready and (ended or len(ready) >= size or not select.select([fd], [], [], 0)[0]):
      yield [ready.popleft() for _ in range(min(size, len(ready)))]
      continue
    data = os.read(fd, _BLOCK)  # waits only when no line is ready (or for the rest of one)
    *lines, pending = (pending + data).split(b'\n')
    ready.extend(lines)
    if not data:
      ended = True
      ready.extend([pending] if pending else [])


def decoded(raw_chunks: Iterable[list[bytes]], name: str) -> Iterator[list[str]]:
  """Each list of raw lines as text (a UTF-8 byte-order mark before the first line dropped, as
  read_lines does); the lines before one that is not UTF-8 come out before its error."""
  number = 0
  for raw in raw_chunks:
    chunk = []
    try:
      for line in raw:
        number += 1
        line = line.removeprefix(codecs.BOM_UTF8) if number == 1 else line
        chunk.append(decode_line(line, f'{name}:{number}'))
    except DataError:
      if chunk:
        yield chunk
      raise
    yield chunk


Translate = Callable[[list[str], int, list[str] | None], Sequence[Any]]


def check_pairs(sources: Sequence[str], targets: Sequence[str]) -> None:
  """DataError unless there is one target a source: what scoring pairs, and what a server
  checks of each request before it merges requests (merged, two wrong counts could pair one
  request's sources with another's targets)."""
  if len(sources) != len(targets):
    raise DataError(f'{len(sources)} sources and {len(targets)} targets: scoring needs one '
                    'target a source.')


class Input(NamedTuple):
  """What `jaxformer translate` translates (read_input)."""
  lines: list[str] | None       # the --input file's lines; None: stdin's, read as they arrive
  prefix_path: str | None       # the --prefix file
  prefixes: list[str] | None    # its lines, one an input line


def read_input(input_path: str | None, prefix_path: str | None) -> Input:
  """The input file's and the prefix file's lines, read before a model loads, so that a file
  that is missing, not UTF-8 or of another count of lines is said at once; DataError for each
  (stdin's count is found when one runs out: translate_lines)."""
  prefixes = read_lines(prefix_path) if prefix_path else None
  if input_path is None:
    if sys.stdin is None:  # (started with stdin closed)
      raise DataError('no input: stdin is closed; give --input FILE, or send the text to stdin.')
    return Input(None, prefix_path, prefixes)
  lines = read_lines(input_path)
  if prefixes is not None and len(prefixes) != len(lines):
    raise DataError(f'{prefix_path} has {len(prefixes)} lines and {input_path} '
                    f'{len(lines)}: give one prefix a line (an empty line for none).')
  return Input(lines, prefix_path, prefixes)


def translate_lines(source: Input, output: str | None, chunk: int, translate: Translate,
                    nbest: int | None) -> None:
  """`jaxformer translate`'s input (read_input's) and output, with a model here or a server's:
  the input file's lines at once, or stdin's as they arrive, at most `chunk` at a time (see
  arrived: a line typed, or written by a program that waits for its answer, is answered at
  once); each part's translations, `translate(lines, index of lines[0] in the input, their
  prefixes or None)`, written as it is done (see write_translations)."""
  prefix_path, prefixes = source.prefix_path, source.prefixes
  parts: Iterable[list[str]] = (
      [source.lines] if source.lines is not None
      else decoded(arrived(sys.stdin.fileno(), chunk), 'stdin'))

  def aligned(lines: list[str], first: int) -> Sequence[Any]:
    part = None if prefixes is None else prefixes[first:first + len(lines)]
    if part is not None and len(part) < len(lines):
      raise DataError(f'{prefix_path} has {len(prefixes)} lines, and stdin more: give one '
                      'prefix a line (an empty line for none).')
    return translate(lines, first, part)
  count = write_translations(output, parts, aligned, nbest)
  if prefixes is not None and len(prefixes) > count:
    raise DataError(f'{prefix_path} has {len(prefixes)} lines and stdin {count}: give one '
                    'prefix a line (an empty line for none).')


def write_translations(output: str | None, chunks: Iterable[list[str]],
                       translate: Callable[[list[str], int], Sequence[Any]],
                       nbest: int | None) -> int:
  """Each chunk's translations (`translate(chunk, index of its first line)`) written to the
  file `output`, or stdout, as each chunk is done: a line each; with nbest, each input's
  (text, score) options as "INDEX ||| TEXT ||| SCORE" lines (Moses n-best form; INDEX counts
  input lines from 0). Returns the number of input lines. JaxformerError for a file that
  cannot be written; stdout's errors (a reader gone) go on to errors.exit_code."""
  try:
    with open(output, 'w', encoding='utf-8') if output else \
        contextlib.nullcontext(sys.stdout) as out:
      first = 0
      for chunk in chunks:
        results = translate(chunk, first)
        if nbest is None:
          out.write(''.join(t + '\n' for t in results))
        else:
          for index, options in enumerate(results, start=first):
            out.write(''.join(f'{index} ||| {text} ||| {score:.4f}\n' for text, score in options))
        out.flush()
        first += len(chunk)
      return first
  except OSError as e:
    if not output:
      raise
    raise JaxformerError(f'cannot write to {output} ({reason(e)}).') from None
