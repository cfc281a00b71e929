"""jaxformer: a faithful JAX/Flax reproduction of "Attention Is All You Need".

`import jaxformer` loads the model, its config and the optimiser; every other submodule
(`jaxformer.train`, `.checkpoint`, `.translation`, `.data`, ...) loads on first use, so that
importing the package does not import orbax, sentencepiece or TensorFlow.
"""

import importlib
import pkgutil
from typing import Any

from jaxformer import config, losses, model, optim
from jaxformer.config import OptimConfig, TransformerConfig, base, big, tiny
from jaxformer.model import Transformer

__version__ = '0.1.0'

_LAZY_SUBMODULES = tuple(sorted(module.name for module in pkgutil.iter_modules(__path__)
                                if module.name not in globals()
                                and not module.name.startswith('_')))  # the rest of the package

__all__ = ['OptimConfig', 'TransformerConfig', 'Transformer', 'base', 'big', 'tiny', 'config',
           'losses', 'model', 'optim', *_LAZY_SUBMODULES]


def __getattr__(name: str) -> Any:
  """`jaxformer.train` and the other submodules, imported when first reached."""
  if name in _LAZY_SUBMODULES:
    return importlib.import_module(f'jaxformer.{name}')
  raise AttributeError(f"module 'jaxformer' has no attribute {name!r}")


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(_LAZY_SUBMODULES))
