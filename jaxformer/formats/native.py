"""jaxformer's own export: a plain, self-contained folder that `Translator.load` and every
command load without orbax or the workdir (`load` reads it, `save` writes it)::

  config.json         {"format": "jaxformer", "version", "step", "spm_sha256", "spm_pieces",
                       "model": TransformerConfig fields}
  spm.model           the shared sentencepiece vocabulary
  params.safetensors  the params, one tensor per leaf, named by its path ('encoder/layers_0/...')
"""

import hashlib
import json
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import safetensors
import safetensors.numpy
from flax import traverse_util

import jaxformer
from jaxformer import checkpoint, files
from jaxformer.config import TransformerConfig, config_from_dict, config_to_dict
from jaxformer.data.tokenizer import Tokenizer
from jaxformer.formats import folders
from jaxformer.model import Transformer

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


def load(path: str | pathlib.Path) -> tuple[Any, TransformerConfig, bytes, int]:
  """(params, config, sentencepiece model bytes, step) of an exported folder; CheckpointError
  naming the problem for a folder that is not one, or a damaged file."""
  path = pathlib.Path(path)
  if (found := files.describe(path)) not in (files.EXPORT, files.EMPTY, files.FOLDER):
    raise checkpoint.CheckpointError(files.misplaced(path, found, 'an exported model'))
  meta, where = read_meta(path)
  step, model = files.field(meta, 'step', int, where, 0), files.field(meta, 'model', dict, where)
  try:
    config = config_from_dict(model)
    tensors = safetensors.numpy.load_file(path / 'params.safetensors')
  except (ValueError, safetensors.SafetensorError) as e:
    raise checkpoint.CheckpointError(f'{path}: damaged export ({type(e).__name__}: {e}).'
                                     ) from None
  spm_model = (path / 'spm.model').read_bytes()
  _check_vocabulary(path, files.field(meta, 'spm_sha256', (str, type(None)), where, None),
                    config, spm_model)
  _check_shapes(path, tensors, config)
  return traverse_util.unflatten_dict(tensors, sep='/'), config, spm_model, step


def read_meta(path: pathlib.Path) -> tuple[dict[str, Any], str]:
  """An export's config.json, and its path for messages (files.read_record), once its files
  are all there (else a CheckpointError naming those missing)."""
  if missing := [name for name in FILES if not (path / name).is_file()]:
    raise checkpoint.CheckpointError(
        f'{path}: not an exported model (missing {", ".join(missing)}); `jaxformer export '
        'WORKDIR OUT` writes one.')
  where = str(path / 'config.json')
  return files.read_record(where, "the export's settings"), where


def read_config(path: pathlib.Path) -> tuple[TransformerConfig, bytes]:
  """(config, sentencepiece model bytes) of an export, without its arrays."""
  meta, where = read_meta(path)
  model = files.field(meta, 'model', dict, where)
  try:
    return config_from_dict(model), (path / 'spm.model').read_bytes()
  except (OSError, ValueError) as e:
    raise checkpoint.CheckpointError(f'{path}: damaged export ({type(e).__name__}: {e}).'
                                     ) from None


def _check_vocabulary(path: pathlib.Path, recorded: str | None, config: TransformerConfig,
                      spm_model: bytes) -> None:
  """CheckpointError when spm.model is not the vocabulary that was exported (its sha256
  `recorded`, if any) or its size is not the model's: either translates into garbage or
  crashes."""
  actual = hashlib.sha256(spm_model).hexdigest()
  if recorded is not None and recorded != actual:
    raise checkpoint.CheckpointError(
        f'{path}/spm.model is not the vocabulary this model was exported with (sha256 '
        f'{actual[:12]}..., recorded {recorded[:12]}...): put the exported spm.model back.')
  pieces = Tokenizer.from_bytes(spm_model).vocab_size
  if pieces != config.vocab_size:
    raise checkpoint.CheckpointError(
        f'{path}/spm.model has {pieces} pieces but the model has vocab_size='
        f'{config.vocab_size}: it is not this model\'s vocabulary.')


def _check_shapes(path: pathlib.Path, tensors: dict[str, np.ndarray],
                  config: TransformerConfig) -> None:
  """CheckpointError naming the first parameter that config.json's model does not have, or has
  in another shape (a config.json from another model)."""
  ids = jnp.ones((1, 8), jnp.int32)
  shapes = jax.eval_shape(lambda: Transformer(config).init(jax.random.key(0), ids, ids))
  expected = traverse_util.flatten_dict(shapes['params'], sep='/')
  for name in sorted(set(expected) | set(tensors)):
    want, got = expected.get(name), tensors.get(name)
    if want is None or got is None or tuple(want.shape) != got.shape:
      raise checkpoint.CheckpointError(
          f'{path}: params.safetensors does not fit config.json ({name}: '
          f'{"missing" if got is None else tuple(got.shape)} where the model has '
          f'{"none" if want is None else tuple(want.shape)}).')
