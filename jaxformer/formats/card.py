"""The model card (README.md) of a Hugging Face export: what the model is, what it was trained
on and with, its last validation BLEU, how to load it, and what differs from jaxformer's own
decoding. Its facts come from the records of the model's training workdir (recipe.json,
metrics.jsonl), each read as a record another tool may have written (files.field)."""

import json
import math
import pathlib
from typing import Any

from jaxformer import files
from jaxformer.config import TransformerConfig


def recorded_data(origin: str | pathlib.Path | None) -> tuple[dict[str, Any], list]:
  """The data section and the rules of the recipe the model's workdir recorded, if any, the
  user's settings over them (--set: the number of steps, say) a last line."""
  found = origin and files.record_near(origin, 'recipe.json')
  if not found:
    return {}, []
  fields, where = found[1], str(found[0])
  rules = files.field(fields, 'rules', list, where, [])
  if settings := files.field(fields, 'settings', list, where, []):  # (none in older records)
    rules = [*rules, f'then your settings: {", ".join(map(str, settings))}']
  return files.field(fields, 'data', dict, where, {}), rules


def markdown(origin: str | pathlib.Path | None, config: TransformerConfig, step: int,
         data: dict[str, Any], rules: list) -> str:
  """README.md: what the model is, what it was trained on and with (`data`, `rules`: what its
  workdir recorded, _recorded_data), its last validation BLEU (where measured), how to load it,
  and what differs."""
  source, target = data.get('source_language', '?'), data.get('target_language', '?')
  trained_on = (f"`{data.get('train_src')}` / `{data.get('train_tgt')}`"
                if data.get('train_src') else 'not recorded with the model')
  recipe = ('the automatic recipe:' + ''.join(f'\n  - {" ".join(str(rule).split())}'
                                              for rule in rules) if rules else
            'not recorded with the model (see its training command)')
  bleu = last_validation_bleu(origin) if origin else 'not measured with the model'
  languages = f'language: [{source}, {target}]\n' if data else ''
  epsilon = ('' if config.norm_epsilon == 1e-5 else "- Marian's layer norms use epsilon 1e-5 "
             f'where jaxformer trained with {config.norm_epsilon:g}.\n')
  return f"""---
{languages}library_name: transformers
pipeline_tag: translation
tags: [translation, marian, jaxformer]
---

# A Transformer{f" for {source}→{target}" if data else ""}, trained with jaxformer

A Transformer (Vaswani et al., 2017) trained with jaxformer (a JAX/Flax reproduction of the paper)
and exported at step {step:,} as a MarianMT model: N={config.num_layers}, d_model
{config.d_model}, d_ff {config.d_ff}, h {config.num_heads}, a shared sentencepiece vocabulary of
{config.vocab_size:,} pieces, positions up to {config.max_len}.

- **Training data:** {trained_on}
- **Recipe:** {recipe}
- **BLEU:** {bleu}

```python
from transformers import MarianMTModel, MarianTokenizer
tokenizer = MarianTokenizer.from_pretrained(PATH)
model = MarianMTModel.from_pretrained(PATH)
batch = tokenizer(["..."], return_tensors="pt", padding=True)
print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))
```

## What differs from jaxformer's own decoding

- Greedy search (`num_beams=1`) gives jaxformer's outputs. Beam search here divides a
  hypothesis's log-probability by length^alpha (length_penalty 0.6), where jaxformer
  divides by GNMT's ((5 + length) / 6)^alpha (§6.1 of the paper), so beam outputs may differ.
- The length limit is {config.max_len} pieces for every sentence (`max_length`); jaxformer's is
  each input's length + 50: pass `max_new_tokens` for that.
{epsilon}- The d_model dimensions are stored permuted (Marian's position table puts the sines
  first); the model computes the same function.
"""


def last_validation_bleu(origin: str | pathlib.Path) -> str:
  """The last validation BLEU in the workdir's metrics.jsonl, said with its step, or why not.
  Its fields are read as any record another tool may have written (files.field): a BLEU of
  null (what JSON tools write for NaN) is no measurement, a string a one-line RecordError."""
  metrics, last = files.near(origin, 'metrics.jsonl'), None
  if metrics:
    lines = metrics.read_text(encoding='utf-8', errors='replace').splitlines()
    for number, line in enumerate(lines, 1):
      try:
        record = json.loads(line)
      except ValueError:
        continue
      if isinstance(record, dict) and record.get('split') == 'eval' and 'bleu' in record:
        where = f'{metrics}:{number}'
        bleu = files.field(record, 'bleu', (int, float, type(None)), where)
        if bleu is not None and math.isfinite(bleu):
          last = (bleu, files.field(record, 'step', int, where, None))
  if last is None:
    return 'not measured with the model (score it with `jaxformer eval`)'
  return (f'{float(last[0]):.2f} sacreBLEU at step {last[1]}, on the first validation '
          'sentences of its training run (train.bleu_sentences), beam 4; score it on a test '
          'set with `jaxformer eval`')
