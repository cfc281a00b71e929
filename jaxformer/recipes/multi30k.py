"""A small Transformer on Multi30k EN->DE (Elliott et al., 2016), trained on CPU.

Run:      make train-multi30k DATA_DIR=../shared/data/multi30k WORKDIR=workdirs/multi30k
          (trains on train.{en,de}, validates on val.{en,de}, then jaxformer eval scores
          test_2016_flickr.{en,de} with beam 4, alpha 0.6, the last 5 checkpoints averaged)
Recipe:   N=3, d_model 256, d_ff 1024, h 4, P_drop 0.1, eps_ls 0.1, an 8k shared BPE vocabulary,
          ~4k+4k tokens per step, warmup 400, 700 steps (about 6-7 epochs).
Expected: published small Transformers reach about 35-40 BLEU on test_2016_flickr with
          GPU-scale training; this CPU budget reaches less (see the README for the measured run).
"""

from jaxformer import config as config_lib


def get_config() -> dict:
  return {
      'model': config_lib.TransformerConfig(
          vocab_size=8000, num_layers=3, d_model=256, d_ff=1024, num_heads=4, max_len=128,
          warmup_steps=400),
      'train': {'num_steps': 700, 'tokens_per_batch': 4096, 'row_len': 128,
                'checkpoint_every_steps': 50, 'checkpoint_every_secs': None,
                'keep_checkpoints': 5, 'average_last': 5, 'eval_every_steps': 100,
                'log_every_steps': 25},
      'data': {'source': 'text'},
  }
