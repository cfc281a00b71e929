"""Training state and the pure train/eval steps. Parallelism is applied where the loop wraps them."""

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct
from flax.training import train_state

from jaxformer import losses, optim
from jaxformer.config import TransformerConfig
from jaxformer.model import Transformer

Array = jax.Array
Batch = dict[str, Array]  # src, tgt_in, tgt_out, weights [B, S|T]; optional *_segments, *_positions
_LAYOUT_KEYS = ('src_segments', 'tgt_segments', 'src_positions', 'tgt_positions')


class TrainState(train_state.TrainState):
  """Params, optimiser state and step (flax), plus the config the step reads."""
  config: TransformerConfig = struct.field(pytree_node=False)


def create_train_state(config: TransformerConfig, rng: Array, src_len: int = 8,
                       tgt_len: int = 8) -> TrainState:
  """Initialises the model's params and the paper's optimiser."""
  model = Transformer(config)
  dummy_src = jnp.ones((1, src_len), jnp.int32)
  dummy_tgt = jnp.ones((1, tgt_len), jnp.int32)
  params = jax.jit(model.init)(rng, dummy_src, dummy_tgt)['params']
  return TrainState.create(apply_fn=model.apply, params=params,
                           tx=optim.make_optimizer(config), config=config)


def _logits(state: TrainState, params: Any, batch: Batch, **kwargs: Any) -> Array:
  layout = {key: batch[key] for key in _LAYOUT_KEYS if key in batch}
  return state.apply_fn({'params': params}, batch['src'], batch['tgt_in'], **layout, **kwargs)


def _sum(x: Any, axis_name: str | None) -> Any:
  return x if axis_name is None else jax.lax.psum(x, axis_name)


def train_step(state: TrainState, batch: Batch, rng: Array, *,
               axis_name: str | None = None) -> tuple[TrainState, dict[str, Array]]:
  """One update on `batch`; under pmap pass the axis name to combine devices.

  The loss is the label-smoothed sum divided by the number of real target tokens across all
  devices, so devices holding fewer tokens do not weigh more.
  """
  rng = jax.random.fold_in(rng, state.step)
  if axis_name is not None:
    rng = jax.random.fold_in(rng, jax.lax.axis_index(axis_name))

  def loss_fn(params):
    logits = _logits(state, params, batch, deterministic=False, rngs={'dropout': rng})
    loss_sum, weight_sum = losses.smoothed_cross_entropy(
        logits, batch['tgt_out'], batch['weights'], state.config.label_smoothing)
    return loss_sum, (logits, weight_sum)

  (loss_sum, (logits, weight_sum)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
      state.params)
  tokens = jnp.maximum(_sum(weight_sum, axis_name), 1.0)
  grads = jax.tree.map(lambda g: _sum(g, axis_name) / tokens, grads)
  correct, _ = losses.accuracy(logits, batch['tgt_out'], batch['weights'])
  metrics = {
      'loss': _sum(loss_sum, axis_name) / tokens,
      'accuracy': _sum(correct, axis_name) / tokens,
      'tokens': tokens,
      'grad_norm': optax.tree.norm(grads),
      'lr': optim.lrate_schedule(state.config.d_model, state.config.warmup_steps)(state.step),
  }
  return state.apply_gradients(grads=grads), metrics


def eval_step(state: TrainState, batch: Batch) -> dict[str, Array]:
  """Sums for one batch: smoothed loss, NLL, correct tokens and tokens."""
  logits = _logits(state, state.params, batch, deterministic=True)
  targets, weights = batch['tgt_out'], batch['weights']
  loss_sum, tokens = losses.smoothed_cross_entropy(
      logits, targets, weights, state.config.label_smoothing)
  nll_sum, _ = losses.cross_entropy(logits, targets, weights)
  correct, _ = losses.accuracy(logits, targets, weights)
  return {'loss_sum': loss_sum, 'nll_sum': nll_sum, 'correct': correct, 'tokens': tokens}
