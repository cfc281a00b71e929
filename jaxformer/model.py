"""The Transformer of Figure 1 as Flax linen modules.

Shape glossary (used in einsum strings and shape comments):
  B batch, S source length, T target (query) length, L key/value length,
  D d_model, H heads, K query/key dim per head, J value dim per head, F d_ff, V vocab;
  in decoding (jaxformer.cache, jaxformer.decode) W beams per sentence, N = B * W hypotheses.

Token id 0 is padding. Packed rows carry segment ids (0 = padding, 1, 2, ... = the pairs in
the row) and positions that restart at 0 for every pair; without them a row holds one pair.
The decoder's first input is 0, as in tensor2tensor (the targets shifted right by one).
"""

import functools
import inspect
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxformer import cache as cache_lib
from jaxformer.config import TransformerConfig
from jaxformer.layout import Layout

Array = jax.Array
Cache = cache_lib.Cache

_dense_init = nn.initializers.xavier_uniform()  # tensor2tensor's uniform_unit_scaling(1.0)


def _layer_norm(config: TransformerConfig) -> nn.LayerNorm:
  """LayerNorm (statistics and params in float32) whose output is in execution.norm_dtype."""
  return nn.LayerNorm(epsilon=config.norm_epsilon, dtype=config.execution.norm_dtype)


def sinusoidal_positions(positions: Array, d_model: int) -> Array:
  """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)) (§3.5)."""
  two_i = jnp.arange(0, d_model, 2, dtype=jnp.float32)
  angles = positions[..., None].astype(jnp.float32) / 10000.0 ** (two_i / d_model)  # [..., D/2]
  pe = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)  # [..., D/2, 2]
  return pe.reshape(*positions.shape, d_model)  # [..., D]: sin at even, cos at odd indices


def segment_mask(q_segments: Array, k_segments: Array) -> Array:
  """True where query and key share a segment and the key is not padding: [B, 1, T, L]."""
  same = q_segments[:, :, None] == k_segments[:, None, :]  # [B, T, L]
  return (same & (k_segments[:, None, :] > 0))[:, None]


def causal_mask(length: int) -> Array:
  """True where the key position is not after the query position: [1, 1, T, T]."""
  return jnp.tril(jnp.ones((length, length), dtype=bool))[None, None]


def window_mask(q_positions: Array, k_positions: Array, window: int | None) -> Array | bool:
  """Restricted self-attention (§4): True where abs(query pos - key pos) <= r. [B, 1, T, L]"""
  if window is None:
    return True
  distance = q_positions[:, :, None] - k_positions[:, None, :]  # [B, T, L]
  return (jnp.abs(distance) <= window)[:, None]


def attend_somewhere(mask: Array) -> Array:
  """`mask` [B, 1, T, L] with every query row that allows no key opened to its row's first key.

  Such rows are padding queries (segment 0): their outputs are never read (no real query attends
  to a padding key, and the loss gives padding weight 0), so logits, loss and gradients at real
  positions are unchanged. What changes is that no row of the softmax is empty: the log-sum-exp
  of every row is finite, as fused kernels' backward passes need (cuDNN's Hopper kernel gave
  NaN query gradients for fully masked rows at key lengths 64 more than a multiple of 128)."""
  first = jnp.arange(mask.shape[-1]) == 0  # [L]
  return mask | (first & ~jnp.any(mask, axis=-1, keepdims=True))


def encoder_mask(segments: Array, positions: Array, window: int | None) -> Array:
  """The encoder's self-attention mask [B, 1, S, S] for source segments and positions [B, S]."""
  return attend_somewhere(segment_mask(segments, segments)
                          & window_mask(positions, positions, window))


def decoder_masks(tgt_segments: Array, src_segments: Array, positions: Array,
                  window: int | None) -> tuple[Array, Array]:
  """The decoder's self-attention [B, 1, T, T] and cross-attention [B, 1, T, S] masks in
  training, for target segments and positions [B, T] and source segments [B, S]."""
  self_mask = (segment_mask(tgt_segments, tgt_segments) & causal_mask(tgt_segments.shape[1])
               & window_mask(positions, positions, window))
  return attend_somewhere(self_mask), attend_somewhere(segment_mask(tgt_segments, src_segments))


def _cudnn_applies(q: Array, k: Array) -> bool:
  """Whether cuDNN's flash attention takes q [B, T, H, K] and k [B, L, H, K]: on a GPU, in
  bfloat16 or float16, with even T and L (its masked kernel's training pass needs them).
  jax.nn.dot_product_attention's default is XLA's own lowering even on a GPU: it must be asked
  for cuDNN by name."""
  lengths = (q.shape[1], k.shape[1])
  return (jax.default_backend() == 'gpu' and q.dtype in (jnp.bfloat16, jnp.float16)
          and all(n % 2 == 0 for n in lengths))


class MultiHeadAttention(nn.Module):
  """Scaled dot-product attention over h heads (§3.2)."""
  config: TransformerConfig

  def setup(self):
    cfg = self.config
    dense = functools.partial(nn.DenseGeneral, dtype=cfg.execution.dtype,
                              kernel_init=_dense_init)
    self.query = dense(features=(cfg.num_heads, cfg.key_dim))
    self.key = dense(features=(cfg.num_heads, cfg.key_dim))
    self.value = dense(features=(cfg.num_heads, cfg.value_dim))
    self.out = dense(features=cfg.d_model, axis=(-2, -1))
    self.dropout = nn.Dropout(cfg.attention_dropout_rate)

  def project_kv(self, context: Array) -> dict[str, Array]:
    """Keys [B, H, K, L] and values [B, H, L, J] of the attended sequence: {'k', 'v'}.

    Heads first, keys transposed: the layout in which both products are plain (not transposed)
    batched matmuls, so that neither the products nor a decoding cache (which stores this
    layout) need a transpose per step.
    """
    return {'k': jnp.transpose(self.key(context), (0, 2, 3, 1)),  # [B, H, K, L]
            'v': jnp.swapaxes(self.value(context), 1, 2)}  # [B, H, L, J]

  def __call__(self, x: Array, kv: dict[str, Array], mask: Array, *,
               deterministic: bool) -> Array:
    """Attends from x [B, T, D] to kv (from `project_kv`) where mask [B, 1, T, L] is True.

    Beam search shares one kv [B, H, ...] among the W beams of each sentence: then x is
    [B * W, T, D] (beams adjacent) and its queries attend as W * T positions of their sentence.
    """
    q = self.query(x) * self.config.key_dim ** -0.5  # [B * W, T, H, K]
    q = cache_lib.by_sentence(q, kv['k'].shape[0])  # [B, W * T, H, K]
    return self.out(self._attend(q, kv, mask, deterministic).reshape(
        *x.shape[:2], *q.shape[2:-1], -1))  # [B * W, T, D]

  def _attend(self, q: Array, kv: dict[str, Array], mask: Array, deterministic: bool) -> Array:
    """The heads [B, T, H, J] of q [B, T, H, K] over kv."""
    if self.config.execution.attention == 'fused':
      k, v = jnp.transpose(kv['k'], (0, 3, 1, 2)), jnp.swapaxes(kv['v'], 1, 2)  # [B, L, H, K|J]
      if not _cudnn_applies(q, k):  # XLA's lowering of the same op
        return jax.nn.dot_product_attention(q, k, v, mask=mask, scale=1.0)
      mask = jnp.broadcast_to(mask, (*jnp.shape(mask)[:2], q.shape[1], k.shape[1]))
      return jax.nn.dot_product_attention(q, k, v, mask=mask, scale=1.0, implementation='cudnn')
    # Heads-first operands make both products plain batched matmuls, which XLA:CPU runs
    # without the transposes it put around the head-in-the-middle einsums (docs/BENCHMARKS.md).
    q, k, v = jnp.swapaxes(q, 1, 2), kv['k'], kv['v']  # [B, H, T, K], [B, H, K, L], [B, H, L, J]
    logits = jnp.einsum('BHTK,BHKL->BHTL', q, k,
                        preferred_element_type=jnp.float32)  # [B, H, T, L]
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(logits, axis=-1).astype(self.config.execution.dtype)  # [B, H, T, L]
    self.sow('intermediates', 'attention_weights', weights)  # only kept when asked for
    weights = self.dropout(weights, deterministic=deterministic)
    heads = jnp.einsum('BHTL,BHLJ->BHTJ', weights, v)  # [B, H, T, J]
    return jnp.swapaxes(heads, 1, 2)  # [B, T, H, J]


ACTIVATIONS = {'relu': nn.relu, 'swish': nn.silu,
               'gelu': functools.partial(nn.gelu, approximate=False)}


class FeedForward(nn.Module):
  """FFN(x) = max(0, x W1 + b1) W2 + b2 (§3.3), or another config.activation than max(0, .)."""
  config: TransformerConfig

  @nn.compact
  def __call__(self, x: Array, *, deterministic: bool) -> Array:
    cfg = self.config
    dense = functools.partial(nn.Dense, dtype=cfg.execution.dtype, kernel_init=_dense_init)
    h = ACTIVATIONS[cfg.activation](dense(cfg.d_ff)(x))  # [B, T, F]
    h = nn.Dropout(cfg.relu_dropout_rate)(h, deterministic=deterministic)
    return dense(cfg.d_model)(h)  # [B, T, D]


class Residual(nn.Module):
  """"Add & Norm": LayerNorm(x + Dropout(Sublayer(x))) (§3.1, §5.4), or pre-LN when asked.

  Use as `y = r(x, sublayer(r.normed(x)))`: `normed` is the identity for the paper's post-LN.
  """
  config: TransformerConfig

  def setup(self):
    self.norm = _layer_norm(self.config)
    self.dropout = nn.Dropout(self.config.dropout_rate)

  def normed(self, x: Array) -> Array:
    """The sub-layer's input."""
    return self.norm(x) if self.config.pre_ln else x

  def __call__(self, x: Array, sublayer_out: Array, *, deterministic: bool) -> Array:
    y = x + self.dropout(sublayer_out, deterministic=deterministic)
    return y if self.config.pre_ln else self.norm(y)


class EncoderLayer(nn.Module):
  """Self-attention, then the FFN, each inside Add & Norm."""
  config: TransformerConfig

  def setup(self):
    self.self_attention = MultiHeadAttention(self.config)
    self.ffn = FeedForward(self.config)
    self.residuals = [Residual(self.config) for _ in range(2)]

  def __call__(self, x: Array, mask: Array, deterministic: bool) -> Array:
    attn, ffn, (r1, r2), det = self.self_attention, self.ffn, self.residuals, deterministic
    h = r1.normed(x)
    x = r1(x, attn(h, attn.project_kv(h), mask, deterministic=det), deterministic=det)
    return r2(x, ffn(r2.normed(x), deterministic=det), deterministic=det)


class DecoderLayer(nn.Module):
  """Masked self-attention, encoder-decoder attention, then the FFN, each inside Add & Norm."""
  config: TransformerConfig

  def setup(self):
    self.self_attention = MultiHeadAttention(self.config)
    self.cross_attention = MultiHeadAttention(self.config)
    self.ffn = FeedForward(self.config)
    self.residuals = [Residual(self.config) for _ in range(3)]

  def __call__(self, y: Array, encoded: Array | None, self_mask: Array, cross_mask: Array,
               deterministic: bool, cache: Cache | None = None,
               index: Array | None = None) -> tuple[Array, Cache | None]:
    """With a layer's decoding cache (see jaxformer.cache), y is the one new position `index`
    [N, 1, D] and `encoded` is not used; returns the updated layer cache (else None)."""
    self_attn, cross_attn, det = self.self_attention, self.cross_attention, deterministic
    r1, r2, r3 = self.residuals
    h = r1.normed(y)
    kv = self_attn.project_kv(h)
    if cache is not None:  # this position joins each hypothesis's slot of the cache
      cache = cache_lib.write(cache, kv, index)
      kv = cache['self']
    y = r1(y, self_attn(h, kv, self_mask, deterministic=det), deterministic=det)
    cross_kv = cross_attn.project_kv(encoded) if cache is None else cache['cross']
    y = r2(y, cross_attn(r2.normed(y), cross_kv, cross_mask, deterministic=det),
           deterministic=det)
    return r3(y, self.ffn(r3.normed(y), deterministic=det), deterministic=det), cache


def _maybe_remat(layer: type[nn.Module], config: TransformerConfig) -> type[nn.Module]:
  """The layer, rematerialised in the backward pass if execution.remat (activation memory of one
  layer instead of N, for a second forward pass). Param names do not change. Its `deterministic`
  argument (a Python bool: dropout on or off) stays static."""
  if not config.execution.remat:
    return layer
  static = list(inspect.signature(layer.__call__).parameters).index('deterministic')
  return nn.remat(layer, static_argnums=(static,))  # the position counts self


class InputEmbedding(nn.Module):
  """Shared token embedding times sqrt(d_model) (§3.4) plus positional encoding (§3.5, or a
  learned table per stack for Table 3 row E), then dropout (§5.4)."""
  config: TransformerConfig
  embed: nn.Embed

  @nn.compact
  def __call__(self, tokens: Array, positions: Array, *, deterministic: bool) -> Array:
    cfg = self.config
    if cfg.learned_positions:
      table = self.param('position_embedding', nn.initializers.normal(stddev=1.0),
                         (cfg.max_len, cfg.d_model))  # unit scale, like the sinusoids
      # Out-of-table positions (longer rows than max_len) give NaN, never a silent clamp.
      pe = jnp.take(table, positions, axis=0, mode='fill', fill_value=jnp.nan)  # [B, T, D]
    else:
      pe = sinusoidal_positions(positions, cfg.d_model)  # [B, T, D]
    x = self.embed(tokens) * cfg.d_model ** 0.5 + pe.astype(cfg.execution.dtype)
    return nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)


class Encoder(nn.Module):
  """The left half of Figure 1: N encoder layers over embedded source tokens."""
  config: TransformerConfig
  embed: nn.Embed

  def setup(self):
    self.embedding = InputEmbedding(self.config, self.embed)
    layer = _maybe_remat(EncoderLayer, self.config)
    self.layers = [layer(self.config) for _ in range(self.config.num_layers)]
    self.final_norm = _layer_norm(self.config) if self.config.pre_ln else None

  def __call__(self, src: Array, segments: Array, positions: Array, *,
               deterministic: bool) -> Array:
    x = self.embedding(src, positions, deterministic=deterministic)  # [B, S, D]
    mask = encoder_mask(segments, positions, self.config.attention_window)
    for layer in self.layers:
      x = layer(x, mask, deterministic)
    return x if self.final_norm is None else self.final_norm(x)


class Decoder(nn.Module):
  """The right half of Figure 1: N decoder layers, then the shared embedding as the softmax."""
  config: TransformerConfig
  embed: nn.Embed

  def setup(self):
    self.embedding = InputEmbedding(self.config, self.embed)
    layer = _maybe_remat(DecoderLayer, self.config)
    self.layers = [layer(self.config) for _ in range(self.config.num_layers)]
    self.final_norm = _layer_norm(self.config) if self.config.pre_ln else None

  def __call__(self, tgt_in: Array, encoded: Array | None, self_mask: Array, cross_mask: Array,
               positions: Array, *, deterministic: bool, cache: Cache | None = None
               ) -> tuple[Array, Cache | None]:
    """(the decoder's output [B, T, D] before the softmax projection, the cache after this
    step or None)."""
    y = self.embedding(tgt_in, positions, deterministic=deterministic)  # [B, T, D]
    layer_caches = [None] * len(self.layers) if cache is None else cache['layers']
    new_caches = []
    for layer, layer_cache in zip(self.layers, layer_caches):
      y, layer_cache = layer(y, encoded, self_mask, cross_mask, deterministic,
                             cache=layer_cache, index=None if cache is None else cache['index'])
      new_caches.append(layer_cache)
    if self.final_norm is not None:
      y = self.final_norm(y)
    return y, None if cache is None else cache_lib.advance(cache, new_caches)


def _check_length(config: TransformerConfig, length: int, what: str) -> None:
  if config.learned_positions and length > config.max_len:
    raise ValueError(f'{what} has {length} positions but the learned positional embeddings '
                     f'cover max_len={config.max_len}; use a larger max_len or sinusoids.')


class Transformer(nn.Module):
  """The encoder-decoder Transformer with one embedding shared by both inputs and the softmax.

  Inputs are int32 token ids (0 is padding): the source [B, S] and the decoder's inputs
  [B, T], which are the targets shifted right by one, starting with 0. Packed rows add segment
  ids (0 padding, 1, 2, ... per pair) and positions that restart at 0 for each pair.

  >>> import jax, jax.numpy as jnp, jaxformer
  >>> model = jaxformer.Transformer(jaxformer.tiny(vocab_size=64))
  >>> src, tgt_in = jnp.array([[5, 9, 3, 1]]), jnp.array([[0, 7, 8]])
  >>> params = model.init(jax.random.key(0), src, tgt_in)['params']
  >>> model.apply({'params': params}, src, tgt_in).shape  # logits [B, T, V], float32
  (1, 3, 64)

  `encode`, `init_cache` and `decode_step` decode incrementally (jaxformer.decode searches with
  them); `forward_hidden` stops before the softmax projection (the training loss's input).
  """
  config: TransformerConfig

  def setup(self):
    cfg = self.config
    self.embed = nn.Embed(cfg.vocab_size, cfg.d_model, dtype=cfg.execution.dtype,
                          embedding_init=nn.initializers.normal(stddev=cfg.d_model ** -0.5))
    self.encoder = Encoder(cfg, self.embed)
    self.decoder = Decoder(cfg, self.embed)
    if cfg.output_bias:
      self.output_bias = self.param('output_bias', nn.initializers.zeros, (cfg.vocab_size,),
                                    jnp.float32)

  def encode(self, src: Array, layout: Layout | None = None, *,
             deterministic: bool = True) -> Array:
    """Source tokens [B, S] -> encoder output [B, S, D]."""
    _check_length(self.config, src.shape[1], 'the source')
    return self.encoder(src, *(layout or Layout()).source(src), deterministic=deterministic)

  def decoder_output(self, encoded: Array, src: Array, tgt_in: Array,
                     layout: Layout | None = None, *, deterministic: bool = True) -> Array:
    """Decoder inputs [B, T] -> the decoder's output [B, T, D] before the softmax projection
    (a loss may project it in chunks: losses.chunked_smoothed_cross_entropy)."""
    _check_length(self.config, tgt_in.shape[1], 'the target')
    layout = layout or Layout()
    tgt_segments, positions = layout.target(tgt_in)
    self_mask, cross_mask = decoder_masks(tgt_segments, layout.source(src)[0], positions,
                                          self.config.attention_window)
    hidden, _ = self.decoder(tgt_in, encoded, self_mask, cross_mask, positions,
                             deterministic=deterministic)
    return hidden

  def logits(self, hidden: Array, projection: Array | None = None) -> Array:
    """The softmax's input: the shared embedding applied to decoder outputs [.., D] -> [.., V]
    (float32), plus config.output_bias's bias. `projection`, if given, is that embedding
    already transposed, [D, V] (output_projection): a caller that projects a few rows many
    times (a search's steps) multiplies faster by it on a CPU, whose kernels read the
    embedding's [V, D] rows slower than a [D, V] matrix's (docs/benchmarks-log.md)."""
    if projection is None:
      logits = self.embed.attend(hidden)
    else:
      dtype = self.config.execution.dtype
      logits = jnp.dot(hidden.astype(dtype), projection.astype(dtype))
    logits = logits.astype(jnp.float32)
    return logits + self.output_bias if self.config.output_bias else logits

  def decode(self, encoded: Array, src: Array, tgt_in: Array, layout: Layout | None = None, *,
             deterministic: bool = True) -> Array:
    """Decoder inputs [B, T] -> logits [B, T, V] (float32)."""
    return self.logits(self.decoder_output(encoded, src, tgt_in, layout,
                                           deterministic=deterministic))

  def init_cache(self, encoded: Array, max_len: int, beams: int = 1) -> Cache:
    """A decoding cache (jaxformer.cache) for up to max_len tokens after `encode`, for `beams`
    hypotheses per sentence (adjacent), which share the encoder-decoder keys/values."""
    _check_length(self.config, max_len, 'the decoding cache')
    cross = [layer.cross_attention.project_kv(encoded) for layer in self.decoder.layers]
    return cache_lib.init(self.config, cross, max_len, beams)

  def decode_step(self, src: Array, tokens: Array, cache: Cache, layout: Layout | None = None,
                  projection: Array | None = None) -> tuple[Array, Cache]:
    """One decoding step: the next token [N, 1] of the N = B * W hypotheses the cache was made
    for (src stays [B, S]) -> (logits [N, V] of the token after it, the cache after it).
    `projection`: as `logits`'."""
    self_mask, cache = cache_lib.self_attention_mask(cache, self.config.attention_window)
    cross_mask = segment_mask(jnp.ones_like(src[:, :1]), (layout or Layout()).source(src)[0])
    # Every hypothesis is at the same position: its encoding is computed once, [1, 1], and
    # broadcast, not once a row (a sine and a cosine an entry).
    hidden, cache = self.decoder(tokens, None, self_mask, cross_mask,
                                 jnp.full((1, 1), cache['index'], tokens.dtype),
                                 deterministic=True, cache=cache)
    return self.logits(hidden[:, 0], projection), cache

  def __call__(self, src: Array, tgt_in: Array, *, deterministic: bool = True,
               src_segments: Array | None = None, tgt_segments: Array | None = None,
               src_positions: Array | None = None, tgt_positions: Array | None = None
               ) -> Array:
    """Teacher-forced logits [B, T, V] for source [B, S] and decoder inputs [B, T]: `forward`
    with the layout's arrays as keywords (the form DESIGN.md documents)."""
    return self.forward(src, tgt_in, Layout(src_segments, src_positions, tgt_segments,
                                             tgt_positions), deterministic=deterministic)

  def forward(self, src: Array, tgt_in: Array, layout: Layout | None = None, *,
              deterministic: bool = True) -> Array:
    """Teacher-forced logits [B, T, V] for source [B, S] and decoder inputs [B, T]."""
    return self.logits(self.forward_hidden(src, tgt_in, layout, deterministic=deterministic))

  def forward_hidden(self, src: Array, tgt_in: Array, layout: Layout | None = None, *,
                     deterministic: bool = True) -> Array:
    """As `forward`, but the decoder's output [B, T, D] before the softmax projection (the
    training loss projects it in chunks)."""
    encoded = self.encode(src, layout, deterministic=deterministic)
    return self.decoder_output(encoded, src, tgt_in, layout, deterministic=deterministic)


@jax.jit
def output_projection(params: Any) -> Array:
  """The shared embedding of Transformer's `params` transposed, [D, V], in memory in that order
  (a program's output): `Transformer.logits`'s `projection`."""
  return params['embed']['embedding'].T


@functools.cache
def parameter_count(config: TransformerConfig) -> int:
  """The number of parameters of Transformer(config), from shapes only (nothing is computed)."""
  dummy = jnp.ones((1, 1), jnp.int32)
  shapes = jax.eval_shape(Transformer(config).init, jax.random.key(0), dummy, dummy)
  return sum(x.size for x in jax.tree.leaves(shapes))
