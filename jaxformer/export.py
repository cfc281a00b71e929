"""A trained model as a plain, self-contained folder, loadable without orbax or the workdir::

  config.json         {"format": "jaxformer", "version", "step", "spm_sha256", "spm_pieces",
                       "model": TransformerConfig fields}
  spm.model           the shared sentencepiece vocabulary
  params.safetensors  the params, one tensor per leaf, named by its path ('encoder/layers_0/...')

or as a CTranslate2 model of the same weights (`save_ctranslate2`, the optional extra
jaxformer[ctranslate2]): the engine MT practitioners deploy, and an independent check of
jaxformer's decoding.
"""

import contextlib
import hashlib
import importlib.util
import json
import os
import pathlib
import shutil
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import safetensors
import safetensors.numpy
from flax import traverse_util

import jaxformer
from jaxformer import checkpoint, files
from jaxformer.config import SettingError, TransformerConfig, config_from_dict, config_to_dict
from jaxformer.data.tokenizer import Tokenizer
from jaxformer.model import Transformer, sinusoidal_positions

FILES = ('config.json', 'spm.model', 'params.safetensors')
MODEL = 'a model (a training workdir, a checkpoint folder or an exported model)'


def save(out: str | pathlib.Path, params: Any, config: TransformerConfig, spm_model: bytes, *,
         step: int, overwrite: bool = False) -> pathlib.Path:
  """Writes the three files into `out` (a new or empty folder, or with `overwrite` an export
  to replace) and returns it; one writer at a time (a second export into `out` meanwhile is a
  CheckpointError naming the first)."""
  out = _folder(out, 'jaxformer', overwrite)
  tensors = {key: np.ascontiguousarray(value) for key, value in
             traverse_util.flatten_dict(params, sep='/').items()}
  with _written_whole(out, params, spm_model) as tmp:
    safetensors.numpy.save_file(tensors, tmp / 'params.safetensors')
    files.respect_umask(tmp / 'params.safetensors')
    (tmp / 'spm.model').write_bytes(spm_model)
    (tmp / 'config.json').write_text(json.dumps(
        {'format': 'jaxformer', 'version': jaxformer.__version__, 'step': step,
         'spm_sha256': hashlib.sha256(spm_model).hexdigest(),
         'spm_pieces': Tokenizer.from_bytes(spm_model).vocab_size,
         'model': config_to_dict(config)}, indent=2) + '\n')
  return out


@contextlib.contextmanager
def _written_whole(out: pathlib.Path, params: Any, spm_model: bytes) -> Iterator[pathlib.Path]:
  """A temporary folder beside `out` to write the export of `params` into; its files replace
  `out`'s once all are written. One writer at a time (a second export into `out` meanwhile is a
  CheckpointError naming the first). Checks the space first. On a full disk, or any failure,
  the temporary folder goes, `out` keeps what it had, and an `out` left empty is removed."""
  size = sum(np.asarray(leaf).nbytes for leaf in jax.tree.leaves(params)) + len(spm_model)
  tmp = out.parent / f'.{out.name}.partial'  # the lock makes it this writer's own
  with files.locked(out.parent, out.name, f'writing {out.name}'):
    try:
      files.check_space(out, size, 'the export')
      tmp.mkdir(exist_ok=True)
      yield tmp
      for written in tmp.iterdir():
        os.replace(written, out / written.name)
    except Exception as e:
      shutil.rmtree(tmp, ignore_errors=True)  # before the free space is measured
      if not any(out.iterdir()):
        out.rmdir()
      if files.disk_full(e):
        raise files.no_space(out, 'the export', size) from None
      raise
    finally:
      shutil.rmtree(tmp, ignore_errors=True)


def load(path: str | pathlib.Path) -> tuple[Any, TransformerConfig, bytes, int]:
  """(params, config, sentencepiece model bytes, step) of an exported folder; CheckpointError
  naming the problem for a folder that is not one, or a damaged file."""
  path = pathlib.Path(path)
  if (found := files.describe(path)) not in (files.EXPORT, files.EMPTY, files.FOLDER):
    raise checkpoint.CheckpointError(files.misplaced(path, found, 'an exported model'))
  if missing := [name for name in FILES if not (path / name).is_file()]:
    raise checkpoint.CheckpointError(
        f'{path}: not an exported model (missing {", ".join(missing)}); `jaxformer export '
        'WORKDIR OUT` writes one.')
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
  """An export's config.json, and its path for messages (files.read_record)."""
  where = str(path / 'config.json')
  return files.read_record(where, "the export's settings"), where


def load_model(path: str | pathlib.Path, average_last: int | None = None
               ) -> tuple[Any, TransformerConfig, bytes, int]:
  """(params, config, sentencepiece model bytes, step) of any model: a training workdir (its
  newest checkpoint, or with average_last=N the mean of its last N), a checkpoint folder (e.g.
  WORKDIR/average-last5) or an exported folder (one with a config.json; `load` says what it
  lacks, if anything)."""
  if _model_kind(path) == files.EXPORT:
    if average_last:
      raise SettingError(f'--average-last averages the checkpoints of a training workdir; {path} '
                         'is an exported folder (one set of params).')
    return load(path)
  return checkpoint.load(path, average_last)


def _model_kind(path: str | pathlib.Path) -> str:
  """files.describe's word for `path` when it is a model (an export, a training workdir or a
  checkpoint folder); the one-line CheckpointError naming what it is otherwise."""
  found = files.describe(path)
  if found not in (files.EXPORT, files.WORKDIR, files.CHECKPOINTS):
    raise checkpoint.CheckpointError(files.misplaced(path, found, MODEL))
  return found


def model_config(path: str | pathlib.Path) -> tuple[TransformerConfig, bytes]:
  """(config, sentencepiece model bytes) of any model load_model reads, without its arrays."""
  path = pathlib.Path(path)
  if _model_kind(path) == files.EXPORT:
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


# --- CTranslate2 ----------------------------------------------------------------------------------


def _ctranslate2_refusal(config: TransformerConfig) -> str | None:
  """Why CTranslate2's Transformer cannot compute `config`, or None when it can."""
  if config.key_dim != config.value_dim:
    return f'd_k ({config.key_dim}) != d_v ({config.value_dim})'
  if config.attention_window is not None:
    return 'restricted self-attention (attention_window)'
  return None


def _linear(spec: Any, kernels: list[np.ndarray], biases: list[np.ndarray]) -> None:
  """A CTranslate2 LinearSpec ([out, in] weights) from flax kernels [in, ..., out...]
  concatenated along the output (e.g. q, k, v into one projection)."""
  spec.weight = np.concatenate([k.reshape(k.shape[0], -1).T for k in kernels])
  spec.bias = np.concatenate([b.reshape(-1) for b in biases])


def _attention(spec: Any, params: dict, norm: dict, *, cross: bool) -> None:
  """Self-attention: [q k v] then out; encoder-decoder attention: q, [k v], then out."""
  q, k, v, out = (params[name] for name in ('query', 'key', 'value', 'out'))
  groups = [[q], [k, v]] if cross else [[q, k, v]]
  for linear, group in zip(spec.linear, groups):
    _linear(linear, [p['kernel'] for p in group], [p['bias'] for p in group])
  heads, head_dim, d_model = out['kernel'].shape
  _linear(spec.linear[-1], [out['kernel'].reshape(heads * head_dim, d_model)], [out['bias']])
  _norm(spec.layer_norm, norm)


def _norm(spec: Any, params: dict) -> None:
  spec.gamma, spec.beta = params['scale'], params['bias']


def _ffn(spec: Any, params: dict, norm: dict) -> None:
  _linear(spec.linear_0, [params['Dense_0']['kernel']], [params['Dense_0']['bias']])
  _linear(spec.linear_1, [params['Dense_1']['kernel']], [params['Dense_1']['bias']])
  _norm(spec.layer_norm, norm)


def _positions(stack: dict, config: TransformerConfig) -> np.ndarray:
  """The stack's position encodings for positions 0..max_len-1: jaxformer's own sinusoids (or
  the learned table of Table 3 row E)."""
  learned = [v for k, v in traverse_util.flatten_dict(stack, sep='/').items()
             if k.endswith('position_embedding')]
  if learned:
    return np.asarray(learned[0], np.float32)
  return np.asarray(sinusoidal_positions(np.arange(config.max_len), config.d_model), np.float32)


def save_ctranslate2(out: str | pathlib.Path, params: Any, config: TransformerConfig,
                     spm_model: bytes, *, overwrite: bool = False) -> pathlib.Path:
  """Writes a CTranslate2 model of these weights (float32) into `out` (as `save` does: a new or
  empty folder, or with `overwrite` a CTranslate2 model to replace): post-LN (or pre-LN), the
  shared embedding scaled by sqrt(d_model) and tied to the softmax, jaxformer's position table,
  the checkpoint's vocabulary, decoder start = id 0 and EOS = id 1."""
  if importlib.util.find_spec('ctranslate2') is None:
    raise checkpoint.CheckpointError("the CTranslate2 export needs ctranslate2: pip install "
                                     "'jaxformer[ctranslate2]'.")
  if reason := _ctranslate2_refusal(config):
    raise checkpoint.CheckpointError(f'CTranslate2 has no Transformer with {reason}.')
  out = _folder(out, 'ctranslate2', overwrite)  # before the work: fails at once
  from ctranslate2.specs import transformer_spec  # pylint: disable=g-import-not-at-top

  params = jax.tree.map(lambda x: np.asarray(x, np.float32), params)
  n, heads, pre_ln = config.num_layers, config.num_heads, config.pre_ln
  options = dict(pre_norm=pre_ln, head_dim=config.key_dim)
  spec = transformer_spec.TransformerSpec(
      transformer_spec.TransformerEncoderSpec(n, heads, **options),
      transformer_spec.TransformerDecoderSpec(n, heads, **options))
  embedding = params['embed']['embedding']
  for stack_spec, stack, embeddings in (
      (spec.encoder, params['encoder'], spec.encoder.embeddings[0]),
      (spec.decoder, params['decoder'], spec.decoder.embeddings)):
    embeddings.weight = embedding
    stack_spec.position_encodings.encodings = _positions(stack, config)
    if pre_ln:
      _norm(stack_spec.layer_norm, stack['final_norm'])
  for i, layer in enumerate(spec.encoder.layer):
    p = params['encoder'][f'layers_{i}']
    _attention(layer.self_attention, p['self_attention'], p['residuals_0']['norm'], cross=False)
    _ffn(layer.ffn, p['ffn'], p['residuals_1']['norm'])
  for i, layer in enumerate(spec.decoder.layer):
    p = params['decoder'][f'layers_{i}']
    _attention(layer.self_attention, p['self_attention'], p['residuals_0']['norm'], cross=False)
    _attention(layer.attention, p['cross_attention'], p['residuals_1']['norm'], cross=True)
    _ffn(layer.ffn, p['ffn'], p['residuals_2']['norm'])
  spec.decoder.projection.weight = embedding
  spec.decoder.projection.bias = np.zeros(embedding.shape[0], np.float32)
  tokenizer = Tokenizer.from_bytes(spm_model)
  pieces = tokenizer.pieces(range(config.vocab_size))
  spec.register_source_vocabulary(pieces)
  spec.register_target_vocabulary(pieces)
  spec.config.unk_token, spec.config.eos_token = pieces[2], pieces[1]
  spec.config.bos_token = spec.config.decoder_start_token = pieces[0]
  spec.config.layer_norm_epsilon = 1e-6
  spec.validate()
  spec.optimize(quantization='float32')
  try:
    with _written_whole(out, params, spm_model) as tmp:
      spec.save(str(tmp))
      (tmp / 'spm.model').write_bytes(spm_model)  # to tokenize for it: pieces in, pieces out
  except files.DiskFullError:
    raise
  except OSError as e:
    raise checkpoint.CheckpointError(f'{out}: cannot write the export ({e.strerror}).') from None
  return out


FORMATS = {'jaxformer': files.EXPORT, 'ctranslate2': files.CTRANSLATE2}


def check_destination(out: str | pathlib.Path, fmt: str, overwrite: bool) -> None:
  """A one-line CheckpointError naming what `out` holds unless it is new, empty, or (with
  `overwrite`) an export of the same format `fmt` (FORMATS). In a training workdir, every later
  command would load the export instead of the newer checkpoints; over an export of the other
  format, the folder would load as neither."""
  found, kind = files.describe(out), FORMATS[fmt]
  if found == kind and not overwrite:
    raise checkpoint.CheckpointError(f'{out}: is {found} already: pass --overwrite to replace '
                                     'it.')
  if found not in (files.MISSING, files.EMPTY, kind):
    raise checkpoint.CheckpointError(files.misplaced(out, found, 'a new or empty folder for '
                                                     'the export'))


def _folder(out: str | pathlib.Path, fmt: str, overwrite: bool) -> pathlib.Path:
  """The export folder (check_destination), created if needed; a one-line error if it cannot
  be."""
  check_destination(out, fmt, overwrite)
  out = pathlib.Path(out)
  try:
    out.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise checkpoint.CheckpointError(f'{out}: cannot create the export folder ({e.strerror}).'
                                     ) from None
  return out
