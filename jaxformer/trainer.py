"""The training loop: the pure steps of `train` in pmap over the local devices, fed by a
data.pipeline.Pipeline, with checkpoints, evaluation and logging as periodic actions.

`train` is the library's entry point (pairs in, a trained workdir out), `train_recipe` the
command line's (a recipe in); `train_and_evaluate` is the loop over a built pipeline. A run
resumes from its workdir's newest checkpoint.
"""

import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
import pathlib
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer import (checkpoint, compilation, files, finetune, monitor, parallel, resume,
                       validation)
from jaxformer import data as data_lib
from jaxformer.config import OptimConfig, TrainConfig, TransformerConfig, config_to_dict
from jaxformer.data import pipeline as pipeline_lib
from jaxformer.errors import TrainingError  # noqa: F401  (imported from here before)
from jaxformer.recipes import Recipe
from jaxformer.train import TrainState, eval_step, train_step
from jaxformer.translation import Translator

log = logging.getLogger(__name__)
Array = jax.Array


def check_backend(train_cfg: TrainConfig, backend: str | None = None) -> None:
  """Stops a run that requires an accelerator (the paper's recipes) on a CPU backend."""
  backend = backend or jax.default_backend()
  if train_cfg.require_accelerator and backend == 'cpu':
    raise TrainingError(
        "this recipe needs a GPU, but jax's backend is cpu (no GPU here, or jax's CPU build): on "
        'a GPU host run `make install` (it installs jaxformer[cuda12] or [cuda13]; or pip install '
        "'jaxformer[cuda12]'), or pass --allow-cpu to train on the CPU anyway.")


# --- periodic work ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Action:
  """Work the loop does after some steps: `run(step)` every `every` steps from step `start`
  (None: never by the count), after the last step, and, with `on_save_signal`, when the hosts
  agreed that a save is due (the save clock ran out, or the run is being preempted)."""
  name: str
  every: int | None
  run: Callable[[int], Any]
  on_save_signal: bool = False
  start: int = 1


def periodic_actions(train_cfg: TrainConfig, *, log_metrics: Callable[[int], Any],
                     evaluate: Callable[[int], Any] | None,
                     save: Callable[[int], Any]) -> list[Action]:
  """The loop's actions in the order they run: log, evaluate (when there is a validation set),
  save. Add one here to give the loop more periodic work."""
  actions = [Action('log', train_cfg.log_every_steps, log_metrics)]
  if evaluate is not None:
    actions.append(Action('eval', train_cfg.eval_every_steps, evaluate))
  return actions + [Action('save', train_cfg.checkpoint_every_steps, save, on_save_signal=True,
                           start=train_cfg.step_checkpoints_from() or 1)]


def due(actions: list[Action], step: int, num_steps: int, *, save_signal: bool = False
        ) -> list[Action]:
  """The actions to run after `step`."""
  return [a for a in actions if step == num_steps or (a.on_save_signal and save_signal)
          or (a.every and step % a.every == 0 and step >= a.start)]


class Patience:
  """Early stopping as fairseq's --patience: counts the evaluations since the validation loss
  last improved; `update` says when `limit` of them passed (never with limit None). The count
  starts afresh when a run resumes."""

  def __init__(self, limit: int | None):
    self.limit, self.best, self.since = limit, float('inf'), 0

  def update(self, loss: float) -> bool:
    """Records an evaluation's loss; True when training should stop."""
    if loss < self.best:
      self.best, self.since = loss, 0
    else:
      self.since += 1
    return self.limit is not None and self.since >= self.limit


def host_sync_due(step: int, train_cfg: TrainConfig, process_count: int) -> bool:
  """Whether the hosts agree on preemption and timed saves after `step`: always with one host
  (no communication), every host_sync_every_steps steps and at the last with several."""
  return (process_count == 1 or step % train_cfg.host_sync_every_steps == 0
          or step == train_cfg.num_steps)


def _agree(guard: monitor.PreemptionGuard, last_save: float, train_cfg: TrainConfig, step: int
           ) -> tuple[bool, bool]:
  """(preempted, timed save due after `step`: none among the averaged step-counted ones) as
  all hosts agree: one all-gather."""
  counted_from = train_cfg.step_checkpoints_from()
  local = [guard.signal is not None, (counted_from is None or step < counted_from)
           and monitor.clock_ran_out(last_save, train_cfg.checkpoint_every_secs)]
  return tuple(bool(x) for x in parallel.all_hosts(np.array(local)).any(0))


# --- what a run records -------------------------------------------------------------------------


def execution_facts(config: TransformerConfig, train_cfg: TrainConfig, *, src_len: int,
                    tgt_len: int, rows: int) -> dict[str, Any]:
  """Where and how a run computes: devices, processes, dtype, attention and the batch."""
  slots = rows * train_cfg.accum_steps * jax.device_count()  # rows per update, all devices
  return {'devices': parallel.devices_line(), 'backend': jax.default_backend(),
          'device_count': jax.device_count(), 'process_count': jax.process_count(),
          'dtype': jnp.dtype(config.execution.dtype).name,
          'attention': config.execution.attention, 'remat': config.execution.remat,
          'source_tokens_per_update': slots * src_len,
          'target_tokens_per_update': slots * tgt_len, 'accum_steps': train_cfg.accum_steps,
          'rows_per_device': rows, 'row_lengths': [src_len, tgt_len]}


def describe_run(facts: dict[str, Any]) -> str:
  """The run's facts as the one line the trainer logs at start."""
  micro = f'{facts["accum_steps"]} micro-batch{"es" if facts["accum_steps"] > 1 else ""}'
  return (f'{facts["devices"]}; compute {facts["dtype"]}, {facts["attention"]} attention'
          f'{", remat" if facts["remat"] else ""}; {facts["source_tokens_per_update"]:,} source + '
          f'{facts["target_tokens_per_update"]:,} target token slots per update ({micro} of '
          f'{facts["rows_per_device"]} rows per device, rows of {facts["row_lengths"][0]} / '
          f'{facts["row_lengths"][1]} tokens)')


def _hparams(config: TransformerConfig, train_cfg: TrainConfig, optim: OptimConfig,
             facts: dict[str, Any]) -> dict[str, Any]:
  """The run's settings as TensorBoard hparams (numbers, booleans and strings only)."""
  settings = {'model': config_to_dict(config), 'optim': dataclasses.asdict(optim),
              'train': dataclasses.asdict(train_cfg), 'run': facts}
  return jax.tree.map(lambda v: v if isinstance(v, (bool, int, float, str)) else str(v),
                      settings, is_leaf=lambda v: v is None or isinstance(v, list))


# A copy of a (replicated) state on its devices, queued behind the steps before it: what a
# background save reads while the next step, which donates the state, runs.
_device_copy = jax.jit(lambda tree: jax.tree.map(jnp.copy, tree))


# --- the loop -----------------------------------------------------------------------------------


def train(config: TransformerConfig, train_cfg: TrainConfig, workdir: str | pathlib.Path,
          train_pairs: data_lib.PairSource, validation: data_lib.ParallelText | None = None, *,
          optim: OptimConfig | None = None) -> dict[str, Any]:
  """Trains `config` on `train_pairs` in `workdir` (resuming from its checkpoints), evaluating
  on `validation` if given, with the optimiser of `optim` (default: the paper's): the backend
  check, data.pipeline.build, train_and_evaluate. With train_cfg.init_from, a fresh workdir
  starts from that model's params and vocabulary (fine-tuning; see `inherit`). One run at a
  time per workdir: a second stops at once, naming the process that holds its lock."""
  check_backend(train_cfg)
  train_cfg.check_rows(config)  # before the workdir is made
  finetune.check_fine_tune_workdir(workdir, train_cfg.init_from)
  first = jax.process_index() == 0  # the other processes of this run share the workdir
  with files.locked(files.make_workdir(workdir), 'run', 'a training run') if first \
      else contextlib.nullcontext():
    fine_tune = train_cfg.init_from and not files.has_checkpoints(workdir)
    init_params = finetune.inherit(train_cfg.init_from, config, pathlib.Path(workdir),
                                   train_pairs) if fine_tune else None
    pipeline = pipeline_lib.build(workdir, config, train_cfg, train_pairs, validation)
    return train_and_evaluate(config, train_cfg, workdir, pipeline, optim=optim,
                              init_params=init_params)


def train_recipe(recipe: Recipe, workdir: str | pathlib.Path) -> dict[str, Any]:
  """`train` on the recipe's data (data.pipeline.sources), checking the backend before any
  data is read."""
  check_backend(recipe.train)
  return train(recipe.model, recipe.train, workdir, *pipeline_lib.sources(recipe.data),
               optim=recipe.optim)


# Steps the loop dispatches ahead of the metrics it reads: the device has work queued while the
# host reads a step's metrics, logs or fetches the next batch.
STEPS_IN_FLIGHT = 4


@functools.lru_cache(maxsize=8)
def _pmapped_steps(config: TransformerConfig, optim: OptimConfig, accum_steps: int,
                   skip_nonfinite: bool) -> tuple[Any, Any]:
  """The train step (donating its state) and the eval step of these settings, pmapped over the
  local devices; made once per process and settings, so that a second run in it with equal
  settings reuses their compiled programs. With one process the eval step is a
  compilation.Programs, which Run.compile_ahead compiles before the first evaluation."""
  p_train_step = jax.pmap(
      functools.partial(train_step, config=config, optim=optim, axis_name=parallel.AXIS,
                        accum_steps=accum_steps, skip_nonfinite=skip_nonfinite),
      axis_name=parallel.AXIS, donate_argnums=0)
  p_eval_step = jax.pmap(functools.partial(eval_step, config=config, optim=optim),
                         axis_name=parallel.AXIS)
  if jax.process_count() > 1:  # (a pmap's compiled program, called, checks each host's shards
    return p_train_step, p_eval_step  # against the global shapes it was compiled for)
  return p_train_step, compilation.Programs('the eval step', p_eval_step)


def _on_skip(step: int, skipped: int) -> None:
  log.warning('step %d: non-finite loss, update skipped (%d so far)', step, skipped)


class Run:
  """One training run in progress: the replicated state, the save clock, the data position,
  early stopping and the summary, with the loop's actions as methods (`log`, `evaluate`,
  `save`, `stop`) and its state changed only by them and `train_step`. train_and_evaluate
  starts one (`Run.start`: restored or initialised), steps it and finishes it; the constructor
  only takes what it is given: it computes, compiles and logs nothing."""

  @classmethod
  def start(cls, config: TransformerConfig, train_cfg: TrainConfig, workdir: pathlib.Path,
            pipeline: pipeline_lib.Pipeline, optim: OptimConfig, init_params: Any = None
            ) -> 'Run':
    """The run of `workdir`: its newest checkpoint restored, else a fresh state (from
    `init_params` if given); the run described in the log."""
    manager = resume.checkpoint_manager(workdir, train_cfg, pipeline.validation is not None)
    state, rng = resume.init_or_restore(config, train_cfg, pipeline, manager, optim, init_params)
    run = cls(config, train_cfg, workdir, pipeline, optim, manager, state, rng)
    log.info('training on %s', describe_run(run.facts))
    return run

  def __init__(self, config: TransformerConfig, train_cfg: TrainConfig, workdir: pathlib.Path,
               pipeline: pipeline_lib.Pipeline, optim: OptimConfig, manager: Any,
               state: TrainState, rng: Array):
    self.config, self.train_cfg, self.workdir, self.pipeline = config, train_cfg, workdir, pipeline
    self.manager, self.rng, self.start_step = manager, rng, int(state.step)
    self.meta = checkpoint.make_meta(config, pipeline.tokenizer.model_proto, optim)
    computed = train_cfg.computed(config)  # what the steps compute with (the fast path's)
    self.facts = execution_facts(computed, train_cfg, src_len=pipeline.src_len,
                                 tgt_len=pipeline.tgt_len, rows=pipeline.rows)
    self.hparams = _hparams(config, train_cfg, optim, self.facts)
    self.p_state, self.p_rng = parallel.replicate(state), parallel.replicate(self.rng)
    self.p_train_step, self.p_eval_step = _pmapped_steps(
        computed, optim, train_cfg.accum_steps, train_cfg.skip_nonfinite)
    self.reader = monitor.MetricReader(skip_nonfinite=train_cfg.skip_nonfinite,
                                       on_skip=_on_skip)
    self.sink = monitor.MetricsSink(workdir, enabled=jax.process_index() == 0,
                                    start_step=self.start_step, total_steps=train_cfg.num_steps)
    self.summary: dict[str, Any] = {'preempted': False, 'train': {}}
    # The model over given params (an evaluation's, or shapes to compile ahead): its searches
    # are compiled once for the run (translation's cache of programs).
    self.translator = functools.partial(Translator, config=config, tokenizer=pipeline.tokenizer)
    self.last_save, self.data_state, self.saved_step = time.monotonic(), None, None
    # Work off the loop's thread: compiling the validation's programs ahead, and saving (the
    # device-to-host copy and orbax's part of a save, which its own threads then finish).
    self._compiler = concurrent.futures.ThreadPoolExecutor(1, 'jaxformer-compile')
    self._saver = concurrent.futures.ThreadPoolExecutor(1, 'jaxformer-save')
    self._saving: concurrent.futures.Future | None = None
    self.patience, self.stop_early = Patience(train_cfg.patience), False
    self.watch = monitor.Stopwatch()  # where the loop's time goes (the summary's 'time')

  def actions(self) -> list[Action]:
    """The loop's periodic actions, this run's methods (evaluate only with a validation set)."""
    return periodic_actions(self.train_cfg, log_metrics=self.log, save=self.save,
                            evaluate=self.evaluate if self.pipeline.validation is not None
                            else None)

  def train_step(self, step: int, batch: Any, position: dict[str, Any]) -> None:
    """Queues step `step` on `batch`, the data stream being at `position` after it (what a
    save records); reads the previous step's metrics (the device has this one) into the
    progress bar."""
    self.data_state = position
    self.p_state, metrics = self.p_train_step(self.p_state, batch, self.p_rng)
    self.read_metrics(keep=STEPS_IN_FLIGHT)
    self.reader.push(step, metrics)

  def read_metrics(self, keep: int = 0) -> None:
    """The queued steps' metrics, but the newest `keep`, into the progress bar."""
    self.sink.progress.update(self.reader.read(keep=keep))

  def _translates(self) -> int:
    """Validation sentences each evaluation translates (BLEU, samples) on this process."""
    train_cfg = self.train_cfg
    if self.pipeline.validation is None or not self.sink.enabled:
      return 0
    return max(train_cfg.bleu_sentences, train_cfg.sample_translations)

  def compile_ahead(self) -> None:
    """Compiles the validation's programs (the eval step, the search of the sentences it
    translates) from their shapes in a background thread, beside the train step, rather than at
    the first evaluation; a failure there is left to the evaluation, which compiles again."""
    if self.pipeline.validation is None or jax.process_count() > 1:
      return
    shape = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)  # noqa: E731
    state, batch = jax.tree.map(shape, self.p_state), self.pipeline.validation_batch_shapes()
    translator = self.translator(jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), self.p_state.params))
    sentences = self.pipeline.validation_text.src[:self._translates()]

    def compile_all() -> None:
      try:
        self.p_eval_step.compile(state, batch)
        if sentences:
          translator.compile_ahead(sentences)
      except Exception as e:  # pylint: disable=broad-except  (the evaluation compiles again)
        log.debug('compiling the validation ahead failed: %s', e)
    self._compiler.submit(compile_all)

  def log(self, step: int) -> None:
    """The interval's train metrics to TensorBoard, metrics.jsonl and the progress bar."""
    values = self.summary['train'] = self.reader.interval()
    self.sink.scalars(step, 'train', values)
    loss = f'{values["loss"]:.3f}' if 'loss' in values else 'skipped'
    self.sink.progress.set_postfix(loss=loss, lr=f'{values["lr"]:.2e}',
                                   tok_s=f'{values["tokens_per_s"]:.0f}')

  def evaluate(self, step: int) -> None:
    """Validation loss, perplexity and accuracy (all hosts); on process 0 also sacreBLEU and
    sample translations, as configured."""
    train_cfg = self.train_cfg
    result = self.summary['eval'] = validation.metrics(self.p_eval_step, self.p_state,
                                                       self.pipeline)
    self.stop_early = self.patience.update(result['loss'])  # the same on every host
    if self._translates():
      with self.watch('translations'):  # (a part of 'eval': samples and BLEU)
        result.update(validation.translated(
            self.translator(parallel.unreplicate(self.p_state.params)),
            self.pipeline.validation_text, train_cfg, self.sink, step))
    self.sink.scalars(step, 'eval', result)
    if train_cfg.average_best:  # a checkpoint at every evaluation, ranked by its metric
      self.save(step, {'loss': result['loss']} if train_cfg.best_metric == 'loss' else
                {'bleu': float(parallel.all_hosts(np.array(result.get('bleu', 0.0))).sum())})

  def save(self, step: int, metrics: dict[str, float] | None = None) -> None:
    """Starts an async save of this step (with the validation `metrics` that rank it, if any)
    and restarts the save clock; nothing if this step was saved already. With one process a
    background thread saves a copy of the state made on the device, and the loop goes on at
    once; with several, orbax's barriers and the loop's all-gathers must keep one order on
    every host, so the loop saves on its own thread."""
    if self.saved_step == step:  # saved already at this step's evaluation
      return
    self.saved_step, self.last_save = step, time.monotonic()
    save = functools.partial(resume.save, self.manager, step, rng=self.rng, meta=self.meta,
                             data_state=self.data_state,
                             keep_train_state=self.train_cfg.keep_train_state, metrics=metrics)
    if jax.process_count() > 1:
      save(parallel.unreplicate(self.p_state))
      return
    self.wait_for_save()  # (the last one's error, if any, raised here on the loop's thread)
    snapshot = _device_copy(self.p_state)
    self._saving = self._saver.submit(lambda: save(parallel.unreplicate(snapshot)))

  def wait_for_save(self) -> None:
    """Waits for the background part of the last save (raising its error, if any)."""
    if self._saving is not None:
      saving, self._saving = self._saving, None
      saving.result()

  def finish_saves(self) -> None:
    """Waits for the last save to commit, then removes the optimiser state it made redundant;
    stops the background threads."""
    try:
      self.wait_for_save()
      checkpoint.wait_until_finished(self.manager)
      if jax.process_index() == 0:
        checkpoint.drop_old_train_state(self.manager, self.train_cfg.keep_train_state)
    finally:
      self._saver.shutdown()
      self._compiler.shutdown(cancel_futures=True)

  def stop(self, step: int, signal: str | None) -> None:
    """Ends the loop early: out of patience (saving this step), or preempted (its save
    committed); says which in the summary and the log."""
    if self.stop_early:
      self.save(step)  # (a no-op if this step saved already)
      self.summary['stopped_early'] = True
      log.info('step %d: no better validation loss in %d evaluations (best %.4f): stopped '
               'early.', step, self.patience.since, self.patience.best)
    else:
      self.wait_for_save()
      checkpoint.wait_until_finished(self.manager)
      self.summary['preempted'], self.summary['signal'] = True, signal
      log.warning('%s received: saved step %d to %s; rerun the same command to resume.',
                  signal or 'stop', step, self.workdir / 'checkpoints' / str(step))

  def finish(self) -> dict[str, Any]:
    """The summary, after the end-of-run averages (resume.average)."""
    self.summary.update(step=int(parallel.unreplicate(self.p_state.step)),
                        skipped_updates=self.reader.skipped, checkpoint=str(  # (as given)
                            self.workdir / 'checkpoints' / str(self.manager.latest_step())))
    finished = (self.summary['step'] == self.train_cfg.num_steps
                or self.summary.get('stopped_early')) and not self.summary['preempted']
    self.summary.update(resume.average(self.workdir, self.manager, self.train_cfg,
                                       finished=finished))
    self.summary['time'] = self.watch.report(self.summary['step'] - self.start_step)
    return self.summary


def _nonfinite_error(e: monitor.NonFiniteLoss, manager: Any) -> 'TrainingError':
  latest = manager.latest_step()
  return TrainingError(
      f'{e}. The last good checkpoint is '
      f'{manager.directory / str(latest) if latest is not None else "none (no save yet)"}'
      '; rerun the same command with a lower learning rate to resume from it (e.g. --set '
      'optim.lr_scale=0.5, or --set optim.grad_clip_norm=1.0), or with --skip-nonfinite.')


def train_and_evaluate(config: TransformerConfig, train_cfg: TrainConfig,
                       workdir: str | pathlib.Path, pipeline: pipeline_lib.Pipeline, *,
                       optim: OptimConfig | None = None, init_params: Any = None) -> dict:
  """Trains `config` with `optim` (default: the paper's) on the pipeline's batches, resuming
  from the workdir, else from `init_params` if given. Returns a summary: final step, metrics,
  the checkpoints, and 'preempted' (with its 'signal') or 'stopped_early' (out of patience)."""
  run = Run.start(config, train_cfg, pathlib.Path(workdir), pipeline, optim or OptimConfig(),
                  init_params)
  actions, device_batches = run.actions(), pipeline.device_batches()
  watch = run.watch
  run.compile_ahead()
  nonfinite = None
  try:
    with run.sink, monitor.PreemptionGuard() as guard:
      run.sink.start(run.start_step, run.facts, describe_run(run.facts), run.hparams)
      for step in range(run.start_step + 1, train_cfg.num_steps + 1):
        with watch('first_step' if step == run.start_step + 1 else 'steps'):
          run.train_step(step, *next(device_batches))
          if step == run.start_step + 1:  # its compile and run, apart from the steps' rate
            run.read_metrics()
        preempted, timed_save = _agree(guard, run.last_save, train_cfg, step) if host_sync_due(
            step, train_cfg, jax.process_count()) else (False, False)
        now = due(actions, step, train_cfg.num_steps, save_signal=preempted or timed_save)
        if now:  # never report or save past an unchecked update
          with watch('steps'):
            run.read_metrics()
        for action in now:
          with watch(action.name):
            action.run(step)
        if run.stop_early or preempted:
          run.stop(step, guard.signal)
          break
  except monitor.NonFiniteLoss as e:
    nonfinite = e  # reported once the saves in flight committed: the last good one may be one
  finally:
    device_batches.close()
    with watch('save'):
      run.finish_saves()
  if nonfinite is not None:
    raise _nonfinite_error(nonfinite, run.manager) from None
  return run.finish()
