"""jaxformer: a faithful JAX/Flax reproduction of "Attention Is All You Need".

`import jaxformer` loads nothing but this file: `jaxformer.Transformer`, the config's names and
every submodule (`jaxformer.train`, `.checkpoint`, `.translation`, `.data`, ...) load on first
use. The package is imported by every `jaxformer` command, including the client of a running
`jaxformer serve`, which answers without importing jax at all.
"""

import importlib
import pkgutil
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what __getattr__ gives, for type checkers and editors
  from jaxformer.config import OptimConfig, TransformerConfig, base, big, tiny  # noqa: F401
  from jaxformer.model import Transformer  # noqa: F401

__version__ = '0.1.0'

_FROM_SUBMODULES = {'OptimConfig': 'config', 'TransformerConfig': 'config', 'base': 'config',
                    'big': 'config', 'tiny': 'config', 'Transformer': 'model'}
_SUBMODULES = tuple(sorted(module.name for module in pkgutil.iter_modules(__path__)
                           if not module.name.startswith('_')))

__all__ = [*_FROM_SUBMODULES, *_SUBMODULES]


def __getattr__(name: str) -> Any:
  """`jaxformer.Transformer`, `jaxformer.train` and the rest, imported when first reached."""
  if name in _FROM_SUBMODULES:
    return getattr(importlib.import_module(f'jaxformer.{_FROM_SUBMODULES[name]}'), name)
  if name in _SUBMODULES:
    return importlib.import_module(f'jaxformer.{name}')
  raise AttributeError(f"module 'jaxformer' has no attribute {name!r}")


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(__all__))
