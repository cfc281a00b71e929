"""jaxformer's own export: a plain, self-contained folder that `Translator.from_pretrained` and
every command load without orbax or the workdir (`export.load` reads it)::

  config.json         {"format": "jaxformer", "version", "step", "spm_sha256", "spm_pieces",
                       "model": TransformerConfig fields}
  spm.model           the shared sentencepiece vocabulary
  params.safetensors  the params, one tensor per leaf, named by its path ('encoder/layers_0/...')
"""

import hashlib
import json
import pathlib
from typing import Any

import numpy as np
import safetensors.numpy
from flax import traverse_util

import jaxformer
from jaxformer import files
from jaxformer.config import TransformerConfig, config_to_dict
from jaxformer.data.tokenizer import Tokenizer
from jaxformer.formats import folders

FILES = ('config.json', 'spm.model', 'params.safetensors')


def cannot(config: TransformerConfig) -> None:  # pylint: disable=unused-argument
  """Every model: the format is jaxformer's own."""
  return None


def save(out: str | pathlib.Path, params: Any, config: TransformerConfig, spm_model: bytes, *,
         step: int, overwrite: bool = False, **unused: Any) -> pathlib.Path:
  """Writes the three files into `out` (a new or empty folder, or with `overwrite` an export
  to replace) and returns it; one writer at a time (a second export into `out` meanwhile is a
  CheckpointError naming the first)."""
  out = folders.prepare(out, files.EXPORT, overwrite)
  tensors = {key: np.ascontiguousarray(value) for key, value in
             traverse_util.flatten_dict(params, sep='/').items()}
  with folders.written_whole(out, params, spm_model) as tmp:
    safetensors.numpy.save_file(tensors, tmp / 'params.safetensors')
    files.respect_umask(tmp / 'params.safetensors')
    (tmp / 'spm.model').write_bytes(spm_model)
    (tmp / 'config.json').write_text(json.dumps(
        {'format': 'jaxformer', 'version': jaxformer.__version__, 'step': step,
         'spm_sha256': hashlib.sha256(spm_model).hexdigest(),
         'spm_pieces': Tokenizer.from_bytes(spm_model).vocab_size,
         'model': config_to_dict(config)}, indent=2) + '\n')
  return out
