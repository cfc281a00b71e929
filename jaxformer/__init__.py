"""jaxformer: a faithful JAX/Flax reproduction of "Attention Is All You Need"."""

from jaxformer import config, losses, model, optim
from jaxformer.config import TransformerConfig, base, big, tiny
from jaxformer.model import Transformer

__version__ = '0.1.0'

__all__ = ['TransformerConfig', 'Transformer', 'base', 'big', 'tiny', 'config', 'losses',
           'model', 'optim']
