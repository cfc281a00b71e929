"""Reading a model of any kind (a training workdir, a checkpoint folder, jaxformer's own
export or a MarianMT folder: `load_model`), and writing one out in a format of jaxformer.formats'
registry: `save` (jaxformer's own, formats.native), `save_ctranslate2`, or any by name
(`save_as`).
"""

import hashlib
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import safetensors
import safetensors.numpy
from flax import traverse_util

from jaxformer import checkpoint, files, formats
from jaxformer.config import SettingError, TransformerConfig, config_from_dict
from jaxformer.data.tokenizer import Tokenizer
from jaxformer.formats import ctranslate2, folders, huggingface, native
from jaxformer.model import Transformer

FILES = native.FILES
MODEL = ('a model (a training workdir, a checkpoint folder, an exported model or a MarianMT '
         'folder)')
save = native.save  # jaxformer's own format
save_ctranslate2 = ctranslate2.save


def save_as(fmt: str, path: str | pathlib.Path, out: str | pathlib.Path, *,
            average_last: int | None = None, overwrite: bool = False
            ) -> tuple[pathlib.Path, int]:
  """The model at `path` (load_model) written to `out` in the format `fmt` of
  formats.REGISTRY, and its step. What can fail without the params fails before they are read:
  the destination, and a model the format cannot express (one line naming the setting)."""
  chosen = formats.REGISTRY[fmt]
  folders.check_destination(out, chosen.kind, overwrite)
  if reason := chosen.cannot(model_config(path)[0]):
    raise checkpoint.CheckpointError(f'the {fmt} format cannot express {reason}.')
  params, config, spm_model, step = load_model(path, average_last)
  return chosen.save(out, params, config, spm_model, step=step, overwrite=overwrite,
                     origin=path), step


def load(path: str | pathlib.Path) -> tuple[Any, TransformerConfig, bytes, int]:
  """(params, config, sentencepiece model bytes, step) of an exported folder; CheckpointError
  naming the problem for a folder that is not one, or a damaged file."""
  path = pathlib.Path(path)
  if (found := files.describe(path)) not in (files.EXPORT, files.EMPTY, files.FOLDER):
    raise checkpoint.CheckpointError(files.misplaced(path, found, 'an exported model'))
  meta, where = _export_meta(path)
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


def _export_meta(path: pathlib.Path) -> tuple[dict[str, Any], str]:
  """An export's config.json, and its path for messages (files.read_record), once its files
  are all there (else a CheckpointError naming those missing)."""
  if missing := [name for name in FILES if not (path / name).is_file()]:
    raise checkpoint.CheckpointError(
        f'{path}: not an exported model (missing {", ".join(missing)}); `jaxformer export '
        'WORKDIR OUT` writes one.')
  where = str(path / 'config.json')
  return files.read_record(where, "the export's settings"), where


def load_model(path: str | pathlib.Path, average_last: int | None = None
               ) -> tuple[Any, TransformerConfig, bytes, int]:
  """(params, config, sentencepiece model bytes, step) of any model: a training workdir (its
  newest checkpoint, or with average_last=N the mean of its last N), a checkpoint folder (e.g.
  WORKDIR/average-last5), an exported folder (one with a config.json; `load` says what it
  lacks, if anything) or a MarianMT folder (formats.huggingface.load: OPUS-MT's, or
  jaxformer's Hugging Face export)."""
  kind = _model_kind(path)
  if kind in (files.EXPORT, files.HUGGINGFACE) and average_last:
    raise SettingError(f'--average-last averages the checkpoints of a training workdir; {path} '
                       f'is {kind} (one set of params).')
  if kind == files.EXPORT:
    return load(path)
  if kind == files.HUGGINGFACE:
    return huggingface.load(path)
  return checkpoint.load(path, average_last)


def _model_kind(path: str | pathlib.Path) -> str:
  """files.describe's word for `path` when it is a model (an export, a MarianMT folder, a
  training workdir or a checkpoint folder); the one-line CheckpointError naming what it is
  otherwise."""
  found = files.describe(path)
  if found not in (files.EXPORT, files.HUGGINGFACE, files.WORKDIR, files.CHECKPOINTS):
    raise checkpoint.CheckpointError(files.misplaced(path, found, MODEL))
  return found


def model_config(path: str | pathlib.Path) -> tuple[TransformerConfig, bytes]:
  """(config, sentencepiece model bytes) of any model load_model reads, without its arrays."""
  path = pathlib.Path(path)
  kind = _model_kind(path)
  if kind == files.HUGGINGFACE:
    return huggingface.read_config(path), huggingface.vocabulary(path)
  if kind == files.EXPORT:
    meta, where = _export_meta(path)
    model = files.field(meta, 'model', dict, where)
    try:
      return config_from_dict(model), (path / 'spm.model').read_bytes()
    except (OSError, ValueError) as e:
      raise checkpoint.CheckpointError(f'{path}: damaged export ({type(e).__name__}: {e}).'
                                       ) from None
  meta = checkpoint.newest_meta(path)[1]
  return checkpoint.meta_config(meta), checkpoint.spm_model_bytes(meta)


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
