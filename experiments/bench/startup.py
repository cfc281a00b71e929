"""The startup section: what a user waits for, as whole processes. `jaxformer translate` on one
sentence and on the demo's 1,000 test sentences, with the compilation cache empty (a first run),
filled (every later run) and off (--no-compilation-cache, as before the cache), and as a client
of a running `jaxformer serve` (`--server`; the server's own start timed apart, and one request
of each case made before the rounds), beside a CTranslate2 process (import, load, translate) on
the same weights; `import jaxformer`; and the
time from `jaxformer train` on an existing workdir to its first resumed step, cached and not,
for a small model and for base dimensions (on a GPU: base dimensions at the paper's 25,600
target tokens a step).

  python experiments/bench --only startup --demo-model workdirs/demo/average-last5

Without --demo-model, only the imports and the resumes are timed.

Medians of `rounds` rounds, the ways of one round run one after another. Each process gets a
cache folder of its own case (JAXFORMER_CACHE_DIR) or none, never the user's, and jax's own
cache settings are taken out of its environment.
"""

import contextlib
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

from bench.common import ROOT

from jaxformer import recipes
from jaxformer.data import embedded

ONE_SENTENCE = 'The red dog sleeps.\n'

# A CTranslate2 user's whole process: import, load, translate stdin as jaxformer translate does
# (beam 4, alpha 0.6, at most input + 50 pieces), print.
_CT2_PROCESS = r'''
import sys
import ctranslate2, sentencepiece
model = sys.argv[1]
spm = sentencepiece.SentencePieceProcessor(model_file=model + '/spm.model')
lines = sys.stdin.read().splitlines()
pieces = [spm.encode(line, out_type=str) + ['</s>'] for line in lines]
found = ctranslate2.Translator(model, device='cpu', intra_threads=2).translate_batch(
    pieces, max_batch_size=32, beam_size=4, length_penalty=0.6,
    max_decoding_length=max(map(len, pieces)) + 50)
print('\n'.join(spm.decode(r.hypotheses[0]) for r in found))
'''


def _env(cache: pathlib.Path | None = None) -> dict[str, str]:
  env = {k: v for k, v in os.environ.items() if not k.startswith('JAX_')}
  return {**env, 'JAXFORMER_CACHE_DIR': str(cache)} if cache else env


def _timed(argv: list[str], *, stdin: str = '', env: dict[str, str] | None = None) -> float:
  start = time.perf_counter()
  subprocess.run(argv, input=stdin, capture_output=True, text=True, check=True,
                 env=env or _env(), cwd=ROOT)
  return time.perf_counter() - start


def _jaxformer(*args: str) -> list[str]:
  return [sys.executable, '-m', 'jaxformer.cli', *args]


def _translations(tmp: pathlib.Path, model: pathlib.Path, ct2: pathlib.Path | None,
                  rounds: int) -> dict:
  """Seconds of each way of translating one sentence and the 1,000 (medians), and the ratios
  to CTranslate2's process."""
  sizes = recipes.load('demo').data
  thousand = embedded.splits(sizes.train_pairs, sizes.validation_pairs,
                             sizes.test_pairs)['test'].src[:1000]
  cases = {'one_sentence': ONE_SENTENCE, 'sentences_1000': '\n'.join(thousand) + '\n'}
  times: dict[str, list[float]] = {}
  translate = _jaxformer('translate', '--model', str(model))
  with _server(model, tmp / 'cache-server') as (url, ready_s):
    client = [sys.executable, '-m', 'jaxformer', 'translate', '--server', url]
    for text in cases.values():  # the server compiles each case's searches once, here
      _timed(client, stdin=text)
    for round_ in range(rounds):
      for case, text in cases.items():
        cache = tmp / f'cache-{case}-{round_}'  # empty
        ways = {'first_run': (translate, _env(cache)), 'cached': (translate, _env(cache)),
                'no_cache': (translate + ['--no-compilation-cache'], _env()),
                'server': (client, _env())}
        if ct2:
          ways['ctranslate2'] = ([sys.executable, '-c', _CT2_PROCESS, str(ct2)], _env())
        for way, (argv, env) in ways.items():
          times.setdefault(f'{case}_{way}_s', []).append(_timed(argv, stdin=text, env=env))
  results = {k: round(statistics.median(v), 2) for k, v in times.items()}
  results['server_ready_s'] = round(ready_s, 2)
  for case in cases if ct2 else ():
    for way in ('first_run', 'cached', 'no_cache', 'server'):
      results[f'{case}_{way}_vs_ctranslate2'] = round(
          results[f'{case}_{way}_s'] / results[f'{case}_ctranslate2_s'], 2)
  return results


@contextlib.contextmanager
def _server(model: pathlib.Path, cache: pathlib.Path) -> Iterator[tuple[str, float]]:
  """`jaxformer serve` of `model` on a free port, its cache folder empty: (its address, seconds
  from its start to the log line that says it answers)."""
  start = time.perf_counter()
  process = subprocess.Popen(_jaxformer('serve', '--model', str(model), '--port', '0'),
                             stderr=subprocess.PIPE, text=True, env=_env(cache), cwd=ROOT)
  try:
    log = ''
    while not (found := re.search(r' at (http://\S+) \(POST', log)):
      line = process.stderr.readline()
      if not line:
        raise RuntimeError(f'jaxformer serve ended: {log[-2000:]}')
      log += line
    yield found.group(1), time.perf_counter() - start
  finally:
    process.terminate()
    process.wait()


def _imports(rounds: int) -> dict:
  """Seconds to import jaxformer and its command line, less a bare interpreter's start."""
  times: dict[str, list[float]] = {}
  for _ in range(rounds):
    for name, code in (('python', 'pass'), ('import_jaxformer', 'import jaxformer'),
                       ('import_jaxformer_cli', 'import jaxformer.cli')):
      times.setdefault(name, []).append(_timed([sys.executable, '-c', code]))
  bare = statistics.median(times.pop('python'))
  return {f'{k}_s': round(statistics.median(v) - bare, 2) for k, v in times.items()}


_BAR_COUNT = re.compile(rb'\| (\d+)/\d+ \[')  # tqdm's "| 3/5 [": the steps done


def _first_step_s(argv: list[str], env: dict[str, str], step: int) -> tuple[float, float]:
  """Seconds from starting `argv` (a training run resuming at step - 1) to the end of its first
  step, `step` (its progress bar's count, shown once the step has run), and to that step's start
  (the end less one step's time, that of the next step); then ends it, before any save: the
  workdir stays as it was. The bar redraws at most every 0.1 s (tqdm's interval on a terminal,
  asked for through TQDM_MININTERVAL: into a pipe the trainer's bar redraws once a minute), so
  fast steps (a GPU's) skip counts: a count at or past the one awaited marks it, and a step
  shorter than a redraw reads as starting where it ends."""
  start = time.perf_counter()
  process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             env={**env, 'TQDM_MININTERVAL': '0.1'}, cwd=ROOT)
  seen, ends = b'', []
  try:
    for count in (step, step + 1):
      while not any(int(shown) >= count for shown in _BAR_COUNT.findall(seen[-400:])):
        chunk = os.read(process.stderr.fileno(), 4096)
        if not chunk:
          raise RuntimeError(f'{argv} ended before step {count}: {seen[-2000:].decode()}')
        seen += chunk
      ends.append(time.perf_counter() - start)
    return ends[0], 2 * ends[0] - ends[1]
  finally:
    process.kill()
    process.wait()


def _resumes(tmp: pathlib.Path, data_dir: pathlib.Path, rounds: int, gpu: bool) -> dict:
  """Seconds from `jaxformer train` on a workdir with a checkpoint at step 1 to the end and to
  the start of its step 2 (_first_step_s), with the cache its first run filled and without: the
  multi30k recipe's model, and base dimensions on batches of 2,048 tokens (on a GPU: base
  dimensions alone, on the paper's 25,600)."""
  corpus = data_dir / 'multi30k'
  base = ['--set', 'model.num_layers=6', '--set', 'model.d_model=512', '--set',
          'model.d_ff=2048', '--set', 'model.num_heads=8']
  models = ({'base_dims': base + ['--set', 'train.tokens_per_batch=25600']} if gpu else
            {'multi30k': [], 'base_dims': base + ['--set', 'train.tokens_per_batch=2048']})
  results = {}
  for name, flags in models.items():
    workdir, cache = tmp / f'resume-{name}', tmp / f'cache-resume-{name}'
    train = _jaxformer('train', '--config', 'multi30k', '--workdir', str(workdir),
                       '--train-src', str(corpus / 'train.en'), '--train-tgt',
                       str(corpus / 'train.de'), *flags)
    _timed(train + ['--num-steps', '1'], env=_env(cache))  # the checkpoint, and the cache
    ends: dict[str, list[float]] = {'cached': [], 'no_cache': []}
    starts: dict[str, list[float]] = {'cached': [], 'no_cache': []}
    for _ in range(rounds):
      for way, flags, env in (('cached', [], _env(cache)),
                              ('no_cache', ['--no-compilation-cache'], _env())):
        end, begin = _first_step_s(train + ['--num-steps', '5', *flags], env, 2)
        ends[way].append(end)
        starts[way].append(begin)
    results[name] = {}
    for what, times in (('to_first_step_end', ends), ('to_first_step_start', starts)):
      cached, plain = (statistics.median(times[k]) for k in ('cached', 'no_cache'))
      results[name][what] = {'cached_s': round(cached, 2), 'no_cache_s': round(plain, 2),
                             'speedup': round(plain / cached, 2)}
  return results


def run(data_dir: pathlib.Path, demo_model: str | None, rounds: int = 3,
        gpu: bool = False) -> dict:
  """The section's results; `gpu`: the processes it starts train on a GPU."""
  with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    results = {'model': demo_model, 'rounds': rounds}
    if demo_model:
      results['translate'] = _translations(tmp, *_exported(tmp, demo_model), rounds)
    return {**results, 'imports': _imports(rounds),
            'resume': _resumes(tmp, data_dir, rounds, gpu)}


def _exported(tmp: pathlib.Path, demo_model: str) -> tuple[pathlib.Path, pathlib.Path | None]:
  """`demo_model` exported for jaxformer and, when ctranslate2 is installed, for CTranslate2."""
  try:
    import ctranslate2  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
    has_ct2 = True
  except ImportError:
    has_ct2 = False
  model = tmp / 'exported'
  ct2 = tmp / 'ct2' if has_ct2 else None
  for fmt, out in (('jaxformer', model), ('ctranslate2', ct2)):  # (not into the user's cache)
    if out:
      _timed(_jaxformer('export', '--model', demo_model, '--format', fmt, str(out),
                        '--no-compilation-cache'))
  return model, ct2
