"""jaxformer.cache: cached decoding equals full decoding; reordered beams keep their histories."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from helpers import apply, init_params, uncached_decoding

from jaxformer import cache as cache_lib
from jaxformer import config as config_lib
from jaxformer import decode, search
from jaxformer.model import Transformer


def test_incremental_decoding_matches_full_decoding(tiny_model):
  model, params = tiny_model
  variables = {'params': params}
  src = jnp.array([[5, 9, 3, 7, 2], [8, 4, 0, 0, 0]])
  tgt = jnp.array([[0, 4, 8, 6, 11, 13], [0, 7, 7, 2, 9, 1]])
  full = apply(model, variables, src, tgt)
  encoded = apply(model, variables, src, method=Transformer.encode)
  cache = model.apply(variables, encoded, 8, method=Transformer.init_cache)
  step = jax.jit(lambda token, cache: model.apply(
      variables, src, token, cache, method=Transformer.decode_step))
  for t in range(tgt.shape[1]):
    logits, cache = step(tgt[:, t:t + 1], cache)
    np.testing.assert_allclose(logits, full[:, t], atol=1e-5, err_msg=f'step {t}')
  assert int(cache['index']) == tgt.shape[1]


def test_windowed_incremental_decoding_matches_full_decoding():
  cfg = config_lib.tiny(vocab_size=32).replace(attention_window=2)
  params = init_params(cfg)
  model, variables = Transformer(cfg), {'params': params}
  src, tgt = jnp.arange(3, 10)[None], jnp.array([[0, 5, 9, 4, 7, 2, 8]])
  full = apply(model, variables, src, tgt)
  encoded = apply(model, variables, src, method=Transformer.encode)
  cache = model.apply(variables, encoded, 8, method=Transformer.init_cache)
  for t in range(tgt.shape[1]):
    logits, cache = apply(model, variables, src, tgt[:, t:t + 1], cache,
                          method=Transformer.decode_step)
    np.testing.assert_allclose(logits, full[:, t], atol=1e-5)


def test_cached_and_uncached_steps_give_the_same_logits(translator):
  model, params = Transformer(translator.config), translator.params
  src = jnp.array([[5, 9, 13, 1, 0, 0], [7, 8, 1, 0, 0, 0]])
  encoded = apply(model, {'params': params}, src, method=Transformer.encode)
  cached = jax.jit(search.cached_tokens_to_logits(model, params, src))
  uncached = jax.jit(uncached_decoding.tokens_to_logits(model, params, src, encoded))
  c_cache = model.apply({'params': params}, encoded, 8, method=Transformer.init_cache)
  u_cache = {'tokens': jnp.zeros((2, 8), jnp.int32), 'index': jnp.array(0)}
  for token in ([0, 0], [17, 4], [33, 33], [9, 200]):
    tokens = jnp.array(token)[:, None]
    c_logits, c_cache = cached(tokens, c_cache)
    u_logits, u_cache = uncached(tokens, u_cache)
    np.testing.assert_allclose(c_logits, u_logits, atol=1e-5)


def test_reordered_beams_attend_to_their_own_histories(translator):
  """Beam search reorders only the cache's slot map: after any choice of parents (a swap, one
  parent twice), each hypothesis's logits are those of its own token history."""
  model, params, beams = Transformer(translator.config), translator.params, 3
  src = jnp.array([[5, 9, 13, 1, 0, 0], [7, 8, 1, 0, 0, 0]])
  encoded = apply(model, {'params': params}, src, method=Transformer.encode)
  cache = model.apply({'params': params}, encoded, 8, beams, method=Transformer.init_cache)
  per_hypothesis = [x for x in jax.tree.leaves(cache) if x.ndim and x.shape[0] == 2 * beams]
  assert [x.shape for x in per_hypothesis] == [(2 * beams, 8)]  # only the slot map is reordered
  cached = jax.jit(search.cached_tokens_to_logits(model, params, src))
  uncached = jax.jit(uncached_decoding.tokens_to_logits(
      model, params, jnp.repeat(src, beams, axis=0), jnp.repeat(encoded, beams, axis=0)))
  history = jnp.zeros((2 * beams, 0), jnp.int32)
  tokens = jnp.zeros((2 * beams, 1), jnp.int32)
  for step, parents in enumerate([[[0, 0, 0], [0, 0, 0]], [[2, 0, 1], [1, 1, 2]],
                                  [[1, 1, 0], [2, 0, 2]], [[0, 2, 1], [0, 1, 1]]]):
    if step:  # choose parents as decode.beam_search does, then the next tokens
      parents = jnp.array(parents)
      cache = cache_lib.reorder(cache, (parents + jnp.arange(2)[:, None] * beams).reshape(-1))
      history = decode._flatten(decode._gather(decode._unflatten(history, beams), parents))
      tokens = jnp.arange(2 * beams)[:, None] * 7 + 10 + step
    history = jnp.concatenate([history, tokens], axis=1)
    logits, cache = cached(tokens, cache)
    expected, _ = uncached(tokens, {'tokens': jnp.pad(history, ((0, 0), (0, 8 - step - 1))),
                                    'index': jnp.array(step)})
    np.testing.assert_allclose(logits, expected, atol=1e-5, err_msg=f'step {step}')


def test_a_first_step_once_a_sentence_expands_to_the_beams_cache(translator):
  """The first decoder step at one row a sentence, then `expand`, holds what the same step at
  every beam's row writes (each beam's keys/values in its own slot), and the beams' next
  steps, after any choice of parents, give the same logits from either cache."""
  model, params, beams = Transformer(translator.config), translator.params, 3
  src = jnp.array([[5, 9, 13, 1, 0, 0], [7, 8, 1, 0, 0, 0]])
  encoded = apply(model, {'params': params}, src, method=Transformer.encode)
  cached = jax.jit(search.cached_tokens_to_logits(model, params, src))
  init = functools.partial(model.apply, {'params': params}, encoded, 8,
                           method=Transformer.init_cache)
  once_logits, once = cached(jnp.zeros((2, 1), jnp.int32), init(1))
  every_logits, every = cached(jnp.zeros((2 * beams, 1), jnp.int32), init(beams))
  np.testing.assert_allclose(jnp.repeat(once_logits, beams, axis=0), every_logits, atol=1e-6)
  expanded = cache_lib.expand(once, beams)
  assert int(expanded['index']) == 1
  np.testing.assert_array_equal(expanded['slots'], every['slots'])
  for ours, theirs in zip(jax.tree.leaves(expanded['layers']), jax.tree.leaves(every['layers'])):
    np.testing.assert_allclose(ours, theirs, atol=1e-6)
  parents = jnp.array([2, 0, 0, 4, 5, 3])  # each sentence's beams, any of them
  tokens = jnp.arange(2 * beams)[:, None] + 20
  ours, _ = cached(tokens, cache_lib.reorder(expanded, parents))
  theirs, _ = cached(tokens, cache_lib.reorder(every, parents))
  np.testing.assert_allclose(ours, theirs, atol=1e-5)
