"""jaxformer.arguments: flags declared once, from DecodingConfig, for the command and the client."""

import argparse
import dataclasses
import subprocess
import sys

import pytest

from jaxformer import arguments
from jaxformer.settings import DecodingConfig, SettingError


def _translate_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog='t', formatter_class=arguments.Formatter)
  arguments.add_translate_flags(parser)
  return parser


def test_every_decoding_field_is_a_flag_with_its_default_in_the_help():
  parser = _translate_parser()
  help_text = ' '.join(parser.format_help().split())
  for field in dataclasses.fields(DecodingConfig):
    spelled = '--' + (field.metadata['flag'] or field.name).replace('_', '-')
    assert spelled in help_text, spelled
  assert 'beam size (1: greedy search; at most 256) (default: 4)' in help_text
  args = parser.parse_args(['--beam', '2', '--extra_length', '7'])  # (an older spelling too)
  assert arguments.decoding_of(args) == DecodingConfig(beam_size=2, extra_length=7)
  assert arguments.decoding_of(parser.parse_args([])) == DecodingConfig()


def test_values_out_of_range_are_argparse_errors(capsys):
  with pytest.raises(SystemExit):
    _translate_parser().parse_args(['--top-k', '-2'])
  assert "argument --top-k: must be an integer >= 0, got '-2'" in capsys.readouterr().err
  with pytest.raises(SettingError, match='for sampling only'):  # refused together: one place
    arguments.decoding_of(_translate_parser().parse_args(['--top-p', '0.5']))


def test_the_servers_flags_are_found_in_their_order():
  parser = _translate_parser()
  argv = ['--input', 'f', '--batch-size=8', '--sampling', '--model', 'm', '--seed', '1',
          '--alpha', '0.3']
  assert arguments.server_side_flags(parser, argv) == ['--batch-size=8', '--model', 'm',
                                                       '--alpha', '0.3']
  assert arguments.server_side_flags(parser, ['--prefix', 'p', '--nbest', '2']) == []


def test_arguments_import_no_jax():
  code = 'import sys, jaxformer.arguments; print("jax" in sys.modules, "numpy" in sys.modules)'
  result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          timeout=60, check=True)
  assert result.stdout.strip() == 'False False'


def test_an_api_key_file_that_cannot_be_read_is_said_in_words(tmp_path):
  """Not Python's "[Errno 21] Is a directory: '...'"."""
  with pytest.raises(SettingError) as raised:
    arguments.api_key(str(tmp_path), {})
  assert str(raised.value) == f'--api-key-file {tmp_path}: cannot read it (Is a directory).'
  (tmp_path / 'key').write_bytes(b'\xff\n')
  with pytest.raises(SettingError, match=r"cannot read it \('utf-8' codec can't decode"):
    arguments.api_key(str(tmp_path / 'key'), {})


@pytest.mark.parametrize('text, url', [
    ('http://127.0.0.1:8228', 'http://127.0.0.1:8228'), ('localhost:8228', 'http://localhost:8228'),
    ('https://mt.example.org/', 'https://mt.example.org/'), ('ftp://x', None), ('http://', None),
    ('localhost:port', None), (' ', None)])
def test_a_server_is_an_http_address_and_host_port_alone_is_one(text, url):
  """`localhost:8228` was taken as a URL of the scheme `localhost` ("unknown url type")."""
  if url:
    assert arguments.server_url(text) == url
  else:
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be the server's address, "
                       r'http://HOST:PORT, got '):
      arguments.server_url(text)
