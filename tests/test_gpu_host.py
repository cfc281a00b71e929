"""GPU hosts: the jax extras resolve, the Makefile picks the build, and `make gpu-check` works
(here on the CPU, as it does on a host without a GPU)."""

import json
import os
import pathlib
import re
import subprocess
import sys
import tomllib

import jax
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXTRAS = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']['optional-dependencies']


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
  assert f"{venv}/bin/python -m pip install --quiet -e '.[test,cuda12]'" in plan
  assert plan.index('rm -rf') < plan.index('python3 -m venv')
  assert _make('-n', 'install', f'VENV={venv}', JAX_EXTRA='cpu').stdout == ''  # up to date


def test_the_extras_pin_the_same_jax_as_the_package():
  dependencies = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']['dependencies']
  pin = next(d for d in dependencies if d.startswith('jax>')).split('#')[0].strip()
  assert EXTRAS['cpu'] == [pin]
  assert EXTRAS['cuda12'] == [pin.replace('jax', 'jax[cuda12]')]
  assert EXTRAS['cuda13'] == [pin.replace('jax', 'jax[cuda13]')]
  assert jax.__version__ == '0.10.2' or re.fullmatch(r'0\.10\.\d+', jax.__version__)


@pytest.mark.slow
def test_the_cuda_extras_resolve_to_a_plugin_of_the_same_version(tmp_path):
  """pip's resolver on both CUDA extras, for this host's platform (nothing is installed)."""
  report = tmp_path / 'report.json'
  subprocess.run([sys.executable, '-m', 'pip', 'install', '--dry-run', '--ignore-installed',
                  '--quiet', '--report', str(report), *EXTRAS['cuda12'], *EXTRAS['cuda13']],
                 check=True, capture_output=True, timeout=600)
  versions = {item['metadata']['name']: item['metadata']['version']
              for item in json.loads(report.read_text())['install']}
  jax_version = versions['jax']
  assert re.fullmatch(r'0\.10\.\d+', jax_version)
  for name in ('jaxlib', 'jax-cuda12-plugin', 'jax-cuda13-plugin', 'jax-cuda12-pjrt',
               'jax-cuda13-pjrt'):
    assert versions[name] == jax_version, (name, versions)


@pytest.mark.slow
def test_make_gpu_check_passes_on_cpu():
  result = subprocess.run(['make', '-s', 'gpu-check'], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 0, result.stdout + result.stderr
  out = result.stdout
  assert out.startswith('cpu: ') and 'no GPU: jax runs on cpu' in out
  rows = re.findall(r'^(.+?)\s{2,}(pass|FAIL)\s', out, flags=re.M)
  assert [name for name, _ in rows] == [
      'devices', 'fused attention == einsum', 'training, bfloat16 fast path',
      'cached == uncached decoding', 'checkpoint save/restore/average']
  assert {result for _, result in rows} == {'pass'}
  assert '5 passed, 0 failed' in out


@pytest.mark.slow
def test_gpu_check_fails_what_is_broken(monkeypatch, capsys):
  """Fused attention that scales its output, and too few steps to learn: both fail, the
  checks that need the trained model not run, and exit status 1."""
  sys.path.insert(0, str(ROOT / 'experiments'))
  import gpu_check  # pylint: disable=g-import-not-at-top
  fused = jax.nn.dot_product_attention
  monkeypatch.setattr(jax.nn, 'dot_product_attention', lambda *a, **k: 1.5 * fused(*a, **k))
  assert gpu_check.main(['--steps', '10']) == 1
  out = capsys.readouterr().out
  assert re.search(r'^fused attention == einsum\s+FAIL\s+AssertionError: relative error', out,
                   flags=re.M)
  assert re.search(r'^training, bfloat16 fast path\s+FAIL\s+AssertionError: loss', out, flags=re.M)
  assert re.search(r'^cached == uncached decoding\s+FAIL\s+not run', out, flags=re.M)
  assert '1 passed, 4 failed' in out
