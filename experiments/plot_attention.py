"""PNG heat-maps of a trained model's encoder-decoder attention for one sentence, and of the
positional encoding.

  python experiments/plot_attention.py --workdir workdirs/base --out plots \\
      --sentence "The man who is reading the book is my brother."
"""

import argparse
import logging
import pathlib
import sys

from jaxformer import checkpoint, cli, data, plots
from jaxformer.translation import Translator


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--workdir', required=True, help='a workdir or checkpoint folder')
  parser.add_argument('--average-last', type=int)
  parser.add_argument('--sentence', required=True, help='a source sentence')
  parser.add_argument('--translation', help='score this translation instead of the model\'s')
  parser.add_argument('--out', required=True, help='folder for the PNG files')
  cli.add_compilation_cache_flag(parser)
  args = parser.parse_args(argv)
  logging.getLogger('absl').setLevel(logging.WARNING)
  cli.use_compilation_cache(args)
  try:
    translator = Translator.from_checkpoint(args.workdir, average_last=args.average_last)
  except (checkpoint.CheckpointError, data.DataError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 1
  written = plots.save_attention(translator, args.sentence, args.out, args.translation)
  pe = pathlib.Path(args.out) / 'positional_encoding.png'
  plots.save_positional_encoding(translator.config.d_model, pe)
  for path in [*written, pe]:
    print(path)
  return 0


if __name__ == '__main__':
  sys.exit(main())
