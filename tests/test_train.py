"""jaxformer.train: the pure train and eval steps."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxformer import config as config_lib
from jaxformer import losses, train
from jaxformer.model import Transformer

EOS = 1
# The step's tests train tiny with one layer (their compiles are about a third cheaper); the
# stored loss is tiny's own, two layers.
CFG = config_lib.tiny(vocab_size=32).replace(num_layers=1)
OPTIM = config_lib.OptimConfig(warmup_steps=100)  # tiny's short runs warm up in 100 steps


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
  state = train.create_train_state(cfg, jax.random.key(0), optim=OPTIM)
  batch = reverse_batch(np.random.default_rng(0), batch=8, length=6, vocab=32)
  step = jax.jit(functools.partial(train.train_step, config=cfg, optim=OPTIM))
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
  cfg = CFG.replace(dropout_rate=0.0)
  # Plain SGD with rate 1 makes the update the gradient itself (Adam's first step is ~sign(g)).
  sgd = optax.sgd(1.0)
  state = train.create_train_state(cfg, jax.random.key(0), optim=OPTIM)
  state = state.replace(opt_state=sgd.init(state.params))
  step = functools.partial(train.train_step, config=cfg, optim=OPTIM, tx=sgd)
  batch = reverse_batch(np.random.default_rng(1), batch=4, length=6, vocab=32)
  batch['weights'] = batch['weights'].at[:2, 3:].set(0.0)  # shard 0 holds fewer real tokens
  whole, whole_metrics = jax.jit(step)(state, batch, jax.random.key(2))

  shards = jax.tree.map(lambda x: x.reshape(2, 2, *x.shape[1:]), batch)
  sharded_step = jax.jit(jax.vmap(
      lambda s, b: step(s, b, jax.random.key(2), axis_name='batch'),
      in_axes=(None, 0), axis_name='batch'))
  split, split_metrics = sharded_step(state, shards)
  np.testing.assert_allclose(split_metrics['loss'][0], whole_metrics['loss'], rtol=1e-5)
  for a, b in zip(jax.tree.leaves(whole.params), jax.tree.leaves(split.params)):
    np.testing.assert_allclose(b[0], a, atol=1e-6, rtol=1e-5)


@pytest.mark.slow
def test_tiny_learns_to_reverse_sequences():
  """The paper's recipe (dropout, label smoothing, Adam, lrate) on a reversal task: >= 99%."""
  cfg = CFG
  state = train.create_train_state(cfg, jax.random.key(0), optim=OPTIM)
  step = jax.jit(functools.partial(train.train_step, config=cfg, optim=OPTIM))
  evaluate = jax.jit(functools.partial(train.eval_step, config=cfg, optim=OPTIM))
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
  cfg = CFG.replace(dropout_rate=0.0)
  sgd = optax.sgd(1.0)
  state = train.create_train_state(cfg, jax.random.key(0), optim=OPTIM)
  state = state.replace(opt_state=sgd.init(state.params))
  step = functools.partial(train.train_step, config=cfg, optim=OPTIM, tx=sgd)
  batch = reverse_batch(np.random.default_rng(2), batch=4, length=6, vocab=32)
  batch['weights'] = batch['weights'].at[0, 2:].set(0.0)  # micro-batches of unequal size
  whole, whole_metrics = jax.jit(step)(state, batch, jax.random.key(3))
  accumulated, metrics = jax.jit(functools.partial(step, accum_steps=2))(
      state, batch, jax.random.key(3))
  for key in ('loss', 'accuracy', 'tokens'):
    np.testing.assert_allclose(metrics[key], whole_metrics[key], rtol=1e-6)
  for a, b in zip(jax.tree.leaves(whole.params), jax.tree.leaves(accumulated.params)):
    np.testing.assert_allclose(b, a, atol=1e-6, rtol=1e-5)


def test_remat_changes_neither_params_nor_loss_nor_gradients():
  """With dropout on: the recomputed forward pass must draw the same masks."""
  cfg = CFG
  batch = reverse_batch(np.random.default_rng(0), batch=4, length=6, vocab=32)
  params = train.create_train_state(cfg, jax.random.key(0), optim=OPTIM).params
  results = []
  for remat in (False, True):
    model = Transformer(cfg.with_execution(remat=remat))  # the same params fit both

    def loss(p, model=model):
      logits = model.apply({'params': p}, batch['src'], batch['tgt_in'], deterministic=False,
                           rngs={'dropout': jax.random.key(1)})
      return losses.smoothed_cross_entropy(logits, batch['tgt_out'], batch['weights'], 0.1)[0]
    results.append(jax.jit(jax.value_and_grad(loss))(params))
  (value, grads), (value_r, grads_r) = results
  assert float(value_r) == pytest.approx(float(value), rel=1e-6)
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_r)):
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


def test_bfloat16_trains_and_stays_close_to_float32():
  """Same init, same fixed batch, 60 steps: bf16 compute learns, and tracks float32."""
  cfg = CFG.replace(dropout_rate=0.0)
  batch = reverse_batch(np.random.default_rng(0), batch=16, length=8, vocab=32)
  curves = {}
  for dtype in (jnp.float32, jnp.bfloat16):
    computed = cfg.with_execution(dtype=dtype)
    state = train.create_train_state(computed, jax.random.key(0), optim=OPTIM)
    step = jax.jit(functools.partial(train.train_step, config=computed, optim=OPTIM))
    curve = []
    for i in range(60):
      state, metrics = step(state, batch, jax.random.key(i))
      curve.append(float(metrics['loss']))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.params))  # master weights
    curves[dtype] = np.array(curve)
  f32, bf16 = curves[jnp.float32], curves[jnp.bfloat16]
  assert bf16[0] == pytest.approx(f32[0], rel=1e-3)  # the same function, in less precision
  assert bf16[-1] < 0.1 * bf16[0]  # it learns (3.31 -> 0.07 here)
  np.testing.assert_allclose(bf16, f32, rtol=0.15, atol=0.03)  # and follows float32 throughout


def test_rbg_dropout_bits_and_bfloat16_norms_train():
  """execution.dropout_rng='rbg' draws other dropout masks from the same step key (the same
  ones again for that key), and with LayerNorm's output in bfloat16 as well the model learns."""
  cfg = CFG
  batch = reverse_batch(np.random.default_rng(0), batch=16, length=8, vocab=32)
  fast = cfg.with_execution(dtype=jnp.bfloat16, norm_dtype=jnp.bfloat16, dropout_rng='rbg')
  first = {}
  for name, c in (('threefry', cfg.with_execution(dtype=jnp.bfloat16)), ('rbg', fast)):
    state = train.create_train_state(c, jax.random.key(0), optim=OPTIM)
    step = jax.jit(functools.partial(train.train_step, config=c, optim=OPTIM))
    first[name] = [float(step(state, batch, jax.random.key(k))[1]['loss']) for k in (1, 1, 2)]
  assert first['rbg'][0] == first['rbg'][1] != first['rbg'][2]  # a function of the key
  assert first['rbg'][0] != first['threefry'][0]  # other bits than threefry's
  state = train.create_train_state(fast, jax.random.key(0), optim=OPTIM)
  step = jax.jit(functools.partial(train.train_step, config=fast, optim=OPTIM))
  curve = []
  for i in range(80):
    state, metrics = step(state, batch, jax.random.key(i))
    curve.append(float(metrics['loss']))
  assert curve[-1] < 0.2 * curve[0], curve[::10]
