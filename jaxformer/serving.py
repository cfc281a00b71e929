"""A model kept loaded and compiled: `jaxformer serve` answers translations over HTTP, and
`jaxformer translate --server URL` is its client.

A `jaxformer translate` process pays for importing jax, loading the model and tracing the search
before its first sentence, even with every program in the compilation cache; a client of a
running server pays for none of them: it imports only this module and the standard library.
The server is for the local machine (127.0.0.1 unless told otherwise) and has no
authentication; it answers one request at a time, each with its Translator's batches.

The protocol, for any HTTP client (every field but "src" and "tgt" optional)::

  POST /translate  {"src": ["a sentence", ...], "nbest": N, "prefix": ["a prefix", ...],
                    "sampling": true, "temperature": T, "top_k": K, "top_p": P, "seed": S,
                    "first_index": I}
    -> {"translations": ["...", ...]}, or with nbest {"nbest": [[["...", score], ...], ...]}
  POST /score      {"src": ["a sentence", ...], "tgt": ["its translation", ...],
                    "token_log_probs": true}
    -> {"scores": [{"log_prob": L, "tokens": N, "mean": M, "token_log_probs": [...]}, ...]}
  GET /            -> the model and its decoding settings
  errors           -> 4xx or 500 with {"error": "one line"}

The search (beam, alpha, extra length, batch size) is the server's; a request may sample, with
DecodingConfig's settings and limits, and give prefixes ("" for none), one a sentence.
"first_index" is the index of src[0] in the client's whole input, from which sampling's keys
are made: a client that sends its input in parts gets the samples of a local translation.
"""

import argparse
import contextlib
import dataclasses
import http.client
import http.server
import json
import logging
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from tqdm import tqdm

from jaxformer import arguments, text
from jaxformer.errors import JaxformerError, exit_code
from jaxformer.settings import DecodingConfig

log = logging.getLogger(__name__)

DEFAULT_PORT = 8228
MAX_REQUEST_BYTES = 64 << 20  # a larger request is refused (413): send a file in parts
CLIENT_LINES = 1024  # lines a request, from a file or pipe (from a terminal: each line)
MAX_NBEST = 100  # translations a sentence in one answer (samples; the beam bounds n-best)


class ServerError(JaxformerError):
  """No server answers at the address, or it refused the request; the message says which."""


class RequestError(JaxformerError):
  """A request the server refuses (400): the message says what is wrong with it."""


# --- the server -----------------------------------------------------------------------------------


class Server(http.server.ThreadingHTTPServer):
  """Serves `model` (a Translator) at `address`; `info` (the model's name, step, ...) is
  answered to GET /. Requests are taken side by side and translated one at a time."""
  daemon_threads = True

  def __init__(self, model: Any, address: tuple[str, int] = ('127.0.0.1', DEFAULT_PORT),
               info: dict[str, Any] | None = None):
    try:
      super().__init__(address, _Handler)
    except OSError as e:
      raise ServerError(f'cannot listen on {address[0]}:{address[1]} ({e.strerror}); choose '
                        'another --port or --host.') from None
    self.model, self.lock = model, threading.Lock()
    self.info = {**(info or {}), **dataclasses.asdict(model.decoding)}

  @property
  def url(self) -> str:
    """http://HOST:PORT, the port as bound (port 0 asks for a free one)."""
    host, port = self.server_address[:2]
    return f'http://{host}:{port}'

  def answer(self, path: str, request: Any) -> dict[str, Any]:
    """The response to a decoded POST body of /translate or /score; JaxformerError (400) for
    a request that cannot be answered."""
    src = _strings(request, 'src')
    fields = ('src', 'tgt', 'token_log_probs') if path == '/score' else (
        'src', 'nbest', 'prefix', 'first_index', *DecodingConfig.PER_REQUEST)
    if unknown := [name for name in request if name not in fields]:
      raise RequestError(f'the request sets "{unknown[0]}", which it cannot (its fields: '
                         f"{', '.join(fields)}; the search is the server's).")
    if path == '/score':
      tgt = _strings(request, 'tgt')
      with_tokens = request.get('token_log_probs', False) is True
      with self._turn(f'scored {len(src)} pair(s)'):
        return {'scores': [s.as_dict(with_tokens) for s in self.model.score(src, tgt)]}
    nbest, first = request.get('nbest'), request.get('first_index', 0)
    for name, value, low, high in (('nbest', nbest, 1, MAX_NBEST), ('first_index', first, 0,
                                                                   2**31)):
      if value is not None and (type(value) is not int or not low <= value <= high):
        raise RequestError(f'"{name}" must be an integer from {low} to {high}, got {value!r}.')
    prefixes = _strings(request, 'prefix') if 'prefix' in request else None
    model = self.model.replace(**{name: request[name] for name in DecodingConfig.PER_REQUEST
                                  if name in request})  # SettingError: a bad value
    with self._turn(f'translated {len(src)} sentence(s)'):
      if nbest is None:
        return {'translations': model.translate(src, prefixes=prefixes, first_index=first)}
      return {'nbest': model.translate_nbest(src, nbest, prefixes=prefixes, first_index=first)}

  @contextlib.contextmanager
  def _turn(self, done: str) -> Any:
    """The model, one request at a time; a line in the log when a request is answered."""
    with self.lock:
      start = time.perf_counter()
      yield
      log.info('%s in %.2f s', done, time.perf_counter() - start)


def _strings(request: Any, name: str) -> list[str]:
  """request[name], a list of strings; RequestError for anything else."""
  value = request.get(name) if isinstance(request, dict) else None
  if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
    raise RequestError(f'the request needs "{name}": a list of strings (one sentence each).')
  return value


class _Handler(http.server.BaseHTTPRequestHandler):
  """One request: JSON in, JSON out, every error a status and a one-line message."""
  server: Server
  protocol_version = 'HTTP/1.1'

  def do_GET(self) -> None:  # pylint: disable=invalid-name
    if self.path.split('?')[0] in ('', '/'):
      self._send(200, self.server.info)
    else:
      self._send(404, {'error': f'no page {self.path}: POST /translate, POST /score, or GET /.'})

  def do_POST(self) -> None:  # pylint: disable=invalid-name
    path = self.path.split('?')[0]
    if path not in ('/translate', '/score'):
      self._send(404, {'error': f'no page {self.path}: POST /translate, POST /score, or GET /.'})
      return
    length = self.headers.get('Content-Length', '')
    if not length.isdigit():  # (a body without a length would be read until the client closes)
      self.close_connection = True
      self._send(411, {'error': 'the request needs a Content-Length header with its size.'})
      return
    length = int(length)
    if length > MAX_REQUEST_BYTES:
      self.close_connection = True  # the body is not read
      self._send(413, {'error': f'the request has {length} bytes, more than '
                                f'{MAX_REQUEST_BYTES}: send the sentences in parts.'})
      return
    try:
      request = json.loads(self.rfile.read(length))
    except ValueError as e:  # (JSONDecodeError and UnicodeDecodeError are ValueErrors)
      self._send(400, {'error': f'bad request: the body is not JSON ({e}).'})
      return
    try:
      self._send(200, self.server.answer(path, request))
    except JaxformerError as e:  # (a DataError or SettingError of the model's too)
      self._send(400, {'error': f'bad request: {e}'})
    except Exception as e:  # pylint: disable=broad-exception-caught
      log.exception('request failed')  # the server's log has the traceback; the client a line
      self._send(500, {'error': f'the server failed: {type(e).__name__}: {e}'})

  def _send(self, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body, ensure_ascii=False).encode()
    self.send_response(status)
    self.send_header('Content-Type', 'application/json; charset=utf-8')
    self.send_header('Content-Length', str(len(data)))
    self.end_headers()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client went away
      self.wfile.write(data)

  def log_message(self, format: str, *args: Any) -> None:  # pylint: disable=redefined-builtin
    log.debug('%s %s', self.address_string(), format % args)


def serve(model: Any, host: str = '127.0.0.1', port: int = DEFAULT_PORT,
          info: dict[str, Any] | None = None) -> None:
  """Serves `model` until interrupted, after compiling its shortest search (one sentence) so
  that the first request does not wait for it; port 0 takes a free port. The address is logged
  once the server answers."""
  with Server(model, (host, port), info) as server:
    model.translate(['Ready.'])
    log.info('serving %s at %s (POST /translate; Ctrl-C stops)',
             (info or {}).get('model', 'the model'), server.url)
    server.serve_forever()


# --- the client -----------------------------------------------------------------------------------


def translate(url: str, sentences: list[str], nbest: int | None = None,
              timeout: float | None = None, *, prefixes: list[str] | None = None,
              first_index: int = 0, **settings: Any) -> list[Any]:
  """The server's translations of `sentences` (with nbest: each one's [text, score] lists),
  with `prefixes` and sampling `settings` (DecodingConfig.PER_REQUEST) as the protocol says;
  ServerError if none answers at `url` or it refuses the request."""
  request = {'src': sentences, **({'nbest': nbest} if nbest else {}),
             **({'prefix': prefixes} if prefixes is not None else {}),
             **({'first_index': first_index} if first_index else {}), **settings}
  return _ask(url, '/translate', request, timeout)['nbest' if nbest else 'translations']


def score(url: str, sources: list[str], targets: list[str], token_log_probs: bool = False,
          timeout: float | None = None) -> list[dict[str, Any]]:
  """The server's scores of the pairs (TargetScore.as_dict's fields); ServerError as translate."""
  return _ask(url, '/score', {'src': sources, 'tgt': targets,
                              'token_log_probs': token_log_probs}, timeout)['scores']


def _ask(url: str, path: str, request: dict[str, Any], timeout: float | None) -> dict[str, Any]:
  """The server's JSON answer at url + path to `request`. Proxies are not used: the server is
  meant to be local."""
  http_request = urllib.request.Request(url.rstrip('/') + path, data=json.dumps(request).encode(),
                                        headers={'Content-Type': 'application/json'})
  opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
  try:
    with opener.open(http_request, timeout=timeout) as response:
      answer = json.load(response)
      if not isinstance(answer, dict) or not answer.keys() & {'nbest', 'translations', 'scores'}:
        raise KeyError(path)
      return answer
  except urllib.error.HTTPError as e:
    with e:
      raise ServerError(f'{url}: {_error_of(e)}') from None
  except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
    reason = getattr(e, 'reason', e)
    raise ServerError(f'no jaxformer server answers at {url} ({reason}); start one with '
                      '`jaxformer serve --model DIR`.') from None
  except (ValueError, KeyError, TypeError):  # (JSONDecodeError is a ValueError)
    raise ServerError(f'{url} answered, but not as `jaxformer serve` does: is it one?') from None


def _error_of(error: urllib.error.HTTPError) -> str:
  try:
    return json.load(error)['error']
  except (ValueError, KeyError, TypeError):
    return f'HTTP {error.code} {error.reason}'


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
  """As the local command: a file read whole, with a progress bar; stdin a chunk at a time (a
  line from a terminal). The server gets CLIENT_LINES lines a request."""
  settings = arguments.decoding_settings(args, DecodingConfig.PER_REQUEST)
  DecodingConfig(**settings)  # refused here, before any request, as the local command does
  with tqdm(total=None, desc='translating', unit='sent', disable=not args.input) as bar:
    def ask(lines: list[str], first: int, prefixes: list[str] | None) -> list[Any]:
      bar.total = bar.total or len(lines)  # (a file: its lines, all in one part)
      answers = []
      for start in range(0, len(lines), CLIENT_LINES):
        part = slice(start, start + CLIENT_LINES)
        answers += translate(args.server, lines[part], args.nbest,
                             prefixes=None if prefixes is None else prefixes[part],
                             first_index=first + start, **settings)
        bar.update(len(lines[part]))
      return answers
    text.translate_lines(args.input, args.output, args.prefix,
                         1 if sys.stdin.isatty() else CLIENT_LINES, ask, args.nbest)
  return 0
