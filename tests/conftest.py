"""Shared fixtures: a tiny model with fixed params."""

import jax
import jax.numpy as jnp
import pytest

from jaxformer import config as config_lib
from jaxformer.model import Transformer


@pytest.fixture(scope='session')
def tiny_config():
  return config_lib.tiny(vocab_size=50)


@pytest.fixture(scope='session')
def tiny_model(tiny_config):
  """(model, params) for the tiny config from seed 0."""
  model = Transformer(tiny_config)
  dummy = jnp.ones((1, 4), jnp.int32)
  params = model.init(jax.random.key(0), dummy, dummy)['params']
  return model, params
