"""Small builders shared by several test files."""

import numpy as np

from jaxformer import data

WORDS = ('the a man woman dog cat sees walks with under house garden red small big quickly '
         'der die das mann frau hund katze sieht geht mit unter haus garten rot klein groß').split()


def synthetic_text(n: int, seed: int = 0) -> data.ParallelText:
  """n random word sequences on each side (English-ish source, German-ish target)."""
  rng = np.random.default_rng(seed)
  src = [' '.join(rng.choice(WORDS[:16], size=rng.integers(1, 20))) for _ in range(n)]
  tgt = [' '.join(rng.choice(WORDS[16:], size=rng.integers(1, 24))) for _ in range(n)]
  return data.ParallelText(src, tgt, origin=f'synthetic-{seed}')
