"""jaxformer against transformers' MarianMTModel on the Hugging Face export of the same model,
sentence by sentence (pip install 'jaxformer[test]' brings torch and transformers):

  python experiments/huggingface_parity.py --model workdirs/demo/average-last5 --out report.json
  python experiments/huggingface_parity.py --model W/average-last5 --src test_2016_flickr.en

Exports the model (`jaxformer export --format huggingface`) into a temporary folder, then
translates the demo's 1,000 test sentences (or --src FILE) with both: greedy, and beam 4 with
transformers' length penalty (it divides by length^lp) at the paper's alpha, 0.6, and at the lp
whose slope matches GNMT's ((5 + L) / 6)^alpha at the median output length L (alpha L / (5 + L):
as near to GNMT's as one exponent of the length can be there). Every search has jaxformer's
limit, min(input + 50, max_len) pieces. Then the teacher-forced logits of both on the first 100
sentences' greedy outputs: their largest difference with Marian's layer norms as transformers
makes them (epsilon 1e-5) and with jaxformer's epsilon, 1e-6, put in.
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


def _agreement(ours: list[str], theirs: list[str]) -> dict:
  differ = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
  return {'same_output': round(1 - len(differ) / len(ours), 4), 'differing': len(differ),
          'examples': [{'line': i, 'jaxformer': ours[i], 'transformers': theirs[i]}
                       for i in differ[:3]]}


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--model', required=True, help='a workdir, checkpoint or exported folder')
  parser.add_argument('--src', help='source sentences, one a line (default: the demo test set)')
  parser.add_argument('--out', help='write the report here too')
  args = parser.parse_args()
  transformers.logging.set_verbosity_error()
  sentences = backend_parity.sources(args.src)
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
  text = json.dumps(report, indent=1, ensure_ascii=False)
  print(text)
  if args.out:
    pathlib.Path(args.out).write_text(text + '\n', encoding='utf-8')
  return 0


if __name__ == '__main__':
  sys.exit(main())
