"""The serve bench's clients, in a process of their own so that they do not share the server's
interpreter lock: each client sends its requests one after another (the next once the last is
answered), all clients at once. Standard library only (it imports neither jax nor jaxformer).

  python experiments/bench/serve_load.py < load.json > result.json

load.json: {"url": "http://127.0.0.1:PORT", "clients": [[[sentence, ...], ...], ...] (each
client's requests, each its sentences), "keep_alive": true}. With keep_alive, a client keeps
one connection for all its requests (as an HTTP library's session does); without, it opens one
a request (as curl does). Exits 1, saying why, at the first answer that is not a translation
of each of its sentences.
"""

import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse
from typing import Any


def run(url: str, clients: list[list[list[str]]], keep_alive: bool = True) -> dict[str, Any]:
  """Requests/s, sentences/s and the latencies' p50 and p99 of `clients` sending at once."""
  address = urllib.parse.urlsplit(url)
  latencies: list[float] = []
  failures: list[str] = []
  ready = threading.Barrier(len(clients) + 1)

  def client(requests: list[list[str]]) -> None:
    connection = None
    ready.wait()
    try:
      for sentences in requests:
        start = time.perf_counter()
        if connection is None:
          connection = http.client.HTTPConnection(address.hostname, address.port, timeout=600)
        connection.request('POST', '/translate', json.dumps({'src': sentences}),
                           {'Content-Type': 'application/json'})
        response = connection.getresponse()
        answer = json.load(response)
        if response.status != 200 or len(answer.get('translations', ())) != len(sentences):
          raise ValueError(f'HTTP {response.status}: {answer}')
        latencies.append(time.perf_counter() - start)
        if not keep_alive:
          connection.close()
          connection = None
    except (OSError, ValueError, http.client.HTTPException) as e:
      failures.append(f'{type(e).__name__}: {e}')
    finally:
      if connection is not None:
        connection.close()

  threads = [threading.Thread(target=client, args=(requests,)) for requests in clients]
  for thread in threads:
    thread.start()
  ready.wait()
  start = time.perf_counter()
  for thread in threads:
    thread.join()
  seconds = time.perf_counter() - start
  if failures:
    raise SystemExit(f'{len(failures)} client(s) failed; the first: {failures[0]}')
  ordered = sorted(latencies)
  sentences = sum(len(r) for requests in clients for r in requests)
  return {'clients': len(clients), 'keep_alive': keep_alive, 'requests': len(ordered),
          'sentences': sentences, 'seconds': round(seconds, 3),
          'requests_per_s': round(len(ordered) / seconds, 1),
          'sentences_per_s': round(sentences / seconds, 1),
          'p50_s': round(statistics.median(ordered), 4),
          'p99_s': round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 4)}


if __name__ == '__main__':
  load = json.load(sys.stdin)
  json.dump(run(load['url'], load['clients'], load.get('keep_alive', True)), sys.stdout)
