"""A seeded synthetic parallel corpus of any size, made from real text (e.g. newstest2014):
its sentence lengths and n-grams, with a fraction of the words mutated so that a vocabulary
trainer sees many word types. Used by the scale section to measure the data path at WMT size.

  python experiments/bench/synthetic.py SRC TGT OUT_PREFIX PAIRS [--seed 0]
writes OUT_PREFIX.en and OUT_PREFIX.de (line-aligned).
"""

import argparse
import pathlib
import sys

import numpy as np
from tqdm import tqdm

_SUFFIXES = np.array(['a', 'e', 'i', 'o', 'u', 'en', 'er', 'es', 'um', 'is', 'ak', 'ol', 'ix',
                      'ung', 'eln', 'ter', 'ish', 'ant', 'ova', 'ski'], dtype=object)


def _mutated(lines: list[str], rng: np.random.Generator, fraction: float) -> str:
  """The lines as one text, with `fraction` of their words given a random suffix."""
  words = np.array(' \n '.join(lines).split(' '), dtype=object)
  mutate = (rng.random(len(words)) < fraction) & (words != '\n')
  words[mutate] = words[mutate] + _SUFFIXES[rng.integers(0, len(_SUFFIXES), mutate.sum())]
  return ' '.join(words).replace(' \n ', '\n') + '\n'


def write_corpus(src_lines: list[str], tgt_lines: list[str], out_prefix: str | pathlib.Path,
                 pairs: int, *, seed: int = 0, fraction: float = 0.15,
                 block: int = 200_000) -> tuple[pathlib.Path, pathlib.Path]:
  """Writes `pairs` pairs drawn (with replacement, seeded) from the given pairs, each side
  mutated independently, to OUT_PREFIX.en and OUT_PREFIX.de; returns the two paths."""
  rng = np.random.default_rng(seed)
  out_prefix = pathlib.Path(out_prefix)
  paths = out_prefix.with_suffix('.en'), out_prefix.with_suffix('.de')
  with open(paths[0], 'w', encoding='utf-8') as src_out, \
       open(paths[1], 'w', encoding='utf-8') as tgt_out, \
       tqdm(total=pairs, desc='synthetic corpus', unit='pairs') as bar:
    for start in range(0, pairs, block):
      pick = rng.integers(0, len(src_lines), min(block, pairs - start))
      src_out.write(_mutated([src_lines[i] for i in pick], rng, fraction))
      tgt_out.write(_mutated([tgt_lines[i] for i in pick], rng, fraction))
      bar.update(len(pick))
  return paths


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('src')
  parser.add_argument('tgt')
  parser.add_argument('out_prefix')
  parser.add_argument('pairs', type=int)
  parser.add_argument('--seed', type=int, default=0)
  args = parser.parse_args()
  read = lambda path: pathlib.Path(path).read_text(encoding='utf-8').splitlines()  # noqa: E731
  write_corpus(read(args.src), read(args.tgt), args.out_prefix, args.pairs, seed=args.seed)
  return 0


if __name__ == '__main__':
  sys.exit(main())
