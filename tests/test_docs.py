"""The documentation: every example of README.md and the guides (docs/*.md) runs, on tiny
settings, or, where it needs a GPU, WMT14 or a long run (marked `<!-- not run: why -->` above
its block), is parsed by the command it names; the README stays a front page."""

import argparse
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from jaxformer import checkpoint, cli, commands, config, data, export, train
from jaxformer.data import sources

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / 'experiments'))
import opus_mt_folder  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = pathlib.Path(sys.executable).parent
# Every page a user reads; the benchmarks log is a record, and its commands are of their day.
PAGES = [ROOT / 'README.md', *sorted(p for p in (ROOT / 'docs').glob('*.md')
                                     if p.name != 'benchmarks-log.md')]
BLOCK = re.compile(r'(?:<!-- not run: ([^>]*?) -->\n)?^```(\w+)\n(.*?)^```', flags=re.S | re.M)
# Appended to a `jaxformer train` that the docs give (by its --config), so that it runs in
# seconds here.
FEW = ' --set train.num_steps=2 --set train.tokens_per_batch=1024'  # two small updates
TINY = {'multi30k': ' --set model.vocab_size=1000 --set model.num_layers=1' + FEW,
        'auto': ' --set model.num_layers=1' + FEW}


def _blocks(language: str) -> list[tuple[str, str, str | None]]:
  """(page, code, why it is not run or None) of every `language` block of PAGES."""
  return [(page.name, code, why or None) for page in PAGES
          for why, lang, code in BLOCK.findall(page.read_text()) if lang == language]


def _commands(code: str) -> list[str]:
  """The commands of a shell block: continuation lines joined, comments dropped."""
  lines = (line.split(' #')[0].strip() for line in code.replace('\\\n', ' ').splitlines())
  return [line for line in lines if line and not line.startswith('#')]


@pytest.fixture(scope='module')
def sandbox(tmp_path_factory, workdir, shared_data) -> pathlib.Path:
  """What the examples expect in their folder: train/val files (Multi30k's first lines), a
  trained workdir at workdirs/demo with its average and test split, the same model exported at
  exported/demo, a CTranslate2 export at exported/base-ct2 (a random model with the
  recipes' max_len, as the serving example decodes to CTranslate2's default length), and an
  OPUS-MT-like MarianMT folder at opus-mt-en-de (the fine-tuning guide's)."""
  folder = tmp_path_factory.mktemp('docs')
  for split, lines in (('train', 3000), ('val', 50)):
    for lang in ('en', 'de'):
      text = (shared_data / 'multi30k' / f'{split}.{lang}').read_text().splitlines(True)
      (folder / f'{split}.{lang}').write_text(''.join(text[:lines]))
  demo = folder / 'workdirs' / 'demo'
  demo.mkdir(parents=True)
  (demo / 'average-last5').symlink_to(workdir / 'average-last2')
  for name in ('mine', 'mine-news'):  # the own-data and fine-tuning guides', trained
    (folder / 'workdirs' / name).symlink_to(demo)
  for lang in ('en', 'de'):  # the fine-tuning guide's new data, and its test pairs
    (folder / f'news.{lang}').symlink_to(folder / f'train.{lang}')
    (folder / f'news-test.{lang}').symlink_to(folder / f'val.{lang}')
  (demo / 'test.en').write_text('a b c\nd e f\n')
  (demo / 'test.de').write_text('a b c\nd e f\n')
  params, cfg, spm_model, step = checkpoint.load(str(workdir / 'average-last2'))
  for name in ('demo', 'mine'):
    export.save(folder / 'exported' / name, params, cfg, spm_model, step=step)
  export.save_as('huggingface', workdir / 'average-last2', folder / 'exported' / 'mine-hf')
  # The fine-tuning guide's OPUS-MT folder, as experiments/opus_mt_folder.py makes it:
  opus_mt_folder.make(folder / 'opus-mt-en-de', *(
      (folder / f'train.{lang}').read_text().splitlines()[:1000] for lang in ('en', 'de')))
  text = data.read_parallel_text(folder / 'train.en', folder / 'train.de')
  tokenizer = data.train_tokenizer(text.src[:2000] + text.tgt[:2000], folder / 'ct2.model',
                                   vocab_size=500)
  cfg = config.tiny(vocab_size=500).replace(max_len=256)
  export.save_ctranslate2(folder / 'exported' / 'base-ct2',
                          train.create_train_state(cfg, jax.random.key(0)).params, cfg,
                          tokenizer.model_proto)
  return folder


def _run_python(page: str, folder: pathlib.Path, monkeypatch) -> dict:
  """Runs a page's python blocks in order, in one namespace, in `folder`."""
  monkeypatch.chdir(folder)
  namespace: dict = {}
  for name, code, why in _blocks('python'):
    if name == page:
      assert why is None, f'{page}: every python example runs'
      exec(compile(textwrap.dedent(code), page, 'exec'), namespace)  # noqa: S102
  return namespace


def test_readme_python_runs(sandbox, monkeypatch):
  ns = _run_python('README.md', sandbox, monkeypatch)
  assert ns['logits'].shape == (1, 4, 1000)
  assert float(ns['loss_sum']) > 0 and float(ns['tokens']) == 4
  assert int(ns['state'].step) == 3 and float(ns['metrics']['loss']) > 0


def test_library_guide_python_runs(sandbox, monkeypatch, capsys):
  ns = _run_python('library.md', sandbox, monkeypatch)
  assert ns['logits'].shape == (1, 1000)  # decode_step: one position's logits
  assert float(ns['peak']) == pytest.approx(6.988e-4, rel=1e-3)
  assert int(ns['train_state'].step) == 3
  np.testing.assert_array_equal(ns['ids'], [[2, 4, 6, 1, 0]])
  printed = capsys.readouterr().out.splitlines()
  assert printed[0] == '[[2 4 6 1 0]]' and printed[1].startswith("['")  # ids, a translation


def test_data_guide_python_runs(sandbox, monkeypatch):
  ns = _run_python('data.md', sandbox, monkeypatch)
  assert ns['batch']['src'].shape[:2] == (8, 12)
  assert ns['state'] == {
      'epoch': 0, 'block': 0, 'row': 96, 'seed': 0, 'shard_size': len(ns['corpus']),
      'src_len': ns['src_len'], 'tgt_len': 256, 'corpus': data.PackedBatches.corpus_id(
          ns['corpus'])}


def test_evaluation_guide_python_runs(sandbox, monkeypatch, capsys):
  ns = _run_python('evaluation.md', sandbox, monkeypatch)
  assert ns['model'].__class__.__name__ == 'Translator'  # CTranslate2's, the last
  marian, ctranslate2 = capsys.readouterr().out.splitlines()  # one translation each
  assert marian.startswith("['") and marian.endswith("']") and ctranslate2


def _shell(run: bool) -> list[tuple[str, str]]:
  """(page, command) of the shell blocks that run here (`run`) or are only parsed."""
  found: dict[str, str] = {}
  for page, code, why in _blocks('sh'):
    for command in _commands(code) if (why is None) == run else ():
      found.setdefault(command, page)  # a command two pages give is checked once
  return [(page, command) for command, page in found.items()]


@pytest.mark.slow
@pytest.mark.parametrize('page,command', _shell(run=True), ids=lambda x: x[:60])
def test_shell_example_runs(page, command, sandbox, tmp_path):
  """As written, with the installed command, in a folder of its own that links to the
  sandbox's files (a workdir or an export it makes is its own); a training gets TINY
  settings."""
  written = (re.search(r'--workdir (workdirs/\S+)', command) if 'jaxformer train' in command
             else re.search(r' (exported/\S+)', command) if 'jaxformer export' in command
             else None)
  for entry in sandbox.iterdir():
    if entry.name not in ('workdirs', 'exported'):
      (tmp_path / entry.name).symlink_to(entry)
  for folder in ('workdirs', 'exported'):
    (tmp_path / folder).mkdir()
    for made in (sandbox / folder).iterdir():  # (not the one the command writes)
      if not (written and written[1] == f'{folder}/{made.name}'):
        (tmp_path / folder / made.name).symlink_to(made)
  if '--init-from' in command:  # the parent's model, not the tiny one
    command += FEW
  elif 'jaxformer train' in command:
    config_name = re.search(r'--config (\w+)', command)
    command += TINY[config_name[1] if config_name else 'auto']
  env = dict(os.environ, PATH=f'{BIN}:{os.environ["PATH"]}')  # the XLA cache's variables too
  result = subprocess.run(['bash', '-c', command], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env=env)
  assert result.returncode == 0, f'{page}: {command}\n{result.stderr[-3000:]}'
  if 'jaxformer eval' in command:
    assert 'sacreBLEU' in result.stdout
  if 'jaxformer translate' in command:
    assert len(result.stdout.splitlines()) == 1


def _parse(command: str) -> None:
  """Checks a command that does not run here against what it calls."""
  command = command.split(' | ')[-1]  # echo "..." | jaxformer translate ...
  words = shlex.split(command)
  while re.fullmatch(r'[A-Z_]+=\S*', words[0]):  # VAR=value prefixes
    words.pop(0)
  if words[0] == 'jaxformer':
    args = cli.build_parser().parse_args(words[1:])  # an unknown flag exits
    if words[1] == 'train':
      commands.recipe_of(args)  # the recipe, its variant and every --set
  elif words[0] == 'make':
    result = subprocess.run(['make', '-n', *words[1:]], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
  elif words[:2] == ['python', '-c']:
    assert words[2] == sources.prepare_command('wmt14_translate/de-en', '/data/tfds')[11:-1]
  elif words[0] == 'python':
    result = subprocess.run([sys.executable, str(ROOT / words[1]), '--help'], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    flags = [w.split('=')[0] for w in words[2:] if w.startswith('--')]
    assert result.returncode == 0 and all(f in result.stdout for f in flags), result.stdout
  elif words[0] == 'echo':  # an example's input written to a file
    assert '>' in words, command
  elif words[0] == 'curl':  # a request to `jaxformer serve`: the body its protocol takes
    body = json.loads(words[words.index('-d') + 1])
    page = words[-1].rsplit('/', 1)[-1]
    assert page in ('translate', 'score') and isinstance(body['src'], list), command
    fields = ({'src', 'tgt', 'token_log_probs'} if page == 'score' else
              {'src', 'nbest', 'prefix', 'first_index', *config.DecodingConfig.PER_REQUEST})
    assert set(body) <= fields, body
  else:
    raise AssertionError(f'no check for {command!r}: run it, or teach _parse to check it')


@pytest.mark.parametrize('page,command', _shell(run=False), ids=lambda x: x[:60])
def test_shell_example_that_needs_more_parses(page, command):
  _parse(command)


def test_every_block_is_run_or_says_why_not():
  marked = [(page, why) for page, _, why in _blocks('sh') if why is not None]
  assert all(re.search(r'needs|long|runs it', why) for _, why in marked), marked
  assert len(_shell(run=True)) >= 4 and len(_shell(run=False)) >= 10


def test_readme_is_a_front_page():
  readme = (ROOT / 'README.md').read_text()
  assert len(readme.splitlines()) <= 200
  for page in PAGES:
    assert not re.search(r'session|issue [0-9]', page.read_text(), flags=re.I), page.name
  for link in re.findall(r'\]\(([^)#]+)', readme):  # every relative link names a file here
    assert link.startswith('http') or (ROOT / link).exists(), link


def test_every_make_target_in_the_docs_exists():
  makefile = (ROOT / 'Makefile').read_text()
  targets = set(re.findall(r'^([a-z][\w-]*(?: [a-z][\w-]*)*):', makefile, flags=re.M))
  defined = {t for group in targets for t in group.split()}
  named = {m for page in PAGES for m in re.findall(r'\bmake ([a-z][\w-]*)', page.read_text())}
  assert named and named <= defined, named - defined


def test_console_script_is_installed():
  result = subprocess.run([str(BIN / 'jaxformer'), '--help'], capture_output=True, text=True,
                          check=True)
  assert 'Attention Is All You Need' in result.stdout


def _options(parser: argparse.ArgumentParser) -> set[str]:
  """Every option string of `parser` and of its subcommands."""
  found = set()
  for action in parser._actions:  # argparse has no public walk
    found |= set(action.option_strings)
    if isinstance(action, argparse._SubParsersAction):
      for sub in action.choices.values():
        found |= _options(sub)
  return found


def test_every_flag_the_docs_name_exists():
  """A flag in the docs is one of the `jaxformer` command's or of a script of experiments/,
  except the other tools' flags the guides name (sacrebleu's, TensorBoard's, XLA's,
  huggingface-cli's)."""
  known = _options(cli.build_parser()) | {'--echo', '--logdir', '--local-dir'}
  for script in [*(ROOT / 'experiments').rglob('*.py'), ROOT / 'experiments' / 'gpu_bench.sh']:
    known |= set(re.findall(r"""['"](--[a-z][a-z0-9_-]*)""", script.read_text()))
  named = {flag: page.name for page in PAGES
           for flag in re.findall(r'(?<![\w-])(--[a-z][a-z0-9_-]*)', page.read_text())}
  assert {flag: page for flag, page in named.items()
          if flag not in known and not flag.startswith('--xla_')} == {}
