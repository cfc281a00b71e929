"""jaxformer.data.pipeline: a run's data prepared once, checked before any work."""

import pathlib
import subprocess
import sys

import numpy as np
import pytest
from helpers import CFG, TEXT, synthetic_text
from helpers import train_settings as _tc

from jaxformer import config, data, files, trainer


def test_row_len_shorter_than_max_len_is_refused_before_any_work(tmp_path):
  with pytest.raises(config.SettingError, match=r'^row_len=16 is shorter than max_len=64: the '
                     r'longest pairs would not fit in a row; make row_len \(--row-len\) 64 or '
                     r'more\.$'):
    trainer.train(CFG, _tc(row_len=16), tmp_path / 'w', TEXT)
  assert not (tmp_path / 'w').exists()


def test_a_workdir_that_cannot_be_made_is_a_one_line_error(tmp_path):
  (tmp_path / 'file').write_text('not a folder')
  for workdir, message in ((tmp_path / 'file', 'is a file, where a training workdir belongs'),
                           (tmp_path / 'file' / 'sub', r'cannot be the workdir \(Not a '
                            r'directory\)')):
    with pytest.raises(files.WorkdirError, match=rf'^{workdir}: {message}'):
      trainer.train(CFG, _tc(), workdir, TEXT)


def test_a_run_stopped_before_its_first_checkpoint_refuses_another_corpus(tmp_path):
  """The vocabulary records what it was trained on: a restart on other data before any
  checkpoint pins it gets a one-line error instead of silently reusing it."""
  data.pipeline.build(tmp_path, CFG, _tc(), TEXT)  # then stopped: no checkpoint
  with pytest.raises(data.DataError, match=r'spm\.model was trained on other data or settings '
                     r'\(corpus .*\): use a new workdir'):
    trainer.train(CFG, _tc(), tmp_path, synthetic_text(400, seed=99))


_PREPARE_CHILD = """
import logging, sys
logging.basicConfig(level=logging.INFO)
sys.path.insert(0, sys.argv[2])
from helpers import synthetic_text
from jaxformer import data
data.pipeline.prepare(__import__('pathlib').Path(sys.argv[1]), synthetic_text(3000, seed=4),
                      None, vocab_size=300, max_len=64, sample_size=10_000, seed=0)
"""


def test_processes_sharing_a_workdir_prepare_it_once(tmp_path):
  """The workdir's lock: of three processes started together, one trains the vocabulary and
  tokenises; the others wait for it, then load."""
  tests = pathlib.Path(__file__).parent
  workers = [subprocess.Popen([sys.executable, '-c', _PREPARE_CHILD, str(tmp_path), str(tests)],
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
  logs = ''.join(w.communicate(timeout=120)[1] for w in workers)
  assert all(w.returncode == 0 for w in workers), logs[-2000:]
  assert logs.count('training a 300-piece vocabulary') == 1, logs[-2000:]
  assert logs.count('read 3000 pairs, kept') == 1
  assert len(list((tmp_path / 'cache').iterdir())) == 1


def test_workdirs_on_separate_disks_prepare_the_same_data(tmp_path):
  """One process per host prepares its own disk's workdir: the same vocabulary file and the
  same cache, so hosts agree without sharing files."""
  text = synthetic_text(3000, seed=4)
  prepared = [data.pipeline.prepare(tmp_path / host, text, None, vocab_size=300, max_len=64,
                                    sample_size=2000, seed=0) for host in ('a', 'b')]
  assert (tmp_path / 'a' / 'spm.model').read_bytes() == (tmp_path / 'b' / 'spm.model').read_bytes()
  (_, a, _), (_, b, _) = prepared
  assert a.fingerprint == b.fingerprint
  for name in ('src_tokens', 'src_offsets', 'tgt_tokens', 'tgt_offsets'):
    np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


def test_validation_pairs_longer_than_the_training_rows_fit_the_rows(tmp_path):
  """Short training sources and a long validation source: the source rows, a share sized by the
  training pairs, now cover the validation pairs too (before: "a pair is longer than the rows"
  at the first evaluation, hours into a run)."""
  words = TEXT.src[0].split() * 20
  train_pairs = data.ParallelText([s.split()[0] for s in TEXT.src[:600]], TEXT.tgt[:600],
                                  origin='short sources')
  validation = data.ParallelText([' '.join(words[:45])], [TEXT.tgt[0]], origin='long source')
  pipeline = data.pipeline.build(tmp_path, CFG, _tc(), train_pairs, validation)
  assert pipeline.src_len < pipeline.tgt_len == 64  # the source side gets a share
  assert pipeline.src_len >= int(pipeline.validation.src_lengths.max()) > 16
  batches = list(pipeline.validation_batches())
  assert sum(int((b['src_segments'] > 0).any(axis=-1).sum()) for b in batches) == 1
