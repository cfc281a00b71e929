"""The installed package alone trains, evaluates, exports and translates: no clone at run time.

The wheel is built from this checkout and installed into a folder of its own; every command then
runs from an empty folder with only that install (and the venv's dependencies) importable.
"""

import ast
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
from helpers import without_tensorflow

from jaxformer.data import embedded

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope='module')
def installed(tmp_path_factory) -> pathlib.Path:
  wheels, target = (tmp_path_factory.mktemp(name) for name in ('wheels', 'site'))
  subprocess.run([sys.executable, '-m', 'pip', 'wheel', '--quiet', '--no-deps',
                  '--no-build-isolation', '--wheel-dir', str(wheels), str(ROOT)], check=True,
                 capture_output=True, timeout=300)
  (wheel,) = wheels.glob('jaxformer-*.whl')
  subprocess.run([sys.executable, '-m', 'pip', 'install', '--quiet', '--no-deps', '--target',
                  str(target), str(wheel)], check=True, capture_output=True, timeout=300)
  return target


def _run(installed: pathlib.Path, cwd: pathlib.Path, *argv: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, PYTHONPATH=str(installed))
  result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  return result


@pytest.mark.slow
def test_train_eval_export_translate_from_the_installed_package(installed, tmp_path):
  jaxformer = str(installed / 'bin' / 'jaxformer')  # the console script of the install
  where = _run(installed, tmp_path, sys.executable, '-c',
               'import jaxformer.recipes; print(jaxformer.recipes.__file__)')
  assert where.stdout.startswith(str(installed))  # not this checkout

  _run(installed, tmp_path, jaxformer, 'train', '--config', 'demo', '--workdir', 'w',
       '--set', 'train.num_steps=4', '--set', 'train.tokens_per_batch=1024', '--set',
       'data.train_pairs=2000', '--set', 'train.spm_sample_size=4000', '--set',
       'train.bleu_sentences=0',
       '--set', 'model.num_layers=1')  # the commands' wiring, not the model, is tested here
  assert sorted(os.listdir(tmp_path / 'w' / 'checkpoints')) == ['4']

  test = embedded.splits(10, 10, 10)['test']
  (tmp_path / 'test.en').write_text('\n'.join(test.src) + '\n')
  (tmp_path / 'test.de').write_text('\n'.join(test.tgt) + '\n')
  scored = _run(installed, tmp_path, jaxformer, 'eval', '--model', 'w', '--src', 'test.en',
                '--ref', 'test.de', '--output', 'hyps.de')
  summary = json.loads(scored.stdout.strip().splitlines()[-1])
  assert summary['segments'] == 10 and {'sacrebleu', 'tokenized_bleu', 'chrf'} <= set(summary)

  _run(installed, tmp_path, jaxformer, 'export', 'w', 'exported')
  code = ('import sys; from jaxformer.translation import Translator; '
          "t = Translator.from_pretrained('exported'); "
          "sys.stdout.write(''.join(h + '\\n' for h in t.translate(open('test.en').read()"
          '.splitlines())))')
  pretrained = _run(installed, tmp_path, sys.executable, '-c', code)
  assert pretrained.stdout == (tmp_path / 'hyps.de').read_text()  # the same model


def test_import_jaxformer_reaches_every_submodule_and_loads_the_heavy_ones_on_first_use():
  """`jaxformer.train.train_step` and the like work after a plain `import jaxformer` (they
  raised AttributeError), and the import itself loads neither orbax, sentencepiece nor TF; the
  command's modules, all loaded, load neither TF nor sacremoses (scoring loads it when used)."""
  code = ('import sys, jaxformer\n'
          "heavy = [m for m in ('orbax', 'sentencepiece', 'tensorflow') if m in sys.modules]\n"
          'jaxformer.train.train_step, jaxformer.translation.Translator\n'
          'jaxformer.checkpoint.average_checkpoints, jaxformer.data.PackedBatches\n'
          'jaxformer.recipes.load, jaxformer.trainer, jaxformer.decode.beam_search\n'
          "assert set(jaxformer.__all__) <= set(dir(jaxformer))\n"
          'import jaxformer.cli\n'
          "print(heavy, [m for m in ('sacremoses', 'tensorflow') if m in sys.modules])\n")
  result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.strip() == '[] []'
  missing = subprocess.run([sys.executable, '-c', 'import jaxformer; jaxformer.trian'],
                           capture_output=True, text=True, timeout=120, cwd=ROOT)
  assert "module 'jaxformer' has no attribute 'trian'" in missing.stderr


def test_licence_citation_and_changelog_match_the_package():
  """The licence pyproject.toml names is the one shipped, and the citation names the paper and
  this version."""
  import tomllib  # pylint: disable=g-import-not-at-top

  import yaml  # pylint: disable=g-import-not-at-top

  import jaxformer  # pylint: disable=g-import-not-at-top
  project = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']
  licence = (ROOT / 'LICENSE').read_text()
  assert project['license'] == 'Apache-2.0' and 'Apache License\n' in licence
  assert 'Version 2.0, January 2004' in licence and 'END OF TERMS AND CONDITIONS' in licence
  citation = yaml.safe_load((ROOT / 'CITATION.cff').read_text())
  assert citation['version'] == jaxformer.__version__ == project['version']
  assert citation['license'] == project['license']
  assert citation['preferred-citation']['title'] == 'Attention Is All You Need'
  assert (ROOT / 'CHANGELOG.md').read_text().startswith('# Changelog')


def test_no_function_of_the_package_is_over_80_lines():
  """The house rule (docs/ARCHITECTURE.md): a longer function becomes a list of named steps."""
  long = []
  for path in sorted((ROOT / 'jaxformer').rglob('*.py')):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.FunctionDef) and node.end_lineno - node.lineno + 1 > 80:
        long.append(f'{path.relative_to(ROOT)}:{node.lineno} {node.name}')
  assert long == []


# Run before a script: TensorFlow and tensorflow-datasets are absent, as in the core install
# (importing either fails, and importlib.util.find_spec finds neither).
@pytest.mark.slow
def test_everything_but_wmt14_works_without_tensorflow(tmp_path):
  """Every module imports where importing TensorFlow fails, and WMT14's entries say in one line
  what to install, before any work (the demo's short run, eval and translate without
  TensorFlow: test_demo.py)."""
  found = without_tensorflow(
      'import contextlib, importlib, io, json, pkgutil, jaxformer\n'
      "names = [m.name for m in pkgutil.walk_packages(jaxformer.__path__, 'jaxformer.')]\n"
      'for name in names: importlib.import_module(name)\n'
      'from jaxformer.__main__ import main\n'
      'results = [len(names)]\n'
      "for argv in (['train', '--config', 'base', '--workdir', 'b', '--allow-cpu'],\n"
      "             ['eval', '--model', 'w']):\n"
      '  err = io.StringIO()\n'
      '  with contextlib.redirect_stderr(err):\n'
      '    results.append([main(argv), err.getvalue().strip().splitlines()[-1]])\n'
      'print(json.dumps(results))', cwd=tmp_path)
  assert found.returncode == 0, found.stderr[-2000:]
  imported, *refusals = json.loads(found.stdout.splitlines()[-1])
  assert imported > 30
  assert refusals == [[1, 'error: WMT14 is read through tensorflow-datasets, which this install '
                       "lacks: pip install 'jaxformer[wmt]' (the make targets install it)."]] * 2
  assert not (tmp_path / 'b').exists()  # refused before any work


def test_every_module_has_its_test_file():
  """The house rule (README): tests/test_<module>.py, test_data_<module>.py for data/, and
  test_recipes.py and test_formats.py for those packages; private modules are tested through
  their users."""
  package = ROOT / 'jaxformer'
  expected = {f'test_{"data_" if path.parent.name == "data" else ""}{path.stem}.py'
              for path in [*package.glob('*.py'), *(package / 'data').glob('*.py')]
              if not path.stem.startswith('_')} | {'test_recipes.py', 'test_formats.py'}
  missing = sorted(name for name in expected if not (ROOT / 'tests' / name).is_file())
  assert not missing, missing


# What a measurement looks like in prose: a date, a time taken on something, a score, a rate.
MEASURED = re.compile(r'20\d\d-\d\d-\d\d|\d+(\.\d+)? (min|ms|s) (on|of|with) |sacreBLEU \d|'
                      r'\d[\d,]* (target )?tokens/s|\d(\.\d+)?× ')


def test_measured_figures_live_in_the_benchmarks_not_in_the_code():
  """The house rule (README, STYLE): docstrings and comments say why; a figure that was measured
  lives in docs/BENCHMARKS.md (and its log), with its command, machine and date, where it can
  be rerun and replaced. The paper's own figures ("Paper:" lines) are quotations, not ours."""
  found = [f'{path.relative_to(ROOT)}:{number}: {line.strip()}'
           for path in sorted((ROOT / 'jaxformer').rglob('*.py'))
           for number, line in enumerate(path.read_text().splitlines(), 1)
           if MEASURED.search(line) and not line.lstrip().startswith('Paper:')]
  assert not found, found

