"""A model kept loaded and compiled: `jaxformer serve` answers translations over HTTP, and
`jaxformer translate --server URL` is its client.

A `jaxformer translate` process pays for importing jax, loading the model and tracing the search
before its first sentence, even with every program in the compilation cache; a client of a
running server pays for none of them: it imports only this module and the standard library.
The server is for the local machine (127.0.0.1 unless told otherwise) and has no
authentication; it translates one request at a time, each with its Translator's batches.

The protocol, for any HTTP client::

  POST /translate  {"src": ["a sentence", ...], "nbest": N (optional)}
    -> {"translations": ["...", ...]}, or with nbest {"nbest": [[["...", score], ...], ...]}
  GET /            -> the model and its decoding settings
  errors           -> 4xx or 500 with {"error": "one line"}
"""

import argparse
import contextlib
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

from jaxformer import text
from jaxformer.errors import JaxformerError, exit_code

log = logging.getLogger(__name__)

DEFAULT_PORT = 8228
MAX_REQUEST_BYTES = 64 << 20  # a larger request is refused (413): send a file in parts
CLIENT_LINES = 1024  # lines a request, from a file or pipe (from a terminal: each line)


class ServerError(JaxformerError):
  """No server answers at the address, or it refused the request; the message says which."""


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
    self.info = {**(info or {}), 'beam': model.beam_size, 'alpha': model.alpha,
                 'extra_length': model.extra_length, 'batch_size': model.batch_size}

  @property
  def url(self) -> str:
    """http://HOST:PORT, the port as bound (port 0 asks for a free one)."""
    host, port = self.server_address[:2]
    return f'http://{host}:{port}'

  def answer(self, request: Any) -> dict[str, Any]:
    """The response to a decoded POST /translate body; ValueError for a bad one."""
    src = request.get('src') if isinstance(request, dict) else None
    if not isinstance(src, list) or not all(isinstance(s, str) for s in src):
      raise ValueError('the request needs "src": a list of strings (one sentence each).')
    nbest = request.get('nbest')
    if nbest is not None and (type(nbest) is not int or nbest < 1):  # (bool is an int)
      raise ValueError(f'"nbest" must be an integer >= 1, got {nbest!r}.')
    with self.lock:
      start = time.perf_counter()
      answer = {'translations': self.model.translate(src)} if nbest is None else \
          {'nbest': self.model.translate_nbest(src, nbest)}  # ValueError: nbest > beam
      log.info('translated %d sentence(s) in %.2f s', len(src), time.perf_counter() - start)
      return answer


class _Handler(http.server.BaseHTTPRequestHandler):
  """One request: JSON in, JSON out, every error a status and a one-line message."""
  server: Server
  protocol_version = 'HTTP/1.1'

  def do_GET(self) -> None:  # pylint: disable=invalid-name
    if self.path.split('?')[0] in ('', '/'):
      self._send(200, self.server.info)
    else:
      self._send(404, {'error': f'no page {self.path}: POST /translate, or GET /.'})

  def do_POST(self) -> None:  # pylint: disable=invalid-name
    if self.path.split('?')[0] != '/translate':
      self._send(404, {'error': f'no page {self.path}: POST /translate, or GET /.'})
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
      self._send(200, self.server.answer(request))
    except ValueError as e:
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
              timeout: float | None = None) -> list[Any]:
  """The server's translations of `sentences` (with nbest: each one's [text, score] lists);
  ServerError if none answers at `url` or it refuses the request. Proxies are not used: the
  server is meant to be local."""
  body = json.dumps({'src': sentences, **({'nbest': nbest} if nbest else {})}).encode()
  request = urllib.request.Request(url.rstrip('/') + '/translate', data=body,
                                   headers={'Content-Type': 'application/json'})
  opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
  try:
    with opener.open(request, timeout=timeout) as response:
      return json.load(response)['nbest' if nbest else 'translations']
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
  """`jaxformer translate --server URL [--input F] [--output F] [--nbest N]` (argv after
  'translate'): the local command's input and output, translated by the server."""
  parser = argparse.ArgumentParser(
      prog='jaxformer translate', description='Translate with a running `jaxformer serve`.')
  parser.add_argument('--server', required=True, help='the server, e.g. http://127.0.0.1:8228')
  parser.add_argument('--input', help='a UTF-8 text file (default: stdin)')
  parser.add_argument('--output', help='where to write (default: stdout)')
  parser.add_argument('--nbest', type=int, help='the N best translations with scores')
  args, others = parser.parse_known_args(argv)
  if others:
    parser.error(f'with --server, the model and its decoding are the server\'s (set them on '
                 f'`jaxformer serve`): drop {" ".join(others)}.')
  if args.nbest is not None and args.nbest < 1:
    parser.error(f'argument --nbest: must be an integer >= 1, got {args.nbest}')
  return exit_code(lambda: _translate_with(args))


def _translate_with(args: argparse.Namespace) -> int:
  """As the local command: a file read whole, with a progress bar; stdin a chunk at a time (a
  line from a terminal). The server gets CLIENT_LINES lines a request."""
  if args.input:
    lines = text.read_lines(args.input)
    chunks = (lines[i:i + CLIENT_LINES] for i in range(0, len(lines), CLIENT_LINES))
  else:
    chunks = text.chunks(sys.stdin.buffer, 'stdin', 1 if sys.stdin.isatty() else CLIENT_LINES)
  with tqdm(total=len(lines) if args.input else None, desc='translating', unit='sent',
            disable=not args.input) as bar:
    def ask(chunk: list[str]) -> list[Any]:
      answer = translate(args.server, chunk, args.nbest)
      bar.update(len(chunk))
      return answer
    text.write_translations(args.output, chunks, ask, args.nbest)
  return 0
