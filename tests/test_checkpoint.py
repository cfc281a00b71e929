"""jaxformer.checkpoint: what is kept, averaging, compatibility, damaged checkpoints."""

import itertools
import shutil
import socket

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tqdm
from helpers import CFG, TEXT, assert_trees_equal, hold_lock, synthetic_text
from helpers import train_settings as _tc

from jaxformer import checkpoint, cli, data, train, trainer
from jaxformer import config as config_lib
from jaxformer.model import Transformer


def test_checkpoints_accept_other_execution_fields_only():
  meta = checkpoint.make_meta(config_lib.base(), b'spm')
  fast = config_lib.base().with_execution(remat=True, loss_chunk=4096, dtype=jnp.bfloat16)
  checkpoint.check_compatible(meta, 'ckpt', config=fast, spm_model=b'spm')  # no error
  with pytest.raises(checkpoint.IncompatibleCheckpointError, match='d_ff'):
    checkpoint.check_compatible(meta, 'ckpt', config=fast.replace(d_ff=1024), spm_model=b'spm')


def test_a_run_with_another_vocabulary_in_a_used_workdir_is_told_to_use_a_new_one(workdir,
                                                                                  tmp_path):
  """A workdir's checkpoints and vocabulary are another run's: the vocabulary's size was said
  without the way out, as the checkpoint's other settings are."""
  shutil.copytree(workdir, tmp_path / 'w')
  with pytest.raises(data.DataError, match=r"spm\.model has 400 pieces, and this run's model "
                     r'vocab_size=512: the workdir holds a run with another vocabulary\. Use a '
                     r'new workdir, or the settings its checkpoints were trained with\.'):
    trainer.train(config_lib.tiny(vocab_size=512), _tc(num_steps=6), tmp_path / 'w',
                  synthetic_text(800))


def test_only_the_newest_checkpoints_keep_the_optimiser_state(trained):
  """Resume needs the newest (keep_train_state=2 by default); averaging needs params only."""
  steps = trained / 'checkpoints'
  assert [(steps / str(s) / 'train').exists() for s in (2, 4, 6)] == [False, True, True]
  assert all((steps / str(s) / 'params').is_dir() for s in (2, 4, 6))
  manager = checkpoint.make_manager(steps)
  template = jax.device_get(train.create_train_state(CFG, jax.random.key(0)))
  step, _ = checkpoint.restore_latest(manager, train={'opt_state': template.opt_state,
                                                      'step': 0, 'rng': np.zeros(2, np.uint32)})
  assert step == 6


def test_average_is_the_mean_and_loads_for_decoding(trained):
  manager = checkpoint.make_manager(trained / 'checkpoints')
  expected = jax.tree.map(lambda *xs: np.mean(np.stack(xs), axis=0),
                          *[checkpoint.restore(manager, s)['params'] for s in (2, 4, 6)])
  assert_trees_equal(checkpoint.average_checkpoints(trained, 3), expected, rtol=1e-6)
  params, cfg, _, step = checkpoint.load(trained / 'average-last3')
  assert_trees_equal(params, expected, rtol=1e-6)
  assert cfg == CFG and step == 6
  logits = Transformer(cfg).apply({'params': params}, jnp.ones((1, 5), jnp.int32),
                                  jnp.zeros((1, 3), jnp.int32))
  assert logits.shape == (1, 3, 400) and bool(jnp.all(jnp.isfinite(logits)))
  with pytest.raises(checkpoint.CheckpointError, match='only 3'):
    checkpoint.average_checkpoints(trained, 5)


@pytest.mark.parametrize('seconds_a_reading, shown', [(0, False), (1, True)])
def test_averaging_shows_its_progress_once_it_takes_a_while(trained, monkeypatch, capsys,
                                                            seconds_a_reading, shown):
  """On tqdm's clock: a bar from a second on (20 big checkpoints take a while), none before."""
  clock = itertools.count(step=seconds_a_reading)
  monkeypatch.setattr(tqdm.std, 'time', lambda: float(next(clock)))
  checkpoint.mean_params(trained, [2, 4, 6])
  err = capsys.readouterr().err
  assert ('averaging: 100%' in err and '3/3' in err) if shown else err == '', err


def test_incompatible_config_or_vocabulary_is_named(trained, tmp_path):
  workdir = tmp_path / 'w'
  shutil.copytree(trained, workdir)
  with pytest.raises(checkpoint.CheckpointError, match=r'd_ff: checkpoint 64, now 128'):
    trainer.train(CFG.replace(d_ff=128), _tc(num_steps=8), workdir, TEXT)
  other = synthetic_text(300, seed=5)
  (workdir / 'spm.model').unlink()
  data.train_tokenizer(other.src, workdir / 'spm.model', 400)
  with pytest.raises(checkpoint.CheckpointError, match='sentencepiece vocabulary differs'):
    trainer.train(CFG, _tc(num_steps=8), workdir, TEXT)


def test_a_damaged_checkpoint_falls_back_to_the_previous_one(trained, tmp_path, caplog):
  workdir = tmp_path / 'w'
  shutil.copytree(trained, workdir)
  for path in (workdir / 'checkpoints' / '6' / 'params').rglob('*'):
    if path.is_file():
      path.write_bytes(b'garbage')
  manager = checkpoint.make_manager(workdir / 'checkpoints')
  step, _ = checkpoint.restore_latest(manager)
  assert step == 4
  assert 'checkpoints/6 cannot be restored' in caplog.text
  for step_dir in ('2', '4'):
    shutil.rmtree(workdir / 'checkpoints' / step_dir / 'params')
  with pytest.raises(checkpoint.CheckpointError, match='none of the checkpoints'):
    checkpoint.restore_latest(checkpoint.make_manager(workdir / 'checkpoints'))


def _ranked_workdir(path, bleus):
  """Checkpoints 1..len(bleus) of params {'w': [step, step]} saved with validation BLEU `bleus`
  (None: saved without metrics, as a preemption save is), keeping the newest one and the best 2."""
  manager = checkpoint.make_manager(path / 'checkpoints', max_to_keep=1, keep_best=(2, 'bleu'))
  for step, bleu in enumerate(bleus, 1):
    checkpoint.save(manager, step, params={'w': np.full(2, step, np.float32)}, meta={'m': step},
                    metrics=None if bleu is None else {'bleu': bleu})
  manager.wait_until_finished()
  return path


def test_best_checkpoints_by_a_metric_are_kept_and_averaged(tmp_path):
  workdir = _ranked_workdir(tmp_path, [10.0, 30.0, 20.0, 30.0, None])
  assert sorted(int(p.name) for p in (workdir / 'checkpoints').iterdir()) == [2, 4, 5]
  assert checkpoint.best_steps(workdir, 2, 'bleu') == [2, 4]
  assert checkpoint.best_steps(workdir, 1, 'bleu') == [4]  # a tie goes to the newer
  assert checkpoint.last_steps(workdir, 2) == [4, 5]
  out = checkpoint.save_average(workdir, best=2, metric='bleu')
  assert out.name == 'average-best2'
  restored = checkpoint.restore(checkpoint.open_checkpoints(out), 4)
  np.testing.assert_array_equal(restored['params']['w'], [3.0, 3.0])  # (2 + 4) / 2
  assert restored['meta'] == {'m': 5, 'averaged_steps': [2, 4]}
  with pytest.raises(checkpoint.CheckpointError, match='only 2 recorded it.*average_best=3'):
    checkpoint.best_steps(workdir, 3, 'bleu')
  with pytest.raises(checkpoint.CheckpointError, match='validation loss, but only 0'):
    checkpoint.best_steps(workdir, 1, 'loss')


def test_best_metric_settings_are_checked():
  with pytest.raises(config_lib.SettingError, match="best_metric must be one of.*'bleu', 'loss'"):
    _tc(best_metric='accuracy')
  with pytest.raises(config_lib.SettingError, match='needs validation BLEU'):
    _tc(average_best=3, best_metric='bleu')
  with pytest.raises(config_lib.SettingError, match='average_best must be >= 0'):
    _tc(average_best=-1)


def test_one_average_at_a_time_and_a_killed_holder_blocks_nothing(workdir, capsys):
  """Two `jaxformer average` at once: the second is refused in one line naming the first
  (before: orbax tracebacks, each deleting the other's step); kill -9 frees the lock."""
  holder = hold_lock(workdir, 'averaging')
  try:
    assert cli.main(['average', '--workdir', str(workdir), '--last', '2']) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0] == (
        f'error: {workdir} is in use: averaging by pid {holder.pid} on {socket.gethostname()} '
        'holds it. Wait for that to end, or use another folder.')
  finally:
    holder.kill()
    holder.wait()
  assert cli.main(['average', '--workdir', str(workdir), '--last', '2']) == 0
  capsys.readouterr()
  for folder in (workdir / 'average-last2', workdir / 'checkpoints'):  # (it averaged into them)
    assert cli.main(['average', '--workdir', str(folder), '--last', '1']) == 1
    assert capsys.readouterr().err == (
        f'error: {folder}: is a checkpoint folder, where a training workdir belongs.\n')
    assert not (folder / 'average-last1').exists()


def test_resume_state_is_kept_until_its_replacement_commits(tmp_path):
  """keep_train_state=1: step 2's optimiser state stays while step 4 is being saved (a kill -9
  then left no resumable checkpoint, and the rerun started from step 0), and goes once 4 has
  committed."""
  state = jax.device_get(train.create_train_state(CFG, jax.random.key(0)))
  manager = checkpoint.make_manager(tmp_path)
  item = {'opt_state': state.opt_state, 'step': 0, 'rng': np.zeros(2, np.uint32)}
  meta = checkpoint.make_meta(CFG, b'spm')
  for step in (2, 4):
    checkpoint.save(manager, step, params=state.params, meta=meta, train=item)
    if step == 2:
      manager.wait_until_finished()
  assert checkpoint.drop_old_train_state(manager, 1, saving=4) == []  # 4 not yet committed
  assert (tmp_path / '2' / 'train').is_dir()
  manager.wait_until_finished()
  assert checkpoint.drop_old_train_state(manager, 1) == [2]
  assert not (tmp_path / '2' / 'train').exists() and (tmp_path / '4' / 'train').is_dir()
