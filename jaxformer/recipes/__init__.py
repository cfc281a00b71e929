"""The training recipes that ship with jaxformer, and `--set section.field=value` overrides:
the one way to change a setting (the command line's shortcut flags are spelled as --set).

A recipe is a module (or any .py file) whose `get_config()` returns a dict with 'model' (a
TransformerConfig), 'train' (TrainConfig fields), 'data' (DataConfig fields) and optionally
'optim' (OptimConfig fields; the paper's by default).
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

from jaxformer.config import DataConfig, OptimConfig, SettingError, TrainConfig, TransformerConfig

NAMES = ('base', 'big', 'big_enfr', 'multi30k', 'multi30k_gpu', 'demo')


@dataclasses.dataclass(frozen=True)
class Recipe:
  """What to train (model), how (train, optim) and on what (data)."""
  model: TransformerConfig
  train: TrainConfig
  data: DataConfig
  optim: OptimConfig = OptimConfig()

  def __post_init__(self):
    self.train.check_rows(self.model)
    wanted = [name for name in ('patience', 'bleu_sentences', 'average_best')
              if getattr(self.train, name)]
    if wanted and not self.data.has_validation:
      raise SettingError(f'{wanted[0]} needs a validation set: give --eval-src and --eval-tgt, '
                         f'or set {wanted[0]} to {"none" if wanted[0] == "patience" else 0}.')


# What `--config auto` starts from: a text source, and settings that recipes.auto.size replaces.
AUTO = Recipe(TransformerConfig(), TrainConfig(), DataConfig(source='text'))


def load(name_or_path: str, variant: str | None = None) -> Recipe:
  """A shipped recipe by name (base, big, ...) or a recipe file, optionally with its model made
  a Table 3 row of base (variant 'C3', ...); SettingError for anything that does not give one."""
  if name_or_path in NAMES:
    settings = importlib.import_module(f'jaxformer.recipes.{name_or_path}').get_config()
  elif name_or_path.endswith('.py'):
    try:
      settings = runpy.run_path(name_or_path)['get_config']()
    except FileNotFoundError:
      raise SettingError(f'{name_or_path}: no such config file.') from None
    except Exception as e:  # pylint: disable=broad-except  (any error in the user's file)
      moved = [f.name for f in dataclasses.fields(OptimConfig) if f"'{f.name}'" in str(e)]
      hint = (f" ({moved[0]} is an optimisation setting now: return it in "
              f"get_config()['optim'])" if moved else '')
      raise SettingError(f'{name_or_path}: cannot load the config ({type(e).__name__}: {e}).'
                         f'{hint}') from None
  else:
    raise SettingError(f'unknown config {name_or_path!r}: give one of {", ".join(NAMES)} or a .py '
                    'file whose get_config() returns a recipe.')
  if not isinstance(settings, dict) or {'model', 'train', 'data'} - set(settings):
    raise SettingError(f"{name_or_path}: get_config() must return a dict with 'model', 'train' and "
                    "'data' (see jaxformer/recipes/base.py).")
  if not isinstance(settings['model'], TransformerConfig):
    raise SettingError(f"{name_or_path}: get_config()['model'] must be a TransformerConfig (e.g. "
                       f"jaxformer.config.base()), got {type(settings['model']).__name__}.")
  settings = {'optim': {}, **settings}
  for section in ('train', 'data', 'optim'):
    if not isinstance(settings[section], dict):
      raise SettingError(f"{name_or_path}: get_config()[{section!r}] must be a dict of "
                         f'settings, got {type(settings[section]).__name__}.')
  for field in settings['train']:
    _field(TrainConfig, 'train', field)
  for field in settings['data']:
    _field(DataConfig, 'data', field)
  for field in settings['optim']:
    _field(OptimConfig, 'optim', field)
  train, optim = dict(settings['train']), dict(settings['optim'])
  if variant:
    # Imported here, not at the top: `python -m jaxformer.recipes.table3` runs it as __main__,
    # which a copy already imported by this package would make runpy warn about.
    from jaxformer.recipes import table3  # pylint: disable=g-import-not-at-top
    try:
      model = table3.variant_config(variant, settings['model'].vocab_size)
    except ValueError as e:
      raise SettingError(str(e)) from None
    settings = {**settings, 'model': model}
    train.update(table3.train_overrides(variant))
    optim.update(table3.optim_overrides(variant))
  try:
    return Recipe(settings['model'], TrainConfig(**train), DataConfig(**settings['data']),
                  OptimConfig(**optim))
  except SettingError as e:
    raise SettingError(f'{name_or_path}: {e}') from None


# --- overrides ------------------------------------------------------------------------------------

_SECTIONS = {'model': TransformerConfig, 'train': TrainConfig, 'data': DataConfig,
             'optim': OptimConfig}


def settable(section: str) -> list[str]:
  """The names `--set section.NAME=...` accepts (a nested dataclass's fields as 'outer.inner',
  e.g. model.execution.dtype)."""
  names = []
  hints = typing.get_type_hints(_SECTIONS[section])
  for field in dataclasses.fields(_SECTIONS[section]):
    if dataclasses.is_dataclass(hints[field.name]):
      names += [f'{field.name}.{inner.name}' for inner in dataclasses.fields(hints[field.name])]
    else:
      names.append(field.name)
  return names


def _field(cls: type, section: str, name: str) -> Any:
  """The type hint of section.name; SettingError listing the valid names for an unknown one."""
  if name not in settable(section):
    raise SettingError(f'unknown setting {section}.{name}; valid {section} settings: '
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
  """`text` as a value of type `hint` (int, float, bool, str, X | None; Execution's dtypes);
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
    if kind is Any:  # Execution's dtype and norm_dtype
      try:
        return jnp.dtype(text)
      except TypeError:
        raise ValueError('expected float32 or bfloat16') from None
  names = ' or '.join('None' if k is type(None) else getattr(k, '__name__', str(k))
                      for k in options)
  raise ValueError(f'expected {names}')


def override(recipe: Recipe, assignments: Sequence[str]) -> Recipe:
  """The recipe with each 'section.field=value' applied (sections: model, train, data, optim); a
  one-line SettingError for an unknown name, a value of the wrong type, or settings the model
  refuses."""
  changes: dict[str, dict[str, Any]] = {section: {} for section in _SECTIONS}
  for assignment in assignments:
    key, equals, text = assignment.partition('=')
    section, dot, name = key.strip().partition('.')
    if not (equals and dot) or section not in _SECTIONS:
      raise SettingError(f'--set {assignment!r}: expected SECTION.NAME=VALUE with SECTION one of '
                      f'model, train, data, optim (e.g. --set model.dropout_rate=0.2).')
    hint = _field(_SECTIONS[section], section, name)
    try:
      changes[section][name] = parse_value(hint, text.strip())
    except ValueError as e:
      raise SettingError(f'--set {key}: {e}, got {text!r}.') from None
  # Each config checks its own values, with a message that names the setting.
  return Recipe(*(_replace(getattr(recipe, section), changes[section])
                  for section in ('model', 'train', 'data', 'optim')))
