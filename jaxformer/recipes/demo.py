"""The offline demo: a small Transformer on the embedded EN->DE corpus (same code path as base).

Run:      make demo   (python experiments/demo.py --workdir workdirs/demo; or just the training:
          jaxformer train --config demo --workdir workdirs/demo)
Recipe:   N=3, d_model 128, d_ff 512, h 4, P_drop 0.1, eps_ls 0.1, Adam + the paper's lrate with
          warmup 200; 60k generated training pairs, ~4k+4k tokens per step in rows of 64 (the
          pairs are at most 31 pieces; attention's cost grows with the row), 330 steps, checkpoints
          every 30 steps, the last 5 averaged; beam 4, alpha 0.6 on the held-out test split
          (docs/benchmarks-log.md, "The recipes' choices", has what the other choices did).
Expected: docs/BENCHMARKS.md gives the measured BLEU and wall time on 2 CPU cores.
"""

from jaxformer import config as config_lib


def get_config() -> dict:
  return {
      'model': config_lib.TransformerConfig(
          vocab_size=1000, num_layers=3, d_model=128, d_ff=512, num_heads=4, max_len=64),
      'train': {'num_steps': 330, 'tokens_per_batch': 4096, 'row_len': 64,
                'checkpoint_every_steps': 30, 'checkpoint_every_secs': None,
                'keep_checkpoints': 5, 'average_last': 5, 'eval_every_steps': 165,
                'log_every_steps': 30, 'bleu_sentences': 100, 'spm_sample_size': 200_000},
      'optim': {'warmup_steps': 200},
      'data': {'source': 'embedded', 'train_pairs': 60_000, 'test_pairs': 1000,
               'validation_pairs': 1000},
  }
