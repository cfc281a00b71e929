"""The training loop's guards: non-finite losses, bad settings, a workdir that cannot be made,
resuming on changed data or another host count, and when hosts agree."""

import json

import jax
import numpy as np
import pytest

from helpers import poison_third_batch as _poison_third_batch
from helpers import synthetic_text, train_settings as _tc
from jaxformer import checkpoint, config, data, optim, trainer

TEXT = synthetic_text(1500)
CFG = config.tiny(vocab_size=400)


def test_nan_guard_stops_and_names_the_step(tmp_path, monkeypatch):
  _poison_third_batch(monkeypatch)
  with pytest.raises(trainer.TrainingError,
                     match=r'non-finite loss \(nan\) at step 3\. The last good checkpoint is '
                           r'.*checkpoints/2'):
    trainer.train(CFG, _tc(num_steps=4), tmp_path, TEXT)


def test_skip_nonfinite_skips_and_counts(tmp_path, monkeypatch):
  _poison_third_batch(monkeypatch)
  summary = trainer.train(CFG, _tc(num_steps=4, skip_nonfinite=True), tmp_path, TEXT)
  assert summary['skipped_updates'] == 1 and summary['step'] == 4
  params, *_ = checkpoint.load(tmp_path)
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(params))


def test_logged_lr_is_the_rate_applied_after_a_skipped_update(tmp_path, monkeypatch):
  """Step 3 is skipped: the optimiser's count stays at 2, so steps 3 and 4 both log (and step 4
  applies) the schedule at count 2, not at state.step."""
  _poison_third_batch(monkeypatch)
  trainer.train(CFG, _tc(num_steps=4, skip_nonfinite=True, log_every_steps=1), tmp_path, TEXT)
  logged = {r['step']: r['lr'] for r in map(json.loads, (tmp_path / 'metrics.jsonl').open())
            if r['split'] == 'train'}
  schedule = optim.lrate_schedule(CFG.d_model, CFG.warmup_steps)
  expected = {1: schedule(0), 2: schedule(1), 3: schedule(2), 4: schedule(2)}
  assert logged == pytest.approx({k: float(v) for k, v in expected.items()}, rel=1e-6)


def test_row_len_shorter_than_max_len_is_refused_before_any_work(tmp_path):
  with pytest.raises(config.SettingError, match=r'^row_len=16 is shorter than max_len=64: the '
                     r'longest pairs would not fit in a row; set row_len >= max_len\.$'):
    trainer.train(CFG, _tc(row_len=16), tmp_path / 'w', TEXT)
  assert not (tmp_path / 'w').exists()


def test_a_workdir_that_cannot_be_made_is_a_one_line_error(tmp_path):
  (tmp_path / 'file').write_text('not a folder')
  for workdir, reason in ((tmp_path / 'file', 'File exists'),
                          (tmp_path / 'file' / 'sub', 'Not a directory')):
    with pytest.raises(data.DataError,
                       match=rf'^{workdir}: cannot be the workdir \({reason}\)'):
      trainer.train(CFG, _tc(), workdir, TEXT)


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


def test_a_run_stopped_before_its_first_checkpoint_refuses_another_corpus(tmp_path):
  """The vocabulary records what it was trained on: a restart on other data before any
  checkpoint pins it gets a one-line error instead of silently reusing it."""
  data.pipeline.build(tmp_path, CFG, _tc(), TEXT)  # then stopped: no checkpoint
  with pytest.raises(data.DataError, match=r'spm\.model was trained on other data or settings '
                     r'\(corpus .*\): use a new workdir'):
    trainer.train(CFG, _tc(), tmp_path, synthetic_text(400, seed=99))


def test_a_change_of_host_count_or_corpus_in_the_data_position(tmp_path, caplog):
  corpus = data.tokenize_corpus(
      TEXT, data.train_tokenizer(TEXT.src + TEXT.tgt, tmp_path / 'spm.model', 400), 64)
  batches = data.PackedBatches(corpus, src_len=64, tgt_len=64, rows_per_device=4)
  saved = dict(batches.get_state(), row=12)
  settings = _tc()
  trainer.resume_data(batches, [saved], settings)
  assert batches.get_state() == saved
  fresh = data.PackedBatches(corpus, src_len=64, tgt_len=64, rows_per_device=4)
  with caplog.at_level('WARNING', logger='jaxformer.trainer'):
    trainer.resume_data(fresh, [saved, saved], settings)  # written by 2 hosts, resumed on 1
  assert fresh.get_state()['row'] == 0
  assert 'written by 2 host(s) and this run has 1' in caplog.text
  older = {key: saved[key] for key in ('epoch', 'row', 'seed', 'shard_size')}  # jaxformer 0.1
  with caplog.at_level('WARNING', logger='jaxformer.trainer'):
    trainer.resume_data(fresh, [older], settings)
  assert fresh.get_state()['row'] == 0 and 'from an older jaxformer' in caplog.text
  other_corpus = dict(saved, shard_size=saved['shard_size'] + 7)  # another corpus, same seed
  with pytest.raises(trainer.TrainingError, match=r'\(training pairs per host '
                     rf'{saved["shard_size"] + 7} -> {saved["shard_size"]}\)'):
    trainer.resume_data(fresh, [other_corpus], settings)


def test_hosts_agree_every_n_steps_and_at_the_end():
  settings = _tc(num_steps=25, host_sync_every_steps=10)
  assert [s for s in range(1, 26) if trainer.host_sync_due(s, settings, 2)] == [10, 20, 25]
  assert all(trainer.host_sync_due(s, settings, 1) for s in range(1, 26))  # one host: free
