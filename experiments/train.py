"""Trains a Transformer: the same code as `jaxformer train` (see its --help).

  python experiments/train.py --config base --workdir workdirs/base --tfds-data-dir ~/tfds
  python experiments/train.py --config demo --workdir W --set train.num_steps=20

Rerunning the same command resumes from the newest checkpoint in the workdir.
"""

import sys

from jaxformer import cli

if __name__ == '__main__':
  sys.exit(cli.main(['train', *sys.argv[1:]]))
