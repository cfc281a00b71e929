"""Where one train step's (or one search's) time goes: traces it with jax.profiler and sums
the compiled ops' durations by the part of the model they come from (from the ops' HLO
metadata).

  python experiments/profile_step.py                      # base, 16 rows x 256 tokens
  python experiments/profile_step.py --preset big --rows 8
  python experiments/profile_step.py --preset demo --rows 32 --row-len 128   # make demo's step
  python experiments/profile_step.py --preset base --vocab-size 8000 --search beam4 --rows 32
  python experiments/profile_step.py --search beam4 --rows 32 \
      --checkpoint workdirs/demo/average-last5

A search decodes --rows sentences of 20 random pieces to 64 pieces. Prints one JSON object:
the wall time and, per part, the summed op time. On CPU the op
times of the runtime's threads add up to more than the wall time (ops run side by side).
"""

import argparse
import collections
import functools
import json
import os
import pathlib
import re
import sys
import tempfile
import time

# Per-op trace events on the CPU runtime; set before jax starts.
os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '')
                           + ' --xla_cpu_enable_xprof_traceme=true').strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench.common import random_batch  # noqa: E402
from bench.train import case_config  # noqa: E402
from jaxformer import checkpoint, config, parallel, search, train  # noqa: E402

# (part, pattern on the op's name scope), first match wins.
PARTS = [('softmax projection + loss', r'chunked|_projected|/while/|closed_call|log_softmax'
          r'|embed\.attend|jit\(_fun\)/reduce$'),
         ('attention: scores, softmax, weighted sum', r'attention/(?!.*(query|key|value|out)/)'),
         ('attention: q, k, v, out projections', r'attention.*(query|key|value|out)/'),
         ('feed-forward', r'/ffn/'),
         ('dropout', r'dropout|random|threefry|bernoulli'),
         ('layer norm', r'norm'),
         ('optimizer', r'adam|optax|scale_by|apply_gradients')]


# The same for one search's loop.
SEARCH_PARTS = [('top-k of the next tokens', r'continuations/.*(top_k|reduce_window|sort|take'
                                           r'|gather|_where)|argmax'),
                ('output projection and log-softmax', r'continuations|embed\.attend'),
                ('reorder beams (cache and sequences)', r'_take|take_along_axis'),
                ('attention: scores, softmax, weighted sum',
                 r'attention/(?!.*(query|key|value|out)/)'),
                ('attention: q, k, v, out projections', r'attention.*(query|key|value|out)/'),
                ('feed-forward', r'/ffn/'),
                ('layer norm', r'norm')]


def _op_scopes(hlo_text: str) -> dict[str, str]:
  """Each compiled instruction's name scope, by its name and by the name its GPU kernel gets
  (XLA names a fusion's kernel after the fusion, '.' written '_')."""
  scopes = dict(re.findall(r'%?([\w.\-]+) = \S+ .*?op_name="([^"]*)"', hlo_text))
  return {**{name.replace('.', '_'): scope for name, scope in scopes.items()}, **scopes}


def _event_op(event, scopes: dict[str, str]) -> str | None:
  """The compiled instruction an event ran: its 'hlo_op' stat (a GPU kernel's event is named
  after the kernel, a cuBLAS or cuDNN one too), else its name (on CPU the two are the same)."""
  stats = {name: value for name, value in event.stats}
  for op in (stats.get('hlo_op'), event.name):
    if isinstance(op, bytes):
      op = op.decode()
    if isinstance(op, str) and op in scopes:
      return op
  return None


def _profile(compiled, run, parts: list[tuple[str, str]]) -> tuple[float, collections.Counter,
                                                                    collections.Counter]:
  """(wall seconds of one traced run after a warm-up, op seconds summed by part, op seconds
  by op name). On a GPU only the device's own op events count (not their host launches); GPU
  time matched to no instruction is summed by kernel as 'unmatched (STREAM): KERNEL'."""
  scopes = _op_scopes(compiled.as_text())
  jax.block_until_ready(run())  # warm-up
  with tempfile.TemporaryDirectory() as tmp:
    jax.profiler.start_trace(tmp)
    start = time.perf_counter()
    jax.block_until_ready(run())
    wall = time.perf_counter() - start
    jax.profiler.stop_trace()
    trace = next(pathlib.Path(tmp).rglob('*.xplane.pb'))
    profile = jax.profiler.ProfileData.from_file(str(trace))
  seconds, by_op = collections.Counter(), collections.Counter()
  on_gpu = jax.default_backend() == 'gpu'
  for plane in profile.planes:
    if on_gpu and not plane.name.startswith('/device:GPU'):
      continue
    for line in plane.lines:
      for event in line.events:
        op = _event_op(event, scopes)
        if op is None:
          if on_gpu:  # a kernel all the same: keep its time visible
            by_op[f'unmatched ({line.name}): {event.name[:100]}'] += event.duration_ns / 1e9
            seconds['unmatched'] += event.duration_ns / 1e9
          continue  # on CPU: runtime bookkeeping, not a compiled op
        scope = scopes[op]
        part = next((name for name, pattern in parts if re.search(pattern, scope)), 'other')
        seconds[part] += event.duration_ns / 1e9
        by_op[f'{op} ({scope[-80:]})'] += event.duration_ns / 1e9
  return wall, seconds, by_op


def _config(args: argparse.Namespace) -> config.TransformerConfig:
  """The preset in the fast path's execution (bfloat16 on GPU)."""
  cfg = case_config(args.preset)
  cfg = cfg.replace(vocab_size=args.vocab_size) if args.vocab_size else cfg
  return config.fast_path(cfg)


def _train_step(args: argparse.Namespace):
  cfg = _config(args)
  state = parallel.replicate(train.create_train_state(cfg, jax.random.key(0)))
  rng = parallel.replicate(jax.random.key(1))
  batch = parallel.shard(random_batch(1, args.rows, args.row_len, cfg.vocab_size))
  step = jax.pmap(functools.partial(train.train_step, config=cfg, axis_name=parallel.AXIS),
                  axis_name=parallel.AXIS)
  compiled = step.lower(state, batch, rng).compile()
  return compiled, _profile(compiled, lambda: compiled(state, batch, rng), PARTS)


def _search(args: argparse.Namespace):
  """One jitted search.decode_batch: args.rows sentences of 20 random pieces + EOS, decoding
  to 64 pieces (random weights almost never emit EOS)."""
  cfg = _config(args)
  params = train.create_train_state(cfg, jax.random.key(0)).params
  if args.checkpoint:
    params, cfg, _, _ = checkpoint.load(args.checkpoint)
  src = np.random.default_rng(0).integers(3, cfg.vocab_size, (args.rows, 21)).astype(np.int32)
  src[:, -1] = 1
  lengths = np.full(args.rows, 64, np.int32)
  jitted = jax.jit(functools.partial(
      search.decode_batch, config=cfg, max_len=64,
      decoding=config.DecodingConfig(beam_size=1 if args.search == 'greedy' else 4)))
  batch = search.Batch(src, lengths)
  compiled = jitted.lower(params, batch).compile()
  return compiled, _profile(compiled, lambda: compiled(params, batch), SEARCH_PARTS)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--preset', choices=('tiny', 'base', 'big', 'demo'), default='base')
  parser.add_argument('--rows', type=int, default=16, help='rows per step, or sentences')
  parser.add_argument('--row-len', type=int, default=256)
  parser.add_argument('--vocab-size', type=int, help="default: the preset's")
  parser.add_argument('--search', choices=('greedy', 'beam4'),
                      help='profile one search instead of a train step')
  parser.add_argument('--checkpoint', help='with --search: decode with these trained weights')
  parser.add_argument('--top', type=int, default=0, help='also list the N slowest ops')
  args = parser.parse_args()
  compiled, (wall, parts, by_op) = (_search if args.search else _train_step)(args)
  hlo = compiled.as_text()
  result = {'preset': args.preset, 'rows': args.rows, 'row_len': args.row_len,
            'search': args.search, 'checkpoint': args.checkpoint,
            'device': jax.devices()[0].device_kind, 'jax': jax.__version__,
            'cudnn_attention_calls': hlo.count('custom_call_target="__cudnn$fmha'),
            'wall_s': round(wall, 3), 'op_seconds_total': round(sum(parts.values()), 6),
            'op_seconds_by_part': {k: round(v, 6) for k, v in parts.most_common()}}
  if args.top:
    result['slowest_ops'] = {k: round(v, 6) for k, v in by_op.most_common(args.top)}
  print(json.dumps(result, indent=2))
  return 0


if __name__ == '__main__':
  sys.exit(main())
