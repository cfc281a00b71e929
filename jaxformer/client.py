"""The client of `jaxformer serve` (jaxformer.serving): `translate` and `score` from Python,
and `jaxformer translate --server URL` from the command line. It imports the standard library,
tqdm and jaxformer's jax-free modules only: a client of a running server pays neither for
importing jax nor for loading and compiling a model. Requests are jaxformer.protocol's.
"""

import argparse
import http.client
import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from tqdm import tqdm

from jaxformer import arguments, files, protocol, text
from jaxformer.errors import JaxformerError, exit_code, reason
from jaxformer.settings import DecodingConfig

DEFAULT_PORT = 8228
CLIENT_LINES = 1024  # the most lines a request (from stdin: those that have arrived, up to this)


class ServerError(JaxformerError):
  """No server answers at the address, or it refused the request; the message says which."""


CLIENT_TIMEOUT = 600.0  # seconds a request may take, by default, before the client gives up


def ask(url: str, request: protocol.Request, timeout: float = CLIENT_TIMEOUT,
        api_key: str | None = None) -> list[Any]:
  """The server's results for `request` (protocol's): translations, n-best lists, or scores
  (TargetScore.as_dict's fields); ServerError if none answers at `url` within `timeout`
  seconds or it refuses the request."""
  path = '/score' if isinstance(request, protocol.ScoreRequest) else '/translate'
  return request.read(_ask(url, path, request.to_json(), timeout, api_key))


def translate(url: str, sentences: list[str], nbest: int | None = None,
              timeout: float = CLIENT_TIMEOUT, *, prefixes: list[str] | None = None,
              first_index: int = 0, api_key: str | None = None, **settings: Any) -> list[Any]:
  """`ask` for the translations of `sentences` (with nbest: each one's [text, score] lists),
  with `prefixes` and sampling `settings` (DecodingConfig.PER_REQUEST)."""
  return ask(url, protocol.TranslateRequest(sentences, nbest, prefixes, first_index, settings),
             timeout, api_key)


def score(url: str, sources: list[str], targets: list[str], token_log_probs: bool = False,
          timeout: float = CLIENT_TIMEOUT, api_key: str | None = None) -> list[dict[str, Any]]:
  """`ask` for the scores of the pairs (TargetScore.as_dict's fields)."""
  return ask(url, protocol.ScoreRequest(sources, targets, token_log_probs), timeout, api_key)


WARMUP_POLL = 0.5  # seconds between the client's GET /health while a server warms up

# Seconds the client gives a server's GET /health before it sends its first work there: a
# server that accepts connections but answers nothing (stopped, stuck) is found in this time,
# not after the request's own --timeout, which a long translation needs.
PROBE_TIMEOUT = 5.0
_probed: set[str] = set()  # the servers this process found answering


def _probe(url: str, opener: urllib.request.OpenerDirector, timeout: float) -> None:
  """ServerError unless `url` answers GET /health (any status) within PROBE_TIMEOUT; once a
  server per process. While it says it is warming up (compiling its first search, as a script
  that has just started it finds it), it is asked again every WARMUP_POLL seconds, for at most
  `timeout` (then the request is sent, and answered 503)."""
  if url in _probed:
    return
  deadline, said = time.monotonic() + timeout, False
  while True:
    try:
      opener.open(url.rstrip('/') + '/health', timeout=PROBE_TIMEOUT).close()
      break
    except urllib.error.HTTPError as e:  # (503: warming up or stopping; it answers)
      with e:
        warming = e.code == 503 and _json_of(e).get('status') == 'warming up'
      if not warming or time.monotonic() + WARMUP_POLL > deadline:
        break
      if not said:
        print(f'{url} is warming up: waiting for it (at most {timeout:g} s, --timeout)',
              file=sys.stderr)
        said = True
      time.sleep(WARMUP_POLL)
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
      cause = getattr(e, 'reason', e)
      if isinstance(cause, TimeoutError):
        raise ServerError(f'{url} accepts connections but did not answer GET /health within '
                          f'{PROBE_TIMEOUT:g} s: is the server stopped or stuck?') from None
      raise _no_server(url, cause) from None
  _probed.add(url)


def _no_server(url: str, cause: Any) -> ServerError:
  return ServerError(f'no jaxformer server answers at {url} ({reason(cause)}); start one with '
                     '`jaxformer serve --model DIR`.')


def _ask(url: str, path: str, request: dict[str, Any], timeout: float, api_key: str | None
         ) -> dict[str, Any]:
  """The server's JSON answer at url + path to `request`, once the server answered a probe
  (_probe). Proxies are not used: the server is meant to be local."""
  headers = {'Content-Type': 'application/json',
             **({'Authorization': f'Bearer {api_key}'} if api_key else {})}
  http_request = urllib.request.Request(url.rstrip('/') + path, data=json.dumps(request).encode(),
                                        headers=headers)
  opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
  _probe(url, opener, timeout)
  try:
    with opener.open(http_request, timeout=timeout) as response:
      answer = json.load(response)
      if not isinstance(answer, dict) or not answer.keys() & {'nbest', 'translations', 'scores'}:
        raise KeyError(path)
      return answer
  except urllib.error.HTTPError as e:
    with e:
      raise ServerError(f'{url}: {_error_of(e)}') from None
  except TimeoutError:
    raise ServerError(f'{url} did not answer within {timeout:g} s (--timeout).') from None
  except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
    cause = getattr(e, 'reason', e)
    if isinstance(cause, TimeoutError):
      raise ServerError(f'{url} did not answer within {timeout:g} s (--timeout).') from None
    raise _no_server(url, cause) from None
  except (ValueError, KeyError, TypeError):  # (JSONDecodeError is a ValueError)
    raise ServerError(f'{url} answered, but not as `jaxformer serve` does: is it one?') from None


def _json_of(error: urllib.error.HTTPError) -> dict[str, Any]:
  """An error's JSON body ({} if it has none: not a jaxformer server's)."""
  try:
    body = json.load(error)
  except ValueError:
    return {}
  return body if isinstance(body, dict) else {}


def _error_of(error: urllib.error.HTTPError) -> str:
  return str(_json_of(error).get('error') or f'HTTP {error.code} {error.reason}')


def is_client(argv: list[str]) -> bool:
  """Whether a `jaxformer` command line is `translate --server ...` (client_main's)."""
  return argv[:1] == ['translate'] and any(
      arg == '--server' or arg.startswith('--server=') for arg in argv)


def client_main(argv: list[str]) -> int:
  """`jaxformer translate --server URL ...` (argv after 'translate'): the local command's
  flags, input and output, translated by the server; the flags that set the server's model
  or search are refused."""
  parser = argparse.ArgumentParser(
      prog='jaxformer translate', description='Translate with a running `jaxformer serve`.',
      formatter_class=arguments.Formatter)
  arguments.add_translate_flags(parser)
  args = parser.parse_args(argv)
  if refused := arguments.server_side_flags(parser, argv):
    parser.error(f"with --server, the model and its search are the server's (set them on "
                 f'`jaxformer serve`): drop {" ".join(refused)}.')
  return exit_code(lambda: _translate_with(args))


def _translate_with(args: argparse.Namespace) -> int:
  """As the local command: a file read whole, with a progress bar; stdin's lines as they
  arrive. The server gets CLIENT_LINES lines a request, and judges sampling's settings against
  its own search (a server that samples takes --temperature alone)."""
  settings = arguments.decoding_settings(args, DecodingConfig.PER_REQUEST)
  protocol.TranslateRequest([], settings=settings)  # refused here, before any request
  api_key = arguments.api_key(args.api_key_file, os.environ)
  if args.output:  # found out before any request, as the local command does
    files.check_output(args.output, 'the translations')
  source = text.read_input(args.input, args.prefix)
  with tqdm(total=None if source.lines is None else len(source.lines), desc='translating',
            unit='sent', disable=source.lines is None) as bar:
    def ask(lines: list[str], first: int, prefixes: list[str] | None) -> list[Any]:
      answers = []
      for start in range(0, len(lines), CLIENT_LINES):
        part = slice(start, start + CLIENT_LINES)
        answers += translate(args.server, lines[part], args.nbest,
                             prefixes=None if prefixes is None else prefixes[part],
                             first_index=first + start, timeout=args.timeout or CLIENT_TIMEOUT,
                             api_key=api_key, **settings)
        bar.update(len(lines[part]))
      return answers
    text.translate_lines(source, args.output, CLIENT_LINES, ask, args.nbest)
  return 0
