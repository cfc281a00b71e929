"""Benchmarks; prints one JSON object.

  make bench   (or: python experiments/bench.py --only train --train-case base)


Sections:
  data:       tokenise-and-cache time and peak memory on Multi30k; packing efficiency (real-token
              fraction per side) on Multi30k train and newstest2014; packed target tokens/s
              from the cache on one core; packing-plan time for 1M WMT-like pairs.
  train:      the pmap'd train step on random full rows (TRAIN_CASES: tiny, base, big; CPU:
              2k-4k target tokens per step, GPU: the paper's ~25k): compile time apart, then
              the median of timed steps, tokens/s, steps/s, and MFU: analytic model FLOPs
              (jaxformer.flops) / step time / the peak of a square jnp.dot in the compute dtype
              measured in the same run. bf16 + fused attention on GPU (--fast-path to choose).
              When torch is installed (jaxformer[bench]), bench_torch.py times PyTorch's
              nn.Transformer on the same cases in the same run: `ratio_to_torch` per case.
  checkpoint: save (blocking part and total) and restore time of a base-size train state;
              time and peak RSS to average the last 5 and 20 base-size checkpoints.
  memory:     XLA's buffer sizes (compiled, not run) of big's train step at the paper's batch,
              with and without remat and 4-way gradient accumulation.
  decode:     target tokens/s at base dimensions (random weights, 64 output tokens): greedy
              and beam 4, with and without the key/value cache; beam-4 sentences/s of the tiny
              config on newstest2014 sources.
"""

import argparse
import functools
import importlib.util
import json
import os
import pathlib
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

if __name__ == '__main__' and '--devices' in sys.argv:  # before jax starts
  os.environ['XLA_FLAGS'] = ('--xla_force_host_platform_device_count='
                             f'{sys.argv[sys.argv.index("--devices") + 1]}')

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxformer import checkpoint, config, data, evaluate, flops, parallel, train  # noqa: E402
from jaxformer.model import Transformer  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _peak_rss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _efficiency(corpus: data.TokenizedCorpus, row_len: int) -> dict:
  """Real-token fraction of the slots over one epoch of full batches (4 rows each)."""
  src_len, tgt_len = data.row_lengths(corpus, row_len)
  stream = data.PackedBatches(corpus, src_len=src_len, tgt_len=tgt_len, rows_per_device=4)
  src, tgt = data.padding_efficiency(stream, stream.rows_in_epoch(0) // 4)
  return {'row_lengths': [src_len, tgt_len], 'src': round(src, 4), 'tgt': round(tgt, 4)}


def bench_data(data_dir: pathlib.Path) -> dict:
  results = {}
  multi30k, newstest = data_dir / 'multi30k', data_dir / 'newstest2014'
  with tempfile.TemporaryDirectory() as tmp:
    # Tokenise and cache Multi30k train (first, so the peak RSS is this step's).
    rss_before = _peak_rss_mb()
    start = time.perf_counter()
    text = data.read_parallel_text(multi30k / 'train.en', multi30k / 'train.de')
    tokenizer = data.train_tokenizer(text.src + text.tgt, pathlib.Path(tmp, 'spm.model'), 8000)
    trained = time.perf_counter()
    corpus = data.tokenize_corpus(text, tokenizer, max_len=256, cache_dir=tmp)
    done = time.perf_counter()
    start_load = time.perf_counter()
    data.tokenize_corpus(text, tokenizer, max_len=256, cache_dir=tmp)
    results['multi30k_tokenise'] = {
        'pairs': len(text), 'vocab_size': tokenizer.vocab_size,
        'read_and_train_spm_s': round(trained - start, 3),
        'tokenise_and_cache_s': round(done - trained, 3),
        'reload_from_cache_s': round(time.perf_counter() - start_load, 3),
        'peak_rss_mb_before': round(rss_before, 1), 'peak_rss_mb_after': round(_peak_rss_mb(), 1)}

    # Padding efficiency. newstest2014 gets its own 8k vocabulary so that its token lengths
    # look like WMT's (a Multi30k vocabulary splits news text into many more pieces).
    results['efficiency_multi30k_train'] = _efficiency(corpus, 256)
    news = data.read_parallel_text(newstest / 'newstest2014.en', newstest / 'newstest2014.de')
    news_tok = data.train_tokenizer(news.src + news.tgt, pathlib.Path(tmp, 'news.model'), 8000)
    news_corpus = data.tokenize_corpus(news, news_tok, max_len=256)
    results['efficiency_newstest2014'] = _efficiency(news_corpus, 256)
    results['newstest2014_mean_tokens'] = [round(float(news_corpus.src_lengths.mean()), 1),
                                           round(float(news_corpus.tgt_lengths.mean()), 1)]

    # Throughput on one core: 25k-token batches for 5 epochs, packing plans included.
    cores = os.sched_getaffinity(0) if hasattr(os, 'sched_setaffinity') else None
    if cores:
      os.sched_setaffinity(0, {min(cores)})
    src_len, tgt_len = data.row_lengths(corpus, 256)
    rows = data.rows_per_device(25000, tgt_len, 1)
    stream = data.PackedBatches(corpus, src_len=src_len, tgt_len=tgt_len, rows_per_device=rows)
    epochs = 5
    num_batches = epochs * stream.rows_in_epoch(0) // rows
    stream = data.PackedBatches(corpus, src_len=src_len, tgt_len=tgt_len, rows_per_device=rows)
    tokens = 0.0
    start = time.perf_counter()
    for _ in range(num_batches):
      tokens += next(stream)['weights'].sum()
    seconds = time.perf_counter() - start
    if cores:
      os.sched_setaffinity(0, cores)  # the other sections use every core
    results['pipeline_one_core'] = {
        'batches': num_batches, 'rows_per_batch': rows, 'epochs': epochs,
        'target_tokens_per_s': round(tokens / seconds), 'seconds': round(seconds, 3)}

    # Planning (pack_rows) cost at WMT scale: 1M pairs with newstest2014's lengths.
    rng = np.random.default_rng(0)
    pick = rng.integers(0, len(news_corpus), 1_000_000)
    start = time.perf_counter()
    planned = data.pack_rows(news_corpus.src_lengths[pick], news_corpus.tgt_lengths[pick],
                             *data.row_lengths(news_corpus, 256), rng=rng)
    results['pack_rows_1M_pairs'] = {'seconds': round(time.perf_counter() - start, 2),
                                     'rows': int(planned.max()) + 1}
  return results


def _random_batch(num_devices: int, rows: int, length: int, vocab: int) -> dict:
  """Full rows (one segment each) of random tokens: the packed batch at 100% efficiency."""
  rng = np.random.default_rng(0)
  shape = (num_devices, rows, length)
  tokens = rng.integers(3, vocab, size=shape).astype(np.int32)
  positions = np.broadcast_to(np.arange(length, dtype=np.int32), shape).copy()
  ones = np.ones(shape, np.int32)
  return {'src': tokens, 'tgt_in': tokens, 'tgt_out': tokens, 'weights': ones.astype(np.float32),
          'src_segments': ones, 'tgt_segments': ones, 'src_positions': positions,
          'tgt_positions': positions}


def matmul_peak(dtype: Any, sizes: tuple[int, ...]) -> dict:
  """FLOP/s of square jnp.dot in `dtype` on one device (median of 5 runs per size); the
  peak is the best size's."""
  results = {}
  dot = jax.jit(jnp.dot)
  for n in sizes:
    a = jax.device_put(jnp.ones((n, n), dtype))
    _, median = _median_time(lambda a=a: dot(a, a), runs=5)
    results[str(n)] = round(2 * n ** 3 / median / 1e9, 1)
  return {'dtype': jnp.dtype(dtype).name, 'gflops_by_size': results,
          'peak_gflops': max(results.values())}


def _time_train_step(cfg: config.TransformerConfig, rows: int, length: int, accum_steps: int,
                     timed_steps: int, peak_gflops: float) -> dict:
  """Median step time of the pmap'd train step on `rows` x `length`-token rows per side, split
  over the local devices; MFU against `peak_gflops` (one device's) x devices."""
  devices = jax.local_device_count()
  state = parallel.replicate(train.create_train_state(cfg, jax.random.key(0)))
  rng = parallel.replicate(jax.random.key(1))
  batch = parallel.shard(_random_batch(devices, rows // devices, length, cfg.vocab_size))
  step = jax.pmap(functools.partial(train.train_step, axis_name='batch',
                                    accum_steps=accum_steps),
                  axis_name='batch', donate_argnums=0)
  start = time.perf_counter()
  compiled = step.lower(state, batch, rng).compile()
  compile_s = time.perf_counter() - start
  times = []
  for i in range(timed_steps + 2):  # two warm-up steps
    start = time.perf_counter()
    state, metrics = compiled(state, batch, rng)
    jax.block_until_ready(metrics)
    if i >= 2:
      times.append(time.perf_counter() - start)
  median = statistics.median(times)
  tokens = rows * length
  model_flops = flops.train_flops(cfg, rows, length, length)
  result = {
      'devices': devices, 'dtype': jnp.dtype(cfg.execution.dtype).name,
      'attention': cfg.execution.attention, 'remat': cfg.execution.remat, 'rows': rows, 'row_len': length, 'accum_steps': accum_steps,
      'target_tokens_per_step': tokens, 'compile_s': round(compile_s, 2),
      'timed_steps': timed_steps, 'step_s_median': round(median, 4),
      'step_s_range': [round(min(times), 4), round(max(times), 4)],
      'steps_per_s': round(1 / median, 3), 'target_tokens_per_s': round(tokens / median, 1),
      'model_tflops_per_step': round(model_flops / 1e12, 4),
      'achieved_gflops': round(model_flops / median / 1e9, 1),
      'mfu': round(model_flops / median / 1e9 / (peak_gflops * devices), 4)}
  memory = compiled.memory_analysis()  # this step's own buffers, per device
  if memory is not None:
    result['step_buffers_gb'] = round(
        (memory.temp_size_in_bytes + memory.argument_size_in_bytes) / 1e9, 2)
  return result


# What `make bench` times per backend:
# (name, preset, rows, row length, accum steps, remat, timed steps).
# CPU: batches of 2k-4k target tokens (the CPU target: base, float32, >= 2048 tokens).
# GPU: the paper's ~25k target tokens per step, on one device.
TRAIN_CASES = {
    'cpu': [('tiny', 'tiny', 32, 64, 1, False, 20), ('base', 'base', 16, 256, 1, False, 3),
            ('base_accum2', 'base', 16, 256, 2, False, 3),
            ('base_2k', 'base', 8, 256, 1, False, 3), ('big_2k', 'big', 8, 256, 1, False, 2)],
    'gpu': [('tiny', 'tiny', 512, 64, 1, False, 20), ('base', 'base', 100, 256, 1, False, 10),
            ('big', 'big', 100, 256, 1, False, 5), ('big_remat', 'big', 100, 256, 1, True, 5)],
}
PAPER_RECIPES = {'base': 100_000, 'big': 300_000}  # steps of ~25k target tokens (§5.2)


def bench_train(data_dir: pathlib.Path, *, fast_path: bool | None = None,
                only: list[str] | None = None) -> dict:
  """Train-step throughput and MFU of the cases for this backend (TRAIN_CASES)."""
  del data_dir
  backend = jax.default_backend()
  use_fast = backend == 'gpu' if fast_path is None else fast_path
  cases = [c for c in TRAIN_CASES['gpu' if backend == 'gpu' else 'cpu']
           if not only or c[0] in only]
  dtype = config.fast_path(config.base(), 'gpu').dtype if use_fast else jnp.float32
  peak = matmul_peak(dtype, (2048, 4096, 8192) if backend == 'gpu' else (1024, 2048, 4096))
  results = {'matmul_peak': peak, 'fast_path': use_fast}
  for name, preset, rows, length, accum, remat, timed in cases:
    cfg = getattr(config, preset)()
    cfg = cfg.replace(execution=config.fast_path(cfg, 'gpu')) if use_fast else cfg
    cfg = cfg.run_as(remat=remat)
    result = _time_train_step(cfg, rows, length, accum, timed, peak['peak_gflops'])
    if preset in PAPER_RECIPES:  # at this speed, the paper's recipe would take this long
      result['paper_recipe_hours'] = round(
          PAPER_RECIPES[preset] * 25_000 / result['target_tokens_per_s'] / 3600, 2)
    results[name] = result
    print(f'train {name}: {result["target_tokens_per_s"]} tokens/s, MFU {result["mfu"]}',
          file=sys.stderr, flush=True)
  if importlib.util.find_spec('torch') is not None:
    results['torch'] = _torch_peer(results, [c[0] for c in cases])
  return results


def _torch_peer(results: dict, names: list[str]) -> dict:
  """bench_torch.py on the same cases, in a process of its own, and jaxformer / torch per case
  (added to each case as `ratio_to_torch`)."""
  command = [sys.executable, str(ROOT / 'experiments' / 'bench_torch.py')]
  peer = json.loads(subprocess.run(command + [f'--case={n}' for n in names], check=True,
                                   stdout=subprocess.PIPE, text=True).stdout)
  for name, case in peer['cases'].items():
    ratio = results[name]['target_tokens_per_s'] / case['target_tokens_per_s']
    results[name]['ratio_to_torch'] = round(ratio, 3)
    print(f'train {name}: jaxformer / torch = {ratio:.2f}', file=sys.stderr, flush=True)
  return peer


def bench_memory(data_dir: pathlib.Path, preset: str = 'big', rows: int = 100,
                 row_len: int = 256,
                 cases: tuple = ((False, 1), (True, 1), (False, 4), (True, 4))) -> dict:
  """XLA's buffer sizes for one train step of big at the paper's batch (100 rows x 256 tokens
  per side on one device, the GPU fast path's bfloat16 and fused attention), with and without
  remat and 4-way accumulation: compiled for this backend, not run. On a CPU host these are
  XLA:CPU's buffer assignments, a guide to (not a measurement of) GPU memory."""
  del data_dir
  results = {}
  for remat, accum in cases:  # (remat, micro-batches)
    cfg = getattr(config, preset)()
    cfg = cfg.replace(execution=config.fast_path(cfg, 'gpu')).run_as(remat=remat)
    state = jax.eval_shape(lambda cfg=cfg: train.create_train_state(cfg, jax.random.key(0)))
    batch = {k: jax.ShapeDtypeStruct(v.shape[1:], v.dtype)
             for k, v in _random_batch(1, rows, row_len, cfg.vocab_size).items()}
    start = time.perf_counter()
    step = jax.jit(functools.partial(train.train_step, accum_steps=accum), donate_argnums=0)
    analysis = step.lower(state, batch, jax.random.key(1)).compile().memory_analysis()
    results[f'{preset}_{rows * row_len}_tokens_remat_{remat}_accum_{accum}'] = {
        'compile_s': round(time.perf_counter() - start, 1),
        'temp_mb': round(analysis.temp_size_in_bytes / 1e6, 2),
        'arguments_mb': round(analysis.argument_size_in_bytes / 1e6, 2)}
  return results


def _base_train_state() -> tuple[dict, dict]:
  state = train.create_train_state(config.base(), jax.random.key(0))
  host = jax.device_get(state)
  return host.params, {'opt_state': host.opt_state, 'step': host.step,
                       'rng': np.zeros(2, np.uint32)}


def bench_checkpoint(data_dir: pathlib.Path) -> dict:
  del data_dir
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
  return results


def _median_time(fn, runs: int) -> tuple[float, float]:
  """(compile + first run, median of `runs` more), each ended with block_until_ready."""
  start = time.perf_counter()
  jax.block_until_ready(fn())
  first = time.perf_counter() - start
  times = []
  for _ in range(runs):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return first, statistics.median(times)


def _newstest_throughput(translator: evaluate.Translator, sources: list[str]) -> dict:
  """Beam-4 sentences/s of a Translator (bucketing and batching included), compiled first."""
  translator.translate(sources[:64])
  start = time.perf_counter()
  outputs = translator.translate(sources)
  seconds = time.perf_counter() - start
  return {'sentences': len(sources), 'sentences_per_s': round(len(sources) / seconds, 2),
          'seconds': round(seconds, 2), 'mean_output_pieces': round(float(np.mean(
              [len(x) for x in translator.tokenizer.encode(outputs)])), 1)}


def bench_decode(data_dir: pathlib.Path, demo_model: str | None = None) -> dict:
  results = {}
  cfg = config.base()
  params = jax.jit(Transformer(cfg).init)(jax.random.key(0), jnp.ones((1, 8), jnp.int32),
                                          jnp.ones((1, 8), jnp.int32))['params']
  batch, src_len, out_len = 4, 32, 64
  src = jnp.asarray(np.random.default_rng(0).integers(3, cfg.vocab_size, (batch, src_len)),
                    jnp.int32)
  lengths = jnp.full((batch,), out_len, jnp.int32)  # random weights almost never emit EOS
  for beam in (1, 4):
    for cached in (True, False):
      fn = jax.jit(functools.partial(evaluate.search, config=cfg, max_len=out_len,
                                     beam_size=beam, alpha=0.6, cached=cached))
      first, median = _median_time(lambda: fn(params, src, lengths), runs=2)
      results[f'{"greedy" if beam == 1 else "beam4"}_{"cached" if cached else "uncached"}'] = {
          'target_tokens_per_s': round(batch * out_len / median, 1),
          'seconds': round(median, 3), 'compile_and_first_s': round(first, 2)}
  for search in ('greedy', 'beam4'):
    results[f'{search}_cache_speedup'] = round(
        results[f'{search}_cached']['target_tokens_per_s']
        / results[f'{search}_uncached']['target_tokens_per_s'], 1)
  results['setup'] = {'batch': batch, 'source_tokens': src_len, 'output_tokens': out_len}

  # The tiny config through the Translator (bucketing, batching) on newstest2014 sources.
  news = data.read_parallel_text(data_dir / 'newstest2014' / 'newstest2014.en',
                                 data_dir / 'newstest2014' / 'newstest2014.de')
  with tempfile.TemporaryDirectory() as tmp:
    tokenizer = data.train_tokenizer(news.src + news.tgt, pathlib.Path(tmp, 'spm.model'), 8000)
  tiny = config.tiny(vocab_size=tokenizer.vocab_size).replace(max_len=256)
  tiny_params = train.create_train_state(tiny, jax.random.key(0)).params
  translator = evaluate.Translator(tiny_params, tiny, tokenizer, batch_size=32)
  results['tiny_beam4_newstest2014'] = {
      **_newstest_throughput(translator, news.src[:512]),
      'weights': 'random (untrained): outputs run to the length limit, the slowest case'}
  if demo_model:  # the trained demo model (make demo), e.g. workdirs/demo/average-last5
    results['demo_model_beam4_newstest2014'] = {
        **_newstest_throughput(evaluate.Translator.from_checkpoint(demo_model, batch_size=32),
                               news.src[:512]), 'model': demo_model}
  return results


SECTIONS = {'data': bench_data, 'train': bench_train, 'checkpoint': bench_checkpoint,
            'decode': bench_decode, 'memory': bench_memory}


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--only', choices=sorted(SECTIONS), action='append',
                      help='run only these sections (repeatable); default: all')
  parser.add_argument('--devices', type=int,
                      help='simulate this many CPU devices (XLA_FLAGS; set before jax starts)')
  parser.add_argument('--fast-path', action=argparse.BooleanOptionalAction,
                      help='train section: bfloat16 compute and fused attention '
                      '(default: on GPU only)')
  parser.add_argument('--train-case', action='append',
                      help='train section: only these cases (repeatable), e.g. base big')
  parser.add_argument('--demo-model', help='decode section: also time this trained model '
                      '(e.g. workdirs/demo/average-last5 after make demo)')
  parser.add_argument('--data-dir', type=pathlib.Path,
                      default=os.environ.get('JAXFORMER_SHARED_DATA', ROOT.parent / 'shared/data'),
                      help='folder with multi30k/ and newstest2014/ (default: ../shared/data)')
  args = parser.parse_args()
  sections = args.only or sorted(SECTIONS)
  if {'data', 'decode'} & set(sections) and not (args.data_dir / 'multi30k').is_dir():
    print(f'error: {args.data_dir}/multi30k not found; pass --data-dir', file=sys.stderr)
    return 2
  results = {'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
             'machine': {'platform': platform.platform(), 'cpus': os.cpu_count(),
                         'backend': jax.default_backend(),
                         'device': jax.devices()[0].device_kind,
                         'local_devices': jax.local_device_count(),
                         'python': platform.python_version(), 'jax': jax.__version__,
                         'numpy': np.__version__}}
  for name in sections:
    kwargs = {}
    if name == 'train':
      kwargs.update(fast_path=args.fast_path, only=args.train_case)
    if name == 'decode' and args.demo_model:
      kwargs['demo_model'] = args.demo_model
    results[name] = SECTIONS[name](args.data_dir, **kwargs)
  print(json.dumps(results, indent=2))
  return 0


if __name__ == '__main__':
  sys.exit(main())
