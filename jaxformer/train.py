"""Training: the state, the pure train/eval steps, and the loop that wraps them in pmap."""

import collections
import dataclasses
import functools
import logging
import pathlib
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from flax.training import train_state

from jaxformer import checkpoint, evaluate, loop, losses, optim, parallel
from jaxformer import data as data_lib
from jaxformer.config import TransformerConfig, fast_path
from jaxformer.model import Transformer

log = logging.getLogger(__name__)
Array = jax.Array
Batch = dict[str, Array]  # src, tgt_in, tgt_out, weights [B, S|T]; optional *_segments, *_positions
_LAYOUT_KEYS = ('src_segments', 'tgt_segments', 'src_positions', 'tgt_positions')


class TrainState(train_state.TrainState):
  """Params, optimiser state and step (flax), plus the config the step reads and the learning
  rate schedule the optimiser was built with (the logged lr reads it)."""
  config: TransformerConfig = struct.field(pytree_node=False)
  lr_schedule: optax.Schedule = struct.field(pytree_node=False)


def create_train_state(config: TransformerConfig, rng: Array, src_len: int = 8,
                       tgt_len: int = 8) -> TrainState:
  """Initialises the model's params and the paper's optimiser."""
  model = Transformer(config)
  dummy_src = jnp.ones((1, src_len), jnp.int32)
  dummy_tgt = jnp.ones((1, tgt_len), jnp.int32)
  params = jax.jit(model.init)(rng, dummy_src, dummy_tgt)['params']
  schedule = optim.lrate_schedule(config.d_model, config.warmup_steps)
  return TrainState.create(apply_fn=model.apply, params=params, config=config,
                           tx=optim.make_optimizer(config, schedule), lr_schedule=schedule)


def _apply(state: TrainState, params: Any, batch: Batch, **kwargs: Any) -> Array:
  layout = {key: batch[key] for key in _LAYOUT_KEYS if key in batch}
  return state.apply_fn({'params': params}, batch['src'], batch['tgt_in'], **layout, **kwargs)


def _sum(x: Any, axis_name: str | None) -> Any:
  return x if axis_name is None else jax.lax.psum(x, axis_name)


def _applied_updates(state: TrainState) -> Array:
  """The optimiser's own count of applied updates, which the schedule reads (state.step also
  counts skipped non-finite updates); state.step for an optimiser that keeps no count."""
  counts = optax.tree_utils.tree_get_all_with_path(state.opt_state, 'count')
  return counts[0][1] if counts else state.step


def train_step(state: TrainState, batch: Batch, rng: Array, *, axis_name: str | None = None,
               accum_steps: int = 1,
               skip_nonfinite: bool = False) -> tuple[TrainState, dict[str, Array]]:
  """One update on `batch`; under pmap pass the axis name to combine devices.

  The loss is the label-smoothed sum divided by the number of real target tokens across all
  devices, so devices holding fewer tokens do not weigh more. With accum_steps = k, the batch's
  rows are split into k micro-batches whose gradient sums are added before that one division:
  the same update as the whole batch at once, in a k-th of the activation memory. With
  skip_nonfinite, an update whose loss or gradients are not finite leaves params and optimiser
  state unchanged (metrics['nonfinite'] = 1).
  """
  rng = jax.random.fold_in(rng, state.step)
  if axis_name is not None:
    rng = jax.random.fold_in(rng, jax.lax.axis_index(axis_name))

  def sums(params, micro_batch, micro_rng):
    """Gradient of the loss sum, and the sums behind the metrics, for one micro-batch."""
    def loss_fn(params):
      hidden = _apply(state, params, micro_batch, deterministic=False, return_hidden=True,
                      rngs={'dropout': micro_rng})
      loss_sum, weight_sum, correct = losses.chunked_smoothed_cross_entropy(
          hidden.astype(state.config.execution.dtype), params['embed']['embedding'],
          micro_batch['tgt_out'], micro_batch['weights'], state.config.label_smoothing,
          chunk=state.config.execution.loss_chunk)
      return loss_sum, (weight_sum, correct)
    (loss_sum, (weight_sum, correct)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    return grads, jnp.stack([loss_sum, weight_sum, correct])

  if accum_steps == 1:
    grads, totals = sums(state.params, batch, rng)
  else:
    micro = jax.tree.map(lambda x: x.reshape(accum_steps, -1, *x.shape[1:]), batch)

    def accumulate(carry, inputs):
      index, micro_batch = inputs
      grads, totals = sums(state.params, micro_batch, jax.random.fold_in(rng, index))
      return jax.tree.map(jnp.add, carry, (grads, totals)), None

    zeros = (jax.tree.map(jnp.zeros_like, state.params), jnp.zeros(3))
    (grads, totals), _ = jax.lax.scan(accumulate, zeros, (jnp.arange(accum_steps), micro))
  loss_sum, tokens, correct = _sum(totals, axis_name)
  tokens = jnp.maximum(tokens, 1.0)
  grads = jax.tree.map(lambda g: _sum(g, axis_name) / tokens, grads)
  grad_norm = optax.tree.norm(grads)
  metrics = {
      'loss': loss_sum / tokens,
      'accuracy': correct / tokens,
      'tokens': tokens,
      'grad_norm': grad_norm,
      'lr': state.lr_schedule(_applied_updates(state)),
  }
  new_state = state.apply_gradients(grads=grads)
  finite = jnp.isfinite(metrics['loss']) & jnp.isfinite(grad_norm)
  metrics['nonfinite'] = 1.0 - finite.astype(jnp.float32)
  if skip_nonfinite:
    kept = jax.tree.map(lambda new, old: jnp.where(finite, new, old),
                        (new_state.params, new_state.opt_state), (state.params, state.opt_state))
    new_state = new_state.replace(params=kept[0], opt_state=kept[1])
  return new_state, metrics


def eval_step(state: TrainState, batch: Batch) -> dict[str, Array]:
  """Sums for one batch: smoothed loss, NLL, correct tokens and tokens."""
  logits = _apply(state, state.params, batch, deterministic=True)
  targets, weights = batch['tgt_out'], batch['weights']
  loss_sum, tokens = losses.smoothed_cross_entropy(
      logits, targets, weights, state.config.label_smoothing)
  nll_sum, _ = losses.cross_entropy(logits, targets, weights)
  correct, _ = losses.accuracy(logits, targets, weights)
  return {'loss_sum': loss_sum, 'nll_sum': nll_sum, 'correct': correct, 'tokens': tokens}


# =============================================================================================
# The training loop.


class TrainingError(RuntimeError):
  """Training cannot go on (e.g. a non-finite loss); the message says where and what to do."""


def setting(default: Any, help: str) -> Any:  # pylint: disable=redefined-builtin
  """A config field with its help text (the command line's flags and --help read it)."""
  return dataclasses.field(default=default, metadata={'help': help})


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """How to train: batch size, schedule of checkpoints, evaluation and logging."""
  workdir: str = setting(dataclasses.MISSING, 'checkpoints, vocabulary, token cache, logs')
  num_steps: int = setting(100_000, 'updates (§5.2: 100k for base, 300k for big)')
  tokens_per_batch: int = setting(25_000, 'token slots per side per update, all devices '
                                  'together (§5.1)')
  accum_steps: int = setting(1, 'micro-batches per update (for fewer devices than 8)')
  row_len: int = setting(256, 'packed row length of the longer side')
  seed: int = setting(0, 'params, dropout, shuffling and vocabulary sample')
  checkpoint_every_secs: float | None = setting(600.0, 'seconds between checkpoints (the '
                                                "paper's 10 minutes; none: off)")
  checkpoint_every_steps: int | None = setting(None, 'steps between checkpoints (none: off)')
  keep_checkpoints: int = setting(20, 'checkpoints kept (raised to average_last if smaller)')
  keep_train_state: int = setting(2, 'the newest checkpoints that keep the optimiser state '
                                  'for resuming (the others keep params only, for averaging)')
  average_last: int = setting(5, 'average this many checkpoints at the end (0: none)')
  eval_every_steps: int = setting(1000, 'steps between evaluations on the validation set')
  log_every_steps: int = setting(100, 'steps between logged training metrics')
  skip_nonfinite: bool = setting(False, 'skip and count updates with a non-finite loss instead '
                                 'of stopping')
  bleu_sentences: int = setting(0, 'at each evaluation, sacreBLEU of this many validation '
                                'sentences decoded with beam 4 (0: none)')
  sample_translations: int = setting(3, 'at each evaluation, this many validation sentences '
                                     'translated into TensorBoard (0: none)')
  spm_sample_size: int = setting(2_000_000, 'sentences sampled to train the vocabulary')
  fast_path: bool | None = setting(None, 'bfloat16 compute and fused attention (none: on GPU '
                                   'only)')
  require_accelerator: bool = setting(False, "refuse a CPU backend (the paper's recipes set it)")
  reset_data: bool = setting(False, "resume the checkpoint's params, optimiser state and step "
                             'on a fresh data stream (after changing the corpus or the seed)')
  host_sync_every_steps: int = setting(10, 'several hosts agree on preemption and timed saves '
                                       '(one all-gather) every this many steps')


def check_backend(tc: TrainConfig, backend: str | None = None) -> None:
  """Stops a run that requires an accelerator (the paper's recipes) on a CPU backend."""
  backend = backend or jax.default_backend()
  if tc.require_accelerator and backend == 'cpu':
    raise TrainingError(
        "this recipe needs a GPU, but jax's backend is cpu (no GPU here, or jax's CPU build): on "
        'a GPU host run `make install` (it installs jaxformer[cuda12] or [cuda13]; or pip install '
        "'jaxformer[cuda12]'), or pass --allow-cpu to train on the CPU anyway.")


def check_settings(config: TransformerConfig, tc: TrainConfig) -> None:
  """Settings that cannot work together, refused before any work."""
  for name in ('num_steps', 'tokens_per_batch', 'accum_steps', 'row_len', 'log_every_steps',
               'eval_every_steps', 'host_sync_every_steps'):
    if getattr(tc, name) < 1:
      raise TrainingError(f'{name} must be >= 1, got {getattr(tc, name)}.')
  for name in ('checkpoint_every_steps', 'checkpoint_every_secs'):
    if getattr(tc, name) is not None and getattr(tc, name) <= 0:
      raise TrainingError(f'{name} must be > 0 (or unset), got {getattr(tc, name)}.')
  if tc.average_last < 0 or tc.bleu_sentences < 0 or min(tc.keep_checkpoints,
                                                          tc.keep_train_state) < 1:
    raise TrainingError('average_last and bleu_sentences must be >= 0, and keep_checkpoints and '
                        'keep_train_state >= 1.')
  if tc.row_len < config.max_len:
    raise TrainingError(f'row_len={tc.row_len} is shorter than max_len={config.max_len}: the '
                        'longest pairs would not fit in a row; set row_len >= max_len.')


def host_sync_due(step: int, tc: TrainConfig, process_count: int) -> bool:
  """Whether the hosts agree on preemption and timed saves after `step`: always with one host
  (no communication), every host_sync_every_steps steps and at the last with several."""
  return process_count == 1 or step % tc.host_sync_every_steps == 0 or step == tc.num_steps


def resume_data(batches: data_lib.PackedBatches, hosts: list[dict[str, int]],
                tc: TrainConfig) -> None:
  """Moves `batches` to this host's saved position; a fresh stream with reset_data or after a
  change of host count (with a warning); a one-line error when the data changed."""
  if tc.reset_data:
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
  changed = [f'{name} {saved[key]} -> {now[key]}' for key, name in
             (('seed', 'seed'), ('shard_size', 'training pairs per host'),
              ('corpus', 'corpus id'), ('src_len', 'source row length'),
              ('tgt_len', 'target row length')) if saved[key] != now[key]]
  if changed:
    raise TrainingError(
        f'the training data changed since the checkpoint ({", ".join(changed)}): resume with the '
        'same corpus and settings, or pass --reset-data to continue from the checkpoint on a '
        'fresh data stream.')
  batches.set_state(saved)


def run_facts(config: TransformerConfig, tc: TrainConfig, *, src_len: int, tgt_len: int,
              rows: int) -> dict[str, Any]:
  """Where and how a run computes: devices, processes, dtype, attention and the batch."""
  slots = rows * tc.accum_steps * jax.device_count()  # rows per update, all devices
  return {'devices': parallel.devices_line(), 'backend': jax.default_backend(),
          'device_count': jax.device_count(), 'process_count': jax.process_count(),
          'dtype': jnp.dtype(config.execution.dtype).name,
          'attention': config.execution.attention, 'remat': config.execution.remat,
          'source_tokens_per_update': slots * src_len,
          'target_tokens_per_update': slots * tgt_len, 'accum_steps': tc.accum_steps,
          'rows_per_device': rows, 'row_lengths': [src_len, tgt_len]}


def describe_run(facts: dict[str, Any]) -> str:
  """The run's facts as the one line the trainer logs at start."""
  micro = f'{facts["accum_steps"]} micro-batch{"es" if facts["accum_steps"] > 1 else ""}'
  return (f'{facts["devices"]}; compute {facts["dtype"]}, {facts["attention"]} attention'
          f'{", remat" if facts["remat"] else ""}; {facts["source_tokens_per_update"]:,} source + '
          f'{facts["target_tokens_per_update"]:,} target token slots per update ({micro} of '
          f'{facts["rows_per_device"]} rows per device, rows of {facts["row_lengths"][0]} / '
          f'{facts["row_lengths"][1]} tokens)')


def _train_item(state: TrainState, rng: Array) -> dict[str, Any]:
  return {'opt_state': state.opt_state, 'step': state.step,
          'rng': np.asarray(jax.random.key_data(rng))}  # host arrays: multi-host orbax needs them


def _data_state(local: dict[str, Any]) -> dict[str, Any]:
  """Every host's iterator position (gathered when there are several hosts)."""
  keys = data_lib.PackedBatches.STATE_KEYS
  gathered = parallel.all_hosts(np.array([local[key] for key in keys], np.int64))
  return {'hosts': [dict(zip(keys, map(int, row))) for row in gathered]}


def validation_metrics(p_eval_step: Any, p_state: TrainState, corpus: Any, *, src_len: int,
                       tgt_len: int, rows_per_device: int) -> dict[str, float]:
  """Loss, perplexity and token accuracy over one pass of `corpus` (all hosts together)."""
  batches = data_lib.PackedBatches(
      corpus, src_len=src_len, tgt_len=tgt_len, rows_per_device=rows_per_device,
      num_devices=jax.local_device_count(), shuffle=False, num_epochs=1,
      process_index=jax.process_index(), process_count=jax.process_count())
  # Hosts may hold different numbers of batches: all run the largest count, padding with
  # empty batches, so that every host makes the same pmap calls.
  num_batches = int(parallel.all_hosts(np.array([batches.rows_in_epoch(0)])).max())
  num_batches = -(-num_batches // (rows_per_device * jax.local_device_count()))
  totals = collections.Counter()
  for _ in range(num_batches):
    batch = next(batches, None)
    sums = jax.device_get(p_eval_step(p_state, batch or batches.empty_batch()))
    totals.update({k: float(np.sum(v)) for k, v in sums.items()})
  totals = parallel.all_hosts(np.array([totals[k] for k in ('loss_sum', 'nll_sum', 'correct',
                                                            'tokens')])).sum(0)
  loss_sum, nll_sum, correct, tokens = map(float, totals)
  tokens = max(tokens, 1.0)
  return {'loss': loss_sum / tokens, 'perplexity': float(np.exp(nll_sum / tokens)),
          'accuracy': correct / tokens, 'tokens': tokens}


def _translate_validation(translator: evaluate.Translator, params: Any, text: Any,
                          tc: TrainConfig) -> tuple[float | None, str]:
  """(sacreBLEU of the first bleu_sentences validation sentences or None, a markdown table of
  the first sample_translations: source, hypothesis, reference), decoded as in §6.1 by the
  run's one translator (its searches compiled at the first evaluation only)."""
  count = max(tc.bleu_sentences, tc.sample_translations)
  translator.params = params
  hypotheses = translator.translate(text.src[:count])
  bleu = evaluate.sacre_bleu(hypotheses, text.tgt[:tc.bleu_sentences])[0] \
      if tc.bleu_sentences else None
  cell = lambda s: s.replace('|', '\\|')  # noqa: E731
  rows = [f'| {cell(src)} | {cell(hyp)} | {cell(ref)} |' for src, hyp, ref in
          list(zip(text.src, hypotheses, text.tgt))[:tc.sample_translations]]
  return bleu, '\n'.join(['| source | hypothesis | reference |', '|---|---|---|', *rows])


def _hparams(config: TransformerConfig, tc: TrainConfig, facts: dict[str, Any]
             ) -> dict[str, Any]:
  """The run's settings as TensorBoard hparams (numbers, booleans and strings only)."""
  settings = {'model': checkpoint.config_to_dict(config), 'train': dataclasses.asdict(tc),
              'run': facts}
  return jax.tree.map(lambda v: v if isinstance(v, (bool, int, float, str)) else str(v),
                      settings, is_leaf=lambda v: v is None or isinstance(v, list))


@dataclasses.dataclass
class PreparedData:
  """The vocabulary and the packed batches of a run, and its one translator (made at the
  first evaluation that translates)."""
  tokenizer: data_lib.Tokenizer
  batches: data_lib.PackedBatches
  eval_corpus: data_lib.TokenizedCorpus | None
  src_len: int            # packed row lengths
  tgt_len: int
  rows: int               # rows per device per micro-batch
  _translator: evaluate.Translator | None = None

  def translator(self, config: TransformerConfig) -> evaluate.Translator:
    if self._translator is None:
      self._translator = evaluate.Translator(None, config, self.tokenizer)
    return self._translator


def prepare_data(config: TransformerConfig, tc: TrainConfig, train_text: Any,
                 eval_text: Any | None) -> PreparedData:
  """The workdir's vocabulary and token caches (prepared by one process per filesystem, see
  data.pipeline), checked to be the same on every process, and this host's share of the
  training pairs as packed batches.

  A fresh run refuses a vocabulary trained on other data or settings; a run that resumes keeps
  the one its checkpoints hold (their data positions say whether the data changed)."""
  workdir = pathlib.Path(tc.workdir)
  resuming = any(path.name.isdigit() for path in (workdir / 'checkpoints').glob('*'))
  tokenizer, corpus, eval_corpus = data_lib.pipeline.prepare(
      workdir, train_text, eval_text, vocab_size=config.vocab_size, max_len=config.max_len,
      sample_size=tc.spm_sample_size, seed=tc.seed, check_vocabulary=not resuming)
  if tokenizer.vocab_size != config.vocab_size:
    raise TrainingError(f'{tokenizer.path} has {tokenizer.vocab_size} pieces but the model '
                        f'expects vocab_size={config.vocab_size}.')
  fingerprints = parallel.all_hosts(np.array([data_lib.PackedBatches.corpus_id(corpus)]))
  if len(set(fingerprints.ravel().tolist())) > 1:
    raise TrainingError(f'the processes prepared different training data (corpus ids '
                        f'{fingerprints.ravel().tolist()}): every process must read the same '
                        'corpus with the same settings.')
  src_len, tgt_len = data_lib.row_lengths(corpus, tc.row_len)
  try:
    rows = data_lib.rows_per_device(tc.tokens_per_batch // tc.accum_steps,
                                    max(src_len, tgt_len), jax.device_count())
  except ValueError as e:
    raise TrainingError(f'{e} Raise tokens_per_batch or lower accum_steps.') from None
  batches = data_lib.PackedBatches(
      corpus, src_len=src_len, tgt_len=tgt_len, rows_per_device=rows * tc.accum_steps,
      num_devices=jax.local_device_count(), seed=tc.seed, process_index=jax.process_index(),
      process_count=jax.process_count())
  return PreparedData(tokenizer, batches, eval_corpus, src_len, tgt_len, rows)


def run_config(config: TransformerConfig, tc: TrainConfig) -> TransformerConfig:
  """The config the steps compute with: the fast path's execution when it is on."""
  on = jax.default_backend() == 'gpu' if tc.fast_path is None else tc.fast_path
  return config.replace(execution=fast_path(config, 'gpu')) if on else config


def init_or_restore(config: TransformerConfig, tc: TrainConfig, prepared: PreparedData,
                    manager: Any) -> tuple[TrainState, Array]:
  """A fresh state and rng, or the newest compatible checkpoint's (the data stream moved to its
  position). The state computes with run_config; checkpoints record `config` as given."""
  init_rng, rng = jax.random.split(jax.random.key(tc.seed))
  state = create_train_state(run_config(config, tc), init_rng)
  found = checkpoint.restore_latest(
      manager, params=state.params, train=_train_item(state, rng), with_data=True,
      check=functools.partial(checkpoint.check_compatible, config=config,
                              spm_model=prepared.tokenizer.model_proto))
  if found is None:
    return state, rng
  step, restored = found
  train_item = restored['train']
  state = state.replace(params=restored['params'], opt_state=train_item['opt_state'],
                        step=train_item['step'])
  resume_data(prepared.batches, restored['data']['hosts'], tc)
  log.info('resumed from step %d (%s)', step, manager.directory / str(step))
  return state, jax.random.wrap_key_data(train_item['rng'])


def _workdir(tc: TrainConfig) -> pathlib.Path:
  workdir = pathlib.Path(tc.workdir)
  try:
    workdir.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise TrainingError(f'{workdir}: cannot be the workdir ({e.strerror}).') from None
  return workdir


def _agree(guard: loop.PreemptionGuard, last_save: float, tc: TrainConfig) -> tuple[bool, bool]:
  """(preempted, timed save due) as all hosts agree: one all-gather."""
  local = [guard.signal is not None, loop.clock_ran_out(last_save, tc.checkpoint_every_secs)]
  return tuple(bool(x) for x in parallel.all_hosts(np.array(local)).any(0))


def _on_skip(step: int, skipped: int) -> None:
  log.warning('step %d: non-finite loss, update skipped (%d so far)', step, skipped)


def train_and_evaluate(config: TransformerConfig, tc: TrainConfig, train_text: Any,
                       eval_text: Any | None = None) -> dict[str, Any]:
  """Trains `config` on `train_text` (a data.ParallelText), resuming from the workdir.

  Returns a summary: final step, last train metrics, last evaluation, the newest checkpoint,
  the averaged checkpoint (if any), and whether training stopped early on SIGTERM/SIGINT.
  """
  check_backend(tc)
  check_settings(config, tc)
  workdir = _workdir(tc)
  prepared = prepare_data(config, tc, train_text, eval_text)
  manager = checkpoint.make_manager(workdir / 'checkpoints',
                                    max_to_keep=max(tc.keep_checkpoints, tc.average_last, 1))
  state, rng = init_or_restore(config, tc, prepared, manager)
  start_step = int(state.step)
  meta = checkpoint.make_meta(config, prepared.tokenizer.model_proto)
  facts = run_facts(state.config, tc, src_len=prepared.src_len, tgt_len=prepared.tgt_len,
                    rows=prepared.rows)
  log.info('training on %s', describe_run(facts))
  p_state, p_rng = parallel.replicate(state), parallel.replicate(rng)
  p_train_step, p_eval_step = _pmapped_steps(tc)
  reader = loop.MetricReader(skip_nonfinite=tc.skip_nonfinite, on_skip=_on_skip)
  summary: dict[str, Any] = {'preempted': False, 'train': {}}
  last_save = time.monotonic()
  sink = loop.MetricsSink(workdir, enabled=jax.process_index() == 0, start_step=start_step,
                          total_steps=tc.num_steps)
  device_batches = parallel.prefetch(prepared.batches)
  try:
    with sink, loop.PreemptionGuard() as guard:
      sink.start(start_step, facts, describe_run(facts), _hparams(config, tc, facts))
      for step in range(start_step + 1, tc.num_steps + 1):
        batch, data_state = next(device_batches)
        p_state, metrics = p_train_step(p_state, batch, p_rng)
        sink.progress.update(reader.read())  # the previous step's: the device has this one
        reader.push(step, metrics)
        preempted, timed_save = _agree(guard, last_save, tc) if host_sync_due(
            step, tc, jax.process_count()) else (False, False)
        now = loop.due(step, tc, evaluating=prepared.eval_corpus is not None,
                       timed_save=timed_save, preempted=preempted)
        if now.any:  # never report or save past an unchecked update
          sink.progress.update(reader.read())
        if now.log:
          summary['train'] = _report_train(sink, step, reader.interval())
        if now.eval:
          summary['eval'] = _evaluate(p_eval_step, p_state, prepared, eval_text, config, tc,
                                      sink, step)
        if now.save:
          _save(manager, step, parallel.unreplicate(p_state), rng, meta, data_state,
                tc.keep_train_state)
          last_save = time.monotonic()
        if preempted:
          manager.wait_until_finished()
          summary['preempted'] = True
          log.warning('%s received: saved step %d to %s; rerun the same command to resume.',
                      guard.signal or 'stop', step, manager.directory / str(step))
          break
  except loop.NonFiniteLoss as e:
    latest = manager.latest_step()
    raise TrainingError(
        f'{e}. The last good checkpoint is '
        f'{manager.directory / str(latest) if latest is not None else "none (no save yet)"}'
        '; resume from it with a lower learning rate or --skip-nonfinite.') from None
  finally:
    device_batches.close()
    manager.wait_until_finished()
  summary.update(step=int(parallel.unreplicate(p_state.step)), skipped_updates=reader.skipped,
                 checkpoint=str(manager.directory / str(manager.latest_step())))
  if tc.average_last and not summary['preempted'] and summary['step'] == tc.num_steps:
    _average(workdir, manager, tc, summary)
  return summary


def _pmapped_steps(tc: TrainConfig) -> tuple[Any, Any]:
  """The train step (donating its state) and the eval step, pmapped over the local devices."""
  p_train_step = jax.pmap(
      functools.partial(train_step, axis_name='batch', accum_steps=tc.accum_steps,
                        skip_nonfinite=tc.skip_nonfinite), axis_name='batch', donate_argnums=0)
  return p_train_step, jax.pmap(eval_step, axis_name='batch')


def _report_train(sink: loop.MetricsSink, step: int, values: dict[str, float]
                  ) -> dict[str, float]:
  sink.scalars(step, 'train', values)
  sink.progress.set_postfix(loss=f'{values["loss"]:.3f}', lr=f'{values["lr"]:.2e}',
                            tok_s=f'{values["tokens_per_s"]:.0f}')
  return values


def _save(manager: Any, step: int, state: TrainState, rng: Array, meta: dict[str, Any],
          data_state: dict[str, Any], keep_train_state: int) -> None:
  """Starts an async save of an unreplicated state, with every host's data position; older
  checkpoints than the newest keep_train_state lose their optimiser state (process 0)."""
  checkpoint.save(manager, step, params=state.params, meta=meta,
                  train=_train_item(state, rng), data=_data_state(data_state))
  if jax.process_index() == 0:
    checkpoint.drop_old_train_state(manager, keep_train_state, saving=step)


def _evaluate(p_eval_step: Any, p_state: TrainState, prepared: PreparedData, eval_text: Any,
              config: TransformerConfig, tc: TrainConfig, sink: loop.MetricsSink,
              step: int) -> dict[str, float]:
  """Validation loss, perplexity and accuracy (all hosts); on process 0 also sacreBLEU and
  sample translations, as configured. Reported to the sink."""
  result = validation_metrics(p_eval_step, p_state, prepared.eval_corpus,
                              src_len=prepared.src_len, tgt_len=prepared.tgt_len,
                              rows_per_device=prepared.rows)
  if (tc.bleu_sentences or tc.sample_translations) and sink.enabled:
    bleu, samples = _translate_validation(prepared.translator(config),
                                          parallel.unreplicate(p_state.params), eval_text, tc)
    if bleu is not None:
      result['bleu'] = bleu
    if tc.sample_translations:
      sink.text(step, 'samples', samples)
  sink.scalars(step, 'eval', result)
  return result


def _average(workdir: pathlib.Path, manager: Any, tc: TrainConfig, summary: dict) -> None:
  available = len(manager.all_steps())
  if available >= tc.average_last:
    summary['averaged'] = str(checkpoint.save_average(workdir, tc.average_last))
  else:
    log.warning('only %d checkpoints: not averaging the last %d.', available, tc.average_last)
