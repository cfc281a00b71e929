"""A training run's checkpoints: what a save holds (the params, the optimiser state, the rng,
every host's data position, the metrics that rank it), how a run resumes from the newest
compatible one (its data stream moved to the saved position), and the averages written at
its end. jaxformer.trainer's loop calls these; jaxformer.checkpoint is the format under them.
"""

import functools
import logging
import pathlib
from typing import Any

import jax
import numpy as np

from jaxformer import checkpoint, parallel
from jaxformer import data as data_lib
from jaxformer import optim as optim_lib
from jaxformer.config import OptimConfig, TrainConfig, TransformerConfig
from jaxformer.data import pipeline as pipeline_lib
from jaxformer.errors import TrainingError
from jaxformer.train import TrainState, create_train_state, train_state_from_params

log = logging.getLogger(__name__)
Array = jax.Array


def train_item(state: TrainState, rng: Array) -> dict[str, Any]:
  """What a checkpoint keeps beside the params to resume training: the optimiser state, the
  step and the rng."""
  return {'opt_state': state.opt_state, 'step': state.step,
          'rng': np.asarray(jax.random.key_data(rng))}  # host arrays: multi-host orbax needs them


def every_host_position(local: dict[str, Any]) -> dict[str, Any]:
  """Every host's iterator position (gathered when there are several hosts)."""
  keys = data_lib.PackedBatches.STATE_KEYS
  gathered = parallel.all_hosts(np.array([local[key] for key in keys], np.int64))
  return {'hosts': [dict(zip(keys, map(int, row))) for row in gathered]}


def resume_data(batches: data_lib.PackedBatches, hosts: list[dict[str, int]],
                train_cfg: TrainConfig) -> None:
  """Moves `batches` to this host's saved position; a fresh stream with reset_data or after a
  change of host count (with a warning); a one-line error when the data changed."""
  if train_cfg.reset_data:
    log.warning('--reset-data: the checkpoint\'s params, optimiser state and step continue on a '
                'fresh data stream.')
    return
  if len(hosts) != jax.process_count():
    log.warning('the checkpoint was written by %d host(s) and this run has %d: its data '
                'positions do not apply, so training continues on a fresh data stream.',
                len(hosts), jax.process_count())
    return
  saved, now = hosts[jax.process_index()], batches.get_state()
  if set(now) - set(saved):
    log.warning('the checkpoint\'s data position is from an older jaxformer (no %s): training '
                'continues on a fresh data stream.', ', '.join(sorted(set(now) - set(saved))))
    return
  if changed := batches.changes(saved):
    raise TrainingError(
        f'the training data changed since the checkpoint ({", ".join(changed)}): resume with the '
        'same corpus and settings, or pass --reset-data to continue from the checkpoint on a '
        'fresh data stream.')
  batches.set_state(saved)


def init_or_restore(config: TransformerConfig, train_cfg: TrainConfig,
                    pipeline: pipeline_lib.Pipeline, manager: Any, optim: OptimConfig,
                    init_params: Any = None) -> tuple[TrainState, Array]:
  """A fresh state (of `init_params` if given, else random) and rng, or the newest compatible
  checkpoint's (the data stream moved to its position). The state computes with
  train_cfg.computed(config) and trains with `optim`, which may differ from the checkpoint's
  (the change is logged); checkpoints record `config`. A resume reads the state into its
  shapes (jax.eval_shape) without computing a fresh one: the random init's program is neither
  compiled nor loaded from the cache, nor run."""
  init_rng, rng = jax.random.split(jax.random.key(train_cfg.seed))
  computed = train_cfg.computed(config)

  def fresh(optim: OptimConfig = optim, params: Any = init_params) -> TrainState:
    return create_train_state(computed, init_rng, optim=optim) if params is None else \
        train_state_from_params(computed, params, optim=optim)
  if not manager.all_steps():
    return fresh(), rng
  shapes = _on_default_device(jax.eval_shape(fresh))

  def train_template(meta: dict[str, Any]) -> dict[str, Any]:
    """The train item shaped as the checkpoint's optimiser made it (its chain may differ)."""
    saved = checkpoint.meta_optim(meta)
    return train_item(shapes if saved == optim else _on_default_device(jax.eval_shape(
        functools.partial(fresh, saved), shapes.params)), rng)
  found = checkpoint.restore_latest(
      manager, params=shapes.params, train=train_template, with_data=True,
      check=functools.partial(checkpoint.check_compatible, config=config,
                              spm_model=pipeline.tokenizer.model_proto))
  if found is None:
    return fresh(), rng
  step, restored = found
  restored_train = restored['train']
  opt_state = restored_train['opt_state']
  if changes := optim.changes(checkpoint.meta_optim(restored['meta'])):
    log.info('optimiser settings changed since the checkpoint: %s.', '; '.join(changes))
    opt_state = optim_lib.carry_state(opt_state, fresh(params=restored['params']).opt_state)
  state = TrainState(params=restored['params'], opt_state=opt_state, step=restored_train['step'])
  resume_data(pipeline.train, restored['data']['hosts'], train_cfg)
  log.info('resumed from step %d (%s)', step, manager.directory / str(step))
  return state, jax.random.wrap_key_data(restored_train['rng'])


def _on_default_device(shapes: TrainState) -> TrainState:
  """A state's shapes (jax.eval_shape's) as orbax restores them: each array on the default
  device, as a fresh state's are; the step a plain 0, as a fresh state's is."""
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  placed = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                        (shapes.params, shapes.opt_state))
  return TrainState(step=0, params=placed[0], opt_state=placed[1])


def save(manager: Any, step: int, state: TrainState, rng: Array, meta: dict[str, Any],
         data_state: dict[str, Any], keep_train_state: int,
         metrics: dict[str, float] | None = None) -> None:
  """Starts an async save of an unreplicated state, with every host's data position (and the
  validation metrics that rank it, if any); older checkpoints than the newest keep_train_state
  lose their optimiser state (process 0)."""
  checkpoint.save(manager, step, params=state.params, meta=meta,
                  train=train_item(state, rng), data=every_host_position(data_state),
                  metrics=metrics)
  if jax.process_index() == 0:
    checkpoint.drop_old_train_state(manager, keep_train_state, saving=step)


def average(workdir: pathlib.Path, manager: Any, train_cfg: TrainConfig, *, finished: bool
            ) -> dict[str, str]:
  """The end-of-run averages of a run that `finished` (or stopped early; not one preempted):
  the last average_last checkpoints, or as many as there are ('averaged'), and the best
  average_best by validation best_metric ('averaged_best'), when there are enough. Returns
  the paths written, under those names, for the run's summary."""
  written: dict[str, str] = {}
  if not finished:
    return written
  available = len(manager.all_steps())
  if train_cfg.average_last and available:
    # A short run averages the checkpoints it has, under a name that says how many.
    count = min(available, train_cfg.average_last)
    written['averaged'] = str(checkpoint.save_average(workdir, count))
    if count < train_cfg.average_last:
      log.warning('the run saved %d checkpoint(s), fewer than average_last=%d: averaged those '
                  'into %s; use that path next.', count, train_cfg.average_last,
                  written['averaged'])
  if train_cfg.average_best:
    ranked = sum(manager.metrics(step) is not None for step in manager.all_steps())
    if ranked >= train_cfg.average_best:
      written['averaged_best'] = str(checkpoint.save_average(
          workdir, best=train_cfg.average_best, metric=train_cfg.best_metric))
    else:
      log.warning('only %d evaluated checkpoints: not averaging the best %d.', ranked,
                  train_cfg.average_best)
  return written


def checkpoint_manager(workdir: pathlib.Path, train_cfg: TrainConfig, validated: bool) -> Any:
  """The run's checkpoints: the newest keep_checkpoints (at least average_last), and the best
  average_best by validation metric (which needs a validation set)."""
  if train_cfg.average_best and not validated:
    raise TrainingError('average_best ranks checkpoints by validation metrics: give a '
                        'validation set (--eval-src/--eval-tgt), or set average_best=0.')
  return checkpoint.make_manager(
      workdir / 'checkpoints',
      max_to_keep=max(train_cfg.keep_checkpoints, train_cfg.average_last, 1),
      keep_best=(train_cfg.average_best, train_cfg.best_metric) if train_cfg.average_best else None)
