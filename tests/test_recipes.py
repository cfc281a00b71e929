"""jaxformer.recipes: the shipped recipes, Table 3 variants and --set overrides."""

import dataclasses
import pathlib
import re
import subprocess
import sys

import jax.numpy as jnp
import pytest

from jaxformer import cli, config, recipes
from jaxformer import config as config_lib
from jaxformer import model as model_lib
from jaxformer.recipes import table3


def _formula(v, n, d, f, h, dk, dv, learned_positions=False, max_len=256) -> int:
  """Tied V x D embedding; biases on every projection; LayerNorm scale + bias per sub-layer."""
  attention = (d * h * dk + h * dk) * 2 + (d * h * dv + h * dv) + (h * dv * d + d)
  ffn = d * f + f + f * d + d
  encoder_layer = attention + ffn + 2 * 2 * d
  decoder_layer = 2 * attention + ffn + 3 * 2 * d
  positions = 2 * max_len * d if learned_positions else 0
  return v * d + n * (encoder_layer + decoder_layer) + positions


@pytest.mark.parametrize('name', list(table3.VARIANTS))
def test_variant_parameter_count_matches_the_formula(name):
  cfg = table3.variant_config(name)
  expected = _formula(37000, cfg.num_layers, cfg.d_model, cfg.d_ff, cfg.num_heads, cfg.key_dim,
                      cfg.value_dim, cfg.learned_positions, cfg.max_len)
  assert model_lib.parameter_count(cfg) == expected


def test_variants_change_only_their_row():
  """Each row changes the model's fields it names, or (D3, D4: label smoothing) the optimiser's,
  and nothing else."""
  base = config_lib.base()
  for name, row in table3.VARIANTS.items():
    cfg, optim = table3.variant_config(name), table3.optim_overrides(name)
    model_changes = {k: v for k, v in row.changes.items() if k not in optim}
    changed = {k for k in model_changes if getattr(cfg, k) != getattr(base, k)}
    assert {k: getattr(cfg, k) for k in changed} == {k: model_changes[k] for k in changed}
    assert cfg.replace(**{k: getattr(base, k) for k in model_changes}) == base
    assert optim == {k: v for k, v in row.changes.items() if k == 'label_smoothing'}
  assert table3.optim_overrides('D4') == {'label_smoothing': 0.2}
  assert recipes.load('base', 'D4').optim == config_lib.OptimConfig(label_smoothing=0.2)
  assert table3.variant_config('big') == config_lib.big()
  assert table3.train_overrides('big')['num_steps'] == 300_000
  with pytest.raises(ValueError, match='unknown Table 3 variant'):
    table3.variant_config('Z9')


def test_docs_table_is_the_generated_one():
  readme = (pathlib.Path(__file__).resolve().parents[1] / 'docs' / 'table3.md').read_text()
  assert table3.markdown_table() in readme
  low, high = table3.matching_vocabulary()
  assert f'{low:,.0f} <= V <= {high:,.0f}' in readme


def test_table3_module_prints_its_table_without_warnings():
  result = subprocess.run([sys.executable, '-W', 'default', '-m', 'jaxformer.recipes.table3'],
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 0 and result.stderr == ''  # runpy's RuntimeWarning was here
  assert result.stdout.startswith('| row | changes from base | jaxformer params |')


def _recipe(*argv: str):
  return cli.recipe_of(cli.build_parser().parse_args(['train', '--workdir', 'w', *argv]))


def test_train_command_selects_a_variant():
  recipe = _recipe('--config', 'base', '--variant', 'C3')
  assert recipe.model == table3.variant_config('C3') and recipe.model.num_layers == 8
  assert recipe.train.num_steps == 100_000 and recipe.data.source == 'wmt14'
  recipe = _recipe('--config', 'base', '--variant', 'big', '--num-steps', '7')
  assert recipe.model == config_lib.big() and recipe.train.num_steps == 7
  assert recipe.train.average_last == 20


def test_an_unknown_variant_is_a_one_line_error(capsys):
  assert cli.main(['train', '--config', 'base', '--workdir', 'w', '--variant', 'Z9']) == 1
  assert capsys.readouterr().err.startswith("error: unknown Table 3 variant 'Z9'")


@pytest.mark.parametrize('config,variant', [
    ('big', None), ('big_enfr', None), ('base', 'E'), ('base', 'big'), ('demo', None),
    ('multi30k', None), ('multi30k_gpu', None)])
def test_only_the_paper_recipes_require_an_accelerator(config, variant):
  argv = ['train', '--config', config, '--workdir', 'w']
  args = cli.build_parser().parse_args(argv + (['--variant', variant] if variant else []))
  assert cli.recipe_of(args).train.require_accelerator == (
      config not in ('demo', 'multi30k'))
  for flag in ('--allow-cpu', '--allow-cpu', '--no-require-accelerator'):
    assert not cli.recipe_of(cli.build_parser().parse_args(argv + [flag])).train.require_accelerator


@pytest.mark.parametrize('config_text,message', [
    ('raise RuntimeError("broken")\n', r'cannot load the config \(RuntimeError: broken\)\.$'),
    ('def get_config():\n  return {"model": 1}\n', r"must return a dict with 'model', 'train'"),
    ('from jaxformer import config\ndef get_config():\n  return {"model": config.tiny(), '
     '"train": {"num_step": 5}, "data": {"source": "text"}}\n',
     r"unknown setting train.num_step; valid train settings: num_steps, tokens_per_batch, "),
    ('from jaxformer import config\ndef get_config():\n  return {"model": config.tiny(), '
     '"train": {"num_steps": "5"}, "data": {"source": "text"}}\n',
     r"bad\.py: train\.num_steps must be int, got str '5'\.$"),
    ('def get_config():\n  return {"model": {"d_model": 64}, "train": {}, "data": {}}\n',
     r"\['model'\] must be a TransformerConfig \(e\.g\. jaxformer\.config\.base\(\)\), got dict"),
    ('from jaxformer import config\ndef get_config():\n  return {"model": config.tiny(), '
     '"train": [], "data": {}}\n', r"\['train'\] must be a dict of settings, got list")])
def test_train_reports_a_bad_config_file_in_one_line(tmp_path, capsys, config_text, message):
  (tmp_path / 'bad.py').write_text(config_text)
  assert cli.main(['train', '--config', str(tmp_path / 'bad.py'), '--workdir',
                   str(tmp_path / 'w')]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith('error: ') and re.search(message, err[0]), err
  assert not (tmp_path / 'w').exists()


def test_every_setting_can_be_set_from_the_command_line():
  def recipe(*argv):
    return cli.recipe_of(cli.build_parser().parse_args(
        ['train', '--config', 'demo', '--workdir', 'w', *argv]))
  changed = recipe('--set', 'model.dropout_rate=0.2', '--set', 'train.num_steps=5000',
                   '--set', 'model.vocab_size=8000', '--set', 'model.qk_dim=none',
                   '--set', 'model.execution.dtype=bfloat16', '--set', 'model.pre_ln=true',
                   '--set', 'train.checkpoint_every_secs=none', '--set', 'data.train_pairs=10',
                   '--spm-sample-size', '77', '--fast-path', '--source', 'text', '--train_src',
                   'a.en', '--train-tgt', 'a.de', '--eval-src', 'v.en', '--eval-tgt', 'v.de')
  assert changed.model == recipes.load('demo').model.replace(
      dropout_rate=0.2, vocab_size=8000, pre_ln=True).with_execution(dtype=jnp.bfloat16)
  assert changed.train == dataclasses.replace(
      recipes.load('demo').train, num_steps=5000, checkpoint_every_secs=None,
      spm_sample_size=77, fast_path=True)
  assert changed.data.train_pairs == 10 and changed.data.train_src == 'a.en'
  # Training files of a source that does not read them, or BLEU with no validation set to
  # score, are refused rather than ignored.
  with pytest.raises(config.SettingError, match="read only from a text source, and this one is"):
    recipe('--train-src', 'a.en', '--train-tgt', 'a.de')
  with pytest.raises(config.SettingError, match=r'^bleu_sentences needs a validation set: give '
                     r'--eval-src and --eval-tgt, or set bleu_sentences to 0\.$'):
    recipe('--source', 'text', '--train-src', 'a.en', '--train-tgt', 'a.de')
  with pytest.raises(config.SettingError, match='^patience needs a validation set'):
    recipe('--set', 'data.validation_pairs=0', '--bleu-sentences', '0', '--patience', '2')
  # --set wins over the shortcut flags; every field of every section has a name.
  assert recipe('--num-steps', '3', '--set', 'train.num_steps=4').train.num_steps == 4
  for section, cls in (('model', config.TransformerConfig), ('train', config.TrainConfig),
                       ('data', config.DataConfig)):
    names = {name.split('.')[0] for name in recipes.settable(section)}
    assert names == {f.name for f in dataclasses.fields(cls)}
