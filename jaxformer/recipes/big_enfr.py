"""Transformer (big) on WMT14 EN->FR (§5, Table 2).

Run:      jaxformer train --config big_enfr --workdir workdirs/enfr --tfds-data-dir ...
Recipe:   as big EN-DE, but P_drop 0.1 (§6.1) and a 32000 word-piece vocabulary (§5.1).
Paper:    41.0 BLEU on newstest2014 (Table 2; 41.8 in the arXiv v5 revision).
"""

from jaxformer import config as config_lib


def get_config() -> dict:
  return {
      'model': config_lib.big(vocab_size=32000).replace(dropout_rate=0.1),
      'train': {'num_steps': 300_000, 'tokens_per_batch': 25_000, 'average_last': 20,
                'checkpoint_every_secs': 600.0,
                'require_accelerator': True},  # a GPU recipe: --allow-cpu to train on CPU
      'data': {'source': 'wmt14', 'target_language': 'fr'},
  }
