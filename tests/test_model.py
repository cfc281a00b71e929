"""The model against the paper's definitions: positions, masks, shapes, parameter counts."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer import config as config_lib
from jaxformer import model as model_lib
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
  for t in range(length):
    grad = np.asarray(jax.grad(logits_at)(delta, t))[0]  # [T, D]
    assert np.all(grad[t + 1:] == 0.0), f'position {t} sees the future'
    assert np.all(np.abs(grad[: t + 1]).sum(-1) > 0), f'position {t} misses the past'


def test_padding_does_not_change_real_logits(tiny_model):
  model, params = tiny_model
  logits = model.apply({'params': params}, SRC, TGT)
  padded = model.apply({'params': params}, jnp.pad(SRC, ((0, 0), (0, 3))),
                       jnp.pad(TGT, ((0, 0), (0, 4))))
  np.testing.assert_allclose(padded[:, :TGT.shape[1]], logits, atol=1e-5)


def test_packed_pairs_are_isolated(tiny_model):
  """Two pairs packed in one row give the logits each pair gives alone."""
  model, params = tiny_model
  src_a, tgt_a = [5, 9, 3], [0, 4, 8, 6]
  src_b, tgt_b = [7, 2, 12, 10], [0, 11, 13]
  alone_a = model.apply({'params': params}, jnp.array([src_a]), jnp.array([tgt_a]))
  alone_b = model.apply({'params': params}, jnp.array([src_b]), jnp.array([tgt_b]))
  packed = model.apply(
      {'params': params},
      jnp.array([src_a + src_b + [0]]), jnp.array([tgt_a + tgt_b + [0, 0]]),
      src_segments=jnp.array([[1, 1, 1, 2, 2, 2, 2, 0]]),
      tgt_segments=jnp.array([[1, 1, 1, 1, 2, 2, 2, 0, 0]]),
      src_positions=jnp.array([[0, 1, 2, 0, 1, 2, 3, 0]]),
      tgt_positions=jnp.array([[0, 1, 2, 3, 0, 1, 2, 0, 0]]))
  np.testing.assert_allclose(packed[:, :4], alone_a, atol=1e-5)
  np.testing.assert_allclose(packed[:, 4:7], alone_b, atol=1e-5)


def test_jit_matches_eager(tiny_model):
  model, params = tiny_model
  eager = model.apply({'params': params}, SRC, TGT)
  jitted = jax.jit(model.apply)({'params': params}, SRC, TGT)
  np.testing.assert_allclose(jitted, eager, atol=1e-5)


def test_incremental_decoding_matches_full_decoding(tiny_model):
  model, params = tiny_model
  variables = {'params': params}
  src = jnp.array([[5, 9, 3, 7, 2], [8, 4, 0, 0, 0]])
  tgt = jnp.array([[0, 4, 8, 6, 11, 13], [0, 7, 7, 2, 9, 1]])
  full = model.apply(variables, src, tgt)
  encoded = model.apply(variables, src, method=Transformer.encode)
  cache = model.apply(variables, encoded, 8, method=Transformer.init_cache)
  step = jax.jit(lambda token, cache: model.apply(
      variables, src, token, cache, method=Transformer.decode_step))
  for t in range(tgt.shape[1]):
    logits, cache = step(tgt[:, t:t + 1], cache)
    np.testing.assert_allclose(logits, full[:, t], atol=1e-5, err_msg=f'step {t}')
  assert int(cache['index']) == tgt.shape[1]


def test_dropout_is_active_only_in_training(tiny_model):
  model, params = tiny_model
  def run(det: bool, seed: int):
    return model.apply({'params': params}, SRC, TGT, deterministic=det,
                       rngs={'dropout': jax.random.key(seed)})
  np.testing.assert_array_equal(run(True, 0), run(True, 1))
  assert not np.allclose(run(False, 0), run(False, 1))


def test_bfloat16_compute_keeps_float32_params_and_logits(tiny_config, tiny_model):
  _, params = tiny_model
  model = Transformer(tiny_config.run_as(dtype=jnp.bfloat16))
  logits = model.apply({'params': params}, SRC, TGT)
  assert logits.dtype == jnp.float32
  full = Transformer(tiny_config).apply({'params': params}, SRC, TGT)
  np.testing.assert_allclose(logits, full, atol=0.1)


def test_config_rejects_indivisible_heads():
  with pytest.raises(ValueError, match='divisible'):
    config_lib.base().replace(num_heads=7)
