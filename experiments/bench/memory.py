"""The memory section: XLA's buffer sizes (compiled, not run) of big's train step at the
paper's batch, with and without remat and 4-way gradient accumulation."""

import functools
import time

import jax

from bench.common import random_batch
from jaxformer import config, train


def run(preset: str = 'big', rows: int = 100, row_len: int = 256,
                 cases: tuple = ((False, 1), (True, 1), (False, 4), (True, 4))) -> dict:
  """XLA's buffer sizes for one train step of big at the paper's batch (100 rows x 256 tokens
  per side on one device, the GPU fast path's settings), with and without
  remat and 4-way accumulation: compiled for this backend, not run. On a CPU host these are
  XLA:CPU's buffer assignments, a guide to (not a measurement of) GPU memory."""
  results = {}
  for remat, accum in cases:  # (remat, micro-batches)
    cfg = getattr(config, preset)()
    cfg = config.fast_path(cfg, 'gpu').with_execution(remat=remat)
    state = jax.eval_shape(lambda cfg=cfg: train.create_train_state(cfg, jax.random.key(0)))
    batch = {k: jax.ShapeDtypeStruct(v.shape[1:], v.dtype)
             for k, v in random_batch(1, rows, row_len, cfg.vocab_size).items()}
    start = time.perf_counter()
    step = jax.jit(functools.partial(train.train_step, config=cfg, accum_steps=accum),
                   donate_argnums=0)
    analysis = step.lower(state, batch, jax.random.key(1)).compile().memory_analysis()
    results[f'{preset}_{rows * row_len}_tokens_remat_{remat}_accum_{accum}'] = {
        'compile_s': round(time.perf_counter() - start, 1),
        'temp_mb': round(analysis.temp_size_in_bytes / 1e6, 2),
        'arguments_mb': round(analysis.argument_size_in_bytes / 1e6, 2)}
  return results
