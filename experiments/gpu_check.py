"""A new host's first command: is jax on the GPU, and does jaxformer's main job work there?

  make gpu-check   (python experiments/gpu_check.py [--steps 300] [--fused-steps 50])

Prints the device line, then runs five checks on jax's default backend and prints a pass/fail
table (exit status 1 if any check fails):
  fused attention   fused attention (cuDNN on GPU) in bfloat16 is as close to a float32
                    reference as the einsum path in bfloat16 (logits and gradients: within 2e-2
                    or twice einsum's error) on packed rows with padding, of 64 and 128 slots
                    (64 only without a GPU); says whether cuDNN's kernel is used;
  fused training    fused attention trains on packed rows with padding of 64, 192 and 256
                    slots (lengths 64 more than a multiple of 128 are where cuDNN's Hopper
                    backward kernel failed on empty mask rows): 50 steps in bfloat16, every
                    loss and gradient norm finite, every loss within 2% of einsum attention's
                    from the same start (rows of 64 only without a GPU);
  training          a small model trains in bfloat16 with the fast path (pmap over every local
                    device) on a reversal task in packed rows of 64, and its loss falls to under
                    half;
  decoding          cached and uncached decoding give the same tokens, greedy and beam 4;
  checkpoints       save, restore and average through orbax, against the values saved.
Without a GPU it says so in one line and runs the same checks on the CPU, on a one-layer model
(80 s on 2 cores, 2026-11-25).
"""

import argparse
import functools
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import uncached_decoding
from jaxformer import checkpoint, cli, config, parallel, search, train
from jaxformer.layout import Layout
from jaxformer.model import Transformer

CFG = config.TransformerConfig(vocab_size=64, num_layers=2, d_model=64, d_ff=256, num_heads=4,
                               max_len=64)
OPTIM = config.OptimConfig(warmup_steps=100)
CPU_CFG = CFG.replace(num_layers=1)  # without a GPU: the same checks at a CPU's speed
LENGTH, ROWS = 13, 32  # reversal task: source length (+ EOS: even, as cuDNN's training
                       # kernel needs), rows per device


def _reversal_batches(count: int, devices: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
  """Batches [devices, ROWS, LENGTH + 1] whose target is the source reversed, then EOS (id 1)."""
  rng = np.random.default_rng(seed)
  batches = []
  for _ in range(count):
    src = rng.integers(3, CFG.vocab_size, (devices, ROWS, LENGTH)).astype(np.int32)
    tgt = np.concatenate([src[..., ::-1], np.ones((devices, ROWS, 1), np.int32)], -1)
    src = np.concatenate([src, np.ones((devices, ROWS, 1), np.int32)], -1)  # src + EOS
    tgt_in = np.concatenate([np.zeros_like(tgt[..., :1]), tgt[..., :-1]], -1)
    batches.append({'src': src, 'tgt_in': tgt_in, 'tgt_out': tgt,
                    'weights': np.ones(tgt.shape, np.float32)})
  return batches


def _packed(batch: dict[str, np.ndarray], width: int) -> dict[str, np.ndarray]:
  """Rows 2i and 2i + 1 of `batch` side by side, then padding up to `width` slots, in the
  trainer's packed layout (segment ids 1, 2 and 0 for padding; positions restart per pair):
  the rows a corpus gives, with padding queries."""
  def pack(x: np.ndarray) -> np.ndarray:
    pairs = x.reshape(*x.shape[:-2], x.shape[-2] // 2, 2 * x.shape[-1])
    return np.concatenate([pairs, np.zeros((*pairs.shape[:-1], width - pairs.shape[-1]),
                                           x.dtype)], -1)
  ones = np.ones_like(batch['src'])
  segments = pack(ones + (np.arange(ones.shape[-2]) % 2)[:, None])  # 1 on even rows, 2 on odd
  positions = pack(np.broadcast_to(np.arange(ones.shape[-1], dtype=np.int32), ones.shape))
  return {**{key: pack(value) for key, value in batch.items()}, 'src_segments': segments,
          'tgt_segments': segments, 'src_positions': positions, 'tgt_positions': positions}


def check_fused_attention(widths: tuple[int, ...] = (64, 128), cfg: config.TransformerConfig = CFG
                          ) -> str:
  """Fused attention in bfloat16 is as close to a float32 reference as einsum attention in
  bfloat16 (within 2e-2, or twice einsum's error) on packed rows with padding of each width:
  the logits, and the gradients of a random projection of them with respect to the params."""
  results = []
  for width in widths:
    batch = _packed(_reversal_batches(1, 1, seed=1)[0], width)
    ok, detail = _fused_against_einsum({key: value[0, :8] for key, value in batch.items()}, cfg)
    results.append((ok, f'rows of {width}: {detail}'))  # 8 packed rows each
  detail = '; '.join(d for _, d in results)
  if not all(ok for ok, _ in results):
    raise AssertionError(detail)
  return detail


def _fused_against_einsum(batch: dict[str, np.ndarray], cfg: config.TransformerConfig
                          ) -> tuple[bool, str]:
  """(whether fused is within the bound on logits and gradients, what was measured)."""
  cfg = cfg.with_execution(dtype=jnp.bfloat16, attention='fused')  # any backend
  layout = Layout.of(batch)
  src, tgt, real = batch['src'], batch['tgt_in'], batch['weights'] > 0
  params = jax.jit(Transformer(cfg).init)(jax.random.key(0), src[:1], tgt[:1])['params']
  projection = np.random.default_rng(1).normal(size=(*tgt.shape, cfg.vocab_size))
  projection *= real[..., None]
  logits, grads = {}, {}
  variants = {'fused': cfg, 'einsum': cfg.with_execution(attention='einsum'),
              'float32': cfg.with_execution(attention='einsum', dtype=jnp.float32)}  # the reference
  for attention, variant in variants.items():
    def projected(p, model=Transformer(variant)):  # (the projection, the logits)
      out = model.apply({'params': p}, src, tgt, layout, method=Transformer.forward
                        ).astype(jnp.float32)
      return jnp.sum(out * projection), out
    grad = jax.jit(jax.grad(projected, has_aux=True)).lower(params).compile()  # one program
    g, out = grad(params)
    logits[attention] = np.asarray(out)[real]
    grads[attention] = np.concatenate([np.ravel(x) for x in jax.tree.leaves(g)])
    if attention == 'fused':
      kernel = 'cuDNN kernel' if 'cudnn' in grad.as_text().lower() else 'XLA (no cuDNN kernel)'

  def error(x: dict, name: str) -> float:
    return np.linalg.norm(x[name] - x['float32']) / np.linalg.norm(x['float32'])
  results = []
  for what, x in (('logits', logits), ('gradients', grads)):
    fused, einsum = error(x, 'fused'), error(x, 'einsum')
    bound = max(2e-2, 2 * einsum)  # bfloat16's own error, doubled
    results.append((fused <= bound,
                    f'{what} {fused:.1e} (einsum {einsum:.1e}, bound {bound:.0e})'))
  return (all(ok for ok, _ in results),
          f'relative error to float32: {", ".join(d for _, d in results)}; {kernel}')


def check_fused_training(steps: int = 50, widths: tuple[int, ...] = (64, 192, 256),
                         cfg: config.TransformerConfig = CFG) -> str:
  """Fused attention trains in bfloat16 on packed rows with padding: finite losses and gradient
  norms at every step, and losses within 2% of einsum attention's (the same init, batches and
  dropout; einsum is not run for a width whose fused training went non-finite)."""
  start = train.create_train_state(cfg.with_execution(dtype=jnp.bfloat16), jax.random.key(0),
                                   optim=OPTIM)
  results, failed = [], False
  for width in widths:
    batches = [{key: value[0] for key, value in _packed(b, width).items()}
               for b in _reversal_batches(8, 1, seed=2)]
    losses, norms, kernel = {}, {}, ''
    for attention in ('fused', 'einsum'):
      variant = cfg.with_execution(dtype=jnp.bfloat16, attention=attention)
      state = jax.tree.map(jnp.copy, start)
      step = jax.jit(functools.partial(train.train_step, config=variant, optim=OPTIM),
                     donate_argnums=0).lower(
          state, batches[0], jax.random.key(1)).compile()
      if attention == 'fused':
        kernel = 'cuDNN' if 'cudnn' in step.as_text().lower() else 'XLA'
      metrics = []
      for i in range(steps):
        state, m = step(state, batches[i % len(batches)], jax.random.key(1))
        metrics.append(m)
      metrics = jax.device_get(metrics)
      losses[attention] = np.array([m['loss'] for m in metrics])
      norms[attention] = np.array([m['grad_norm'] for m in metrics])
      finite = all(np.isfinite(x['fused']).all() for x in (losses, norms))
      if not finite:  # failed: no einsum run to compare with
        break
    if finite:
      gap = float(np.max(np.abs(losses['fused'] - losses['einsum']) / losses['einsum']))
      failed |= gap > 2e-2
      results.append(f'rows of {width} ({kernel}): loss {losses["fused"][0]:.2f} -> '
                     f'{losses["fused"][-1]:.2f}, max gap to einsum {gap:.1e}')
    else:
      failed = True
      first_bad = int(np.argmin(np.isfinite(losses['fused']) & np.isfinite(norms['fused'])))
      results.append(f'rows of {width} ({kernel}): non-finite from step {first_bad + 1}')
  detail = '; '.join(results)
  if failed:
    raise AssertionError(detail)
  return detail


def check_training(steps: int, cfg: config.TransformerConfig = CFG) -> tuple[str, dict]:
  """The fast path trains on packed rows: the mean loss of the last 10 steps is under half the
  first 10's."""
  devices = jax.local_device_count()
  fast = config.fast_path(cfg, 'gpu')
  state = train.create_train_state(fast, jax.random.key(0), optim=OPTIM)
  p_state, p_rng = parallel.replicate(state), parallel.replicate(jax.random.key(1))
  p_step = jax.pmap(functools.partial(train.train_step, config=fast, optim=OPTIM,
                                      axis_name=parallel.AXIS),
                    axis_name=parallel.AXIS, donate_argnums=0)
  batches = [parallel.shard(_packed(b, 64)) for b in _reversal_batches(16, devices)]
  losses, start = [], time.perf_counter()
  for step in range(steps):
    p_state, metrics = p_step(p_state, batches[step % len(batches)], p_rng)
    losses.append(metrics['loss'])
  losses = [float(x[0]) for x in jax.device_get(losses)]
  seconds = time.perf_counter() - start
  first, last = np.mean(losses[:10]), np.mean(losses[-10:])
  detail = (f'loss {first:.2f} -> {last:.2f} in {steps} steps ({seconds:.1f} s, bfloat16, '
            f'{fast.execution.attention} attention, {devices} device{"s" * (devices > 1)})')
  if not last < first / 2:
    raise AssertionError(detail)
  return detail, parallel.unreplicate(p_state.params)


def check_decoding(params: dict, cfg: config.TransformerConfig = CFG) -> str:
  """Cached and uncached decoding give the same tokens (float32, as translation runs)."""
  src = jnp.asarray(_reversal_batches(1, 1, seed=7)[0]['src'][0])  # [ROWS, LENGTH + 1]
  lengths = jnp.full((src.shape[0],), LENGTH + 4, jnp.int32)
  correct = []
  for beam in (1, 4):
    cached, uncached = (np.asarray(jax.jit(functools.partial(
        fn, params, search.Batch(src, lengths), config=cfg, max_len=LENGTH + 4,
        decoding=config.DecodingConfig(beam_size=beam)))()[0])
        for fn in (search.decode_batch, uncached_decoding.decode_batch))
    if not np.array_equal(cached, uncached):
      rows = int((cached != uncached).any(-1).sum())
      raise AssertionError(f'beam {beam}: {rows} of {len(src)} sentences differ')
    correct.append(int((cached[:, :LENGTH] == np.asarray(src)[:, LENGTH - 1::-1]).all(-1).sum()))
  return (f'greedy and beam 4 equal on {len(src)} sentences ({correct[0]} and {correct[1]} '
          'exact reversals)')


def check_checkpoints(params: dict, cfg: config.TransformerConfig = CFG) -> str:
  """Two saved steps restore exactly, and their average is the element-wise mean."""
  meta = checkpoint.make_meta(cfg, b'no vocabulary')
  shifted = jax.tree.map(lambda x: x + np.float32(1), params)
  with tempfile.TemporaryDirectory() as workdir:
    manager = checkpoint.make_manager(checkpoint.checkpoint_dir(workdir))
    for step, tree in ((1, params), (2, shifted)):
      checkpoint.save(manager, step, params=tree, meta=meta)
    manager.wait_until_finished()
    restored, restored_config, _, step = checkpoint.load(workdir)
    averaged = checkpoint.average_checkpoints(workdir, 2)
  pairs = [(restored, shifted, 0.0), (averaged, jax.tree.map(lambda x: x + 0.5, params), 1e-6)]
  for got, want, atol in pairs:
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_allclose(a, b, rtol=0, atol=atol)
  if (step, restored_config) != (2, cfg):
    raise AssertionError(f'restored step {step} and config {restored_config}')
  return f'{len(jax.tree.leaves(params))} arrays saved at 2 steps, restored, averaged'


def _run(name: str, check: Callable[[], Any], table: list[tuple[str, bool, str]]) -> Any:
  """Runs a check and adds its row to the table: what the check returned, or None if it
  failed (a failed check is a row and a traceback on stderr, not the end of the run)."""
  try:
    result = check()
  except Exception as e:  # pylint: disable=broad-except
    message = str(e).strip().splitlines()[0] if str(e).strip() else ''
    table.append((name, False, f'{type(e).__name__}: {message}'))
    traceback.print_exc(file=sys.stderr)
    print(f'{name}: FAIL: {table[-1][2]}', file=sys.stderr, flush=True)
    return None
  table.append((name, True, result if isinstance(result, str) else result[0]))
  print(f'{name}: pass: {table[-1][2]}', file=sys.stderr, flush=True)  # a time limit keeps it
  return result


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--steps', type=int, default=300, help='training steps (default: 300)')
  parser.add_argument('--fused-steps', type=int, default=50,
                      help='steps of each fused-attention training run (default: 50)')
  cli.add_compilation_cache_flag(parser)
  args = parser.parse_args(argv)
  cli.use_compilation_cache(args)
  line = parallel.devices_line()
  print(line, flush=True)
  on_gpu = jax.default_backend() == 'gpu'
  if not on_gpu:
    print(f'no GPU: jax runs on {jax.default_backend()}, so these are the CPU checks, on a '
          'one-layer model (on a GPU host, `make install` installs the CUDA build of jax)',
          flush=True)
  cfg = CFG if on_gpu else CPU_CFG
  start = time.perf_counter()
  table: list[tuple[str, bool, str]] = [('devices', True, line)]
  # Without cuDNN, the row length does not matter: rows of 64 only.
  widths, train_widths = ((64, 128), (64, 192, 256)) if on_gpu else ((64,), (64,))
  _run('fused attention == einsum', lambda: check_fused_attention(widths, cfg), table)
  _run('fused attention trains, packed rows',
       lambda: check_fused_training(args.fused_steps, train_widths, cfg), table)
  trained = _run('training, bfloat16 fast path', lambda: check_training(args.steps, cfg), table)
  if trained is None:
    table += [(name, False, 'not run: training failed') for name in
              ('cached == uncached decoding', 'checkpoint save/restore/average')]
  else:
    _run('cached == uncached decoding', lambda: check_decoding(trained[1], cfg), table)
    _run('checkpoint save/restore/average', lambda: check_checkpoints(trained[1], cfg), table)
  width = max(len(name) for name, _, _ in table)
  print(f'\n{"check":<{width}}  result  detail')
  for name, ok, detail in table:
    print(f'{name:<{width}}  {"pass" if ok else "FAIL":<6}  {detail}')
  failed = sum(not ok for _, ok, _ in table)
  print(f'\n{len(table) - failed} passed, {failed} failed in {time.perf_counter() - start:.0f} s')
  return 1 if failed else 0


if __name__ == '__main__':
  sys.exit(main())
