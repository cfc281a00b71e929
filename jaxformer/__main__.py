"""The `jaxformer` command (and `python -m jaxformer`): `translate --server URL` goes to
client.client_main without importing jax (a client starts in a fraction of the time), every
other command to jaxformer.cli.main."""

import sys

from jaxformer import client


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  if client.is_client(argv):
    return client.client_main(argv[1:])
  from jaxformer import cli  # pylint: disable=g-import-not-at-top
  return cli.main(argv)


if __name__ == '__main__':
  sys.exit(main())
