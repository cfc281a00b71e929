"""The loop section: how much of a training run's time goes to its steps. The demo's model on
the embedded corpus, with the automatic recipe's periodic work for a small corpus (a checkpoint
and a validation pass every 200 steps, 3 sample translations each, metrics every 100, the last
5 checkpoints averaged), `steps` steps in a fresh workdir; the run's own 'time' summary
(trainer.Run's Stopwatch) and the busy share: the steps' time over the run's time after its
first step (which compiles)."""

import dataclasses
import logging
import tempfile

from jaxformer import config, recipes, trainer
from jaxformer.data import embedded


def run(steps: int = 400) -> dict:
  recipe = recipes.load('demo')
  corpus = embedded.splits(20_000, 1000, 10)
  train_cfg = dataclasses.replace(
      config.TrainConfig(), num_steps=steps, tokens_per_batch=2048, row_len=64,
      checkpoint_every_steps=200, checkpoint_every_secs=None, keep_checkpoints=5,
      average_last=5, eval_every_steps=200, log_every_steps=100, sample_translations=3,
      spm_sample_size=20_000)
  logging.getLogger('jaxformer').setLevel(logging.WARNING)
  with tempfile.TemporaryDirectory() as workdir:
    summary = trainer.train(recipe.model, train_cfg, workdir, corpus['train'],
                            corpus['validation'], optim=recipe.optim)
  time = summary['time']
  return {'steps': steps, 'time': time,
          'busy_share': round(time['steps_s'] / (time['total_s'] - time['first_step_s']), 3)}
