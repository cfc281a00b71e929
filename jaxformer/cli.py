"""The `jaxformer` command line: thin wrappers around library functions."""

import argparse
import os
import sys

_PRESETS = ('tiny', 'base', 'big')


def positive_int(text: str) -> int:
  """An argparse type: an integer >= 1 (argparse reports anything else in one line)."""
  try:
    value = int(text)
  except ValueError:
    value = 0
  if value < 1:
    raise argparse.ArgumentTypeError(f'must be an integer >= 1, got {text!r}')
  return value


def _params(args: argparse.Namespace) -> int:
  import jax
  import jax.numpy as jnp

  from jaxformer import config as config_lib
  from jaxformer.model import Transformer

  cfg = getattr(config_lib, args.preset)(vocab_size=args.vocab_size)
  dummy = jnp.ones((1, 1), jnp.int32)
  shapes = jax.eval_shape(Transformer(cfg).init, jax.random.key(0), dummy, dummy)
  print(f'{args.preset} (vocab {args.vocab_size}): '
        f'{sum(x.size for x in jax.tree.leaves(shapes)):,} parameters')
  return 0


def _average(args: argparse.Namespace) -> int:
  from jaxformer import checkpoint

  try:
    out = checkpoint.save_average(args.workdir, args.last)
  except checkpoint.CheckpointError as e:
    print(f'error: {e}', file=sys.stderr)
    return 1
  print(f'averaged the last {args.last} checkpoints of {args.workdir} into {out}')
  return 0


def _translate(args: argparse.Namespace) -> int:
  import itertools  # pylint: disable=g-import-not-at-top

  from jaxformer import checkpoint, data, evaluate  # pylint: disable=g-import-not-at-top

  try:
    translator = evaluate.Translator.from_checkpoint(
        args.workdir, average_last=args.average_last, beam_size=args.beam, alpha=args.alpha,
        batch_size=args.batch_size)
  except (checkpoint.CheckpointError, data.DataError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 1
  lines = (data.decode_line(raw, f'stdin:{number}')
           for number, raw in enumerate(sys.stdin.buffer, start=1))
  try:
    while chunk := list(itertools.islice(lines, args.batch_size)):  # streams: a batch at a time
      for translation in translator.translate(chunk):
        sys.stdout.write(translation + '\n')
      sys.stdout.flush()
  except data.DataError as e:  # input that is not UTF-8: stop at that line
    print(f'error: {e}', file=sys.stderr)
    return 1
  return 0


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog='jaxformer',
      description='A faithful JAX/Flax reproduction of "Attention Is All You Need".')
  commands = parser.add_subparsers(dest='command', metavar='COMMAND')
  params = commands.add_parser('params', help='count the parameters of a preset')
  params.add_argument('--preset', choices=_PRESETS, default='base')
  params.add_argument('--vocab-size', type=positive_int, default=37000)
  params.set_defaults(run=_params)
  average = commands.add_parser(
      'average', help='average the last N checkpoints of a workdir into a new checkpoint')
  average.add_argument('--workdir', required=True)
  average.add_argument('--last', type=positive_int, default=5,
                       help='how many (paper: 5 base, 20 big)')
  average.set_defaults(run=_average)
  translate = commands.add_parser(
      'translate', help='translate stdin to stdout, one line per line (beam 4, alpha 0.6)')
  translate.add_argument('--workdir', required=True, help='a workdir or checkpoint folder')
  translate.add_argument('--average-last', type=positive_int,
                         help='average the last N checkpoints')
  translate.add_argument('--beam', type=positive_int, default=4)
  translate.add_argument('--alpha', type=float, default=0.6)
  translate.add_argument('--batch-size', type=positive_int, default=32)
  translate.set_defaults(run=_translate)
  return parser


def main(argv: list[str] | None = None) -> int:
  parser = build_parser()
  args = parser.parse_args(argv)
  if args.command is None:
    parser.print_help()
    return 0
  try:
    return args.run(args)
  except KeyboardInterrupt:
    print('interrupted', file=sys.stderr)
    return 130
  except BrokenPipeError:  # the reader went away, e.g. `jaxformer translate < f | head -3`
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit either
    return 1


if __name__ == '__main__':
  sys.exit(main())
