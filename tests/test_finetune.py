"""jaxformer.finetune: --init-from, from every kind of parent, its checks, its coverage
report, and a fine-tuning run's resume."""

import functools
import json
import logging
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
from helpers import (
  CFG,
  TESTS,
  TEXT,
  WORDS,
  assert_trees_equal,
  one_line_error,
  synthetic_text,
  text_files,
)
from helpers import train_settings as _tc

from jaxformer import checkpoint, cli, commands, config, export, trainer


def _parent_kinds(trained, tmp_path) -> dict[str, pathlib.Path]:
  """The trained tiny model as each kind of MODEL --init-from takes."""
  exported = export.save(tmp_path / 'exported', *checkpoint.load(trained)[:3], step=6)
  return {'workdir': trained, 'checkpoints': trained / 'checkpoints',
          'averaged': trained / 'average-last3', 'exported': exported}


@pytest.mark.parametrize('kind', ['workdir', 'checkpoints', 'averaged', 'exported'])
def test_init_from_starts_at_step_0_from_the_parents_params_and_vocabulary(
    trained, tmp_path, kind, caplog):
  parent = _parent_kinds(trained, tmp_path)[kind]
  parent_params = export.load_model(parent)[0]
  # A learning rate so small that one update leaves the params as they started, to the float.
  optim_cfg = config.OptimConfig(learning_rate=1e-12, warmup_steps=1)
  workdir = tmp_path / 'child'
  with caplog.at_level('INFO'):
    summary = trainer.train(CFG, _tc(num_steps=1, checkpoint_every_steps=1, log_every_steps=1,
                                     init_from=str(parent)),
                            workdir, synthetic_text(300, seed=4), optim=optim_cfg)
  assert summary['step'] == 1
  assert_trees_equal(checkpoint.load(workdir)[0], parent_params, atol=1e-9)
  record = json.loads((workdir / 'spm.model.json').read_text())
  assert (workdir / 'spm.model').read_bytes() == (trained / 'spm.model').read_bytes()
  assert record['inherited_from'].startswith(str(parent))
  assert 'training a' not in caplog.text  # the vocabulary was not trained again
  coverage = [r.message for r in caplog.records if 'inherited vocabulary' in r.message]
  assert len(coverage) == 1 and 'pieces per word' in coverage[0]
  assert ('its own data' in coverage[0]) == (kind != 'exported')  # a workdir's record has it
  first = [json.loads(line) for line in (workdir / 'metrics.jsonl').open()
           if json.loads(line).get('split') == 'train'][0]
  assert first['lr'] == pytest.approx(1e-12)  # the new schedule's first rate: a fresh optimiser


def test_init_from_refuses_another_model_shape_and_allows_dropout(trained, tmp_path):
  tc = _tc(num_steps=1, init_from=str(trained))
  with pytest.raises(config.SettingError, match=r'^model\.d_ff=128 differs from the model it '
                     r'fine-tunes \(.*: 64\).*only attention_dropout_rate, dropout_rate, max_len'):
    trainer.train(CFG.replace(d_ff=128), tc, tmp_path / 'a', TEXT)
  summary = trainer.train(CFG.replace(dropout_rate=0.3), tc, tmp_path / 'b', TEXT)
  assert summary['step'] == 1


def test_cli_init_from_takes_the_parents_model_and_names_a_changed_shape(trained, tmp_path,
                                                                         capsys):
  """The command line's model comes from the parent, not from the recipe: tiny_config's
  recipe has 400 pieces and so does the parent, but its d_model could be anything."""
  files = text_files(tmp_path)
  args = ['train', '--config', str(TESTS / 'tiny_config.py'), '--train-src',
          str(files[0]), '--train-tgt', str(files[1]), '--init-from', str(trained)]
  assert cli.main([*args, '--workdir', str(tmp_path / 'a'), '--set', 'model.d_model=64']) == 1
  assert capsys.readouterr().err.startswith('error: model.d_model=64 differs from the model it '
                                            'fine-tunes')
  assert cli.main([*args, '--workdir', str(tmp_path / 'b'), '--num-steps', '1',
                   '--set', 'model.dropout_rate=0.2', '--learning-rate', '1e-4']) == 0
  _, child, _, step = checkpoint.load(tmp_path / 'b')
  assert step == 1 and child == CFG.replace(dropout_rate=0.2)


def test_a_longer_parent_is_fine_tuned_in_the_recipes_rows(trained, tmp_path, caplog):
  """--init-from an OPUS-MT folder (max_len 511) with --config multi30k (rows of 64) failed:
  'row_len=64 is shorter than max_len=511', where the rows were never the user's choice. A
  fine-tuned model keeps its parent's max_len (what it translates) and trains in the recipe's
  rows, the pairs longer than a row dropped and counted."""
  params, cfg, spm_model, _ = checkpoint.load(trained)
  parent = export.save(tmp_path / 'long', params, cfg.replace(max_len=300), spm_model, step=6)

  def recipe(*argv: str):
    return commands.recipe_of(cli.build_parser().parse_args(
        ['train', '--workdir', str(tmp_path / 'w'), '--config', 'multi30k', '--init-from',
         str(parent), *argv]))
  assert (recipe().model.max_len, recipe().train.row_len) == (300, 64)
  assert recipe('--row-len', '512').train.row_len == 512
  assert recipe('--set', 'model.max_len=500').model.max_len == 500
  pairs = synthetic_text(300, seed=4)
  long = ' '.join(['der'] * 80)  # longer than a row of 64 tokens, within max_len 300
  text = type(pairs)([*pairs.src, long], [*pairs.tgt, long], 'with-a-long-pair')
  caplog.set_level(logging.INFO)
  trainer.train(cfg.replace(max_len=300), _tc(num_steps=1, init_from=str(parent)),
                tmp_path / 'child', text)
  assert checkpoint.load(tmp_path / 'child')[1].max_len == 300
  assert 'read 301 pairs, kept 300, dropped 0 empty and 1 longer than 64 tokens' in caplog.text


def test_a_fine_tuning_run_resumes_like_any_other(trained, tmp_path, caplog):
  tc = functools.partial(_tc, init_from=str(trained), checkpoint_every_steps=2)
  trainer.train(CFG, tc(num_steps=2), tmp_path, synthetic_text(300, seed=4))
  with caplog.at_level('INFO'):
    summary = trainer.train(CFG, tc(num_steps=4), tmp_path, synthetic_text(300, seed=4))
  assert summary['step'] == 4 and 'resumed from step 2' in caplog.text
  assert 'fine-tuning' not in caplog.text  # the parent is not read again


def test_fine_tuning_into_a_workdir_with_a_past_is_one_line_that_says_what_it_holds(
    trained, tmp_path):
  """--init-from P into a workdir W that holds checkpoints: a rerun of the fine-tuning that
  made W resumes (above); W of another run, or P inside W, would silently continue W, so each
  is one line from the installed command, and W is left as it was."""
  src, tgt = text_files(tmp_path)
  parent = export.save(tmp_path / 'exported', *checkpoint.load(trained)[:3], step=6)
  scratch = tmp_path / 'scratch'
  shutil.copytree(trained, scratch)
  before = sorted(p.name for p in scratch.iterdir())
  train = ['train', '--config', str(TESTS / 'tiny_config.py'), '--train-src', str(src),
           '--train-tgt', str(tgt), '--num-steps', '8']
  assert one_line_error(*train, '--workdir', str(scratch), '--init-from', str(parent)) == (
      f'error: {scratch} already holds a run trained from scratch: --init-from {parent} would '
      f'continue that run, not start from {parent}. Fine-tune into a new --workdir, or leave '
      'out --init-from to resume it.')
  assert sorted(p.name for p in scratch.iterdir()) == before
  for inside in (scratch, scratch / 'average-last3'):
    assert one_line_error(*train, '--workdir', str(scratch), '--init-from', str(inside)) == (
        f'error: --init-from {inside} is the workdir {scratch} or lies in it: fine-tune into a '
        'new --workdir (to continue this run, leave out --init-from).')
  child = tmp_path / 'child'
  trainer.train(CFG, _tc(num_steps=2, checkpoint_every_steps=2, init_from=str(parent)), child,
                synthetic_text(300, seed=4))
  assert one_line_error(*train, '--workdir', str(child), '--init-from', str(trained)) == (
      f'error: {child} already holds a fine-tuning run of {parent} (step 6): --init-from '
      f'{trained} would continue that run, not start from {trained}. Fine-tune into a new '
      '--workdir, or leave out --init-from to resume it.')


def test_automatic_fine_tuning_trains_at_the_max_len_its_recipe_states(trained, tmp_path):
  """Sentences longer than the parent's max_len of 64: the automatic recipe raises max_len for
  them (the parent's positions are sinusoidal), and the run trains at that max_len rather than
  the parent's, dropping nothing."""
  rng = np.random.default_rng(3)
  src, tgt = tmp_path / 'long.src', tmp_path / 'long.tgt'
  for path, words in ((src, WORDS[:16]), (tgt, WORDS[16:])):
    path.write_text(''.join(' '.join(rng.choice(words, size=rng.integers(60, 70))) + '\n'
                            for _ in range(200)))
  done = subprocess.run(
      [str(pathlib.Path(sys.executable).with_name('jaxformer')), 'train', '--workdir',
       str(tmp_path / 'w'), '--train-src', str(src), '--train-tgt', str(tgt), '--init-from',
       str(trained), '--num-steps', '1'], capture_output=True, text=True, timeout=300)
  assert done.returncode == 0 and 'Traceback' not in done.stderr, done.stderr[-3000:]
  chosen = json.loads((tmp_path / 'w' / 'recipe.json').read_text())['model']['max_len']
  assert chosen > CFG.max_len == 64 and f'max_len {chosen}, rows of' in done.stderr
  assert checkpoint.load(tmp_path / 'w')[1] == CFG.replace(max_len=chosen)
  assert 'dropped 0 empty and 0 longer' in done.stderr, done.stderr
