"""The README's code runs and its commands exist."""

import pathlib
import re
import subprocess
import sys
import textwrap

import jax
import pytest

from jaxformer import config, data, export, train

ROOT = pathlib.Path(__file__).resolve().parents[1]


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
  assert int(namespace['train_state'].step) == 3 and float(namespace['metrics']['loss']) > 0
  assert namespace['batch']['src'].shape[:2] == (8, 12)
  assert namespace['state'] == {
      'epoch': 0, 'block': 0, 'row': 96, 'seed': 0, 'shard_size': 29000, 'src_len': 248,
      'tgt_len': 256, 'corpus': data.PackedBatches.corpus_id(namespace['corpus'])}


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
