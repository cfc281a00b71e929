"""The scale section: the base recipe's data path on a WMT-sized corpus (4.5M pairs by default,
synthetic from newstest2014, seeded; or your own files), each stage in a fresh process:

  prepare  vocabulary (37k pieces, 2M-sentence sample), tokenising and cache: wall time per
           step, peak RSS, cache size on disk; then the time to the first batch;
  cached   a second run on the same workdir: time to the first batch, peak RSS;
  feed     the prefetch threads' batches (8 devices' worth, 25k tokens) through the main
           thread: sustained real target tokens/s, and the longest gap between consecutive
           batches over two epoch boundaries; then, on one thread, the time to plan a block,
           to assemble a batch and to transfer it;
  train    (with --scale-train) `jaxformer train`'s own run in a new workdir: vocabulary,
           cache, and a tiny model for 20 steps at the recipe's batch; the whole command's
           peak RSS, as /usr/bin/time reports it.

  python experiments/bench --only scale [--scale-pairs 4500000] [--scale-src F --scale-tgt F]
"""

import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

_STAGES = ('prepare', 'cached', 'feed')


def _rss_mb() -> float:
  """This process's peak RSS (VmHWM: ru_maxrss would carry the forking parent's over exec)."""
  status = pathlib.Path('/proc/self/status').read_text()
  return int(re.search(r'VmHWM:\s+(\d+) kB', status)[1]) / 1024


def _stage(stage: str, workdir: str, src: str, tgt: str) -> dict:
  """One stage, run in this (fresh) process."""
  start = time.perf_counter()
  os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=8'
  import jax  # pylint: disable=g-import-not-at-top
  from jaxformer import data, parallel, recipes  # pylint: disable=g-import-not-at-top

  recipe = recipes.load('base')
  settings = recipe.train
  text = data.TextFiles(src, tgt)
  result = {'stage': stage, 'devices': jax.device_count()}
  if stage in ('prepare', 'cached'):
    text.fingerprint()
    result['read_and_fingerprint_s'] = round(time.perf_counter() - start, 2)
    data.train_tokenizer(text, pathlib.Path(workdir, 'spm.model'), recipe.model.vocab_size,
                         sample_size=settings.spm_sample_size, seed=settings.seed)
    result['vocabulary_s'] = round(time.perf_counter() - start, 2)  # cumulative, as those below
    prepared = data.pipeline.build(workdir, recipe.model, settings, text)
    result['prepare_s'] = round(time.perf_counter() - start, 2)
    batch = next(prepared.train)
    result.update(first_batch_s=round(time.perf_counter() - start, 2), peak_rss_mb=round(_rss_mb()),
                  pairs=len(prepared.train.corpus), row_lengths=[prepared.src_len,
                                                                   prepared.tgt_len],
                  rows_per_batch=int(batch['src'].shape[0] * batch['src'].shape[1]))
    result['cache_mb'] = round(sum(f.stat().st_size for f in
                                   pathlib.Path(workdir, 'cache').rglob('*')) / 1e6)
    return result
  # feed: the trainer's prefetch threads through the last block of epoch 0 into epoch 1, and
  # through the last block of epoch 1 into epoch 2; then a steady stretch.
  prepared = data.pipeline.build(workdir, recipe.model, settings, text)
  batches = prepared.train
  last_block = batches.blocks_per_epoch - 1
  gaps, firsts, count = [], [], 0
  for epoch in (0, 1):
    batches.set_state(batches.get_state() | {'epoch': epoch, 'block': last_block, 'row': 0})
    rows = batches._block_plan(epoch, last_block).num_rows  # pylint: disable=protected-access
    before = time.perf_counter()
    stream = prepared.device_batches()
    batch, _ = next(stream)  # the first batch after a jump: as after a resume
    firsts.append(time.perf_counter() - before)
    before = time.perf_counter()
    for _ in range(rows // len(batch['src']) // batch['src'].shape[1] + 50):  # and 50 more
      next(stream)
      now = time.perf_counter()
      gaps.append(now - before)
      before = now
    stream.close()
  # The steady stretch: real tokens are counted where the batches are assembled (a host sum),
  # so that the main thread does nothing but take the next batch.
  counted = []
  assemble = batches.assemble
  batches.assemble = lambda pieces: counted.append(float(
      (batch := assemble(pieces))['weights'].sum())) or batch
  stream = prepared.device_batches()
  next(stream)
  start = time.perf_counter()
  for _ in range(3000):
    next(stream)
    count += 1
  seconds = time.perf_counter() - start
  tokens = sum(counted[1:count + 1])
  stream.close()
  # The parts on one thread: planning a whole block, assembling a batch, transferring it.
  start = time.perf_counter()
  batches._plan_block(2, 0)  # pylint: disable=protected-access
  plan_s = time.perf_counter() - start
  pieces = [batches.advance() for _ in range(200)]
  start = time.perf_counter()
  host = [assemble(p) for p in pieces]
  assemble_ms = 1e3 * (time.perf_counter() - start) / len(pieces)
  start = time.perf_counter()
  for batch in host:
    jax.block_until_ready(parallel.shard(batch))
  transfer_ms = 1e3 * (time.perf_counter() - start) / len(host)
  result.update(plan_block_s=round(plan_s, 3), block_pairs=batches.block_size,
                assemble_ms=round(assemble_ms, 2), transfer_ms=round(transfer_ms, 2))
  result.update(longest_gap_s=round(max(gaps), 3), first_batch_after_jump_s=round(max(firsts), 3),
                batches=count,
                target_tokens_per_s=round(tokens / seconds), batch_ms=round(1e3 * seconds / count,
                                                                            2),
                peak_rss_mb=round(_rss_mb()))
  return result


def _train_run(workdir: str, src: str, tgt: str) -> dict:
  """`jaxformer train` with a tiny model (the base recipe's vocabulary and batch) for 20 steps,
  measured as /usr/bin/time measures the whole command (its peak resident set)."""
  jaxformer = pathlib.Path(sys.executable).with_name('jaxformer')
  command = [str(jaxformer), 'train', '--config', 'base', '--allow-cpu', '--workdir', workdir,
             '--train-src', src, '--train-tgt', tgt, '--set', 'data.source=text',
             '--set', 'train.num_steps=20', '--set', 'train.average_last=0',
             '--set', 'train.sample_translations=0',
             '--set', 'model.num_layers=1', '--set', 'model.d_model=32', '--set',
             'model.d_ff=64', '--set', 'model.num_heads=2']
  start = time.perf_counter()
  out = subprocess.run(['/usr/bin/time', '-f', '%M', *command], capture_output=True, text=True,
                       check=False)
  if out.returncode:
    return {'error': out.stderr[-2000:]}
  return {'seconds': round(time.perf_counter() - start, 1),
          'peak_rss_mb': round(int(out.stderr.strip().splitlines()[-1]) / 1024)}


def run(data_dir: pathlib.Path, pairs: int = 4_500_000, src: str | None = None,
        tgt: str | None = None, with_train: bool = False) -> dict:
  results = {'pairs': pairs}
  with tempfile.TemporaryDirectory(dir=os.environ.get('BENCH_TMP')) as tmp:
    if src is None:
      from bench import synthetic  # pylint: disable=g-import-not-at-top
      news = data_dir / 'newstest2014'
      read = lambda path: path.read_text(encoding='utf-8').splitlines()  # noqa: E731
      src, tgt = map(str, synthetic.write_corpus(
          read(news / 'newstest2014.en'), read(news / 'newstest2014.de'), pathlib.Path(tmp, 'wmt'),
          pairs))
    results['corpus_mb'] = [round(os.path.getsize(path) / 1e6) for path in (src, tgt)]
    workdir = str(pathlib.Path(tmp, 'workdir'))
    for stage in _STAGES:
      out = subprocess.run([sys.executable, __file__, stage, workdir, src, tgt],
                           capture_output=True, text=True, check=False)
      if out.returncode:
        results[stage] = {'error': out.stderr[-2000:]}
        break
      results[stage] = json.loads(out.stdout.strip().splitlines()[-1])
      print(f'scale: {results[stage]}', file=sys.stderr, flush=True)
    if with_train:  # from scratch: vocabulary, cache and training in one process
      results['train'] = _train_run(workdir + '-train', src, tgt)
  return results


if __name__ == '__main__':
  sys.path[0] = str(pathlib.Path(__file__).resolve().parents[2])
  print(json.dumps(_stage(*sys.argv[1:5])))
