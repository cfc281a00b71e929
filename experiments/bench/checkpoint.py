"""The checkpoint section: save (blocking part and total) and restore time of a base-size train
state; time and peak RSS to average the last 5 and 20 base-size checkpoints; the disk one
checkpoint of base and of big takes (params, and the optimiser state with non-zero moments), and
what a run keeping 20 of them takes with the optimiser state in every one and in the newest 2."""

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np

from jaxformer import checkpoint, config, train


def _base_train_state() -> tuple[dict, dict]:
  state = train.create_train_state(config.base(), jax.random.key(0))
  host = jax.device_get(state)
  return host.params, {'opt_state': host.opt_state, 'step': host.step,
                       'rng': np.zeros(2, np.uint32)}


def _disk_mb(path: pathlib.Path) -> float:
  return sum(f.stat().st_size for f in path.rglob('*') if f.is_file()) / 1e6


def _disk(preset: str, tmp: str, kept: int = 20, keep_train_state: int = 2) -> dict:
  """One checkpoint's disk: Adam's moments are random (zeros, as at init, compress to nothing)."""
  cfg = getattr(config, preset)()
  state = jax.device_get(train.create_train_state(cfg, jax.random.key(0)))
  rng = np.random.default_rng(0)
  moments = jax.tree.map(lambda x: rng.standard_normal(x.shape).astype(x.dtype)
                         if np.ndim(x) and np.issubdtype(x.dtype, np.floating) else x,
                         state.opt_state)
  manager = checkpoint.make_manager(pathlib.Path(tmp, preset))
  checkpoint.save(manager, 1, params=state.params, meta=checkpoint.make_meta(cfg, b'spm'),
                  train={'opt_state': moments, 'step': state.step,
                         'rng': np.zeros(2, np.uint32)}, data={'hosts': []})
  manager.wait_until_finished()
  params, train_mb = (_disk_mb(pathlib.Path(tmp, preset, '1', item)) for item in ('params',
                                                                                'train'))
  return {'params_mb': round(params), 'train_mb': round(train_mb),
          f'run_of_{kept}_every_train_state_gb': round(kept * (params + train_mb) / 1e3, 1),
          f'run_of_{kept}_newest_{keep_train_state}_train_state_gb':
              round((kept * params + keep_train_state * train_mb) / 1e3, 1)}


def run() -> dict:
  params, train_item = _base_train_state()
  meta = checkpoint.make_meta(config.base(), b'spm')
  results = {}
  with tempfile.TemporaryDirectory(dir=os.environ.get('BENCH_TMP')) as tmp:
    manager = checkpoint.make_manager(pathlib.Path(tmp, 'full'))
    start = time.perf_counter()
    checkpoint.save(manager, 1, params=params, train=train_item, meta=meta, data={'hosts': []})
    blocking = time.perf_counter() - start
    manager.wait_until_finished()
    total = time.perf_counter() - start
    start = time.perf_counter()
    checkpoint.restore(manager, 1, params=params, train=train_item, with_data=True)
    results['base_train_state'] = {
        'mb': round(sum(np.asarray(x).nbytes
                        for x in jax.tree.leaves((params, train_item))) / 2**20, 1),
        'save_blocking_s': round(blocking, 3), 'save_total_s': round(total, 3),
        'restore_s': round(time.perf_counter() - start, 3)}
    del train_item

    # 20 params-only base checkpoints (what averaging reads), each a little different.
    workdir = pathlib.Path(tmp, 'avg')
    manager = checkpoint.make_manager(workdir / 'checkpoints', items=('params', 'meta'))
    for step in range(1, 21):
      shifted = jax.tree.map(lambda x: x + np.float32(step), params)
      checkpoint.save(manager, step, params=shifted, meta=meta)
      manager.wait_until_finished()
    del params, shifted
    for last in (1, 5, 20):  # 1: the cost of restoring one checkpoint, for scale
      code = ('import json, resource, time; from jaxformer import checkpoint; '
              f't = time.perf_counter(); checkpoint.average_checkpoints({str(workdir)!r}, {last}); '
              'print(json.dumps({"seconds": round(time.perf_counter() - t, 2), "peak_rss_mb": '
              'round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}))')
      child = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                             check=True)
      results[f'average_last_{last}'] = json.loads(child.stdout.strip().splitlines()[-1])
    results['params_mb'] = round(sum(
        x.nbytes for x in jax.tree.leaves(_base_train_state()[0])) / 2**20, 1)
    results['disk'] = {preset: _disk(preset, tmp) for preset in ('base', 'big')}
  return results
