"""`jaxformer serve` under load: 1, 4, 16 and 64 clients at once sending one sentence each, and
a mixed load (one-sentence and 100-sentence requests), through real sockets on 127.0.0.1:
requests/s, sentences/s, p50 and p99 latency. CTranslate2 on the same exported weights is
served by the same server code (serving.Server with its Batcher) in the same run, so that
the ratio compares the engines, not the HTTP.

  python experiments/bench --only serve --demo-model workdirs/demo/average-last5
"""

import concurrent.futures
import contextlib
import pathlib
import statistics
import tempfile
import threading
import time
from typing import Any

from jaxformer import checkpoint, data, export, serving
from jaxformer.config import DecodingConfig
from jaxformer.data import embedded
from jaxformer.translation import Translator

CLIENTS = (1, 4, 16, 64)
REQUESTS = 256  # one-sentence requests of each concurrency, shared among its clients
MIXED = {'one': (12, 16), 'hundred': (4, 2)}  # kind: (clients, requests each)


class CTranslate2Model:
  """CTranslate2's translator behind what serving.Server calls of a Translator (translate,
  replace, decoding), with jaxformer's decoding limits: beam 4, alpha 0.6, input + 50."""

  def __init__(self, model_dir: pathlib.Path, tokenizer: data.Tokenizer, max_len: int):
    import ctranslate2  # pylint: disable=g-import-not-at-top  (an optional extra)
    self.engine = ctranslate2.Translator(str(model_dir), device='cpu', inter_threads=2,
                                         intra_threads=1)
    self.tokenizer, self.max_len, self.decoding = tokenizer, max_len, DecodingConfig()

  def replace(self, **settings: Any) -> 'CTranslate2Model':
    assert not settings, 'the benchmark sends the default settings only'
    return self

  def translate(self, sentences: list[str], progress: bool = False, **unused: Any) -> list[str]:
    tok, decoding = self.tokenizer, self.decoding
    pieces = [tok.pieces(ids[:self.max_len - 1] + [data.EOS_ID]) for ids in tok.encode(sentences)]
    found = self.engine.translate_batch(
        pieces, max_batch_size=decoding.batch_size, beam_size=decoding.beam_size,
        length_penalty=decoding.alpha, min_decoding_length=0,
        max_decoding_length=min(max(map(len, pieces)) + decoding.extra_length, self.max_len),
        suppress_sequences=[tok.pieces([data.PAD_ID])])
    return tok.decode([tok.piece_ids(r.hypotheses[0]) for r in found])


@contextlib.contextmanager
def _served(model: Any):
  with serving.Server(model, ('127.0.0.1', 0)) as server:
    server.state = 'ready'
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
      yield server.url
    finally:
      server.shutdown()


def _load(url: str, batches: list[list[list[str]]]) -> dict[str, Any]:
  """Each client (a list of requests, each a list of sentences) sends its requests one after
  another, all clients at once: the rates and the latencies."""
  latencies: list[float] = []

  def client(requests: list[list[str]]) -> None:
    for sentences in requests:
      start = time.perf_counter()
      serving.translate(url, sentences, timeout=600)
      latencies.append(time.perf_counter() - start)
  start = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(len(batches)) as pool:
    list(pool.map(client, batches))
  seconds = time.perf_counter() - start
  ordered = sorted(latencies)
  sentences = sum(len(r) for requests in batches for r in requests)
  return {'clients': len(batches), 'requests': len(ordered), 'sentences': sentences,
          'seconds': round(seconds, 3), 'requests_per_s': round(len(ordered) / seconds, 1),
          'sentences_per_s': round(sentences / seconds, 1),
          'p50_s': round(statistics.median(ordered), 4),
          'p99_s': round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 4)}


def _warm_up(url: str, sentences: list[str]) -> None:
  """Requests of every size the load sends, of short, middling and long sentences: the programs
  a long-running server has compiled (jaxformer) or a warm engine (CTranslate2)."""
  ordered = sorted(sentences, key=len)
  thirds = [ordered[i * len(ordered) // 3:] for i in range(3)]
  for part in thirds:
    for size in (1, 2, 4, 8, 16, 32, 64, 100):
      serving.translate(url, part[:size])
  serving.translate(url, sentences)


def _measure(url: str, sentences: list[str]) -> dict[str, Any]:
  _warm_up(url, sentences)
  results = {}
  for clients in CLIENTS:
    per = REQUESTS // clients
    results[f'{clients}_clients'] = _load(url, [[[sentences[(c * per + i) % len(sentences)]]
                                                 for i in range(per)] for c in range(clients)])
  one, hundred = MIXED['one'], MIXED['hundred']
  batches = [[[sentences[(c * 16 + i) % len(sentences)]] for i in range(one[1])]
             for c in range(one[0])]
  batches += [[sentences[i * 100:(i + 1) * 100] for i in range(hundred[1])]
              for _ in range(hundred[0])]
  results['mixed'] = _load(url, batches)
  return results


def run(demo_model: str | None = None) -> dict:
  if not demo_model:
    raise SystemExit('--only serve needs --demo-model (make demo makes one)')
  sentences = embedded.splits(10, 10, 512)['test'].src
  params, cfg, spm_model, _ = checkpoint.load(demo_model)
  tokenizer = data.Tokenizer.from_bytes(spm_model)
  results: dict[str, Any] = {'model': demo_model, 'requests_per_concurrency': REQUESTS,
                             'mixed': {k: {'clients': c, 'requests_each': r,
                                           'sentences_each': 1 if k == 'one' else 100}
                                       for k, (c, r) in MIXED.items()}}
  with tempfile.TemporaryDirectory() as tmp:
    model_dir = export.save_ctranslate2(pathlib.Path(tmp, 'ct2'), params, cfg, spm_model)
    engines = {'jaxformer': Translator(params, cfg, tokenizer),
               'ctranslate2': CTranslate2Model(model_dir, tokenizer, cfg.max_len)}
    for name, model in engines.items():
      with _served(model) as url:
        results[name] = _measure(url, sentences)
  ours, theirs = results['jaxformer'], results['ctranslate2']
  results['jaxformer_16_over_1_clients'] = round(
      ours['16_clients']['sentences_per_s'] / ours['1_clients']['sentences_per_s'], 2)
  results['ratio_to_ctranslate2'] = {
      case: round(ours[case]['sentences_per_s'] / theirs[case]['sentences_per_s'], 3)
      for case in ours}
  return results
