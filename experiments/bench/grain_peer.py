"""jaxformer's packer beside grain's (google/grain, FirstFitPackIterDataset and
BestFitPackIterDataset) on the same token cache, rows and batch, one after the other in one
process: real-token fraction per side, batches/s on one thread, the time to the first batch, the
memory each adds, and whether a saved iterator state resumes to the same next batch.

grain is not a jaxformer dependency; in an environment that has both:
  pip install grain && python experiments/bench/grain_peer.py WORKDIR/cache/tokens-... \
      [--batches 300] [--rows 96] [--src-len 256 --tgt-len 248]
"""

import argparse
import json
import pathlib
import re
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from jaxformer import data  # noqa: E402


def _rss_mb() -> float:
  status = pathlib.Path('/proc/self/status').read_text()
  return int(re.search(r'VmRSS:\s+(\d+) kB', status)[1]) / 1024


def _measure(make, batches: int, keys: tuple[str, str]) -> dict:
  """make() -> an iterator with get_state/set_state; fraction of real slots, rates, resume."""
  rss = _rss_mb()
  start = time.perf_counter()
  iterator = make()
  first = next(iterator)
  first_s = time.perf_counter() - start
  real, slots = np.zeros(2), np.zeros(2)
  start = time.perf_counter()
  for _ in range(batches):
    batch = next(iterator)
    for i, key in enumerate(keys):
      real[i] += np.count_nonzero(batch[key])
      slots[i] += batch[key].size
  seconds = time.perf_counter() - start
  state = iterator.get_state()
  expected = next(iterator)
  resumed = make()
  resumed.set_state(state)
  again = next(resumed)
  same = all(np.array_equal(np.asarray(expected[k]), np.asarray(again[k])) for k in expected)
  del first
  return {'real_fraction': [round(float(x), 4) for x in real / slots],
          'batches_per_s': round(batches / seconds, 1),
          'target_tokens_per_s': round(real[1] / seconds),
          'first_batch_s': round(first_s, 3), 'rss_added_mb': round(_rss_mb() - rss),
          'resume_exact': bool(same)}


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('cache', type=pathlib.Path, help='a token cache folder (tokens-...)')
  parser.add_argument('--batches', type=int, default=300)
  parser.add_argument('--rows', type=int, default=96, help='rows per batch (base, 8 GPUs: 96)')
  parser.add_argument('--src-len', type=int, default=256)
  parser.add_argument('--tgt-len', type=int, default=248)
  args = parser.parse_args()
  import grain  # pylint: disable=g-import-not-at-top
  import grain.experimental as grain_experimental  # pylint: disable=g-import-not-at-top

  corpus = data.cache._load(  # pylint: disable=protected-access
      args.cache, args.cache.name.removeprefix('tokens-'))
  results = {'pairs': len(corpus), 'rows_per_batch': args.rows,
             'row_lengths': [args.src_len, args.tgt_len], 'grain': grain.__version__}
  results['jaxformer'] = _measure(
      lambda: data.PackedBatches(corpus, src_len=args.src_len, tgt_len=args.tgt_len,
                                 rows_per_device=args.rows),
      args.batches, ('src_segments', 'tgt_segments'))

  def pair(i: int) -> dict:
    return {'src': np.asarray(corpus.pair(i)[0], np.int32),
            'tgt': np.asarray(corpus.pair(i)[1], np.int32)}

  for name in ('FirstFitPackIterDataset', 'BestFitPackIterDataset'):
    packer = getattr(grain_experimental, name)

    def make(packer=packer):
      pairs = grain.MapDataset.range(len(corpus)).shuffle(seed=0).map(pair).to_iter_dataset()
      packed = packer(pairs, length_struct={'src': args.src_len, 'tgt': args.tgt_len},
                      num_packing_bins=args.rows, seed=0, shuffle_bins=True)
      return iter(packed.batch(args.rows))

    results[f'grain_{name}'] = _measure(make, args.batches,
                                        ('src_segment_ids', 'tgt_segment_ids'))
  print(json.dumps(results, indent=2))
  return 0


if __name__ == '__main__':
  sys.exit(main())
