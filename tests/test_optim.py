"""The lrate schedule and Adam settings of §5.3."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxformer import config as config_lib
from jaxformer import optim


def _paper_lrate(step_num, d_model=512, warmup=4000):
  return d_model ** -0.5 * min(step_num ** -0.5, step_num * warmup ** -1.5)


@pytest.mark.parametrize('step_num', [1, 2, 4000, 4001, 100_000])
def test_lrate_follows_the_formula_with_1_based_steps(step_num):
  schedule = optim.lrate_schedule(512, 4000)
  assert float(schedule(step_num - 1)) == pytest.approx(_paper_lrate(step_num), rel=1e-6)


def test_lrate_peaks_at_warmup():
  schedule = optim.lrate_schedule(512, 4000)
  assert float(schedule(3999)) == pytest.approx(6.988e-4, rel=1e-3)
  assert float(schedule(0)) > 0.0  # a literal port of the formula would give 0 here
  assert float(schedule(3998)) < float(schedule(3999)) > float(schedule(4000))


def _hand_adam(grads, lrs, b1=0.9, b2=0.98, eps=1e-9):
  """Textbook Adam with bias correction on a scalar parameter starting at 0."""
  m = v = param = 0.0
  for t, (g, lr) in enumerate(zip(grads, lrs), start=1):
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    param -= lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
  return param


def test_make_optimizer_is_adam_0_9_0_98_1e_9_on_the_schedule():
  grads = [0.5, -2.0, 1.0]
  lrs = [_paper_lrate(t) for t in (1, 2, 3)]
  assert _run(config_lib.base(), grads) == pytest.approx(_hand_adam(grads, lrs), rel=1e-5)


def _run(cfg, grads, optim_cfg=None, param=0.0):
  tx = optim.make_optimizer(cfg, optim_cfg)
  param = jnp.asarray(param)
  state = tx.init(param)
  for g in grads:
    updates, state = tx.update(jnp.asarray(g), state, param)
    param = param + updates
  return float(param)


def test_clipping_is_off_unless_asked():
  grads = [300.0, 1.0, -0.5]
  lrs = [_paper_lrate(t) for t in (1, 2, 3)]
  assert _run(config_lib.base(), grads) == pytest.approx(_hand_adam(grads, lrs), rel=1e-5)
  clipped = [max(-1.0, min(1.0, g)) for g in grads]  # global norm of a scalar is |g|
  clipping = config_lib.OptimConfig(grad_clip_norm=1.0)
  assert _run(config_lib.base(), grads, clipping) == pytest.approx(_hand_adam(clipped, lrs),
                                                                   rel=1e-5)
  assert _hand_adam(clipped, lrs) != pytest.approx(_hand_adam(grads, lrs), rel=1e-3)


def test_weight_decay_is_off_unless_asked():
  # With a zero gradient Adam does nothing; only decoupled weight decay moves the parameter.
  assert _run(config_lib.base(), [0.0], param=2.0) == 2.0
  decayed = _run(config_lib.base(), [0.0], config_lib.OptimConfig(weight_decay=0.1), param=2.0)
  assert decayed == pytest.approx(2.0 - _paper_lrate(1) * 0.1 * 2.0, rel=1e-6)


def test_default_schedule_is_the_papers_formula_itself():
  """OptimConfig's defaults build lrate_schedule exactly (no scale of 1.0 multiplied in)."""
  schedule = optim.make_schedule(config_lib.base(), config_lib.OptimConfig())
  for count in (0, 3999, 99_999):
    assert float(schedule(count)) == float(optim.lrate_schedule(512, 4000)(count))


@pytest.mark.parametrize('step_num', [1, 50, 100, 101, 400, 10_000])
def test_peak_learning_rate_warms_up_linearly_then_decays_as_inverse_sqrt(step_num):
  """fairseq's inverse_sqrt: lr * step/warmup, then lr * sqrt(warmup / step)."""
  schedule = optim.make_schedule(config_lib.base(), config_lib.OptimConfig(
      learning_rate=5e-4, warmup_steps=100))
  expected = 5e-4 * step_num / 100 if step_num <= 100 else 5e-4 * (100 / step_num) ** 0.5
  assert float(schedule(step_num - 1)) == pytest.approx(expected, rel=1e-6)


def test_papers_lrate_is_the_inverse_sqrt_curve_with_its_own_peak():
  peak = 512 ** -0.5 * 4000 ** -0.5
  ours, papers = optim.inverse_sqrt_schedule(peak, 4000), optim.lrate_schedule(512, 4000)
  for count in (0, 1999, 3999, 4000, 50_000):
    assert float(ours(count)) == pytest.approx(float(papers(count)), rel=1e-6)


@pytest.mark.parametrize('learning_rate', [None, 1e-4])
def test_lr_scale_multiplies_either_schedule(learning_rate):
  plain = config_lib.OptimConfig(learning_rate=learning_rate)
  halved = config_lib.OptimConfig(learning_rate=learning_rate, lr_scale=0.5)
  for count in (0, 4000, 20_000):
    assert float(optim.make_schedule(config_lib.base(), halved)(count)) == pytest.approx(
        0.5 * float(optim.make_schedule(config_lib.base(), plain)(count)), rel=1e-6)


@pytest.mark.parametrize('old,new', [
    ({}, {'grad_clip_norm': 1.0}), ({'grad_clip_norm': 1.0}, {}), ({}, {'weight_decay': 0.01}),
    ({'weight_decay': 0.01, 'grad_clip_norm': 2.0}, {'warmup_steps': 10})])
def test_carry_state_moves_adams_moments_and_counts_across_chains(old, new):
  """The state of an optimiser with clipping or weight decay turned on or off continues the old
  one's: the same moments and counts, so the next update is the new chain's on them."""
  params = {'w': jnp.array([1.0, -2.0])}
  grads = {'w': jnp.array([0.3, -0.1])}
  cfg = config_lib.base()
  old_tx = optim.make_optimizer(cfg, config_lib.OptimConfig(**old))
  old_state = old_tx.init(params)
  for _ in range(3):
    _, old_state = old_tx.update(grads, old_state, params)
  new_tx = optim.make_optimizer(cfg, config_lib.OptimConfig(**new))
  carried = optim.carry_state(old_state, new_tx.init(params))
  adam = lambda state: [s for s in jax.tree.leaves(  # noqa: E731
      state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
      if isinstance(s, optax.ScaleByAdamState)][0]
  assert int(adam(carried).count) == 3
  np.testing.assert_array_equal(adam(carried).mu['w'], adam(old_state).mu['w'])
  np.testing.assert_array_equal(adam(carried).nu['w'], adam(old_state).nu['w'])
  assert jax.tree.structure(carried) == jax.tree.structure(new_tx.init(params))
  new_tx.update(grads, carried, params)  # the new chain accepts it
