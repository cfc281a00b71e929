"""jaxformer.compilation and the commands' compilation cache: a second process compiles nothing
that the first compiled; a folder that cannot be written, or a disk that fills, is one warning
line and the same output; --no-compilation-cache keeps nothing; a Programs compiles a shape
once whatever object its weights come in."""

import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import TESTS

from jaxformer import cli, compilation, translation

_LINES = ('the man sees a dog', 'the dog')


def _run(tmp_path: pathlib.Path, model: pathlib.Path, *flags: str, fault: str = 'none'
         ) -> tuple[str, list[str], int]:
  """(stdout, stderr's lines but the count, programs compiled) of `jaxformer translate`, with
  `fault` (tests/faults.py) injected."""
  env = {k: v for k, v in os.environ.items() if not k.startswith('JAX_')}  # not the tests' cache
  env.update(JAXFORMER_CACHE_DIR=str(tmp_path / 'cache'))
  result = subprocess.run([sys.executable, str(TESTS / 'faults.py'), fault, 'translate',
                           '--model', str(model), '--batch-size', '2', *flags],
                          input='\n'.join(_LINES) + '\n', capture_output=True, text=True,
                          env=env, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  *lines, count = result.stderr.strip().split('\n')
  return result.stdout, lines, int(count.removeprefix('compiled '))


def _entries(tmp_path: pathlib.Path) -> set[str]:
  return {p.name for p in (tmp_path / 'cache' / 'xla').glob('*-cache')}


def _expected(workdir: pathlib.Path) -> str:
  translator = translation.Translator.from_checkpoint(str(workdir), batch_size=2)
  return ''.join(line + '\n' for line in translator.translate(_LINES))


def test_a_second_command_loads_every_program_the_first_compiled(workdir, tmp_path):
  """And --no-compilation-cache compiles them all again, keeping nothing."""
  first, _, compiled = _run(tmp_path, workdir)
  stored = _entries(tmp_path)
  assert first == _expected(workdir)
  assert compiled > 0 and len(stored) >= compiled, (compiled, stored)
  second, lines, recompiled = _run(tmp_path, workdir)
  assert (second, recompiled, _entries(tmp_path)) == (first, 0, stored)
  assert not [line for line in lines if 'cache' in line], lines
  (tmp_path / 'off').mkdir()
  uncached, _, again = _run(tmp_path / 'off', workdir, '--no-compilation-cache')
  assert (uncached, again) == (first, compiled) and not (tmp_path / 'off' / 'cache').exists()


@pytest.mark.parametrize('fault, message', [
    ('cache-read-only',
     r'compilation cache off: cannot write \S+/cache/xla \(Read-only file system\)'),
    ('cache-full', r'compilation cache: No space left on device; this run compiles what it '
                   'cannot load or store')])
def test_a_cache_that_cannot_be_written_is_one_warning_line(workdir, tmp_path, fault, message):
  output, lines, compiled = _run(tmp_path, workdir, fault=fault)
  assert output == _expected(workdir) and compiled > 0
  warnings = [line for line in lines if 'cache' in line.lower()]
  assert len(warnings) == 1 and re.search(message, warnings[0]), lines
  assert not _entries(tmp_path)


def test_the_cache_folder_follows_the_environment():
  home = pathlib.Path.home()
  assert cli.compilation_cache_dir({}) == home / '.cache' / 'jaxformer' / 'xla'
  assert cli.compilation_cache_dir({'XDG_CACHE_HOME': '/x'}) == pathlib.Path('/x/jaxformer/xla')
  assert cli.compilation_cache_dir({'XDG_CACHE_HOME': '/x', 'JAXFORMER_CACHE_DIR': '/y'}) == \
      pathlib.Path('/y/xla')


def test_programs_know_their_weights_and_compile_a_shape_once():
  """compilation.Programs remembers the key of its last FIRSTS first arguments (weights): the
  same object, an equal one of the same shapes, and one seen before FIRSTS others all take the
  program compiled for them; other shapes, static arguments or inputs compile their own."""
  programs = compilation.Programs('a product', jax.jit(
      lambda w, x, scale=1.0: w['a'] @ x * scale, static_argnames='scale'))
  weights = [{'a': jnp.full((2, 3), float(n))} for n in range(compilation.FIRSTS + 2)]
  x = jnp.ones((3, 4))
  for w in weights + weights[:1]:  # the first's key is forgotten by then, and found again
    np.testing.assert_allclose(programs(w, x), np.asarray(w['a']) @ np.ones((3, 4)))
  assert len(programs) == 1
  programs({'a': jnp.ones((5, 3))}, x)
  programs(weights[0], jnp.ones((3, 2)))
  programs(weights[0], x, scale=2.0)
  assert len(programs) == 4
  np.testing.assert_allclose(programs(weights[1], x, scale=2.0), 2.0 * np.full((2, 4), 3.0))
  assert len(programs) == 4
