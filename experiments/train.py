"""Trains a Transformer from a config file; thin: flags -> configs -> train_and_evaluate.

  python experiments/train.py --config experiments/configs/base.py --workdir workdirs/base
  python experiments/train.py --config experiments/configs/base.py --workdir W \\
      --source text --train_src train.en --train_tgt train.de --eval_src val.en --eval_tgt val.de

Rerunning the same command resumes from the newest checkpoint in the workdir.
"""

import argparse
import dataclasses
import json
import logging
import pathlib
import runpy
import sys
from typing import Any

from jaxformer import checkpoint, data, parallel, train

TABLE3 = pathlib.Path(__file__).resolve().parent / 'configs' / 'table3.py'


def _load_config(path: str) -> dict:
  """The settings of a config file; DataError for a file that does not give them."""
  if not pathlib.Path(path).is_file():
    raise data.DataError(f'{path}: no such config file.')
  try:
    settings = runpy.run_path(path)['get_config']()
  except Exception as e:  # pylint: disable=broad-except  (any error in the user's file)
    raise data.DataError(f'{path}: cannot load the config ({type(e).__name__}: {e}).') from None
  if not isinstance(settings, dict) or {'model', 'train', 'data'} - set(settings):
    raise data.DataError(f"{path}: get_config() must return a dict with 'model', 'train' and "
                         "'data' (see experiments/configs/base.py).")
  known = [f.name for f in dataclasses.fields(train.TrainConfig)]
  if unknown := set(settings['train']) - set(known):
    raise data.DataError(f'{path}: unknown training settings {sorted(unknown)}; valid: '
                         f'{", ".join(known)}.')
  return settings


def _texts(source: dict, args: argparse.Namespace
           ) -> tuple[data.ParallelText, data.ParallelText | None]:
  if source['source'] == 'wmt14':
    load = lambda split: data.load_wmt14(source['target_language'], split,  # noqa: E731
                                         data_dir=args.tfds_data_dir, download=args.download)
    return load('train'), load('validation')
  if not (args.train_src and args.train_tgt):
    raise data.DataError('--source text needs --train_src and --train_tgt.')
  eval_text = data.read_parallel_text(args.eval_src, args.eval_tgt) \
      if args.eval_src and args.eval_tgt else None
  return data.read_parallel_text(args.train_src, args.train_tgt), eval_text


def experiment(args: argparse.Namespace) -> tuple[Any, train.TrainConfig, dict]:
  """(model config, train config, data source) from the config file, --variant and the flags."""
  settings = _load_config(args.config)
  if args.variant:
    table3 = runpy.run_path(str(TABLE3))
    try:
      model = table3['variant_config'](args.variant, settings['model'].vocab_size)
    except ValueError as e:
      raise data.DataError(str(e)) from None
    settings = dict(settings, model=model,
                    train={**settings['train'], **table3['train_overrides'](args.variant)})
  source = dict(settings['data'], **({'source': args.source} if args.source else {}))
  overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(train.TrainConfig)
               if getattr(args, f.name, None) is not None}
  if args.allow_cpu:
    overrides['require_accelerator'] = False
  model = settings['model'].replace(remat=True) if args.remat else settings['model']
  return model, train.TrainConfig(**{**settings['train'], **overrides}), source


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--config', required=True, help='experiments/configs/*.py')
  parser.add_argument('--workdir', required=True)
  parser.add_argument('--variant', help='a Table 3 row (A1..A4, B1, B2, C1..C7, D1..D4, E, big): '
                      'the config\'s model becomes that variant of base')
  parser.add_argument('--source', choices=('wmt14', 'text'), help="default: the config's")
  parser.add_argument('--train_src'), parser.add_argument('--train_tgt')
  parser.add_argument('--eval_src'), parser.add_argument('--eval_tgt')
  parser.add_argument('--tfds_data_dir', help='tfds data folder (default: $TFDS_DATA_DIR)')
  parser.add_argument('--download', action='store_true',
                      help='let tfds download and prepare WMT14 (needs internet; hours)')
  for name in ('num_steps', 'tokens_per_batch', 'accum_steps', 'row_len', 'seed',
               'checkpoint_every_steps', 'keep_checkpoints', 'average_last', 'eval_every_steps',
               'log_every_steps', 'bleu_sentences', 'host_sync_every_steps'):
    parser.add_argument(f'--{name}', type=int)
  parser.add_argument('--checkpoint_every_secs', type=float)
  parser.add_argument('--skip_nonfinite', action='store_true', default=None,
                      help='skip and count updates with a non-finite loss instead of stopping')
  parser.add_argument('--reset_data', action='store_true', default=None,
                      help="resume the checkpoint's params, optimiser state and step on a fresh "
                      'data stream (after changing the corpus or the seed)')
  parser.add_argument('--fast_path', action=argparse.BooleanOptionalAction,
                      help='bfloat16 compute and fused attention (default: on GPU only)')
  parser.add_argument('--remat', action='store_true',
                      help='recompute layer activations in the backward pass (less memory)')
  parser.add_argument('--allow_cpu', action='store_true',
                      help="train the paper's recipes even on a CPU backend (they refuse it)")
  group = parser.add_argument_group('multi-host (jax.distributed)')
  group.add_argument('--distributed', action='store_true',
                     help='call jax.distributed.initialize (auto-detects on SLURM, TPU, ...)')
  group.add_argument('--coordinator_address', help='host:port of process 0')
  group.add_argument('--num_processes', type=int)
  group.add_argument('--process_id', type=int)
  return parser


def main(argv: list[str] | None = None) -> int:
  args = build_parser().parse_args(argv)
  logging.basicConfig(level=logging.INFO, format='%(levelname)s %(name)s: %(message)s',
                      force=True)  # absl may have installed a handler already
  logging.getLogger('absl').setLevel(logging.WARNING)  # orbax logs every step at INFO
  if args.distributed or args.coordinator_address:
    parallel.initialize(args.coordinator_address, args.num_processes, args.process_id)
  try:
    model_config, train_config, source = experiment(args)
    train.check_backend(train_config)  # before any data is read
    train.check_settings(model_config, train_config)
    train_text, eval_text = _texts(source, args)
    summary = train.train_and_evaluate(model_config, train_config, train_text, eval_text)
  except (data.DataError, checkpoint.CheckpointError, train.TrainingError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 1
  except KeyboardInterrupt:  # before the loop's own SIGINT handler (which saves and stops)
    print('interrupted', file=sys.stderr)
    return 130
  print(json.dumps(summary, indent=2))
  return 0


if __name__ == '__main__':
  sys.exit(main())
