"""Arguments declared once, for the command line (jaxformer.cli) and for the client of
`jaxformer serve` (jaxformer.serving), which parses `translate`'s with the same declarations.

Standard library only, so that `jaxformer translate --server` answers without importing jax:
the argparse types, the flags made from DecodingConfig's fields, the model's path, and
`translate`'s whole set of flags, which say which of them belong to the server when it has the
model (SERVER_SIDE).
"""

import argparse
import dataclasses
import math
import types
import typing
import urllib.parse
from collections.abc import Callable
from typing import Any

from jaxformer.errors import reason
from jaxformer.settings import MAX_NBEST, DecodingConfig, Range, ServerLimits, SettingError


class Formatter(argparse.RawDescriptionHelpFormatter):
  """Help with each flag's default (where it has one) and the description's own line breaks."""

  def _get_help_string(self, action: argparse.Action) -> str:
    help_text = action.help or ''
    if action.default not in (None, False, [], argparse.SUPPRESS) and action.option_strings:
      help_text += ' (default: %(default)s)'
    return help_text


def in_range(kind: type, valid: Range) -> Callable[[str], Any]:
  """An argparse type: a finite number of `kind` (int or float) in `valid`."""
  what = 'an integer' if kind is int else 'a finite number'

  def parse(text: str) -> Any:
    try:
      value = kind(text)
    except ValueError:
      value = math.nan
    if not math.isfinite(value) or value not in valid:
      raise argparse.ArgumentTypeError(f'must be {what} {valid}, got {text!r}')
    return value
  parse.__name__ = kind.__name__  # (argparse names the type in its own messages)
  parse.__doc__ = f'An argparse type: {what} {valid} (anything else is one line).'
  return parse


positive_int = in_range(int, Range(1))


def port_number(text: str) -> int:
  """An argparse type: a TCP port, 0 to 65535 (0: the system picks a free one)."""
  value = int(text) if text.isdigit() else -1
  if not 0 <= value <= 65535:
    raise argparse.ArgumentTypeError(f'must be a port number from 0 to 65535, got {text!r}')
  return value


def path_arg(text: str) -> str:
  """An argparse type: a path, not an empty string (which would name the current folder), nor
  - (the standard stream of stream_arg's flags: here it would name a file called -)."""
  if not text.strip():
    raise argparse.ArgumentTypeError(f'must be a path, got {text!r}')
  if text == '-':
    raise argparse.ArgumentTypeError('must be a path: - (stdin or stdout) is not taken here; '
                                     'a file called - is ./-')
  return text


def stream_arg(text: str) -> str | None:
  """An argparse type: a path, or - for the standard stream (stdin, stdout), as the flag's
  default is and as other command-line tools take it."""
  return None if text == '-' else path_arg(text)


def server_url(text: str) -> str:
  """An argparse type: a server's HTTP(S) address; HOST:PORT alone is http://HOST:PORT (urllib
  took `localhost:8228` for a URL of the scheme `localhost`)."""
  url = text.strip() if '://' in text else f'http://{text.strip()}'
  try:
    parts = urllib.parse.urlsplit(url)
    parts.port  # noqa: B018  (a port that is no number raises here)
  except ValueError:
    parts = None
  if parts is None or parts.scheme not in ('http', 'https') or not parts.hostname:
    raise argparse.ArgumentTypeError(f"must be the server's address, http://HOST:PORT, got "
                                     f'{text!r}')
  return url


def flag(parser: argparse._ActionsContainer, name: str, **kwargs: Any) -> None:
  """--name-with-dashes (its value in args.name, or in `dest`), and --name_with_underscores as
  a hidden older spelling."""
  dest = kwargs.pop('dest', name)
  parser.add_argument('--' + name.replace('_', '-'), dest=dest, **kwargs)
  if '_' in name:
    alias = {k: v for k, v in kwargs.items() if k in ('action', 'type', 'choices', 'nargs')}
    parser.add_argument('--' + name, dest=dest, help=argparse.SUPPRESS,
                        default=kwargs.get('default'), **alias)


# --- decoding ------------------------------------------------------------------------------------


def add_setting_flags(parser: argparse._ActionsContainer, cls: type,
                      names: tuple[str, ...] | None = None) -> None:
  """A flag for each field of the settings dataclass `cls` (of `names`, default all; its help
  and default from the field, its range from cls.RANGES), None unless given: settings_of and
  decoding_of read them."""
  hints = typing.get_type_hints(cls)
  for field in dataclasses.fields(cls):
    if names is not None and field.name not in names:
      continue
    meta = field.metadata
    default = '' if field.default is None else f' (default: {field.default})'
    if hints[field.name] is bool:
      flag(parser, meta['flag'] or field.name, dest=field.name, action='store_true',
           default=None, help=meta['help'])
      continue
    kind = next(k for k in typing.get_args(hints[field.name]) or (hints[field.name],)
                if k is not types.NoneType)
    flag(parser, meta['flag'] or field.name, dest=field.name, default=None,
         metavar=meta['metavar'] or 'N', help=meta['help'] + default,
         type=in_range(kind, cls.RANGES.get(field.name, Range(-math.inf))))


def add_decoding_flags(parser: argparse._ActionsContainer, names: tuple[str, ...] | None = None
                       ) -> None:
  """The flags of DecodingConfig's fields (add_setting_flags)."""
  add_setting_flags(parser, DecodingConfig, names)


def server_limits_of(args: argparse.Namespace) -> ServerLimits:
  """The ServerLimits of the flags given (the others: its defaults)."""
  return ServerLimits(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ServerLimits)
                         if getattr(args, f.name, None) is not None})


def decoding_settings(args: argparse.Namespace, names: tuple[str, ...] | None = None
                      ) -> dict[str, Any]:
  """The DecodingConfig fields (of `names`, default all) given on the command line."""
  names = names or tuple(f.name for f in dataclasses.fields(DecodingConfig))
  return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def decoding_of(args: argparse.Namespace) -> DecodingConfig:
  """The DecodingConfig of the flags given (the others: its defaults); SettingError for values
  refused together (a temperature without --sampling, ...)."""
  return DecodingConfig(**decoding_settings(args))


# --- the model, and translate ------------------------------------------------------------------


def add_model_path(parser: argparse.ArgumentParser, *aliases: str) -> None:
  """--model PATH, the one name of "the model to load" in eval, translate, serve, score and
  export; --workdir (and eval's --checkpoint) are older spellings of it, kept out of the help
  (cli.older_spellings)."""
  parser.add_argument('--model', dest='model', type=path_arg, metavar='PATH',
                      help='the model: a training workdir (its newest checkpoint), a checkpoint '
                      'folder (e.g. WORKDIR/average-last5), an exported folder or a MarianMT '
                      'folder (an OPUS-MT model)')
  for alias in ('--workdir', *aliases):
    parser.add_argument(alias, dest='model', type=path_arg, help=argparse.SUPPRESS)


def add_model_flags(parser: argparse.ArgumentParser, *, decoding: bool = True) -> None:
  """--average-last, and the decoding flags where the command decodes."""
  flag(parser, 'average_last', type=positive_int, metavar='N',
       help="average a workdir's last N checkpoints first")
  if decoding:
    add_decoding_flags(parser.add_argument_group(
        'decoding (by default the paper\'s: beam 4, alpha 0.6, at most input + 50 tokens)'))


# What a client of `jaxformer serve` leaves to the server: the model and how it searches.
SERVER_SIDE = ('model', 'average_last', 'beam_size', 'alpha', 'extra_length', 'batch_size')


def add_translate_flags(parser: argparse.ArgumentParser) -> None:
  """Every flag of `jaxformer translate`, with a model here or (--server) a server's."""
  add_model_path(parser)
  add_model_flags(parser)
  parser.add_argument('--input', type=stream_arg, metavar='FILE',
                      help='a UTF-8 text file (default, or -: stdin)')
  parser.add_argument('--output', type=stream_arg, metavar='FILE',
                      help='where to write (default, or -: stdout)')
  parser.add_argument('--nbest', type=in_range(int, Range(1, MAX_NBEST, high_open=False)),
                      metavar='N', help='the N best translations with scores (with --sampling: '
                      f'N samples; at most {MAX_NBEST})')
  parser.add_argument('--prefix', type=path_arg, metavar='FILE',
                      help='target prefixes, a line for each input line (an empty line: none): '
                      'each output starts with its prefix, searched from there')
  group = parser.add_argument_group('with a server (jaxformer serve)')
  group.add_argument('--server', type=server_url, metavar='URL',
                     help='translate with a running `jaxformer serve` at this address (e.g. '
                     'http://127.0.0.1:8228; HOST:PORT alone is taken as http://HOST:PORT) '
                     'instead of --model: the model and its search (beam, alpha, extra length, '
                     "batch size) are the server's; sampling, prefixes and --nbest are sent with "
                     'each request')
  group.add_argument('--timeout', type=in_range(float, Range(0, low_open=True)),
                     metavar='SECONDS', help='--server: seconds a request may take before the '
                     'client gives up (default: 600)')
  flag(group, 'api_key_file', type=path_arg, metavar='FILE',
       help="--server: a file holding the server's API key (default: $JAXFORMER_API_KEY, if "
       'set)')


# Flags only the client of a server reads.
CLIENT_SIDE = ('timeout', 'api_key_file')


def api_key(path: str | None, environ: typing.Mapping[str, str]) -> str | None:
  """An API key from a file (its first line) or else $JAXFORMER_API_KEY: never from the
  command line, where other users of the machine can read it. None if neither is given."""
  if path is None:
    key, where = environ.get('JAXFORMER_API_KEY') or None, 'JAXFORMER_API_KEY'
  else:
    try:
      with open(path, encoding='utf-8') as f:
        key, where = f.readline().strip(), f'--api-key-file {path}'
    except (OSError, UnicodeDecodeError) as e:
      raise SettingError(f'--api-key-file {path}: cannot read it ({reason(e)}).') from None
    if not key:
      raise SettingError(f'--api-key-file {path}: the file holds no key on its first line.')
  # The key travels in an HTTP header, which carries printable ASCII only: another character
  # would be accepted here and then refuse every request (401) in the server and its client.
  if key is not None and not (key.isascii() and key.isprintable()):
    raise SettingError(f'{where}: the API key holds a character an HTTP header cannot carry '
                       '(only printable ASCII: letters, digits, punctuation).')
  return key


def server_side_flags(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
  """The words of `argv` that set what SERVER_SIDE leaves to the server (each flag and its
  value), in their order: what a client refuses."""
  options = {option: action.nargs != 0 for action in parser._actions  # pylint: disable=protected-access
             if action.dest in SERVER_SIDE for option in action.option_strings}
  words, rest = [], iter(argv)
  for word in rest:
    name = word.split('=')[0]
    if name in options:
      words.append(word)
      if options[name] and '=' not in word:
        words.append(next(rest, ''))
  return [w for w in words if w]
