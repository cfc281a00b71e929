"""Small builders shared by several test files."""

import numpy as np

from jaxformer import config, data

_EN = 'the a man woman dog cat sees walks with under house garden red small big quickly'
_DE = 'der die das mann frau hund katze sieht geht mit unter haus garten rot klein groß'
WORDS = (_EN + ' ' + _DE).split()  # 16 English-ish words, then 16 German-ish ones


def synthetic_text(n: int, seed: int = 0) -> data.ParallelText:
  """n random word sequences on each side (English-ish source, German-ish target)."""
  rng = np.random.default_rng(seed)
  src = [' '.join(rng.choice(WORDS[:16], size=rng.integers(1, 20))) for _ in range(n)]
  tgt = [' '.join(rng.choice(WORDS[16:], size=rng.integers(1, 24))) for _ in range(n)]
  return data.ParallelText(src, tgt, origin=f'synthetic-{seed}')


def train_settings(**overrides) -> config.TrainConfig:
  """Training settings for the tiny tests: 6 steps, a checkpoint every 2, logs every 2."""
  settings = dict(num_steps=6, tokens_per_batch=1024, row_len=64,
                  checkpoint_every_steps=2, checkpoint_every_secs=None, keep_checkpoints=5,
                  average_last=0, eval_every_steps=1000, log_every_steps=2,
                  sample_translations=0)
  settings.update(overrides)
  return config.TrainConfig(**settings)


def poison_third_batch(monkeypatch) -> None:
  """Makes the third batch's weights NaN, so step 3's loss is not finite. (The trainer's
  prefetch advances the batches in order and assembles them on several threads: the third
  `advance` marks the pieces whose assembly is poisoned.)"""
  advance, assemble = data.PackedBatches.advance, data.PackedBatches.assemble
  calls = {'n': 0, 'third': None}

  def counted(self):
    pieces = advance(self)
    calls['n'] += 1
    if calls['n'] == 3:
      calls['third'] = pieces
    return pieces

  def poisoned(self, pieces):
    batch = assemble(self, pieces)
    if pieces is calls['third']:
      batch['weights'] = np.full_like(batch['weights'], np.nan)
    return batch

  monkeypatch.setattr(data.PackedBatches, 'advance', counted)
  monkeypatch.setattr(data.PackedBatches, 'assemble', poisoned)
