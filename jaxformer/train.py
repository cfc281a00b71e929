"""The pure, jittable part of training: the state, the train step and the eval step.

Nothing here touches the host, the data pipeline or the disk: `trainer` wraps these in pmap
and runs the loop around them."""

import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct
from flax.training import train_state

from jaxformer import losses
from jaxformer import optim as optim_lib
from jaxformer.config import OptimConfig, TransformerConfig
from jaxformer.layout import Layout
from jaxformer.model import Transformer

Array = jax.Array
Batch = dict[str, Array]  # src, tgt_in, tgt_out, weights [B, S|T]; packed: Layout's fields too


class TrainState(train_state.TrainState):
  """Params, optimiser state and step (flax), plus the config the step reads, how it trains
  (label smoothing) and the learning rate schedule the optimiser was built with (the logged lr
  reads it)."""
  config: TransformerConfig = struct.field(pytree_node=False)
  optim: OptimConfig = struct.field(pytree_node=False)
  lr_schedule: optax.Schedule = struct.field(pytree_node=False)


def create_train_state(config: TransformerConfig, rng: Array, src_len: int = 8,
                       tgt_len: int = 8, *, optim: OptimConfig | None = None) -> TrainState:
  """Initialises the model's params and the optimiser of `optim` (default: the paper's)."""
  init = _model_and_optimizer(config, optim or OptimConfig())[1]
  dummy_src = jnp.ones((1, src_len), jnp.int32)
  dummy_tgt = jnp.ones((1, tgt_len), jnp.int32)
  return train_state_from_params(config, init(rng, dummy_src, dummy_tgt)['params'], optim=optim)


def train_state_from_params(config: TransformerConfig, params: Any, *,
                            optim: OptimConfig | None = None) -> TrainState:
  """A train state at step 0 of given params (e.g. a trained model's, to fine-tune it), with a
  fresh optimiser state and schedule of `optim` (default: the paper's)."""
  optim = optim or OptimConfig()
  model, _, schedule, tx = _model_and_optimizer(config, optim)
  return TrainState.create(apply_fn=model.apply, params=params, config=config, optim=optim,
                           tx=tx, lr_schedule=schedule)


@functools.lru_cache(maxsize=8)
def _model_and_optimizer(config: TransformerConfig, optim: OptimConfig
                         ) -> tuple[Transformer, Any, optax.Schedule, optax.GradientTransformation]:
  """The model, its jitted init, the schedule and the optimiser of a config, made once per
  process: states of equal configs then have equal static fields (the model's apply, the
  optimiser), so jitted steps compiled for one state are reused for the next, not traced again."""
  model = Transformer(config)
  schedule = optim_lib.make_schedule(config, optim)
  return model, jax.jit(model.init), schedule, optim_lib.make_optimizer(config, optim, schedule)


def _apply(state: TrainState, params: Any, batch: Batch, method: Any, **kwargs: Any) -> Array:
  return state.apply_fn({'params': params}, batch['src'], batch['tgt_in'], Layout.of(batch),
                        method=method, **kwargs)


def _sum(x: Any, axis_name: str | None) -> Any:
  return x if axis_name is None else jax.lax.psum(x, axis_name)


def _applied_updates(state: TrainState) -> Array:
  """The optimiser's own count of applied updates, which the schedule reads (state.step also
  counts skipped non-finite updates); state.step for an optimiser that keeps no count."""
  counts = optax.tree_utils.tree_get_all_with_path(state.opt_state, 'count')
  return counts[0][1] if counts else state.step


def train_step(state: TrainState, batch: Batch, rng: Array, *, axis_name: str | None = None,
               accum_steps: int = 1,
               skip_nonfinite: bool = False) -> tuple[TrainState, dict[str, Array]]:
  """One update on `batch`; under pmap pass the axis name to combine devices (under `jax.jit`
  over a mesh, `parallel.data_mesh` and `parallel.shard_rows`, pass none).

  The loss is the label-smoothed sum divided by the number of real target tokens across all
  devices, so devices holding fewer tokens do not weigh more. With accum_steps = k, the batch's
  rows are split into k micro-batches whose gradient sums are added before that one division:
  the same update as the whole batch at once, in a k-th of the activation memory. With
  skip_nonfinite, an update whose loss or gradients are not finite leaves params and optimiser
  state unchanged (metrics['nonfinite'] = 1).
  """
  rng = jax.random.fold_in(rng, state.step)
  if axis_name is not None:
    rng = jax.random.fold_in(rng, jax.lax.axis_index(axis_name))
  if state.config.execution.dropout_rng == 'rbg':  # this step's key, as an RngBitGenerator key
    rng = jax.random.wrap_key_data(jax.random.bits(rng, (4,), jnp.uint32), impl='rbg')

  def sums(params, micro_batch, micro_rng):
    """Gradient of the loss sum, and the sums behind the metrics, for one micro-batch."""
    def loss_fn(params):
      hidden = _apply(state, params, micro_batch, Transformer.forward_hidden,
                      deterministic=False, rngs={'dropout': micro_rng})
      loss_sum, weight_sum, correct = losses.chunked_smoothed_cross_entropy(
          hidden.astype(state.config.execution.dtype), params['embed']['embedding'],
          micro_batch['tgt_out'], micro_batch['weights'], state.optim.label_smoothing,
          chunk=state.config.execution.loss_chunk)
      return loss_sum, (weight_sum, correct)
    (loss_sum, (weight_sum, correct)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    return grads, jnp.stack([loss_sum, weight_sum, correct])

  if accum_steps == 1:
    grads, totals = sums(state.params, batch, rng)
  else:
    micro = jax.tree.map(lambda x: x.reshape(accum_steps, -1, *x.shape[1:]), batch)

    def accumulate(carry, inputs):
      index, micro_batch = inputs
      grads, totals = sums(state.params, micro_batch, jax.random.fold_in(rng, index))
      return jax.tree.map(jnp.add, carry, (grads, totals)), None

    zeros = (jax.tree.map(jnp.zeros_like, state.params), jnp.zeros(3))
    (grads, totals), _ = jax.lax.scan(accumulate, zeros, (jnp.arange(accum_steps), micro))
  loss_sum, tokens, correct = _sum(totals, axis_name)
  tokens = jnp.maximum(tokens, 1.0)
  grads = jax.tree.map(lambda g: _sum(g, axis_name) / tokens, grads)
  grad_norm = optax.tree.norm(grads)
  metrics = {
      'loss': loss_sum / tokens,
      'accuracy': correct / tokens,
      'tokens': tokens,
      'grad_norm': grad_norm,
      'lr': state.lr_schedule(_applied_updates(state)),
  }
  new_state = state.apply_gradients(grads=grads)
  finite = jnp.isfinite(metrics['loss']) & jnp.isfinite(grad_norm)
  metrics['nonfinite'] = 1.0 - finite.astype(jnp.float32)
  if skip_nonfinite:
    kept = jax.tree.map(lambda new, old: jnp.where(finite, new, old),
                        (new_state.params, new_state.opt_state), (state.params, state.opt_state))
    new_state = new_state.replace(params=kept[0], opt_state=kept[1])
  return new_state, metrics


def eval_step(state: TrainState, batch: Batch) -> dict[str, Array]:
  """Sums for one batch: smoothed loss, NLL, correct tokens and tokens."""
  logits = _apply(state, state.params, batch, Transformer.forward, deterministic=True)
  targets, weights = batch['tgt_out'], batch['weights']
  loss_sum, tokens = losses.smoothed_cross_entropy(
      logits, targets, weights, state.optim.label_smoothing)
  nll_sum, _ = losses.cross_entropy(logits, targets, weights)
  correct, _ = losses.accuracy(logits, targets, weights)
  return {'loss_sum': loss_sum, 'nll_sum': nll_sum, 'correct': correct, 'tokens': tokens}
