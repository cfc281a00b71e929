"""`jaxformer serve` under load: 1, 4, 16 and 64 clients at once sending one sentence each, and
a mixed load (one-sentence and 100-sentence requests), through real sockets on 127.0.0.1:
requests/s, sentences/s, p50 and p99 latency. The clients run in a process of their own
(serve_load.py) and keep their connections, as an HTTP library's session does; one row opens a
connection a request, as curl does. CTranslate2 on the same exported weights is served by the
same server code (serving.Server with its Batcher) in the same run, so that the ratio compares
the engines, not the HTTP. Beside them: jaxformer with --drop-finished; jaxformer serving the
16 clients one request a search (--max-batch 1); and each engine in-process given the sentences
one and 16 at a time (what gathering requests can gain at most).

  python experiments/bench --only serve --demo-model workdirs/demo/average-last5
"""

import contextlib
import json
import pathlib
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from jaxformer import checkpoint, data, export, protocol, serving
from jaxformer.config import DecodingConfig
from jaxformer.data import embedded
from jaxformer.settings import ServerLimits
from jaxformer.translation import Translator

CLIENTS = (1, 4, 16, 64)
REQUESTS = 1024  # one-sentence requests of each concurrency, shared among its clients
MIXED = {'one': (12, 16), 'hundred': (4, 2)}  # kind: (clients, requests each)


class CTranslate2Model:
  """CTranslate2's translator behind what serving.Server calls of a Translator (`run` of a
  translation request, `decoding`), with jaxformer's decoding limits: beam 4, alpha 0.6,
  input + 50."""

  def __init__(self, model_dir: pathlib.Path, tokenizer: data.Tokenizer, max_len: int):
    import ctranslate2  # pylint: disable=g-import-not-at-top  (an optional extra)
    self.engine = ctranslate2.Translator(str(model_dir), device='cpu', inter_threads=2,
                                         intra_threads=1)
    self.tokenizer, self.max_len, self.decoding = tokenizer, max_len, DecodingConfig()

  def run(self, request: protocol.TranslateRequest) -> list[str]:
    assert request.nbest is None and not request.settings and request.prefix is None, \
        'the benchmark sends plain translation requests only'
    tok, decoding = self.tokenizer, self.decoding
    pieces = [tok.pieces(ids[:self.max_len - 1] + [data.EOS_ID])
              for ids in tok.encode(request.src)]
    found = self.engine.translate_batch(
        pieces, max_batch_size=decoding.batch_size, beam_size=decoding.beam_size,
        length_penalty=decoding.alpha, min_decoding_length=0,
        max_decoding_length=min(max(map(len, pieces)) + decoding.extra_length, self.max_len),
        suppress_sequences=[tok.pieces([data.PAD_ID])])
    return tok.decode([tok.piece_ids(r.hypotheses[0]) for r in found])


@contextlib.contextmanager
def _served(model: Any, **limits: Any):
  with serving.Server(model, ('127.0.0.1', 0), limits=ServerLimits(**limits)) as server:
    server.ready()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
      yield server.url
    finally:
      server.shutdown()


def _load(url: str, clients: list[list[list[str]]], keep_alive: bool = True) -> dict[str, Any]:
  """serve_load.run in a process of its own (the clients do not share this one's lock)."""
  result = subprocess.run([sys.executable, str(pathlib.Path(__file__).with_name('serve_load.py'))],
                          input=json.dumps({'url': url, 'clients': clients,
                                            'keep_alive': keep_alive}),
                          capture_output=True, text=True, timeout=1800, check=False)
  if result.returncode:
    raise SystemExit(f'serve_load.py failed: {result.stderr.strip()[-500:]}')
  return json.loads(result.stdout)


def _one_sentence_clients(sentences: list[str], clients: int) -> list[list[list[str]]]:
  """REQUESTS one-sentence requests shared among `clients`."""
  per = REQUESTS // clients
  return [[[sentences[(c * per + i) % len(sentences)]] for i in range(per)]
          for c in range(clients)]


def _warm_up(url: str, sentences: list[str]) -> None:
  """Requests of every size the load sends, of short, middling and long sentences: the programs
  a long-running server has compiled (jaxformer) or a warm engine (CTranslate2)."""
  ordered = sorted(sentences, key=len)
  thirds = [ordered[i * len(ordered) // 3:] for i in range(3)]
  for part in thirds:
    for size in (1, 2, 4, 8, 16, 32, 64, 100):
      serving.translate(url, part[:size])
  serving.translate(url, sentences)


def _measure(url: str, sentences: list[str], compiled: Callable[[], int]) -> dict[str, Any]:
  """The loads' rates at `url`; `compiled()` counts the engine's compiled programs."""
  _warm_up(url, sentences)
  results = {f'{clients}_clients': _settled(url, _one_sentence_clients(sentences, clients),
                                            compiled) for clients in CLIENTS}
  results['16_clients_new_connections'] = _settled(url, _one_sentence_clients(sentences, 16),
                                                   compiled, keep_alive=False)
  one, hundred = MIXED['one'], MIXED['hundred']
  mixed = [[[sentences[(c * 16 + i) % len(sentences)]] for i in range(one[1])]
           for c in range(one[0])]
  mixed += [[sentences[i * 100:(i + 1) * 100] for i in range(hundred[1])]
            for _ in range(hundred[0])]
  results['mixed'] = _settled(url, mixed, compiled)
  return results


def _settled(url: str, clients: list[list[list[str]]], compiled: Callable[[], int],
             keep_alive: bool = True) -> dict[str, Any]:
  """A load's figures from its first pass that compiles nothing (at most 5 passes): merged
  batches vary in shape from run to run, and a long-running server, which has met them all,
  answers them without compiling."""
  for passes in range(1, 6):
    programs = compiled()
    result = {**_load(url, clients, keep_alive), 'passes': passes}
    if compiled() == programs:
      break
  return result


def _engine(model: Any, sentences: list[str], count: int = REQUESTS) -> dict[str, float]:
  """Sentences/s of the model itself, in this process, given `count` sentences one at a time
  and 16 at a time: what gathering 16 requests can gain at most."""
  rates, load = {}, [sentences[i % len(sentences)] for i in range(count)]
  for size in (1, 16):
    batches = [load[i:i + size] for i in range(0, count, size)]
    model.run(protocol.TranslateRequest(batches[0]))
    start = time.perf_counter()
    for batch in batches:
      model.run(protocol.TranslateRequest(batch))
    rates[f'{size}_at_a_time'] = round(count / (time.perf_counter() - start), 1)
  return rates


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
               'jaxformer_drop_finished': Translator(params, cfg, tokenizer, drop_finished=True),
               'ctranslate2': CTranslate2Model(model_dir, tokenizer, cfg.max_len)}
    programs = {name: lambda engine=engine: len(engine._search.compiled)  # pylint: disable=W0212
                for name, engine in engines.items() if name != 'ctranslate2'}
    programs['ctranslate2'] = lambda: 0  # (it compiles nothing)
    for name, model in engines.items():
      with _served(model) as url:
        results[name] = _measure(url, sentences, programs[name])
      results[name]['engine'] = _engine(model, sentences)
    with _served(engines['jaxformer'], max_batch=1) as url:  # one request a search
      results['jaxformer']['16_clients_one_request_at_a_time'] = _load(
          url, _one_sentence_clients(sentences, 16))
  ours, theirs = results['jaxformer'], results['ctranslate2']

  def rate(engine: dict[str, Any], case: str) -> float:
    return engine[case]['sentences_per_s']
  results['jaxformer_16_over_1_clients'] = round(rate(ours, '16_clients')
                                                 / rate(ours, '1_clients'), 2)
  results['jaxformer_16_clients_batched_over_one_request_at_a_time'] = round(
      rate(ours, '16_clients') / rate(ours, '16_clients_one_request_at_a_time'), 2)
  results['engine_16_over_1_at_a_time'] = {
      name: round(results[name]['engine']['16_at_a_time']
                  / results[name]['engine']['1_at_a_time'], 2) for name in engines}
  results['ratio_to_ctranslate2'] = {case: round(rate(ours, case) / rate(theirs, case), 3)
                                     for case in theirs if case != 'engine'}
  results['ratio_to_ctranslate2']['engine_16_at_a_time'] = round(
      ours['engine']['16_at_a_time'] / theirs['engine']['16_at_a_time'], 3)
  dropping = results['jaxformer_drop_finished']
  results['drop_finished_ratio_to_ctranslate2'] = {
      case: round(rate(dropping, case) / rate(theirs, case), 3)
      for case in theirs if case != 'engine'}
  return results
