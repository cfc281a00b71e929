"""The `jaxformer` command (and `python -m jaxformer`): `translate --server URL` goes to
serving.client_main without importing jax (a client starts in a fraction of the time), every
other command to jaxformer.cli.main."""

import sys

from jaxformer import serving


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  if serving.is_client(argv):
    return serving.client_main(argv[1:])
  from jaxformer import cli  # pylint: disable=g-import-not-at-top
  return cli.main(argv)


if __name__ == '__main__':
  sys.exit(main())
