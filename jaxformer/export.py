"""Reading a model of any kind (a training workdir, a checkpoint folder, jaxformer's own
export or a MarianMT folder: `load_model`), and writing one out in a format of jaxformer.formats'
registry: `save` (jaxformer's own, formats.native), `save_ctranslate2`, or any by name
(`save_as`).
"""

import pathlib
from typing import Any

from jaxformer import checkpoint, files, formats
from jaxformer.config import SettingError, TransformerConfig
from jaxformer.formats import ctranslate2, folders, huggingface, native

FILES = native.FILES
MODEL = ('a model (a training workdir, a checkpoint folder, an exported model or a MarianMT '
         'folder)')
save, load = native.save, native.load  # jaxformer's own format
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
    return native.read_config(path)
  meta = checkpoint.newest_meta(path)[1]
  return checkpoint.meta_config(meta), checkpoint.spm_model_bytes(meta)
