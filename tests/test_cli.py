"""jaxformer.cli: the commands, their flags and their one-line errors."""

import argparse
import ast
import pathlib
import re
import socket
import subprocess
import sys

import jax
import pytest
from helpers import hold_lock, train_command

from jaxformer import checkpoint, cli, config, recipes, translation

TESTS = pathlib.Path(__file__).resolve().parent
ROOT = TESTS.parent


def test_cli_help_lists_subcommands(capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.main(['--help'])
  assert exit_info.value.code == 0
  listing = ' '.join(capsys.readouterr().out.split())  # argparse wraps the lines
  assert 'params' in listing
  assert (f'train on your own files (a recipe sized from them), a recipe '  # (the default)
          f'({", ".join(recipes.NAMES)}) or a recipe file') in listing  # multi30k_gpu was missing
  with pytest.raises(SystemExit):
    cli.main(['train', '--help'])
  assert 'GLIBC_TUNABLES=glibc.malloc.hugetlb=1 jaxformer train' in capsys.readouterr().out


def test_console_script_is_installed():
  script = pathlib.Path(sys.executable).parent / 'jaxformer'
  result = subprocess.run([str(script), '--help'], capture_output=True, text=True, check=True)
  assert 'Attention Is All You Need' in result.stdout


def test_params_command_counts_a_models_parameters(trained, capsys):
  params = checkpoint.load(trained)[0]
  assert cli.main(['params', '--model', str(trained)]) == 0
  assert capsys.readouterr().out.endswith(
      f': {sum(x.size for x in jax.tree.leaves(params)):,} parameters\n')
  assert cli.main(['params', '--model', str(trained), '--preset', 'big']) == 1
  assert capsys.readouterr().err == ("error: --model counts that model's parameters: leave out "
                                     '--preset and --vocab-size.\n')


@pytest.mark.parametrize('preset,count', [('base', '63,082,496'), ('big', '214,245,376')])
def test_params_command_prints_the_documented_counts(capsys, preset, count):
  assert cli.main(['params', '--preset', preset]) == 0
  printed = capsys.readouterr().out
  assert count in printed
  assert count in (ROOT / 'docs' / 'table3.md').read_text()


@pytest.mark.parametrize('flags,message', [
    (['--accum-steps', '0'], 'error: train.accum_steps must be >= 1, got 0.'),
    (['--log-every-steps', '0'], 'error: train.log_every_steps must be >= 1, got 0.'),
    (['--set', 'train.row_len=16'], 'error: row_len=16 is shorter than max_len=64: the longest '
                                    'pairs would not fit in a row; make row_len (--row-len) 64 or '
                                    'more.'),
    (['--checkpoint-every-steps', '-5'], 'error: train.checkpoint_every_steps must be > 0 '
                                         '(or unset), '
                                         'got -5.'),
    (['--set', 'model.dropout'], "error: --set 'model.dropout': expected SECTION.NAME=VALUE with "
                                 'SECTION one of model, train, data, optim (e.g. --set '
                                 'model.dropout_rate=0.2).'),
    (['--set', 'model.dropout=0.2'], 'error: unknown setting model.dropout; valid model settings: '
                                     'vocab_size, num_layers, d_model, d_ff, num_heads, qk_dim, '
                                     'v_dim, dropout_rate, attention_dropout_rate, '
                                     'relu_dropout_rate, pre_ln, max_len, '
                                     'learned_positions, attention_window, activation, '
                                     'output_bias, norm_epsilon, execution.dtype, '
                                     'execution.attention, execution.remat, '
                                     'execution.loss_chunk, execution.norm_dtype, '
                                     'execution.dropout_rng.'),
    (['--set', 'train.num_steps=many'], "error: --set train.num_steps: expected int, got 'many'."),
    (['--set', 'model.qk_dim=x'], "error: --set model.qk_dim: expected int or None, got 'x'."),
    (['--set', 'model.pre_ln=maybe'], "error: --set model.pre_ln: expected bool, got 'maybe'."),
    (['--set', 'model.execution.dtype=int8'],
     'error: model.execution.dtype must be float32 or bfloat16, got int8.'),
    (['--set', 'model.execution.dtype=half-ish'],
     "error: --set model.execution.dtype: expected float32 or bfloat16, got 'half-ish'."),
    (['--set', 'model.execution.attention=flash'],
     "error: model.execution.attention must be 'einsum' or 'fused', got 'flash'."),
    (['--set', 'data.source=web'], "error: data.source must be 'wmt14', 'text' or "
                                   "'embedded', got 'web'."),
    (['--learning-rate', '0'], 'error: optim.learning_rate must be > 0 (or unset), got 0.0.'),
    (['--lr-scale', 'nan'], 'error: optim.lr_scale must be a finite number, got nan.'),
    (['--set', 'optim.warmup_steps=soon'], "error: --set optim.warmup_steps: expected int, got "
                                           "'soon'."),
    (['--set', 'optim.beta=0.9'], 'error: unknown setting optim.beta; valid optim settings: '
                                  'warmup_steps, learning_rate, lr_scale, adam_b1, adam_b2, '
                                  'adam_eps, grad_clip_norm, weight_decay, label_smoothing.'),
    (['--target-language', 'German'], "error: data.target_language must be an ISO 639 code "
                                      "such as en, de or zh, got 'German'."),
    (['--init-from', '/nowhere/model'], 'error: /nowhere/model: does not exist, where a model '
     '(a training workdir, a checkpoint folder, an exported model or a MarianMT folder) '
     'belongs.')])
def test_train_refuses_bad_settings_before_any_work(tmp_path, capsys, flags, message):
  argv = ['train', '--config', str(ROOT / 'tests' / 'tiny_config.py'), '--workdir',
          str(tmp_path / 'w'), '--source', 'text', '--train-src', 'none.en', '--train-tgt',
          'none.de', *flags]
  assert cli.main(argv) == 1
  assert capsys.readouterr().err.strip().splitlines() == [message]
  assert not (tmp_path / 'w').exists()


def test_every_flag_has_help_and_one_spelling():
  parser = cli.build_parser()
  for name, sub in parser._subparsers._group_actions[0].choices.items():  # pylint: disable=protected-access
    for action in sub._actions:  # pylint: disable=protected-access
      if action.help == argparse.SUPPRESS:  # the --name_with_underscores aliases
        continue
      assert action.help, (name, action.option_strings)
      assert not any('_' in option for option in action.option_strings), (name, action)


@pytest.mark.parametrize('argv', [
    ['translate', '--workdir', 'w', '--batch-size', '0'], ['translate', '--workdir', 'w',
                                                             '--beam', '-1'],
    ['average', '--workdir', 'w', '--last', 'two'], ['params', '--vocab-size', '0'],
    ['eval', '--workdir', 'w', '--batch-size', '0'], ['eval', '--workdir', 'w', '--beam', '0'],
    ['train', '--config', 'demo', '--workdir', 'w', '--num-processes', '0']])
def test_cli_refuses_non_positive_counts_in_one_line(capsys, argv):
  with pytest.raises(SystemExit) as exit_info:
    cli.main(argv)
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1].startswith('jaxformer ') and re.search(
      r'must be an integer (>= 1|in \[1, \d+\]), got', err[-1]), err[-1]


@pytest.mark.parametrize('argv, usage, unknown', [
    (['export', '--model', 'M', '--output', 'OUT'], 'usage: jaxformer export ', '--output'),
    (['translate', '--model', 'M', '--bem', '3'], 'usage: jaxformer translate ', '--bem 3'),
    (['--bogus'], 'usage: jaxformer [-h] COMMAND', '--bogus')])
def test_an_unknown_flag_shows_its_commands_usage(capsys, argv, usage, unknown):
  """Not `jaxformer`'s usage, which lists none of the command's flags (it did)."""
  with pytest.raises(SystemExit) as exit_info:
    cli.main(argv)
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.startswith(usage)
  assert err.strip().splitlines()[-1].endswith(f'error: unrecognized arguments: {unknown}')


@pytest.mark.parametrize('flag, value, bound', [
    ('--beam', '100000', 'an integer in [1, 256]'), ('--batch-size', '100000',
                                                     'an integer in [1, 4096]'),
    ('--extra-length', '10000000000', 'an integer in [0, 100000]'),
    ('--extra-length', '1e10', 'an integer'), ('--nbest', '100000', 'an integer in [1, 100]')])
def test_the_search_refuses_sizes_past_their_bounds_in_one_line(capsys, flag, value, bound):
  """Sizes that could only fail for memory (a beam of 100,000: about 20 TB) or overflow int32
  (an extra length of 1e10) are refused before anything loads; the server's n-best bound is
  the command's (settings.MAX_NBEST)."""
  with pytest.raises(SystemExit) as exit_info:
    cli.main(['translate', '--model', 'w', flag, value])
  assert exit_info.value.code == 2
  assert f'argument {flag}: must be {bound}' in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize('value', ['nan', 'inf', '-inf', '-0.5'])
@pytest.mark.parametrize('command', ['translate', 'eval'])
def test_the_search_refuses_an_alpha_that_is_not_a_finite_number(capsys, command, value):
  with pytest.raises(SystemExit) as exit_info:  # nan scored every beam nan: empty lines out
    cli.main([command, '--model', 'w', f'--alpha={value}'])
  assert exit_info.value.code == 2
  assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
      f"argument --alpha: must be a finite number >= 0, got '{value}'")
  with pytest.raises(config.SettingError,
                     match=r'^decoding\.alpha must be a finite number, got nan'):
    translation.Translator(None, config.tiny(), None, alpha=float('nan'))


def test_older_spellings_still_work_and_name_the_current_one():
  parser = cli.build_parser()
  assert cli.older_spellings(parser, ['eval', '--checkpoint', 'M', '--average_last', '2',
                                      '--beam', '4']) == [
      'note: --checkpoint is an older spelling of --model; it still works.',
      'note: --average_last is an older spelling of --average-last; it still works.']
  assert cli.older_spellings(parser, ['train', '--workdir', 'W', '--num_steps=3']) == [
      'note: --num_steps is an older spelling of --num-steps; it still works.']
  assert cli.older_spellings(parser, ['translate', '--model', 'M']) == []
  args = parser.parse_args(['translate', '--workdir', 'M', '--batch_size', '3'])
  assert (args.model, args.batch_size) == ('M', 3)


def test_translate_command_missing_checkpoint_is_one_line(tmp_path):
  result = subprocess.run([sys.executable, '-m', 'jaxformer.cli', 'translate', '--workdir',
                           str(tmp_path / 'none')], input='x\n', capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1].startswith('error: ')
  assert 'does not exist, where a model (a training workdir' in result.stderr


def _tree_snapshot(folder: pathlib.Path) -> dict[str, tuple[int, int]]:
  """Every file under `folder` with its size and modification time."""
  return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
          for p in sorted(folder.rglob('*')) if p.is_file()}


def test_reading_commands_create_and_change_nothing(workdir, tmp_path, caplog):
  from jaxformer import cli  # pylint: disable=g-import-not-at-top
  caplog.set_level('WARNING')
  missing = tmp_path / 'no-such-workdir'
  assert cli.main(['average', '--workdir', str(missing), '--last', '2']) == 1
  assert not missing.exists()
  checkpoints = 'a training workdir or a checkpoint folder'
  for read, belongs in ((checkpoint.load, checkpoints),
                        (lambda p: checkpoint.average_checkpoints(p, 1), checkpoints),
                        (translation.Translator.load, r'a model \(a training workdir, a '
                         r'checkpoint folder, an exported model or a MarianMT folder\)')):
    with pytest.raises(checkpoint.CheckpointError, match=f'does not exist, where {belongs} '
                       'belongs'):
      read(missing)
    assert not missing.exists()
  before = _tree_snapshot(workdir)
  checkpoint.load(workdir)
  checkpoint.average_checkpoints(workdir, 2)
  translation.Translator.from_checkpoint(str(workdir), average_last=2).translate(['the dog'])
  assert _tree_snapshot(workdir) == before
  assert not caplog.records, caplog.text  # read-only managers, and nothing to warn about
  with pytest.raises(checkpoint.CheckpointError, match='must be >= 1, got 0'):
    checkpoint.average_checkpoints(workdir, 0)


def test_train_entry_point_reports_bad_input_in_one_line(tmp_path):
  (tmp_path / 'a.src').write_text('one\ntwo\n')
  (tmp_path / 'a.tgt').write_text('eins\n')
  result = subprocess.run(train_command(tmp_path / 'w', tmp_path / 'a.src', tmp_path / 'a.tgt'),
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == (
      f'error: {tmp_path / "a.src"} has 2 lines but {tmp_path / "a.tgt"} has 1: the files must '
      'be line-aligned.')


def test_eval_finds_files_that_do_not_pair_before_it_loads_the_model(tmp_path, capsys):
  (tmp_path / 'a.src').write_text('one\ntwo\n')
  (tmp_path / 'a.ref').write_text('eins\n')
  assert cli.main(['eval', '--model', str(tmp_path / 'nowhere'), '--src', str(tmp_path / 'a.src'),
                   '--ref', str(tmp_path / 'a.ref')]) == 1
  assert capsys.readouterr().err.strip() == (
      f'error: {tmp_path / "a.src"} has 2 lines but {tmp_path / "a.ref"} has 1: the files must '
      'be line-aligned.')
  # newstest2014 (tfds) after the model: a wrong path is said before WMT14 is looked for
  assert cli.main(['eval', '--model', str(tmp_path / 'nowhere'), '--tfds-data-dir',
                   str(tmp_path)]) == 1
  assert capsys.readouterr().err.startswith(f'error: {tmp_path / "nowhere"}: does not exist')


def test_cli_imports_at_the_top_only():
  """cli.py imports what it uses at module level: no command imports inside a function."""
  tree = ast.parse((ROOT / 'jaxformer' / 'cli.py').read_text())
  inner = [node.lineno for function in ast.walk(tree) if isinstance(function, ast.FunctionDef)
           for node in ast.walk(function) if isinstance(node, (ast.Import, ast.ImportFrom))]
  assert inner == []


@pytest.mark.parametrize('argv', [
    ['eval', '--model', 'M'], ['eval', '--workdir', 'M'], ['eval', '--checkpoint', 'M'],
    ['translate', '--model', 'M'], ['translate', '--workdir', 'M'],
    ['export', '--model', 'M', 'OUT'], ['export', 'M', 'OUT']])
def test_eval_translate_and_export_name_the_model_alike(argv):
  """--model PATH in all three (it was --workdir|--checkpoint, --workdir and a positional);
  the older spellings still work."""
  args = cli.build_parser().parse_args(argv)
  assert (args.model or args.path if argv[0] == 'export' else args.model) == 'M'


@pytest.mark.parametrize('argv', [['export', 'OUT'], ['export', '--model', 'M', 'M', 'OUT']])
def test_export_needs_the_model_once(capsys, argv):
  assert cli.main(argv) == 1
  assert capsys.readouterr().err == (
      'error: give the model to export once: jaxformer export --model PATH OUT.\n')


def test_distributed_outside_a_cluster_is_a_one_line_error(tmp_path, capsys):
  assert cli.main(['train', '--config', 'demo', '--workdir', str(tmp_path / 'w'),
                   '--distributed']) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith('error: --distributed: cannot join a cluster ('), err
  assert 'give --coordinator-address, --num-processes and --process-id' in err[0]


@pytest.mark.parametrize('argv', [['train', '--config', 'demo', '--workdir', ''],
                                  ['translate', '--model', ' '],
                                  ['eval', '--model', 'w', '--src', '', '--ref', 'r']])
def test_an_empty_path_is_refused_not_taken_as_the_current_folder(argv, capsys):
  """`--workdir ''` trained into the current folder before."""
  with pytest.raises(SystemExit) as exit_info:
    cli.main(argv)
  assert exit_info.value.code == 2
  assert re.search(r"error: argument \S+: must be a path, got '\s*'$",
                   capsys.readouterr().err.strip().splitlines()[-1])


_BAD_INPUT = {  # one of each class of bad input: (its files, argv) -> the command's one line
    'a setting out of range': (
        'train --workdir w --train-src s.txt --train-tgt t.txt --set model.num_heads=0',
        'error: model.num_heads must be >= 1, got 0.'),
    'settings that go together': (
        'train --workdir w --train-src s.txt --train-tgt t.txt --eval-src s.txt',
        'error: data.eval_src and data.eval_tgt go together: give both files or neither.'),
    'a folder given as a file': (
        'train --workdir w --train-src folder --train-tgt t.txt',
        'error: folder: is a folder, not a file.'),
    'a damaged .gz': (
        'train --workdir w --train-src bad.gz --train-tgt t.txt',
        "error: bad.gz: cannot read (Not a gzipped file (b'ga'))."),
    'a workdir in use': (
        'train --workdir busy --train-src s.txt --train-tgt t.txt',
        'error: busy is in use: a training run by pid {pid} on {host} holds it. Wait for that '
        'to end, or use another folder.'),
    'an exported folder without its vocabulary': (
        'translate --model export --input s.txt',
        'error: export: not an exported model (missing spm.model, params.safetensors); '
        '`jaxformer export WORKDIR OUT` writes one.'),
    'an odd model width under sinusoidal positions': (
        'train --workdir w --train-src s.txt --train-tgt t.txt --set model.d_model=33 '
        '--set model.num_heads=1',
        'error: model.d_model=33 is odd, and the sinusoidal positions (§3.5) pair a sine with a '
        'cosine per frequency: use an even d_model, or set model.learned_positions=true.'),
    'a preset with a vocabulary too small': (
        'params --preset tiny --vocab-size 3', 'error: model.vocab_size must be >= 4, got 3.'),
    'a file where a model belongs': (
        'translate --model s.txt --input s.txt',
        'error: s.txt: is a file, where a model (a training workdir, a checkpoint folder, an '
        'exported model or a MarianMT folder) belongs.'),
    'a model that does not exist': (
        'average --workdir nowhere',
        'error: nowhere: does not exist, where a training workdir belongs.'),
    'a file where the workdir belongs': (
        'train --workdir s.txt --train-src s.txt --train-tgt t.txt',
        'error: s.txt: is a file, where a training workdir belongs.'),
    'an export into a training workdir': (
        'export --model wd wd',
        'error: wd: is a training workdir, where a new or empty folder for the export belongs.'),
    'an export over an export': (
        'export --model wd export', 'error: export: is an exported model already: pass '
        '--overwrite to replace it.'),
    'an export of another format over an export': (
        'export --model wd --format ctranslate2 --overwrite export',
        'error: export: is an exported model, where a new or empty folder for the export '
        'belongs.'),
    'an option that does not apply to an export': (
        'translate --model export --input s.txt --average-last 2',
        'error: --average-last averages the checkpoints of a training workdir; export is an '
        'exported model (one set of params).'),
}


@pytest.mark.parametrize('case', sorted(_BAD_INPUT))
def test_each_class_of_bad_input_is_one_line_from_the_installed_command(case, tmp_path):
  """Through the console script in a subprocess: exit 1, no traceback, and the one line."""
  argv, expected = _BAD_INPUT[case]
  (tmp_path / 's.txt').write_text('a b\n')
  (tmp_path / 't.txt').write_text('c d\n')
  (tmp_path / 'folder').mkdir()
  (tmp_path / 'bad.gz').write_bytes(b'garbage')
  (tmp_path / 'export').mkdir()
  (tmp_path / 'export' / 'config.json').write_text('{}')
  (tmp_path / 'busy').mkdir()
  (tmp_path / 'wd').mkdir()  # a run's first file: a training workdir with no checkpoint yet
  (tmp_path / 'wd' / 'spm.model').write_bytes(b'')
  holder = hold_lock(tmp_path / 'busy', 'a training run') if 'busy' in argv else None
  command = [str(pathlib.Path(sys.executable).with_name('jaxformer')), *argv.split()]
  if command[1] == 'train':
    command[2:2] = ['--config', str(TESTS / 'tiny_config.py')]
  try:
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
  finally:
    if holder:
      holder.kill()
      holder.wait()
  assert done.returncode == 1 and 'Traceback' not in done.stderr, done.stderr
  assert done.stderr.strip().splitlines()[-1] == expected.format(
      pid=holder and holder.pid, host=socket.gethostname())


def test_ctrl_c_while_sentencepiece_reads_the_sample_is_an_interrupt(tmp_path):
  """sentencepiece turns a KeyboardInterrupt raised in the sentences it reads into a
  RuntimeError (which became a one-line data error, exit 1): it ends as any Ctrl-C does."""
  from helpers import synthetic_text  # pylint: disable=g-import-not-at-top
  text = synthetic_text(300)
  for name, lines in (('s.txt', text.src), ('t.txt', text.tgt)):
    (tmp_path / name).write_text('\n'.join(lines) + '\n')
  done = subprocess.run(
      [sys.executable, str(TESTS / 'faults.py'), 'ctrl-c-in-vocabulary-sample', 'train',
       '--config', str(TESTS / 'tiny_config.py'), '--workdir', str(tmp_path / 'w'),
       '--train-src', str(tmp_path / 's.txt'), '--train-tgt', str(tmp_path / 't.txt')],
      capture_output=True, text=True, timeout=300)
  lines = done.stderr.strip().splitlines()
  assert done.returncode == 130 and 'Traceback' not in done.stderr, done.stderr[-3000:]
  assert lines[-2] == 'interrupted', lines[-3:]  # (then faults.py's count)
  assert not (tmp_path / 'w' / 'spm.model').exists()


