"""jaxformer.flops: the counted FLOPs equal the dots of XLA's own programs."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer import config as config_lib
from jaxformer import flops, train
from jaxformer.model import Transformer


def _dot_flops(jaxpr) -> int:
  """2 x multiply-adds of every dot_general in a jaxpr (scan bodies times their length)."""
  total = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'dot_general':
      (lhs_contract, _), _ = eqn.params['dimension_numbers']
      lhs_shape = eqn.invars[0].aval.shape
      total += 2 * math.prod(eqn.outvars[0].aval.shape) * math.prod(
          lhs_shape[d] for d in lhs_contract)
    repeat = eqn.params.get('length', 1) if eqn.primitive.name == 'scan' else 1
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else [param]:
        if isinstance(sub, jax.extend.core.ClosedJaxpr):
          total += repeat * _dot_flops(sub.jaxpr)
        elif isinstance(sub, jax.extend.core.Jaxpr):
          total += repeat * _dot_flops(sub)
  return total


FLOPS_CONFIG = config_lib.TransformerConfig(
    vocab_size=97, num_layers=2, d_model=24, d_ff=40, num_heads=3, qk_dim=4, v_dim=6,
    dropout_rate=0.0, execution=config_lib.Execution(loss_chunk=16))


def _flops_batch(rows=2, src_len=7, tgt_len=5):
  rng = np.random.default_rng(0)
  return {'src': jnp.asarray(rng.integers(3, 97, (rows, src_len))),
          'tgt_in': jnp.asarray(rng.integers(3, 97, (rows, tgt_len))),
          'tgt_out': jnp.asarray(rng.integers(3, 97, (rows, tgt_len))),
          'weights': jnp.ones((rows, tgt_len))}


def test_forward_flops_equal_the_dots_of_the_forward_pass():
  batch = _flops_batch()
  model = Transformer(FLOPS_CONFIG)
  params = jax.eval_shape(model.init, jax.random.key(0), batch['src'], batch['tgt_in'])['params']
  jaxpr = jax.make_jaxpr(lambda p: model.apply({'params': p}, batch['src'], batch['tgt_in']))
  assert _dot_flops(jaxpr(params).jaxpr) == flops.forward_flops(FLOPS_CONFIG, 2, 7, 5)


def test_train_flops_equal_the_dots_of_the_train_step():
  batch = _flops_batch()
  state = train.create_train_state(FLOPS_CONFIG, jax.random.key(0))
  jaxpr = jax.make_jaxpr(functools.partial(train.train_step, config=FLOPS_CONFIG))(
      state, batch, jax.random.key(1))
  counted = _dot_flops(jaxpr.jaxpr)
  assert counted == flops.train_flops(FLOPS_CONFIG, 2, 7, 5) == 3 * flops.forward_flops(
      FLOPS_CONFIG, 2, 7, 5)


def test_forward_flops_of_base_by_hand():
  """One 256-token row per side: 6 x (enc + dec) layers plus the softmax, written out."""
  d, f, v, n = 512, 2048, 37000, 256
  attention = 2 * (4 * n * d * d + 2 * n * n * d)
  ffn = 2 * 2 * n * d * f
  expected = 6 * ((attention + ffn) + (2 * attention + ffn)) + 2 * n * d * v
  assert flops.forward_flops(config_lib.base(), 1, n, n) == expected
