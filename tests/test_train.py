"""The pure train step: a stored first-step loss, device-count independence, and learning."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxformer import config as config_lib
from jaxformer import train

EOS = 1


def reverse_batch(rng: np.random.Generator, batch: int, length: int, vocab: int) -> dict:
  """Random sequences and their reversal, with EOS; the decoder input starts with 0."""
  src = rng.integers(2, vocab, size=(batch, length))
  tgt = np.concatenate([src[:, ::-1], np.full((batch, 1), EOS)], axis=1)
  tgt_in = np.concatenate([np.zeros((batch, 1), int), tgt[:, :-1]], axis=1)
  return {'src': jnp.asarray(src), 'tgt_in': jnp.asarray(tgt_in), 'tgt_out': jnp.asarray(tgt),
          'weights': jnp.ones(tgt.shape, jnp.float32)}


def test_first_step_matches_the_stored_loss():
  """Update the stored values only if the change to the model or step was intended."""
  cfg = config_lib.tiny(vocab_size=32)
  state = train.create_train_state(cfg, jax.random.key(0))
  batch = reverse_batch(np.random.default_rng(0), batch=8, length=6, vocab=32)
  step = jax.jit(train.train_step)
  state, first = step(state, batch, jax.random.key(1))
  _, second = step(state, batch, jax.random.key(1))
  assert float(first['loss']) == pytest.approx(STORED_FIRST_LOSS, rel=1e-5), \
      'the first-step loss changed: update STORED_FIRST_LOSS only if the change was intended'
  assert float(second['loss']) == pytest.approx(STORED_SECOND_LOSS, rel=1e-5), \
      'the second-step loss changed: update STORED_SECOND_LOSS only if the change was intended'
  assert float(first['lr']) == pytest.approx(32 ** -0.5 * 100 ** -1.5, rel=1e-6)


STORED_FIRST_LOSS = 3.3386624
STORED_SECOND_LOSS = 3.3430729


def test_loss_is_normalised_by_the_global_token_count():
  """Two shards with uneven token counts, combined by psum, equal one step on the whole batch."""
  cfg = config_lib.tiny(vocab_size=32).replace(dropout_rate=0.0)
  # Plain SGD with rate 1 makes the update the gradient itself (Adam's first step is ~sign(g)).
  state = train.create_train_state(cfg, jax.random.key(0)).replace(tx=optax.sgd(1.0))
  state = state.replace(opt_state=state.tx.init(state.params))
  batch = reverse_batch(np.random.default_rng(1), batch=4, length=6, vocab=32)
  batch['weights'] = batch['weights'].at[:2, 3:].set(0.0)  # shard 0 holds fewer real tokens
  whole, whole_metrics = jax.jit(train.train_step)(state, batch, jax.random.key(2))

  shards = jax.tree.map(lambda x: x.reshape(2, 2, *x.shape[1:]), batch)
  sharded_step = jax.jit(jax.vmap(
      lambda s, b: train.train_step(s, b, jax.random.key(2), axis_name='batch'),
      in_axes=(None, 0), axis_name='batch'))
  split, split_metrics = sharded_step(state, shards)
  np.testing.assert_allclose(split_metrics['loss'][0], whole_metrics['loss'], rtol=1e-5)
  for a, b in zip(jax.tree.leaves(whole.params), jax.tree.leaves(split.params)):
    np.testing.assert_allclose(b[0], a, atol=1e-6, rtol=1e-5)


@pytest.mark.slow
def test_tiny_learns_to_reverse_sequences():
  """The paper's recipe (dropout, label smoothing, Adam, lrate) on a reversal task: >= 99%."""
  cfg = config_lib.tiny(vocab_size=32)
  state = train.create_train_state(cfg, jax.random.key(0))
  step, evaluate = jax.jit(train.train_step), jax.jit(train.eval_step)
  rng = np.random.default_rng(0)
  held_out = reverse_batch(np.random.default_rng(123), batch=256, length=10, vocab=32)
  accuracy = 0.0
  for i in range(1, 1001):
    state, _ = step(state, reverse_batch(rng, batch=64, length=10, vocab=32), jax.random.key(1))
    if i % 100 == 0:
      sums = evaluate(state, held_out)
      accuracy = float(sums['correct'] / sums['tokens'])
      if accuracy >= 0.99:
        break
  assert accuracy >= 0.99, f'held-out token accuracy {accuracy:.4f} after {i} steps'


def test_gradient_accumulation_equals_the_big_batch():
  cfg = config_lib.tiny(vocab_size=32).replace(dropout_rate=0.0)
  state = train.create_train_state(cfg, jax.random.key(0)).replace(tx=optax.sgd(1.0))
  state = state.replace(opt_state=state.tx.init(state.params))
  batch = reverse_batch(np.random.default_rng(2), batch=4, length=6, vocab=32)
  batch['weights'] = batch['weights'].at[0, 2:].set(0.0)  # micro-batches of unequal size
  whole, whole_metrics = jax.jit(train.train_step)(state, batch, jax.random.key(3))
  accumulated, metrics = jax.jit(functools.partial(train.train_step, accum_steps=2))(
      state, batch, jax.random.key(3))
  for key in ('loss', 'accuracy', 'tokens'):
    np.testing.assert_allclose(metrics[key], whole_metrics[key], rtol=1e-6)
  for a, b in zip(jax.tree.leaves(whole.params), jax.tree.leaves(accumulated.params)):
    np.testing.assert_allclose(b, a, atol=1e-6, rtol=1e-5)
