"""Transformer (base) on WMT14 EN->DE, the paper's recipe (§5, Table 3 "base").

Run:      jaxformer train --config base --workdir workdirs/base --tfds-data-dir ...
          (or make train-base WORKDIR=workdirs/base TFDS_DATA_DIR=...)
Recipe:   100k steps, warmup 4000, ~25k source + 25k target tokens per step, P_drop 0.1,
          eps_ls 0.1, a checkpoint every 10 minutes, the last 5 averaged at the end.
Paper:    27.3 BLEU on newstest2014 (Table 2), 25.8 BLEU / 4.92 PPL on newstest2013 (Table 3),
          12 hours on 8 P100 GPUs. With fewer than 8 GPUs, add --accum-steps 8/num_gpus.
"""

from jaxformer import config as config_lib


def get_config() -> dict:
  return {
      'model': config_lib.base(vocab_size=37000),
      'train': {'num_steps': 100_000, 'tokens_per_batch': 25_000, 'average_last': 5,
                'checkpoint_every_secs': 600.0,
                'require_accelerator': True},  # a GPU recipe: --allow-cpu to train on CPU
      'data': {'source': 'wmt14', 'target_language': 'de'},
  }
