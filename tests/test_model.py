"""jaxformer.model: Figure 1 against hand computations, masks, attention kernels, Table 3 shapes."""

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import apply, init_params

from jaxformer import config as config_lib
from jaxformer import model as model_lib
from jaxformer import data, losses, search, train, translation
from jaxformer.layout import Layout
from jaxformer.model import Transformer

SRC = jnp.array([[5, 9, 3, 7, 2]])


TGT = jnp.array([[0, 4, 8, 6, 11, 13]])


def _formula(v: int, n: int, d: int, f: int, pre_ln: bool = False) -> int:
  """Tied V x D embedding; biases on every projection; two LayerNorm vectors per sub-layer."""
  attention = 4 * (d * d + d)
  ffn = d * f + f + f * d + d
  norm = 2 * d
  encoder_layer = attention + ffn + 2 * norm
  decoder_layer = 2 * attention + ffn + 3 * norm
  final_norms = 2 * norm if pre_ln else 0
  return v * d + n * (encoder_layer + decoder_layer) + final_norms


@pytest.mark.parametrize('pos,i', [(0, 0), (1, 0), (7, 3), (50, 100), (255, 255)])
def test_sinusoid_entries_follow_section_3_5(pos, i):
  d = 512
  pe = np.asarray(model_lib.sinusoidal_positions(jnp.array([pos]), d))[0]
  angle = pos / 10000 ** (2 * i / d)
  assert pe[2 * i] == pytest.approx(math.sin(angle), abs=1e-5)
  assert pe[2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-5)


def test_masks():
  segments = jnp.array([[1, 1, 2, 2, 0]])
  mask = model_lib.segment_mask(segments, segments)[0, 0]
  expected = np.array([[1, 1, 0, 0, 0],
                       [1, 1, 0, 0, 0],
                       [0, 0, 1, 1, 0],
                       [0, 0, 1, 1, 0],
                       [0, 0, 0, 0, 0]], dtype=bool)
  np.testing.assert_array_equal(mask, expected)
  np.testing.assert_array_equal(model_lib.causal_mask(3)[0, 0],
                                np.array([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=bool))


def test_attend_somewhere_opens_only_empty_rows_to_their_first_key():
  segments = jnp.array([[1, 1, 2, 2, 0]])
  mask = model_lib.segment_mask(segments, segments)
  opened = np.asarray(model_lib.attend_somewhere(mask)[0, 0])
  np.testing.assert_array_equal(opened[:4], np.asarray(mask[0, 0, :4]))  # real rows unchanged
  np.testing.assert_array_equal(opened[4], [1, 0, 0, 0, 0])  # the padding query: key 0 only


def test_no_attention_row_is_empty_in_packed_batches(corpus):
  """Every query, padding included, attends to at least one key in all three masks, for the
  rows PackedBatches gives (pairs packed side by side, padding, whole empty rows at the end)."""
  stream = data.PackedBatches(corpus, src_len=40, tgt_len=48, rows_per_device=8, num_epochs=1)
  padding_queries = 0
  for batch in stream:
    flat = {key: jnp.asarray(value.reshape(-1, value.shape[-1])) for key, value in batch.items()}
    masks = (model_lib.encoder_mask(flat['src_segments'], flat['src_positions'], None),
             *model_lib.decoder_masks(flat['tgt_segments'], flat['src_segments'],
                                      flat['tgt_positions'], None))
    for mask in masks:
      assert np.all(np.asarray(mask).any(-1))
    padding_queries += int((batch['tgt_segments'] == 0).sum())
  assert padding_queries > 0  # the batches had padding to test


@pytest.mark.parametrize('attention', ['einsum', 'fused'])
def test_opened_padding_rows_change_no_real_logit_and_no_gradient(tiny_config, attention,
                                                                  monkeypatch):
  """Logits at real positions and the gradients of the training loss w.r.t. every param are
  those of masks that leave padding rows empty (attend_somewhere as the identity), on packed
  rows with padding, with dropout."""
  cfg = tiny_config.with_execution(attention=attention)
  params = init_params(cfg)
  inputs = _packed_inputs()
  real = np.asarray(inputs['tgt_segments'] > 0)
  targets = jnp.roll(inputs['tgt_in'], -1, axis=1) * real

  def logits_and_grads():
    def loss(p):
      logits = Transformer(cfg).apply({'params': p}, **inputs, deterministic=False,
                                      rngs={'dropout': jax.random.key(3)})
      total, _ = losses.smoothed_cross_entropy(logits, targets, real, 0.1)
      return total, logits
    grads, logits = jax.jit(jax.grad(loss, has_aux=True))(params)  # traced anew: no jit cache
    return np.asarray(logits)[real], grads
  opened = logits_and_grads()
  monkeypatch.setattr(model_lib, 'attend_somewhere', lambda mask: mask)
  empty = logits_and_grads()
  # Two programs, which XLA may sum in another order: float32 rounding apart (up to 3e-7 seen).
  # A padding row that leaked into a real one would move them by orders of magnitude more.
  np.testing.assert_allclose(opened[0], empty[0], rtol=1e-6, atol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), *[
      g for _, g in (opened, empty)])


@pytest.mark.parametrize('preset,expected', [('base', 63_082_496), ('big', 214_245_376)])
def test_parameter_counts_match_table_3_dimensions(preset, expected):
  cfg = getattr(config_lib, preset)(vocab_size=37000)
  count = model_lib.parameter_count(cfg)
  assert count == expected
  assert count == _formula(37000, cfg.num_layers, cfg.d_model, cfg.d_ff)


def test_one_embedding_is_shared(tiny_model):
  _, params = tiny_model
  assert params['embed']['embedding'].shape == (50, 32)
  names = {'/'.join(k.key for k in path) for path, _ in jax.tree_util.tree_leaves_with_path(params)}
  assert not any('embed' in name and not name.startswith('embed/') for name in names)


def test_pre_ln_adds_only_the_final_norms(tiny_config):
  cfg = tiny_config.replace(pre_ln=True)
  assert model_lib.parameter_count(cfg) == _formula(50, 2, 32, 64, pre_ln=True)


def test_a_marian_models_settings_change_what_they_say_and_nothing_else(tiny_config):
  """model.activation, model.output_bias and model.norm_epsilon (a MarianMT folder's): the
  bias is one [V] parameter added to the logits, the activation the FFN's, the epsilon every
  layer norm's; the paper's defaults compute what they did."""
  src, tgt = jnp.array([[5, 9, 3, 1]]), jnp.array([[0, 7, 8]])
  params = Transformer(tiny_config).init(jax.random.key(0), src, tgt)['params']
  logits = lambda cfg, p: Transformer(cfg).apply({'params': p}, src, tgt)  # noqa: E731
  base = logits(tiny_config, params)
  biased = tiny_config.replace(output_bias=True)
  assert model_lib.parameter_count(biased) == model_lib.parameter_count(tiny_config) + 50
  bias = jnp.arange(50, dtype=jnp.float32) / 10
  np.testing.assert_allclose(logits(biased, {**params, 'output_bias': bias}), base + bias,
                             rtol=1e-6, atol=1e-5)
  for change in (dict(activation='swish'), dict(activation='gelu'), dict(norm_epsilon=1e-1)):
    assert not np.allclose(logits(tiny_config.replace(**change), params), base, atol=1e-4)
  ffn = model_lib.FeedForward(tiny_config.replace(activation='swish', d_model=4, d_ff=2))
  x = jnp.array([[[1.0, -2.0, 0.5, 3.0]]])
  ffn_params = ffn.init(jax.random.key(1), x, deterministic=True)
  inner = x @ ffn_params['params']['Dense_0']['kernel'] + ffn_params['params']['Dense_0']['bias']
  want = (inner * jax.nn.sigmoid(inner)) @ ffn_params['params']['Dense_1']['kernel'] + \
      ffn_params['params']['Dense_1']['bias']
  np.testing.assert_allclose(ffn.apply(ffn_params, x, deterministic=True), want, rtol=1e-6)
  with pytest.raises(config_lib.SettingError, match="model.activation must be one of"):
    tiny_config.replace(activation='tanh')


def test_decoder_is_causal(tiny_model):
  """d logits[t] / d (decoder input at s) is exactly zero for s > t and nonzero for s <= t."""
  model, params = tiny_model
  length = TGT.shape[1]

  def logits_at(delta, t):
    def add_delta(next_fun, args, kwargs, context):
      # Perturb the decoder's embedded inputs (embeddings + PE) by delta.
      out = next_fun(*args, **kwargs)
      if isinstance(context.module, model_lib.InputEmbedding) and isinstance(
          context.module.parent, model_lib.Decoder):
        out = out + delta
      return out
    with nn.intercept_methods(add_delta):
      return model.apply({'params': params}, SRC, TGT)[0, t].sum()

  delta = jnp.zeros((1, length, 32))
  grad_at = jax.jit(jax.grad(logits_at))  # one program for every t (op by op: ~500 compiles)
  for t in range(length):
    grad = np.asarray(grad_at(delta, t))[0]  # [T, D]
    assert np.all(grad[t + 1:] == 0.0), f'position {t} sees the future'
    assert np.all(np.abs(grad[: t + 1]).sum(-1) > 0), f'position {t} misses the past'


def test_padding_does_not_change_real_logits(tiny_model):
  model, params = tiny_model
  logits = apply(model, {'params': params}, SRC, TGT)
  padded = apply(model, {'params': params}, jnp.pad(SRC, ((0, 0), (0, 3))),
                       jnp.pad(TGT, ((0, 0), (0, 4))))
  np.testing.assert_allclose(padded[:, :TGT.shape[1]], logits, atol=1e-5)


def test_packed_pairs_are_isolated(tiny_model):
  """Two pairs packed in one row give the logits each pair gives alone."""
  model, params = tiny_model
  src_a, tgt_a = [5, 9, 3], [0, 4, 8, 6]
  src_b, tgt_b = [7, 2, 12, 10], [0, 11, 13]
  alone_a = apply(model, {'params': params}, jnp.array([src_a]), jnp.array([tgt_a]))
  alone_b = apply(model, {'params': params}, jnp.array([src_b]), jnp.array([tgt_b]))
  packed = apply(model,
      {'params': params},
      jnp.array([src_a + src_b + [0]]), jnp.array([tgt_a + tgt_b + [0, 0]]),
      src_segments=jnp.array([[1, 1, 1, 2, 2, 2, 2, 0]]),
      tgt_segments=jnp.array([[1, 1, 1, 1, 2, 2, 2, 0, 0]]),
      src_positions=jnp.array([[0, 1, 2, 0, 1, 2, 3, 0]]),
      tgt_positions=jnp.array([[0, 1, 2, 3, 0, 1, 2, 0, 0]]))
  np.testing.assert_allclose(packed[:, :4], alone_a, atol=1e-5)
  np.testing.assert_allclose(packed[:, 4:7], alone_b, atol=1e-5)


@pytest.mark.parametrize('bias', [False, True])
def test_logits_through_the_transposed_embedding_are_the_embeddings(tiny_config, bias):
  """output_projection is the shared embedding transposed, and logits through it (a search's
  steps on a CPU) equal logits through the embedding, its bias added either way."""
  cfg = tiny_config.replace(output_bias=bias)
  model, params = Transformer(cfg), init_params(cfg)
  if bias:
    params = {**params, 'output_bias': jnp.linspace(-1.0, 1.0, cfg.vocab_size)}
  projection = model_lib.output_projection(params)
  np.testing.assert_array_equal(projection, np.asarray(params['embed']['embedding']).T)
  hidden = jax.random.normal(jax.random.key(3), (5, cfg.d_model))
  logits = lambda *a: model.apply({'params': params}, hidden, *a,  # noqa: E731
                                  method=Transformer.logits)
  assert logits(projection).dtype == jnp.float32
  np.testing.assert_allclose(logits(projection), logits(), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(logits(), hidden @ params['embed']['embedding'].T
                             + (params['output_bias'] if bias else 0.0), rtol=1e-5, atol=1e-5)


def test_jit_matches_eager(tiny_model):
  model, params = tiny_model
  eager = model.apply({'params': params}, SRC, TGT)
  jitted = jax.jit(model.apply)({'params': params}, SRC, TGT)
  np.testing.assert_allclose(jitted, eager, atol=1e-5)


def test_dropout_is_active_only_in_training(tiny_model):
  model, params = tiny_model
  def run(det: bool, seed: int):
    return model.apply({'params': params}, SRC, TGT, deterministic=det,
                       rngs={'dropout': jax.random.key(seed)})
  np.testing.assert_array_equal(run(True, 0), run(True, 1))
  assert not np.allclose(run(False, 0), run(False, 1))


def test_bfloat16_compute_keeps_float32_params_and_logits(tiny_config, tiny_model):
  _, params = tiny_model
  model = Transformer(tiny_config.with_execution(dtype=jnp.bfloat16))
  logits = apply(model, {'params': params}, SRC, TGT)
  assert logits.dtype == jnp.float32
  full = apply(Transformer(tiny_config), {'params': params}, SRC, TGT)
  np.testing.assert_allclose(logits, full, atol=0.1)


def _packed_inputs():
  """Two rows: one with two packed pairs and padding, one with a single pair."""
  src = jnp.array([[5, 6, 7, 8, 9, 0], [11, 12, 13, 14, 15, 16]])
  src_segments = jnp.array([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 1]])
  src_positions = jnp.array([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]])
  tgt = jnp.array([[0, 21, 22, 0, 23, 0, 0], [0, 31, 32, 33, 34, 35, 36]])
  tgt_segments = jnp.array([[1, 1, 1, 2, 2, 0, 0], [1, 1, 1, 1, 1, 1, 1]])
  tgt_positions = jnp.array([[0, 1, 2, 0, 1, 0, 0], [0, 1, 2, 3, 4, 5, 6]])
  return dict(src=src, tgt_in=tgt, src_segments=src_segments, tgt_segments=tgt_segments,
              src_positions=src_positions, tgt_positions=tgt_positions)


def test_fused_attention_agrees_with_einsum_attention(tiny_model, tiny_config):
  _, params = tiny_model
  inputs = _packed_inputs()
  real = np.asarray(inputs['tgt_segments'] > 0)
  outputs = {}
  for attention in ('einsum', 'fused'):
    cfg = tiny_config.with_execution(attention=attention)
    logits = apply(Transformer(cfg), {'params': params}, **inputs)
    greedy = translation._jitted_search(cfg, config_lib.DecodingConfig(beam_size=1), False)(
        params, search.Batch(inputs['src'][1:], jnp.array([9])), max_len=10)[0]  # as Translator
    outputs[attention] = (np.asarray(logits)[real], np.asarray(greedy))
  np.testing.assert_allclose(outputs['fused'][0], outputs['einsum'][0], rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(outputs['fused'][1], outputs['einsum'][1])


def test_fused_attention_names_cudnn_on_gpu_with_full_masks(tiny_model, tiny_config,
                                                            monkeypatch):
  """On a GPU (faked here), fused bfloat16 attention asks for cuDNN's kernel by name where its
  lengths are even, with each mask broadcast to the [B, 1, T, L] bias cuDNN needs; odd lengths
  keep XLA's lowering. The fake runs XLA's lowering, so the answers must equal the CPU path's."""
  _, params = tiny_model
  cfg = tiny_config.with_execution(attention='fused', dtype=jnp.bfloat16)
  xla, calls = jax.nn.dot_product_attention, []

  def fake(q, k, v, *, mask, scale, implementation=None):
    calls.append((implementation, mask.shape, (q.shape[0], 1, q.shape[1], k.shape[1])))
    return xla(q, k, v, mask=mask, scale=scale)
  even = {name: jnp.pad(x, ((0, 0), (0, 1))) if name.startswith('tgt') else x
          for name, x in _packed_inputs().items()}  # targets of 8
  on_cpu = jax.jit(Transformer(cfg).apply)({'params': params}, **even)
  monkeypatch.setattr(jax.nn, 'dot_product_attention', fake)
  monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
  on_gpu = jax.jit(Transformer(cfg).apply)({'params': params}, **even)  # (a new jit: traced)
  np.testing.assert_array_equal(np.asarray(on_gpu), np.asarray(on_cpu))
  assert len(calls) == 3 * cfg.num_layers  # encoder self, decoder self and cross, per layer
  assert all(kernel == 'cudnn' and mask == bias for kernel, mask, bias in calls)
  calls.clear()
  jax.eval_shape(Transformer(cfg).apply, {'params': params}, **_packed_inputs())  # targets of 7
  assert [kernel for kernel, _, _ in calls] == ['cudnn'] * 2 + [None] * 4
  calls.clear()
  jax.eval_shape(Transformer(cfg.with_execution(dtype=jnp.float32)).apply, {'params': params},
                 **even)
  assert {kernel for kernel, _, _ in calls} == {None}  # cuDNN's kernel is bf16/fp16 only
  for length in (64, 128, 192, 248):  # every even length, 64 more than a multiple of 128 too
    calls.clear()
    padded = {name: jnp.pad(x, ((0, 0), (0, length - x.shape[1])))
              for name, x in _packed_inputs().items()}
    jax.eval_shape(Transformer(cfg).apply, {'params': params}, **padded)
    assert {kernel for kernel, _, _ in calls} == {'cudnn'}, length


def test_bfloat16_keeps_layer_norm_softmax_and_logits_in_float32(tiny_model, tiny_config):
  _, params = tiny_model
  inputs = _packed_inputs()
  cfg = tiny_config.with_execution(dtype=jnp.bfloat16)
  logits, state = jax.jit(functools.partial(Transformer(cfg).apply, mutable=['intermediates']))(
      {'params': params}, **inputs)
  hidden = apply(Transformer(cfg), {'params': params}, inputs['src'], inputs['tgt_in'],
                 Layout.of(inputs), method=Transformer.forward_hidden)
  weights = state['intermediates']['decoder']['layers_0']['self_attention']['attention_weights']
  assert logits.dtype == jnp.float32 and hidden.dtype == jnp.float32  # after the final LN
  assert weights[0].dtype == jnp.bfloat16  # the softmax ran in float32, its output is cast
  np.testing.assert_allclose(np.asarray(weights[0], np.float32).sum(-1), 1.0, atol=1e-2)


def test_independent_qk_and_v_dims_shape_and_train():
  cfg = config_lib.tiny(vocab_size=32).replace(num_layers=1, qk_dim=4, v_dim=12)
  state = train.create_train_state(cfg, jax.random.key(0))
  attention = state.params['encoder']['layers_0']['self_attention']
  assert attention['query']['kernel'].shape == (32, 4, 4)
  assert attention['key']['kernel'].shape == (32, 4, 4)
  assert attention['value']['kernel'].shape == (32, 4, 12)
  assert attention['out']['kernel'].shape == (4, 12, 32)
  batch = {'src': jnp.array([[3, 4, 5, 6]]), 'tgt_in': jnp.array([[0, 7, 8]]),
           'tgt_out': jnp.array([[7, 8, 1]]), 'weights': jnp.ones((1, 3))}
  new_state, metrics = jax.jit(functools.partial(train.train_step, config=cfg))(
      state, batch, jax.random.key(1))
  assert np.isfinite(float(metrics['loss'])) and int(new_state.step) == 1
  model = Transformer(cfg)
  encoded = apply(model, {'params': state.params}, batch['src'], method=Transformer.encode)
  cache = model.apply({'params': state.params}, encoded, 5, method=Transformer.init_cache)
  assert cache['layers'][0]['self']['k'].shape == (1, 4, 4, 5)  # [B, H, K, L * beams]
  assert cache['layers'][0]['self']['v'].shape == (1, 4, 5, 12)  # [B, H, L * beams, J]


def _attention_weights(cfg, params, src, tgt):
  _, state = jax.jit(functools.partial(Transformer(cfg).apply, mutable=['intermediates']))(
      {'params': params}, src, tgt)
  return state['intermediates']


def test_window_zeroes_weights_beyond_r():
  r = 2
  cfg = config_lib.tiny(vocab_size=32).replace(attention_window=r)
  params = init_params(cfg)
  src = jnp.arange(3, 15)[None]
  tgt = jnp.arange(4, 14)[None]
  weights = _attention_weights(cfg, params, src, tgt)
  distance = np.abs(np.arange(12)[:, None] - np.arange(12)[None, :])
  for stack, length in (('encoder', 12), ('decoder', 10)):
    w = np.asarray(weights[stack]['layers_0']['self_attention']['attention_weights'][0])
    d = distance[:length, :length]
    assert np.all(w[..., d > r] == 0.0), stack
    assert np.all(w[..., d <= r].sum() > 0)
  w = np.asarray(weights['decoder']['layers_0']['cross_attention']['attention_weights'][0])
  assert np.all(w > 0), 'encoder-decoder attention stays unrestricted'


def test_window_bounds_the_receptive_field_to_r_times_n():
  r = 1
  cfg = config_lib.tiny(vocab_size=32).replace(attention_window=r)  # N = 2 layers
  params = init_params(cfg)
  encode = lambda src: apply(Transformer(cfg), {'params': params}, src,  # noqa: E731
                             method=Transformer.encode)
  src = jnp.arange(3, 15)[None]
  changed = src.at[0, 0].set(31)
  delta = np.abs(np.asarray(encode(changed) - encode(src)))[0].max(-1)  # [S]
  reach = r * cfg.num_layers
  assert np.all(delta[reach + 1:] == 0.0)
  assert np.all(delta[:reach + 1] > 0.0)


def test_a_window_as_long_as_the_input_is_full_attention():
  cfg = config_lib.tiny(vocab_size=32)
  params = init_params(cfg)
  src, tgt = jnp.arange(3, 15)[None], jnp.arange(4, 14)[None]
  full = apply(Transformer(cfg), {'params': params}, src, tgt)
  windowed = apply(Transformer(cfg.replace(attention_window=12)), {'params': params}, src, tgt)
  np.testing.assert_array_equal(windowed, full)


def test_learned_positions_are_parameters_and_sinusoids_are_not():
  cfg = config_lib.tiny(vocab_size=32)
  sinusoid = init_params(cfg)
  learned = init_params(cfg.replace(learned_positions=True))
  count = lambda p: sum(x.size for x in jax.tree.leaves(p))  # noqa: E731
  assert count(learned) - count(sinusoid) == 2 * cfg.max_len * cfg.d_model
  assert learned['encoder']['embedding']['position_embedding'].shape == (64, 32)
  assert learned['decoder']['embedding']['position_embedding'].shape == (64, 32)
  assert 'embedding' not in sinusoid['encoder']


def test_learned_table_refuses_longer_inputs_while_sinusoids_extend():
  cfg = config_lib.tiny(vocab_size=32)  # max_len 64
  long = jnp.ones((1, 80), jnp.int32)
  params = init_params(cfg.replace(learned_positions=True))
  with pytest.raises(ValueError, match='80 positions but the learned positional embeddings '
                                       'cover max_len=64'):
    jax.eval_shape(Transformer(cfg.replace(learned_positions=True)).apply, {'params': params},
                   long, long[:, :5])
  logits = apply(Transformer(cfg), {'params': init_params(cfg)}, long, long)
  assert logits.shape == (1, 80, 32) and bool(jnp.all(jnp.isfinite(logits)))
  pe = model_lib.sinusoidal_positions(jnp.arange(1000), 32)
  assert bool(jnp.all(jnp.isfinite(pe)))


def test_transformer_docstring_example_runs():
  import doctest  # pylint: disable=g-import-not-at-top
  examples = doctest.DocTestFinder().find(Transformer, 'Transformer')[0]
  assert examples.examples, 'the usage example is gone'
  result = doctest.DocTestRunner().run(examples)
  assert result.failed == 0
