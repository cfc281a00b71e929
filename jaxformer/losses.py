"""Losses and metrics that return (sum, weight) so callers normalise once, across devices."""

import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp

Array = jax.Array


def _xlogx(p: float) -> float:
  return p * math.log(p) if p > 0 else 0.0


def _smoothing(epsilon: float, vocab: int) -> tuple[float, float, float]:
  """(confidence, low, entropy) of the smoothed target distribution."""
  confidence, low = 1.0 - epsilon, epsilon / (vocab - 1)
  return confidence, low, -(_xlogx(confidence) + (vocab - 1) * _xlogx(low))


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
  confidence, low, entropy = _smoothing(epsilon, logits.shape[-1])
  log_probs, target_log_prob = _log_probs_at(logits, targets)
  others_log_prob = jnp.sum(log_probs, axis=-1) - target_log_prob
  cross_entropy = -(confidence * target_log_prob + low * others_log_prob)
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


def _projected_chunk(hidden: Array, targets: Array, weights: Array, *, softmax_weights: Array,
                     weight_sum: Array, epsilon: float, with_grads: bool) -> Any:
  """[loss_sum, correct_sum] of one chunk (hidden [C, D], targets and weights [C]), and with
  with_grads the loss sum's gradients with respect to hidden [C, D] and the softmax weights
  [V, D] (float32). softmax_weights: the embedding in hidden's dtype; weight_sum [D]: the sum of
  its rows in float32 (both the same for every chunk)."""
  vocab = softmax_weights.shape[0]
  confidence, low, entropy = _smoothing(epsilon, vocab)
  # [C, V] stored in hidden's dtype, rounded as the model's own logits are, and read in float32
  # by each pass below: in bfloat16 the passes move half the bytes. The barrier keeps XLA from
  # computing the product in float32 instead (excess precision), which stores twice the bytes.
  logits = jax.lax.optimization_barrier(jnp.dot(hidden, softmax_weights.T)).astype(jnp.float32)
  top = jnp.max(logits, axis=-1)
  exp = jnp.exp(logits - top[:, None])
  log_z = top + jnp.log(jnp.sum(exp, axis=-1))  # [C]
  target_logit = jnp.take_along_axis(logits, targets[:, None], axis=-1)[:, 0]
  # sum_v z_v = h . sum_v w_v: a [C, D] reduction instead of another pass over the [C, V] logits
  # (not a matmul: the step's dots stay the model's, as jaxformer.flops counts them).
  logit_sum = jnp.sum(hidden.astype(jnp.float32) * weight_sum, axis=-1)
  # -(confidence log p_t + low sum_{v != t} log p_v), where sum_v log p_v = sum_v z_v - V log Z.
  cross_entropy = -((confidence - low) * (target_logit - log_z)
                    + low * (logit_sum - vocab * log_z))
  sums = jnp.stack([jnp.sum((cross_entropy - entropy) * weights),
                    jnp.sum((target_logit >= top) * weights)])  # a tie with the max is a hit
  if not with_grads:
    return sums
  # d loss / d logits = softmax - smoothed target; the one-hot is an iota compare, fused away.
  target_mass = low + (confidence - low) * (jnp.arange(vocab) == targets[:, None])
  probs = exp * jnp.exp(top - log_z)[:, None]
  d_logits = ((probs - target_mass) * weights[:, None]).astype(hidden.dtype)  # [C, V]
  d_hidden = jnp.dot(d_logits, softmax_weights)  # [C, D]
  d_embedding = jnp.dot(d_logits.T, hidden, preferred_element_type=jnp.float32)  # [V, D]
  return sums, d_hidden, d_embedding


def chunks(x: Array, chunk: int) -> Array:
  """[N, ...] -> [N / chunk, chunk, ...], zero-padded to whole chunks (zero weight, target 0):
  the positions a chunked projection takes at a time (the loss here, translation's scores)."""
  x = jnp.pad(x, [(0, -x.shape[0] % chunk)] + [(0, 0)] * (x.ndim - 1))
  return x.reshape(-1, chunk, *x.shape[1:])


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _projected_sums(hidden: Array, embedding: Array, targets: Array, weights: Array,
                    epsilon: float) -> Array:
  """[loss_sum, correct_sum] over chunks: hidden [N, C, D], targets and weights [N, C]."""
  project = _chunk_projection(hidden, embedding, epsilon, with_grads=False)
  body = lambda total, chunk: (total + project(*chunk), None)  # noqa: E731
  return jax.lax.scan(body, jnp.zeros(2), (hidden, targets, weights))[0]


def _projected_sums_fwd(hidden, embedding, targets, weights, epsilon):
  project = _chunk_projection(hidden, embedding, epsilon, with_grads=True)
  def body(carry, chunk):
    total, d_embedding = carry
    sums, d_hidden, d_emb = project(*chunk)
    return (total + sums, d_embedding + d_emb), d_hidden
  (sums, d_embedding), d_hidden = jax.lax.scan(
      body, (jnp.zeros(2), jnp.zeros(embedding.shape, jnp.float32)), (hidden, targets, weights))
  return sums, (d_hidden, d_embedding.astype(embedding.dtype))


def _chunk_projection(hidden: Array, embedding: Array, epsilon: float,
                      with_grads: bool) -> Callable[..., Any]:
  """_projected_chunk with what every chunk shares computed once, outside the loop."""
  softmax_weights = embedding.astype(hidden.dtype)
  return functools.partial(
      _projected_chunk, softmax_weights=softmax_weights, epsilon=epsilon, with_grads=with_grads,
      weight_sum=jnp.sum(softmax_weights.astype(jnp.float32), axis=0))


def _projected_sums_bwd(epsilon, grads, cotangent):
  del epsilon
  d_hidden, d_embedding = grads
  g = cotangent[0]  # correct_sum has no gradient
  return (g.astype(d_hidden.dtype) * d_hidden, g * d_embedding, None, None)


_projected_sums.defvjp(_projected_sums_fwd, _projected_sums_bwd)


def chunked_smoothed_cross_entropy(hidden: Array, embedding: Array, targets: Array,
                                   weights: Array, epsilon: float, *, chunk: int = 1024,
                                   bias: Array | None = None) -> tuple[Array, Array, Array]:
  """`smoothed_cross_entropy` and `accuracy` of logits = hidden @ embedding.T, without them.

  The softmax projection and the loss run over `chunk` positions at a time, so the [..., V]
  logits and their gradient never exist whole. The gradient is computed in the same pass as the
  loss (a custom VJP): the projection costs three matrix products, as with autodiff.

  Args:
    hidden: [..., D] decoder outputs, in the compute dtype.
    embedding: [V, D] the shared embedding (the softmax weights); cast to hidden's dtype.
    targets, weights: [...] as for `smoothed_cross_entropy`.
    epsilon: the smoothing mass epsilon_ls.
    chunk: positions per chunk (the last one is padded).
    bias: [V] added to the logits (config.output_bias), with its gradient: carried as one more
      column of the embedding against a column of ones in hidden, so that the projection and
      its custom VJP stay one matrix product.

  Returns:
    (loss_sum, weight_sum, correct_sum), float32 scalars; only loss_sum has a gradient.
  """
  if bias is not None:
    hidden = jnp.concatenate([hidden, jnp.ones((*hidden.shape[:-1], 1), hidden.dtype)], -1)
    embedding = jnp.concatenate([embedding, bias[:, None].astype(embedding.dtype)], -1)
  weights = weights.reshape(-1).astype(jnp.float32)
  chunk = min(chunk, weights.shape[0])
  loss_sum, correct = _projected_sums(
      chunks(hidden.reshape(-1, hidden.shape[-1]), chunk), embedding,
      chunks(targets.reshape(-1), chunk), chunks(weights, chunk), epsilon)
  return loss_sum, jnp.sum(weights), correct
