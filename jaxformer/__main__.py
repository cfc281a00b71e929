"""The `jaxformer` command (and `python -m jaxformer`): `translate --server URL` is answered by
serving.client_main without importing jax; every other command is jaxformer.cli's."""

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
