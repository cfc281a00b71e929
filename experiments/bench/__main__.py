"""Benchmarks; prints one JSON object.

  make bench   (or: python experiments/bench --only train --train-case base)
Sections, one module each of this package (its docstring says what it measures): data, train,
checkpoint, memory, decode, and, only when asked for, scale (--only scale), loop (--only loop:
a training run's time outside its steps), startup (--only startup [--demo-model M]), score
(--only score --multi30k-model M: scoring against greedy translation and CTranslate2's
score_batch, in decode.py) and serve (--only serve --demo-model M: the server under load);
common.py holds the timing, matmul-peak, RSS and batch helpers.
"""

import argparse
import json
import os
import pathlib
import platform
import sys
import time

if '--devices' in sys.argv:  # before jax starts
  os.environ['XLA_FLAGS'] = ('--xla_force_host_platform_device_count='
                             f'{sys.argv[sys.argv.index("--devices") + 1]}')
sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # experiments/: the bench package

import jax  # noqa: E402
import numpy as np  # noqa: E402

from bench import checkpoint, data, decode, loop, memory, scale, serve, startup, train  # noqa: E402
from bench.common import ROOT, turn  # noqa: E402
from jaxformer.cli import positive_int  # noqa: E402

# Each section, and the options of this command it takes.
SECTIONS = {
    'data': (data.run, lambda args: {'data_dir': args.data_dir}),
    'train': (train.run, lambda args: {'fast_path': args.fast_path, 'only': args.train_case,
                                       'executions': args.execution,
                                       'peer': args.peer, 'lock': args.time_lock,
                                       'compiler_options': dict(args.compiler_option or [])}),
    'checkpoint': (checkpoint.run, lambda args: {}),
    'loop': (loop.run, lambda args: {'rounds': args.rounds, 'in_flight': args.steps_in_flight}),
    'decode': (decode.run, lambda args: {'data_dir': args.data_dir,
                                         'demo_model': args.demo_model,
                                         'multi30k_model': args.multi30k_model}),
    'score': (decode.score_run, lambda args: {'data_dir': args.data_dir,
                                              'multi30k_model': args.multi30k_model}),
    'serve': (serve.run, lambda args: {'demo_model': args.demo_model}),
    'memory': (memory.run, lambda args: {}),
    'scale': (scale.run, lambda args: {'data_dir': args.data_dir, 'pairs': args.scale_pairs,
                                       'src': args.scale_src, 'tgt': args.scale_tgt,
                                       'with_train': args.scale_train}),
    'startup': (startup.run, lambda args: {'data_dir': args.data_dir,
                                           'demo_model': args.demo_model,
                                           'rounds': args.rounds,
                                           'gpu': jax.default_backend() == 'gpu'}),
}


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--only', choices=sorted(SECTIONS), action='append',
                      help='run only these sections (repeatable); default: all')
  parser.add_argument('--devices', type=int,
                      help='simulate this many CPU devices (XLA_FLAGS; set before jax starts)')
  parser.add_argument('--fast-path', action=argparse.BooleanOptionalAction,
                      help='train section: the GPU fast path (bfloat16 compute) '
                      '(default: on GPU only)')
  parser.add_argument('--train-case', action='append',
                      help='train section: only these cases (repeatable), e.g. base big')
  parser.add_argument('--execution', type=train.execution_changes, action='append',
                      help='train section: time each case with this change to its Execution, '
                      "e.g. loss_chunk=4096,dropout_rng=rbg, or 'default' (repeatable)")
  parser.add_argument('--compiler-option', type=train.compiler_option, action='append',
                      help='train section: an XLA option for the timed programs alone, e.g. '
                      'xla_gpu_enable_triton_gemm=false (repeatable; XLA_FLAGS sets them for '
                      'the whole process)')
  parser.add_argument('--time-lock', metavar='FILE',
                      help='train section: time while holding a lock on FILE, so that bench '
                      'processes sharing one GPU (e.g. under different XLA_FLAGS) compile side '
                      'by side and time in turn')
  parser.add_argument('--torch', action=argparse.BooleanOptionalAction, default=True,
                      help='train section: time PyTorch beside jaxformer when it is installed')
  parser.add_argument('--demo-model', help='decode section: also time this trained model '
                      '(e.g. workdirs/demo/average-last5 after make demo); startup section: '
                      'the model whose translations it times (without it: imports and resumes)')
  parser.add_argument('--multi30k-model', help='decode section: also time this trained model '
                      'against CTranslate2 on test_2016_flickr (e.g. workdirs/multi30k/'
                      'average-last5 after make train-multi30k)')
  parser.add_argument('--rounds', type=positive_int, default=3,
                      help='startup and loop sections: rounds, each way once a round (medians)')
  parser.add_argument('--steps-in-flight', type=positive_int, action='append',
                      help='loop section: also run its cases with the trainer keeping this many '
                      'steps dispatched ahead of the metrics it reads (repeatable)')
  parser.add_argument('--scale-pairs', type=positive_int, default=4_500_000,
                      help='scale section: pairs of the synthetic corpus (WMT14 EN-DE: 4.5M)')
  parser.add_argument('--scale-src', help='scale section: your own source file instead')
  parser.add_argument('--scale-tgt', help='scale section: your own target file instead')
  parser.add_argument('--scale-train', action='store_true',
                      help="scale section: also `jaxformer train` a tiny model on it (peak RSS)")
  parser.add_argument('--data-dir', type=pathlib.Path,
                      default=os.environ.get('JAXFORMER_SHARED_DATA', ROOT.parent / 'shared/data'),
                      help='folder with multi30k/ and newstest2014/ (default: ../shared/data)')
  args = parser.parse_args()
  if args.time_lock:
    try:
      open(args.time_lock, 'a', encoding='utf-8').close()
    except OSError as error:
      parser.error(f'--time-lock: cannot open {args.time_lock}: {error.strerror}')
  # scale: minutes, GBs of disk; loop and startup: minutes; serve and score: a trained model
  sections = args.only or sorted(set(SECTIONS) - {'scale', 'loop', 'startup', 'score', 'serve'})
  needs_data = {'data', 'decode', 'scale', 'startup', 'score'} & set(sections)
  if needs_data and not (args.data_dir / 'multi30k').is_dir():
    print(f'error: {args.data_dir}/multi30k not found; pass --data-dir', file=sys.stderr)
    return 2
  # PyTorch's peer first, in a process of its own, before jax starts and takes the GPU; holding
  # the time lock, so that no other bench process compiles or times beside it.
  args.peer = None
  if 'train' in sections and args.torch:
    with turn(args.time_lock):
      args.peer = train.torch_peer(args.train_case)
  results = {'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
             'machine': {'platform': platform.platform(), 'cpus': os.cpu_count(),
                         'backend': jax.default_backend(),
                         'device': jax.devices()[0].device_kind,
                         'local_devices': jax.local_device_count(),
                         'python': platform.python_version(), 'jax': jax.__version__,
                         'xla_flags': os.environ.get('XLA_FLAGS', ''),
                         'glibc_tunables': os.environ.get('GLIBC_TUNABLES', ''),
                         'numpy': np.__version__}}
  for name in sections:
    run, options = SECTIONS[name]
    results[name] = run(**options(args))
  print(json.dumps(results, indent=2))
  return 0


if __name__ == '__main__':
  sys.exit(main())
