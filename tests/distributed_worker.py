"""Runs a few pmap train steps for the multi-device tests, in a process of its own (device counts
and jax.distributed must be set before jax starts). Writes the final params to .npz files.

  python distributed_worker.py devices DIR      one process, 8 devices (simulated on CPU): pmap
                                                over 8 (DIR/devices8.npz), over 1 with all rows
                                                (devices1.npz), jax.jit over an 8-device mesh
                                                (jit8.npz), and pmap over 2 fed like the 2 hosts
                                                below (hosts2.npz)
  python distributed_worker.py host I PORT OUT  process I of 2 in a jax.distributed cluster
  python distributed_worker.py train I PORT WORKDIR STEPS
                                                process I of 2 runs train_and_evaluate
"""

import os
import sys

MODE = sys.argv[1]
if MODE == 'devices':
  os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '')
                             + ' --xla_force_host_platform_device_count=8')

import functools  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from helpers import CFG, synthetic_text  # noqa: E402

from jaxformer import config, data, parallel, train, trainer  # noqa: E402

STEPS, ROWS, LENGTH = 3, 8, 64


@functools.cache  # (the devices mode reads it five times)
def corpus() -> data.TokenizedCorpus:
  text = synthetic_text(400, seed=7)
  workdir = os.environ.get('WORKER_TMP', '/tmp')
  tokenizer = data.train_tokenizer(text.src + text.tgt, f'{workdir}/spm-{os.getpid()}.model', 400)
  return data.tokenize_corpus(text, tokenizer, max_len=LENGTH)


def batches(num_devices: int, process_index: int = 0, process_count: int = 1):
  """Global batches of 8 rows with uneven real-token counts per device."""
  stream = data.PackedBatches(corpus(), src_len=LENGTH, tgt_len=LENGTH,
                              rows_per_device=ROWS // num_devices // process_count,
                              num_devices=num_devices, seed=3, process_index=process_index,
                              process_count=process_count)
  for _ in range(STEPS):
    batch = next(stream)
    batch['weights'][0, 0, LENGTH // 2:] = 0.0  # the first device holds fewer tokens
    yield batch


STEP_CFG = CFG.replace(dropout_rate=0.0)
# SGD with rate 1 makes each update the combined gradient itself. Adam's first steps are
# ~sign(g), which turns float rounding in near-zero gradients into differences of 2 * lr.
SGD = optax.sgd(1.0)
STEP = functools.partial(train.train_step, config=STEP_CFG, tx=SGD)


def initial_state() -> train.TrainState:
  state = train.create_train_state(STEP_CFG, jax.random.key(0))
  return state.replace(opt_state=SGD.init(state.params))


def run_jit(batch_iter) -> dict:
  """The README's own loop: jax.jit over a data mesh, no axis name."""
  mesh = parallel.data_mesh()
  state = parallel.replicate_on(initial_state(), mesh)
  step = jax.jit(STEP, donate_argnums=0)
  for batch in batch_iter:
    rows = {key: value.reshape(-1, value.shape[-1]) for key, value in batch.items()}
    state, _ = step(state, parallel.shard_rows(rows, mesh), jax.random.key(1))
  return jax.device_get(state.params)


def run(batch_iter, devices=None) -> dict:
  p_state = parallel.replicate(initial_state(), devices)
  p_rng = parallel.replicate(jax.random.key(1), devices)
  step = jax.pmap(functools.partial(STEP, axis_name=parallel.AXIS),
                  axis_name=parallel.AXIS, devices=devices)
  for batch in batch_iter:
    p_state, _ = step(p_state, batch, p_rng)
  return parallel.unreplicate(p_state.params)


def save(params: dict, path: str) -> None:
  flat = {'/'.join(str(k.key) for k in keys): value
          for keys, value in jax.tree_util.tree_leaves_with_path(params)}
  np.savez(path, **flat)


if MODE == 'devices':
  out = sys.argv[2]
  assert jax.local_device_count() == 8
  save(run(batches(8)), f'{out}/devices8.npz')
  # The same global batches, all rows on one device.
  merged = ({k: v.reshape(1, -1, v.shape[-1]) for k, v in b.items()} for b in batches(8))
  save(run(merged, jax.devices()[:1]), f'{out}/devices1.npz')
  save(run_jit(batches(8)), f'{out}/jit8.npz')
  both = zip(batches(1, 0, 2), batches(1, 1, 2))  # what each of the 2 hosts is fed
  save(run(({k: np.concatenate([a[k], b[k]]) for k in a} for a, b in both), jax.devices()[:2]),
       f'{out}/hosts2.npz')
elif MODE == 'host':
  index, port, out = int(sys.argv[2]), sys.argv[3], sys.argv[4]
  parallel.initialize(f'localhost:{port}', 2, index)
  assert jax.device_count() == 2 and jax.local_device_count() == 1
  params = run(batches(1, index, 2))
  if index == 0:
    save(params, out)
elif MODE == 'train':
  index, port, workdir, steps = int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
  parallel.initialize(f'localhost:{port}', 2, index)
  import json
  import logging
  logging.basicConfig(level=logging.INFO, force=True)
  settings = config.TrainConfig(num_steps=steps, tokens_per_batch=1024, row_len=LENGTH,
                                checkpoint_every_steps=2, checkpoint_every_secs=None,
                                average_last=2, log_every_steps=1, sample_translations=0)
  summary = trainer.train(CFG, settings, workdir,
                          synthetic_text(400, seed=7), synthetic_text(40, seed=8))
  print('SUMMARY', json.dumps(summary))
