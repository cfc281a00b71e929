"""jaxformer.export: the plain folder and CTranslate2, checked against jaxformer's own decoding."""

import importlib.util
import json
import os
import pathlib
import re
import socket
import stat
import subprocess
import sys

import jax
import numpy as np
import pytest
from helpers import hold_lock, one_line_error, synthetic_text

from jaxformer import checkpoint, cli, config, data, export, train, translation

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'experiments'))
from bench.decode import compare_ctranslate2  # noqa: E402


@pytest.mark.slow
def test_ctranslate2_decodes_the_same_ids_greedy_and_beam4(demo_sized, tmp_path):
  workdir, sentences = demo_sized
  out = tmp_path / 'ct2'
  assert cli.main(['export', str(workdir), str(out), '--format', 'ctranslate2']) == 0
  assert {'model.bin', 'config.json', 'shared_vocabulary.json', 'spm.model'} <= {
      p.name for p in out.iterdir()}
  translator = translation.Translator.from_checkpoint(str(workdir))
  assert sum(map(len, translator.translate_ids(sentences))) > 5 * len(sentences)  # real output
  report = compare_ctranslate2(translator, out, sentences, repeats=1,
                               variants=())  # agreement, not speed (test_commands: variants)
  assert report['greedy']['same_output'] >= 0.99, report
  assert report['beam4']['same_output'] >= 0.99, report


def test_ctranslate2_scores_what_jaxformer_scores(workdir, tmp_path):
  """`Translator.score` (forced decoding) against CTranslate2's score_batch on the export of
  the same model: every token's log-probability, EOS included, to float32 rounding."""
  import ctranslate2  # pylint: disable=g-import-not-at-top  (a test dependency)
  out = tmp_path / 'ct2'
  assert cli.main(['export', '--model', str(workdir), str(out), '--format', 'ctranslate2']) == 0
  translator = translation.Translator.from_checkpoint(str(workdir), batch_size=4)
  sources = ['the man sees a dog', 'a small red house under the garden with a big cat', 'dog']
  targets = ['der mann sieht einen hund', 'ein kleines rotes haus', 'hund hund hund hund']
  tok = translator.tokenizer
  theirs = ctranslate2.Translator(str(out), device='cpu').score_batch(
      [tok.pieces(ids + [data.EOS_ID]) for ids in tok.encode(sources)],
      [tok.pieces(ids) for ids in tok.encode(targets)])
  for ours, their in zip(translator.score(sources, targets), theirs):
    assert ours.tokens == len(their.log_probs) and their.tokens[-1] == '</s>'
    np.testing.assert_allclose(ours.token_log_probs, their.log_probs, atol=1e-5)


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
  with pytest.raises(checkpoint.CheckpointError, match='taken: is a file, where a new or empty '
                     'folder for the export belongs'):
    export.save_ctranslate2(tmp_path / 'taken', params, cfg, b'')
  with pytest.raises(checkpoint.CheckpointError, match='cannot create the export folder'):
    export.save_ctranslate2(tmp_path / 'taken' / 'sub', params, cfg, b'')


def test_export_without_ctranslate2_says_what_to_install(tmp_path, monkeypatch):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, 'find_spec',
                      lambda name, *a: None if name == 'ctranslate2' else real(name, *a))
  with pytest.raises(checkpoint.CheckpointError, match=r"pip install 'jaxformer\[ctranslate2\]'"):
    export.save_ctranslate2(tmp_path / 'x', {}, config.tiny(), b'')


def test_export_round_trips_through_from_pretrained(workdir, tmp_path):
  out = tmp_path / 'export'
  assert cli.main(['export', str(workdir), str(out), '--average-last', '2']) == 0
  assert sorted(p.name for p in out.iterdir()) == ['config.json', 'params.safetensors',
                                                   'spm.model']
  averaged = translation.Translator.from_checkpoint(str(workdir), average_last=2, batch_size=4)
  exported = translation.Translator.from_pretrained(str(out), batch_size=4)
  assert exported.config == averaged.config
  assert exported.tokenizer.model_proto == averaged.tokenizer.model_proto
  assert jax.tree.structure(exported.params) == jax.tree.structure(averaged.params)
  for a, b in zip(jax.tree.leaves(exported.params), jax.tree.leaves(averaged.params)):
    np.testing.assert_array_equal(a, b)
  sentences = ['the man sees a dog', 'a small red house', '']
  assert exported.translate(sentences) == averaged.translate(sentences)
  assert json.loads((out / 'config.json').read_text())['step'] == 4
  umask = os.umask(0)
  os.umask(umask)
  for path in [*out.iterdir(), workdir / 'spm.model', *workdir.glob('cache/tokens-*')]:
    want = (0o777 if path.is_dir() else 0o666) & ~umask  # before: 0600 and 0700, owner only
    assert stat.S_IMODE(path.stat().st_mode) == want, path


def test_a_damaged_or_partial_export_is_a_one_line_error(workdir, tmp_path, capsys):
  out = tmp_path / 'export'
  assert cli.main(['export', str(workdir), str(out)]) == 0
  (out / 'params.safetensors').write_bytes(b'not safetensors')
  with pytest.raises(checkpoint.CheckpointError, match='damaged export'):
    translation.Translator.from_pretrained(str(out))
  (out / 'spm.model').unlink()
  with pytest.raises(checkpoint.CheckpointError, match=r'not an exported model \(missing spm'):
    translation.Translator.from_pretrained(str(out))
  capsys.readouterr()
  assert cli.main(['translate', '--model', str(out)]) == 1
  assert capsys.readouterr().err.strip().splitlines()[-1].startswith('error: ')


@pytest.fixture
def exported(workdir, tmp_path) -> pathlib.Path:
  out = tmp_path / 'export'
  assert cli.main(['export', str(workdir), str(out)]) == 0
  return out


def _one_line_error(argv: list[str], capsys) -> str:
  capsys.readouterr()
  assert cli.main(argv) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith('error: '), err
  return err[0]


def test_an_exported_vocabulary_is_checked_against_the_model(exported, tokenizer, tmp_path,
                                                              capsys):
  """Another spm.model of the same size translated into garbage, of another size crashed."""
  recorded = json.loads((exported / 'config.json').read_text())
  assert recorded['spm_pieces'] == 400 and len(recorded['spm_sha256']) == 64
  (exported / 'spm.model').write_bytes(tokenizer.model_proto)  # 400 pieces, other text
  assert re.search(r'spm\.model is not the vocabulary this model was exported with \(sha256 '
                   r'\w{12}\.\.\., recorded \w{12}\.\.\.\): put the exported spm\.model back\.$',
                   _one_line_error(['translate', '--model', str(exported)], capsys))
  other = data.train_tokenizer(synthetic_text(300).src, tmp_path / 'small.model', 300)
  (exported / 'spm.model').write_bytes(other.model_proto)
  del recorded['spm_sha256']  # as exports made before the hash was recorded
  (exported / 'config.json').write_text(json.dumps(recorded))
  assert _one_line_error(['translate', '--model', str(exported)], capsys).endswith(
      "spm.model has 300 pieces but the model has vocab_size=400: it is not this model's "
      'vocabulary.')


def test_a_config_that_does_not_fit_the_params_names_the_first_difference(exported, capsys):
  recorded = json.loads((exported / 'config.json').read_text())
  recorded['model']['d_ff'] *= 2
  (exported / 'config.json').write_text(json.dumps(recorded))
  assert re.search(r'params\.safetensors does not fit config\.json \(decoder/layers_0/ffn/\w+/'
                   r'\w+: \([\d, ]+\) where the model has \([\d, ]+\)\)\.$',
                   _one_line_error(['eval', '--model', str(exported), '--src', str(exported /
                                    'config.json'), '--ref', str(exported / 'config.json')],
                                   capsys))


def test_options_that_do_not_apply_to_an_exported_folder_are_refused(exported, capsys):
  assert _one_line_error(['translate', '--model', str(exported), '--average-last', '2'],
                         capsys).endswith('is an exported model (one set of params).')
  with pytest.raises(SystemExit):
    cli.main(['translate', '--model', str(exported), '--extra-length', '-1'])
  assert "--extra-length: must be an integer in [0, 100000], got '-1'" in capsys.readouterr().err
  (exported / 'spm.model').unlink()  # a folder without its vocabulary is not "no checkpoint"
  assert _one_line_error(['export', '--model', str(exported), str(exported.parent / 'again')],
                         capsys).endswith('not an exported model (missing spm.model); '
                                          '`jaxformer export WORKDIR OUT` writes one.')


def test_one_export_into_a_folder_at_a_time(workdir, tmp_path, capsys):
  """An export into a folder another export is writing is refused in one line naming it."""
  out = tmp_path / 'export'
  out.mkdir()
  holder = hold_lock(tmp_path, 'writing export')
  try:
    assert _one_line_error(['export', '--model', str(workdir), str(out)], capsys) == (
        f'error: {tmp_path} is in use: writing export by pid {holder.pid} on '
        f'{socket.gethostname()} holds it. Wait for that to end, or use another folder.')
  finally:
    holder.kill()
    holder.wait()
  assert cli.main(['export', '--model', str(workdir), str(out)]) == 0


def test_an_export_killed_while_its_files_move_in_is_replaced_by_the_next(workdir, tmp_path):
  """A new export is one rename of its whole folder. Into a folder that held an export, the
  files move in under a marker: killed between two moves (tests/faults.py), the folder is
  'an unfinished export' in one line wherever a model is read, and the next export, without
  --overwrite, replaces it (it was refused as 'a folder', the user cleaning up by hand)."""
  out = tmp_path / 'export'
  assert cli.main(['export', '--model', str(workdir), str(out)]) == 0
  assert not (tmp_path / '.export.partial').exists()  # (renamed whole into place)
  killed = subprocess.run([sys.executable, str(ROOT / 'tests' / 'faults.py'),
                           'killed-mid-export-move', 'export', '--model', str(workdir),
                           str(out), '--overwrite'], capture_output=True, text=True, timeout=300)
  assert killed.returncode == 137, killed.stderr[-2000:]
  said = (f'{out}: is an unfinished export (its writing was stopped; export into it again, '
          'with or without --overwrite), where')
  for argv in (['translate', '--model', str(out)], ['score', '--model', str(out), '--src',
                                                    str(out / 'config.json'), '--tgt',
                                                    str(out / 'config.json')]):
    assert one_line_error(*argv).startswith(f'error: {said}')
  assert cli.main(['export', '--model', str(workdir), str(out)]) == 0
  assert not (out / '.jaxformer-unfinished').exists()
  assert translation.Translator.from_pretrained(str(out)).translate(['the dog'])
