"""Table 3 variants: parameter counts, independent d_k/d_v, learned positions, restricted
self-attention."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer import config as config_lib
from jaxformer import model as model_lib
from jaxformer import cli, train
from jaxformer.model import Transformer
from jaxformer.recipes import table3


def _formula(v, n, d, f, h, dk, dv, learned_positions=False, max_len=256) -> int:
  """Tied V x D embedding; biases on every projection; LayerNorm scale + bias per sub-layer."""
  attention = (d * h * dk + h * dk) * 2 + (d * h * dv + h * dv) + (h * dv * d + d)
  ffn = d * f + f + f * d + d
  encoder_layer = attention + ffn + 2 * 2 * d
  decoder_layer = 2 * attention + ffn + 3 * 2 * d
  positions = 2 * max_len * d if learned_positions else 0
  return v * d + n * (encoder_layer + decoder_layer) + positions


@pytest.mark.parametrize('name', list(table3.VARIANTS))
def test_variant_parameter_count_matches_the_formula(name):
  cfg = table3.variant_config(name)
  expected = _formula(37000, cfg.num_layers, cfg.d_model, cfg.d_ff, cfg.num_heads, cfg.key_dim,
                      cfg.value_dim, cfg.learned_positions, cfg.max_len)
  assert model_lib.parameter_count(cfg) == expected


def test_variants_change_only_their_row():
  base = config_lib.base()
  for name, row in table3.VARIANTS.items():
    cfg = table3.variant_config(name)
    changed = {k for k in row.changes if getattr(cfg, k) != getattr(base, k)}
    assert {k: getattr(cfg, k) for k in changed} == {
        k: v for k, v in row.changes.items() if k in changed}
    assert cfg.replace(**{k: getattr(base, k) for k in row.changes}) == base
  assert table3.variant_config('big') == config_lib.big()
  assert table3.train_overrides('big')['num_steps'] == 300_000
  with pytest.raises(ValueError, match='unknown Table 3 variant'):
    table3.variant_config('Z9')


def test_readme_table_is_the_generated_one():
  readme = (pathlib.Path(__file__).resolve().parents[1] / 'README.md').read_text()
  assert table3.markdown_table() in readme
  low, high = table3.matching_vocabulary()
  assert f'{low:,.0f} <= V <= {high:,.0f}' in readme


def test_independent_qk_and_v_dims_shape_and_train():
  cfg = config_lib.tiny(vocab_size=32).replace(qk_dim=4, v_dim=12)
  state = train.create_train_state(cfg, jax.random.key(0))
  attention = state.params['encoder']['layers_0']['self_attention']
  assert attention['query']['kernel'].shape == (32, 4, 4)
  assert attention['key']['kernel'].shape == (32, 4, 4)
  assert attention['value']['kernel'].shape == (32, 4, 12)
  assert attention['out']['kernel'].shape == (4, 12, 32)
  batch = {'src': jnp.array([[3, 4, 5, 6]]), 'tgt_in': jnp.array([[0, 7, 8]]),
           'tgt_out': jnp.array([[7, 8, 1]]), 'weights': jnp.ones((1, 3))}
  new_state, metrics = jax.jit(train.train_step)(state, batch, jax.random.key(1))
  assert np.isfinite(float(metrics['loss'])) and int(new_state.step) == 1
  model = Transformer(cfg)
  encoded = model.apply({'params': state.params}, batch['src'], method=Transformer.encode)
  cache = model.apply({'params': state.params}, encoded, 5, method=Transformer.init_cache)
  assert cache['layers'][0]['self']['k'].shape == (1, 4, 4, 5)  # [B, H, K, L * beams]
  assert cache['layers'][0]['self']['v'].shape == (1, 4, 5, 12)  # [B, H, L * beams, J]


# --- restricted self-attention ------------------------------------------------------------------


def _init(cfg, length=12):
  tokens = jnp.ones((1, length), jnp.int32)
  return Transformer(cfg).init(jax.random.key(0), tokens, tokens)['params']


def _attention_weights(cfg, params, src, tgt):
  _, state = Transformer(cfg).apply({'params': params}, src, tgt, mutable=['intermediates'])
  return state['intermediates']


def test_window_zeroes_weights_beyond_r():
  r = 2
  cfg = config_lib.tiny(vocab_size=32).replace(attention_window=r)
  params = _init(cfg)
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
  params = _init(cfg)
  encode = lambda src: Transformer(cfg).apply({'params': params}, src,  # noqa: E731
                                              method=Transformer.encode)
  src = jnp.arange(3, 15)[None]
  changed = src.at[0, 0].set(31)
  delta = np.abs(np.asarray(encode(changed) - encode(src)))[0].max(-1)  # [S]
  reach = r * cfg.num_layers
  assert np.all(delta[reach + 1:] == 0.0)
  assert np.all(delta[:reach + 1] > 0.0)


def test_a_window_as_long_as_the_input_is_full_attention():
  cfg = config_lib.tiny(vocab_size=32)
  params = _init(cfg)
  src, tgt = jnp.arange(3, 15)[None], jnp.arange(4, 14)[None]
  full = Transformer(cfg).apply({'params': params}, src, tgt)
  windowed = Transformer(cfg.replace(attention_window=12)).apply({'params': params}, src, tgt)
  np.testing.assert_array_equal(windowed, full)


def test_windowed_incremental_decoding_matches_full_decoding():
  cfg = config_lib.tiny(vocab_size=32).replace(attention_window=2)
  params = _init(cfg)
  model, variables = Transformer(cfg), {'params': params}
  src, tgt = jnp.arange(3, 10)[None], jnp.array([[0, 5, 9, 4, 7, 2, 8]])
  full = model.apply(variables, src, tgt)
  encoded = model.apply(variables, src, method=Transformer.encode)
  cache = model.apply(variables, encoded, 8, method=Transformer.init_cache)
  for t in range(tgt.shape[1]):
    logits, cache = model.apply(variables, src, tgt[:, t:t + 1], cache,
                                method=Transformer.decode_step)
    np.testing.assert_allclose(logits, full[:, t], atol=1e-5)


# --- learned positional embeddings --------------------------------------------------------------


def test_learned_positions_are_parameters_and_sinusoids_are_not():
  cfg = config_lib.tiny(vocab_size=32)
  sinusoid = _init(cfg)
  learned = _init(cfg.replace(learned_positions=True))
  count = lambda p: sum(x.size for x in jax.tree.leaves(p))  # noqa: E731
  assert count(learned) - count(sinusoid) == 2 * cfg.max_len * cfg.d_model
  assert learned['encoder']['embedding']['position_embedding'].shape == (64, 32)
  assert learned['decoder']['embedding']['position_embedding'].shape == (64, 32)
  assert 'embedding' not in sinusoid['encoder']


def test_learned_table_refuses_longer_inputs_while_sinusoids_extend():
  cfg = config_lib.tiny(vocab_size=32)  # max_len 64
  long = jnp.ones((1, 80), jnp.int32)
  params = _init(cfg.replace(learned_positions=True))
  with pytest.raises(ValueError, match='80 positions but the learned positional embeddings '
                                       'cover max_len=64'):
    Transformer(cfg.replace(learned_positions=True)).apply({'params': params}, long, long[:, :5])
  logits = Transformer(cfg).apply({'params': _init(cfg)}, long, long)
  assert logits.shape == (1, 80, 32) and bool(jnp.all(jnp.isfinite(logits)))
  pe = model_lib.sinusoidal_positions(jnp.arange(1000), 32)
  assert bool(jnp.all(jnp.isfinite(pe)))


def _recipe(*argv: str):
  return cli.recipe_of(cli.build_parser().parse_args(['train', '--workdir', 'w', *argv]))


def test_train_command_selects_a_variant():
  recipe = _recipe('--config', 'base', '--variant', 'C3')
  assert recipe.model == table3.variant_config('C3') and recipe.model.num_layers == 8
  assert recipe.train.num_steps == 100_000 and recipe.data.source == 'wmt14'
  recipe = _recipe('--config', 'base', '--variant', 'big', '--num-steps', '7')
  assert recipe.model == config_lib.big() and recipe.train.num_steps == 7
  assert recipe.train.average_last == 20


def test_an_unknown_variant_is_a_one_line_error(capsys):
  assert cli.main(['train', '--config', 'base', '--workdir', 'w', '--variant', 'Z9']) == 1
  assert capsys.readouterr().err.startswith("error: unknown Table 3 variant 'Z9'")
