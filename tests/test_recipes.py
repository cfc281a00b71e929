"""jaxformer.recipes: the shipped recipes, Table 3 variants and --set overrides."""

import dataclasses
import json
import pathlib
import re
import subprocess
import sys

import jax.numpy as jnp
import pytest
from helpers import assert_log_lines

from jaxformer import cli, commands, config, data, files, recipes
from jaxformer import config as config_lib
from jaxformer import model as model_lib
from jaxformer.recipes import auto, table3


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
  return commands.recipe_of(cli.build_parser().parse_args(['train', '--workdir', 'w', *argv]))


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
  assert commands.recipe_of(args).train.require_accelerator == (
      config not in ('demo', 'multi30k'))
  for flag in ('--allow-cpu', '--allow-cpu', '--no-require-accelerator'):
    args = cli.build_parser().parse_args(argv + [flag])
    assert not commands.recipe_of(args).train.require_accelerator


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
     '"train": [], "data": {}}\n', r"\['train'\] must be a dict of settings, got list"),
    ('from jaxformer import config\ndef get_config():\n  return {"model": '
     'config.TransformerConfig(warmup_steps=400), "train": {}, "data": {}}\n',
     r"unexpected keyword argument 'warmup_steps'\)\. \(warmup_steps is an optimisation setting "
     r"now: return it in get_config\(\)\['optim'\]\)$"),
    ('from jaxformer import config\ndef get_config():\n  return {"model": config.tiny(), '
     '"train": {}, "data": {}, "optim": {"warmup": 4}}\n',
     r'unknown setting optim\.warmup; valid optim settings: warmup_steps, ')])
def test_train_reports_a_bad_config_file_in_one_line(tmp_path, capsys, config_text, message):
  (tmp_path / 'bad.py').write_text(config_text)
  assert cli.main(['train', '--config', str(tmp_path / 'bad.py'), '--workdir',
                   str(tmp_path / 'w')]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith('error: ') and re.search(message, err[0]), err
  assert not (tmp_path / 'w').exists()


def test_every_setting_can_be_set_from_the_command_line():
  def recipe(*argv):
    return commands.recipe_of(cli.build_parser().parse_args(
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


# --- the automatic recipe -----------------------------------------------------------------------


def _corpus(pairs, mean=14.0, longest=42, largest=None):
  return auto.Corpus(pairs=pairs, mean_pieces=mean, long_pieces=longest, largest_vocab=largest)


@pytest.mark.parametrize('pairs,vocab,dropout,steps,warmup,every', [
    (2_000, 2000, 0.3, 350, 400, 20), (4_000, 3000, 0.3, 550, 400, 40),
    (10_000, 4500, 0.2, 950, 400, 60), (29_000, 8000, 0.2, 1750, 400, 100),
    (200_000, 21_000, 0.2, 5600, 1240, 320)])
def test_the_rule_for_a_corpus_size_on_cpu(pairs, vocab, dropout, steps, warmup, every):
  """Expected values worked out by hand from the rules (docs/own-data.md) for sentences of 14
  pieces (15 target tokens with EOS): e.g. 4k pairs: 33 * (29/4)^0.4 = 72.9 epochs of 60,000
  tokens = 533.8 steps of 8192, to the nearest 50: 550; warmup 22% = 121, but at least 400; a
  checkpoint every 550 / 18 = 30.6, up to 40 steps; vocabulary 8000 * sqrt(4/29) = 2971: 3000.
  At 200k pairs: 15.2 epochs, 5582 steps: 5600, warmup 22% = 1232, up to 1240."""
  chosen = auto.choose(_corpus(pairs), 'cpu')
  model, train, reasons = chosen.model, chosen.train, chosen.reasons
  assert (model.vocab_size, model.dropout_rate, train['num_steps'],
          chosen.optim.warmup_steps, train['checkpoint_every_steps'],
          train['eval_every_steps']) == (vocab, dropout, steps, warmup, every, 2 * every)
  assert (model.num_layers, model.d_model, model.d_ff, model.num_heads) == (4, 128, 256, 4)
  assert (model.max_len, train['row_len'], train['average_last']) == (64, 64, 5)
  assert train['checkpoint_steps_to_average'] and train['checkpoint_every_secs'] == 600
  assert len(reasons) == 6 and reasons[0].startswith(f'vocabulary   {vocab:,} pieces')


def test_at_wmt14s_size_the_rule_is_the_papers_base_recipe():
  for backend in ('cpu', 'gpu'):
    chosen = auto.choose(_corpus(4_500_000, mean=27.0, longest=120), backend)
    base = recipes.load('base')
    assert chosen.model == base.model == config_lib.base(37_000)
    assert chosen.optim == config_lib.OptimConfig() and recipes.Recipe(
        chosen.model, config_lib.TrainConfig(**chosen.train), base.data).train == \
        dataclasses.replace(base.train, require_accelerator=False)
    assert "the paper's base recipe" in chosen.reasons[0]


def test_on_a_gpu_the_model_is_wider_and_trains_twice_the_epochs():
  cpu = auto.choose(_corpus(29_000), 'cpu')
  gpu = auto.choose(_corpus(29_000), 'gpu')
  assert (gpu.model.d_model, gpu.model.d_ff, gpu.model.dropout_rate) == (256, 1024, 0.3)
  assert gpu.train['num_steps'] == pytest.approx(2 * cpu.train['num_steps'], abs=50)
  assert gpu.train['eval_every_steps'] == gpu.train['checkpoint_every_steps']


def test_the_vocabulary_is_at_most_what_sentencepiece_can_make():
  chosen = auto.choose(_corpus(4_000, largest=1800), 'cpu')
  assert chosen.model.vocab_size == 1800
  assert chosen.reasons[0].startswith('vocabulary   1,800 pieces: the most sentencepiece can make')


def test_size_measures_the_files_and_lets_settings_win(tmp_path, shared_data):
  """On real text: the first 3000 pairs of Multi30k. --set and the flags win over the rule."""
  src, tgt = (tmp_path / 'train.en', tmp_path / 'train.de')
  for path, lang in ((src, 'en'), (tgt, 'de')):
    lines = (shared_data / 'multi30k' / f'train.{lang}').read_text().splitlines(True)[:3000]
    path.write_text(''.join(lines))
  recipe = recipes.override(recipes.AUTO, [f'data.train_src={src}', f'data.train_tgt={tgt}'])
  sizing = auto.size(recipe, ['train.num_steps=7', 'model.dropout_rate=0.1'], backend='cpu')
  assert sizing.recipe.model.vocab_size == 2500 and sizing.recipe.train.num_steps == 7
  assert sizing.recipe.model.dropout_rate == 0.1 and sizing.recipe.data.train_src == str(src)
  assert sizing.reasons[0].startswith('the automatic recipe for 3,000 pairs (')
  assert sizing.reasons[-1] == ('then your settings, which win: train.num_steps=7, '
                                'model.dropout_rate=0.1')
  recorded = json.loads(auto.record(tmp_path / 'w', sizing).read_text())
  assert recorded['train']['num_steps'] == 7 and recorded['reasons'] == list(sizing.reasons)
  with pytest.raises(config_lib.SettingError, match='give --train-src and --train-tgt'):
    auto.size(recipes.AUTO, [], backend='cpu')
  (tmp_path / 'file').write_text('')
  with pytest.raises(files.WriteError, match=r'/file/recipe\.json: cannot write the recipe on '
                     r'/\S* \(File exists\)'):
    auto.record(tmp_path / 'file', sizing)  # a file where the workdir belongs


def test_a_resumed_run_keeps_its_recorded_recipe_and_does_not_measure_again(tmp_path,
                                                                           monkeypatch):
  """With checkpoints to resume, the record is the recipe (a newer jaxformer's rules, or a
  corpus measured again, cannot change what the checkpoints were trained with); --set wins."""
  chosen = auto.choose(_corpus(4_000), 'cpu')
  reasons = chosen.reasons
  data_cfg = recipes.override(recipes.AUTO, ['data.train_src=a', 'data.train_tgt=b']).data
  first = auto.Sizing(recipes.Recipe(chosen.model, config.TrainConfig(**chosen.train),
                                     data_cfg, chosen.optim), 'head', reasons, ())
  auto.record(tmp_path, first)
  assert auto.recorded(tmp_path, recipes.AUTO, []) is None  # no checkpoint yet: sized afresh
  (tmp_path / 'checkpoints' / '40').mkdir(parents=True)
  monkeypatch.setattr(auto, 'measure', lambda *args, **kwargs: pytest.fail('measured again'))
  moved = ['data.train_src=c', 'data.train_tgt=d']  # the files moved since
  again = auto.recorded(tmp_path, recipes.override(recipes.AUTO, moved),
                        [*moved, 'train.num_steps=900'])
  assert again.recipe.model == first.recipe.model and again.recipe.optim == first.recipe.optim
  assert again.recipe.train == dataclasses.replace(first.recipe.train, num_steps=900)
  assert (again.recipe.data.train_src, again.recipe.data.train_tgt) == ('c', 'd')
  assert again.reasons[1:-1] == tuple(reasons) and again.reasons[0].startswith('resuming: ')
  assert again.reasons[-1] == 'then your settings, which win: train.num_steps=900'
  auto.record(tmp_path, again)  # and the next resume reads it as well
  assert auto.recorded(tmp_path, recipes.AUTO, []).rules == tuple(reasons)
  record = json.loads((tmp_path / 'recipe.json').read_text())
  del record['rules']  # a record written before the rules had a field of their own
  (tmp_path / 'recipe.json').write_text(json.dumps(record))
  assert auto.recorded(tmp_path, recipes.AUTO, []).rules == tuple(reasons)
  (tmp_path / 'recipe.json').write_text('{"model": ')
  with pytest.raises(files.RecordError, match=r'recipe\.json: cannot read the recipe record'):
    auto.recorded(tmp_path, recipes.AUTO, [])
  (tmp_path / 'recipe.json').write_text(json.dumps({**record, 'train': None}))
  with pytest.raises(files.RecordError, match=r'recipe\.json: "train" must be an object, got '
                     r'null\.$'):
    auto.recorded(tmp_path, recipes.AUTO, [])
  (tmp_path / 'recipe.json').write_text(json.dumps({**record, 'model': {'d_model': 'wide'}}))
  with pytest.raises(config_lib.SettingError, match='damaged recipe record'):
    auto.recorded(tmp_path, recipes.AUTO, [])


def test_a_fine_tuning_run_keeps_its_parents_model_at_a_lower_learning_rate():
  parent = recipes.load('multi30k').model
  chosen = auto.choose(_corpus(2_000, mean=24.0, longest=70), 'cpu', parent)
  reasons = chosen.reasons
  # max_len covers the new sentences (sinusoidal positions have no table to outgrow)
  assert chosen.model == parent.replace(max_len=72)
  assert chosen.optim == config_lib.OptimConfig(lr_scale=auto.FINE_TUNE_LR_SCALE,
                                                warmup_steps=400)
  assert chosen.train['row_len'] == 96 and chosen.train['num_steps'] == 600  # 587
  learned = parent.replace(learned_positions=True)
  assert auto.choose(_corpus(2_000, mean=24.0, longest=70), 'cpu', learned).model == learned
  assert reasons[0].startswith("model        the parent's (N=4, d_model 128, 8,000 pieces")
  assert not any(r.startswith('vocabulary') for r in reasons)
  assert auto.choose(_corpus(4_500_000), 'cpu', parent).model == parent  # never base
  # An OPUS-MT parent's 511 tokens are never lowered (to the 72 of these sentences): the model
  # fine-tuned from it would cut the longer inputs that its parent took. Its rows are the
  # sentences' (96), not 512.
  opus = parent.replace(max_len=511)
  chosen = auto.choose(_corpus(2_000, mean=24.0, longest=70), 'cpu', opus)
  assert (chosen.model, chosen.train['row_len']) == (opus, 96)
  assert chosen.reasons[1] == (
      'lengths      max_len 511, rows of 96: 99.9% of the sentences have at most 70 pieces with '
      "EOS (max_len the parent's: what the model translates); longer pairs are dropped and "
      'counted')


def test_on_multi30k_the_rule_is_the_multi30k_recipe(shared_data):
  """The rules' anchor: on Multi30k's training set they choose the multi30k recipe, setting for
  setting, so that a run of either trains the same model (and scores the same BLEU); only the
  validation passes, which change no update, are half as frequent."""
  folder = shared_data / 'multi30k'
  recipe = recipes.override(recipes.AUTO, [f'data.train_src={folder / "train.en"}',
                                           f'data.train_tgt={folder / "train.de"}'])
  sized = auto.size(recipe, [], backend='cpu').recipe
  multi30k = recipes.load('multi30k')
  assert sized.train.eval_every_steps == 2 * multi30k.train.eval_every_steps
  assert (sized.model, dataclasses.replace(sized.train, eval_every_steps=100), sized.optim) == (
      multi30k.model, multi30k.train, multi30k.optim)


def test_long_sentences_raise_max_len_and_the_rows():
  chosen = auto.choose(_corpus(50_000, mean=30.0, longest=131), 'cpu')
  assert (chosen.model.max_len, chosen.train['row_len']) == (136, 160)
  assert chosen.reasons[3].startswith('lengths      max_len 136, rows of 160: 99.9% of the '
                                      'sentences have at most 131 pieces')


def test_a_handful_of_overlong_lines_never_sets_max_len():
  """All but the longest 0.1% of the sentences, and at least 5 of them left out (at most a
  tenth), set max_len and the mean: on 600 sentences the 99.9th percentile is the longest line,
  however long."""
  assert auto.lengths_of([10] * 599 + [20_000]) == (10.0, 11, 595 / 600)
  assert auto.lengths_of(list(range(20_000))) == (9989.5, 19_980, 0.999)
  assert auto.lengths_of([3, 4]) == (3.5, 5, 1.0)  # too few to leave any out
  assert auto.lengths_of([]) == (0.0, 1, 1.0)
  chosen = auto.choose(auto.Corpus(300, 9.0, 11, None, 595 / 600), 'cpu')
  assert chosen.model.max_len == 64
  assert any(r.startswith('lengths      max_len 64, rows of 64: 99.2% of the sentences have at '
                          'most 11 pieces') for r in chosen.reasons)


def test_a_small_corpus_is_said_to_be_one_and_every_reason_states_what_is_done():
  """300 pairs of 14 pieces: the rule's epochs stop at 2,000 pairs' (33 * 14.5^0.4 = 96: 53
  steps), the steps' floor of 300 sets the run (546 epochs), and the warmup's floor of 400 is
  longer than it; fewer than 100 pairs are refused."""
  chosen = auto.choose(_corpus(300), 'cpu')
  assert (chosen.train['num_steps'], chosen.optim.warmup_steps) == (300, 400)
  assert chosen.reasons[0].startswith('corpus       300 pairs: fewer than 2,000, the fewest the '
                                      'rules were measured on')
  assert 'cannot teach a translation model' in chosen.reasons[0]
  schedule = next(r for r in chosen.reasons if r.startswith('schedule'))
  assert schedule == (
      'schedule     300 steps of 8,192 tokens, about 546 epochs of 4,500 target tokens (the '
      "fewest the recipe trains; the rule's 96 epochs would be 53 steps); warmup 400 (the "
      "multi30k recipe's 400 at least, longer than the run: the learning rate rises throughout "
      'and never peaks)')
  with pytest.raises(config_lib.SettingError, match=r'^30 training pairs are too few to learn a '
                     r'translation from: the automatic recipe needs at least 100'):
    auto.choose(_corpus(30), 'cpu')


def test_a_peak_learning_rate_of_the_users_is_not_scaled_by_the_fine_tuning_rule():
  parent = recipes.load('multi30k').model
  scaled = auto.choose(_corpus(2_000), 'cpu', parent)
  assert scaled.optim.lr_scale == auto.FINE_TUNE_LR_SCALE
  yours = auto.choose(_corpus(2_000), 'cpu', parent, peak_given=True)
  assert yours.optim.lr_scale == 1.0
  assert not any(r.startswith('learning rate') for r in yours.reasons)


def test_the_recipe_record_states_only_the_data_settings_in_use(tmp_path):
  recipe = recipes.override(recipes.AUTO, ['data.train_src=a', 'data.train_tgt=b'])
  chosen = auto.choose(_corpus(4_000), 'cpu')
  sizing = auto.Sizing(recipes.Recipe(chosen.model, config.TrainConfig(**chosen.train),
                                      recipe.data, chosen.optim), 'head', chosen.reasons, ())
  data = json.loads(auto.record(tmp_path, sizing).read_text())['data']
  assert data['train_src'] == 'a' and data['target_language'] == 'de'
  assert 'train_pairs' not in data and 'tfds_data_dir' not in data  # (embedded's, wmt14's)


def test_validation_files_that_do_not_pair_are_found_before_the_corpus_is_measured(
    tmp_path, monkeypatch):
  """Found after the probe vocabulary and the recipe's record (minutes on a large corpus),
  where a given recipe's run finds them at once."""
  for name, count in (('t.en', 150), ('t.de', 150), ('v.en', 10), ('v.de', 12)):
    (tmp_path / name).write_text('a b c\n' * count)
  recipe = recipes.override(recipes.AUTO, [f'data.{side}={tmp_path / name}' for side, name in (
      ('train_src', 't.en'), ('train_tgt', 't.de'), ('eval_src', 'v.en'), ('eval_tgt', 'v.de'))])
  monkeypatch.setattr(auto, 'measure', lambda *a, **k: pytest.fail('the corpus was measured'))
  with pytest.raises(data.DataError, match=r'v\.en has 10 lines but \S+v\.de has 12: the files '
                     'must be line-aligned'):
    auto.size(recipe, [], backend='cpu')


def _auto_train(workdir, src_lines, tgt_lines, *extra) -> subprocess.CompletedProcess:
  """The installed `jaxformer train` without --config on these lines, one step of a one-layer
  model (the recipe's block is what is checked)."""
  src, tgt = workdir.parent / f'{workdir.name}.src', workdir.parent / f'{workdir.name}.tgt'
  src.write_text(''.join(line + '\n' for line in src_lines))
  tgt.write_text(''.join(line + '\n' for line in tgt_lines))
  return subprocess.run(
      [str(pathlib.Path(sys.executable).with_name('jaxformer')), 'train', '--workdir',
       str(workdir), '--train-src', str(src), '--train-tgt', str(tgt), '--num-steps', '1',
       '--set', 'model.num_layers=1', *extra], capture_output=True, text=True, timeout=300)


def test_the_installed_command_on_a_small_corpus_with_one_overlong_line(tmp_path, shared_data):
  """300 Multi30k pairs and one source line of 100,000 characters: max_len stays 64 (the pair is
  dropped and counted), the block says how small the corpus is, and eval scores in the language
  the run recorded. 30 pairs: one line, exit 1."""
  folder = shared_data / 'multi30k'
  src = (folder / 'train.en').read_text().splitlines()[:300] + ['word ' * 20_000]
  tgt = (folder / 'train.de').read_text().splitlines()[:301]
  done = _auto_train(tmp_path / 'w', src, tgt, '--target-language', 'es')
  assert done.returncode == 0 and 'Traceback' not in done.stderr, done.stderr[-3000:]
  assert_log_lines(done.stderr)
  assert 'corpus       301 pairs: fewer than 2,000' in done.stderr
  # The probe that measures the lengths, then the run's own: each named (both read alike).
  assert re.findall(r'training a \d+-piece (.*) on a sample', done.stderr) == [
      "probe vocabulary (to measure the sentences' lengths)", 'vocabulary'], done.stderr
  assert re.search(r'lengths      max_len 64, rows of 64: 99\.\d% of the sentences have at most '
                   r'\d\d pieces', done.stderr), done.stderr
  assert re.search(r'read 301 pairs, kept 29\d, dropped 0 empty and \d longer than 64 tokens',
                   done.stderr), done.stderr
  few = tmp_path / 'few.txt'
  few.write_text('a man\na dog\n')
  scored = subprocess.run(
      [str(pathlib.Path(sys.executable).with_name('jaxformer')), 'eval', '--model',
       str(tmp_path / 'w'), '--src', str(few), '--ref', str(few)],
      capture_output=True, text=True, timeout=300)
  assert scored.returncode == 0, scored.stderr[-3000:]
  assert (f'scoring as es, the target language recorded in {tmp_path}/w/recipe.json'
          in scored.stderr)
  assert 'Moses -l es' in scored.stdout
  assert sorted(p.name for p in (tmp_path / 'w' / 'checkpoints').iterdir()) == ['1']
  assert not any('hyps' in p.name for p in (tmp_path / 'w').rglob('*'))  # eval wrote nothing
  done = _auto_train(tmp_path / 'few', src[:30], tgt[:30])
  assert done.returncode == 1
  [line] = done.stderr.strip().splitlines()  # (refused before a probe vocabulary is trained)
  assert line.startswith('error: 30 training pairs are too few to learn a translation from')
