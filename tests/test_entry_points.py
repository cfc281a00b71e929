"""The console script, the Makefile targets and the README's code all work as written."""

import argparse
import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

import jax
import jax.numpy as jnp

from jaxformer import cli, config, data, export, recipes, train
from jaxformer.flops import forward_flops

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_cli_help_lists_subcommands(capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.main(['--help'])
  assert exit_info.value.code == 0
  assert 'params' in capsys.readouterr().out


def test_console_script_is_installed():
  script = pathlib.Path(sys.executable).parent / 'jaxformer'
  result = subprocess.run([str(script), '--help'], capture_output=True, text=True, check=True)
  assert 'Attention Is All You Need' in result.stdout


@pytest.mark.parametrize('preset,count', [('base', '63,082,496'), ('big', '214,245,376')])
def test_params_command_prints_the_readme_counts(capsys, preset, count):
  assert cli.main(['params', '--preset', preset]) == 0
  printed = capsys.readouterr().out
  assert count in printed
  assert count in (ROOT / 'README.md').read_text()


def test_readme_python_snippets_run(tmp_path, monkeypatch, shared_data, capsys):
  """Runs every python block of the README in order, in a folder holding Multi30k's train files
  (as the data example expects train.en and train.de) and a CTranslate2 export of a small
  random model where the serving example reads one (exported/base-ct2)."""
  multi30k = shared_data / 'multi30k'
  for name in ('train.en', 'train.de'):
    (tmp_path / name).symlink_to(multi30k / name)
  text = data.read_parallel_text(tmp_path / 'train.en', tmp_path / 'train.de')
  tokenizer = data.train_tokenizer(text.src[:2000] + text.tgt[:2000], tmp_path / 'ct2.model',
                                   vocab_size=500)
  cfg = config.tiny(vocab_size=500).replace(max_len=256)  # the recipes' max_len
  export.save_ctranslate2(tmp_path / 'exported' / 'base-ct2',
                          train.create_train_state(cfg, jax.random.key(0)).params, cfg,
                          tokenizer.model_proto)
  monkeypatch.chdir(tmp_path)
  blocks = re.findall(r'```python\n(.*?)```', (ROOT / 'README.md').read_text(), flags=re.S)
  assert len(blocks) >= 4, 'the README lost its python examples'
  namespace: dict = {}
  for block in blocks:  # later blocks use names from earlier ones; some sit in list items
    exec(compile(textwrap.dedent(block), 'README.md', 'exec'), namespace)  # pylint: disable=exec-used
  assert namespace['model'].__class__.__name__ == 'Translator'  # CTranslate2's, from the last
  assert len(capsys.readouterr().out.splitlines()) == 1  # its one translation
  assert namespace['logits'].shape == (1, 37000)  # decode_step: one position's logits
  assert float(namespace['peak']) == pytest.approx(6.988e-4, rel=1e-3)
  assert namespace['batch']['src'].shape[:2] == (8, 12)
  assert namespace['state'] == {
      'epoch': 0, 'block': 0, 'row': 96, 'seed': 0, 'shard_size': 29000, 'src_len': 248,
      'tgt_len': 256, 'corpus': data.PackedBatches.corpus_id(namespace['corpus'])}


def test_bench_answers_help():
  result = subprocess.run([sys.executable, str(ROOT / 'experiments' / 'bench'), '--help'],
                          capture_output=True, text=True, check=True)
  assert '--only' in result.stdout and 'data' in result.stdout and '--fast-path' in result.stdout
  bad = subprocess.run([sys.executable, str(ROOT / 'experiments' / 'bench'), '--only', 'train',
                        '--loss-chunk', '0'], capture_output=True, text=True)
  assert bad.returncode == 2 and 'Traceback' not in bad.stderr
  assert bad.stderr.strip().splitlines()[-1].endswith(
      "--loss-chunk: must be an integer >= 1, got '0'")


def test_bench_train_reports_mfu_against_its_measured_peak():
  result = subprocess.run([sys.executable, str(ROOT / 'experiments' / 'bench'), '--only',
                           'train', '--train-case', 'tiny'], capture_output=True, text=True,
                          check=True, timeout=300)
  report = json.loads(result.stdout)
  train, tiny = report['train'], report['train']['tiny']
  assert report['machine']['backend'] == 'cpu' and train['fast_path'] is False
  peak = train['matmul_peak']['peak_gflops']
  assert peak == max(train['matmul_peak']['gflops_by_size'].values()) > 0
  flops = 3 * forward_flops(config.tiny(), 32, 64, 64)
  assert tiny['model_tflops_per_step'] == round(flops / 1e12, 4)
  assert tiny['target_tokens_per_step'] == 2048
  assert tiny['mfu'] == pytest.approx(flops / tiny['step_s_median'] / 1e9 / peak, rel=1e-2)
  assert tiny['step_s_range'][0] <= tiny['step_s_median'] <= tiny['step_s_range'][1]
  assert tiny['step_buffers_gb'] >= 0 and not tiny['remat'] and tiny['loss_chunk'] == 1024
  assert tiny['target_tokens_per_s_pipelined'] == pytest.approx(
      2048 / tiny['step_s_pipelined'], rel=1e-2)  # steps queued back to back, as in training


def test_bench_divides_by_the_torch_peer_of_each_case(monkeypatch):
  """The ratio jaxformer / torch per case, from bench_torch.py's JSON (faked here: torch is an
  optional extra; test_torch_peer_matches_jaxformer checks the peer where torch is installed);
  a failed peer is reported, not raised."""
  sys.path.insert(0, str(ROOT / 'experiments'))
  from bench import train as bench_train  # pylint: disable=g-import-not-at-top
  peer = {'torch': 'x', 'cases': {'tiny': {'target_tokens_per_s': 400.0}}}
  calls, exits = [], [0, 1]

  def fake_run(command, **kwargs):
    calls.append(command)
    return subprocess.CompletedProcess(command, exits[len(calls) - 1], stdout=json.dumps(peer),
                                       stderr='torch.OutOfMemoryError: CUDA out of memory\n')
  monkeypatch.setattr(bench_train.importlib.util, 'find_spec', lambda name: True)
  monkeypatch.setattr(bench_train.subprocess, 'run', fake_run)
  assert bench_train.torch_peer(['tiny', 'base']) == peer
  assert calls[0][-2:] == ['--case=tiny', '--case=base']
  assert calls[0][1].endswith('experiments/bench_torch.py')
  results = {'tiny': {'target_tokens_per_s': 1000.0}, 'base': {'target_tokens_per_s': 5.0}}
  assert bench_train.add_ratios(results, peer) == peer
  assert bench_train.torch_peer() == {
      'error': 'bench_torch.py exited with 1: torch.OutOfMemoryError: CUDA out of memory'}
  assert results['tiny']['ratio_to_torch'] == 2.5 and 'ratio_to_torch' not in results['base']


def test_torch_peer_matches_jaxformer():
  """Where torch is installed (jaxformer[bench]): the peer has jaxformer's parameters plus the
  two stack LayerNorms nn.Transformer adds, the paper's lrate, and times the tiny case."""
  pytest.importorskip('torch')
  from jaxformer import optim  # pylint: disable=g-import-not-at-top
  from jaxformer.model import parameter_count  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, str(ROOT / 'experiments'))
  import bench_torch  # pylint: disable=g-import-not-at-top
  for cfg in (config.tiny(), config.base()):
    ours = parameter_count(cfg)
    peer = sum(p.numel() for p in bench_torch.PaperTransformer(cfg).parameters())
    assert peer == ours + 2 * 2 * cfg.d_model
    schedule = optim.lrate_schedule(cfg.d_model, cfg.warmup_steps)
    for count in (0, 99, 3999, 50_000):
      peer_lr = bench_torch._lrate(cfg)(count)  # pylint: disable=protected-access
      assert peer_lr == pytest.approx(float(schedule(count)), rel=1e-5)
  result = subprocess.run([sys.executable, str(ROOT / 'experiments' / 'bench_torch.py'),
                           '--case', 'tiny'], capture_output=True, text=True, check=True,
                          timeout=300)
  tiny = json.loads(result.stdout)['cases']['tiny']
  assert tiny['target_tokens_per_step'] == 2048 and tiny['dtype'] == 'float32'
  assert tiny['target_tokens_per_s'] == pytest.approx(2048 / tiny['step_s_median'], rel=1e-2)


def test_bench_memory_compiles_the_step_and_reports_its_buffers():
  sys.path.insert(0, str(ROOT / 'experiments'))
  from bench import memory  # pylint: disable=g-import-not-at-top
  report = memory.run(preset='tiny', rows=16, row_len=64, cases=((False, 1), (False, 4)))
  assert len(report) == 2
  sizes = {name.split('tokens_')[1]: case['temp_mb'] for name, case in report.items()}
  assert all(case['arguments_mb'] > 0 for case in report.values())
  assert sizes['remat_False_accum_4'] < sizes['remat_False_accum_1']  # a quarter of the batch


def test_bench_decode_fast_path_counts_the_output_tokens(shared_data):
  """The GPU's decode case (run here on CPU with the tiny preset): sources of one 32-wide
  bucket, outputs to the length limit (64: tiny's max_len), tokens/s = tokens / seconds."""
  sys.path.insert(0, str(ROOT / 'experiments'))
  from bench import decode  # pylint: disable=g-import-not-at-top
  report = decode.base_fast_path(shared_data, batch_size=8, sentences=16, preset='tiny')
  assert report['sentences'] == 16 and report['attention'] == 'einsum'
  for search in ('greedy', 'beam4'):
    case = report[search]
    assert 0 < case['tokens'] <= 16 * 64
    assert case['target_tokens_per_s'] == pytest.approx(case['tokens'] / case['seconds'],
                                                        rel=1e-2)  # seconds: 3 decimals


def test_profile_step_splits_a_step_by_model_part():
  result = subprocess.run([sys.executable, str(ROOT / 'experiments' / 'profile_step.py'),
                           '--preset', 'tiny', '--rows', '4', '--row-len', '16'],
                          capture_output=True, text=True, check=True, timeout=300)
  report = json.loads(result.stdout)
  parts = report['op_seconds_by_part']
  assert {'feed-forward', 'softmax projection + loss',
          'attention: q, k, v, out projections'} <= set(parts)
  assert parts['feed-forward'] > 0 and parts['softmax projection + loss'] > 0
  assert report['wall_s'] > 0


def test_profile_step_splits_a_beam_search_by_part():
  result = subprocess.run([sys.executable, str(ROOT / 'experiments' / 'profile_step.py'),
                           '--preset', 'tiny', '--rows', '2', '--search', 'beam4'],
                          capture_output=True, text=True, check=True, timeout=300)
  parts = json.loads(result.stdout)['op_seconds_by_part']
  assert parts['reorder beams (cache and sequences)'] > 0 and parts['top-k'] > 0
  assert parts['feed-forward'] > 0


def test_make_train_base_refuses_a_cpu_backend_before_reading_data(tmp_path):
  result = subprocess.run(['make', '-s', 'train-base', f'TFDS_DATA_DIR={tmp_path}',
                           f'WORKDIR={tmp_path / "w"}'], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
  assert result.returncode != 0
  assert result.stderr.strip().splitlines()[-2] == (
      "error: this recipe needs a GPU, but jax's backend is cpu (no GPU here, or jax's CPU "
      'build): on a GPU host run `make install` (it installs jaxformer[cuda12] or [cuda13]; or '
      "pip install 'jaxformer[cuda12]'), or pass --allow-cpu to train on the CPU anyway.")
  assert 'tfds' not in result.stderr and not (tmp_path / 'w').exists()


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


@pytest.mark.parametrize('target', ['train-base', 'train-big'])
def test_recipes_fail_fast_without_wmt14(target, tmp_path):
  result = subprocess.run(['make', '-s', target, f'TFDS_DATA_DIR={tmp_path}',
                           f'WORKDIR={tmp_path / "w"}', 'ARGS=--allow-cpu'], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
  assert result.returncode != 0
  assert result.stderr.strip().splitlines()[-2].startswith(
      'error: tfds dataset wmt14_translate/de-en is not prepared')
  assert f'tfds build wmt14_translate/de-en --data_dir={tmp_path}' in result.stderr


def test_make_eval_asks_for_a_workdir():
  result = subprocess.run(['make', '-s', 'eval'], cwd=ROOT, capture_output=True, text=True)
  assert result.returncode != 0
  assert 'set WORKDIR=' in result.stderr


_THP = pathlib.Path('/sys/kernel/mm/transparent_hugepage/enabled')
_MALLOC_64_MIB = """
import ctypes, resource
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
ctypes.memset(libc.malloc(64 << 20), 1, 64 << 20)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not _THP.exists() or '[madvise]' not in _THP.read_text(),
                    reason="the kernel's transparent huge pages are not 'madvise': malloc's "
                    'blocks get them always or never, whatever glibc asks')
def test_make_runs_its_commands_on_huge_pages_and_keeps_a_users_tunables(tmp_path):
  """A block of 64 MiB that malloc hands out and the program touches: 16,384 page faults on
  4 KB pages; the Makefile's GLIBC_TUNABLES backs it with 2 MB pages. One's own is kept."""
  script = tmp_path / 'faults.py'
  script.write_text(_MALLOC_64_MIB)
  env = {k: v for k, v in os.environ.items() if k != 'GLIBC_TUNABLES'}

  def faults(**extra: str) -> tuple[int, int]:
    made = subprocess.run(['make', '-s', '--eval', f'faults: ; @{sys.executable} {script}',
                           'faults'], cwd=ROOT, capture_output=True, text=True, check=True,
                          env={**env, **extra})
    plain = subprocess.run([sys.executable, script], capture_output=True, text=True,
                           check=True, env={**env, **extra})
    return int(made.stdout), int(plain.stdout)
  under_make, alone = faults()
  assert alone >= 16_000 and under_make < 2_000, (under_make, alone)
  assert min(faults(GLIBC_TUNABLES='glibc.malloc.check=0')) >= 16_000  # the user's setting


def _readme_commands() -> list[str]:
  blocks = re.findall(r'```sh\n(.*?)```', (ROOT / 'README.md').read_text(), flags=re.S)
  text = '\n'.join(blocks).replace('\\\n', ' ')
  return [line.split('#')[0].strip() for line in text.splitlines() if line.strip()]


def test_every_make_target_in_the_readme_exists():
  makefile = (ROOT / 'Makefile').read_text()
  targets = set(re.findall(r'^([a-z][\w-]*(?: [a-z][\w-]*)*):', makefile, flags=re.M))
  defined = {t for group in targets for t in group.split()}
  named = set(re.findall(r'\bmake ([a-z][\w-]*)', (ROOT / 'README.md').read_text()))
  assert named and named <= defined, named - defined


def test_every_script_and_subcommand_in_the_readme_answers_help():
  commands = _readme_commands()
  scripts = {m for c in commands for m in re.findall(r'python (experiments/\w+\.py)', c)}
  subcommands = {m for c in commands for m in re.findall(r'jaxformer (\w[\w-]*)', c)}
  assert 'experiments/plot_attention.py' in scripts
  assert {'train', 'eval', 'translate', 'export'} <= subcommands
  scripts |= {'experiments/train.py', 'experiments/eval.py'}  # the shortcuts to the CLI
  for script in sorted(scripts):
    result = subprocess.run([sys.executable, str(ROOT / script), '--help'], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and 'usage:' in result.stdout, script
  for command in sorted(subcommands):
    result = subprocess.run([sys.executable, '-m', 'jaxformer.cli', command, '--help'],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and 'usage:' in result.stdout, command


# --- bad input through every entry point: one line, never a traceback -----------------------------


def _script(name: str):
  sys.path.insert(0, str(ROOT / 'experiments'))
  return __import__(name)


@pytest.mark.parametrize('config_text,message', [
    ('raise RuntimeError("broken")\n', r'cannot load the config \(RuntimeError: broken\)\.$'),
    ('def get_config():\n  return {"model": 1}\n', r"must return a dict with 'model', 'train'"),
    ('from jaxformer import config\ndef get_config():\n  return {"model": config.tiny(), '
     '"train": {"num_step": 5}, "data": {"source": "text"}}\n',
     r"unknown setting train.num_step; valid train settings: num_steps, tokens_per_batch, ")])
def test_train_reports_a_bad_config_file_in_one_line(tmp_path, capsys, config_text, message):
  (tmp_path / 'bad.py').write_text(config_text)
  assert cli.main(['train', '--config', str(tmp_path / 'bad.py'), '--workdir',
                   str(tmp_path / 'w')]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith('error: ') and re.search(message, err[0]), err
  assert not (tmp_path / 'w').exists()


@pytest.mark.parametrize('flags,message', [
    (['--accum_steps', '0'], 'error: accum_steps must be >= 1, got 0.'),
    (['--log-every-steps', '0'], 'error: log_every_steps must be >= 1, got 0.'),
    (['--set', 'train.row_len=16'], 'error: row_len=16 is shorter than max_len=64: the longest '
                                    'pairs would not fit in a row; set row_len >= max_len.'),
    (['--checkpoint-every-steps', '-5'], 'error: checkpoint_every_steps must be > 0 (or unset), '
                                         'got -5.'),
    (['--set', 'model.dropout'], "error: --set 'model.dropout': expected SECTION.NAME=VALUE with "
                                 'SECTION one of model, train, data (e.g. --set '
                                 'model.dropout_rate=0.2).'),
    (['--set', 'model.dropout=0.2'], 'error: unknown setting model.dropout; valid model settings: '
                                     'vocab_size, num_layers, d_model, d_ff, num_heads, qk_dim, '
                                     'v_dim, dropout_rate, attention_dropout_rate, '
                                     'relu_dropout_rate, label_smoothing, pre_ln, max_len, '
                                     'learned_positions, attention_window, warmup_steps, '
                                     'adam_b1, adam_b2, adam_eps, grad_clip_norm, weight_decay, '
                                     'execution.dtype, execution.attention, execution.remat, '
                                     'execution.loss_chunk.'),
    (['--set', 'train.num_steps=many'], "error: --set train.num_steps: expected int, got 'many'."),
    (['--set', 'model.qk_dim=x'], "error: --set model.qk_dim: expected int or None, got 'x'."),
    (['--set', 'model.pre_ln=maybe'], "error: --set model.pre_ln: expected bool, got 'maybe'."),
    (['--set', 'model.execution.dtype=int8'],
     'error: --set: dtype must be float32 or bfloat16, got int8.'),
    (['--set', 'model.execution.dtype=half-ish'],
     "error: --set model.execution.dtype: expected float32 or bfloat16, got 'half-ish'."),
    (['--set', 'model.execution.attention=flash'],
     "error: --set: attention must be 'einsum' or 'fused', got 'flash'."),
    (['--set', 'data.source=web'], "error: --set: data.source must be 'wmt14', 'text' or "
                                   "'embedded', got 'web'.")])
def test_train_refuses_bad_settings_before_any_work(tmp_path, capsys, flags, message):
  argv = ['train', '--config', str(ROOT / 'tests' / 'tiny_config.py'), '--workdir',
          str(tmp_path / 'w'), '--source', 'text', '--train-src', 'none.en', '--train-tgt',
          'none.de', *flags]
  assert cli.main(argv) == 1
  assert capsys.readouterr().err.strip().splitlines() == [message]
  assert not (tmp_path / 'w').exists()


def test_every_setting_can_be_set_from_the_command_line():
  def recipe(*argv):
    return cli.recipe_of(cli.build_parser().parse_args(
        ['train', '--config', 'demo', '--workdir', 'w', *argv]))
  changed = recipe('--set', 'model.dropout_rate=0.2', '--set', 'train.num_steps=5000',
                   '--set', 'model.vocab_size=8000', '--set', 'model.qk_dim=none',
                   '--set', 'model.execution.dtype=bfloat16', '--set', 'model.pre_ln=true',
                   '--set', 'train.checkpoint_every_secs=none', '--set', 'data.train_pairs=10',
                   '--spm-sample-size', '77', '--fast-path', '--train_src', 'a.en')
  assert changed.model == recipes.load('demo').model.replace(
      dropout_rate=0.2, vocab_size=8000, pre_ln=True).run_as(dtype=jnp.bfloat16)
  assert changed.train == dataclasses.replace(
      recipes.load('demo').train, num_steps=5000, checkpoint_every_secs=None,
      spm_sample_size=77, fast_path=True)
  assert changed.data.train_pairs == 10 and changed.data.train_src == 'a.en'
  # --set wins over the shortcut flags; every field of every section has a name.
  assert recipe('--num-steps', '3', '--set', 'train.num_steps=4').train.num_steps == 4
  for section, cls in (('model', config.TransformerConfig), ('train', config.TrainConfig),
                       ('data', config.DataConfig)):
    names = {name.split('.')[0] for name in recipes.settable(section)}
    assert names == {f.name for f in dataclasses.fields(cls)}


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
  assert err[-1].startswith('jaxformer ') and 'must be an integer >= 1, got' in err[-1]


def test_demo_refuses_non_positive_counts_in_one_line(capsys):
  with pytest.raises(SystemExit) as exit_info:
    _script('demo').main(['--num-steps', '0'])
  assert exit_info.value.code == 2
  assert 'must be an integer >= 1, got' in capsys.readouterr().err.strip().splitlines()[-1]
