"""The `jaxformer` command (and `python -m jaxformer`, and jaxformer.cli.main): the one place
that hands `translate --server URL` to serving.client_main, which imports no jax; every other
command is jaxformer.cli's."""

import sys

from jaxformer import serving


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  if serving.is_client(argv):
    return serving.client_main(argv[1:])
  from jaxformer import cli  # pylint: disable=g-import-not-at-top
  return cli.run(argv)


if __name__ == '__main__':
  sys.exit(main())
