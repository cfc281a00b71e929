"""jaxformer.plots: attention maps, the positional encoding and learning curves, as images."""

import json
import re

import numpy as np
import pytest
from matplotlib import image

from jaxformer import files, plots

SENTENCE = 'the man sees a small dog'


def test_cross_attention_rows_are_distributions_over_real_source_pieces(translator):
  src, tgt, layers = plots.cross_attention(translator, SENTENCE)
  assert len(layers) == translator.config.num_layers
  for weights in layers:
    assert weights.shape == (translator.config.num_heads, len(tgt), len(src))
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
  assert src[-1] == '</s>' and tgt[-1] == '</s>'


def _picture(path) -> np.ndarray:
  pixels = image.imread(path)
  assert pixels.ndim == 3 and min(pixels.shape[:2]) > 100 and pixels.std() > 0.01, path
  return pixels


def test_attention_maps_one_mean_and_one_grid_of_heads_per_layer(translator, tmp_path):
  written = plots.save_attention(translator, SENTENCE, tmp_path / 'maps')
  layers = translator.config.num_layers
  assert [p.name for p in written] == [name for i in range(1, layers + 1) for name in
                                       (f'attention_layer{i}.png', f'attention_layer{i}_heads.png')]
  for path in written:
    _picture(path)


def test_positional_encoding_picture(tmp_path):
  plots.save_positional_encoding(64, tmp_path / 'pe.png', length=50)
  _picture(tmp_path / 'pe.png')


def test_learning_curve_reads_metrics_jsonl_with_a_skipped_interval(tmp_path):
  """An interval whose every step was skipped has no loss (monitor.MetricReader): it is left out,
  not a KeyError."""
  records = [{'step': 0, 'split': 'run'}, {'step': 10, 'split': 'train', 'loss': 5.0, 'lr': 1e-4},
             {'step': 20, 'split': 'train', 'lr': 2e-4, 'skipped_updates': 10},
             {'step': 30, 'split': 'train', 'loss': 3.0, 'lr': 3e-4},
             {'step': 30, 'split': 'eval', 'loss': 3.5}]
  (tmp_path / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records))
  plots.save_learning_curve(tmp_path / 'metrics.jsonl', tmp_path / 'curve.png')
  _picture(tmp_path / 'curve.png')
  # A record another tool wrote: a null loss (JSON's NaN) is no point; a string, or a line that
  # is no JSON object, is one line naming the file and the line.
  records.append({'step': 40, 'split': 'eval', 'loss': None})
  (tmp_path / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records))
  plots.save_learning_curve(tmp_path / 'metrics.jsonl', tmp_path / 'curve.png')
  for bad, said in (({'step': 50, 'split': 'eval', 'loss': 'low'}, '"loss" must be an integer or '
                     'a number or null, got "low".'), ([1, 2], 'not a JSON object.')):
    (tmp_path / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records[:2]
                                                    + [bad]))
    with pytest.raises(files.RecordError, match=re.escape(f'metrics.jsonl:3: {said}')):
      plots.save_learning_curve(tmp_path / 'metrics.jsonl', tmp_path / 'curve.png')
