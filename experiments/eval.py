"""BLEU and chrF of a trained model: the same code as `jaxformer eval` (see its --help).

  python experiments/eval.py --workdir workdirs/base --average-last 5   # tfds newstest2014
  python experiments/eval.py --checkpoint workdirs/base/average-last5 \\
      --src ../shared/data/newstest2014/newstest2014.en \\
      --ref ../shared/data/newstest2014/newstest2014.de
"""

import sys

from jaxformer import cli

if __name__ == '__main__':
  sys.exit(cli.main(['eval', *sys.argv[1:]]))
