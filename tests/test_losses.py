"""jaxformer.losses: label smoothing by hand, and the chunked loss against whole logits."""

import functools
import math

import jax
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


def _hidden_case(seed=0, n_batch=3, length=7, d=16, vocab=50, dtype=jnp.float32):
  rng = np.random.default_rng(seed)
  hidden = jnp.asarray(rng.standard_normal((n_batch, length, d)), dtype)
  embedding = jnp.asarray(rng.standard_normal((vocab, d)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, vocab, (n_batch, length)))
  weights = jnp.asarray(rng.random((n_batch, length)) > 0.3, jnp.float32)
  return hidden, embedding, targets, weights


def _reference(hidden, embedding, targets, weights, epsilon):
  """The loss through whole [..., V] logits and autodiff: (loss, (weight_sum, correct))."""
  logits = jnp.dot(hidden, embedding.astype(hidden.dtype).T).astype(jnp.float32)  # as the model's
  loss_sum, weight_sum = losses.smoothed_cross_entropy(logits, targets, weights, epsilon)
  correct, _ = losses.accuracy(logits, targets, weights)
  return loss_sum, (weight_sum, correct)


@pytest.mark.parametrize('epsilon', [0.1, 0.0])
@pytest.mark.parametrize('chunk', [4, 21, 64])  # 21 positions: ragged, exact, one padded chunk
def test_chunked_loss_equals_the_loss_of_whole_logits(epsilon, chunk):
  case = _hidden_case()

  def chunked(hidden, embedding, targets, weights):
    loss_sum, weight_sum, correct = losses.chunked_smoothed_cross_entropy(
        hidden, embedding, targets, weights, epsilon, chunk=chunk)
    return loss_sum, (weight_sum, correct)

  grad = functools.partial(jax.value_and_grad, argnums=(0, 1), has_aux=True)
  (want, (want_n, want_c)), want_grads = grad(_reference)(*case, epsilon)
  (got, (got_n, got_c)), got_grads = jax.jit(grad(chunked))(*case)
  assert float(got) == pytest.approx(float(want), rel=1e-5)
  assert float(got_n) == float(want_n) == float(case[3].sum())
  assert float(got_c) == float(want_c)
  for g, w in zip(got_grads, want_grads):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)


def test_chunked_loss_with_an_output_bias_equals_the_loss_of_biased_logits():
  """config.output_bias: the bias rides as one more embedding column; the loss and the
  gradients of hidden, embedding and bias are those of whole logits + bias, by autodiff."""
  hidden, embedding, targets, weights = _hidden_case()
  bias = jnp.asarray(np.random.default_rng(1).standard_normal(embedding.shape[0]), jnp.float32)

  def reference(hidden, embedding, bias):
    logits = jnp.dot(hidden, embedding.T) + bias
    return losses.smoothed_cross_entropy(logits, targets, weights, 0.1)[0]

  def chunked(hidden, embedding, bias):
    return losses.chunked_smoothed_cross_entropy(hidden, embedding, targets, weights, 0.1,
                                                 chunk=8, bias=bias)[0]

  want, want_grads = jax.value_and_grad(reference, argnums=(0, 1, 2))(hidden, embedding, bias)
  got, got_grads = jax.jit(jax.value_and_grad(chunked, argnums=(0, 1, 2)))(hidden, embedding,
                                                                           bias)
  assert float(got) == pytest.approx(float(want), rel=1e-5)
  assert float(got) != pytest.approx(float(reference(hidden, embedding, 0 * bias)), rel=1e-3)
  for g, w in zip(got_grads, want_grads):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)


def test_chunked_loss_scales_its_gradient_by_the_cotangent():
  hidden, embedding, targets, weights = _hidden_case()
  loss = lambda h, s: s * losses.chunked_smoothed_cross_entropy(  # noqa: E731
      h, embedding, targets, weights, 0.1, chunk=8)[0]
  np.testing.assert_allclose(jax.grad(loss)(hidden, 3.0), 3 * jax.grad(loss)(hidden, 1.0),
                             rtol=1e-6)


def test_chunked_loss_in_bfloat16_is_close_to_float32():
  case32 = _hidden_case(d=32, vocab=300)
  case16 = (case32[0].astype(jnp.bfloat16), *case32[1:])
  want, _ = _reference(*case32, 0.1)
  got, _, _ = losses.chunked_smoothed_cross_entropy(*case16, 0.1, chunk=8)
  assert float(got) == pytest.approx(float(want), rel=2e-2)
  d_hidden = jax.grad(lambda h: losses.chunked_smoothed_cross_entropy(
      h, *case16[1:], 0.1, chunk=8)[0])(case16[0])
  assert d_hidden.dtype == jnp.bfloat16


def test_chunked_loss_in_bfloat16_scores_the_models_bfloat16_logits():
  """In bfloat16 the chunks' logits are rounded to bfloat16, as `Transformer.logits` rounds
  them, so the loss is that of the model's own logits, not a more precise one."""
  case16 = _hidden_case(d=32, vocab=300, dtype=jnp.bfloat16)
  want, (_, want_correct) = _reference(*case16, 0.1)
  got, _, correct = losses.chunked_smoothed_cross_entropy(*case16, 0.1, chunk=8)
  assert float(got) == pytest.approx(float(want), rel=1e-6)
  assert float(correct) == float(want_correct)
