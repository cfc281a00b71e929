"""The Makefile: the jax build it installs, its targets, huge pages and gpu-check."""

import gzip
import json
import os
import pathlib
import re
import subprocess
import sys
import time
import tomllib

import jax
import pytest
from helpers import run_folder

from jaxformer.data import sources

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXTRAS = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']['optional-dependencies']




def _start_cuda_resolution() -> pathlib.Path:
  """pip's resolution of both CUDA extras for this host's platform (nothing installed), started
  in the background when this file is collected, by the first of the run's workers to get here:
  its seconds are spent waiting on the index, so it waits beside the other tests. fast-deps
  reads each wheel's metadata by HTTP range requests: without it pip downloads every wheel the
  extras pull in (6.5 GB of CUDA libraries), and one interrupted download failed a CI run.
  Its report is `report.json` in the run's folder, then its exit status in report.json.rc."""
  folder = run_folder('pip')
  folder.mkdir(exist_ok=True)
  report = folder / 'report.json'
  try:
    os.close(os.open(folder / 'started', os.O_CREAT | os.O_EXCL))
  except FileExistsError:  # another worker started it
    return report
  resolve = [sys.executable, '-m', 'pip', 'install', '--dry-run', '--ignore-installed', '--quiet',
             '--use-feature=fast-deps', '--report', str(report), *EXTRAS['cuda12'],
             *EXTRAS['cuda13']]
  os.posix_spawn('/bin/sh', ['sh', '-c', '"$@" 2>"$0.err"; echo $? >"$0.rc.part" && '
                             'mv "$0.rc.part" "$0.rc"', str(report), *resolve], os.environ)
  return report


CUDA_REPORT = _start_cuda_resolution()


def _make(*args: str, path: str | None = None, **env: str) -> subprocess.CompletedProcess:
  environment = {k: v for k, v in os.environ.items() if k != 'JAX_EXTRA'}
  environment.update(env, PATH=f'{path}:{os.environ["PATH"]}' if path else os.environ['PATH'])
  return subprocess.run(['make', '-s', *args], cwd=ROOT, capture_output=True, text=True,
                        env=environment, timeout=60)


def _fake_nvidia_smi(folder: pathlib.Path, driver: str | None) -> str:
  """A folder holding an nvidia-smi that reports `driver`, or fails as with no driver loaded."""
  script = folder / 'nvidia-smi'
  script.write_text('#!/bin/sh\n' + (f'echo {driver}\n' if driver else 'exit 9\n'))
  script.chmod(0o755)
  return str(folder)


@pytest.mark.parametrize('driver,extra', [(None, 'cpu'), ('550.54.15', 'cuda12'),
                                          ('580.65.06', 'cuda13'), ('', 'cpu')])
def test_make_picks_the_jax_build_from_nvidia_smi(tmp_path, driver, extra):
  path = None if driver is None else _fake_nvidia_smi(tmp_path, driver)
  if driver is None and subprocess.run('command -v nvidia-smi', shell=True).returncode == 0:
    pytest.skip('this host has a real nvidia-smi')
  assert _make('jax-extra', path=path).stdout.strip() == extra


def test_jax_extra_overrides_the_choice_and_is_checked(tmp_path):
  path = _fake_nvidia_smi(tmp_path, '580.65.06')
  assert _make('jax-extra', path=path, JAX_EXTRA='cpu').stdout.strip() == 'cpu'
  assert _make('jax-extra', JAX_EXTRA='cuda12').stdout.strip() == 'cuda12'
  result = _make('jax-extra', JAX_EXTRA='rocm')
  assert result.returncode != 0
  assert "JAX_EXTRA must be cpu, cuda12 or cuda13, got 'rocm'" in result.stderr


def test_a_venv_of_the_other_kind_is_rebuilt_and_the_same_kind_reused(tmp_path):
  venv = tmp_path / 'venv'
  venv.mkdir()
  (venv / '.installed-cpu').touch()
  (venv / '.installed-cpu').touch()
  os.utime(venv / '.installed-cpu', (2e9, 2e9))  # newer than pyproject.toml
  plan = _make('-n', 'install', f'VENV={venv}', JAX_EXTRA='cuda12').stdout
  assert f'rm -rf {venv}' in plan
  assert f"{venv}/bin/python -m pip wheel --quiet --wheel-dir \"$tmp/wheels\" " \
         "'.[test,docs,wmt,cuda12]'" in plan
  assert "--no-index --find-links \"$tmp/wheels\" --compile-bytecode " \
         "'jaxformer[test,docs,wmt,cuda12]'" in plan  # uv: pip's wheels alone, by name
  assert f"{venv}/bin/python -m pip install --quiet --no-deps -e ." in plan
  assert plan.index('--no-deps -e .') < plan.index(f'{venv}/bin/python -m compileall -q jaxformer')
  assert plan.index('rm -rf') < plan.index('python3 -m venv')
  assert _make('-n', 'install', f'VENV={venv}', JAX_EXTRA='cpu').stdout == ''  # up to date


def test_the_extras_pin_the_same_jax_as_the_package():
  dependencies = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']['dependencies']
  pin = next(d for d in dependencies if d.startswith('jax>')).split('#')[0].strip()
  assert EXTRAS['cpu'] == [pin]
  assert EXTRAS['cuda12'] == [pin.replace('jax', 'jax[cuda12]')]
  assert EXTRAS['cuda13'] == [pin.replace('jax', 'jax[cuda13]')]
  assert re.fullmatch(r'0\.1[01]\.\d+', jax.__version__)  # the versions the suite ran on


@pytest.mark.slow
def test_the_cuda_extras_resolve_to_a_plugin_of_the_same_version():
  """pip's resolver on both CUDA extras, for this host's platform (nothing is installed)."""
  done, deadline = CUDA_REPORT.with_name('report.json.rc'), time.monotonic() + 600
  while not done.exists():  # (started at collection: _start_cuda_resolution)
    assert time.monotonic() < deadline, 'pip did not resolve the CUDA extras in 10 minutes'
    time.sleep(0.5)
  assert done.read_text().strip() == '0', CUDA_REPORT.with_name('report.json.err').read_text()
  versions = {item['metadata']['name']: item['metadata']['version']
              for item in json.loads(CUDA_REPORT.read_text())['install']}
  jax_version = versions['jax']
  assert re.fullmatch(r'0\.1[01]\.\d+', jax_version)
  for name in ('jaxlib', 'jax-cuda12-plugin', 'jax-cuda13-plugin', 'jax-cuda12-pjrt',
               'jax-cuda13-pjrt'):
    assert versions[name] == jax_version, (name, versions)


def test_make_gpu_check_runs_the_check_script_with_its_args():
  """`make gpu-check` is the script (tests/test_gpu_check.py runs it whole, on this CPU)."""
  result = _make('-n', 'gpu-check', 'ARGS=--fused-steps 5')
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip().endswith('experiments/gpu_check.py --fused-steps 5')


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


@pytest.mark.parametrize('target', ['train-base', 'train-big'])
def test_recipes_fail_fast_without_wmt14(target, tmp_path):
  result = subprocess.run(['make', '-s', target, f'TFDS_DATA_DIR={tmp_path}',
                           f'WORKDIR={tmp_path / "w"}', 'ARGS=--allow-cpu'], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
  assert result.returncode != 0
  error, _ = result.stderr.strip().splitlines()  # (tfds's 'Variant folder' warning came first)
  assert error.startswith('error: tfds dataset wmt14_translate/de-en is not prepared')
  assert sources.prepare_command('wmt14_translate/de-en', tmp_path) in result.stderr


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


def test_make_help_lists_every_target():
  """Every target of .PHONY but help itself has its line in `make help` (install and clean,
  which the CPU refusal and the README name, had none)."""
  text = (ROOT / 'Makefile').read_text()
  phony = re.search(r'^\.PHONY:(.*?)(?<!\\)\n', text, flags=re.M | re.S).group(1)
  targets = set(phony.replace('\\', ' ').split()) - {'help'}
  listed = set(re.findall(r'^make (\S+)', _make('help').stdout, flags=re.M))
  assert targets <= listed, sorted(targets - listed)


@pytest.mark.slow
def test_train_multi30k_reads_the_corpus_as_multi30k_ships_it(tmp_path):
  """The Multi30k repository ships train.en.gz etc.: the make target reads them (a short run,
  which averages the one checkpoint it has and scores that)."""
  sys.path.insert(0, str(ROOT / 'tests'))
  from helpers import synthetic_text  # pylint: disable=g-import-not-at-top
  for split, count in (('train', 600), ('val', 10), ('test_2016_flickr', 10)):
    text = synthetic_text(count, seed=len(split))
    for lang, lines in (('en', text.src), ('de', text.tgt)):
      (tmp_path / f'{split}.{lang}.gz').write_bytes(gzip.compress(
          ''.join(line + '\n' for line in lines).encode()))
  result = subprocess.run(
      ['make', '-s', 'train-multi30k', f'DATA_DIR={tmp_path}', f'WORKDIR={tmp_path / "w"}',
       'ARGS=--num-steps 1 --set model.vocab_size=400 --set model.num_layers=1 '
       '--tokens-per-batch 2048 --sample-translations 0'], cwd=ROOT, capture_output=True,
      text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f'{tmp_path}/train.en.gz|{tmp_path}/train.de.gz: read 600 pairs' in result.stderr
  assert result.stdout.splitlines()[-6].startswith('sacreBLEU ')
  assert f'test set: {tmp_path}/test_2016_flickr.en.gz' in result.stdout
  assert (tmp_path / 'w' / 'average-last1').is_dir()


def test_train_multi30k_scores_its_newest_average_or_else_its_newest_checkpoint(tmp_path):
  """The eval after training takes the largest average-lastN of the workdir, and the workdir
  itself (its newest checkpoint) where the run averaged none, never an empty --model."""
  log = tmp_path / 'calls'
  stub = tmp_path / 'jaxformer'
  stub.write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
  stub.chmod(0o755)
  workdir = tmp_path / 'w'
  workdir.mkdir()

  def evaluated() -> str:
    log.unlink(missing_ok=True)
    result = _make('train-multi30k', f'JAXFORMER={stub}', f'DATA_DIR={tmp_path}',
                   f'WORKDIR={workdir}')
    assert result.returncode == 0 and not result.stderr, result.stderr
    train, evaluation = log.read_text().splitlines()
    assert train.startswith(f'train --config multi30k --workdir {workdir} ')
    assert evaluation.endswith(f'--src {tmp_path}/test_2016_flickr.en '
                               f'--ref {tmp_path}/test_2016_flickr.de')
    return evaluation.split()[2]  # eval --model MODEL ...

  assert evaluated() == str(workdir)
  for n in (5, 10, 2):
    (workdir / f'average-last{n}').mkdir()
  assert evaluated() == str(workdir / 'average-last10')
