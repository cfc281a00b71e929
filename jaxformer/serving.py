"""A model kept loaded and compiled: `jaxformer serve` answers translations over HTTP;
`jaxformer translate --server URL` is its client (jaxformer.client).

A `jaxformer translate` process pays for importing jax, loading the model and tracing the search
before its first sentence, even with every program in the compilation cache; a client of a
running server pays for none of them: it imports jaxformer.client and the standard library.
The server is for the local machine (127.0.0.1 unless told otherwise, and then only with an
API key or --allow-no-key); requests that arrive together are searched together (Batcher).

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

import concurrent.futures
import contextlib
import dataclasses
import hmac
import http.client
import http.server
import itertools
import json
import logging
import queue
import socket
import sys
import threading
import time
import typing
from collections.abc import Iterator
from typing import Any

from jaxformer import text
# The client's names, where they were before it had a module of its own:
from jaxformer.client import (  # noqa: F401
    CLIENT_LINES, CLIENT_TIMEOUT, DEFAULT_PORT, PROBE_TIMEOUT, ServerError, client_main,
    is_client, score, translate)
from jaxformer.errors import JaxformerError
from jaxformer.settings import MAX_NBEST, DecodingConfig, ServerLimits

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 64 << 20  # a larger request is refused (413): send a file in parts


class RequestError(JaxformerError):
  """A request the server refuses (400): the message says what is wrong with it."""


# --- the server -----------------------------------------------------------------------------------


class Server(http.server.ThreadingHTTPServer):
  """Serves `model` (a Translator) at `address`; `info` (the model's name, step, ...) is
  answered to GET /. Each connection has a thread of its own, up to limits.max_connections;
  their requests wait (at most limits.max_wait) for one model, which a Batcher gives them
  together. With `api_key`, every request but GET /health needs `Authorization: Bearer KEY`."""
  daemon_threads = True
  request_queue_size = 1024  # the listen backlog: a burst of clients waits to be accepted

  def __init__(self, model: Any, address: tuple[str, int] = ('127.0.0.1', DEFAULT_PORT),
               info: dict[str, Any] | None = None, limits: ServerLimits = ServerLimits(),
               api_key: str | None = None):
    try:
      super().__init__(address, _Handler)
    except OSError as e:
      raise ServerError(f'cannot listen on {address[0]}:{address[1]} ({e.strerror}); choose '
                        'another --port or --host.') from None
    self.model, self.limits, self.api_key = model, limits, api_key
    self.info = {**(info or {}), **dataclasses.asdict(model.decoding)}
    self.batcher = Batcher(model, limits.max_batch, limits.batch_wait)
    self.connections = threading.BoundedSemaphore(limits.max_connections)
    self.state = 'warming up'  # then 'ready', then 'stopping'
    self._answering, self._lock = 0, threading.Lock()
    self._idle: dict[socket.socket, float] = {}  # connection: since when it waits

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
    if hasattr(self, 'batcher'):  # (not when the address could not be bound)
      self.batcher.close()

  def in_flight(self) -> int:
    """Requests being answered now (idle connections are not waited for)."""
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

  def answer(self, path: str, request: Any) -> dict[str, Any]:
    """The response to a decoded POST body of /translate or /score; JaxformerError (400) for
    a request that cannot be answered, Busy (503) past max_wait."""
    fields = ('src', 'tgt', 'token_log_probs') if path == '/score' else (
        'src', 'nbest', 'prefix', 'first_index', *DecodingConfig.PER_REQUEST)
    if not isinstance(request, dict):
      raise RequestError('the request must be a JSON object: {"src": [sentences], ...}.')
    if unknown := [name for name in request if name not in fields]:
      raise RequestError(f'the request sets "{unknown[0]}", which it cannot (its fields: '
                         f"{', '.join(fields)}; the search is the server's).")
    src = self._sentences(request, 'src')
    if path == '/score':
      tgt = self._sentences(request, 'tgt')
      text.check_pairs(src, tgt)  # before it is merged with other requests
      with_tokens = request.get('token_log_probs', False)
      if type(with_tokens) is not bool:
        raise RequestError('"token_log_probs" must be true or false, got '
                           f'{json.dumps(with_tokens)[:60]}.')
      scores = self._wait(self.batcher.submit(('score',), (src, tgt)))
      return {'scores': [s.as_dict(with_tokens) for s in scores]}
    nbest, first = request.get('nbest'), request.get('first_index', 0)
    for name, value, low, high in (('nbest', nbest, 1, MAX_NBEST),
                                   ('first_index', first, 0, 2**31)):
      if value is not None and (type(value) is not int or not low <= value <= high):
        raise RequestError(f'"{name}" must be an integer from {low} to {high}, got {value!r}.')
    prefixes = self._sentences(request, 'prefix') if 'prefix' in request else None
    if prefixes is not None and len(prefixes) != len(src):
      raise RequestError(f'{len(prefixes)} prefixes for {len(src)} sentences: give one a '
                         "sentence ('' for none).")
    settings = {name: request[name] for name in DecodingConfig.PER_REQUEST if name in request}
    decoding = self.model.decoding.replace(**settings)  # SettingError: a bad value
    # A sampling request is searched alone: its keys follow its own first_index.
    key = ('translate', decoding, nbest, first, object()) if decoding.sampling else (
        'translate', decoding, nbest, 0, None)
    found = self._wait(self.batcher.submit(key, (src, prefixes)))
    return {'translations': found} if nbest is None else {'nbest': found}

  def _sentences(self, request: dict[str, Any], name: str) -> list[str]:
    """request[name], a list of at most max_sentences strings of valid text, each at most
    max_chars long; RequestError (400, or TooLarge: 413) for anything else."""
    value = request.get(name)
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
      raise RequestError(f'the request needs "{name}": a list of strings (one sentence each).')
    if len(value) > self.limits.max_sentences:
      raise TooLarge(f'"{name}" has {len(value)} sentences, more than the server takes at once '
                     f'({self.limits.max_sentences}): send them in parts.')
    for i, sentence in enumerate(value):
      if len(sentence) > self.limits.max_chars:
        raise TooLarge(f'{name}[{i}] has {len(sentence)} characters, more than the server '
                       f'takes ({self.limits.max_chars}).')
      try:
        sentence.encode('utf-8')
      except UnicodeEncodeError as e:  # a lone surrogate, sent as a JSON escape
        raise RequestError(f'{name}[{i}] is not valid text at character {e.start} '
                           f'({e.reason}).') from None
    return value

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


class TooLarge(RequestError):
  """A request over a size limit (413)."""


class _Job(typing.NamedTuple):
  key: tuple[Any, ...]   # jobs of one key are searched together
  inputs: tuple[Any, ...]
  future: concurrent.futures.Future


class Batcher:
  """Requests given to one model together: a thread takes every request that queued while the
  last search ran and those its clients send next (up to max_batch sentences, waiting at most
  batch_wait seconds for them: _gather), and searches those with the same key (the same kind
  and settings) as one input, which the Translator sorts into length buckets. Each request
  gets what it would alone: a sentence's search does not depend on its batch
  (tests/test_serving.py)."""

  def __init__(self, model: Any, max_batch: int, batch_wait: float):
    self.model, self.max_batch, self.batch_wait = model, max_batch, batch_wait
    self._queue: queue.Queue = queue.Queue()
    self._thread = threading.Thread(target=self._run, name='batcher', daemon=True)
    self._thread.start()

  def close(self) -> None:
    """Ends the thread once the requests queued before are answered."""
    self._queue.put(None)
    self._thread.join()

  def submit(self, key: tuple[Any, ...], inputs: tuple[Any, ...]) -> concurrent.futures.Future:
    """A future of the request's answer; `inputs` are (sources, targets) for the key
    ('score',), else (sentences, prefixes or None)."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    self._queue.put(_Job(key, inputs, future))
    return future

  def _run(self) -> None:
    expected, deadline = 1, 0.0
    while (job := self._queue.get()) is not None:
      jobs = self._gather(job, expected, deadline)
      start = time.monotonic()
      groups: dict[tuple[Any, ...], list[_Job]] = {}
      for job in jobs:
        if job.future.set_running_or_notify_cancel():  # (not one that stopped waiting)
          groups.setdefault(job.key, []).append(job)
      for group in groups.values():
        self._answer(group)
      # The clients just answered come back (a closed loop), beside those who queued meanwhile.
      expected = len(jobs) + self._queue.qsize()
      end = time.monotonic()
      deadline = end + min(self.batch_wait, (end - start) / 2)

  def _gather(self, first: _Job, expected: int, deadline: float) -> list[_Job]:
    """`first` and the requests queued behind it, up to max_batch sentences; until `expected`
    are gathered (those the last search answered, and those that queued while it ran), it waits
    for more until `deadline` (time.monotonic: the last search's end + batch_wait, at most half
    its time). Without the wait, clients that send again as soon as they are answered split
    into two groups that take turns: the first to come back starts a search, and the others
    queue behind it."""
    jobs, sentences = [first], len(first.inputs[0])
    while sentences < self.max_batch:
      wait = deadline - time.monotonic() if len(jobs) < expected else 0.0
      try:
        job = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
      except queue.Empty:
        break
      if job is None:
        self._queue.put(None)  # (seen at the top, after these)
        break
      jobs.append(job)
      sentences += len(job.inputs[0])
    return jobs

  def _answer(self, group: list[_Job]) -> None:
    """One search for the group's requests; each alone when together they fail as a request
    (one bad prefix: its error, the others' answers)."""
    def joined(side: int) -> list[str]:  # (a job without prefixes: '' for each sentence)
      return list(itertools.chain.from_iterable(
          job.inputs[side] or [''] * len(job.inputs[0]) for job in group))
    kind, *settings = group[0].key
    try:
      if kind == 'score':
        found = self.model.score(joined(0), joined(1))
      else:
        decoding, nbest, first, _ = settings
        model = self.model if decoding == self.model.decoding else self.model.replace(
            **dataclasses.asdict(decoding))
        prefixes = None if all(job.inputs[1] is None for job in group) else joined(1)
        found = model.translate(joined(0), prefixes=prefixes, first_index=first) \
            if nbest is None else model.translate_nbest(joined(0), nbest, prefixes=prefixes,
                                                        first_index=first)
    except JaxformerError as e:
      if len(group) > 1:
        for job in group:
          self._answer([job])
      else:
        group[0].future.set_exception(e)
      return
    except Exception as e:  # pylint: disable=broad-exception-caught
      for job in group:
        job.future.set_exception(e)
      return
    counts = [len(job.inputs[0]) for job in group]
    if len(found) != sum(counts):  # a merge that would not come apart as it went in
      error = RuntimeError(f'the search of {sum(counts)} sentences gave {len(found)} answers')
      for job in group:
        job.future.set_exception(error)
      return
    start = 0
    for job, count in zip(group, counts):
      job.future.set_result(found[start:start + count])
      start += count


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
      self.close_connection = True  # the body is not read
      self._send(413, {'error': f'the request has {length} bytes, more than '
                                f'{MAX_REQUEST_BYTES}: send the sentences in parts.'})
      return
    body = self.rfile.read(length)  # (OSError, a timeout: handle_error's one line)
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
    log.info('%s %s %s %s %.3f s', self.client_address[0], self.command, self.path, code,
             time.perf_counter() - getattr(self, '_start', time.perf_counter()))

  def parse_request(self) -> bool:
    self._start = time.perf_counter()  # pylint: disable=attribute-defined-outside-init
    return super().parse_request()

  def log_message(self, format: str, *args: Any) -> None:  # pylint: disable=redefined-builtin
    log.info('%s %s', self.client_address[0], format % args)  # (a timeout, a bad request line)


def serve(model: Any, host: str = '127.0.0.1', port: int = DEFAULT_PORT,
          info: dict[str, Any] | None = None, limits: ServerLimits = ServerLimits(),
          api_key: str | None = None, stop: threading.Event | None = None) -> None:
  """Serves `model` until `stop` is set or the process is interrupted (KeyboardInterrupt:
  Ctrl-C, or SIGTERM where the caller turns it into one). GET /health answers 503 until the
  shortest search (one sentence) is compiled, so that the first request does not wait for it,
  then 200; the address is logged once it does. On the way out, new requests are refused (503)
  and those in flight get limits.drain_timeout seconds to finish."""
  with Server(model, (host, port), info, limits, api_key) as server:
    threading.Thread(target=server.serve_forever, name='server', daemon=True).start()
    try:
      model.translate(['Ready.'])
      server.state = 'ready'
      log.info('serving %s at %s (POST /translate, POST /score, GET /health; Ctrl-C stops)',
               (info or {}).get('model', 'the model'), server.url)
      (stop or threading.Event()).wait()
    finally:
      server.state = 'stopping'
      deadline = time.monotonic() + limits.drain_timeout
      while server.in_flight() and time.monotonic() < deadline:
        time.sleep(0.05)
      log.info('stopped (%d request(s) still in flight)', server.in_flight())
      server.shutdown()
