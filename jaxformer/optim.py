"""The paper's optimiser (§5.3): Adam(0.9, 0.98, 1e-9) on the warmup / inverse-sqrt schedule."""

import jax.numpy as jnp
import optax

from jaxformer.config import TransformerConfig


def lrate_schedule(d_model: int, warmup_steps: int) -> optax.Schedule:
  """lrate = d_model^-0.5 * min(step_num^-0.5, step_num * warmup_steps^-1.5).

  optax passes the update count (0 for the first update); step_num = count + 1, so the first
  update uses a small positive rate instead of 0.
  """
  def schedule(count: jnp.ndarray) -> jnp.ndarray:
    step_num = jnp.asarray(count, jnp.float32) + 1.0
    return d_model ** -0.5 * jnp.minimum(step_num ** -0.5, step_num * warmup_steps ** -1.5)
  return schedule


def make_optimizer(config: TransformerConfig, schedule: optax.Schedule | None = None
                   ) -> optax.GradientTransformation:
  """Adam on `schedule` (default: the config's lrate_schedule); clipping and weight decay only
  when the config asks for them."""
  lr = schedule or lrate_schedule(config.d_model, config.warmup_steps)
  adam = dict(learning_rate=lr, b1=config.adam_b1, b2=config.adam_b2, eps=config.adam_eps)
  tx = optax.adamw(weight_decay=config.weight_decay, **adam) if config.weight_decay \
      else optax.adam(**adam)
  if config.grad_clip_norm is not None:
    tx = optax.chain(optax.clip_by_global_norm(config.grad_clip_norm), tx)
  return tx
