"""The pure, jittable part of training: the state, the train step and the eval step.

Nothing here touches the host, the data pipeline or the disk: `trainer` wraps these in pmap
and runs the loop around them."""

import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from jaxformer import losses
from jaxformer import optim as optim_lib
from jaxformer.config import OptimConfig, TransformerConfig
from jaxformer.layout import Layout
from jaxformer.model import Transformer

Array = jax.Array
Batch = dict[str, Array]  # src, tgt_in, tgt_out, weights [B, S|T]; packed: Layout's fields too


class TrainState(struct.PyTreeNode):
  """What a train step updates: the step count, the params and the optimiser state. It holds no
  setting: the model's config and the optimiser's are bound where the step is wrapped
  (`functools.partial(train_step, config=...)` before jit or pmap), so that equal settings give
  equal programs however many states are made."""
  step: Array | int
  params: Any
  opt_state: Any


def create_train_state(config: TransformerConfig, rng: Array, src_len: int = 8,
                       tgt_len: int = 8, *, optim: OptimConfig | None = None) -> TrainState:
  """Initialises the model's params and the optimiser of `optim` (default: the paper's).

  The params are drawn on the host's CPU, by the model computed the plain way (the values do
  not depend on config.execution): flax shapes them by tracing a forward pass, and on a GPU
  compiling that program (autotuned, with its fused attention) cost most of a small run's
  start (docs/BENCHMARKS.md). The caller puts the state where it trains (parallel.replicate)."""
  plain = config.replace(execution=type(config.execution)())
  with jax.default_device(_host_cpu()):
    dummy_src = jnp.ones((1, src_len), jnp.int32)
    dummy_tgt = jnp.ones((1, tgt_len), jnp.int32)
    params = _jitted_init(plain)(rng, dummy_src, dummy_tgt)['params']
    return train_state_from_params(config, params, optim=optim)


def _host_cpu() -> jax.Device | None:
  """The host's first CPU device (jax has one beside any accelerator); None where the CPU
  backend is switched off (JAX_PLATFORMS=cuda): then the default device."""
  try:
    return jax.local_devices(backend='cpu')[0]
  except RuntimeError:
    return None


def train_state_from_params(config: TransformerConfig, params: Any, *,
                            optim: OptimConfig | None = None) -> TrainState:
  """A train state at step 0 of given params (e.g. a trained model's, to fine-tune it), with a
  fresh state of the optimiser of `optim` (default: the paper's)."""
  return TrainState(step=0, params=params,
                    opt_state=optim_lib.make_optimizer(config, optim).init(params))


@functools.lru_cache(maxsize=8)
def _jitted_init(config: TransformerConfig) -> Any:
  """The model's init, jitted once per config (each state of an equal config reuses it)."""
  return jax.jit(Transformer(config).init)


def _apply(config: TransformerConfig, params: Any, batch: Batch, method: Any,
           **kwargs: Any) -> Array:
  return Transformer(config).apply({'params': params}, batch['src'], batch['tgt_in'],
                                   Layout.of(batch), method=method, **kwargs)


def _sum(x: Any, axis_name: str | None) -> Any:
  return x if axis_name is None else jax.lax.psum(x, axis_name)


def _applied_updates(state: TrainState) -> Array:
  """The optimiser's own count of applied updates, which the schedule reads (state.step also
  counts skipped non-finite updates); state.step for an optimiser that keeps no count."""
  counts = optax.tree_utils.tree_get_all_with_path(state.opt_state, 'count')
  return counts[0][1] if counts else state.step


def train_step(state: TrainState, batch: Batch, rng: Array, *, config: TransformerConfig,
               optim: OptimConfig | None = None, tx: optax.GradientTransformation | None = None,
               axis_name: str | None = None, accum_steps: int = 1,
               skip_nonfinite: bool = False) -> tuple[TrainState, dict[str, Array]]:
  """One update on `batch` of the model `config` describes, with the optimiser of `optim`
  (default: the paper's; `tx` to use another, whose state `state` must hold). Bind the
  settings before wrapping it: `jax.jit(functools.partial(train_step, config=config))`. Under
  pmap pass the axis name to combine devices (under `jax.jit` over a mesh,
  `parallel.data_mesh` and `parallel.shard_rows`, pass none).

  The loss is the label-smoothed sum divided by the number of real target tokens across all
  devices, so devices holding fewer tokens do not weigh more. With accum_steps = k, the batch's
  rows are split into k micro-batches whose gradient sums are added before that one division:
  the same update as the whole batch at once, in a k-th of the activation memory. With
  skip_nonfinite, an update whose loss or gradients are not finite leaves params and optimiser
  state unchanged (metrics['nonfinite'] = 1).
  """
  optim = optim or OptimConfig()
  schedule = optim_lib.make_schedule(config, optim)
  tx = tx or optim_lib.make_optimizer(config, optim, schedule)
  rng = jax.random.fold_in(rng, state.step)
  if axis_name is not None:
    rng = jax.random.fold_in(rng, jax.lax.axis_index(axis_name))
  if config.execution.dropout_rng == 'rbg':  # this step's key, as an RngBitGenerator key
    rng = jax.random.wrap_key_data(jax.random.bits(rng, (4,), jnp.uint32), impl='rbg')

  def sums(params, micro_batch, micro_rng):
    """Gradient of the loss sum, and the sums behind the metrics, for one micro-batch."""
    def loss_fn(params):
      hidden = _apply(config, params, micro_batch, Transformer.forward_hidden,
                      deterministic=False, rngs={'dropout': micro_rng})
      loss_sum, weight_sum, correct = losses.chunked_smoothed_cross_entropy(
          hidden.astype(config.execution.dtype), params['embed']['embedding'],
          micro_batch['tgt_out'], micro_batch['weights'], optim.label_smoothing,
          chunk=config.execution.loss_chunk, bias=params.get('output_bias'))
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
      'lr': schedule(_applied_updates(state)),
  }
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  new_state = state.replace(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                            opt_state=opt_state)
  finite = jnp.isfinite(metrics['loss']) & jnp.isfinite(grad_norm)
  metrics['nonfinite'] = 1.0 - finite.astype(jnp.float32)
  if skip_nonfinite:
    kept = jax.tree.map(lambda new, old: jnp.where(finite, new, old),
                        (new_state.params, new_state.opt_state), (state.params, state.opt_state))
    new_state = new_state.replace(params=kept[0], opt_state=kept[1])
  return new_state, metrics


def eval_step(state: TrainState, batch: Batch, *, config: TransformerConfig,
              optim: OptimConfig | None = None) -> dict[str, Array]:
  """Sums for one batch: smoothed loss (optim's label smoothing), NLL, correct tokens and
  tokens; the settings bound as for train_step."""
  logits = _apply(config, state.params, batch, Transformer.forward, deterministic=True)
  targets, weights = batch['tgt_out'], batch['weights']
  loss_sum, tokens = losses.smoothed_cross_entropy(
      logits, targets, weights, (optim or OptimConfig()).label_smoothing)
  nll_sum, _ = losses.cross_entropy(logits, targets, weights)
  correct, _ = losses.accuracy(logits, targets, weights)
  return {'loss_sum': loss_sum, 'nll_sum': nll_sum, 'correct': correct, 'tokens': tokens}
