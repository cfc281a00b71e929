"""Small builders shared by several test files."""

import dataclasses
import functools
import gc
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer import config, data, recipes, trainer
from jaxformer.data import embedded
from jaxformer.model import Transformer

TESTS = pathlib.Path(__file__).resolve().parent
sys.path.insert(1, str(TESTS.parent / 'experiments'))  # uncached_decoding: the cached search's
import uncached_decoding  # noqa: E402,F401  pylint: disable=wrong-import-position  reference
# XLA:CPU compiles with LLVM's cheapest settings in the tests (conftest.py, and the processes the
# tests start): the suite's time is mostly compiling small programs, which these settings make
# about 1.4-1.8x cheaper, while the compiled programs run about 2x slower (docs/benchmarks-log.md,
# "The test suite's compile settings"). XLA optimises the same HLO; the losses measured there
# matched to the last digit, and every test's stored value and tolerance holds. XLA:CPU's older
# elemental emitters instead of its MLIR fusion emitters compile a tiny train step 2.3x cheaper
# and run it no slower ("The test suite's time: XLA:CPU's fusion emitters off"); float32 results
# move by rounding (1e-7 relative).
CHEAP_COMPILES = ('--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true '
                  '--xla_cpu_use_fusion_emitters=false')


OPTIMISED = '--xla_backend_optimization_level=1'


def optimised_env() -> dict[str, str]:
  """The environment for a process that runs long rather than compiles much (the demo-sized
  fixture's 250 float32 steps): XLA's backend optimisation level 1 instead of CHEAP_COMPILES. Its
  programs ran about as fast as at XLA's default level, and that process took half the CPU it
  takes with CHEAP_COMPILES (docs/benchmarks-log.md, "The test suite's time: XLA:CPU's fusion
  emitters off")."""
  flags = os.environ.get('XLA_FLAGS', '').replace(CHEAP_COMPILES, '')
  return {**os.environ, 'XLA_FLAGS': f'{flags} {OPTIMISED}'.strip()}

_EN = 'the a man woman dog cat sees walks with under house garden red small big quickly'
_DE = 'der die das mann frau hund katze sieht geht mit unter haus garten rot klein groß'
WORDS = (_EN + ' ' + _DE).split()  # 16 English-ish words, then 16 German-ish ones


def synthetic_text(n: int, seed: int = 0) -> data.ParallelText:
  """n random word sequences on each side (English-ish source, German-ish target)."""
  rng = np.random.default_rng(seed)
  src = [' '.join(rng.choice(WORDS[:16], size=rng.integers(1, 20))) for _ in range(n)]
  tgt = [' '.join(rng.choice(WORDS[16:], size=rng.integers(1, 24))) for _ in range(n)]
  return data.ParallelText(src, tgt, origin=f'synthetic-{seed}')


TEXT = synthetic_text(1500)             # the training pairs of the tiny trainer tests
# Their model: config.tiny with one layer. The trainer's, the commands' and the checkpoints' tests
# exercise the machinery around the model, and a layer fewer makes each of their many compiles
# about a third cheaper (a tiny train step: 3.0-3.3 s against 4.6-4.8 s; docs/benchmarks-log.md).
# The model's and the cache's tests, and conftest's `workdir` (plots and exports go through
# layers), keep tiny's two.
CFG = config.tiny(vocab_size=400).replace(num_layers=1)


def text_files(folder: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
  """TEXT as the two files a training command reads (train.src, train.tgt in `folder`)."""
  src, tgt = folder / 'train.src', folder / 'train.tgt'
  src.write_text('\n'.join(TEXT.src) + '\n')
  tgt.write_text('\n'.join(TEXT.tgt) + '\n')
  return src, tgt


def train_settings(**overrides) -> config.TrainConfig:
  """Training settings for the tiny tests: 6 steps, a checkpoint every 2, logs every 2."""
  settings = dict(num_steps=6, tokens_per_batch=1024, row_len=64,
                  checkpoint_every_steps=2, checkpoint_every_secs=None, keep_checkpoints=5,
                  average_last=0, eval_every_steps=1000, log_every_steps=2,
                  sample_translations=0)
  settings.update(overrides)
  return config.TrainConfig(**settings)


def poison_third_batch(monkeypatch) -> None:
  """Makes the third batch's weights NaN, so step 3's loss is not finite. (The trainer's
  prefetch advances the batches in order and assembles them on several threads: the third
  `advance` marks the pieces whose assembly is poisoned.)"""
  advance, assemble = data.PackedBatches.advance, data.PackedBatches.assemble
  calls = {'n': 0, 'third': None}

  def counted(self):
    pieces = advance(self)
    calls['n'] += 1
    if calls['n'] == 3:
      calls['third'] = pieces
    return pieces

  def poisoned(self, pieces):
    batch = assemble(self, pieces)
    if pieces is calls['third']:
      batch['weights'] = np.full_like(batch['weights'], np.nan)
    return batch

  monkeypatch.setattr(data.PackedBatches, 'advance', counted)
  monkeypatch.setattr(data.PackedBatches, 'assemble', poisoned)


def assert_trees_equal(a, b, **tolerance) -> None:
  """Same structure and leaves: exactly, or within `tolerance` (assert_allclose's)."""
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    if tolerance:
      np.testing.assert_allclose(x, y, **tolerance)
    else:
      np.testing.assert_array_equal(x, y)


def init_params(cfg: config.TransformerConfig, length: int = 12):
  """Transformer(cfg)'s params from seed 0."""
  tokens = jnp.ones((1, length), jnp.int32)
  return jax.jit(Transformer(cfg).init)(jax.random.key(0), tokens, tokens)['params']


def apply(model: Transformer, variables: dict, *arrays: jax.Array, method=None,
          **array_kwargs: jax.Array):
  """model.apply(variables, *arrays, method=method, **array_kwargs) as one compiled program per
  model, method and shapes. Run eagerly, each of a tiny model's ~200 operations compiles on its
  own: about 10 s a test here, against 1 to 2 s for the whole program."""
  return _jitted_apply(model, method)(variables, *arrays, **array_kwargs)


@functools.lru_cache(maxsize=None)
def _jitted_apply(model: Transformer, method):
  return jax.jit(functools.partial(model.apply, method=method))


def start_worker(*args: str, tmp_path: pathlib.Path) -> subprocess.Popen:
  """tests/distributed_worker.py with `args`, on its own devices (no device count in
  XLA_FLAGS)."""
  env = dict(os.environ, WORKER_TMP=str(tmp_path), XLA_FLAGS=CHEAP_COMPILES)
  return subprocess.Popen([sys.executable, str(TESTS / 'distributed_worker.py'), *args],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run_folder(kind: str) -> pathlib.Path:
  """A folder of this test run's, the same in each of its workers (the process that started
  the run removes it at the end: conftest.py)."""
  run = os.environ.get('PYTEST_XDIST_TESTRUNUID', str(os.getpid()))
  return pathlib.Path(tempfile.gettempdir()) / f'jaxformer-tests-{kind}-{run}'


# A process where importing TensorFlow (and tensorflow-datasets) fails, as in the core install.
NO_TENSORFLOW = 'import sys\nsys.modules.update(tensorflow=None, tensorflow_datasets=None)\n'
JAXFORMER_MAIN = 'from jaxformer.__main__ import main; sys.exit(main(sys.argv[1:]))'


def without_tensorflow(code: str, *args: str, cwd: pathlib.Path, stdin: str = ''
                       ) -> subprocess.CompletedProcess:
  """`python -c code args...` in `cwd` where importing TensorFlow fails (NO_TENSORFLOW)."""
  return subprocess.run([sys.executable, '-c', NO_TENSORFLOW + code, *args], cwd=cwd,
                        input=stdin, capture_output=True, text=True, timeout=600)


def train_command(workdir: pathlib.Path, src: pathlib.Path, tgt: pathlib.Path,
                  *extra: str) -> list[str]:
  """experiments/train.py on tests/tiny_config.py and line-aligned text files."""
  return [sys.executable, str(TESTS.parent / 'experiments' / 'train.py'), '--config',
          str(TESTS / 'tiny_config.py'), '--workdir', str(workdir), '--source', 'text',
          '--train-src', str(src), '--train-tgt', str(tgt), *extra]


def assert_log_lines(stderr: str, *own: str) -> None:
  """A command's stderr: each log record on a line of its own (not appended to a progress bar's
  line, which tqdm redraws after a carriage return), and none at INFO from another library's
  logger than jaxformer's and those in `own` (jax's notes on a host without a TPU)."""
  for line in re.split(r'[\r\n]', stderr):
    record = re.search(r'(DEBUG|INFO|WARNING|ERROR) ([\w.]+): ', line)
    if record:
      ours = record[2].split('.')[0] in ('jaxformer', *own)
      assert record.start() == 0 and (ours or record[1] in ('WARNING', 'ERROR')), line


def one_line_error(*argv: str) -> str:
  """The installed command's last line on stderr, once it has exited 1 with no traceback."""
  done = subprocess.run([str(pathlib.Path(sys.executable).with_name('jaxformer')), *argv],
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 1 and 'Traceback' not in done.stderr, done.stderr[-3000:]
  return done.stderr.strip().splitlines()[-1]


def hold_lock(folder: pathlib.Path, what: str) -> subprocess.Popen:
  """Another process holding `folder`'s lock for `what` (files.locked) until killed."""
  name = {'a training run': 'run', 'averaging': 'averaging'}.get(what, what.split()[-1])
  code = ('import time\nfrom jaxformer import files\n'
          f'with files.locked({str(folder)!r}, {name!r}, {what!r}):\n'
          '  print("held", flush=True)\n  time.sleep(300)\n')
  holder = subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE, text=True)
  assert holder.stdout.readline().strip() == 'held'
  return holder


def sigint_inside_a_gc_callback(when=lambda: True):
  """A gc callback (jax runs one at every collection) in which SIGINT's handler runs, once
  `when()` holds: Ctrl-C landing where Python drops what is raised. Returns it, to remove."""
  sent = []

  def callback(phase, info):  # pylint: disable=unused-argument
    if phase == 'start' and not sent and when():
      sent.append(True)
      signal.raise_signal(signal.SIGINT)  # its Python handler runs here, in the callback
  gc.callbacks.append(callback)
  return callback


def demo_sized_corpus() -> dict[str, data.ParallelText]:
  """The embedded corpus's splits for conftest's `demo_sized` model."""
  return embedded.splits(6000, 10, 200)


def train_demo_sized(workdir: str) -> None:
  """conftest's `demo_sized` model, trained into workdir (run in a process of its own)."""
  recipe = recipes.load('demo')
  model = recipe.model.replace(num_layers=1, d_model=64, d_ff=256)
  settings = dataclasses.replace(
      recipe.train, num_steps=250, tokens_per_batch=2048, checkpoint_every_steps=250,
      average_last=0, bleu_sentences=0, sample_translations=0, spm_sample_size=12_000,
      log_every_steps=50)
  trainer.train(model, settings, pathlib.Path(workdir), demo_sized_corpus()['train'],
                optim=config.OptimConfig(warmup_steps=100))
