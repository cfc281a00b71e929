"""The training recipes that ship with jaxformer, and `--set section.field=value` overrides.

A recipe is a module (or any .py file) whose `get_config()` returns a dict with 'model' (a
TransformerConfig), 'train' (TrainConfig fields but the workdir) and 'data' (DataConfig fields).
The shipped ones: base, big, big_enfr (the paper's), multi30k, multi30k_gpu and demo; `table3`
holds the paper's Table 3 rows as variants of base.
"""

import dataclasses
import importlib
import runpy
import typing
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp

from jaxformer.config import TransformerConfig
from jaxformer.data import (DataError, PairSource, ParallelText, TextFiles, embedded, load_wmt14,
                            read_parallel_text, wmt14)
from jaxformer.train import TrainConfig

NAMES = ('base', 'big', 'big_enfr', 'multi30k', 'multi30k_gpu', 'demo')


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Where the training and validation pairs come from."""
  source: str = 'text'                  # 'wmt14' (tfds), 'text' (files) or 'embedded' (generated)
  target_language: str = 'de'           # wmt14: EN->DE or EN->FR
  tfds_data_dir: str | None = None      # wmt14: tfds data folder (None: $TFDS_DATA_DIR)
  download: bool = False                # wmt14: let tfds download and prepare it (hours, online)
  train_src: str | None = None          # text: line-aligned training files
  train_tgt: str | None = None
  eval_src: str | None = None           # text: validation files (optional)
  eval_tgt: str | None = None
  train_pairs: int = 60_000             # embedded: generated pairs per split
  validation_pairs: int = 1000
  test_pairs: int = 1000

  def __post_init__(self):
    if self.source not in ('wmt14', 'text', 'embedded'):
      raise ValueError(f"data.source must be 'wmt14', 'text' or 'embedded', got {self.source!r}.")


@dataclasses.dataclass(frozen=True)
class Recipe:
  """What to train (model), how (train: TrainConfig fields but the workdir) and on what (data)."""
  model: TransformerConfig
  train: dict[str, Any]
  data: DataConfig

  def train_config(self, workdir: str) -> TrainConfig:
    return TrainConfig(workdir=workdir, **self.train)


def load(name_or_path: str, variant: str | None = None) -> Recipe:
  """A shipped recipe by name (base, big, ...) or a recipe file, optionally with its model made
  a Table 3 row of base (variant 'C3', ...); DataError for anything that does not give one."""
  if name_or_path in NAMES:
    settings = importlib.import_module(f'jaxformer.recipes.{name_or_path}').get_config()
  elif name_or_path.endswith('.py'):
    try:
      settings = runpy.run_path(name_or_path)['get_config']()
    except FileNotFoundError:
      raise DataError(f'{name_or_path}: no such config file.') from None
    except Exception as e:  # pylint: disable=broad-except  (any error in the user's file)
      raise DataError(f'{name_or_path}: cannot load the config ({type(e).__name__}: {e}).'
                      ) from None
  else:
    raise DataError(f'unknown config {name_or_path!r}: give one of {", ".join(NAMES)} or a .py '
                    'file whose get_config() returns a recipe.')
  if not isinstance(settings, dict) or {'model', 'train', 'data'} - set(settings):
    raise DataError(f"{name_or_path}: get_config() must return a dict with 'model', 'train' and "
                    "'data' (see jaxformer/recipes/base.py).")
  for field in settings['train']:
    _field(TrainConfig, 'train', field)
  for field in settings['data']:
    _field(DataConfig, 'data', field)
  recipe = Recipe(settings['model'], dict(settings['train']), DataConfig(**settings['data']))
  if variant:
    from jaxformer.recipes import table3  # pylint: disable=g-import-not-at-top
    try:
      model = table3.variant_config(variant, recipe.model.vocab_size)
    except ValueError as e:
      raise DataError(str(e)) from None
    recipe = dataclasses.replace(recipe, model=model,
                                 train={**recipe.train, **table3.train_overrides(variant)})
  return recipe


# --- overrides ------------------------------------------------------------------------------------

_SECTIONS = {'model': TransformerConfig, 'train': TrainConfig, 'data': DataConfig}
_NOT_SETTABLE = {'train': ('workdir',)}  # given by its own flag


def settable(section: str) -> list[str]:
  """The names `--set section.NAME=...` accepts (a nested dataclass's fields as 'outer.inner',
  e.g. model.execution.dtype)."""
  names = []
  hints = typing.get_type_hints(_SECTIONS[section])
  for field in dataclasses.fields(_SECTIONS[section]):
    if field.name in _NOT_SETTABLE.get(section, ()):
      continue
    if dataclasses.is_dataclass(hints[field.name]):
      names += [f'{field.name}.{inner.name}' for inner in dataclasses.fields(hints[field.name])]
    else:
      names.append(field.name)
  return names


def _field(cls: type, section: str, name: str) -> Any:
  """The type hint of section.name; DataError listing the valid names for an unknown one."""
  if name not in settable(section):
    raise DataError(f'unknown setting {section}.{name}; valid {section} settings: '
                    f'{", ".join(settable(section))}.')
  outer, _, inner = name.partition('.')
  hint = typing.get_type_hints(cls)[outer]
  return typing.get_type_hints(hint)[inner] if inner else hint


def _replace(obj: Any, changes: dict[str, Any]) -> Any:
  """`obj` with `changes` applied; 'outer.inner' names change a nested dataclass."""
  nested: dict[str, dict[str, Any]] = {}
  for name in [n for n in changes if '.' in n]:
    outer, _, inner = name.partition('.')
    nested.setdefault(outer, {})[inner] = changes.pop(name)
  for outer, inner in nested.items():
    changes[outer] = dataclasses.replace(getattr(obj, outer), **inner)
  return dataclasses.replace(obj, **changes)


def parse_value(hint: Any, text: str) -> Any:
  """`text` as a value of type `hint` (int, float, bool, str, X | None; the compute dtype);
  ValueError naming the expected type."""
  options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, type(int | None)) \
      else (hint,)
  if type(None) in options and text.lower() == 'none':
    return None
  for kind in options:
    if kind is bool and text.lower() in ('true', 'false', '1', '0', 'yes', 'no'):
      return text.lower() in ('true', '1', 'yes')
    if kind in (int, float) and kind is not bool:
      try:
        return kind(text)
      except ValueError:
        continue
    if kind is str:
      return text
    if kind is Any:  # the compute dtype
      try:
        return jnp.dtype(text)
      except TypeError:
        raise ValueError('expected float32 or bfloat16') from None
  names = ' or '.join('None' if k is type(None) else getattr(k, '__name__', str(k))
                      for k in options)
  raise ValueError(f'expected {names}')


def override(recipe: Recipe, assignments: Sequence[str]) -> Recipe:
  """The recipe with each 'section.field=value' applied (sections: model, train, data); a
  one-line DataError for an unknown name, a value of the wrong type, or settings the model
  refuses."""
  changes: dict[str, dict[str, Any]] = {section: {} for section in _SECTIONS}
  for assignment in assignments:
    key, equals, text = assignment.partition('=')
    section, dot, name = key.strip().partition('.')
    if not (equals and dot) or section not in _SECTIONS:
      raise DataError(f'--set {assignment!r}: expected SECTION.NAME=VALUE with SECTION one of '
                      f'model, train, data (e.g. --set model.dropout_rate=0.2).')
    hint = _field(_SECTIONS[section], section, name)
    try:
      changes[section][name] = parse_value(hint, text.strip())
    except ValueError as e:
      raise DataError(f'--set {key}: {e}, got {text!r}.') from None
  try:
    return Recipe(_replace(recipe.model, changes['model']), {**recipe.train, **changes['train']},
                  _replace(recipe.data, changes['data']))
  except ValueError as e:
    raise DataError(f'--set: {e}') from None


def texts(data: DataConfig) -> tuple[PairSource, ParallelText | None]:
  """The training pairs (streamed: any size) and the validation pairs (in memory; None when
  there are none) of `data`."""
  if data.source == 'wmt14':
    train = wmt14(data.target_language, 'train', data_dir=data.tfds_data_dir,
                  download=data.download)
    return train, load_wmt14(data.target_language, 'validation', data_dir=data.tfds_data_dir)
  if data.source == 'embedded':
    corpus = embedded.splits(data.train_pairs, data.validation_pairs, data.test_pairs)
    return corpus['train'], corpus['validation']
  if not (data.train_src and data.train_tgt):
    raise DataError('a text source needs --train-src and --train-tgt.')
  validation = read_parallel_text(data.eval_src, data.eval_tgt) \
      if data.eval_src and data.eval_tgt else None
  return TextFiles(data.train_src, data.train_tgt), validation
