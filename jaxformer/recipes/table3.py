"""Table 3 of the paper: the variations on the base model, as named configs built from base().

Train a row, or print the parameter table of docs/table3.md::

  make train-base VARIANT=C3 WORKDIR=workdirs/C3 TFDS_DATA_DIR=...
  jaxformer train --config base --variant C3 --workdir workdirs/C3 ...
  python -m jaxformer.recipes.table3

Each row overrides only what the paper's row changes. The paper reports them on newstest2013
(the validation split our recipes evaluate on) after 100k steps (300k for big), without
checkpoint averaging; its perplexities are per word-piece.
"""

import dataclasses
from typing import Any

from jaxformer import config as config_lib
from jaxformer.model import parameter_count


@dataclasses.dataclass(frozen=True)
class Variant:
  """A row of Table 3: what it changes from base and the paper's dev figures for it."""
  changes: dict[str, Any]       # fields of TransformerConfig that differ from base()
  ppl: float                    # the paper's dev perplexity
  bleu: float                   # the paper's dev BLEU
  params_m: int | None = None   # the paper's parameter count (x 10^6); None where it is blank
  steps: int = 100_000          # training steps in the paper


VARIANTS = {
    'base': Variant({}, 4.92, 25.8, 65),
    # (A) number of heads, keeping h * d_k = h * d_v = 512.
    'A1': Variant({'num_heads': 1, 'qk_dim': 512, 'v_dim': 512}, 5.29, 24.9),
    'A2': Variant({'num_heads': 4, 'qk_dim': 128, 'v_dim': 128}, 5.00, 25.5),
    'A3': Variant({'num_heads': 16, 'qk_dim': 32, 'v_dim': 32}, 4.91, 25.8),
    'A4': Variant({'num_heads': 32, 'qk_dim': 16, 'v_dim': 16}, 5.01, 25.4),
    # (B) smaller attention keys.
    'B1': Variant({'qk_dim': 16}, 5.16, 25.1, 58),
    'B2': Variant({'qk_dim': 32}, 5.01, 25.4, 60),
    # (C) model size.
    'C1': Variant({'num_layers': 2}, 6.11, 23.7, 36),
    'C2': Variant({'num_layers': 4}, 5.19, 25.3, 50),
    'C3': Variant({'num_layers': 8}, 4.88, 25.5, 80),
    'C4': Variant({'d_model': 256, 'qk_dim': 32, 'v_dim': 32}, 5.75, 24.5, 28),
    'C5': Variant({'d_model': 1024, 'qk_dim': 128, 'v_dim': 128}, 4.66, 26.0, 168),
    'C6': Variant({'d_ff': 1024}, 5.12, 25.4, 53),
    'C7': Variant({'d_ff': 4096}, 4.75, 26.2, 90),
    # (D) regularisation.
    'D1': Variant({'dropout_rate': 0.0}, 5.77, 24.6),
    'D2': Variant({'dropout_rate': 0.2}, 4.95, 25.5),
    'D3': Variant({'label_smoothing': 0.0}, 4.67, 25.3),
    'D4': Variant({'label_smoothing': 0.2}, 5.47, 25.7),
    # (E) learned positional embeddings instead of sinusoids.
    'E': Variant({'learned_positions': True}, 4.92, 25.7),
    'big': Variant({'d_model': 1024, 'd_ff': 4096, 'num_heads': 16, 'dropout_rate': 0.3},
                   4.33, 26.4, 213, steps=300_000),
}


_OPTIM_FIELDS = {field.name for field in dataclasses.fields(config_lib.OptimConfig)}


def variant_config(name: str, vocab_size: int = 37000) -> config_lib.TransformerConfig:
  """base(vocab_size) with the row's changes to the model (optim_overrides has the others)."""
  if name not in VARIANTS:
    raise ValueError(f'unknown Table 3 variant {name!r}; choose from {", ".join(VARIANTS)}.')
  return config_lib.base(vocab_size).replace(**{
      k: v for k, v in VARIANTS[name].changes.items() if k not in _OPTIM_FIELDS})


def optim_overrides(name: str) -> dict[str, Any]:
  """The row's changes to how the model is trained (rows D3, D4: label smoothing)."""
  return {k: v for k, v in VARIANTS[name].changes.items() if k in _OPTIM_FIELDS}


def train_overrides(name: str) -> dict[str, Any]:
  """Training settings that differ from the base recipe (the paper trains big for 300k steps)."""
  return {'num_steps': VARIANTS[name].steps, 'average_last': 20} if name == 'big' else {}


def markdown_table(vocab_size: int = 37000) -> str:
  """Every row: what it changes, our count at this vocabulary, the paper's, and the vocabulary
  that would close the gap (paper count +- 0.5M, as it is rounded to millions)."""
  lines = ['| row | changes from base | jaxformer params | paper (x10^6) | difference | '
           'V that matches the paper |',
           '|---|---|---|---|---|---|']
  for name, row in VARIANTS.items():
    cfg = variant_config(name, vocab_size)
    ours = parameter_count(cfg)
    changes = ', '.join(f'{k}={v}' for k, v in row.changes.items()) or '-'
    if row.params_m is None:
      lines.append(f'| {name} | {changes} | {ours:,} | (blank) | | |')
      continue
    low, high = ((row.params_m + d) * 1e6 - ours for d in (-0.5, 0.5))
    lines.append(
        f'| {name} | {changes} | {ours:,} | {row.params_m} | {row.params_m * 1e6 - ours:+,.0f} | '
        f'{vocab_size + low / cfg.d_model:,.0f}–{vocab_size + high / cfg.d_model:,.0f} |')
  return '\n'.join(lines)


def matching_vocabulary(vocab_size: int = 37000, exclude: tuple[str, ...] = ('big',)
                        ) -> tuple[float, float]:
  """The range of V for which our count lands within the paper's rounding on every row that
  has a count (but those excluded): the intersection of the rows' ranges."""
  low, high = float('-inf'), float('inf')
  for name, row in VARIANTS.items():
    if row.params_m is None or name in exclude:
      continue
    cfg = variant_config(name, vocab_size)
    gap = row.params_m * 1e6 - parameter_count(cfg)
    low = max(low, vocab_size + (gap - 0.5e6) / cfg.d_model)
    high = min(high, vocab_size + (gap + 0.5e6) / cfg.d_model)
  return low, high


if __name__ == '__main__':
  print(markdown_table())
  low, high = matching_vocabulary()
  print(f'\nEvery row with a count but big matches the paper for {low:,.0f} <= V <= {high:,.0f}.')
