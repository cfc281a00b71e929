"""Shared fixtures, made once per pytest worker and reused by every file: a tiny model with fixed
params, trained workdirs (tiny; demo-sized), a tokenizer and a token cache, the shared data."""

import fcntl
import gc
import logging
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from helpers import (CFG, CHEAP_COMPILES, TEXT, demo_sized_corpus, optimised_env, run_folder,
                     synthetic_text, train_settings)

from jaxformer import config as config_lib
from jaxformer import data, trainer
from jaxformer.model import Transformer
from jaxformer.translation import Translator

# Before jax starts its backend (importing jax does not): cheap compiles here and in the
# processes the tests start (see helpers.CHEAP_COMPILES).
if CHEAP_COMPILES not in os.environ.get('XLA_FLAGS', ''):  # (pytest-xdist's workers inherit it)
  os.environ['XLA_FLAGS'] = f'{os.environ.get("XLA_FLAGS", "")} {CHEAP_COMPILES}'.strip()

# A worker ends a run holding jax's caches of every program it traced and compiled, and each of
# CPython's full collections scans all of it, by default once every 10 collections of the middle
# generation. Once every 1,000 gives the workers back most of that CPU; their cyclic garbage waits
# longer for it, at about the same peak memory (docs/benchmarks-log.md).
gc.set_threshold(*gc.get_threshold()[:2], 1000)

# One persistent XLA compilation cache for the whole run: the pytest workers and the processes
# the tests start (through the environment) compile the same small programs many times. It
# halves the trainer tests' time; the process that started the run removes it.
_XLA_CACHE = run_folder('xla')
os.environ.setdefault('JAX_COMPILATION_CACHE_DIR', str(_XLA_CACHE))
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0.2')
jax.config.update('jax_compilation_cache_dir', os.environ['JAX_COMPILATION_CACHE_DIR'])
jax.config.update('jax_persistent_cache_min_compile_time_secs',
                  float(os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS']))


# The files that take longest, longest first (measured on 2 cores: `--durations=0` summed by
# file, docs/benchmarks-log.md): `make test` hands whole files to its workers in collection
# order (--no-loadscope-reorder), so these start first and the run does not end on one worker
# alone. Every other file (each under 10 s) follows, in name order.
_LONGEST_FIRST = ('test_docs.py', 'test_experiments.py', 'test_translation.py', 'test_trainer.py',
                  'test_export.py', 'test_demo.py', 'test_formats_marian.py', 'test_model.py',
                  'test_gpu_check.py', 'test_commands.py', 'test_search.py', 'test_serving.py',
                  'test_train.py', 'test_recipes.py', 'test_decode.py', 'test_cli.py',
                  'test_finetune.py', 'test_package.py', 'test_formats.py', 'test_files.py',
                  'test_parallel.py', 'test_resume.py', 'test_compilation.py', 'test_makefile.py',
                  'test_data_cache.py')


def pytest_collection_modifyitems(items):
  def rank(item: pytest.Item) -> int:
    name = item.path.name
    return _LONGEST_FIRST.index(name) if name in _LONGEST_FIRST else len(_LONGEST_FIRST)
  items.sort(key=rank)  # stable: a file's tests keep their order


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
  params = jax.jit(model.init)(jax.random.key(0), dummy, dummy)['params']
  return model, params


@pytest.fixture(scope='session')
def shared_data() -> pathlib.Path:
  """The real corpora folder: $JAXFORMER_SHARED_DATA, by default ../shared/data."""
  root = pathlib.Path(__file__).resolve().parents[1]
  folder = pathlib.Path(os.environ.get('JAXFORMER_SHARED_DATA', root.parent / 'shared' / 'data'))
  if not (folder / 'multi30k').is_dir():
    pytest.skip(f'{folder}/multi30k not found: set JAXFORMER_SHARED_DATA to the shared data')
  return folder


@pytest.fixture(scope='session')
def trained(tmp_path_factory) -> pathlib.Path:
  """CFG trained 6 steps on TEXT with checkpoints at 2, 4 and 6, the last 3 averaged, and a
  validation at the end (translated: BLEU and samples)."""
  workdir = tmp_path_factory.mktemp('trained')
  summary = trainer.train(CFG, train_settings(average_last=3, bleu_sentences=8,
                                              sample_translations=3),
                          workdir, TEXT, synthetic_text(50, seed=9))
  assert summary['step'] == 6 and summary['averaged'].endswith('average-last3')
  assert 0 < summary['eval']['accuracy'] < 1 and summary['eval']['perplexity'] > 1
  assert 0 <= summary['eval']['bleu'] <= 100
  assert 0 < summary['time']['translations_s'] < summary['time']['eval_s']  # (a part of it)
  return workdir


@pytest.fixture(scope='session')
def workdir(tmp_path_factory) -> pathlib.Path:
  """A tiny model (two layers, for the tests that go through layers: plots, exports) trained
  4 steps, checkpoints at 2 and 4 (translation quality does not matter where this is used)."""
  path = tmp_path_factory.mktemp('tiny4')
  settings = config_lib.TrainConfig(num_steps=4, tokens_per_batch=1024, row_len=64,
                                    checkpoint_every_steps=2, checkpoint_every_secs=None,
                                    average_last=2, log_every_steps=2)
  trainer.train(config_lib.tiny(vocab_size=400), settings, path, synthetic_text(800))
  return path


@pytest.fixture(scope='session')
def translator(workdir) -> Translator:
  return Translator.from_checkpoint(str(workdir), batch_size=4)


@pytest.fixture(scope='session')
def demo_sized() -> tuple[pathlib.Path, list[str]]:
  """A small model (the demo recipe's, with N=1 and d_model 64) trained 250 steps on the embedded
  corpus: enough for real, varied translations (5 to 23 pieces; the demo's own dimensions took
  4.5 min; N=2 agreed with CTranslate2 as well and took 104 CPU-s to train against 69); and 100
  held-out test sentences. Trained once a run, by the first worker that needs it (the others
  wait for it and read it: no test writes into it), in a process of its own at XLA's backend
  level 1 (helpers.optimised_env)."""
  path = run_folder('demo_sized')
  with open(f'{path}.lock', 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when closed, also by a worker that crashed
    if not (path / '.trained').exists():
      shutil.rmtree(path, ignore_errors=True)
      subprocess.run([sys.executable, '-c',
                      f'import helpers; helpers.train_demo_sized({str(path)!r})'],
                     cwd=pathlib.Path(__file__).parent, env=optimised_env(), check=True,
                     timeout=900)
      (path / '.trained').touch()
  return path, demo_sized_corpus()['test'].src[:100]


@pytest.fixture(scope='session')
def tokenizer(tmp_path_factory) -> data.Tokenizer:
  """A 400-piece vocabulary of synthetic_text(2000)."""
  text = synthetic_text(2000)
  return data.train_tokenizer(text.src + text.tgt, tmp_path_factory.mktemp('spm') / 'spm.model',
                              vocab_size=400)


@pytest.fixture(scope='session')
def corpus(tokenizer) -> data.TokenizedCorpus:
  return data.tokenize_corpus(synthetic_text(600, seed=1), tokenizer, max_len=64)


def pytest_sessionfinish(session):
  """The process that started the run removes the run's folders (its workers share them): the
  compilation cache, pip's report (test_makefile.py), the demo-sized model."""
  if not os.environ.get('PYTEST_XDIST_WORKER'):
    for kind in ('xla', 'pip', 'demo_sized'):
      shutil.rmtree(run_folder(kind), ignore_errors=True)
    pathlib.Path(f'{run_folder("demo_sized")}.lock').unlink(missing_ok=True)
