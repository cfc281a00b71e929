"""BLEU of a trained model on newstest2014 (or your own files), with the paper's decoding.

  python experiments/eval.py --workdir workdirs/base                  # tfds newstest2014 EN->DE
  python experiments/eval.py --workdir workdirs/base --average-last 5
  python experiments/eval.py --checkpoint workdirs/base/average-last5 \\
      --src ../shared/data/newstest2014/newstest2014.en \\
      --ref ../shared/data/newstest2014/newstest2014.de

Prints sacreBLEU (detokenized, 13a, with its signature) as the headline and, beside it, the
paper-comparable tokenized BLEU (intl tokens, compounds split); writes the hypotheses.
"""

import argparse
import json
import logging
import pathlib
import sys

from jaxformer import checkpoint, cli, data, evaluate

NEWSTEST2014_FULL, NEWSTEST2014_FILTERED = 3003, 2737


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  where = parser.add_mutually_exclusive_group(required=True)
  where.add_argument('--workdir', help='a training workdir (its newest checkpoint)')
  where.add_argument('--checkpoint', help='a checkpoint folder, e.g. WORKDIR/average-last5')
  parser.add_argument('--average-last', type=cli.positive_int,
                      help='average the last N checkpoints first')
  parser.add_argument('--target-language', choices=('de', 'fr'), default='de',
                      help='tfds newstest2014 direction: EN->DE or EN->FR (default de)')
  parser.add_argument('--tfds-data-dir', help='tfds data folder (default: $TFDS_DATA_DIR)')
  parser.add_argument('--src', help='a local source file instead of tfds')
  parser.add_argument('--ref', help='its reference translations, line-aligned')
  parser.add_argument('--output', help='hypotheses file (default: next to the checkpoint)')
  parser.add_argument('--beam', type=cli.positive_int, default=4)
  parser.add_argument('--alpha', type=float, default=0.6)
  parser.add_argument('--extra-length', type=int, default=50, help='max output = input + this')
  parser.add_argument('--batch-size', type=cli.positive_int, default=32)
  return parser


def _test_set(args: argparse.Namespace) -> tuple[data.ParallelText, str]:
  if args.src or args.ref:
    if not (args.src and args.ref):
      raise data.DataError('--src and --ref go together.')
    return data.read_parallel_text(args.src, args.ref), pathlib.Path(args.src).stem
  text = data.load_wmt14(args.target_language, 'test', data_dir=args.tfds_data_dir)
  return text, f'newstest2014-en{args.target_language}'


def main(argv: list[str] | None = None) -> int:
  args = build_parser().parse_args(argv)
  logging.getLogger('absl').setLevel(logging.WARNING)
  path = args.workdir or args.checkpoint
  try:
    translator = evaluate.Translator.from_checkpoint(
        path, average_last=args.average_last, beam_size=args.beam, alpha=args.alpha,
        extra_length=args.extra_length, batch_size=args.batch_size)
    text, name = _test_set(args)
  except (data.DataError, checkpoint.CheckpointError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 1
  output = pathlib.Path(args.output or pathlib.Path(path) / f'hyps-{name}.txt')
  if not output.parent.is_dir():  # found out before the translation, not after
    print(f'error: {output.parent}: no such folder for the hypotheses.', file=sys.stderr)
    return 1
  try:
    hypotheses = translator.translate(text.src, progress=True)
  except KeyboardInterrupt:
    print('interrupted: no hypotheses written', file=sys.stderr)
    return 130
  try:
    output.write_text(''.join(h + '\n' for h in hypotheses), encoding='utf-8')
  except OSError as e:
    print(f'error: cannot write the hypotheses to {output} ({e.strerror}).', file=sys.stderr)
    return 1
  score, signature = evaluate.sacre_bleu(hypotheses, text.tgt)
  tokenized = evaluate.tokenized_bleu(hypotheses, text.tgt)
  variant = {NEWSTEST2014_FULL: 'the full newstest2014 (3003 segments, as tfds and the paper)',
             NEWSTEST2014_FILTERED: "sacreBLEU's filtered wmt14 (2737 segments)"}.get(
                 len(text), f'{len(text)} segments')
  print(f'sacreBLEU {score:.2f}  ({signature})')
  print(f'tokenized BLEU {tokenized:.2f}  (intl + compound splitting, comparable to the '
        "paper's tables; do not mix with sacreBLEU)")
  print(f'test set: {text.origin}: {variant}; beam {args.beam}, alpha {args.alpha}, max '
        f'length input + {args.extra_length}; hypotheses in {output}')
  print(json.dumps({'sacrebleu': round(score, 2), 'signature': signature,
                    'tokenized_bleu': round(tokenized, 2), 'segments': len(text),
                    'hypotheses': str(output)}))
  return 0


if __name__ == '__main__':
  sys.exit(main())
