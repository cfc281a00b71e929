"""`jaxformer export --format ctranslate2`: CTranslate2 decodes the same weights to the same ids."""

import dataclasses
import importlib.util
import pathlib
import sys

import jax
import pytest

from jaxformer import checkpoint, cli, config, export, recipes, train, trainer, translation
from jaxformer.data import embedded

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'experiments'))
from bench.decode import compare_ctranslate2  # noqa: E402


@pytest.fixture(scope='module')
def demo_sized(tmp_path_factory) -> tuple[pathlib.Path, list[str]]:
  """The demo recipe's model (N=3, d_model 128, V=1000) trained briefly on the embedded
  corpus: enough for real, varied translations; and its held-out test sentences."""
  workdir = tmp_path_factory.mktemp('demo_sized')
  recipe = recipes.load('demo')
  corpus = embedded.splits(6000, 10, 200)
  settings = dataclasses.replace(
      recipe.train, num_steps=150, checkpoint_every_steps=150, average_last=0, bleu_sentences=0,
      sample_translations=0, spm_sample_size=12_000, log_every_steps=50)
  trainer.train(recipe.model, settings, workdir, corpus['train'])
  return workdir, corpus['test'].src[:100]


@pytest.mark.slow
def test_ctranslate2_decodes_the_same_ids_greedy_and_beam4(demo_sized, tmp_path):
  workdir, sentences = demo_sized
  out = tmp_path / 'ct2'
  assert cli.main(['export', str(workdir), str(out), '--format', 'ctranslate2']) == 0
  assert {'model.bin', 'config.json', 'shared_vocabulary.json', 'spm.model'} <= {
      p.name for p in out.iterdir()}
  translator = translation.Translator.from_checkpoint(str(workdir))
  assert sum(map(len, translator.translate_ids(sentences))) > 5 * len(sentences)  # real output
  report = compare_ctranslate2(translator, out, sentences, repeats=1)  # agreement, not speed
  assert report['greedy']['same_output'] >= 0.99, report
  assert report['beam4']['same_output'] >= 0.99, report


def test_export_refuses_what_ctranslate2_cannot_compute(tmp_path):
  cfg = config.tiny().replace(qk_dim=4, v_dim=8)
  params = train.create_train_state(cfg, jax.random.key(0)).params
  with pytest.raises(checkpoint.CheckpointError, match=r'no Transformer with d_k \(4\) != d_v'):
    export.save_ctranslate2(tmp_path / 'x', params, cfg, b'')
  window = config.tiny().replace(attention_window=3)
  with pytest.raises(checkpoint.CheckpointError, match='restricted self-attention'):
    export.save_ctranslate2(tmp_path / 'x', params, window, b'')


def test_export_into_a_file_is_a_one_line_error(tmp_path):
  cfg = config.tiny()
  params = train.create_train_state(cfg, jax.random.key(0)).params
  (tmp_path / 'taken').write_text('')
  with pytest.raises(checkpoint.CheckpointError, match='cannot create the export folder'):
    export.save_ctranslate2(tmp_path / 'taken', params, cfg, b'')


def test_export_without_ctranslate2_says_what_to_install(tmp_path, monkeypatch):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, 'find_spec',
                      lambda name, *a: None if name == 'ctranslate2' else real(name, *a))
  with pytest.raises(checkpoint.CheckpointError, match=r"pip install 'jaxformer\[ctranslate2\]'"):
    export.save_ctranslate2(tmp_path / 'x', {}, config.tiny(), b'')
