"""A small Transformer on Multi30k EN->DE (Elliott et al., 2016), trained on CPU.

Run:      make train-multi30k DATA_DIR=../shared/data/multi30k WORKDIR=workdirs/multi30k
          (trains on train.{en,de}, validates on val.{en,de}, then jaxformer eval scores
          test_2016_flickr.{en,de} with beam 4, alpha 0.6, the last 5 checkpoints averaged)
Recipe:   a narrow model for 29k pairs, after the literature's best small Transformer (Wu et al.,
          2021): N=4, d_model 128, d_ff 256, h 4, but P_drop 0.2 (their 0.3 was worse in this
          budget), eps_ls 0.1, an 8k shared BPE vocabulary, 8192 + 8192 token slots per step in
          rows of 64 tokens (the longest pair has 55), warmup 400 (the paper's lrate then peaks
          at 4.4e-3), 1800 steps (about 30 epochs), a validation loss every 100 steps, the 5
          averaged checkpoints 100 steps apart (before them one every 10 minutes, to resume
          from). Every choice was made on val: docs/BENCHMARKS.md, "Multi30k: the small-data
          recipe", has the ablation.
Expected: docs/BENCHMARKS.md gives the measured test BLEU and wall time.
"""

from jaxformer import config as config_lib


def get_config() -> dict:
  return {
      'model': config_lib.TransformerConfig(
          vocab_size=8000, num_layers=4, d_model=128, d_ff=256, num_heads=4, dropout_rate=0.2,
          max_len=64),
      'train': {'num_steps': 1800, 'tokens_per_batch': 8192, 'row_len': 64,
                'checkpoint_every_steps': 100, 'checkpoint_steps_to_average': True,
                'checkpoint_every_secs': 600.0,
                'keep_checkpoints': 5, 'average_last': 5, 'eval_every_steps': 100,
                'log_every_steps': 50},
      'optim': {'warmup_steps': 400},
      'data': {'source': 'text'},
  }
