"""Shared fixtures: a tiny model with fixed params, and the shared data folder."""

import logging
import os
import pathlib

import jax
import jax.numpy as jnp
import pytest

from jaxformer import config as config_lib
from jaxformer.model import Transformer


@pytest.fixture(autouse=True)
def _keep_logging(monkeypatch):
  """Scripts' main(), called in-process, configure logging on the stream pytest captures, which
  is closed after the test (later log records would then fail): keep the process's logging."""
  monkeypatch.setattr(logging, 'basicConfig', lambda **kwargs: None)


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


@pytest.fixture(scope='session')
def shared_data() -> pathlib.Path:
  """The real corpora folder: $JAXFORMER_SHARED_DATA, by default ../shared/data."""
  root = pathlib.Path(__file__).resolve().parents[1]
  folder = pathlib.Path(os.environ.get('JAXFORMER_SHARED_DATA', root.parent / 'shared' / 'data'))
  if not (folder / 'multi30k').is_dir():
    pytest.skip(f'{folder}/multi30k not found: set JAXFORMER_SHARED_DATA to the shared data')
  return folder
