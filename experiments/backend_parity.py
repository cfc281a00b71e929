"""Decoding on two backends, sentence by sentence: does a GPU translate exactly as the CPU does?

  python experiments/backend_parity.py decode --model exported/demo --out cpu.json
  python experiments/backend_parity.py decode --model exported/demo --out gpu.json   (on a GPU)
  python experiments/backend_parity.py compare cpu.json gpu.json --model exported/demo

`decode` translates the demo's 1,000 test sentences (or --src FILE) greedily and with the paper's
beam search (beam 4, alpha 0.6), keeping each output's piece ids and each beam output's score.
`compare` lists the sentences whose outputs differ and explains each with the arithmetic of the
backend it runs on: both outputs scored by teacher forcing (log-probability / the beam's length
penalty), and at the first piece where they part, the log-probabilities of the two pieces
given their common prefix. A near tie there (a gap far under the model's usual margins) is the
rounding of one backend's matrix products choosing the other piece, not a defect of the search.
--precision highest runs float32 matrix products at full float32 precision (a GPU's default may
round their operands to TF32), which tells rounding apart from anything else.
"""

import argparse
import json
import pathlib
import sys

import jax
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
# pylint: disable=wrong-import-position
from jaxformer import files, recipes, translation  # noqa: E402
from jaxformer.data import embedded  # noqa: E402
from jaxformer.data.tokenizer import EOS_ID  # noqa: E402
from jaxformer.decode import length_penalty  # noqa: E402
from jaxformer.model import Transformer  # noqa: E402

SEARCHES = {'greedy': 1, 'beam4': 4}
ALPHA = 0.6


def sources(path: str | None) -> list[str]:
  """The lines of `path`, or the demo's 1,000 test sentences."""
  if path:
    return pathlib.Path(path).read_text(encoding='utf-8').splitlines()
  sizes = recipes.load('demo').data
  return embedded.splits(sizes.train_pairs, sizes.validation_pairs,
                         sizes.test_pairs)['test'].src[:1000]


def decode(model: str, src: str | None, precision: str) -> dict:
  """Each search's piece ids per sentence, and the beam's scores, on this backend."""
  sentences = sources(src)
  with jax.default_matmul_precision(precision):
    result = {'backend': jax.default_backend(), 'device': jax.devices()[0].device_kind,
              'jax': jax.__version__, 'precision': precision, 'sources': sentences}
    searches = {name: translation.Translator.from_pretrained(model, beam_size=beam, alpha=ALPHA)
                for name, beam in SEARCHES.items()}
    for name, translator in searches.items():
      result[name] = translator.translate_ids(sentences, progress=True)
    result['beam4_scores'] = [best[0][1] if best else None for best in searches['beam4']
                              .translate_nbest(sentences, 1, progress=True)]
  return result


def log_probs(translator: translation.Translator, src: list[int], hyps: list[list[int]]
              ) -> list[np.ndarray]:
  """Each hypothesis's log-probabilities [its pieces and EOS, V] given `src`, teacher forced."""
  model, params = Transformer(translator.config), translator.params
  width = max(map(len, hyps)) + 1
  tgt_in = np.zeros((len(hyps), width), np.int32)
  for row, hyp in enumerate(hyps):
    tgt_in[row, 1:len(hyp) + 1] = hyp
  source = np.repeat(np.array([src + [EOS_ID]], np.int32), len(hyps), axis=0)
  encoded = model.apply({'params': params}, source, method=Transformer.encode)
  logits = model.apply({'params': params}, encoded, source, tgt_in, method=Transformer.decode)
  return [np.asarray(jax.nn.log_softmax(logits[row, :len(hyp) + 1]))
          for row, hyp in enumerate(hyps)]


def explain(translator: translation.Translator, src: list[int], a: list[int], b: list[int]
            ) -> dict:
  """Both outputs' teacher-forced scores (each as ended by EOS, also one that the length limit
  ended), and the two pieces' log-probabilities where they part."""
  part = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
  lp_a, lp_b = (lp[np.arange(len(hyp) + 1), hyp + [EOS_ID]]
                for lp, hyp in zip(log_probs(translator, src, [a, b]), (a, b)))
  scores = [float(lp.sum() / length_penalty(np.array(len(lp)), ALPHA)) for lp in (lp_a, lp_b)]
  return {'part_at': part, 'piece_log_prob': [float(lp_a[part]), float(lp_b[part])],
          'gap_at_part': abs(float(lp_a[part] - lp_b[part])), 'score': scores}


def compare(a: dict, b: dict, model: str, precision: str) -> dict:
  """The sentences whose outputs differ between runs `a` and `b`, each explained (explain) with
  this backend's arithmetic."""
  if a['sources'] != b['sources']:
    raise SystemExit('error: the two runs translated different sentences')
  with jax.default_matmul_precision(precision):
    translator = translation.Translator.from_pretrained(model)
    report = {'a': {k: a[k] for k in ('backend', 'device', 'jax', 'precision')},
              'b': {k: b[k] for k in ('backend', 'device', 'jax', 'precision')},
              'scored_on': jax.default_backend(), 'scoring_precision': precision,
              'sentences': len(a['sources'])}
    for name in SEARCHES:
      differ = [i for i, (x, y) in enumerate(zip(a[name], b[name])) if x != y]
      report[name] = {'differ': len(differ), 'cases': []}
      for i in differ:
        src = translator.tokenizer.encode([a['sources'][i]])[0][:translator.config.max_len - 1]
        case = {'sentence': i, **explain(translator, src, a[name][i], b[name][i])}
        if name == 'beam4':
          case['search_scores'] = [a['beam4_scores'][i], b['beam4_scores'][i]]
        case['outputs'] = translator.tokenizer.decode([a[name][i], b[name][i]])
        report[name]['cases'].append(case)
  return report


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  sub = parser.add_subparsers(dest='command', required=True)
  run = sub.add_parser('decode', help='translate with both searches on this backend')
  run.add_argument('--src', help="source sentences (default: the demo's 1,000 test sentences)")
  run.add_argument('--out', required=True, help='where the JSON goes')
  check = sub.add_parser('compare', help='explain where two decode runs differ')
  check.add_argument('runs', nargs=2, help='two JSON files written by decode')
  check.add_argument('--out', help='the report as JSON (default: stdout only)')
  for command in (run, check):
    command.add_argument('--model', required=True, help='an exported folder (jaxformer export)')
    command.add_argument('--precision', choices=('default', 'highest'), default='default',
                         help="float32 matrix products' precision (jax.default_matmul_precision)")
  args = parser.parse_args(argv)
  if args.out:  # before the decoding (minutes of a lent GPU's), not after it
    files.check_output(args.out, 'the report')
  if args.command == 'decode':
    pathlib.Path(args.out).write_text(json.dumps(decode(args.model, args.src, args.precision)))
    return 0
  a, b = (json.loads(pathlib.Path(p).read_text()) for p in args.runs)
  report = compare(a, b, args.model, args.precision)
  text = json.dumps(report, indent=1, ensure_ascii=False)
  if args.out:
    pathlib.Path(args.out).write_text(text)
  for name in SEARCHES:
    gaps = [c['gap_at_part'] for c in report[name]['cases']]
    print(f"{name}: {report[name]['differ']} of {report['sentences']} differ"
          + (f'; gap where they part: max {max(gaps):.2e}, median {np.median(gaps):.2e}'
             if gaps else ''))
  return 0


if __name__ == '__main__':
  sys.exit(main())
