"""Pictures of what the model learned: encoder-decoder attention and the positional encoding."""

import functools
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np

from jaxformer import files
from jaxformer.config import TransformerConfig
from jaxformer.data.tokenizer import EOS_ID
from jaxformer.translation import Translator
from jaxformer.model import Transformer, sinusoidal_positions

matplotlib.use('Agg')  # files only, no display
from matplotlib import pyplot as plt  # noqa: E402  pylint: disable=g-import-not-at-top


def cross_attention(translator: Translator, sentence: str, translation: str | None = None
                    ) -> tuple[list[str], list[str], list[np.ndarray]]:
  """(source pieces, target pieces, one [H, T, S] array per decoder layer): the encoder-decoder
  attention while the model reads its own translation (or the one given) after `sentence`."""
  tokenizer = translator.tokenizer
  if translation is None:
    translation = translator.translate([sentence])[0]
  src = tokenizer.encode([sentence])[0] + [EOS_ID]
  tgt = tokenizer.encode_target([translation])[0] + [EOS_ID]
  _, state = _forward_with_intermediates(translator.config)(
      {'params': translator.params}, jnp.array([src]), jnp.array([[0] + tgt[:-1]]))
  decoder = state['intermediates']['decoder']
  layers = [np.asarray(decoder[f'layers_{i}']['cross_attention']['attention_weights'][0][0])
            for i in range(translator.config.num_layers)]
  return tokenizer.pieces(src), tokenizer.pieces(tgt), layers


@functools.lru_cache(maxsize=8)
def _forward_with_intermediates(config: TransformerConfig) -> Any:
  """The model's forward, jitted once per config and process, returning what it sows (the
  attention weights; einsum attention, which keeps them)."""
  model = Transformer(config.with_execution(attention='einsum'))
  return jax.jit(functools.partial(model.apply, mutable=['intermediates']))


def _heatmap(ax, weights: np.ndarray, src: list[str], tgt: list[str], title: str) -> None:
  """A map with the pieces along its axes (an empty list: no ticks on that axis; matplotlib's
  ticks cost more to draw than the map)."""
  ax.imshow(weights, cmap='viridis', vmin=0.0, vmax=1.0, aspect='auto')
  ax.set_xticks(range(len(src)), src, rotation=90, fontsize=7)
  ax.set_yticks(range(len(tgt)), tgt, fontsize=7)
  ax.set_title(title, fontsize=9)


def save_attention(translator: Translator, sentence: str, out_dir: str | pathlib.Path,
                   translation: str | None = None) -> list[pathlib.Path]:
  """Writes, per decoder layer, the head-averaged map and a grid of every head's map."""
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  src, tgt, layers = cross_attention(translator, sentence, translation)
  written = []
  for i, weights in enumerate(layers):
    fig, ax = plt.subplots(figsize=(1 + 0.3 * len(src), 1 + 0.3 * len(tgt)))
    _heatmap(ax, weights.mean(0), src, tgt, f'encoder-decoder attention, layer {i + 1}, '
             'mean over heads')
    ax.set_xlabel('source')
    ax.set_ylabel('target')
    fig.tight_layout()
    written.append(out_dir / f'attention_layer{i + 1}.png')
    fig.savefig(written[-1], dpi=100)
    plt.close(fig)

    heads = weights.shape[0]
    cols = min(heads, 4)
    rows = -(-heads // cols)
    fig, axes = plt.subplots(rows, cols, squeeze=False,
                             figsize=(cols * (1 + 0.25 * len(src)), rows * (1 + 0.25 * len(tgt))))
    for h, ax in enumerate(axes.flat):
      if h < heads:
        # The pieces once per row and column of the grid: left, and under the lowest map.
        _heatmap(ax, weights[h], src if h + cols >= heads else [],
                 tgt if h % cols == 0 else [], f'layer {i + 1}, head {h + 1}')
      else:
        ax.axis('off')
    fig.tight_layout()
    written.append(out_dir / f'attention_layer{i + 1}_heads.png')
    fig.savefig(written[-1], dpi=100)
    plt.close(fig)
  return written


def save_positional_encoding(d_model: int, path: str | pathlib.Path, length: int = 100) -> None:
  """The sinusoid matrix of §3.5 as an image: positions down, dimensions across."""
  pe = np.asarray(sinusoidal_positions(jnp.arange(length), d_model))
  fig, ax = plt.subplots(figsize=(8, 4))
  image = ax.imshow(pe, cmap='RdBu', vmin=-1, vmax=1, aspect='auto')
  ax.set_xlabel('dimension i')
  ax.set_ylabel('position')
  ax.set_title('positional encoding: sin at even, cos at odd dimensions (§3.5)')
  fig.colorbar(image, ax=ax)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def save_learning_curve(metrics_jsonl: str | pathlib.Path, path: str | pathlib.Path) -> None:
  """Train and validation loss against step, with the learning rate on a second axis, from a
  training run's metrics.jsonl."""
  train, evals = [], []
  number = (int, float, type(None))  # (null: what JSON tools write for NaN)
  for where, record in _records(metrics_jsonl):
    split = files.field(record, 'split', str, where, None)
    loss = files.field(record, 'loss', number, where, None)  # (skipped steps: none)
    if split not in ('train', 'eval') or loss is None:
      continue
    step = files.field(record, 'step', int, where)
    if split == 'train':
      train.append((step, loss, files.field(record, 'lr', number, where)))
    else:
      evals.append((step, loss))
  fig, ax = plt.subplots(figsize=(8, 4.5))
  if train:
    steps, loss, lr = zip(*train)
    ax.plot(steps, loss, label='train loss (label-smoothed)')
    lr_ax = ax.twinx()
    lr_ax.plot(steps, lr, color='grey', linestyle=':', label='learning rate')
    lr_ax.set_ylabel('learning rate')
    lr_ax.legend(loc='upper center')
  if evals:
    steps, loss = zip(*evals)
    ax.plot(steps, loss, marker='o', label='validation loss')
  ax.set_xlabel('step')
  ax.set_ylabel('loss')
  ax.set_title('learning curve')
  ax.legend(loc='upper right')
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def _records(path: str | pathlib.Path) -> list[tuple[str, dict]]:
  """(where, record) for each line of a JSON-lines file, as a record another tool may have
  written or edited: a line that is no JSON object is a one-line files.RecordError."""
  import json  # pylint: disable=g-import-not-at-top
  out = []
  for number, line in enumerate(pathlib.Path(path).read_text(encoding='utf-8').splitlines(), 1):
    where = f'{path}:{number}'
    try:
      record = json.loads(line)
    except ValueError:
      record = None
    if not isinstance(record, dict):
      raise files.RecordError(f'{where}: not a JSON object.')
    out.append((where, record))
  return out
