"""The `jaxformer` command line: thin wrappers around library functions."""

import argparse
import sys

_PRESETS = ('tiny', 'base', 'big')


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


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog='jaxformer',
      description='A faithful JAX/Flax reproduction of "Attention Is All You Need".')
  commands = parser.add_subparsers(dest='command', metavar='COMMAND')
  params = commands.add_parser('params', help='count the parameters of a preset')
  params.add_argument('--preset', choices=_PRESETS, default='base')
  params.add_argument('--vocab-size', type=int, default=37000)
  params.set_defaults(run=_params)
  return parser


def main(argv: list[str] | None = None) -> int:
  parser = build_parser()
  args = parser.parse_args(argv)
  if args.command is None:
    parser.print_help()
    return 0
  return args.run(args)


if __name__ == '__main__':
  sys.exit(main())
