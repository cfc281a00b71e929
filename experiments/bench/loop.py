"""The loop section: how much of a training run's time goes to its steps. A tiny model (one
layer, d_model 32), whose steps take milliseconds on a CPU as a small model's do on a GPU, on
the embedded corpus, `steps` steps in a fresh workdir each time, in one process:

  alone        no periodic work at all: the steps' own rate;
  every save   the automatic recipe's periodic work before 2026-11-29: a checkpoint and a
               validation pass (3 sample translations) every 1/18 of the steps, metrics every
               1/36, the last 5 checkpoints averaged;
  the recipe   the same, with the step count making only the 5 averaged checkpoints
               (train.checkpoint_steps_to_average, as the automatic recipe now sets it).

A short run with the periodic work first compiles the validation's programs for all; then the
cases run in turn, `rounds` times. Each case reports its runs' own 'time' summaries
(trainer.Run's Stopwatch), their steps a second after the first step (which compiles), and its
busy share: the median of those over alone's median, the steps' own rate. The
work moved off the loop's thread (background saves) shows there, not in the summary's
'steps_s' share.

With `in_flight` (--steps-in-flight, repeatable), each case runs at each depth of the loop's
queue of dispatched steps (trainer.STEPS_IN_FLIGHT), named 'CASE, N in flight' for a depth
other than the trainer's, its busy share against 'alone' at the same depth: whether a deeper
queue keeps the device fed while a background save's Python holds the interpreter.
"""

import contextlib
import dataclasses
import logging
import statistics
import tempfile

from jaxformer import config, recipes, trainer
from jaxformer.data import embedded


def run(steps: int = 1800, rounds: int = 3, in_flight: list[int] | None = None) -> dict:
  recipe = recipes.load('demo')
  model = dataclasses.replace(recipe.model, num_layers=1, d_model=32, d_ff=64, num_heads=2)
  corpus = embedded.splits(20_000, 1000, 10)
  every, never = max(1, steps // 18), steps + 1
  base = dataclasses.replace(
      config.TrainConfig(), num_steps=steps, tokens_per_batch=512, row_len=64,
      checkpoint_every_steps=never, checkpoint_every_secs=None, keep_checkpoints=5,
      average_last=0, eval_every_steps=never, log_every_steps=never, sample_translations=3,
      spm_sample_size=20_000)
  periodic = dataclasses.replace(base, checkpoint_every_steps=every, average_last=5,
                                 eval_every_steps=every, log_every_steps=max(1, every // 2))
  kinds = {'alone': (base, None),
           'every save': (periodic, corpus['validation']),
           'the recipe': (dataclasses.replace(periodic, checkpoint_steps_to_average=True,
                                              checkpoint_every_secs=600.0),
                          corpus['validation'])}
  default = trainer.STEPS_IN_FLIGHT
  depths = in_flight or [default]

  def named(kind: str, depth: int) -> str:
    return kind if depth == default else f'{kind}, {depth} in flight'

  cases = {named(kind, depth): (depth, *case) for depth in depths for kind, case in kinds.items()}

  def train(depth: int, train_cfg: config.TrainConfig, validation) -> dict:
    with tempfile.TemporaryDirectory() as workdir, _settings(depth):
      return trainer.train(model, train_cfg, workdir, corpus['train'], validation,
                           optim=recipe.optim)['time']

  # A short run compiles the programs every case uses (the queue's depth changes none).
  train(default, dataclasses.replace(periodic, num_steps=2 * every), corpus['validation'])
  times = {name: [] for name in cases}
  for _ in range(rounds):  # the cases in turn, rounds times: the host's drift hits them alike
    for name, case in cases.items():
      times[name].append(train(*case))
  rate = {name: [round((steps - 1) / (t['total_s'] - t['first_step_s']), 2) for t in runs]
          for name, runs in times.items()}
  alone = {depth: statistics.median(rate[named('alone', depth)]) for depth in depths}
  return {'steps': steps, 'every': every, 'rounds': rounds, 'cases': {
      name: {'steps_in_flight': depth, 'steps_per_s_after_first': rate[name],
             'busy_share': round(statistics.median(rate[name]) / alone[depth], 3),
             'time': times[name]} for name, (depth, *_) in cases.items()}}


@contextlib.contextmanager
def _settings(depth: int):
  """Within: the trainer's loop keeps `depth` steps dispatched ahead of the metrics it reads,
  and jaxformer logs only warnings (the runs' lines would drown the bench's); both as they were
  after, for whatever runs next in the process."""
  log = logging.getLogger('jaxformer')
  default, level = trainer.STEPS_IN_FLIGHT, log.level
  trainer.STEPS_IN_FLIGHT = depth
  log.setLevel(logging.WARNING)
  try:
    yield
  finally:
    trainer.STEPS_IN_FLIGHT = default
    log.setLevel(level)
