"""CTranslate2's Transformer (the optional extra jaxformer[ctranslate2]): the engine MT
practitioners deploy, and an independent check of jaxformer's decoding. The folder is
CTranslate2's own (config.json, model.bin, the vocabularies) with the sentencepiece model(s)
beside it (Tokenizer.files: spm.model, or a MarianMT's source.spm and target.spm)."""

import importlib.util
import pathlib
from typing import Any

import jax
import numpy as np
from flax import traverse_util

from jaxformer import checkpoint, files
from jaxformer.config import TransformerConfig
from jaxformer.data.tokenizer import Tokenizer
from jaxformer.errors import reason
from jaxformer.formats import folders
from jaxformer.model import sinusoidal_positions


def cannot(config: TransformerConfig) -> str | None:
  """The setting of `config` CTranslate2's Transformer cannot compute, or None."""
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


def save(out: str | pathlib.Path, params: Any, config: TransformerConfig, spm_model: bytes, *,
         overwrite: bool = False, **unused: Any) -> pathlib.Path:
  """Writes a CTranslate2 model of these weights (float32) into `out` (as native.save does: a new or
  empty folder, or with `overwrite` a CTranslate2 model to replace): post-LN (or pre-LN), the
  shared embedding scaled by sqrt(d_model) and tied to the softmax, jaxformer's position table,
  the checkpoint's vocabulary, decoder start = id 0 and EOS = id 1."""
  if importlib.util.find_spec('ctranslate2') is None:
    raise checkpoint.CheckpointError("the CTranslate2 export needs ctranslate2: pip install "
                                     "'jaxformer[ctranslate2]'.")
  if missing := cannot(config):
    raise checkpoint.CheckpointError(f'CTranslate2 has no Transformer with {missing}.')
  out = folders.prepare(out, files.CTRANSLATE2, overwrite)  # before the work: fails at once
  # pylint: disable-next=g-import-not-at-top
  from ctranslate2.specs import common_spec, transformer_spec

  params = jax.tree.map(lambda x: np.asarray(x, np.float32), params)
  n, heads, pre_ln = config.num_layers, config.num_heads, config.pre_ln
  activation = {'relu': common_spec.Activation.RELU, 'swish': common_spec.Activation.SWISH,
                'gelu': common_spec.Activation.GELU}[config.activation]
  options = dict(pre_norm=pre_ln, head_dim=config.key_dim, activation=activation)
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
  spec.decoder.projection.bias = params.get('output_bias',
                                            np.zeros(embedding.shape[0], np.float32))
  tokenizer = Tokenizer.from_bytes(spm_model)
  pieces = tokenizer.pieces(range(config.vocab_size))
  spec.register_source_vocabulary(pieces)
  spec.register_target_vocabulary(pieces)
  spec.config.unk_token, spec.config.eos_token = pieces[2], pieces[1]
  spec.config.bos_token = spec.config.decoder_start_token = pieces[0]
  spec.config.layer_norm_epsilon = config.norm_epsilon
  spec.validate()
  spec.optimize(quantization='float32')
  try:
    with folders.written_whole(out, params, spm_model) as tmp:
      spec.save(str(tmp))
      for name, content in tokenizer.files().items():  # to tokenize for it: pieces in and out
        (tmp / name).write_bytes(content)
  except files.DiskFullError:
    raise
  except OSError as e:
    raise checkpoint.CheckpointError(f'{out}: cannot write the export ({reason(e)}).') from None
  return out
