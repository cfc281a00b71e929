"""jaxformer.checkpoint: what is kept, averaging, compatibility, damaged checkpoints."""

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import CFG, TEXT, assert_trees_equal, synthetic_text
from helpers import train_settings as _tc

from jaxformer import checkpoint, data, train, trainer
from jaxformer import config as config_lib
from jaxformer.model import Transformer


def test_checkpoints_accept_other_execution_fields_only():
  meta = checkpoint.make_meta(config_lib.base(), b'spm')
  fast = config_lib.base().with_execution(remat=True, loss_chunk=4096, dtype=jnp.bfloat16)
  checkpoint.check_compatible(meta, 'ckpt', config=fast, spm_model=b'spm')  # no error
  with pytest.raises(checkpoint.IncompatibleCheckpointError, match='d_ff'):
    checkpoint.check_compatible(meta, 'ckpt', config=fast.replace(d_ff=1024), spm_model=b'spm')


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
