"""Losses against hand computations."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer import losses


def _hand_smoothed(logits, target, eps):
  """KL(q || softmax(logits)) with q = 1 - eps on the target and eps / (V - 1) elsewhere."""
  v = len(logits)
  log_z = math.log(sum(math.exp(x) for x in logits))
  q = [1 - eps if k == target else eps / (v - 1) for k in range(v)]
  return sum(qk * (math.log(qk) - (x - log_z)) for qk, x in zip(q, logits) if qk > 0)


def test_smoothed_cross_entropy_on_a_hand_example():
  logits = jnp.array([[[0.0, 1.0, 2.0, 3.0], [2.0, -1.0, 0.5, 0.0], [9.0, 9.0, 9.0, 9.0]]])
  targets = jnp.array([[1, 0, 3]])
  weights = jnp.array([[1.0, 1.0, 0.0]])  # the third position is padding
  loss_sum, weight_sum = losses.smoothed_cross_entropy(logits, targets, weights, 0.1)
  expected = (_hand_smoothed([0.0, 1.0, 2.0, 3.0], 1, 0.1)
              + _hand_smoothed([2.0, -1.0, 0.5, 0.0], 0, 0.1))
  assert float(weight_sum) == 2.0
  assert float(loss_sum) == pytest.approx(expected, rel=1e-6)
  # Spelled out for the first position: q = [1/30, 0.9, 1/30, 1/30].
  log_p = np.array([0.0, 1.0, 2.0, 3.0]) - np.log(np.exp([0.0, 1.0, 2.0, 3.0]).sum())
  q = np.array([1 / 30, 0.9, 1 / 30, 1 / 30])
  assert _hand_smoothed([0.0, 1.0, 2.0, 3.0], 1, 0.1) == pytest.approx(
      float(np.sum(q * (np.log(q) - log_p))))


def test_smoothed_loss_is_zero_at_the_smoothed_target():
  eps, v = 0.1, 5
  q = np.full(v, eps / (v - 1))
  q[2] = 1 - eps
  loss_sum, _ = losses.smoothed_cross_entropy(jnp.log(jnp.array([[q]])), jnp.array([[2]]),
                                              jnp.ones((1, 1)), eps)
  assert float(loss_sum) == pytest.approx(0.0, abs=1e-6)


def test_no_smoothing_is_the_nll():
  logits = jnp.array([[[0.3, -1.2, 2.0], [1.0, 1.0, 0.0]]])
  targets, weights = jnp.array([[2, 1]]), jnp.ones((1, 2))
  smoothed, _ = losses.smoothed_cross_entropy(logits, targets, weights, 0.0)
  nll, count = losses.cross_entropy(logits, targets, weights)
  expected = -(math.log(math.exp(2.0) / (math.exp(0.3) + math.exp(-1.2) + math.exp(2.0)))
               + math.log(math.exp(1.0) / (2 * math.exp(1.0) + 1.0)))
  assert float(nll) == pytest.approx(expected, rel=1e-6)
  assert float(smoothed) == pytest.approx(expected, rel=1e-6)
  assert float(count) == 2.0


def test_bfloat16_logits_are_scored_in_float32():
  logits = jnp.array([[[0.0, 1.0, 2.0, 3.0]]], jnp.bfloat16)
  loss_sum, _ = losses.smoothed_cross_entropy(logits, jnp.array([[1]]), jnp.ones((1, 1)), 0.1)
  assert loss_sum.dtype == jnp.float32
  assert float(loss_sum) == pytest.approx(_hand_smoothed([0.0, 1.0, 2.0, 3.0], 1, 0.1), rel=1e-6)


def test_accuracy_counts_weighted_argmax_hits():
  logits = jnp.array([[[0.0, 5.0], [5.0, 0.0], [5.0, 0.0]]])
  correct, count = losses.accuracy(logits, jnp.array([[1, 1, 0]]), jnp.array([[1, 1, 0]]))
  assert (float(correct), float(count)) == (1.0, 2.0)
