"""Orbax checkpoints: saved unreplicated, checked for compatibility, restored, and averaged.

A training workdir holds `checkpoints/<step>/` with four items::

  params  the model parameters (one copy, not one per device);
  train   optimiser state, step and the base rng (in the newest few only: resume needs it,
          averaging does not);
  data    the data iterators' positions, one per host;
  meta    the config, and the sentencepiece model (base64) with its sha256.

A checkpoint saved at an evaluation also records its validation metrics (orbax's `metrics`
item) when the run keeps its best checkpoints. An averaged checkpoint (`average-last<N>/<step>/`
or `average-best<N>/<step>/`) holds params and meta, and loads like any other.
"""

from __future__ import annotations  # orbax's types in signatures, unevaluated: see _Orbax

import base64
import contextlib
import dataclasses
import hashlib
import logging
import pathlib
import shutil
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

from jaxformer import files
from jaxformer.config import (BEST_METRICS, OptimConfig, SettingError, TransformerConfig,
                              config_from_dict, config_to_dict, optim_from_dict)
from jaxformer.errors import JaxformerError

log = logging.getLogger(__name__)
PyTree = Any


class _Orbax:
  """orbax.checkpoint, imported (the usual way) at the first attribute read: orbax and
  tensorstore take a noticeable part of a command's start, and translating an exported model,
  which `jaxformer translate` imports this module for, needs neither."""

  def __getattr__(self, name: str) -> Any:
    import orbax.checkpoint  # pylint: disable=g-import-not-at-top
    return getattr(orbax.checkpoint, name)


ocp = _Orbax()


class CheckpointError(JaxformerError, ValueError):
  """A missing, corrupt or incompatible checkpoint; the message says which and why."""


class IncompatibleCheckpointError(CheckpointError):
  """A readable checkpoint of a different model or vocabulary."""


# --- config and vocabulary metadata -------------------------------------------------------------


META = "a checkpoint's meta"  # (files.field's `where` for its fields)


def meta_config(meta: dict[str, Any]) -> TransformerConfig:
  """The model config stored in a checkpoint's meta; CheckpointError when this jaxformer cannot
  read it."""
  try:
    return config_from_dict(files.field(meta, 'config', dict, META))
  except SettingError as e:
    raise CheckpointError(f'checkpoint {e}') from None


def make_meta(config: TransformerConfig, spm_model: bytes, optim: OptimConfig | None = None
              ) -> dict[str, Any]:
  """What a checkpoint records beside its arrays: the model config, how it was trained (not
  pinned: see meta_optim) and the sentencepiece model (its bytes and their sha256), which
  restoring and `check_compatible` read."""
  return {'config': config_to_dict(config),
          'optim': dataclasses.asdict(optim or OptimConfig()),
          'spm_sha256': hashlib.sha256(spm_model).hexdigest(),
          'spm_model': base64.b64encode(spm_model).decode('ascii')}


def meta_optim(meta: dict[str, Any]) -> OptimConfig:
  """The optimisation settings a checkpoint was trained with; checkpoints from before
  OptimConfig kept them among the model's fields."""
  return optim_from_dict(meta.get('optim', meta['config']))


def spm_model_bytes(meta: dict[str, Any]) -> bytes:
  """The sentencepiece model stored in a checkpoint's meta."""
  try:
    return base64.b64decode(files.field(meta, 'spm_model', str, META), validate=True)
  except ValueError as e:  # (binascii.Error)
    raise files.RecordError(f'{META}: "spm_model" is not base64 ({e}).') from None


def check_compatible(meta: dict[str, Any], where: str, *, config: TransformerConfig,
                     spm_model: bytes) -> None:
  """Raises IncompatibleCheckpointError naming every config field (and the vocabulary) that
  differs between the checkpoint at `where` and this run. How the model is computed (its
  `execution`, e.g. the compute dtype) may differ."""
  saved = config_to_dict(meta_config(meta))
  now = config_to_dict(config)
  diffs = [f'{k}: checkpoint {saved.get(k)!r}, now {now.get(k)!r}'
           for k in sorted(set(saved) | set(now))
           if saved.get(k) != now.get(k) and k != 'execution']
  if meta['spm_sha256'] != hashlib.sha256(spm_model).hexdigest():
    diffs.append('the sentencepiece vocabulary differs')
  if diffs:
    raise IncompatibleCheckpointError(
        f'{where} does not match this run ({"; ".join(diffs)}). Use a new workdir, or the '
        'settings the checkpoint was trained with.')


# --- managers -----------------------------------------------------------------------------------

TRAIN_ITEMS = ('params', 'train', 'data', 'meta')


def checkpoint_dir(path: str | pathlib.Path) -> pathlib.Path:
  """A training workdir's checkpoint folder, or `path` itself if it holds checkpoints."""
  path = pathlib.Path(path)
  return path / 'checkpoints' if (path / 'checkpoints').is_dir() else path


def make_manager(directory: str | pathlib.Path, *, max_to_keep: int | None = None,
                 keep_best: tuple[int, str] | None = None,
                 items: tuple[str, ...] = TRAIN_ITEMS,
                 read_only: bool = False) -> ocp.CheckpointManager:
  """An async orbax manager; it commits each step atomically and ignores unfinished ones.
  It keeps the newest `max_to_keep` checkpoints, and with keep_best=(n, metric) also the n best
  by the validation metric saved with them (`save(..., metrics=...)`). A read-only one creates,
  saves and deletes nothing."""
  directory = pathlib.Path(directory).absolute()
  if not read_only:
    retention = {'max_to_keep': max_to_keep}
    if keep_best:
      n, metric = keep_best
      rank = lambda metrics: metrics[metric]  # noqa: E731
      mode = BEST_METRICS[metric]
      policies = ocp.checkpoint_managers
      retention = {'best_fn': rank, 'best_mode': mode, 'keep_checkpoints_without_metrics': False,
                   'preservation_policy': policies.AnyPreservationPolicy([
                       policies.LatestN(n=max_to_keep),
                       policies.BestN(get_metric_fn=rank, reverse=mode == 'min', n=n,
                                      keep_checkpoints_without_metrics=False)])}
    options = ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=True,
                                           **retention)
    return ocp.CheckpointManager(directory, options=options, item_names=items)
  options = ocp.CheckpointManagerOptions(read_only=True, create=False, save_interval_steps=0)
  absl = logging.getLogger('absl')
  level = absl.level
  absl.setLevel(logging.ERROR)  # orbax warns "Given directory is read only" for every reader
  try:
    return ocp.CheckpointManager(directory, options=options, item_names=items)
  finally:
    absl.setLevel(level)


def open_checkpoints(path: str | pathlib.Path) -> ocp.CheckpointManager:
  """A read-only manager of the params and meta under `path`: a training workdir, its
  checkpoints folder, or an averaged checkpoint folder."""
  found = files.describe(path)
  if found not in (files.WORKDIR, files.CHECKPOINTS):
    raise CheckpointError(files.misplaced(path, found, 'a training workdir or a checkpoint '
                                          'folder'))
  if found == files.WORKDIR and not (pathlib.Path(path) / 'checkpoints').is_dir():
    raise CheckpointError(f'{path}: a training workdir with no checkpoint yet.')
  return make_manager(checkpoint_dir(path), items=('params', 'meta'), read_only=True)


def save(manager: ocp.CheckpointManager, step: int, *, params: PyTree, meta: dict[str, Any],
         train: PyTree | None = None, data: dict[str, Any] | None = None,
         metrics: dict[str, float] | None = None) -> None:
  """Starts an async save of host (unreplicated) trees; `wait_until_finished(manager)` waits.
  `metrics` (validation loss, BLEU) rank the checkpoint for a manager made with keep_best."""
  items = {'params': ocp.args.StandardSave(params), 'meta': ocp.args.JsonSave(meta)}
  if train is not None:
    items['train'] = ocp.args.StandardSave(train)
  if data is not None:
    items['data'] = ocp.args.JsonSave(data)
  size = sum(getattr(leaf, 'nbytes', 0) for leaf in jax.tree.leaves((params, train)))
  files.check_space(manager.directory, size, f'checkpoint {step}')
  with _disk_full_said(manager, f'checkpoint {step}', size):
    manager.save(step, args=ocp.args.Composite(**items), metrics=metrics, force=True)


def wait_until_finished(manager: ocp.CheckpointManager) -> None:
  """Waits for the manager's async save to commit; a disk that filled meanwhile is a one-line
  DiskFullError, with the unfinished checkpoint removed."""
  with _disk_full_said(manager, 'the checkpoint being saved'):
    manager.wait_until_finished()


@contextlib.contextmanager
def _disk_full_said(manager: ocp.CheckpointManager, what: str, size: int | None = None
                    ) -> Iterator[None]:
  try:
    yield
  except Exception as e:  # orbax reports a full disk as tensorstore's ValueError, among others
    if not files.disk_full(e):
      raise
    for unfinished in pathlib.Path(manager.directory).glob('*.orbax-checkpoint-tmp*'):
      shutil.rmtree(unfinished, ignore_errors=True)
    raise files.no_space(manager.directory, what, size) from None


def drop_old_train_state(manager: ocp.CheckpointManager, keep: int,
                         saving: int | None = None) -> list[int]:
  """Removes the `train` item (optimiser state, step, rng) from every committed checkpoint but
  the newest `keep`: older ones are for averaging, which reads params only, and Adam's two
  moments are twice the params' size. Step `saving`, still being written, does not count: what
  resume needs is never removed before its replacement has committed, so a kill -9 during a
  save leaves the newest committed checkpoint resumable whatever `keep` is. Call on one process
  after `save` (orbax has then finished every earlier step). Returns the steps it pruned."""
  finished = sorted(step for step in manager.all_steps() if step != saving and
                    (pathlib.Path(manager.directory) / str(step) / 'train').exists())
  pruned = finished[:max(len(finished) - keep, 0)]
  for step in pruned:
    shutil.rmtree(pathlib.Path(manager.directory) / str(step) / 'train')
  return pruned


def _restore_items(manager: ocp.CheckpointManager, step: int, items: dict[str, Any]) -> dict:
  try:
    return dict(manager.restore(step, args=ocp.args.Composite(**items)))
  except Exception as e:  # pylint: disable=broad-except  (orbax raises many types)
    raise CheckpointError(f'checkpoint {manager.directory / str(step)} cannot be restored '
                          f'({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ""})'
                          ) from None


def restore(manager: ocp.CheckpointManager, step: int, *, params: PyTree | None = None,
            train: PyTree | Callable[[dict[str, Any]], PyTree] | None = None,
            with_data: bool = False,
            check: Callable[[dict[str, Any], str], None] | None = None) -> dict[str, Any]:
  """Restores step's meta, and params/train shaped like the given templates (None: as saved;
  `train` may be a function of the meta, for a state whose shape the checkpoint's settings
  decide).

  `check(meta, where)` runs on the meta before any array is read, so that a different model
  gets an IncompatibleCheckpointError naming the difference instead of a shape error. Raises
  CheckpointError for a damaged checkpoint.
  """
  if check is not None or callable(train):
    meta = _restore_items(manager, step, {'meta': ocp.args.JsonRestore()})['meta']
    if check is not None:
      check(meta, f'checkpoint {manager.directory / str(step)}')
    if callable(train):
      train = train(meta)
  items = {'meta': ocp.args.JsonRestore(), 'params': ocp.args.StandardRestore(params)}
  if train is not None:
    items['train'] = ocp.args.StandardRestore(train)
  if with_data:
    items['data'] = ocp.args.JsonRestore()
  return _restore_items(manager, step, items)


def restore_latest(manager: ocp.CheckpointManager, **kwargs: Any) -> tuple[int, dict] | None:
  """The newest step that restores, falling back to older ones (with a warning) when the newest
  is damaged; None when there is no checkpoint. kwargs as for `restore`."""
  steps = sorted(manager.all_steps(), reverse=True)
  if kwargs.get('train') is not None:  # only checkpoints that kept their optimiser state
    steps = [step for step in steps
             if (pathlib.Path(manager.directory) / str(step) / 'train').exists()]
  for step in steps:
    try:
      return step, restore(manager, step, **kwargs)
    except IncompatibleCheckpointError:
      raise
    except CheckpointError as e:
      log.warning('%s; trying an older one.', e)
  if steps:
    raise CheckpointError(f'none of the checkpoints {steps} in {manager.directory} restores.')
  return None


# --- loading for decoding, and averaging --------------------------------------------------------


def newest_meta(path: str | pathlib.Path) -> tuple[int, dict[str, Any]]:
  """(step, meta) of the newest checkpoint under `path`, without reading any array."""
  manager = open_checkpoints(path)
  for step in sorted(manager.all_steps(), reverse=True):
    try:
      return step, _restore_items(manager, step, {'meta': ocp.args.JsonRestore()})['meta']
    except CheckpointError as e:
      log.warning('%s; trying an older one.', e)
  raise CheckpointError(f'{path}: no checkpoint found.')


def load(path: str | pathlib.Path, average_last: int | None = None
         ) -> tuple[PyTree, TransformerConfig, bytes, int]:
  """(params, config, sentencepiece model bytes, step) of the newest checkpoint under `path`: a
  training workdir, its checkpoints folder, or an averaged checkpoint folder. With
  average_last=N, the params are the mean of the last N checkpoints' (average_checkpoints)."""
  if average_last:
    step, meta = newest_meta(path)
    params = average_checkpoints(path, average_last)
  else:
    found = restore_latest(open_checkpoints(path))
    if found is None:
      raise CheckpointError(f'{path}: no checkpoint found.')
    step, restored = found
    params, meta = jax.tree.map(np.asarray, restored['params']), restored['meta']
  return params, meta_config(meta), spm_model_bytes(meta), step


def last_steps(path: str | pathlib.Path, n: int) -> list[int]:
  """The newest `n` checkpoint steps under `path`, oldest first."""
  if n < 1:
    raise CheckpointError(f'the number of checkpoints to average must be >= 1, got {n}.')
  steps = sorted(open_checkpoints(path).all_steps())
  if len(steps) < n:
    raise CheckpointError(f'{path}: asked to average the last {n} checkpoints, but there are '
                          f'only {len(steps)} ({steps}).')
  return steps[-n:]


def best_steps(path: str | pathlib.Path, n: int, metric: str = 'loss') -> list[int]:
  """The `n` checkpoint steps under `path` with the best validation `metric` (BEST_METRICS)
  saved with them, oldest first. Ties go to the newer checkpoint."""
  if n < 1:
    raise CheckpointError(f'the number of checkpoints to average must be >= 1, got {n}.')
  manager = open_checkpoints(path)
  scored = [(metrics[metric], step) for step in manager.all_steps()
            if (metrics := manager.metrics(step)) and metric in metrics]
  if len(scored) < n:
    raise CheckpointError(
        f'{path}: asked to average the {n} best checkpoints by validation {metric}, but only '
        f'{len(scored)} recorded it: train with --set train.average_best={n} (it saves the '
        'validation metrics with each evaluation\'s checkpoint and keeps the best).')
  sign = 1 if BEST_METRICS[metric] == 'min' else -1
  return sorted(step for _, step in sorted(scored, key=lambda s: (sign * s[0], -s[1]))[:n])


def mean_params(path: str | pathlib.Path, steps: list[int]) -> PyTree:
  """The element-wise mean of the params of checkpoints `steps` under `path` (§6.1).

  Checkpoints are read one at a time into a running float32 sum, so memory stays at about two
  copies of the params however many are averaged; a progress bar shows once that takes longer
  than a second (the big recipe's 20 checkpoints).
  """
  manager = open_checkpoints(path)
  total = None
  for step in tqdm(steps, desc='averaging', unit='checkpoint', delay=1.0,
                   disable=jax.process_index() != 0):
    params = restore(manager, step)['params']
    if total is None:
      total = jax.tree.map(lambda x: np.array(x, np.float32), params)
    else:
      jax.tree.map(lambda t, x: np.add(t, np.asarray(x, np.float32), out=t), total, params)
    del params
  return jax.tree.map(lambda t: t / len(steps), total)


def average_checkpoints(workdir: str | pathlib.Path, last_n: int) -> PyTree:
  """The element-wise mean of the params of the last `last_n` checkpoints (§6.1)."""
  return mean_params(workdir, last_steps(workdir, last_n))


def save_average(workdir: str | pathlib.Path, last_n: int | None = None, *,
                 best: int | None = None, metric: str = 'loss') -> pathlib.Path:
  """Averages the last `last_n` checkpoints into `<workdir>/average-last<N>/<last step>/`, or
  with `best`, the best N by validation `metric` into `<workdir>/average-best<N>/<newest of
  them>/`. `workdir` must be a training workdir: a checkpoint folder (its checkpoints/, an
  average) would get the average inside it."""
  if (found := files.describe(workdir)) != files.WORKDIR:
    raise CheckpointError(files.misplaced(workdir, found, 'a training workdir'))
  steps = best_steps(workdir, best, metric) if best else last_steps(workdir, last_n)
  meta = newest_meta(workdir)[1]
  out = pathlib.Path(workdir) / (f'average-best{best}' if best else f'average-last{last_n}')
  first = jax.process_index() == 0  # every process of a run saves; the first holds the lock
  with files.locked(workdir, 'averaging', 'averaging') if first else contextlib.nullcontext():
    target = make_manager(out, items=('params', 'meta'))
    if steps[-1] in target.all_steps():
      target.delete(steps[-1])
    save(target, steps[-1], params=mean_params(workdir, steps),
         meta={**meta, 'averaged_steps': steps})
    wait_until_finished(target)
  return out
