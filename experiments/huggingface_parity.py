"""jaxformer against transformers' MarianMTModel on the Hugging Face export of the same model,
sentence by sentence (pip install 'jaxformer[test]' brings torch and transformers):

  python experiments/huggingface_parity.py --model workdirs/demo/average-last5 --out report.json
  python experiments/huggingface_parity.py --model W/average-last5 --src test_2016_flickr.en
  python experiments/huggingface_parity.py --marian --model FOLDER --src S --tgt T

Exports the model (`jaxformer export --format huggingface`) into a temporary folder, then
translates the demo's 1,000 test sentences (or --src FILE) with both: greedy, and beam 4 with
transformers' length penalty (it divides by length^lp) at the paper's alpha, 0.6, and at the lp
whose slope matches GNMT's ((5 + L) / 6)^alpha at the median output length L (alpha L / (5 + L):
as near to GNMT's as one exponent of the length can be there). Every search has jaxformer's
limit, min(input + 50, max_len) pieces. Then the teacher-forced logits of both on the first 100
sentences' greedy outputs: their largest difference with Marian's layer norms as transformers
makes them (epsilon 1e-5) and with jaxformer's epsilon, 1e-6, put in.

With --marian, --model is a MarianMT folder (an OPUS-MT model, or experiments/opus_mt_folder.py's)
that jaxformer reads as it is: its greedy and beam outputs (no length penalty on either side)
and its forced-decoding scores against transformers' on the same folder (marian_report).
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile

import jax
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
os.environ.setdefault('HF_HUB_OFFLINE', '1')  # everything is in the exported folder
# pylint: disable=wrong-import-position
import torch  # noqa: E402
import transformers  # noqa: E402

import backend_parity  # noqa: E402  (its sources)

from jaxformer import data, export, files, translation  # noqa: E402
from jaxformer.model import Transformer  # noqa: E402


def teacher_forced_gap(out: pathlib.Path, model_path: pathlib.Path, sources: list[str],
                       targets: list[str], eps: float | None = None) -> float:
  """The largest |logit difference| between jaxformer and transformers' MarianMTModel of the
  export `out`, teacher-forced on (sources, targets), over the targets' real positions; `eps`:
  the layer norms' epsilon put into the MarianMTModel (default: transformers', 1e-5)."""
  params, cfg, spm_model, _ = export.load_model(model_path)
  tokenizer = data.Tokenizer.from_bytes(spm_model)
  src = [row + [data.EOS_ID] for row in tokenizer.encode(sources)]
  tgt = [([data.PAD_ID] + row)[:cfg.max_len] for row in tokenizer.encode(targets)]
  src_a = np.array([row + [0] * (max(map(len, src)) - len(row)) for row in src], np.int32)
  tgt_a = np.array([row + [0] * (max(map(len, tgt)) - len(row)) for row in tgt], np.int32)
  ours = np.asarray(jax.jit(Transformer(cfg).apply)({'params': params}, src_a, tgt_a))
  model = transformers.MarianMTModel.from_pretrained(out).eval()
  for module in model.modules():
    if eps is not None and isinstance(module, torch.nn.LayerNorm):
      module.eps = eps
  with torch.no_grad():
    theirs = model(input_ids=torch.tensor(src_a, dtype=torch.long),
                   attention_mask=torch.tensor(src_a != 0),
                   decoder_input_ids=torch.tensor(tgt_a, dtype=torch.long)).logits.numpy()
  real = np.array([[t < len(row) for t in range(tgt_a.shape[1])] for row in tgt])
  return float(np.abs(ours - theirs)[real].max())


def _theirs(model, tokenizer, sentences: list[str], beams: int, penalty: float) -> list[str]:
  out = []
  for start in range(0, len(sentences), 50):
    batch = tokenizer(sentences[start:start + 50], return_tensors='pt', padding=True)
    limit = min(batch['input_ids'].shape[1] + 50, model.config.max_position_embeddings)
    with torch.no_grad():
      made = model.generate(**batch, num_beams=beams, length_penalty=penalty, do_sample=False,
                            max_new_tokens=limit)
    out += tokenizer.batch_decode(made, skip_special_tokens=True)
  return out


def generate_per_length(model, tokenizer, sentences: list[str], beams: int,
                        extra_length: int = 50, length_penalty: float = 0.0) -> list[str]:
  """transformers' outputs with jaxformer's limit (input + extra_length, the paper's 50; EOS
  counted; at most the model's positions): a batch for each input length, so that every
  sentence has its own limit; by default no length penalty (as jaxformer's alpha 0); no EOS
  forced at the limit (OPUS-MT's forced_eos_token_id replaces the last piece there, which
  jaxformer's search does not)."""
  by_length: dict[int, list[int]] = {}
  for i, row in enumerate(tokenizer(sentences).input_ids):
    by_length.setdefault(len(row), []).append(i)
  out = [''] * len(sentences)
  for length, chosen in by_length.items():
    batch = tokenizer([sentences[i] for i in chosen], return_tensors='pt', padding=True)
    with torch.no_grad():
      made = model.generate(**batch, num_beams=beams, do_sample=False,
                            length_penalty=length_penalty,
                            max_new_tokens=min(length + extra_length,
                                               model.config.max_position_embeddings),
                            forced_eos_token_id=None)
    for i, text in zip(chosen, tokenizer.batch_decode(made, skip_special_tokens=True)):
      out[i] = text
  return out


def forced_log_probs(folder: pathlib.Path, sources: list[str], targets: list[str]) -> np.ndarray:
  """transformers' log-probability of each target (its pieces and EOS) given its source."""
  tokenizer = transformers.MarianTokenizer.from_pretrained(folder)
  model = transformers.MarianMTModel.from_pretrained(folder).eval()
  batch = tokenizer(sources, text_target=targets, return_tensors='pt', padding=True)
  labels = batch.pop('labels')
  with torch.no_grad():
    logits = model(**batch, labels=labels).logits.double()
  picked = logits.log_softmax(-1).gather(-1, labels.clamp(min=0)[..., None])[..., 0]
  return (picked * (labels != tokenizer.pad_token_id)).sum(-1).numpy()


def marian_report(folder: pathlib.Path, sources: list[str], targets: list[str]) -> dict:
  """A MarianMT folder read by jaxformer against transformers on the same folder: greedy
  search, beam 4 without a length penalty on both sides (and how many of the differing
  outputs jaxformer's search scores higher), and forced decoding's log-probabilities."""
  ours = translation.Translator.load(str(folder), alpha=0.0)
  tokenizer = transformers.MarianTokenizer.from_pretrained(folder)
  model = transformers.MarianMTModel.from_pretrained(folder).eval()
  report = {'model': str(folder), 'sentences': len(sources),
            'transformers': transformers.__version__}
  report['greedy'] = _agreement(ours.replace(beam_size=1).translate(sources),
                                generate_per_length(model, tokenizer, sources, 1))
  found = [best[0] for best in ours.replace(beam_size=4).translate_nbest(sources, 1)]
  theirs = generate_per_length(model, tokenizer, sources, 4)
  report['beam4_no_penalty'] = _agreement([text for text, _ in found], theirs)
  # Where they differ, which output the model itself prefers (transformers' empty ones, none
  # here, could not be scored: score refuses an empty target).
  differ = [i for i, ((text, _), other) in enumerate(zip(found, theirs)) if text != other]
  scored = ours.score([sources[i] for i in differ], [theirs[i] for i in differ])
  report['beam4_no_penalty']['jaxformer_scores_higher'] = sum(
      found[i][1] > other.log_prob for i, other in zip(differ, scored))
  # As each is used: jaxformer at the paper's alpha (GNMT's penalty), transformers at the same
  # exponent of the length and at the one whose slope matches GNMT's at the median length.
  beam = ours.replace(beam_size=4, alpha=0.6).translate(sources)
  length = statistics.median(len(ids) + 1 for ids in ours.tokenizer.encode_target(beam))
  for penalty in (0.6, round(0.6 * length / (5 + length), 3)):
    report[f'beam4_alpha_0.6_lp_{penalty}'] = _agreement(
        beam, generate_per_length(model, tokenizer, sources, 4, length_penalty=penalty))
  gap = np.abs(np.array([s.log_prob for s in ours.score(sources, targets)])
               - forced_log_probs(folder, sources, targets))
  report['score_max_abs_diff'] = float(gap.max())
  return report


def _agreement(ours: list[str], theirs: list[str]) -> dict:
  differ = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
  return {'same_output': round(1 - len(differ) / len(ours), 4), 'differing': len(differ),
          'examples': [{'line': i, 'jaxformer': ours[i], 'transformers': theirs[i]}
                       for i in differ[:3]]}


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--model', required=True, help='a workdir, checkpoint or exported folder')
  parser.add_argument('--marian', action='store_true',
                      help='--model is a MarianMT folder: read it as it is and compare (with '
                      '--src and --tgt: greedy, beam 4 and forced decoding)')
  parser.add_argument('--tgt', help='with --marian: the targets to score, one a line')
  parser.add_argument('--src', help='source sentences, one a line (default: the demo test set)')
  parser.add_argument('--out', help='write the report here too')
  args = parser.parse_args()
  transformers.logging.set_verbosity_error()
  sentences = backend_parity.sources(args.src)
  if args.marian:
    targets = pathlib.Path(args.tgt).read_text(encoding='utf-8').splitlines()[:len(sentences)]
    return _write(marian_report(pathlib.Path(args.model), sentences, targets), args.out)
  ours = (translation.Translator.from_pretrained(args.model)
          if files.describe(args.model) == files.EXPORT else
          translation.Translator.from_checkpoint(args.model))
  greedy, beam = ours.replace(beam_size=1).translate(sentences), ours.translate(sentences)
  with tempfile.TemporaryDirectory() as tmp:
    folder = export.save_as('huggingface', args.model, pathlib.Path(tmp) / 'hf')[0]
    tokenizer = transformers.MarianTokenizer.from_pretrained(folder)
    model = transformers.MarianMTModel.from_pretrained(folder).eval()
    length = statistics.median(len(ids) + 1 for ids in ours.tokenizer.encode(beam))
    matched = round(0.6 * length / (5 + length), 3)
    report = {'model': args.model, 'sentences': len(sentences),
              'transformers': transformers.__version__, 'torch': torch.__version__,
              'greedy': _agreement(greedy, _theirs(model, tokenizer, sentences, 1, 1.0)),
              'beam4_lp_0.6': _agreement(beam, _theirs(model, tokenizer, sentences, 4, 0.6)),
              f'beam4_lp_{matched}': _agreement(beam, _theirs(model, tokenizer, sentences, 4,
                                                              matched)),
              'median_output_pieces': length}
    report['logits_max_abs_diff_eps_1e-5'] = teacher_forced_gap(
        folder, pathlib.Path(args.model), sentences[:100], greedy[:100])
    report['logits_max_abs_diff_eps_1e-6'] = teacher_forced_gap(
        folder, pathlib.Path(args.model), sentences[:100], greedy[:100], eps=1e-6)
  return _write(report, args.out)


def _write(report: dict, out: str | None) -> int:
  text = json.dumps(report, indent=1, ensure_ascii=False)
  print(text)
  if out:
    pathlib.Path(out).write_text(text + '\n', encoding='utf-8')
  return 0


if __name__ == '__main__':
  sys.exit(main())
