"""A tiny config for the entry-point tests (not a recipe)."""

from jaxformer import config as config_lib


def get_config() -> dict:
  return {
      'model': config_lib.tiny(vocab_size=400).replace(num_layers=1),  # helpers.CFG
      'train': {'num_steps': 6, 'tokens_per_batch': 1024, 'row_len': 64, 'log_every_steps': 1,
                'checkpoint_every_secs': None, 'checkpoint_every_steps': 50, 'average_last': 0,
                'keep_checkpoints': 3, 'sample_translations': 0},
      'data': {'source': 'text'},
  }
