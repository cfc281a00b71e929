"""jaxformer.resume: a run's checkpoints, resuming exactly (data included), changes since
the checkpoint, and the averages at a run's end."""

import json
import shutil

import jax
import numpy as np
import pytest
from helpers import (
  CFG,
  TESTS,
  TEXT,
  assert_trees_equal,
  synthetic_text,
)
from helpers import train_settings as _tc

from jaxformer import checkpoint, config, data, optim, resume, trainer, validation


def test_resuming_with_other_row_lengths_is_a_data_change(trained, tmp_path):
  workdir = tmp_path / 'w'
  shutil.copytree(trained, workdir)
  with pytest.raises(trainer.TrainingError, match=r'the training data changed since the checkpoint '
                     r'\(.*row length 64 -> 72.*\): .* or pass --reset-data'):
    trainer.train(CFG, _tc(num_steps=8, row_len=72), workdir, TEXT)


def test_resume_continues_exactly(trained, tmp_path, monkeypatch):
  """6 steps straight equal 3 steps, a stop, and 3 more from the checkpoint (data included).
  The resume reads the state into its shapes: no fresh state is computed, only traced."""
  trainer.train(CFG, _tc(num_steps=3, checkpoint_every_steps=3), tmp_path, TEXT)
  computed, fresh_state = [], resume.create_train_state

  def watched(*args, **kwargs):
    state = fresh_state(*args, **kwargs)
    computed.append(not isinstance(jax.tree.leaves(state.params)[0], jax.core.Tracer))
    return state
  monkeypatch.setattr(resume, 'create_train_state', watched)
  summary = trainer.train(CFG, _tc(num_steps=6), tmp_path, TEXT)
  assert summary['step'] == 6 and computed == [False]
  manager = checkpoint.make_manager(trained / 'checkpoints')
  straight = checkpoint.restore(manager, 6, with_data=True)
  resumed = checkpoint.restore(checkpoint.make_manager(tmp_path / 'checkpoints'), 6,
                               with_data=True)
  assert_trees_equal(straight['params'], resumed['params'])
  assert straight['data'] == resumed['data']


def test_resumes_with_the_fast_path_and_remat(trained, tmp_path):
  """Execution fields (bf16, fused attention, remat) may differ from the checkpoint's run."""
  workdir = tmp_path / 'w'
  shutil.copytree(trained, workdir)
  summary = trainer.train(CFG.with_execution(remat=True), _tc(num_steps=8, fast_path=True), workdir,
                          TEXT)
  assert summary['step'] == 8 and np.isfinite(summary['train']['loss'])
  _, saved_config, _, step = checkpoint.load(workdir)
  assert step == 8 and saved_config == CFG.with_execution(remat=True)  # as given, not as run (bf16)


def test_resuming_on_changed_data_names_the_change_or_resets_the_stream(tmp_path, caplog):
  trainer.train(CFG, _tc(num_steps=2), tmp_path, TEXT)
  with pytest.raises(trainer.TrainingError, match=r'^the training data changed since the '
                     r'checkpoint \(seed 0 -> 1\): .* or pass --reset-data'):
    trainer.train(CFG, _tc(num_steps=4, seed=1), tmp_path, TEXT)
  with caplog.at_level('INFO', logger='jaxformer.trainer'):
    summary = trainer.train(CFG, _tc(num_steps=4, seed=1, reset_data=True), tmp_path, TEXT)
  assert summary['step'] == 4 and 'fresh data stream' in caplog.text
  assert 'training on cpu: 1 × cpu, 1 process; compute float32, einsum attention; ' in caplog.text
  restored = checkpoint.restore(checkpoint.make_manager(tmp_path / 'checkpoints'), 4,
                                with_data=True)
  assert restored['data']['hosts'][0]['seed'] == 1  # the new stream, two batches in


def test_a_change_of_host_count_or_corpus_in_the_data_position(tmp_path, caplog):
  corpus = data.tokenize_corpus(
      TEXT, data.train_tokenizer(TEXT.src + TEXT.tgt, tmp_path / 'spm.model', 400), 64)
  batches = data.PackedBatches(corpus, src_len=64, tgt_len=64, rows_per_device=4)
  saved = dict(batches.get_state(), row=12)
  settings = _tc()
  resume.resume_data(batches, [saved], settings)
  assert batches.get_state() == saved
  fresh = data.PackedBatches(corpus, src_len=64, tgt_len=64, rows_per_device=4)
  with caplog.at_level('WARNING', logger='jaxformer.trainer'):
    resume.resume_data(fresh, [saved, saved], settings)  # written by 2 hosts, resumed on 1
  assert fresh.get_state()['row'] == 0
  assert 'written by 2 host(s) and this run has 1' in caplog.text
  older = {key: saved[key] for key in ('epoch', 'row', 'seed', 'shard_size')}  # jaxformer 0.1
  with caplog.at_level('WARNING', logger='jaxformer.trainer'):
    resume.resume_data(fresh, [older], settings)
  assert fresh.get_state()['row'] == 0 and 'from an older jaxformer' in caplog.text
  other_corpus = dict(saved, shard_size=saved['shard_size'] + 7)  # another corpus, same seed
  with pytest.raises(trainer.TrainingError, match=r'\(training pairs per host '
                     rf'{saved["shard_size"] + 7} -> {saved["shard_size"]}\)'):
    resume.resume_data(fresh, [other_corpus], settings)


def test_average_best_keeps_and_averages_the_best_beside_the_newest(tmp_path, monkeypatch):
  """Validation losses 3.0, 1.0, 2.0, 1.5, 2.5, 2.8 at steps 2..12: every evaluation saves with
  its loss; the best two (steps 4 and 8) stay beside the newest two (10 and 12), and their mean
  is average-best2 (the last-2 average is made as before)."""
  losses = iter([3.0, 1.0, 2.0, 1.5, 2.5, 2.8])
  monkeypatch.setattr(validation, 'metrics', lambda *a: {'loss': next(losses)})
  summary = trainer.train(CFG, _tc(num_steps=12, eval_every_steps=2, checkpoint_every_steps=4,
                                   keep_checkpoints=2, average_last=2, average_best=2),
                          tmp_path, TEXT, synthetic_text(20, seed=9))
  assert sorted(int(p.name) for p in (tmp_path / 'checkpoints').iterdir()) == [4, 8, 10, 12]
  manager = checkpoint.open_checkpoints(tmp_path)
  assert [manager.metrics(step) for step in (4, 8, 10, 12)] == [
      {'loss': 1.0}, {'loss': 1.5}, {'loss': 2.5}, {'loss': 2.8}]
  assert checkpoint.best_steps(tmp_path, 2) == [4, 8]
  assert summary['averaged_best'].endswith('average-best2')
  params, _, _, step = checkpoint.load(summary['averaged_best'])
  assert step == 8
  assert_trees_equal(params, checkpoint.mean_params(tmp_path, [4, 8]), rtol=1e-6)
  assert summary['averaged'].endswith('average-last2')
  assert_trees_equal(checkpoint.load(summary['averaged'])[0],
                     checkpoint.mean_params(tmp_path, [10, 12]), rtol=1e-6)


def test_average_best_needs_a_validation_set(tmp_path):
  with pytest.raises(trainer.TrainingError, match='--eval-src'):
    trainer.train(CFG, _tc(average_best=2), tmp_path, TEXT)


def test_resume_may_change_the_optimisers_settings_and_logs_them(trained, tmp_path, caplog):
  """Warmup, the learning rate's scale and clipping (which changes the optimiser's chain) may
  change on a resume: it continues from the checkpoint's step and Adam state."""
  workdir = tmp_path / 'w'
  shutil.copytree(trained, workdir)
  changed = config.OptimConfig(warmup_steps=50, lr_scale=0.5, grad_clip_norm=1.0)
  with caplog.at_level('INFO'):
    summary = trainer.train(CFG, _tc(num_steps=8, log_every_steps=1), workdir, TEXT,
                            optim=changed)
  assert summary['step'] == 8 and 'resumed from step 6' in caplog.text
  assert ('optimiser settings changed since the checkpoint: warmup_steps 4000 -> 50; lr_scale '
          '1.0 -> 0.5; grad_clip_norm None -> 1.0.') in caplog.text
  restored = checkpoint.restore(checkpoint.make_manager(workdir / 'checkpoints'), 8)
  assert checkpoint.meta_optim(restored['meta']) == changed
  lr = [json.loads(line)['lr'] for line in (workdir / 'metrics.jsonl').open()
        if json.loads(line).get('step') == 7 and json.loads(line).get('split') == 'train'][0]
  assert lr == pytest.approx(0.5 * float(optim.inverse_sqrt_schedule(
      CFG.d_model ** -0.5 * 50 ** -0.5, 50)(6)), rel=1e-6)  # the applied count continues at 6


OLD_WORKDIR = TESTS / 'fixtures' / 'old-0.1.0'


def test_a_workdir_of_jaxformer_0_1_0_loads_and_resumes(tmp_path, caplog):
  """tests/fixtures/old-0.1.0 was written by jaxformer 0.1.0 (make_old_workdir.py there),
  whose checkpoints kept the optimiser's settings among the model's: they load for decoding,
  and a run resumes from them with their settings read as OptimConfig."""
  params, cfg, _, step = checkpoint.load(OLD_WORKDIR)
  assert step == 2 and cfg == config.TransformerConfig(
      vocab_size=320, num_layers=1, d_model=16, d_ff=32, num_heads=2, max_len=64)
  meta = checkpoint.newest_meta(OLD_WORKDIR)[1]
  assert checkpoint.meta_optim(meta) == config.OptimConfig(warmup_steps=100)
  workdir = tmp_path / 'old'
  shutil.copytree(OLD_WORKDIR, workdir)
  settings = config.TrainConfig(num_steps=3, tokens_per_batch=1024, row_len=64,
                                checkpoint_every_steps=1, checkpoint_every_secs=None,
                                average_last=0, log_every_steps=1, sample_translations=0)
  with caplog.at_level('INFO'):
    summary = trainer.train(cfg, settings, workdir, TEXT, optim=config.OptimConfig(
        warmup_steps=100))
  assert summary['step'] == 3 and 'resumed from step 2' in caplog.text
  assert 'optimiser settings changed' not in caplog.text


def test_a_short_run_averages_the_checkpoints_it_has_and_says_where(tmp_path, caplog,
                                                                   monkeypatch):
  """Two checkpoints where average_last asks for 5: both are averaged, into average-last2. The
  summary's paths are spelled as the workdir was given (the checkpoint's was absolute)."""
  monkeypatch.chdir(tmp_path)
  with caplog.at_level('WARNING'):
    summary = trainer.train(CFG, _tc(num_steps=4, average_last=5), 'w', TEXT)
  assert (summary['averaged'], summary['checkpoint']) == ('w/average-last2', 'w/checkpoints/4')
  manager = checkpoint.make_manager(tmp_path / 'w' / 'checkpoints')
  expected = jax.tree.map(lambda a, b: (np.asarray(a) + np.asarray(b)) / 2,
                          *[checkpoint.restore(manager, s)['params'] for s in (2, 4)])
  assert_trees_equal(checkpoint.load(summary['averaged'])[0], expected, rtol=1e-6)
  assert ('the run saved 2 checkpoint(s), fewer than average_last=5: averaged those into '
          'w/average-last2; use that path next.') in caplog.messages
