"""experiments/demo.py: the offline end-to-end demo."""

import json
import pathlib
import subprocess
import sys

import pytest
from helpers import JAXFORMER_MAIN, assert_log_lines, without_tensorflow
from matplotlib import image

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHORT = ['--num-steps', '6', '--train-pairs', '3000', '--test-pairs', '12']


def _demo(workdir: pathlib.Path) -> subprocess.CompletedProcess:
  """The short demo, where importing TensorFlow fails (as in the core install)."""
  return without_tensorflow(
      f'import runpy; sys.argv = ["demo.py", *sys.argv[1:]]\n'
      f'runpy.run_path({str(ROOT / "experiments" / "demo.py")!r}, run_name="__main__")',
      '--workdir', str(workdir), *SHORT, cwd=workdir.parent)


@pytest.mark.slow
def test_short_demo_runs_end_to_end_and_reruns_cleanly(tmp_path):
  workdir = tmp_path / 'demo'
  first = _demo(workdir)
  assert first.returncode == 0, first.stderr[-3000:]
  summary = json.loads((workdir / 'demo_summary.json').read_text())
  assert isinstance(summary['sacrebleu'], float) and 0 <= summary['sacrebleu'] <= 100
  assert summary['signature'].startswith('nrefs:1|case:mixed|eff:no|tok:13a')
  assert summary['steps'] == 6 and summary['test_sentences'] == 12
  assert sorted(int(p.name) for p in (workdir / 'checkpoints').iterdir()) == [2, 3, 4, 5, 6]
  assert summary['model'] == str(workdir / 'average-last5')
  assert (workdir / 'average-last5' / '6').is_dir()
  assert len((workdir / 'test_hypotheses.de').read_text().splitlines()) == 12
  # The README's quickstart: the demo's test split, scored again by `jaxformer eval`, and a
  # sentence translated (both without TensorFlow too).
  scored = without_tensorflow(JAXFORMER_MAIN, 'eval', '--model', summary['model'], '--src',
                              str(workdir / 'test.en'), '--ref', str(workdir / 'test.de'),
                              cwd=tmp_path)
  assert scored.returncode == 0, scored.stderr[-3000:]
  assert f'sacreBLEU {summary["sacrebleu"]:.2f}' in scored.stdout
  translated = without_tensorflow(JAXFORMER_MAIN, 'translate', '--model', str(workdir),
                                  cwd=tmp_path, stdin='the red dog\n')
  assert translated.returncode == 0 and len(translated.stdout.splitlines()) == 1, \
      translated.stderr[-2000:]
  for picture in summary['pictures']:
    pixels = image.imread(picture)
    assert pixels.ndim == 3 and min(pixels.shape[:2]) > 100 and pixels.std() > 0.01
  assert any(w in summary['attention_sentence'] for w in ('because', 'although', 'when'))
  for line in ('sample translations of held-out sentences', 'BLEU ', 'wall time',
               'make train-base'):
    assert line in first.stdout
  assert 'training' in first.stderr  # the training progress bar
  assert_log_lines(first.stderr, 'demo')

  again = _demo(workdir)  # a finished workdir: resumes at the end and re-evaluates
  assert again.returncode == 0, again.stderr[-3000:]
  assert 'resumed from step 6' in again.stderr
  assert json.loads((workdir / 'demo_summary.json').read_text())['sacrebleu'] == \
      summary['sacrebleu']


def test_demo_refuses_non_positive_counts_in_one_line(capsys):
  with pytest.raises(SystemExit) as exit_info:
    _demo_module().main(['--num-steps', '0'])
  assert exit_info.value.code == 2
  assert 'must be an integer >= 1, got' in capsys.readouterr().err.strip().splitlines()[-1]


def _demo_module():
  sys.path.insert(0, str(ROOT / 'experiments'))
  return __import__('demo')
