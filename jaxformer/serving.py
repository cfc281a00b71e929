"""A model kept loaded and compiled: `jaxformer serve` answers translations over HTTP;
`jaxformer translate --server URL` is its client (jaxformer.client).

A `jaxformer translate` process pays for importing jax, loading the model and tracing the search
before its first sentence, even with every program in the compilation cache; a client of a
running server pays for none of them: it imports jaxformer.client and the standard library.
The server is for the local machine (127.0.0.1 unless told otherwise, and then only with an
API key or --allow-no-key); requests that arrive together are searched together (Batcher).

The pages, for any HTTP client: POST /translate and POST /score, whose bodies and answers are
the JSON of jaxformer.protocol (TranslateRequest, ScoreRequest); GET / (the model and its
decoding settings); GET /health (200 once ready, 503 while warming up or stopping); errors
are 4xx or 500 with {"error": "one line"}. The port is taken before the model loads, so that a
busy one is said at once; until the model is loaded and a search compiled, every page but GET
/health answers 503 ("warming up").

The search (beam, alpha, extra length, batch size) is the server's; a request may sample, with
DecodingConfig's settings and limits, and give prefixes ("" for none), one a sentence.
"first_index" is the index of src[0] in the client's whole input, from which sampling's keys
are made: a client that sends its input in parts gets the samples of a local translation.
"""

import concurrent.futures
import contextlib
import dataclasses
import hmac
import http.client
import http.server
import ipaddress
import json
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from jaxformer import protocol
from jaxformer.batching import Batcher
# The client's names, where they were before it had a module of its own:
from jaxformer.client import (  # noqa: F401
    CLIENT_LINES, CLIENT_TIMEOUT, DEFAULT_PORT, PROBE_TIMEOUT, ServerError, client_main,
    is_client, score, translate)
from jaxformer.errors import JaxformerError, reason
from jaxformer.protocol import RequestError, TooLarge  # noqa: F401  (its 400 and 413)
from jaxformer.settings import ServerLimits, SettingError

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 64 << 20  # a larger request is refused (413): send a file in parts


# --- the server -----------------------------------------------------------------------------------


class Server(http.server.ThreadingHTTPServer):
  """Serves `translator` (a Translator; None: not yet loaded, `attach` gives it) at `address`;
  `info` (the model's name, step, ...) is answered to GET /. Each connection has a thread of
  its own, up to limits.max_connections; their requests wait (at most limits.max_wait) for one
  model, which a Batcher gives them together. With `api_key`, every request but GET /health
  needs `Authorization: Bearer KEY`."""
  daemon_threads = True
  request_queue_size = 1024  # the listen backlog: a burst of clients waits to be accepted

  def __init__(self, translator: Any | None,
               address: tuple[str, int] = ('127.0.0.1', DEFAULT_PORT),
               info: dict[str, Any] | None = None, limits: ServerLimits = ServerLimits(),
               api_key: str | None = None):
    self.translator = self.batcher = self.info = None  # (attach's)
    try:
      super().__init__(address, _Handler)
    except OSError as e:
      raise ServerError(f'cannot listen on {address[0]}:{address[1]} ({reason(e)}); choose '
                        'another --port or --host.') from None
    self.limits, self.api_key = limits, api_key
    if translator is not None:
      self.attach(translator, info)
    self.connections = threading.BoundedSemaphore(limits.max_connections)
    self.state = 'warming up'  # then 'ready' (ready), then 'stopping' (drain)
    self._answering, self._lock = 0, threading.Lock()
    self._done = threading.Condition(self._lock)  # notified when no request is in flight
    self._idle: dict[socket.socket, float] = {}  # connection: since when it waits

  def attach(self, translator: Any, info: dict[str, Any] | None = None) -> None:
    """The model to serve, once loaded (still warming up: `ready` says when it answers)."""
    self.translator = translator
    self.info = {**(info or {}), **dataclasses.asdict(translator.decoding)}
    self.batcher = Batcher(translator, self.limits.max_batch, self.limits.batch_wait)

  @property
  def url(self) -> str:
    """http://HOST:PORT, the port as bound (port 0 asks for a free one)."""
    host, port = self.server_address[:2]
    return f'http://{host}:{port}'

  def process_request(self, request: Any, client_address: Any) -> None:
    """A thread for the connection (at max_connections, in the place of the longest-idle
    one: _admit), or, when every connection is busy with a request, an immediate 503."""
    if self._admit():
      super().process_request(request, client_address)
      return
    body = json.dumps({'error': f'the server is busy ({self.limits.max_connections} '
                                'connections): retry shortly.'}).encode()
    with contextlib.suppress(OSError):
      request.settimeout(1)
      request.sendall(b'HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: '
                      b'application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s'
                      % (len(body), body))
    self.shutdown_request(request)

  def _admit(self) -> bool:
    """A connection's slot: a free one, else the slot of the connection idle the longest (kept
    alive between requests, or silent since it opened), which is closed for it. So idle
    connections never lock new clients out, and a thread a connection costs is one that
    answers."""
    if self.connections.acquire(blocking=False):
      return True
    with self._lock:
      oldest = min(self._idle, key=self._idle.get, default=None)
      self._idle.pop(oldest, None)
    if oldest is None:
      return False
    with contextlib.suppress(OSError):
      oldest.shutdown(socket.SHUT_RDWR)  # its handler reads the end and frees the slot
    return self.connections.acquire(timeout=1.0)  # (the accept loop waits no longer for it)

  @contextlib.contextmanager
  def idle(self, connection: socket.socket) -> Iterator[None]:
    """Within: `connection` waits for its next request, and may give its slot away (_admit)."""
    with self._lock:
      self._idle[connection] = time.monotonic()
    try:
      yield
    finally:
      with self._lock:
        self._idle.pop(connection, None)

  def process_request_thread(self, request: Any, client_address: Any) -> None:
    try:
      super().process_request_thread(request, client_address)
    finally:
      self.connections.release()

  def handle_error(self, request: Any, client_address: Any) -> None:
    """A connection that failed: one line in the log for a client gone or silent (an OSError),
    the traceback for anything else (a bug)."""
    error = sys.exc_info()[1]
    if isinstance(error, OSError):
      log.info('%s: connection closed (%s: %s)', client_address[0], type(error).__name__, error)
    else:
      log.exception('%s: connection failed', client_address[0])

  def server_close(self) -> None:
    super().server_close()
    if self.batcher is not None:  # (not before a model was attached)
      self.batcher.close()

  def in_flight(self) -> int:
    """Requests being answered now (idle connections are not waited for)."""
    return self._answering

  def ready(self) -> None:
    """From now on requests are answered (GET /health: 200)."""
    self.state = 'ready'

  def drain(self, timeout: float) -> int:
    """Refuses new requests from now on (503) and waits, at most `timeout` seconds, for those
    in flight to be answered; returns how many are still in flight."""
    with self._done:
      self.state = 'stopping'
      self._done.wait_for(lambda: not self._answering, timeout)
      return self._answering

  @contextlib.contextmanager
  def answering(self) -> Iterator[None]:
    """Counts a request in flight while it is answered (in_flight)."""
    with self._lock:
      self._answering += 1
    try:
      yield
    finally:
      with self._lock:
        self._answering -= 1
        if not self._answering:
          self._done.notify_all()

  def answer(self, path: str, body: Any) -> dict[str, Any]:
    """The response to a decoded POST body of /translate or /score; JaxformerError (400) for
    a request that cannot be answered, Busy (503) past max_wait."""
    kind = protocol.ScoreRequest if path == '/score' else protocol.TranslateRequest
    request = kind.from_json(body, self.limits)
    return request.answer(self._wait(self.batcher.submit(request)))

  def _wait(self, future: concurrent.futures.Future) -> Any:
    """The future's result, waited for at most max_wait while it has not started."""
    try:
      return future.result(timeout=self.limits.max_wait)
    except concurrent.futures.TimeoutError:
      if future.cancel():
        raise Busy(f'the model was busy for {self.limits.max_wait:g} s: retry '
                   'shortly.') from None
      return future.result()  # under way: its answer comes


class Busy(JaxformerError):
  """The model did not become free in time (503)."""


class _Handler(http.server.BaseHTTPRequestHandler):
  """One connection's requests: JSON in, JSON out, every error a status and a one-line JSON
  message (those of http.server's own checks too), and a line in the log for each."""
  server: Server
  protocol_version = 'HTTP/1.1'
  # An answer goes out in two writes (headers, body): with Nagle's algorithm, a client that
  # keeps its connection would get the body only after its delayed ACK, some 40 ms later.
  disable_nagle_algorithm = True
  PAGES = 'POST /translate, POST /score, GET /health, or GET /'

  def setup(self) -> None:
    self.timeout = self.server.limits.idle_timeout  # (StreamRequestHandler sets it on the socket)
    super().setup()

  def handle_one_request(self) -> None:
    """As http.server's, the connection counted idle (Server.idle) until the first byte of its
    next request is here (a byte already read counts: peek returns the buffer's first)."""
    try:
      with self.server.idle(self.connection):
        arrived = self.rfile.peek(1)[:1]
    except (TimeoutError, OSError) as e:  # silent past idle_timeout, or closed for another
      log.info('%s: connection closed (%s)', self.client_address[0], type(e).__name__)
      arrived = b''
    if not arrived:
      self.close_connection = True
      return
    super().handle_one_request()

  def do_GET(self) -> None:  # pylint: disable=invalid-name
    path = self.path.split('?')[0]
    if path == '/health':
      ready = self.server.state == 'ready'
      self._send(200 if ready else 503, {'status': self.server.state})
    elif not self._allowed():
      return
    elif path in ('', '/'):
      if self.server.info is None:  # (the model is loading)
        self._send(503, {'status': self.server.state})
      else:
        self._send(200, self.server.info)
    else:
      self._send(404, {'error': f'no page GET {self.path}: {self.PAGES}.'})

  def do_POST(self) -> None:  # pylint: disable=invalid-name
    path = self.path.split('?')[0]
    if not self._allowed():
      return
    if path not in ('/translate', '/score'):
      self._send(404, {'error': f'no page POST {self.path}: {self.PAGES}.'})
      return
    if self.server.state != 'ready':
      self._send(503, {'error': f'the server is {self.server.state}: retry shortly.'})
      return
    length = self.headers.get('Content-Length', '')
    if not length.isdigit():  # (a body without a length would be read until the client closes)
      self.close_connection = True
      self._send(411, {'error': 'the request needs a Content-Length header with its size.'})
      return
    length = int(length)
    if length > MAX_REQUEST_BYTES:
      self._send(413, {'error': f'the request has {length} bytes, more than '
                                f'{MAX_REQUEST_BYTES}: send the sentences in parts.'})
      return
    body = self.rfile.read(length)  # (OSError, a timeout: handle_error's one line)
    self.body_read = True
    try:
      request = json.loads(body)
    except ValueError as e:  # (JSONDecodeError and UnicodeDecodeError are ValueErrors)
      self._send(400, {'error': f'bad request: the body is not JSON ({e}).'})
      return
    try:
      with self.server.answering():
        answer = self.server.answer(path, request)
      self._send(200, answer)
    except Busy as e:
      self._send(503, {'error': str(e)}, retry_after=1)
    except TooLarge as e:
      self._send(413, {'error': str(e)})
    except JaxformerError as e:  # (a DataError or SettingError of the model's too)
      self._send(400, {'error': f'bad request: {e}'})
    except Exception as e:  # pylint: disable=broad-exception-caught
      log.exception('request failed')  # the server's log has the traceback; the client a line
      self._send(500, {'error': f'the server failed: {type(e).__name__}: {e}'})

  def _allowed(self) -> bool:
    """Whether the request carries the server's key (if it has one; compared in constant
    time); else False, a 401 sent."""
    key = self.server.api_key
    given = self.headers.get('Authorization', '')
    if key is None or hmac.compare_digest(given.encode(), f'Bearer {key}'.encode()):
      return True
    self._send(401, {'error': 'the server needs its API key: send "Authorization: Bearer KEY" '
                              '(translate --server reads $JAXFORMER_API_KEY).'}, authenticate=True)
    return False

  def send_error(self, code: int, message: str | None = None, explain: str | None = None
                 ) -> None:
    """http.server's own refusals (an unknown method, a bad request line, headers too long)
    as the protocol's JSON error."""
    self.close_connection = True
    reason = message or self.responses.get(code, ('',))[0]
    if code == 501:
      code, reason = 405, f'no method {self.command}: {self.PAGES}'
    self._send(code, {'error': f'{reason}.'})

  def _send(self, status: int, body: dict[str, Any], retry_after: int | None = None,
            authenticate: bool = False) -> None:
    """The answer; the connection closed after it if the request's body is still unread (a
    refusal before it: 401, 404, 503 warming up), since the next request would begin inside it."""
    if not self.close_connection and not self.body_read and (
        self.headers.get('Content-Length', '0') != '0' or 'Transfer-Encoding' in self.headers):
      self.close_connection = True
    data = json.dumps(body, ensure_ascii=False).encode()
    self.send_response(status)
    self.send_header('Content-Type', 'application/json; charset=utf-8')
    self.send_header('Content-Length', str(len(data)))
    if retry_after is not None:
      self.send_header('Retry-After', str(retry_after))
    if authenticate:
      self.send_header('WWW-Authenticate', 'Bearer')
    if self.close_connection:
      self.send_header('Connection', 'close')
    self.end_headers()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client went away
      self.wfile.write(data)

  def log_request(self, code: Any = '-', size: Any = '-') -> None:  # pylint: disable=unused-argument
    """The access log: a line per request, with its status and time."""
    # (a request line that did not parse has no command, and its path is the last request's)
    what = f'{self.command} {self.path}' if self.command else repr(self.requestline[:200])
    log.info('%s %s %s %.3f s', self.client_address[0], what, code,
             time.perf_counter() - getattr(self, '_start', time.perf_counter()))

  def parse_request(self) -> bool:
    self._start = time.perf_counter()  # pylint: disable=attribute-defined-outside-init
    self.body_read = False  # pylint: disable=attribute-defined-outside-init
    return super().parse_request()

  def log_message(self, format: str, *args: Any) -> None:  # pylint: disable=redefined-builtin
    log.info('%s %s', self.client_address[0], format % args)  # (a timeout, a bad request line)


def check_exposure(host: str, api_key: str | None, allow_no_key: bool) -> None:
  """SettingError for a server open to other machines (a `host` that is not loopback) without
  an API key, unless `allow_no_key` says that is meant."""
  if api_key is None and not _is_loopback(host) and not allow_no_key:
    raise SettingError(f'--host {host} without an API key: anyone who reaches the port could '
                       'use the server. Set JAXFORMER_API_KEY (or --api-key-file), or give '
                       '--allow-no-key to serve it open.')


def _is_loopback(host: str) -> bool:
  """Whether `host` is this machine only (127.0.0.0/8, ::1, localhost)."""
  try:
    return host == 'localhost' or ipaddress.ip_address(host).is_loopback
  except ValueError:  # a name: only the machine's own
    return False


def serve(load: Callable[[], tuple[Any, dict[str, Any]]], host: str = '127.0.0.1',
          port: int = DEFAULT_PORT, limits: ServerLimits = ServerLimits(),
          api_key: str | None = None, stop: threading.Event | None = None) -> None:
  """Serves the Translator that `load` gives (with its GET / info) until `stop` is set or the
  process is interrupted (KeyboardInterrupt: Ctrl-C, or SIGTERM where the caller turns it into
  one). The port is taken first, so that a busy one is said before a model loads for minutes.
  GET /health answers 503 until the model is loaded and the shortest search (one sentence)
  compiled, so that the first request does not wait for it, then 200; the address is logged
  once it does. On the way out, new requests are refused (503) and those in flight get
  limits.drain_timeout seconds to finish."""
  with Server(None, (host, port), limits=limits, api_key=api_key) as server:
    threading.Thread(target=server.serve_forever, name='server', daemon=True).start()
    try:
      translator, info = load()
      server.attach(translator, info)
      translator.run(protocol.TranslateRequest(['Ready.']))
      server.ready()
      log.info('serving %s at %s (POST /translate, POST /score, GET /health; Ctrl-C stops)',
               info.get('model', 'the model'), server.url)
      (stop or threading.Event()).wait()
    finally:
      if server.translator is not None:  # (a model that did not load: its error alone)
        log.info('stopped (%d request(s) still in flight)', server.drain(limits.drain_timeout))
      server.shutdown()
