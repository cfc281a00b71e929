"""The lrate schedule and Adam settings of §5.3."""

import jax.numpy as jnp
import numpy as np
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


def _run(cfg, grads, param=0.0):
  tx = optim.make_optimizer(cfg)
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
  assert _run(config_lib.base().replace(grad_clip_norm=1.0), grads) == pytest.approx(
      _hand_adam(clipped, lrs), rel=1e-5)
  assert _hand_adam(clipped, lrs) != pytest.approx(_hand_adam(grads, lrs), rel=1e-3)


def test_weight_decay_is_off_unless_asked():
  # With a zero gradient Adam does nothing; only decoupled weight decay moves the parameter.
  assert _run(config_lib.base(), [0.0], param=2.0) == 2.0
  decayed = _run(config_lib.base().replace(weight_decay=0.1), [0.0], param=2.0)
  assert decayed == pytest.approx(2.0 - _paper_lrate(1) * 0.1 * 2.0, rel=1e-6)
