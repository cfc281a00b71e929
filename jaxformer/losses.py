"""Losses and metrics that return (sum, weight) so callers normalise once, across devices."""

import math

import jax
import jax.numpy as jnp

Array = jax.Array


def _xlogx(p: float) -> float:
  return p * math.log(p) if p > 0 else 0.0


def _log_probs_at(logits: Array, targets: Array) -> tuple[Array, Array]:
  """float32 log-softmax [..., V] and its entry at each target [...]."""
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return log_probs, jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]


def smoothed_cross_entropy(logits: Array, targets: Array, weights: Array,
                           epsilon: float) -> tuple[Array, Array]:
  """Label-smoothed cross entropy (§5.4), summed over weighted positions.

  The smoothed target puts 1 - epsilon on the true token and epsilon / (V - 1) on every other
  one. As in tensor2tensor, the target distribution's own entropy is subtracted, so the loss is
  KL(target || model): 0 at the optimum, with the same gradients as the plain cross entropy.
  No [..., V] one-hot is materialised.

  Args:
    logits: [..., V] in any float dtype; computed in float32.
    targets: [...] integer ids.
    weights: [...] 1.0 for real tokens, 0.0 for padding.
    epsilon: the smoothing mass epsilon_ls.

  Returns:
    (loss_sum, weight_sum), both float32 scalars.
  """
  vocab = logits.shape[-1]
  confidence, low = 1.0 - epsilon, epsilon / (vocab - 1)
  log_probs, target_log_prob = _log_probs_at(logits, targets)
  others_log_prob = jnp.sum(log_probs, axis=-1) - target_log_prob
  cross_entropy = -(confidence * target_log_prob + low * others_log_prob)
  entropy = -(_xlogx(confidence) + (vocab - 1) * _xlogx(low))
  weights = weights.astype(jnp.float32)
  return jnp.sum((cross_entropy - entropy) * weights), jnp.sum(weights)


def cross_entropy(logits: Array, targets: Array, weights: Array) -> tuple[Array, Array]:
  """Unsmoothed negative log-likelihood (for perplexity): (nll_sum, weight_sum)."""
  _, target_log_prob = _log_probs_at(logits, targets)
  weights = weights.astype(jnp.float32)
  return -jnp.sum(target_log_prob * weights), jnp.sum(weights)


def accuracy(logits: Array, targets: Array, weights: Array) -> tuple[Array, Array]:
  """Weighted count of argmax predictions equal to the target: (correct_sum, weight_sum)."""
  weights = weights.astype(jnp.float32)
  correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
  return jnp.sum(correct * weights), jnp.sum(weights)
