"""jaxformer.text: the one text reader, and the one writer of translations."""

import gzip
import os
import sys

import pytest

from jaxformer import text
from jaxformer.errors import DataError


def test_files_are_read_as_lines_whatever_their_line_ends_mark_and_packing(tmp_path):
  (tmp_path / 'a.txt').write_bytes(b'\xef\xbb\xbfone\r\ntwo\tthree\n\nfour')
  assert text.read_lines(tmp_path / 'a.txt') == ['one', 'two\tthree', '', 'four']
  with gzip.open(tmp_path / 'b.txt.gz', 'wb') as f:
    f.write('größe\n'.encode())
  assert text.read_lines(tmp_path / 'b.txt.gz') == ['größe']
  (tmp_path / 'bad.txt').write_bytes(b'fine\nbad \xff byte\n')
  with pytest.raises(DataError, match=r'bad\.txt:2: not valid UTF-8 \(byte 4'):
    text.read_lines(tmp_path / 'bad.txt')
  (tmp_path / 'empty.txt').write_bytes(b'')
  with pytest.raises(DataError, match='the file is empty'):
    text.read_lines(tmp_path / 'empty.txt')


def test_a_stream_comes_in_chunks_and_its_bad_line_after_the_lines_before():
  lines = [[b'\xef\xbb\xbfa', b'b\r'], [b'c', b'\xff']]  # (arrived's lists)
  got = []
  with pytest.raises(DataError, match='stdin:4: not valid UTF-8'):
    for chunk in text.decoded(lines, 'stdin'):
      got.append(chunk)
  assert got == [['a', 'b'], ['c']]


def test_translations_are_written_a_line_each_or_as_moses_nbest(tmp_path):
  out = tmp_path / 'out.txt'
  count = text.write_translations(str(out), [['a', 'b'], ['c']],
                                  lambda chunk, first: [s.upper() for s in chunk], None)
  assert count == 3 and out.read_text() == 'A\nB\nC\n'
  text.write_translations(str(out), [['a'], ['b']],
                          lambda chunk, first: [[(f'{s}{first}', -1.0)] for s in chunk], 1)
  assert out.read_text() == '0 ||| a0 ||| -1.0000\n1 ||| b1 ||| -1.0000\n'


def test_lines_come_as_they_arrive_never_waiting_for_more_than_one():
  reader, writer = os.pipe()
  lines = text.arrived(reader, 2)
  os.write(writer, b'a\nb\nc\r\nd\ne\n')
  assert [next(lines), next(lines), next(lines)] == [[b'a', b'b'], [b'c\r', b'd'], [b'e']]
  os.write(writer, b'f\n')  # one line there: a chunk of one, not a wait for a second
  assert next(lines) == [b'f']
  os.write(writer, b'g\nh')  # the last line's end missing
  os.close(writer)
  assert list(lines) == [[b'g', b'h']]
  os.close(reader)


def _stdin(monkeypatch, data: bytes) -> None:
  """stdin a pipe that holds `data`, its writer closed."""
  reader, writer = os.pipe()
  os.write(writer, data)
  os.close(writer)
  monkeypatch.setattr(sys, 'stdin', os.fdopen(reader))


def test_prefixes_go_with_their_lines_and_a_count_that_differs_is_an_error(tmp_path,
                                                                        monkeypatch, capsys):
  (tmp_path / 'in.txt').write_text('a\nb\nc\n')
  (tmp_path / 'p.txt').write_text('x\n\nz\n')
  seen = []

  def translate(lines, first, prefixes):
    seen.append((lines, first, prefixes))
    return lines
  def from_stdin():
    return text.read_input(None, str(tmp_path / 'p.txt'))
  source = text.read_input(str(tmp_path / 'in.txt'), str(tmp_path / 'p.txt'))
  text.translate_lines(source, None, 2, translate, None)
  assert seen == [(['a', 'b', 'c'], 0, ['x', '', 'z'])]
  assert capsys.readouterr().out == 'a\nb\nc\n'  # (no --output: stdout)
  _stdin(monkeypatch, b'a\nb\nc\n')
  seen.clear()
  text.translate_lines(from_stdin(), None, 2, translate, None)
  assert seen == [(['a', 'b'], 0, ['x', '']), (['c'], 2, ['z'])]
  assert capsys.readouterr().out == 'a\nb\nc\n'
  _stdin(monkeypatch, b'a\nb\nc\nd\n')
  with pytest.raises(DataError, match=r'p\.txt has 3 lines, and stdin more'):
    text.translate_lines(from_stdin(), None, 2, translate, None)
  _stdin(monkeypatch, b'a\n')
  with pytest.raises(DataError, match=r'p\.txt has 3 lines and stdin 1'):
    text.translate_lines(from_stdin(), None, 2, translate, None)
  (tmp_path / 'in.txt').write_text('a\n')
  with pytest.raises(DataError, match=r'p\.txt has 3 lines and \S+in\.txt 1: give one prefix'):
    text.read_input(str(tmp_path / 'in.txt'), str(tmp_path / 'p.txt'))
