"""Hugging Face transformers' MarianMT (PyTorch weights in safetensors): what
`MarianMTModel.from_pretrained(OUT)` and `MarianTokenizer.from_pretrained(OUT)` load, the format
of the OPUS-MT models on the Hub. Written with numpy alone: neither torch nor transformers is
needed to export.

The architectures are the same (post-LN layers, biases on every projection, one embedding for
encoder, decoder and output scaled by sqrt(d_model), static sinusoids, the FFN's activation
and the output bias as config.activation and config.output_bias say, decoding from the
padding token). What differs, and how it is bridged:

- Marian's position table holds the sines in the first half of the dimensions and the cosines
  in the second; jaxformer interleaves them (sin at 2i, cos at 2i + 1). transformers never
  reads a saved table (it makes its own), so the model's d_model basis is permuted instead,
  through every weight that reads or writes it (`tensors`): jaxformer's dimension perm[k]
  becomes Marian's k. Layer norms are equivariant under it, so the model computes the same.
- Marian's LayerNorms keep torch's epsilon, 1e-5 (jaxformer's: 1e-6, unless the model came
  from a MarianMT folder: model.norm_epsilon); MarianConfig cannot set it. docs/BENCHMARKS.md
  measures what it moves.
- transformers' beam search divides a hypothesis's log-probability by length^alpha, not by
  GNMT's ((5 + length) / 6)^alpha (§6.1): beam outputs may differ, greedy ones do not.
- The output layer's final_logits_bias is the model's output_bias, or zeros; the shared
  sentencepiece model serves as both source.spm and target.spm (a MarianMT's own two where the
  model came from one), and vocab.json maps the pieces to jaxformer's ids.
"""

import json
import os
import pathlib
from typing import Any

import jax
import numpy as np
import safetensors
import safetensors.numpy
from flax import traverse_util

from jaxformer import checkpoint, files
from jaxformer.config import SettingError, TransformerConfig
from jaxformer.data.tokenizer import EOS_ID, PAD_ID, UNK_ID, Tokenizer, sided_bytes
from jaxformer.formats import card, folders
from jaxformer.model import Transformer


def cannot(config: TransformerConfig) -> str | None:
  """The setting of `config` that MarianMT cannot express, as --set names it, or None."""
  if config.pre_ln:
    return 'model.pre_ln=true (Marian normalises after each residual)'
  if config.learned_positions:
    return 'model.learned_positions=true (Marian makes its sinusoids itself)'
  if config.attention_window is not None:
    return f'model.attention_window={config.attention_window} (Marian attends to every position)'
  if config.d_model % 2:
    return f'model.d_model={config.d_model} (odd: Marian\'s table pairs the dimensions)'
  if config.num_heads * config.key_dim != config.d_model or config.key_dim != config.value_dim:
    return (f'model.qk_dim={config.key_dim}, model.v_dim={config.value_dim} (Marian\'s heads '
            f'are d_model / h = {config.d_model / config.num_heads:g} wide)')
  return None


def permutation(d_model: int) -> np.ndarray:
  """perm: Marian's dimension k is jaxformer's perm[k] (the sines, then the cosines)."""
  return np.concatenate([np.arange(0, d_model, 2), np.arange(1, d_model, 2)])


def _linear_in(kernel: np.ndarray, bias: np.ndarray, perm: np.ndarray) -> dict[str, np.ndarray]:
  """torch's [out, in] weight of a projection that reads the residual stream: flax's kernel
  [d_model, ...out], its input rows permuted."""
  return {'weight': kernel.reshape(kernel.shape[0], -1)[perm].T, 'bias': bias.reshape(-1)}


def _linear_out(kernel: np.ndarray, bias: np.ndarray, perm: np.ndarray) -> dict[str, np.ndarray]:
  """A projection that writes the residual stream: flax's kernel [...in, d_model], its output
  columns (and bias) permuted."""
  return {'weight': kernel.reshape(-1, kernel.shape[-1])[:, perm].T, 'bias': bias[perm]}


def _attention(params: dict, perm: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
  names = {'q_proj': 'query', 'k_proj': 'key', 'v_proj': 'value'}
  torch = {ours: _linear_in(params[theirs]['kernel'], params[theirs]['bias'], perm)
           for ours, theirs in names.items()}
  return {**torch, 'out_proj': _linear_out(params['out']['kernel'], params['out']['bias'], perm)}


def _norm(params: dict, perm: np.ndarray) -> dict[str, np.ndarray]:
  return {'weight': params['scale'][perm], 'bias': params['bias'][perm]}


def _ffn(params: dict, perm: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
  return {'fc1': _linear_in(params['Dense_0']['kernel'], params['Dense_0']['bias'], perm),
          'fc2': _linear_out(params['Dense_1']['kernel'], params['Dense_1']['bias'], perm)}


def tensors(params: Any, config: TransformerConfig) -> dict[str, np.ndarray]:
  """MarianMTModel's state dict (the names save_pretrained writes) of jaxformer's params."""
  params = jax.tree.map(lambda x: np.asarray(x, np.float32), params)
  perm = permutation(config.d_model)
  embedding = params['embed']['embedding']
  layers: dict[str, Any] = {}
  for i in range(config.num_layers):
    p = params['encoder'][f'layers_{i}']
    layers[f'model.encoder.layers.{i}'] = {
        'self_attn': _attention(p['self_attention'], perm),
        'self_attn_layer_norm': _norm(p['residuals_0']['norm'], perm),
        **_ffn(p['ffn'], perm), 'final_layer_norm': _norm(p['residuals_1']['norm'], perm)}
    p = params['decoder'][f'layers_{i}']
    layers[f'model.decoder.layers.{i}'] = {
        'self_attn': _attention(p['self_attention'], perm),
        'self_attn_layer_norm': _norm(p['residuals_0']['norm'], perm),
        'encoder_attn': _attention(p['cross_attention'], perm),
        'encoder_attn_layer_norm': _norm(p['residuals_1']['norm'], perm),
        **_ffn(p['ffn'], perm), 'final_layer_norm': _norm(p['residuals_2']['norm'], perm)}
  flat = {'model.shared.weight': embedding[:, perm],
          'final_logits_bias': params.get('output_bias', np.zeros(config.vocab_size, np.float32)
                                          ).reshape(1, -1)}
  flat.update(traverse_util.flatten_dict(layers, sep='.'))
  return {name: np.ascontiguousarray(value) for name, value in flat.items()}


def model_config(config: TransformerConfig) -> dict[str, Any]:
  """config.json: MarianConfig's fields for `config`."""
  return {
      'architectures': ['MarianMTModel'], 'model_type': 'marian', 'is_encoder_decoder': True,
      'vocab_size': config.vocab_size, 'decoder_vocab_size': config.vocab_size,
      'd_model': config.d_model, 'encoder_layers': config.num_layers,
      'decoder_layers': config.num_layers, 'encoder_attention_heads': config.num_heads,
      'decoder_attention_heads': config.num_heads, 'encoder_ffn_dim': config.d_ff,
      'decoder_ffn_dim': config.d_ff, 'activation_function': config.activation,
      'dropout': config.dropout_rate, 'attention_dropout': config.attention_dropout_rate,
      'activation_dropout': config.relu_dropout_rate,
      'max_position_embeddings': config.max_len, 'scale_embedding': True,
      'share_encoder_decoder_embeddings': True, 'tie_word_embeddings': True,
      'pad_token_id': PAD_ID, 'eos_token_id': EOS_ID, 'decoder_start_token_id': PAD_ID,
      'forced_eos_token_id': None, 'dtype': 'float32'}


def generation_config(config: TransformerConfig, alpha: float, beam_size: int) -> dict[str, Any]:
  """generation_config.json: the paper's decoding as near as transformers' allows. Its length
  penalty divides by length^alpha (GNMT's formula is not among its options), and its length
  limit is one number for every sentence: max_len pieces after the decoder's start token
  (max_length counts it), where jaxformer's is also each input's length + 50 (give
  max_new_tokens per call for that)."""
  return {'decoder_start_token_id': PAD_ID, 'eos_token_id': EOS_ID, 'pad_token_id': PAD_ID,
          'bad_words_ids': [[PAD_ID]], 'num_beams': beam_size, 'length_penalty': alpha,
          'max_length': config.max_len + 1, 'early_stopping': True, 'forced_eos_token_id': None}


def save(out: str | pathlib.Path, params: Any, config: TransformerConfig, spm_model: bytes, *,
         step: int, overwrite: bool = False, origin: str | pathlib.Path | None = None,
         alpha: float = 0.6, beam_size: int = 4, **unused: Any) -> pathlib.Path:
  """Writes the MarianMT folder of these weights into `out` (a new or empty folder, or with
  `overwrite` a Hugging Face model to replace), with a model card of what `origin` (the model's
  path, when it lies in a workdir) recorded."""
  if reason := cannot(config):
    raise checkpoint.CheckpointError(f'the huggingface format cannot express {reason}.')
  out = folders.prepare(out, files.HUGGINGFACE, overwrite)  # before the work: fails at once
  tokenizer = Tokenizer.from_bytes(spm_model)
  pieces = tokenizer.pieces(range(config.vocab_size))
  data, rules = card.recorded_data(origin)
  with folders.written_whole(out, params, spm_model) as tmp:
    safetensors.numpy.save_file(tensors(params, config), tmp / 'model.safetensors',
                                metadata={'format': 'pt'})
    files.respect_umask(tmp / 'model.safetensors')
    for name, content in (
        ('config.json', {**model_config(config), 'jaxformer_step': step,
                         'jaxformer_norm_epsilon': config.norm_epsilon}),
        ('generation_config.json', generation_config(config, alpha, beam_size)),
        ('vocab.json', {piece: i for i, piece in enumerate(pieces)}),
        ('tokenizer_config.json', {
            'tokenizer_class': 'MarianTokenizer', 'source_lang': data.get('source_language'),
            'target_lang': data.get('target_language'), 'separate_vocabs': False,
            'model_max_length': config.max_len,
            'pad_token': pieces[PAD_ID], 'eos_token': pieces[EOS_ID],
            'unk_token': pieces[UNK_ID]})):
      (tmp / name).write_text(json.dumps(content, indent=2, ensure_ascii=False) + '\n')
    for name, model in zip(('source.spm', 'target.spm'), tokenizer.sides()):
      (tmp / name).write_bytes(model)
    (tmp / 'README.md').write_text(card.markdown(origin, config, step, data, rules))
  return out


# --- reading a MarianMT folder (an OPUS-MT model, or this module's own export) ------------------
#
# Read in place, not converted by a command of its own: every command and Translator.load
# take the folder (or the Hub cache's folder of it) as they take any model, as transformers
# users expect of a model path, and no converted copy can fall out of step with it. The
# vocabulary is renumbered so that pad, EOS and unk take jaxformer's ids 0, 1 and 2 (the rest
# keep Marian's order), the embedding's and the output bias's rows with it; the sinusoid
# permutation is undone; the layer norms keep Marian's epsilon, 1e-5 (model.norm_epsilon).

MARIAN_FILES = ('config.json', 'vocab.json', 'source.spm', 'target.spm')
# MarianConfig's fields (and the BART-era ones OPUS-MT's config.json still carries) that a
# jaxformer Transformer cannot compute with these values: (field, the value it must have, why).
_REFUSED = (
    ('share_encoder_decoder_embeddings', True, 'separate source and target embeddings'),
    ('scale_embedding', True, 'embeddings not scaled by sqrt(d_model)'),
    ('normalize_embedding', False, 'a layer norm on the embeddings'),
    ('layernorm_embedding', False, 'a layer norm on the embeddings'),
    ('normalize_before', False, 'layer norms before each sub-layer (pre-LN) in Marian'),
    ('add_final_layer_norm', False, 'a final layer norm in each stack'),
    ('static_position_embeddings', True, 'learned positions in Marian'),
    ('add_bias_logits', False, 'a second output bias'))
_ACTIVATIONS = {'relu': 'relu', 'swish': 'swish', 'silu': 'swish', 'gelu': 'gelu'}


def resolve(path: str | os.PathLike) -> pathlib.Path:
  """The MarianMT folder at `path`, or, for a folder of the Hub's download cache
  (models--ORG--NAME, with refs/ and snapshots/), its snapshot of refs/main (or its only one)."""
  path = pathlib.Path(path)
  if not (path / 'snapshots').is_dir():
    return path
  ref = path / 'refs' / 'main'
  snapshots = sorted((path / 'snapshots').iterdir())
  if ref.is_file():
    return path / 'snapshots' / ref.read_text().strip()
  if len(snapshots) == 1:
    return snapshots[0]
  raise checkpoint.CheckpointError(f'{path}: a Hub cache folder of {len(snapshots)} snapshots '
                                   'and no refs/main: give the snapshot folder itself.')


def _marian_config(path: pathlib.Path) -> tuple[dict[str, Any], str]:
  """config.json of a MarianMT folder (CheckpointError naming what is missing or not Marian)."""
  if missing := [name for name in MARIAN_FILES if not (path / name).is_file()]:
    raise checkpoint.CheckpointError(f'{path}: not a MarianMT model (missing '
                                     f'{", ".join(missing)}).')
  where = str(path / 'config.json')
  meta = files.read_record(where, "the model's settings")
  if (kind := files.field(meta, 'model_type', str, where, None)) != 'marian':
    raise checkpoint.CheckpointError(f'{where}: a {kind or "untyped"} model; jaxformer reads '
                                     'MarianMT ones (model_type "marian").')
  return meta, where


def read_config(path: str | os.PathLike) -> TransformerConfig:
  """The TransformerConfig of a MarianMT folder: its shape, dropouts, activation, the output
  bias, Marian's epsilon, and as max_len the fewer of its positions and its generation
  config's max_length (less the start token). The epsilon is Marian's, 1e-5, unless
  jaxformer's export recorded the model's own. One line naming the field for what a
  jaxformer Transformer cannot compute."""
  path = resolve(path)
  return _config_of(path, *_marian_config(path))


def _config_of(path: pathlib.Path, meta: dict[str, Any], where: str) -> TransformerConfig:
  """read_config's, from the config.json already read."""
  number = lambda name, default=None: files.field(meta, name, int, where, default)  # noqa: E731
  for name, wanted, what in _REFUSED:
    if name in meta and meta[name] != wanted:
      raise checkpoint.CheckpointError(f'{where}: "{name}": {json.dumps(meta[name])} ({what}) '
                                       'is not supported.')
  for mine, theirs in (('encoder_layers', 'decoder_layers'), ('encoder_ffn_dim', 'decoder_ffn_dim'),
                       ('encoder_attention_heads', 'decoder_attention_heads'),
                       ('vocab_size', 'decoder_vocab_size')):
    if number(theirs, number(mine)) != number(mine):
      raise checkpoint.CheckpointError(f'{where}: "{mine}" {number(mine)} and "{theirs}" '
                                       f'{number(theirs)} differ (jaxformer has one of each).')
  if meta.get('decoder_start_token_id') != meta.get('pad_token_id'):
    raise checkpoint.CheckpointError(f'{where}: "decoder_start_token_id" is not the padding '
                                     "token (Marian's and jaxformer's decoders start from it).")
  activation = files.field(meta, 'activation_function', str, where, 'relu')
  if activation not in _ACTIVATIONS:
    raise checkpoint.CheckpointError(f'{where}: "activation_function": "{activation}" is not '
                                     f'supported (only {", ".join(_ACTIVATIONS)}).')
  max_len = number('max_position_embeddings')
  generation = _generation(path, meta)
  if 'max_length' in generation:
    max_len = min(max_len, files.field(generation, 'max_length', int, where) - 1)
  fraction = lambda name: float(files.field(meta, name, (int, float), where, 0.0))  # noqa: E731
  try:
    return TransformerConfig(
        vocab_size=number('vocab_size'), num_layers=number('encoder_layers'),
        d_model=number('d_model'), d_ff=number('encoder_ffn_dim'),
        num_heads=number('encoder_attention_heads'), dropout_rate=fraction('dropout'),
        attention_dropout_rate=fraction('attention_dropout'),
        relu_dropout_rate=fraction('activation_dropout'), max_len=max_len,
        activation=_ACTIVATIONS[activation], output_bias=True,
        norm_epsilon=fraction('jaxformer_norm_epsilon') or 1e-5)  # jaxformer's, else torch's
  except SettingError as e:
    raise checkpoint.CheckpointError(f'{where}: {e}') from None


def _generation(path: pathlib.Path, meta: dict[str, Any]) -> dict[str, Any]:
  """The generation settings (generation_config.json's, else config.json's), checked: a
  bad_words_ids other than the padding token (which no jaxformer search emits) is refused."""
  found = path / 'generation_config.json'
  generation = files.read_record(found, 'the generation settings') if found.is_file() else meta
  bad = generation.get('bad_words_ids') or []
  if any(words != [meta.get('pad_token_id')] for words in bad):
    raise checkpoint.CheckpointError(f'{found}: "bad_words_ids" {json.dumps(bad)[:60]}: only '
                                     'the padding token is supported.')
  return generation


def _renumbering(path: pathlib.Path, meta: dict[str, Any], vocab_size: int
                 ) -> tuple[np.ndarray, list[str]]:
  """(order, pieces): jaxformer's id j is Marian's order[j] (pad, EOS, unk, then the rest in
  Marian's order), and pieces[j] its piece."""
  where = str(path / 'vocab.json')
  vocab = files.read_record(where, 'the vocabulary')
  tokens = files.read_record(path / 'tokenizer_config.json', "the tokenizer's settings") \
      if (path / 'tokenizer_config.json').is_file() else {}
  if tokens.get('separate_vocabs'):
    raise checkpoint.CheckpointError(f'{path}/tokenizer_config.json: "separate_vocabs": true '
                                     '(separate source and target vocabularies) is not '
                                     'supported.')
  by_id = {i: piece for piece, i in vocab.items() if isinstance(i, int)}
  if sorted(by_id) != list(range(vocab_size)):
    raise checkpoint.CheckpointError(f'{where}: not the ids 0..{vocab_size - 1} of the '
                                     f'model\'s vocab_size ({len(by_id)} ids).')
  unk = vocab.get(str(tokens.get('unk_token', '<unk>')))
  special = [meta.get('pad_token_id'), meta.get('eos_token_id'), unk]
  if None in special or len(set(special)) < 3:
    raise checkpoint.CheckpointError(f'{path}: the padding, end and unknown tokens are not '
                                     f'three ids of the vocabulary ({special}).')
  order = np.array(special + [i for i in range(vocab_size) if i not in special])
  return order, [by_id[int(i)] for i in order]


def _state_dict(path: pathlib.Path) -> dict[str, np.ndarray]:
  """The weights, from model.safetensors, or from pytorch_model.bin with torch."""
  if (path / 'model.safetensors').is_file():
    try:
      return safetensors.numpy.load_file(path / 'model.safetensors')
    except (OSError, ValueError, safetensors.SafetensorError) as e:
      raise checkpoint.CheckpointError(f'{path}/model.safetensors: damaged ({e}).') from None
  if not (path / 'pytorch_model.bin').is_file():
    raise checkpoint.CheckpointError(f'{path}: no weights (model.safetensors or '
                                     'pytorch_model.bin).')
  try:
    import torch  # pylint: disable=g-import-not-at-top  (only for torch's own format)
  except ImportError:
    raise checkpoint.CheckpointError(f'{path}/pytorch_model.bin: reading it needs torch (pip '
                                     'install torch), or a model.safetensors.') from None
  try:  # (torch's loader raises many kinds for a damaged file: any is one line here)
    weights = torch.load(path / 'pytorch_model.bin', map_location='cpu', weights_only=True)
    return {name: value.float().numpy() for name, value in weights.items()}
  except Exception as e:  # pylint: disable=broad-except
    raise checkpoint.CheckpointError(f'{path}/pytorch_model.bin: damaged ({type(e).__name__}: '
                                     f'{str(e).splitlines()[0] if str(e) else ""}).') from None


def _embedding(path: pathlib.Path, state: dict[str, np.ndarray]) -> np.ndarray:
  """The one embedding every tied name holds (a folder may keep any of them)."""
  names = ('model.shared.weight', 'model.encoder.embed_tokens.weight',
           'model.decoder.embed_tokens.weight', 'lm_head.weight')
  found = [state[name] for name in names if name in state]
  if not found:
    raise checkpoint.CheckpointError(f'{path}: no embedding ({names[0]}) among the weights.')
  if any(not np.array_equal(found[0], other) for other in found[1:]):
    raise checkpoint.CheckpointError(f'{path}: the encoder, decoder and output embeddings differ '
                                     '(separate embeddings are not supported).')
  return found[0]


# Marian's sub-layers of a layer, in jaxformer's order (residuals_0, _1, ...): the prefix of
# their weights' names, jaxformer's module, the projections (Marian's name, jaxformer's, and
# whether it reads the residual stream, whose basis is permuted), and the sub-layer's norm.
_ATTENTION = (('q_proj', 'query', True), ('k_proj', 'key', True), ('v_proj', 'value', True),
              ('out_proj', 'out', False))
_FFN = ('', 'ffn', (('fc1', 'Dense_0', True), ('fc2', 'Dense_1', False)), 'final_layer_norm')
_SUBLAYERS = {
    'encoder': (('self_attn.', 'self_attention', _ATTENTION, 'self_attn_layer_norm'), _FFN),
    'decoder': (('self_attn.', 'self_attention', _ATTENTION, 'self_attn_layer_norm'),
                ('encoder_attn.', 'cross_attention', _ATTENTION, 'encoder_attn_layer_norm'),
                _FFN)}


def params_of(state: dict[str, np.ndarray], config: TransformerConfig, order: np.ndarray,
              path: pathlib.Path) -> dict[str, Any]:
  """jaxformer's params of MarianMTModel's state dict: the inverse of `tensors`, with the
  vocabulary's rows in jaxformer's order (`order`, _renumbering)."""
  inverse = np.argsort(permutation(config.d_model))  # jaxformer's dimension k: Marian's inverse[k]
  shapes = jax.eval_shape(lambda: Transformer(config).init(
      jax.random.key(0), np.ones((1, 2), np.int32), np.ones((1, 2), np.int32)))['params']
  wanted = traverse_util.flatten_dict(shapes, sep='/')

  def get(name: str) -> np.ndarray:
    if name not in state:
      raise checkpoint.CheckpointError(f'{path}: {name} is missing from the weights.')
    return np.asarray(state[name], np.float32)

  def linear(name: str, ours: str, reads: bool) -> dict[str, np.ndarray]:
    weight, bias = get(f'{name}.weight').T, get(f'{name}.bias')  # [in, out]
    if reads:
      weight = weight[inverse]
    else:
      weight, bias = weight[:, inverse], bias[inverse]
    return {'kernel': weight.reshape(wanted[f'{ours}/kernel'].shape),
            'bias': bias.reshape(wanted[f'{ours}/bias'].shape)}

  flat: dict[str, np.ndarray] = {}
  for stack, sublayers in _SUBLAYERS.items():
    for i in range(config.num_layers):
      theirs, ours = f'model.{stack}.layers.{i}', f'{stack}/layers_{i}'
      for index, (prefix, module, projections, norm) in enumerate(sublayers):
        for their_name, our_name, reads in projections:
          where = f'{ours}/{module}/{our_name}'
          flat.update(_prefixed(where, linear(f'{theirs}.{prefix}{their_name}', where, reads)))
        flat[f'{ours}/residuals_{index}/norm/scale'] = get(f'{theirs}.{norm}.weight')[inverse]
        flat[f'{ours}/residuals_{index}/norm/bias'] = get(f'{theirs}.{norm}.bias')[inverse]
  flat['embed/embedding'] = _embedding(path, state).astype(np.float32)[order][:, inverse]
  flat['output_bias'] = get('final_logits_bias').reshape(-1)[order]
  for name in sorted(set(wanted) | set(flat)):
    if name not in flat or name not in wanted or flat[name].shape != wanted[name].shape:
      raise checkpoint.CheckpointError(f'{path}: the weights do not fit config.json ({name}).')
  return traverse_util.unflatten_dict(flat, sep='/')


def _prefixed(prefix: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  return {f'{prefix}/{name}': value for name, value in arrays.items()}


def _vocabulary(path: pathlib.Path, meta: dict[str, Any], vocab_size: int
                ) -> tuple[np.ndarray, bytes]:
  """(order, as _renumbering gives it; the vocabulary as a SidedTokenizer's bytes: the two
  sentencepiece models over the joint vocabulary, renumbered), checked to load."""
  order, pieces = _renumbering(path, meta, vocab_size)
  found = sided_bytes((path / 'source.spm').read_bytes(), (path / 'target.spm').read_bytes(),
                      pieces)
  Tokenizer.from_bytes(found, str(path))  # a damaged sentencepiece model fails here
  return order, found


def vocabulary(path: str | os.PathLike) -> bytes:
  """A MarianMT folder's vocabulary, as a SidedTokenizer's bytes (_vocabulary)."""
  path = resolve(path)
  meta, where = _marian_config(path)
  return _vocabulary(path, meta, files.field(meta, 'vocab_size', int, where))[1]


def load(path: str | os.PathLike) -> tuple[Any, TransformerConfig, bytes, int]:
  """(params, config, vocabulary bytes, step) of a MarianMT folder, as export.load_model gives
  every model: the vocabulary's (`vocabulary`), the step 0 (or the one jaxformer's export
  recorded)."""
  path = resolve(path)
  meta, where = _marian_config(path)
  config = _config_of(path, meta, where)
  order, found = _vocabulary(path, meta, config.vocab_size)
  params = params_of(_state_dict(path), config, order, path)
  return params, config, found, files.field(meta, 'jaxformer_step', int, where, 0)
