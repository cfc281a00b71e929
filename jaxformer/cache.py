"""The key/value cache of incremental decoding and its slot layout, documented once here::

    {'index':  int32 []          the next target position;
     'slots':  int32 [N, T]      per hypothesis, the slot holding each position of its history;
     'layers': [{'self':  {'k': [B, H, K, T * W], 'v': [B, H, T * W, J]},
                 'cross': {'k': [B, H, K, S],     'v': [B, H, S, J]}}, ...]}   one per layer

B sentences, W hypotheses per sentence (beams, adjacent: N = B * W; as in jaxformer.decode),
T target positions, S source positions (as in jaxformer.model, whose key length L is T * W
here); keys and values in `MultiHeadAttention.project_kv`'s layout.

Beam search never copies the self-attention keys/values. Each sentence has W slots of T
positions, stored position-major (position l of slot s at entry l * W + s). At step t,
hypothesis s of a sentence writes its keys/values at position t of slot s (`write`), and
`slots` says, per hypothesis, which slot holds each position of its history. When beams are
chosen, only `slots` is reordered (`reorder`), and each query attends to all its sentence's
slots through a mask that keeps its own history (`self_attention_mask`): W times the attention
products of one history, instead of copying every layer's cache at every step. The
encoder-decoder keys/values are computed once per sentence and shared by its hypotheses.
"""

from typing import Any

import jax
import jax.numpy as jnp

from jaxformer import decode
from jaxformer.config import TransformerConfig

Array = jax.Array
Cache = dict[str, Any]
POSITION_AXIS = {'k': -1, 'v': -2}  # of the self-attention keys [.., T * W], values [.., T * W, J]


def init(config: TransformerConfig, cross: list[dict[str, Array]], max_len: int,
         beams: int = 1) -> Cache:
  """An empty cache for `beams` hypotheses per sentence and max_len positions, given each
  layer's encoder-decoder keys/values [B, ...] (computed once per sentence)."""
  batch, length = cross[0]['k'].shape[0], max_len * beams
  dtype = config.execution.dtype
  empty = {'k': jnp.zeros((batch, config.num_heads, config.key_dim, length), dtype),
           'v': jnp.zeros((batch, config.num_heads, length, config.value_dim), dtype)}
  return {'index': jnp.array(0, jnp.int32),
          'slots': jnp.zeros((batch * beams, max_len), jnp.int32),
          'layers': [{'self': empty, 'cross': kv} for kv in cross]}


def expand(cache: Cache, beams: int) -> Cache:
  """A cache of one hypothesis per sentence (`init`'s beams=1) as one of `beams` per sentence,
  each beam with the history the one had, in a slot of its own: what the beams' caches would
  hold had each decoded that history (beam search's first step, before which a sentence's beams
  are alike, is decoded once a sentence: jaxformer.decode.Beam.first_step)."""
  index, (sentences, max_len) = cache['index'], cache['slots'].shape
  own = jnp.arange(sentences * beams) % beams  # each hypothesis's slot
  slots = jnp.where(jnp.arange(max_len) < index, own[:, None], 0)
  return {**cache, 'slots': slots,
          'layers': [{**layer, 'self': {name: jnp.repeat(x, beams, axis=POSITION_AXIS[name])
                                        for name, x in layer['self'].items()}}
                     for layer in cache['layers']]}


def beams(cache: Cache) -> int:
  """W: the hypotheses per sentence the cache was made for."""
  return cache['slots'].shape[0] // cache['layers'][0]['cross']['k'].shape[0]


def by_sentence(queries: Array, sentences: int) -> Array:
  """Queries [N, T, ...] of N = B * W hypotheses as [B, W * T, ...]: a sentence's W beams
  attend to the keys/values it shares (its slots, or its encoder output) as one sequence of
  W * T queries, which the mask of `self_attention_mask` keeps to each one's own history.
  With W = 1 (training, greedy search) it changes nothing."""
  return queries.reshape(sentences, -1, *queries.shape[2:])


def self_attention_mask(cache: Cache, window: int | None) -> tuple[Array, Cache]:
  """(mask [B, 1, W, T * W] of the keys each hypothesis's new query sees, the cache with this
  position recorded in each hypothesis's own slot). A query sees the positions of its own
  history up to `index` (within +-window of it for restricted self-attention)."""
  index, (hypotheses, max_len), w = cache['index'], cache['slots'].shape, beams(cache)
  slots = jax.lax.dynamic_update_slice_in_dim(
      cache['slots'], (jnp.arange(hypotheses) % w)[:, None], index, axis=1)
  positions = jnp.arange(max_len)  # [T]
  visible = positions <= index
  if window is not None:
    visible &= jnp.abs(index - positions) <= window
  own = visible[None, :, None] & (slots[:, :, None] == jnp.arange(w))  # [N, T, W]
  return own.reshape(hypotheses // w, 1, w, max_len * w), {**cache, 'slots': slots}


def write(layer: dict[str, Any], new: dict[str, Array], index: Array) -> dict[str, Any]:
  """A layer's cache with the new self-attention keys/values of position `index` (from N = B * W
  hypotheses) written in place: hypothesis b * W + s into slot s of sentence b."""
  w = new['v'].shape[0] // layer['cross']['v'].shape[0]
  def put(cache: Array, x: Array, axis: int) -> Array:
    axis = cache.ndim + axis
    x = jnp.moveaxis(x.reshape(-1, w, *x.shape[1:]), 1, axis + 1)  # [..., 1, W, ...]
    x = x.reshape(*cache.shape[:axis], w, *cache.shape[axis + 1:])
    return jax.lax.dynamic_update_slice_in_dim(cache, x, index * w, axis=axis)
  return {**layer, 'self': {name: put(layer['self'][name], x, POSITION_AXIS[name])
                            for name, x in new.items()}}


def advance(cache: Cache, layers: list[dict[str, Any]]) -> Cache:
  """The cache after a step: the layers' new caches, the next position."""
  return {**cache, 'index': cache['index'] + 1, 'layers': layers}


def grow(cache: Cache, max_len: int) -> Cache:
  """`cache` with room for max_len target positions: its self-attention keys/values and its
  slots padded with zeros after the positions they have."""
  def pad(x: Array, axis: int) -> Array:  # T * W entries along `axis` -> max_len * W
    w = x.shape[axis] // cache['slots'].shape[1]
    return jnp.pad(x, [(0, (max_len - cache['slots'].shape[1]) * w)
                       if a == x.ndim + axis else (0, 0) for a in range(x.ndim)])
  return {**cache, 'slots': pad(cache['slots'], -1),
          'layers': [{**layer, 'self': {name: pad(x, POSITION_AXIS[name])
                                        for name, x in layer['self'].items()}}
                     for layer in cache['layers']]}


def reorder(cache: Cache, parents: Array) -> Cache:
  """The cache after beams are chosen: hypothesis i continues hypothesis parents[i] [N]. Only
  `slots` is per hypothesis; the keys/values stay where they were written."""
  return {**cache, 'slots': decode.take_rows(cache['slots'], parents)}
