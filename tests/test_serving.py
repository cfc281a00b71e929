"""jaxformer.serving: `jaxformer serve`, and its client (jaxformer.client) against it."""

import contextlib
import http.client
import http.server
import json
import logging
import pathlib
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from helpers import one_line_error

from jaxformer import cli, client, commands, files, serving
from jaxformer.settings import ServerLimits

ROOT = pathlib.Path(__file__).resolve().parents[1]
LINES = ['the man sees a dog', '', 'Größe 😀', 'the dog walks with a cat', 'a red cat']


@pytest.fixture(scope='module')
def server(translator):
  """The tiny translator served on a free port, in a thread of this process."""
  with serving.Server(translator, ('127.0.0.1', 0), info={'model': 'tiny'}) as running:
    running.ready()  # (serve() says so once it has compiled a search)
    thread = threading.Thread(target=running.serve_forever, daemon=True)
    thread.start()
    yield running
    running.shutdown()
  thread.join(timeout=30)


def _http(url: str, body: bytes | None = None) -> tuple[int, dict]:
  """(status, JSON answer) of a GET, or of a POST of `body`."""
  try:
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
        urllib.request.Request(url, data=body), timeout=120) as response:
      return response.status, json.load(response)
  except urllib.error.HTTPError as e:
    with e:
      return e.code, json.load(e)


def test_the_server_answers_as_its_translator(server, translator):
  assert serving.translate(server.url, LINES) == translator.translate(LINES)
  nbest = serving.translate(server.url, LINES, nbest=2)
  assert [[tuple(o) for o in options] for options in nbest] == translator.translate_nbest(
      LINES, 2)
  assert _http(server.url + '/') == (200, {
      'model': 'tiny', 'beam_size': 4, 'alpha': 0.6, 'extra_length': 50, 'batch_size': 4,
      'all_rows': False, 'drop_finished': False, 'sampling': False, 'temperature': 1.0,
      'top_k': 0, 'top_p': 1.0, 'seed': None})


def test_requests_at_once_are_each_answered_whole(server, translator):
  """Requests taken side by side, translated one at a time: no answer mixes two requests."""
  asks = [LINES, LINES[::-1], ['a red cat'] * 9, LINES[1:]]
  answers = [None] * len(asks)

  def ask(i: int) -> None:
    answers[i] = serving.translate(server.url, asks[i])
  threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(asks))]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join(timeout=120)
  assert answers == [translator.translate(sentences) for sentences in asks]


def test_the_server_scores_samples_and_prefixes_as_its_translator(server, translator):
  targets = ['der hund', 'ein haus', 'x', 'die katze']
  assert serving.score(server.url, LINES[:4], targets, token_log_probs=True) == [
      s.as_dict(True) for s in translator.score(LINES[:4], targets)]
  prefixes = ['der'] + [''] * (len(LINES) - 1)
  sampler = translator.replace(sampling=True, seed=5, top_k=20)
  asked = serving.translate(server.url, LINES, 2, prefixes=prefixes, first_index=7,
                            sampling=True, seed=5, top_k=20)
  assert [[tuple(o) for o in options] for options in asked] == sampler.translate_nbest(
      LINES, 2, prefixes=prefixes, first_index=7)


def test_a_server_of_another_beam_samples_as_a_local_sampler(translator):
  """A sampling request reads none of the server's beam settings: a server searching with beam
  5 and alpha 1 samples what a local sampler does (it used to refuse every sampling request)."""
  with _serving(translator.replace(beam_size=5, alpha=1.0)) as server:
    asked = serving.translate(server.url, LINES, sampling=True, seed=3)
  assert asked == translator.replace(sampling=True, seed=3).translate(LINES)


def test_a_server_that_samples_takes_sampling_settings_alone(translator, tmp_path, capsys):
  """A temperature without "sampling": true (or --temperature without --sampling) was refused
  as 'for sampling only: turn it on' by a server that samples."""
  sampler = translator.replace(sampling=True)
  expected = sampler.replace(temperature=0.5, seed=3).translate(LINES[:2])
  with _serving(sampler) as server:
    assert serving.translate(server.url, LINES[:2], temperature=0.5, seed=3) == expected
    (tmp_path / 'in.txt').write_text('\n'.join(LINES[:2]) + '\n')
    assert serving.client_main(['--server', server.url, '--input', str(tmp_path / 'in.txt'),
                                '--temperature', '0.5', '--seed', '3']) == 0
  assert capsys.readouterr().out == ''.join(t + '\n' for t in expected)


@pytest.mark.parametrize('page, body, status, message', [
    ('/translate', b'not json', 400, 'bad request: the body is not JSON (Expecting value'),
    ('/translate', b'\xff', 400, 'bad request: the body is not JSON ('),
    ('/translate', b'{"src": "one string"}', 400,
     'bad request: the request needs "src": a list of strings'),
    ('/translate', b'["a"]', 400, 'bad request: the request must be a JSON object'),
    ('/translate', b'{"src": ["a", 3]}', 400,
     'bad request: the request needs "src": a list of strings'),
    ('/translate', b'{"src": ["a"], "nbest": true}', 400,
     'bad request: "nbest" must be an integer from 1 to 100, got True.'),
    ('/translate', b'{"src": ["a"], "nbest": 5}', 400,
     'bad request: 5-best needs a beam of at least 5 (this search has 4), or sampling.'),
    ('/translate', b'{"src": ["a"], "sampling": true, "temperature": 0}', 400,
     'bad request: decoding.temperature must be > 0, got 0.'),
    ('/translate', b'{"src": ["a"], "sampling": true, "top_p": 1.5}', 400,
     'bad request: decoding.top_p must be in (0, 1], got 1.5.'),
    ('/translate', b'{"src": ["a"], "top_k": 5}', 400,
     'bad request: top_k=5: temperature, top_k, top_p and seed are for sampling only'),
    ('/translate', b'{"src": ["a"], "beam_size": 1}', 400,
     'bad request: the request sets "beam_size", which it cannot (its fields: src, nbest, '
     "prefix, first_index, sampling, temperature, top_k, top_p, seed; the search is the "
     "server's)."),
    ('/translate', b'{"src": ["a", "b"], "prefix": ["x"]}', 400,
     "bad request: 1 prefixes for 2 sentences: give one a sentence ('' for none)."),
    ('/score', b'{"src": ["a"], "tgt": [""]}', 400, 'bad request: target 1 is empty'),
    ('/score', b'{"src": ["a"], "tgt": ["a", "b"]}', 400,
     'bad request: 1 sources and 2 targets'),
    ('/score', b'{"src": ["a"]}', 400, 'bad request: the request needs "tgt": a list of strings'),
    ('/score', b'{"src": ["a"], "tgt": ["b"], "token_log_probs": "yes"}', 400,
     'bad request: "token_log_probs" must be true or false, got "yes".'),
    ('/score', b'{"src": ["a"], "tgt": ["b"], "token_log_probs": 1}', 400,
     'bad request: "token_log_probs" must be true or false, got 1.'),
    ('/translate', b'{"src": ["a"], "sampling": "yes"}', 400,
     'bad request: decoding.sampling must be bool, got str'),
])
def test_bad_requests_get_a_status_and_one_line(server, page, body, status, message):
  code, answer = _http(server.url + page, body)
  assert code == status and answer['error'].startswith(message), answer
  assert '\n' not in answer['error']


def test_unknown_pages_and_oversized_requests_are_refused(server, monkeypatch):
  assert _http(server.url + '/nowhere')[0] == 404
  assert _http(server.url + '/nowhere', b'{}')[0] == 404
  with socket.create_connection(server.server_address[:2], timeout=60) as raw:  # no length
    raw.sendall(b'POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n{}')
    answer = raw.makefile('rb').read()  # to the end: the server closes the connection
  assert answer.startswith(b'HTTP/1.1 411 ') and b'needs a Content-Length header' in answer
  monkeypatch.setattr(serving, 'MAX_REQUEST_BYTES', 10)
  code, answer = _http(server.url + '/translate', json.dumps({'src': LINES}).encode())
  assert code == 413 and 'send the sentences in parts' in answer['error']
  with pytest.raises(serving.ServerError, match=r'^http://127\.0\.0\.1:\d+: the request has '):
    serving.translate(server.url, LINES)


def test_no_server_and_a_busy_port_are_one_line_errors(server, tmp_path, capsys):
  (tmp_path / 'in.txt').write_text('the dog\n')
  assert serving.client_main(['--server', 'http://127.0.0.1:9', '--input',
                              str(tmp_path / 'in.txt')]) == 1
  err = capsys.readouterr().err  # (after the file's progress bar at 0%)
  assert err.splitlines()[-1] == (
      'error: no jaxformer server answers at http://127.0.0.1:9 (Connection refused); start '
      'one with `jaxformer serve --model DIR`.') and 'Traceback' not in err
  with pytest.raises(serving.ServerError, match=r'cannot listen on 127\.0\.0\.1:\d+ \(Address '
                     r'already in use\); choose another --port or --host\.'):
    serving.Server(server.translator, server.server_address)


def test_the_port_is_taken_before_the_model_loads(server, translator, monkeypatch, capsys,
                                                  caplog, tmp_path):
  """A busy port was said only once the model had loaded (minutes, for a large one); now at
  once, and a server whose model is loading answers 503 'warming up' (a client waits on it).
  A model that does not load is its error alone, without a line of the server's stopping."""
  caplog.set_level(logging.INFO, 'jaxformer.serving')
  assert cli.main(['serve', '--model', str(tmp_path / 'nowhere'), '--port', '0']) == 1
  assert capsys.readouterr().err.startswith(f'error: {tmp_path / "nowhere"}: does not exist')
  assert 'stopped' not in caplog.text
  monkeypatch.setattr(commands, 'load_translator', lambda *_: pytest.fail('the model loaded'))
  assert cli.main(['serve', '--model', 'm', '--port', str(server.server_address[1])]) == 1
  assert capsys.readouterr().err.startswith('error: cannot listen on 127.0.0.1:')
  loaded, stop = threading.Event(), threading.Event()
  with socket.socket() as probe:  # a free port
    probe.bind(('127.0.0.1', 0))
    port = probe.getsockname()[1]
  url = f'http://127.0.0.1:{port}'
  load = lambda: (loaded.wait(60), (translator, {'model': 'tiny'}))[1]  # noqa: E731
  thread = threading.Thread(target=serving.serve, args=(load, '127.0.0.1', port),
                            kwargs={'stop': stop})
  thread.start()
  try:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # (the thread binds the port)
      with contextlib.suppress(OSError):
        assert _http(url + '/health') == (503, {'status': 'warming up'})
        break
      time.sleep(0.01)
    assert _http(url + '/') == (503, {'status': 'warming up'})
    assert _http(url + '/translate', b'{"src": ["a"]}') == (
        503, {'error': 'the server is warming up: retry shortly.'})
    loaded.set()
    assert client.translate(url, LINES[:1]) == translator.translate(LINES[:1])
    assert _http(url + '/')[1]['model'] == 'tiny'
  finally:
    loaded.set()
    stop.set()
    thread.join(60)


def test_the_client_command_imports_no_jax_and_writes_what_the_local_command_writes(
    server, workdir, tmp_path, capsys):
  """`jaxformer translate --server` (through the installed command's entry point) gives the
  local command's output byte for byte, lines and n-best, without importing jax."""
  (tmp_path / 'in.txt').write_text('\n'.join(LINES) + '\n', encoding='utf-8')
  (tmp_path / 'prefix.txt').write_text('der\n' * len(LINES), encoding='utf-8')
  sampled = ['--sampling', '--seed', '2', '--nbest', '2', '--prefix', str(tmp_path / 'prefix.txt')]
  for extra in ([], ['--nbest', '2'], sampled):
    assert cli.main(['translate', '--model', str(workdir), '--batch-size', '4', '--input',
                     str(tmp_path / 'in.txt'), '--output', str(tmp_path / 'local.txt'),
                     *extra]) == 0
    code = ('import sys; from jaxformer.__main__ import main; status = main(sys.argv[1:]); '
            "print(sorted(m for m in ('jax', 'numpy', 'flax') if m in sys.modules)); "
            'sys.exit(status)')
    result = subprocess.run(
        [sys.executable, '-c', code, 'translate', '--server', server.url, *extra],
        input=(tmp_path / 'in.txt').read_bytes(), capture_output=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    out, imported = result.stdout.decode().rsplit('\n', 2)[:2]
    assert out + '\n' == (tmp_path / 'local.txt').read_text(encoding='utf-8')
    assert imported == '[]'
  assert cli.main(['translate', '--server', server.url, '--input', str(tmp_path / 'in.txt'),
                   '--output', str(tmp_path / 'through-cli.txt')]) == 0  # python -m jaxformer.cli
  assert 'translating: 100%' in capsys.readouterr().err  # a file: a progress bar
  assert (tmp_path / 'through-cli.txt').read_text(encoding='utf-8').splitlines() == \
      serving.translate(server.url, LINES)


@pytest.mark.parametrize('stop', [signal.SIGINT, signal.SIGTERM])
def test_serve_command_serves_until_ctrl_c_or_sigterm(workdir, translator, stop):
  """`jaxformer serve --port 0` logs its address once it answers (and /health says ready);
  Ctrl-C ends it (130), SIGTERM too, draining, with 0 (a service manager's stop, not a
  failure), with a line for each request and one for the stop."""
  process = subprocess.Popen(
      [sys.executable, '-m', 'jaxformer', 'serve', '--model', str(workdir), '--batch-size', '4',
       '--port', '0'], stderr=subprocess.PIPE, text=True, cwd=ROOT)
  watchdog = threading.Timer(300, process.kill)  # a server that never answers fails, not hangs
  watchdog.start()
  try:
    log = ''
    while not (found := re.search(r'at (http://127\.0\.0\.1:\d+) \(POST /translate', log)):
      line = process.stderr.readline()
      assert line, f'serve ended: {log[-2000:]}'
      log += line
    url = found.group(1)
    assert _http(url + '/health') == (200, {'status': 'ready'})
    assert serving.translate(url, LINES) == translator.translate(LINES)
    process.send_signal(stop)
    assert process.wait(timeout=60) == (130 if stop == signal.SIGINT else 0)
    rest = process.stderr.read()
    assert re.search(r'127\.0\.0\.1 POST /translate 200 \d+\.\d+ s', rest), rest
    assert 'stopped (0 request(s) still in flight)' in rest
    assert rest.strip().endswith('interrupted') == (stop == signal.SIGINT), rest[-500:]
  finally:
    watchdog.cancel()
    process.kill()
    process.wait()


def test_serve_refuses_a_port_out_of_range(capsys):
  with pytest.raises(SystemExit):
    cli.main(['serve', '--model', 'm', '--port', '70000'])
  assert 'must be a port number from 0 to 65535' in capsys.readouterr().err


def test_an_output_file_that_cannot_be_written_is_one_line(server, workdir, tmp_path, capsys,
                                                          monkeypatch):
  """Both ways of translating say so alike, before any translation (the local command before
  its model loads); a write that fails later is one line too."""
  (tmp_path / 'in.txt').write_text('the dog\n')
  missing, folder = tmp_path / 'no-folder' / 'out.txt', tmp_path
  for argv in (['--server', server.url], ['--model', str(workdir)]):
    for output, said in ((missing, f'{missing.parent}: no such folder for the translations.'),
                         (folder, f'{folder}: a folder, where the file for the translations '
                          'belongs.')):
      assert cli.main(['translate', *argv, '--input', str(tmp_path / 'in.txt'), '--output',
                       str(output)]) == 1
      assert capsys.readouterr().err.splitlines()[-1] == f'error: {said}'
  assert cli.main(['translate', '--model', str(tmp_path / 'no-model'), '--output',
                   str(missing)]) == 1  # found out before the model is looked for
  assert capsys.readouterr().err == (
      f'error: {missing.parent}: no such folder for the translations.\n')
  monkeypatch.setattr(files, 'check_output', lambda *args: None)  # (as if it went later)
  assert cli.main(['translate', '--model', str(workdir), '--input', str(tmp_path / 'in.txt'),
                   '--output', str(missing)]) == 1
  assert capsys.readouterr().err.splitlines()[-1] == (
      f'error: cannot write to {missing} (No such file or directory).')


# --- bounds, batching and access (each class of issue 70, on real sockets) ------------------------


@contextlib.contextmanager
def _serving(model, **limits):
  """`model` served on a free port with these limits, ready, in a thread of this process."""
  with serving.Server(model, ('127.0.0.1', 0), limits=ServerLimits(**limits)) as running:
    running.ready()
    thread = threading.Thread(target=running.serve_forever, daemon=True)
    thread.start()
    try:
      yield running
    finally:
      running.shutdown()
  thread.join(timeout=30)


class _Gate:
  """A Translator whose searches wait until `open` is set, counting them."""

  def __init__(self, model):
    self.model, self.open, self.entered, self.searches = model, threading.Event(), \
        threading.Event(), []
    self.decoding = model.decoding

  def run(self, request):
    self.entered.set()
    assert self.open.wait(60)
    self.searches.append(len(request.src))
    return self.model.run(request)


def _raw(server, data: bytes, timeout: float = 10) -> bytes:
  """What the server sends back to `data` written on a fresh connection, until it closes."""
  with socket.create_connection(server.server_address[:2], timeout=timeout) as raw:
    raw.sendall(data)
    return raw.makefile('rb').read()


def test_idle_connections_give_way_to_new_ones_and_busy_ones_past_the_cap_get_503(translator):
  """At max_connections, a new client takes the place of the connection idle the longest
  (closed for it: it was answered 503 while the idle ones held every slot); idle connections
  are closed after idle_timeout; with every slot answering a request, a new one is 503."""
  with _serving(translator, idle_timeout=5, max_connections=2) as server:
    idle = [socket.create_connection(server.server_address[:2], timeout=10) for _ in range(2)]
    time.sleep(0.2)  # (both accepted and waiting: the cap is reached)
    assert _http(server.url + '/health') == (200, {'status': 'ready'})
    assert idle[0].recv(100) == b''  # the longest idle gave its place, closed
    idle[1].close()
  gate = _Gate(translator)
  with _serving(gate, idle_timeout=0.5, max_connections=1) as server:
    busy = threading.Thread(target=_http, args=(server.url + '/translate', b'{"src": ["a"]}'))
    busy.start()  # (one connection: the client's probe would take the slot first)
    assert gate.entered.wait(60)  # the one slot answers a request: nothing idle to give
    refused = _raw(server, b'GET /health HTTP/1.1\r\nHost: x\r\n\r\n')
    assert refused.startswith(b'HTTP/1.1 503 ') and b'Retry-After: 1' in refused
    assert b'the server is busy (1 connections)' in refused
    gate.open.set()
    busy.join(timeout=60)
    # (the answered connection's thread frees its slot just after the client has its answer)
    assert server.connections.acquire(timeout=30)
    server.connections.release()
    silent = socket.create_connection(server.server_address[:2], timeout=10)
    assert silent.recv(100) == b''  # closed by the server within its idle timeout
    silent.close()


def test_many_clients_at_once_are_all_answered_as_alone(translator):
  sentences = [f'{LINES[i % 5]} {i}' for i in range(48)]
  expected = translator.translate(sentences)
  answers: list = [None] * len(sentences)
  with _serving(translator) as server:
    def ask(i: int) -> None:
      answers[i] = serving.translate(server.url, [sentences[i]], timeout=120)[0]
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(sentences))]
    for thread in threads:
      thread.start()
    for thread in threads:
      thread.join(timeout=120)
  assert answers == expected


def test_requests_that_wait_together_are_searched_together(translator):
  gate = _Gate(translator)
  asks = [[LINES[0]], [LINES[3], LINES[4]], [LINES[2]], [LINES[0], 'x']]
  answers: list = [None] * len(asks)
  with _serving(gate) as server:
    def ask(i: int) -> None:
      answers[i] = serving.translate(server.url, asks[i], timeout=120)
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(asks))]
    threads[0].start()
    while not server.batcher._queue.empty() or server.in_flight() < 1:  # the first is taken
      time.sleep(0.01)
    for thread in threads[1:]:
      thread.start()
    while server.batcher._queue.qsize() < 3:  # the others wait behind it
      time.sleep(0.01)
    gate.open.set()
    for thread in threads:
      thread.join(timeout=120)
  assert gate.searches == [1, 5]  # the first alone, then the three waiting as one search
  assert answers == [translator.translate(a) for a in asks]


def test_nothing_to_search_is_an_empty_answer_from_the_server(server):
  """No sentence, or blank ones only: 200 with as many empty answers (it was a 500)."""
  for src, expected in (([], []), (['', '  '], ['', ''])):
    assert _http(server.url + '/translate', json.dumps({'src': src}).encode()) == (
        200, {'translations': expected})
    assert _http(server.url + '/translate', json.dumps({'src': src, 'nbest': 2}).encode()) == (
        200, {'nbest': [[] for _ in src]})
  assert _http(server.url + '/score', b'{"src": [], "tgt": []}') == (200, {'scores': []})


def test_score_requests_are_checked_whole_before_they_wait_together(translator):
  """Two /score requests whose counts differ, sent while a search runs: each is refused in
  one line. Merged, 1 + 2 sources and 2 + 1 targets would pair; both were answered 200, one
  request's sources scored against the other's targets."""
  gate = _Gate(translator)
  with _serving(gate) as server:
    busy = threading.Thread(target=lambda: serving.translate(server.url, [LINES[0]], timeout=120))
    busy.start()
    assert gate.entered.wait(60)  # a search under way: the next requests would queue
    answers = [_http(server.url + '/score', json.dumps(body).encode()) for body in (
        {'src': ['a'], 'tgt': ['x', 'y']}, {'src': ['b', 'c'], 'tgt': ['z']})]
    gate.open.set()
    busy.join(timeout=120)
  assert [code for code, _ in answers] == [400, 400]
  assert answers[0][1]['error'] == ('bad request: 1 sources and 2 targets: scoring needs one '
                                    'target a source.')
  assert answers[1][1]['error'].startswith('bad request: 2 sources and 1 targets')


def test_a_merged_search_that_does_not_come_apart_as_it_went_in_is_an_error(translator):
  """The batcher checks that a merged search answers each sentence once before it splits it:
  a search that loses or adds answers fails each of its requests (500), never shifts them."""
  class Short:  # a model whose search drops one answer
    decoding = translator.decoding

    def run(self, request):
      return translator.run(request)[1:]
  with _serving(Short()) as server:
    code, answer = _http(server.url + '/translate', b'{"src": ["a", "b"]}')
  assert code == 500 and 'the search of 2 sentences gave 1 answers' in answer['error'], answer


def test_clients_answered_together_are_searched_together_again(translator):
  # A closed loop: each client sends again once answered. A comes back after its search while
  # B and C queued behind it; without the wait, B and C would start a search that A queues
  # behind, and the clients would take turns in two groups for ever.
  gate = _Gate(translator)
  asks = {name: [LINES[i]] for name, i in (('A', 0), ('A again', 4), ('B', 3), ('C', 2))}
  answers: dict = {}
  with _serving(gate, batch_wait=30) as server:
    def ask(*names: str) -> None:
      for name in names:
        answers[name] = serving.translate(server.url, asks[name], timeout=120)
    threads = [threading.Thread(target=ask, args=names)
               for names in (('A', 'A again'), ('B',), ('C',))]
    threads[0].start()
    assert gate.entered.wait(60)  # A's search has begun
    for thread in threads[1:]:
      thread.start()
    while server.batcher._queue.qsize() < 2:  # B and C wait behind it
      time.sleep(0.01)
    time.sleep(1)  # A's search lasts a second: the next may wait half of it (under batch_wait)
    gate.open.set()
    for thread in threads:
      thread.join(timeout=120)
  assert gate.searches == [1, 3]  # A, then B, C and A again as one search
  assert answers == {name: translator.translate(sentences) for name, sentences in asks.items()}


def test_a_kept_connection_is_answered_at_once(server, monkeypatch):
  # Each answer is two writes (headers, body): with Nagle's algorithm on, a client that keeps
  # its connection would wait for its delayed ACK (some 40 ms) before the body came.
  nodelay = []
  setup = serving._Handler.setup

  def spy(handler):
    setup(handler)
    nodelay.append(handler.connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
  monkeypatch.setattr(serving._Handler, 'setup', spy)
  connection = http.client.HTTPConnection(*server.server_address[:2], timeout=60)
  for _ in range(3):
    connection.request('POST', '/translate', json.dumps({'src': [LINES[0]]}))
    response = connection.getresponse()
    assert response.status == 200 and json.load(response)['translations']
  connection.close()
  assert len(nodelay) == 1 and nodelay[0]  # one connection for the three, without Nagle's delay


def test_a_request_waits_for_the_model_at_most_max_wait(translator):
  gate = _Gate(translator)
  with _serving(gate, max_wait=0.3) as server:
    first = threading.Thread(target=serving.translate, args=(server.url, ['a']),
                             kwargs={'timeout': 60})
    first.start()
    while server.batcher._queue.qsize() or not server.in_flight():
      time.sleep(0.01)
    request = urllib.request.Request(server.url + '/translate', data=b'{"src": ["b"]}')
    with pytest.raises(urllib.error.HTTPError) as error:
      urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=30)
    assert error.value.code == 503 and error.value.headers['Retry-After'] == '1'
    assert json.load(error.value)['error'].startswith('the model was busy for 0.3 s')
    gate.open.set()
    first.join(timeout=60)
  assert gate.searches == [1]  # the refused request was never searched


@pytest.mark.parametrize('method', ['PUT', 'DELETE', 'PATCH', 'BREW'])
def test_every_method_gets_the_protocols_json_error(server, method):
  answer = _raw(server, f'{method} /translate HTTP/1.1\r\nHost: x\r\n\r\n'.encode())
  head, body = answer.split(b'\r\n\r\n', 1)
  assert head.startswith(b'HTTP/1.1 405 ') and b'application/json' in head
  assert json.loads(body)['error'] == (f'no method {method}: POST /translate, POST /score, GET '
                                       '/health, or GET /.')


def test_a_request_refused_before_its_body_leaves_the_next_one_on_the_connection_whole(
    translator):
  """A POST answered before its body was read (warming up, no such page, no key) left the body
  in the connection, so a client that kept it (a retry after the 503) got 400 'Bad request
  syntax' for its next request: such an answer now closes the connection."""
  with serving.Server(translator, ('127.0.0.1', 0), api_key='k') as server:  # warming up
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
      for page, key, status in [('/translate', 'k', 503), ('/nothing', 'k', 404),
                                ('/translate', 'wrong', 401)]:
        connection = http.client.HTTPConnection(*server.server_address[:2], timeout=60)
        connection.request('POST', page, b'{"src": ["a"]}', {'Authorization': f'Bearer {key}'})
        response = connection.getresponse()
        assert (response.status, response.getheader('Connection')) == (status, 'close')
        response.read()
        connection.request('GET', '/health')  # (http.client opens a new connection for it)
        response = connection.getresponse()
        assert (response.status, json.load(response)) == (503, {'status': 'warming up'})
        connection.close()
    finally:
      server.shutdown()


def test_a_request_line_that_does_not_parse_is_answered_and_logged_as_it_came(server, caplog):
  """As a connection's first request it was a traceback in the log (the access line read the
  path of a request that never was) and no answer; after a request, that request's path."""
  caplog.set_level(logging.INFO, logger='jaxformer.serving')
  assert json.loads(_raw(server, b'garbage\r\n\r\n')) == {
      'error': "Bad request syntax ('garbage')."}
  answer = _raw(server, b'GET / HTTP/1.1\r\nHost: x\r\n\r\nnot a request\r\n\r\n')
  assert answer.startswith(b'HTTP/1.1 200 ')
  assert answer.endswith(b'{"error": "Bad request version (\'request\')."}')
  assert "'garbage' 400" in caplog.text and "'not a request' 400" in caplog.text
  assert 'Traceback' not in caplog.text and 'None' not in caplog.text


def test_text_that_is_not_unicode_and_sizes_over_the_caps_are_refused(translator):
  with _serving(translator, max_sentences=3, max_chars=20) as server:
    code, answer = _http(server.url + '/translate', b'{"src": ["ok", "bad \\ud800 text"]}')
    assert (code, answer['error']) == (400, 'bad request: src[1] is not valid text at '
                                            'character 4 (surrogates not allowed).')
    assert _http(server.url + '/translate', json.dumps({'src': ['a'] * 4}).encode()) == (
        413, {'error': '"src" has 4 sentences, more than the server takes at once (3): send '
                       'them in parts.'})
    assert _http(server.url + '/score', json.dumps({'src': ['a'], 'tgt': ['b' * 21]}).encode(
        )) == (413, {'error': 'tgt[0] has 21 characters, more than the server takes (20).'})


def test_a_failure_inside_the_model_is_a_500_not_the_clients_fault(translator, monkeypatch):
  with _serving(translator) as server:
    monkeypatch.setattr(type(translator), 'translate',
                        lambda *a, **k: (_ for _ in ()).throw(ValueError('inside')))
    assert _http(server.url + '/translate', b'{"src": ["a"]}') == (
        500, {'error': 'the server failed: ValueError: inside'})


def test_a_client_gone_mid_body_is_one_line_in_the_log(server, caplog):
  caplog.set_level(logging.INFO, logger='jaxformer.serving')
  with socket.create_connection(server.server_address[:2], timeout=10) as raw:
    raw.sendall(b'POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"src"')
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, 0))  # a reset
  deadline = time.monotonic() + 30
  while 'connection closed' not in caplog.text and time.monotonic() < deadline:
    time.sleep(0.05)
  assert 'connection closed (ConnectionResetError' in caplog.text
  assert 'Traceback' not in caplog.text


def test_a_silent_server_is_found_in_seconds_and_a_slow_answer_waits_its_timeout(
    translator, monkeypatch):
  """A server that accepts connections and answers nothing is found by the client's GET
  /health probe (client.PROBE_TIMEOUT), not after the request's --timeout; a server that
  answers its probe gets the request's whole --timeout, and past it, says so."""
  monkeypatch.setattr(client, 'PROBE_TIMEOUT', 0.5)
  with socket.socket() as silent:  # accepts connections (the backlog) and never answers
    silent.bind(('127.0.0.1', 0))
    silent.listen()
    url = f'http://127.0.0.1:{silent.getsockname()[1]}'
    start = time.monotonic()
    with pytest.raises(serving.ServerError, match=r'accepts connections but did not answer GET '
                       r'/health within 0\.5 s: is the server stopped or stuck\?'):
      serving.translate(url, ['a'], timeout=600)
    assert time.monotonic() - start < 30
  gate = _Gate(translator)
  with _serving(gate) as server:
    with pytest.raises(serving.ServerError, match=r'did not answer within 1 s \(--timeout\)'):
      serving.translate(server.url, ['a'], timeout=1)  # (its search waits at the gate)
    gate.open.set()


def test_a_key_guards_every_page_but_health(translator, tmp_path, monkeypatch, capsys):
  with serving.Server(translator, ('127.0.0.1', 0), api_key='s3cret') as server:
    server.state = 'ready'
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
      assert _http(server.url + '/health') == (200, {'status': 'ready'})
      code, answer = _http(server.url + '/translate', b'{"src": ["a"]}')
      assert code == 401 and answer['error'].startswith('the server needs its API key')
      with pytest.raises(serving.ServerError, match='needs its API key'):
        serving.translate(server.url, ['a'], api_key='wrong')
      assert serving.translate(server.url, ['a b'], api_key='s3cret') == translator.translate(
          ['a b'])
      (tmp_path / 'in.txt').write_text('a b\n')
      (tmp_path / 'key').write_text('s3cret\n')
      for how in (['--api-key-file', str(tmp_path / 'key')], []):
        monkeypatch.setenv('JAXFORMER_API_KEY', 's3cret' if not how else 'wrong')
        assert serving.client_main(['--server', server.url, '--input', str(tmp_path / 'in.txt'),
                                    *how]) == 0
        assert capsys.readouterr().out == translator.translate(['a b'])[0] + '\n'
    finally:
      server.shutdown()


def test_a_key_an_http_header_cannot_carry_is_refused_at_start(tmp_path, monkeypatch):
  """A non-ASCII key was accepted at start, then every request was 401 and the client said
  the server was not `jaxformer serve`: now the command and the client refuse it in one line,
  from the environment or a file."""
  key_file = tmp_path / 'key'
  key_file.write_text('clé-secrète\n', encoding='utf-8')
  said = 'the API key holds a character an HTTP header cannot carry (only printable ASCII'
  assert one_line_error('serve', '--model', str(tmp_path), '--api-key-file',
                        str(key_file)) == f'error: --api-key-file {key_file}: {said}: letters, ' \
      'digits, punctuation).'
  monkeypatch.setenv('JAXFORMER_API_KEY', 'tab\there')
  assert one_line_error('translate', '--server', 'http://127.0.0.1:9', '--input',
                        str(key_file)).startswith(f'error: JAXFORMER_API_KEY: {said}')


def test_serve_refuses_another_address_without_a_key(capsys, monkeypatch):
  monkeypatch.delenv('JAXFORMER_API_KEY', raising=False)
  assert cli.main(['serve', '--model', 'nowhere', '--host', '0.0.0.0']) == 1
  assert capsys.readouterr().err.strip() == (
      'error: --host 0.0.0.0 without an API key: anyone who reaches the port could use the '
      'server. Set JAXFORMER_API_KEY (or --api-key-file), or give --allow-no-key to serve it '
      'open.')


def test_health_says_warming_up_until_the_model_is_ready(translator):
  with serving.Server(translator, ('127.0.0.1', 0)) as server:
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
      assert _http(server.url + '/health') == (503, {'status': 'warming up'})
      assert _http(server.url + '/translate', b'{"src": ["a"]}') == (
          503, {'error': 'the server is warming up: retry shortly.'})
      server.ready()
      assert _http(server.url + '/health') == (200, {'status': 'ready'})
    finally:
      server.shutdown()


def test_the_client_waits_while_the_server_warms_up(translator, monkeypatch, capsys):
  """A script that starts a server and sends it work at once got 'the server is warming up:
  retry shortly' as the command's error: the client now asks /health again until it is ready
  (its waits here make the server ready), for at most --timeout."""
  with serving.Server(translator, ('127.0.0.1', 0)) as server:
    threading.Thread(target=server.serve_forever, daemon=True).start()
    waits = []
    monkeypatch.setattr(client.time, 'sleep', lambda s: waits.append(s) or server.ready())
    try:
      assert client.translate(server.url, LINES[:1]) == translator.translate(LINES[:1])
      assert waits == [client.WARMUP_POLL]
      assert capsys.readouterr().err == (f'{server.url} is warming up: waiting for it (at most '
                                         '600 s, --timeout)\n')
    finally:
      server.shutdown()
  with serving.Server(translator, ('127.0.0.1', 0)) as server:  # never ready: --timeout's bound
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
      with pytest.raises(client.ServerError, match='the server is warming up: retry shortly'):
        client.translate(server.url, LINES[:1], timeout=0.1)
    finally:
      server.shutdown()


def test_stopping_refuses_new_requests_and_lets_those_in_flight_finish(translator):
  gate = _Gate(translator)
  gate.open.set()  # (the warm-up's search)
  with socket.socket() as probe:  # a free port
    probe.bind(('127.0.0.1', 0))
    port = probe.getsockname()[1]
  stop, url = threading.Event(), f'http://127.0.0.1:{port}'
  server = threading.Thread(target=serving.serve, args=(lambda: (gate, {}), '127.0.0.1', port),
                            kwargs={'stop': stop, 'limits': ServerLimits(drain_timeout=60)})
  server.start()
  deadline = time.monotonic() + 120
  while time.monotonic() < deadline:
    with contextlib.suppress(OSError):
      if _http(url + '/health')[0] == 200:
        break
    time.sleep(0.05)
  gate.open.clear()
  gate.entered.clear()
  answer: list = []
  in_flight = threading.Thread(target=lambda: answer.append(serving.translate(url, ['a b'])))
  in_flight.start()
  assert gate.entered.wait(60)  # the request is being searched
  stop.set()
  while _http(url + '/health')[0] != 503:
    time.sleep(0.01)
  assert _http(url + '/health') == (503, {'status': 'stopping'})
  assert _http(url + '/translate', b'{"src": ["c"]}') == (
      503, {'error': 'the server is stopping: retry shortly.'})
  gate.open.set()  # the request in flight finishes, and then the server stops
  in_flight.join(timeout=60)
  server.join(timeout=60)
  assert answer == [translator.translate(['a b'])] and not server.is_alive()
