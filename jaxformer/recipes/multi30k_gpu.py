"""Transformer (base dimensions) on Multi30k EN->DE on one GPU, in minutes.

Run:      jaxformer train --config multi30k_gpu --workdir workdirs/multi30k_gpu \
            --train-src DIR/train.en --train-tgt DIR/train.de \
            --eval-src DIR/val.en --eval-tgt DIR/val.de
          jaxformer eval --checkpoint workdirs/multi30k_gpu/average-last5 \
            --src DIR/test_2016_flickr.en --ref DIR/test_2016_flickr.de
          (DIR: ../shared/data/multi30k)
Recipe:   the paper's base model (N=6, d_model 512, d_ff 2048, h 8) with P_drop 0.3 (big's
          rate: more regularisation for a corpus 150x smaller than WMT14), eps_ls 0.1, an 8k shared
          vocabulary, ~8k source + 8k target token slots per step, warmup 1000, 2000 steps
          (about 35 epochs), bfloat16 and fused attention (the GPU fast path), a checkpoint every
          100 steps and the last 5 averaged.
Expected: docs/BENCHMARKS.md, "GPU", gives the measured BLEU on test_2016_flickr and wall time.
"""

from jaxformer import config as config_lib


def get_config() -> dict:
  return {
      'model': config_lib.TransformerConfig(
          vocab_size=8000, dropout_rate=0.3, max_len=128, warmup_steps=1000),
      'train': {'num_steps': 2000, 'tokens_per_batch': 8192, 'row_len': 128,
                'checkpoint_every_steps': 100, 'checkpoint_every_secs': None,
                'keep_checkpoints': 5, 'average_last': 5, 'eval_every_steps': 1000,
                'log_every_steps': 100, 'bleu_sentences': 200, 'require_accelerator': True},
      'data': {'source': 'text'},
  }
