"""Translating text with a trained model: the search glue between the Transformer and the
model-agnostic decode module, and `Translator` (batches, length buckets, n-best, loading from a
checkpoint or an exported folder). Decoding follows §6.1: beam 4, alpha 0.6, at most the
source length + 50 tokens.
"""

import concurrent.futures
import functools
import logging
import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

from jaxformer import cache as cache_lib
from jaxformer import checkpoint, decode, export
from jaxformer import config as config_lib
from jaxformer.config import TransformerConfig
from jaxformer.data.tokenizer import EOS_ID, Tokenizer
from jaxformer.model import Transformer

Array = jax.Array
log = logging.getLogger(__name__)


# --- search glue: tokens_to_logits over the Transformer ------------------------------------------


def cached_tokens_to_logits(model: Transformer, params: Any, src: Array
                            ) -> decode.TokensToLogits:
  """One decoder step per call over the key/value cache of `Transformer.init_cache`."""
  def fn(tokens, cache):
    return model.apply({'params': params}, src, tokens, cache, method=Transformer.decode_step)
  return fn


def decode_batch(params: Any, src: Array, max_lengths: Array, *, config: TransformerConfig,
           max_len: int, beam_size: int, alpha: float,
           num_results: int | None = None) -> Array | tuple[Array, Array]:
  """Encodes src [B, S] once and decodes [B, max_len] ids (greedy when beam_size is 1); with
  num_results=n, the n best of the beam search and their scores ([B, n, max_len], [B, n]).
  The beams of a sentence share its encoder keys/values; the cache grows in stages."""
  model = Transformer(config)
  encoded = model.apply({'params': params}, src, method=Transformer.encode)  # [B, S, D]
  cache = model.apply({'params': params}, encoded, decode.stage_lengths(max_len)[0], beam_size,
                      method=Transformer.init_cache)
  step = cached_tokens_to_logits(model, params, src)
  if beam_size == 1 and num_results is None:
    return decode.greedy_search(step, cache, max_lengths, max_len, grow_cache=cache_lib.grow)
  found = decode.beam_search(step, cache, max_lengths, max_len, beam_size=beam_size,
                             alpha=alpha, num_results=num_results, grow_cache=cache_lib.grow,
                             reorder_cache=cache_lib.reorder)
  return found if num_results else found[0]


def _bucket(length: int) -> int:
  """Source lengths are padded to powers of two (at least 8): few compiled programs."""
  return max(8, 1 << (length - 1).bit_length())


@functools.lru_cache(maxsize=8)
def _jitted_search(config: TransformerConfig, beam_size: int, alpha: float) -> Any:
  """decode_batch jitted for one model shape and search, made once per process: Translators of
  equal configs (a run's evaluations, a second run) reuse its compiled programs."""
  return jax.jit(functools.partial(decode_batch, config=config, beam_size=beam_size,
                                   alpha=alpha), static_argnames=('max_len', 'num_results'))


MAX_WORKERS = 8  # each batch in flight holds a decoding cache of its own: memory grows with them


def default_workers() -> int:
  """Batches searched side by side: on CPU one per core this process may use, at most
  MAX_WORKERS, since XLA:CPU runs a small model's search on little more than one core
  (measured in docs/benchmarks-log.md); elsewhere one, as an accelerator runs one program at a
  time."""
  if jax.default_backend() != 'cpu':
    return 1
  cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()
  return min(cores or 1, MAX_WORKERS)


class Translator:
  """Translates text with a model and its sentencepiece vocabulary, by the paper's settings:
  beam 4, alpha 0.6, at most (source length + 50) tokens. Batches of `batch_size` sentences are
  searched by `workers` threads side by side (default_workers()); outputs keep the inputs'
  order whatever the workers."""

  def __init__(self, params: Any, config: TransformerConfig, tokenizer: Tokenizer, *,
               beam_size: int = 4, alpha: float = 0.6, extra_length: int = 50,
               batch_size: int = 32, workers: int | None = None):
    self.params, self.config, self.tokenizer = params, config, tokenizer
    self.beam_size, self.alpha, self.extra_length = beam_size, alpha, extra_length
    self.batch_size = batch_size
    config_lib.check_decoding(beam_size=beam_size, alpha=alpha, extra_length=extra_length,
                              batch_size=batch_size, workers=workers)
    self.workers = default_workers() if workers is None else workers
    self._search = _jitted_search(config, beam_size, alpha)

  @classmethod
  def from_checkpoint(cls, path: str, average_last: int | None = None,
                      **kwargs: Any) -> 'Translator':
    """From a workdir, its checkpoints folder or an averaged checkpoint; with average_last,
    the mean of the workdir's last N checkpoints."""
    params, config, spm_model, _ = checkpoint.load(path, average_last)
    return cls(params, config, Tokenizer.from_bytes(spm_model), **kwargs)

  @classmethod
  def from_pretrained(cls, path: str, **kwargs: Any) -> 'Translator':
    """From a folder written by `jaxformer export` (config.json, spm.model, safetensors)."""
    params, config, spm_model, _ = export.load(path)
    return cls(params, config, Tokenizer.from_bytes(spm_model, f'{path}/spm.model'), **kwargs)

  def translate(self, sentences: Sequence[str], progress: bool = False) -> list[str]:
    """One output line per input line; blank inputs give empty outputs without decoding.

    A source longer than the model's max_len (with its EOS) is cut to that length, with a
    warning naming the lines (0-based indices); outputs stop at max_len tokens as well.
    """
    return self.tokenizer.decode(self.translate_ids(sentences, progress))

  def translate_ids(self, sentences: Sequence[str], progress: bool = False) -> list[list[int]]:
    """As translate, but the output pieces' ids (without EOS; [] for a blank input)."""
    out: list[list[int]] = [[] for _ in sentences]
    for chosen, ids, _ in self._batches(sentences, progress, None):
      for i, row in zip(chosen, ids):
        out[i] = [int(t) for t in row[:np.argmax(np.append(row, 0) <= EOS_ID)]]
    return out

  def translate_nbest(self, sentences: Sequence[str], n: int, progress: bool = False
                      ) -> list[list[tuple[str, float]]]:
    """The n best translations of each sentence with their scores (log-probability / GNMT
    length penalty), best first; [] for a blank sentence. Needs n <= beam_size."""
    if not 1 <= n <= self.beam_size:
      raise ValueError(f'n-best needs 1 <= n <= the beam size ({self.beam_size}), got {n}.')
    out: list[list[tuple[str, float]]] = [[] for _ in sentences]
    for chosen, ids, scores in self._batches(sentences, progress, n):
      texts = self.tokenizer.decode(ids.reshape(-1, ids.shape[-1]))
      for row, i in enumerate(chosen):
        out[i] = list(zip(texts[row * n:(row + 1) * n], map(float, scores[row])))
    return out

  def _batches(self, sentences: Sequence[str], progress: bool, num_results: int | None):
    """(indices, ids, scores or None) per decoded batch, longest sources first (the longest
    searches start first, so that workers finish together)."""
    ids = self.tokenizer.encode(sentences)
    limit = self.config.max_len - 1  # pieces, leaving room for EOS
    cut = [i for i, x in enumerate(ids) if len(x) > limit]
    if cut:
      log.warning('%d source(s) longer than the model\'s %d tokens were cut to that length '
                  '(indices %s%s).', len(cut), self.config.max_len,
                  ', '.join(map(str, cut[:10])), ', ...' if len(cut) > 10 else '')
      for i in cut:
        ids[i] = ids[i][:limit]
    todo = sorted((i for i, x in enumerate(ids) if x), key=lambda i: -len(ids[i]))
    groups = [todo[start:start + self.batch_size] for start in range(0, len(todo),
                                                                      self.batch_size)]

    def search(chosen: list[int]) -> tuple[np.ndarray, np.ndarray | None]:
      rows = [ids[i] + [EOS_ID] for i in chosen]
      width = min(_bucket(max(map(len, rows))), self.config.max_len)
      src = np.zeros((self.batch_size, width), np.int32)  # a fixed batch: one compile per width
      for r, row in enumerate(rows):
        src[r, :len(row)] = row
      max_lengths = np.zeros(self.batch_size, np.int32)
      max_lengths[:len(rows)] = [len(row) + self.extra_length for row in rows]
      max_len = min(width + self.extra_length, self.config.max_len)
      result = jax.device_get(self._search(self.params, src, np.minimum(max_lengths, max_len),
                                           max_len=max_len, num_results=num_results))
      if num_results is None:
        return result[:len(rows)], None
      return result[0][:len(rows)], result[1][:len(rows)]

    workers = min(self.workers, len(groups))
    pool = concurrent.futures.ThreadPoolExecutor(workers) if workers > 1 else None
    try:
      results = pool.map(search, groups) if pool else map(search, groups)
      with tqdm(total=len(todo), desc='translating', unit='sent', disable=not progress) as bar:
        for chosen, (found, scores) in zip(groups, results):
          yield chosen, found, scores
          bar.update(len(chosen))
    finally:  # an error, or a caller that stops early: no batch is started after it
      if pool:
        pool.shutdown(cancel_futures=True)
