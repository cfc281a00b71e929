"""The paper's optimiser (§5.3): Adam(0.9, 0.98, 1e-9) on the warmup / inverse-sqrt schedule,
with what OptimConfig adds for fine-tuning and recovery (a peak learning rate, a scale,
clipping, weight decay)."""

import jax
import jax.numpy as jnp
import optax

from jaxformer.config import OptimConfig, TransformerConfig


def lrate_schedule(d_model: int, warmup_steps: int) -> optax.Schedule:
  """lrate = d_model^-0.5 * min(step_num^-0.5, step_num * warmup_steps^-1.5).

  optax passes the update count (0 for the first update); step_num = count + 1, so the first
  update uses a small positive rate instead of 0.
  """
  def schedule(count: jnp.ndarray) -> jnp.ndarray:
    step_num = jnp.asarray(count, jnp.float32) + 1.0
    return d_model ** -0.5 * jnp.minimum(step_num ** -0.5, step_num * warmup_steps ** -1.5)
  return schedule


def inverse_sqrt_schedule(peak: float, warmup_steps: int) -> optax.Schedule:
  """peak * min(step_num / warmup_steps, (warmup_steps / step_num)^0.5), step_num = count + 1:
  fairseq's inverse_sqrt. The paper's lrate is this curve with peak d_model^-0.5 *
  warmup_steps^-0.5; a peak of its own is what fine-tuning sets."""
  def schedule(count: jnp.ndarray) -> jnp.ndarray:
    step_num = jnp.asarray(count, jnp.float32) + 1.0
    return peak * jnp.minimum(step_num / warmup_steps, (warmup_steps / step_num) ** 0.5)
  return schedule


def make_schedule(config: TransformerConfig, optim: OptimConfig | None = None) -> optax.Schedule:
  """The learning rate of `optim` (default: the paper's): lrate_schedule, or the
  inverse_sqrt_schedule of optim.learning_rate, times optim.lr_scale."""
  optim = optim or OptimConfig()
  if optim.learning_rate is None:
    schedule = lrate_schedule(config.d_model, optim.warmup_steps)
  else:
    schedule = inverse_sqrt_schedule(optim.learning_rate, optim.warmup_steps)
  if optim.lr_scale == 1.0:  # the paper's formula exactly, not times 1.0
    return schedule
  return lambda count: optim.lr_scale * schedule(count)


def make_optimizer(config: TransformerConfig, optim: OptimConfig | None = None,
                   schedule: optax.Schedule | None = None) -> optax.GradientTransformation:
  """Adam on `schedule` (default: make_schedule(config, optim)); clipping and weight decay only
  when `optim` asks for them."""
  optim = optim or OptimConfig()
  adam = dict(learning_rate=schedule or make_schedule(config, optim), b1=optim.adam_b1,
              b2=optim.adam_b2, eps=optim.adam_eps)
  tx = optax.adamw(weight_decay=optim.weight_decay, **adam) if optim.weight_decay \
      else optax.adam(**adam)
  if optim.grad_clip_norm is not None:
    tx = optax.chain(optax.clip_by_global_norm(optim.grad_clip_norm), tx)
  return tx


_CARRIED = (optax.ScaleByAdamState, optax.ScaleByScheduleState)


def carry_state(old_state: optax.OptState, new_state: optax.OptState) -> optax.OptState:
  """`new_state` (a fresh init) holding `old_state`'s Adam moments and update counts.

  Turning clipping or weight decay on or off changes the optimiser's chain, and so the shape of
  its state, but not the parts that carry over from update to update (Adam's moments and
  count, the schedule's count): those are moved across by type, so that a resume may change
  any OptimConfig setting."""
  is_carried = lambda x: isinstance(x, _CARRIED)  # noqa: E731
  carried = {kind: [node for node in jax.tree.leaves(old_state, is_leaf=is_carried)
                    if type(node) is kind] for kind in _CARRIED}

  def take(node: object) -> object:
    return carried[type(node)].pop(0) if is_carried(node) and carried[type(node)] else node
  return jax.tree.map(take, new_state, is_leaf=is_carried)
