"""Where one train step's time goes: traces it with jax.profiler and sums the compiled ops'
durations by the part of the model they come from (from the ops' HLO metadata).

  python experiments/profile_step.py                      # base, 16 rows x 256 tokens
  python experiments/profile_step.py --preset big --rows 8
  python experiments/profile_step.py --preset demo --rows 32 --row-len 128   # make demo's step

Prints one JSON object: the step's wall time and, per part, the summed op time. On CPU the op
times of the runtime's threads add up to more than the wall time (ops run side by side).
"""

import argparse
import collections
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

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench.common import random_batch  # noqa: E402
from jaxformer import config, parallel, recipes, train  # noqa: E402

# (part, pattern on the op's name scope), first match wins.
PARTS = [('softmax projection + loss', r'chunked|_projected|/while/|closed_call|log_softmax'
          r'|embed\.attend|jit\(_fun\)/reduce$'),
         ('attention: scores, softmax, weighted sum', r'attention/(?!.*(query|key|value|out)/)'),
         ('attention: q, k, v, out projections', r'attention.*(query|key|value|out)/'),
         ('feed-forward', r'/ffn/'),
         ('dropout', r'dropout|random|threefry|bernoulli'),
         ('layer norm', r'norm'),
         ('optimizer', r'adam|optax|scale_by|apply_gradients')]


def _op_scopes(hlo_text: str) -> dict[str, str]:
  return dict(re.findall(r'%?([\w.\-]+) = \S+ .*?op_name="([^"]*)"', hlo_text))


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--preset', choices=('tiny', 'base', 'big', 'demo'), default='base')
  parser.add_argument('--rows', type=int, default=16)
  parser.add_argument('--row-len', type=int, default=256)
  args = parser.parse_args()
  cfg = recipes.load('demo').model if args.preset == 'demo' else getattr(config, args.preset)()
  state = parallel.replicate(train.create_train_state(cfg, jax.random.key(0)))
  rng = parallel.replicate(jax.random.key(1))
  batch = parallel.shard(random_batch(1, args.rows, args.row_len, cfg.vocab_size))
  step = jax.pmap(lambda s, b, r: train.train_step(s, b, r, axis_name='batch'),
                  axis_name='batch', donate_argnums=0)
  compiled = step.lower(state, batch, rng).compile()
  scopes = _op_scopes(compiled.as_text())
  state, metrics = compiled(state, batch, rng)  # warm-up
  jax.block_until_ready(metrics)
  with tempfile.TemporaryDirectory() as tmp:
    jax.profiler.start_trace(tmp)
    start = time.perf_counter()
    state, metrics = compiled(state, batch, rng)
    jax.block_until_ready(metrics)
    wall = time.perf_counter() - start
    jax.profiler.stop_trace()
    trace = next(pathlib.Path(tmp).rglob('*.xplane.pb'))
    profile = jax.profiler.ProfileData.from_file(str(trace))
  parts = collections.Counter()
  for plane in profile.planes:
    for line in plane.lines:
      for event in line.events:
        if event.name not in scopes:  # runtime bookkeeping, not a compiled op
          continue
        scope = scopes[event.name]
        part = next((name for name, pattern in PARTS if re.search(pattern, scope)), 'other')
        parts[part] += event.duration_ns / 1e9
  print(json.dumps({'preset': args.preset, 'rows': args.rows, 'row_len': args.row_len,
                    'device': jax.devices()[0].device_kind, 'step_wall_s': round(wall, 3),
                    'op_seconds_total': round(sum(parts.values()), 6),
                    'op_seconds_by_part': {k: round(v, 6) for k, v in parts.most_common()}},
                   indent=2))
  return 0


if __name__ == '__main__':
  sys.exit(main())
