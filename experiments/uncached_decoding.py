"""Decoding without a cache: every step runs the decoder again over the whole prefix. The
reference the cached search is checked against (the tests, gpu_check.py) and timed against
(bench --only decode); nothing in jaxformer uses it.

  from uncached_decoding import decode_batch      (experiments/ on sys.path)
"""

from typing import Any

import jax
import jax.numpy as jnp

from jaxformer import decode, search
from jaxformer.config import DecodingConfig, TransformerConfig
from jaxformer.model import Transformer

Array = jax.Array


def tokens_to_logits(model: Transformer, params: Any, src: Array, encoded: Array
                     ) -> decode.TokensToLogits:
  """search.cached_tokens_to_logits's scores without a cache: its cache is the prefix
  buffer {'tokens' [N, L], 'index'}, and each step reruns the decoder over all of it."""
  def fn(tokens, cache):
    buffer = cache['tokens'].at[:, cache['index']].set(tokens[:, 0])
    logits = model.apply({'params': params}, encoded, src, buffer, method=Transformer.decode)
    return logits[:, cache['index']], {'tokens': buffer, 'index': cache['index'] + 1}
  return fn


def decode_batch(params: Any, batch: search.Batch, *, config: TransformerConfig, max_len: int,
                 decoding: DecodingConfig = DecodingConfig()) -> tuple[Array, Array]:
  """search.decode_batch's (ids [B, max_len], scores [B]) (greedy when beam_size is 1, its
  scores zeros; beam search), uncached: each hypothesis holds its own copy of the source and
  its prefix, reordered with its beam."""
  src, max_lengths, prefix = batch.src, batch.max_lengths, batch.prefix
  beam_size = decoding.beam_size
  model = Transformer(config)
  encoded = model.apply({'params': params}, src, method=Transformer.encode)  # [B, S, D]
  src, encoded = (jnp.repeat(x, beam_size, axis=0) for x in (src, encoded))  # beams adjacent
  cache = {'tokens': jnp.zeros((src.shape[0], max_len), jnp.int32), 'index': jnp.array(0)}
  step = tokens_to_logits(model, params, src, encoded)
  if beam_size == 1:
    ids = decode.greedy_search(step, cache, max_lengths, max_len, prefix=prefix)
    return ids, jnp.zeros(ids.shape[0], jnp.float32)
  return decode.beam_search(step, cache, max_lengths, max_len, beam_size=beam_size,
                            alpha=decoding.alpha, prefix=prefix)
