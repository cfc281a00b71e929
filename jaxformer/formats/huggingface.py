"""Hugging Face transformers' MarianMT (PyTorch weights in safetensors): what
`MarianMTModel.from_pretrained(OUT)` and `MarianTokenizer.from_pretrained(OUT)` load, the format
of the OPUS-MT models on the Hub. Written with numpy alone: neither torch nor transformers is
needed to export.

The architectures are the same (post-LN layers, biases on every projection, one embedding for
encoder, decoder and output scaled by sqrt(d_model), static sinusoids, ReLU, decoding from the
padding token). What differs, and how it is bridged:

- Marian's position table holds the sines in the first half of the dimensions and the cosines
  in the second; jaxformer interleaves them (sin at 2i, cos at 2i + 1). transformers never
  reads a saved table (it makes its own), so the model's d_model basis is permuted instead,
  through every weight that reads or writes it (`tensors`): jaxformer's dimension perm[k]
  becomes Marian's k. Layer norms are equivariant under it, so the model computes the same.
- Marian's LayerNorms keep torch's epsilon, 1e-5 (jaxformer's: 1e-6); MarianConfig cannot set
  it. docs/BENCHMARKS.md measures what it moves.
- transformers' beam search divides a hypothesis's log-probability by length^alpha, not by
  GNMT's ((5 + length) / 6)^alpha (§6.1): beam outputs may differ, greedy ones do not.
- The output layer's final_logits_bias is zeros; the shared sentencepiece model serves as both
  source.spm and target.spm, and vocab.json maps its pieces to jaxformer's ids.
"""

import json
import math
import pathlib
from typing import Any

import jax
import numpy as np
import safetensors.numpy
from flax import traverse_util

from jaxformer import checkpoint, files
from jaxformer.config import TransformerConfig
from jaxformer.data.tokenizer import EOS_ID, PAD_ID, UNK_ID, Tokenizer
from jaxformer.formats import folders


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
          'final_logits_bias': np.zeros((1, config.vocab_size), np.float32)}
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
      'decoder_ffn_dim': config.d_ff, 'activation_function': 'relu',
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


def _recorded_data(origin: str | pathlib.Path | None) -> tuple[dict[str, Any], list]:
  """The data section and the rules of the recipe the model's workdir recorded, if any."""
  found = origin and files.record_near(origin, 'recipe.json')
  if not found:
    return {}, []
  return (files.field(found[1], 'data', dict, str(found[0]), {}),
          files.field(found[1], 'rules', list, str(found[0]), []))


def card(origin: str | pathlib.Path | None, config: TransformerConfig, step: int,
         data: dict[str, Any], rules: list) -> str:
  """README.md: what the model is, what it was trained on and with (`data`, `rules`: what its
  workdir recorded, _recorded_data), its last validation BLEU (where measured), how to load it,
  and what differs."""
  source, target = data.get('source_language', '?'), data.get('target_language', '?')
  trained_on = (f"`{data.get('train_src')}` / `{data.get('train_tgt')}`"
                if data.get('train_src') else 'not recorded with the model')
  recipe = ('the automatic recipe:' + ''.join(f'\n  - {" ".join(str(rule).split())}'
                                              for rule in rules) if rules else
            'not recorded with the model (see its training command)')
  bleu = _last_validation_bleu(origin) if origin else 'not measured with the model'
  languages = f'language: [{source}, {target}]\n' if data else ''
  return f"""---
{languages}library_name: transformers
pipeline_tag: translation
tags: [translation, marian, jaxformer]
---

# A Transformer{f" for {source}→{target}" if data else ""}, trained with jaxformer

A Transformer (Vaswani et al., 2017) trained with jaxformer (a JAX/Flax reproduction of the paper)
and exported at step {step:,} as a MarianMT model: N={config.num_layers}, d_model
{config.d_model}, d_ff {config.d_ff}, h {config.num_heads}, a shared sentencepiece vocabulary of
{config.vocab_size:,} pieces, positions up to {config.max_len}.

- **Training data:** {trained_on}
- **Recipe:** {recipe}
- **BLEU:** {bleu}

```python
from transformers import MarianMTModel, MarianTokenizer
tokenizer = MarianTokenizer.from_pretrained(PATH)
model = MarianMTModel.from_pretrained(PATH)
batch = tokenizer(["..."], return_tensors="pt", padding=True)
print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))
```

## What differs from jaxformer's own decoding

- Greedy search (`num_beams=1`) gives jaxformer's outputs. Beam search here divides a
  hypothesis's log-probability by length^alpha (length_penalty 0.6), where jaxformer
  divides by GNMT's ((5 + length) / 6)^alpha (§6.1 of the paper), so beam outputs may differ.
- The length limit is {config.max_len} pieces for every sentence (`max_length`); jaxformer's is
  each input's length + 50: pass `max_new_tokens` for that.
- Marian's layer norms use epsilon 1e-5 where jaxformer trained with 1e-6.
- The d_model dimensions are stored permuted (Marian's position table puts the sines first);
  the model computes the same function.
"""


def _last_validation_bleu(origin: str | pathlib.Path) -> str:
  """The last validation BLEU in the workdir's metrics.jsonl, said with its step, or why not.
  Its fields are read as any record another tool may have written (files.field): a BLEU of
  null (what JSON tools write for NaN) is no measurement, a string a one-line RecordError."""
  metrics, last = files.near(origin, 'metrics.jsonl'), None
  if metrics:
    lines = metrics.read_text(encoding='utf-8', errors='replace').splitlines()
    for number, line in enumerate(lines, 1):
      try:
        record = json.loads(line)
      except ValueError:
        continue
      if isinstance(record, dict) and record.get('split') == 'eval' and 'bleu' in record:
        where = f'{metrics}:{number}'
        bleu = files.field(record, 'bleu', (int, float, type(None)), where)
        if bleu is not None and math.isfinite(bleu):
          last = (bleu, files.field(record, 'step', int, where, None))
  if last is None:
    return 'not measured with the model (score it with `jaxformer eval`)'
  return (f'{float(last[0]):.2f} sacreBLEU at step {last[1]}, on the first validation '
          'sentences of its training run (train.bleu_sentences), beam 4; score it on a test '
          'set with `jaxformer eval`')


def save(out: str | pathlib.Path, params: Any, config: TransformerConfig, spm_model: bytes, *,
         step: int, overwrite: bool = False, origin: str | pathlib.Path | None = None,
         alpha: float = 0.6, beam_size: int = 4, **unused: Any) -> pathlib.Path:
  """Writes the MarianMT folder of these weights into `out` (a new or empty folder, or with
  `overwrite` a Hugging Face model to replace), with a model card of what `origin` (the model's
  path, when it lies in a workdir) recorded."""
  if reason := cannot(config):
    raise checkpoint.CheckpointError(f'the huggingface format cannot express {reason}.')
  out = folders.prepare(out, files.HUGGINGFACE, overwrite)  # before the work: fails at once
  pieces = Tokenizer.from_bytes(spm_model).pieces(range(config.vocab_size))
  data, rules = _recorded_data(origin)
  with folders.written_whole(out, params, spm_model) as tmp:
    safetensors.numpy.save_file(tensors(params, config), tmp / 'model.safetensors',
                                metadata={'format': 'pt'})
    files.respect_umask(tmp / 'model.safetensors')
    for name, content in (
        ('config.json', {**model_config(config), 'jaxformer_step': step}),
        ('generation_config.json', generation_config(config, alpha, beam_size)),
        ('vocab.json', {piece: i for i, piece in enumerate(pieces)}),
        ('tokenizer_config.json', {
            'tokenizer_class': 'MarianTokenizer', 'source_lang': data.get('source_language'),
            'target_lang': data.get('target_language'), 'separate_vocabs': False,
            'model_max_length': config.max_len,
            'pad_token': pieces[PAD_ID], 'eos_token': pieces[EOS_ID],
            'unk_token': pieces[UNK_ID]})):
      (tmp / name).write_text(json.dumps(content, indent=2, ensure_ascii=False) + '\n')
    for name in ('source.spm', 'target.spm'):
      (tmp / name).write_bytes(spm_model)
    (tmp / 'README.md').write_text(card(origin, config, step, data, rules))
  return out
