"""A trained model as a plain, self-contained folder, loadable without orbax or the workdir:

  config.json         {"format": "jaxformer", "version", "step", "model": TransformerConfig fields}
  spm.model           the shared sentencepiece vocabulary
  params.safetensors  the params, one tensor per leaf, named by its path ('encoder/layer_0/...')
"""

import json
import pathlib
from typing import Any

import numpy as np
import safetensors
import safetensors.numpy
from flax import traverse_util

import jaxformer
from jaxformer import checkpoint
from jaxformer.config import TransformerConfig

FILES = ('config.json', 'spm.model', 'params.safetensors')


def save(out: str | pathlib.Path, params: Any, config: TransformerConfig, spm_model: bytes, *,
         step: int) -> pathlib.Path:
  """Writes the three files into `out` (created if needed) and returns it."""
  out = pathlib.Path(out)
  try:
    out.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise checkpoint.CheckpointError(f'{out}: cannot create the export folder ({e.strerror}).'
                                     ) from None
  tensors = {key: np.ascontiguousarray(value) for key, value in
             traverse_util.flatten_dict(params, sep='/').items()}
  safetensors.numpy.save_file(tensors, out / 'params.safetensors')
  (out / 'spm.model').write_bytes(spm_model)
  (out / 'config.json').write_text(json.dumps(
      {'format': 'jaxformer', 'version': jaxformer.__version__, 'step': step,
       'model': checkpoint.config_to_dict(config)}, indent=2) + '\n')
  return out


def load(path: str | pathlib.Path) -> tuple[Any, TransformerConfig, bytes, int]:
  """(params, config, sentencepiece model bytes, step) of an exported folder; CheckpointError
  naming the problem for a folder that is not one, or a damaged file."""
  path = pathlib.Path(path)
  if missing := [name for name in FILES if not (path / name).is_file()]:
    raise checkpoint.CheckpointError(
        f'{path}: not an exported model (missing {", ".join(missing)}); `jaxformer export '
        'WORKDIR OUT` writes one.')
  try:
    meta = json.loads((path / 'config.json').read_text())
    config = checkpoint.config_from_dict(meta['model'])
    tensors = safetensors.numpy.load_file(path / 'params.safetensors')
  except (ValueError, KeyError, TypeError, safetensors.SafetensorError) as e:
    raise checkpoint.CheckpointError(f'{path}: damaged export ({type(e).__name__}: {e}).'
                                     ) from None
  params = traverse_util.unflatten_dict(tensors, sep='/')
  return params, config, (path / 'spm.model').read_bytes(), int(meta.get('step', 0))
