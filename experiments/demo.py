"""The offline demo: generate the embedded EN->DE corpus, train a small Transformer with the
paper's recipe (same code as base), average its last checkpoints, score BLEU on the held-out
split with beam 4 / alpha 0.6, and show the work. `make demo` runs it.

Rerunning in the same workdir resumes (or, when finished, just re-evaluates).
"""

import argparse
import dataclasses
import json
import logging
import pathlib
import sys
import time

from jaxformer import cli, commands, compilation, monitor, plots, recipes, scoring, trainer
from jaxformer.data import embedded
from jaxformer.errors import JaxformerError
from jaxformer.translation import Translator

VERB_FINAL = (' weil ', ' obwohl ', ' wenn ')


def run(workdir: pathlib.Path, *, num_steps: int | None = None, train_pairs: int | None = None,
        test_pairs: int | None = None, samples: int = 5) -> dict:
  start = time.monotonic()
  recipe = recipes.load('demo')
  sizes = recipe.data
  log = logging.getLogger('demo')

  # 1. The corpus (generated, deterministic).
  corpus = embedded.splits(train_pairs or sizes.train_pairs,
                           min(sizes.validation_pairs, test_pairs or sizes.test_pairs),
                           test_pairs or sizes.test_pairs)
  log.info('embedded corpus: %s', {k: len(v) for k, v in corpus.items()})

  # 2-4. Vocabulary, training with checkpoints, averaging of the last N.
  settings = recipe.train
  if num_steps is not None:  # a shorter (or longer) run: keep 5 checkpoints and 2 evaluations
    settings = dataclasses.replace(settings, num_steps=num_steps,
                                   checkpoint_every_steps=max(1, num_steps // 5),
                                   eval_every_steps=max(1, num_steps // 2))
  if test_pairs is not None:
    settings = dataclasses.replace(settings,
                                   bleu_sentences=min(settings.bleu_sentences, test_pairs))
  summary = trainer.train(recipe.model, settings, workdir, corpus['train'],
                          corpus['validation'], optim=recipe.optim)
  if summary.get('signal') == 'SIGINT':  # saved; the rerun resumes
    raise KeyboardInterrupt
  if summary['preempted']:
    return summary
  model_path = summary.get('averaged', str(workdir))

  # 5. BLEU on the held-out split, decoded as in the paper.
  translator = Translator.from_checkpoint(model_path)
  test = corpus['test']
  hypotheses = translator.translate(test.src, progress=True)
  for name, lines in (('test.en', test.src), ('test.de', test.tgt),
                      ('test_hypotheses.de', hypotheses)):  # `jaxformer eval --src --ref` reads
    (workdir / name).write_text(''.join(line + '\n' for line in lines), encoding='utf-8')
  bleu, signature = scoring.sacre_bleu(hypotheses, test.tgt)

  # 6-7. Samples and pictures.
  print('\nsample translations of held-out sentences (source / model / reference):')
  for src, hyp, ref in list(zip(test.src, hypotheses, test.tgt))[:samples]:
    print(f'  EN  {src}\n  MT  {hyp}\n  REF {ref}\n')
  plots.save_learning_curve(workdir / 'metrics.jsonl', workdir / 'learning_curve.png')
  pick = next((i for i, r in enumerate(test.tgt) if any(c in r for c in VERB_FINAL)), 0)
  sentence = test.src[pick]  # its translation is at hand: no search compiled for one sentence
  attention = plots.save_attention(translator, sentence, workdir / 'attention', hypotheses[pick])
  result = {'workdir': str(workdir), 'model': model_path, 'steps': summary['step'],
            'sacrebleu': round(bleu, 2), 'signature': signature,
            'test_sentences': len(test), 'attention_sentence': sentence,
            'pictures': [str(workdir / 'learning_curve.png')] + [str(p) for p in attention],
            'wall_time_s': round(time.monotonic() - start, 1)}
  (workdir / 'demo_summary.json').write_text(json.dumps(result, indent=2))

  # 8. Summary.
  print(f'workdir      {workdir}')
  print(f'model        {model_path} (average of the last checkpoints)')
  print(f'BLEU         {bleu:.2f} on {len(test)} held-out sentences with unseen adjective-noun '
        f'pairs ({signature})')
  print(f'pictures     {workdir / "learning_curve.png"}, {workdir / "attention"}/')
  print(f'wall time    {result["wall_time_s"]:.0f} s')
  print('the real thing: make train-base WORKDIR=workdirs/base TFDS_DATA_DIR=...  '
        '(WMT14 EN-DE, the paper\'s base recipe; docs/training.md)')
  return result


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  parser.add_argument('--workdir', default='workdirs/demo')
  parser.add_argument('--num-steps', '--num_steps', dest='num_steps', type=cli.positive_int,
                      help="shorter or longer training (default: the config's)")
  parser.add_argument('--train-pairs', '--train_pairs', dest='train_pairs', type=cli.positive_int,
                      help="generated training pairs (default: the config's)")
  parser.add_argument('--test-pairs', '--test_pairs', dest='test_pairs', type=cli.positive_int,
                      help="generated test pairs (default: the config's)")
  cli.add_compilation_cache_flag(parser)
  args = parser.parse_args(argv)
  commands.setup_logging('demo')
  cli.use_compilation_cache(args)
  try:
    with monitor.Interrupts(), compilation.one_line_cache_errors():
      run(pathlib.Path(args.workdir), num_steps=args.num_steps, train_pairs=args.train_pairs,
          test_pairs=args.test_pairs)
  except (JaxformerError, ValueError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 1
  except KeyboardInterrupt:  # before training, while decoding, or after a save on Ctrl-C
    print('\ninterrupted', file=sys.stderr)  # on its own line: a progress bar may be cut short
    return 130
  return 0


if __name__ == '__main__':
  sys.exit(main())
