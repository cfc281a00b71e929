"""Multi30k EN->DE on one GPU, in minutes: the small-data recipe (`multi30k`) made wider and
trained longer, which the GPU's speed affords.

Run:      jaxformer train --config multi30k_gpu --workdir workdirs/multi30k_gpu \
            --train-src DIR/train.en --train-tgt DIR/train.de \
            --eval-src DIR/val.en --eval-tgt DIR/val.de
          jaxformer eval --workdir workdirs/multi30k_gpu --average-last 5 \
            --src DIR/test_2016_flickr.en --ref DIR/test_2016_flickr.de --batch-size 128
          (DIR: ../shared/data/multi30k)
Recipe:   N=4, d_model 256, d_ff 1024, h 4, P_drop 0.3, eps_ls 0.1, an 8k shared vocabulary,
          8192 token slots per step in rows of 64, warmup 800, 4000 steps (about 65 epochs),
          bfloat16 (the GPU fast path), the last 5 checkpoints 100 steps apart and averaged
          (before them one every 10 minutes, to resume from).
          The `multi30k` recipe's findings on val (a narrow model, rows of 64, averaging the last
          5 of checkpoints 100 steps apart) with d_model and d_ff 2x and 4x its, more dropout
          for the larger model, and 4000 steps instead of 1800: chosen by reasoning, not tuned.
Expected: docs/BENCHMARKS.md gives the measured test BLEU and wall time on one H100.
"""

from jaxformer import config as config_lib


def get_config() -> dict:
  return {
      'model': config_lib.TransformerConfig(
          vocab_size=8000, num_layers=4, d_model=256, d_ff=1024, num_heads=4, dropout_rate=0.3,
          max_len=64),
      'train': {'num_steps': 4000, 'tokens_per_batch': 8192, 'row_len': 64,
                'checkpoint_every_steps': 100, 'checkpoint_steps_to_average': True,
                'checkpoint_every_secs': 600.0,
                'keep_checkpoints': 5, 'average_last': 5, 'eval_every_steps': 1000,
                'log_every_steps': 100, 'require_accelerator': True},
      'optim': {'warmup_steps': 800},
      'data': {'source': 'text'},
  }
