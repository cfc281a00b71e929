"""Transformer (big) on WMT14 EN->DE (§5, Table 3 "big").

Run:      jaxformer train --config big --workdir workdirs/big --tfds-data-dir ...
          (or make train-big WORKDIR=workdirs/big TFDS_DATA_DIR=...)
Recipe:   300k steps, warmup 4000, ~25k + 25k tokens per step, P_drop 0.3, eps_ls 0.1,
          a checkpoint every 10 minutes, the last 20 averaged at the end.
Paper:    28.4 BLEU on newstest2014 (Table 2), 26.4 BLEU / 4.33 PPL on newstest2013 (Table 3),
          3.5 days on 8 P100 GPUs.
"""

from jaxformer import config as config_lib


def get_config() -> dict:
  return {
      'model': config_lib.big(vocab_size=37000),
      'train': {'num_steps': 300_000, 'tokens_per_batch': 25_000, 'average_last': 20,
                'checkpoint_every_secs': 600.0,
                'require_accelerator': True},  # a GPU recipe: --allow-cpu to train on CPU
      'data': {'source': 'wmt14', 'target_language': 'de'},
  }
