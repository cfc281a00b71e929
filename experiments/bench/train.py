"""The train section: the pmap'd train step on random full rows (TRAIN_CASES: tiny, base, big;
CPU: 2k-4k target tokens per step, GPU: the paper's ~25k): compile time apart, then the median
of timed steps, tokens/s, steps/s, and MFU: analytic model FLOPs (jaxformer.flops) / step time /
the peak of a square jnp.dot in the compute dtype measured in the same run. The GPU fast path
on GPU (--fast-path to choose; --execution for other settings). When torch is installed
(jaxformer[bench]), bench_torch.py times PyTorch's nn.Transformer on the same cases in the same
run: `ratio_to_torch` per case (PyTorch first, before jax takes the GPU)."""

import argparse
import dataclasses
import functools
import importlib.util
import itertools
import json
import statistics
import subprocess
import sys
import time
import typing

import jax
import jax.numpy as jnp

from bench.common import ROOT, matmul_peak, random_batch, turn
from jaxformer import config, flops, parallel, recipes, train


def _time_train_step(cfg: config.TransformerConfig, rows: int, length: int, accum_steps: int,
                     timed_steps: int, peak_gflops: float, lock: str | None = None,
                     compiler_options: dict | None = None) -> dict:
  """Median step time of the pmap'd train step on `rows` x `length`-token rows per side, split
  over the local devices; MFU against `peak_gflops` (one device's) x devices. The timing holds
  `lock` (common.turn); `compiler_options`: XLA options for this program alone (e.g.
  {'xla_gpu_enable_triton_gemm': False}), where XLA_FLAGS would set them for the process."""
  devices = jax.local_device_count()
  with turn(lock, compiling=True):
    state = parallel.replicate(train.create_train_state(cfg, jax.random.key(0)))
    rng = parallel.replicate(jax.random.key(1))
    batch = parallel.shard(random_batch(devices, rows // devices, length, cfg.vocab_size))
    step = jax.pmap(functools.partial(train.train_step, config=cfg, axis_name=parallel.AXIS,
                                      accum_steps=accum_steps),
                    axis_name=parallel.AXIS, donate_argnums=0)
    start = time.perf_counter()
    compiled = step.lower(state, batch, rng).compile(compiler_options or None)
    compile_s = time.perf_counter() - start
  times = []
  with turn(lock):
    for i in range(timed_steps + 2):  # two warm-up steps
      start = time.perf_counter()
      state, metrics = compiled(state, batch, rng)
      jax.block_until_ready(metrics)
      if i >= 2:
        times.append(time.perf_counter() - start)
    start = time.perf_counter()  # as the trainer runs: the next step queued before this one ends
    for _ in range(timed_steps):
      state, metrics = compiled(state, batch, rng)
    jax.block_until_ready(metrics)
    pipelined = (time.perf_counter() - start) / timed_steps
  median = statistics.median(times)
  tokens = rows * length
  model_flops = flops.train_flops(cfg, rows, length, length)
  result = {
      'devices': devices, 'dtype': jnp.dtype(cfg.execution.dtype).name,
      'attention': cfg.execution.attention, 'remat': cfg.execution.remat, 'rows': rows,
      'row_len': length, 'accum_steps': accum_steps,
      'target_tokens_per_step': tokens, 'compile_s': round(compile_s, 2),
      'timed_steps': timed_steps, 'step_s_median': round(median, 4),
      'step_s_range': [round(min(times), 4), round(max(times), 4)],
      'steps_per_s': round(1 / median, 3), 'target_tokens_per_s': round(tokens / median, 1),
      'step_s_pipelined': round(pipelined, 4),
      'target_tokens_per_s_pipelined': round(tokens / pipelined, 1),
      'model_tflops_per_step': round(model_flops / 1e12, 4),
      'achieved_gflops': round(model_flops / median / 1e9, 1),
      'mfu': round(model_flops / median / 1e9 / (peak_gflops * devices), 4)}
  memory = compiled.memory_analysis()  # this step's own buffers, per device
  if memory is not None:
    result['step_buffers_gb'] = round(
        (memory.temp_size_in_bytes + memory.argument_size_in_bytes) / 1e9, 2)
  return result


# What `make bench` times per backend:
# (name, preset or recipe, rows, row length, accum steps, remat, timed steps).
# CPU: batches of 2k-4k target tokens (the CPU target: base, float32, >= 2048 tokens),
# and the multi30k recipe's model on its batch, 8192 target token slots in rows of 64 (and of
# 128, as before: attention's work grows with the row length).
# GPU: the paper's ~25k target tokens per step, on one device.
TRAIN_CASES = {
    'cpu': [('tiny', 'tiny', 32, 64, 1, False, 20), ('multi30k', 'multi30k', 128, 64, 1, False, 10),
            ('multi30k_rows128', 'multi30k', 64, 128, 1, False, 10),
            ('base', 'base', 16, 256, 1, False, 3),
            ('base_accum2', 'base', 16, 256, 2, False, 3),
            ('base_2k', 'base', 8, 256, 1, False, 3), ('big_2k', 'big', 8, 256, 1, False, 2)],
    'gpu': [('tiny', 'tiny', 512, 64, 1, False, 20), ('base', 'base', 100, 256, 1, False, 10),
            ('big', 'big', 100, 256, 1, False, 5), ('big_remat', 'big', 100, 256, 1, True, 5)],
}
PAPER_RECIPES = {'base': 100_000, 'big': 300_000}  # steps of ~25k target tokens (§5.2)


def case_config(preset: str) -> config.TransformerConfig:
  """A case's model: a preset of jaxformer.config ('base'), else a recipe's ('multi30k')."""
  if hasattr(config, preset):
    return getattr(config, preset)()
  return recipes.load(preset).model


def execution_changes(text: str) -> dict:
  """--execution's value: 'loss_chunk=4096,dropout_rng=rbg' -> {'loss_chunk': 4096,
  'dropout_rng': 'rbg'}, each value parsed as --set parses it and checked by Execution;
  'default' -> {} (the case as it is)."""
  if text == 'default':
    return {}
  hints = typing.get_type_hints(config.Execution)
  try:
    if any('=' not in item for item in text.split(',')):
      raise ValueError('expected NAME=VALUE[,NAME=VALUE...] or default')
    changes = dict(item.split('=', 1) for item in text.split(','))
    unknown = sorted(set(changes) - set(hints))
    if unknown:
      raise ValueError(f'unknown {", ".join(unknown)}; Execution has {", ".join(hints)}')
    changes = {key: recipes.parse_value(hints[key], value) for key, value in changes.items()}
    dataclasses.replace(config.Execution(), **changes)
  except ValueError as error:
    raise argparse.ArgumentTypeError(f'{text!r}: {error}') from None
  return changes


def compiler_option(text: str) -> tuple[str, bool | int | str]:
  """--compiler-option's value: 'xla_gpu_enable_triton_gemm=false' -> (name, False); true and
  false are booleans, digits an integer, anything else a string, as XLA's options take them."""
  name, sep, value = text.partition('=')
  if not sep or not name.startswith('xla_'):
    raise argparse.ArgumentTypeError(f'{text!r}: expected xla_NAME=VALUE')
  if value.lower() in ('true', 'false'):
    return name, value.lower() == 'true'
  return name, int(value) if value.lstrip('-').isdigit() else value


def run(*, fast_path: bool | None = None, only: list[str] | None = None,
        executions: list[dict] | None = None, peer: dict | None = None,
        lock: str | None = None, compiler_options: dict | None = None) -> dict:
  """Train-step throughput and MFU of the cases for this backend (TRAIN_CASES); with
  `executions` (e.g. [{'loss_chunk': 4096}]), each case once per change to its Execution, named
  CASE@loss_chunk=4096. `peer`: torch_peer's results on the same cases, added with jaxformer /
  torch per case (`ratio_to_torch`). `lock`: a file whose lock each timing holds (common.turn),
  for processes that share one GPU. `compiler_options`: XLA options for every case's program."""
  backend = jax.default_backend()
  use_fast = backend == 'gpu' if fast_path is None else fast_path
  cases = [c for c in TRAIN_CASES['gpu' if backend == 'gpu' else 'cpu']
           if not only or c[0] in only]
  dtype = config.fast_path(config.base(), 'gpu').execution.dtype if use_fast else jnp.float32
  # A CPU reaches its peak by 1024 (2 cores: 112.7, 106.0 and 113.8 GFLOP/s at 1024, 2048 and
  # 4096, the last taking 17 CPU-s alone).
  with turn(lock):
    peak = matmul_peak(dtype, (2048, 4096, 8192) if backend == 'gpu' else (1024, 2048))
  results = {'matmul_peak': peak, 'fast_path': use_fast,
             'compiler_options': compiler_options or {}}
  for (name, preset, rows, length, accum, remat, timed), changes in itertools.product(
      cases, executions or [{}]):
    cfg = case_config(preset)
    cfg = config.fast_path(cfg, 'gpu') if use_fast else cfg
    cfg = cfg.with_execution(**{'remat': remat, **changes})  # changes win
    result = _time_train_step(cfg, rows, length, accum, timed, peak['peak_gflops'], lock,
                              compiler_options)
    result['execution'] = config.config_to_dict(cfg)['execution']
    if preset in PAPER_RECIPES:  # at this speed, the paper's recipe would take this long
      result['paper_recipe_hours'] = round(
          PAPER_RECIPES[preset] * 25_000 / result['target_tokens_per_s'] / 3600, 2)
    if changes:
      name += '@' + ','.join(f'{key}={value}' for key, value in changes.items())
    results[name] = result
    # Each case on stderr as it ends: a run cut short by a time limit keeps what it measured.
    print(f'train {name}: {result["target_tokens_per_s"]} tokens/s, MFU {result["mfu"]} '
          f'{json.dumps(result)}', file=sys.stderr, flush=True)
  if peer:
    results['torch'] = add_ratios(results, peer)
  return results


def add_ratios(results: dict, peer: dict) -> dict:
  """Adds jaxformer / torch per case of `results` that the peer timed (CASE@changes too):
  `ratio_to_torch` against the peer as its users run it (compiled on GPU), and
  `ratio_to_torch_eager` against its eager row where it has one; returns the peer."""
  for name, result in results.items():
    for row, key in (('cases', 'ratio_to_torch'), ('cases_eager', 'ratio_to_torch_eager')):
      case = peer.get(row, {}).get(name.split('@')[0])  # CASE@changes: the peer's CASE
      if case:
        ratio = result['target_tokens_per_s'] / case['target_tokens_per_s']
        result[key] = round(ratio, 3)
        print(f'train {name}: jaxformer / torch{" eager" if "eager" in row else ""} = '
              f'{ratio:.2f}', file=sys.stderr, flush=True)
  return peer


def torch_peer(only: list[str] | None = None) -> dict | None:
  """bench_torch.py on the same cases (`only`, default all), in a process of its own: its JSON,
  {'error': ...} if it failed, None without torch. Run it before jax starts: on a GPU, jax's
  process keeps most of the device's memory, and PyTorch beside it runs out."""
  if importlib.util.find_spec('torch') is None:
    return None
  command = [sys.executable, str(ROOT / 'experiments' / 'bench_torch.py')]
  done = subprocess.run(command + [f'--case={n}' for n in only or []], stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True)
  sys.stderr.write(done.stderr)
  if done.returncode:
    lines = done.stderr.strip().splitlines() or ['no output']
    return {'error': f'bench_torch.py exited with {done.returncode}: {lines[-1]}'}
  return json.loads(done.stdout)
