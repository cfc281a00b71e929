"""Every setting of jaxformer, in one low layer: the model (TransformerConfig, with how it is
computed: Execution), the training run (TrainConfig), where the pairs come from (DataConfig),
the paper's presets, and the (de)serialisation checkpoints and TensorBoard use.

Frozen dataclasses that check themselves on construction: a bad value raises SettingError.
This module imports only jax; recipes, the trainer and the command line build on it.
"""

import dataclasses
import re
from typing import Any

import jax
import jax.numpy as jnp

from jaxformer.settings import (AT_LEAST_0, AT_LEAST_1, FRACTION, POSITIVE, SEEDS,  # noqa: F401
                                DecodingConfig, Range, SettingError, check_fields, setting)

DROPOUT_RNGS = ('threefry', 'rbg')
_DTYPE_FIELDS = ('dtype', 'norm_dtype')  # Execution's dtypes, written by name


@dataclasses.dataclass(frozen=True)
class Execution:
  """How the model is computed, not what it computes: it may differ between the run that saved
  a checkpoint and the one that loads it (the compatibility check ignores it). `fast_path`
  picks one per backend."""

  dtype: Any = jnp.float32
  """Compute dtype; params, softmax, LayerNorm, loss: float32."""
  attention: str = 'einsum'
  """'einsum', or 'fused': jax.nn.dot_product_attention (cuDNN's fused kernel on GPU; no
  attention dropout)."""
  remat: bool = False
  """Recompute each layer's activations in the backward pass."""
  loss_chunk: int = 1024
  """Positions per chunk of the training softmax and loss."""
  norm_dtype: Any = jnp.float32
  """LayerNorm's output, so the residual stream (its statistics and params are float32 either
  way)."""
  dropout_rng: str = 'threefry'
  """The dropout bits' PRNG: jax's default, or 'rbg' (XLA's RngBitGenerator, derived from the
  step's key: cheaper on GPU)."""

  def __post_init__(self):
    if self.attention not in ('einsum', 'fused'):
      raise SettingError(f"model.execution.attention must be 'einsum' or 'fused', got "
                         f'{self.attention!r}.')
    for name in _DTYPE_FIELDS:
      if jnp.dtype(getattr(self, name)) not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
        raise SettingError(f'model.execution.{name} must be float32 or bfloat16, got '
                           f'{getattr(self, name)}.')
      # One spelling (jnp.float32 and dtype('float32') are equal but hash apart), so that equal
      # configs share the programs compiled for them (translation._jitted_search).
      object.__setattr__(self, name, jnp.dtype(getattr(self, name)))
    if self.dropout_rng not in DROPOUT_RNGS:
      raise SettingError(f'model.execution.dropout_rng must be one of {DROPOUT_RNGS}, got '
                         f'{self.dropout_rng!r}.')
    check_fields(self, 'model.execution', {'loss_chunk': AT_LEAST_1})


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Hyperparameters of the encoder-decoder Transformer (Vaswani et al., 2017): what it
  computes. How it is trained is OptimConfig's, which checkpoints record but do not pin."""

  vocab_size: int = 37000
  """Shared source/target vocabulary (§5.1); id 0 is padding."""
  num_layers: int = 6
  """N: layers in each of the encoder and the decoder."""
  d_model: int = 512
  """Width of every sub-layer output and of the embeddings."""
  d_ff: int = 2048
  """Inner width of the position-wise feed-forward network."""
  num_heads: int = 8
  """h: parallel attention heads."""
  qk_dim: int | None = None
  """d_k per head; None: d_model / h (Table 3 rows A, B)."""
  v_dim: int | None = None
  """d_v per head; None: d_model / h."""
  dropout_rate: float = 0.1
  """P_drop: on sub-layer outputs and embeddings + PE (§5.4)."""
  attention_dropout_rate: float = 0.0
  """On attention weights; 0.0 as in t2t at publication."""
  relu_dropout_rate: float = 0.0
  """After the FFN's ReLU; 0.0 as in t2t at publication."""
  pre_ln: bool = False
  """False: the paper's LayerNorm(x + Dropout(Sublayer(x)))."""
  max_len: int = 256
  """Longest sentence (tokens) the data pipeline and decoder allow."""
  learned_positions: bool = False
  """A learned [max_len, D] table per stack (Table 3 row E)."""
  attention_window: int | None = None
  """Restricted self-attention: keys within +-r only (§4)."""
  activation: str = 'relu'
  """The FFN's nonlinearity: the paper's 'relu' (§3.3), or 'swish' (SiLU, OPUS-MT's) or
  'gelu' (exact) for models made elsewhere (a MarianMT folder's activation_function)."""
  output_bias: bool = False
  """A learned bias on the output logits (Marian's final_logits_bias); the paper has none."""
  norm_epsilon: float = 1e-6
  """LayerNorm's epsilon: tensor2tensor's 1e-6 (the paper is silent); torch's and Marian's
  1e-5 for a MarianMT folder's weights."""
  execution: Execution = Execution()
  """How it is computed (dtype, attention kernel, remat)."""

  RANGES = {  # every number's valid values (a vocabulary holds pad, EOS, unk and one more)
      'vocab_size': Range(4), 'num_layers': AT_LEAST_1, 'd_model': AT_LEAST_1,
      'd_ff': AT_LEAST_1, 'num_heads': AT_LEAST_1, 'qk_dim': AT_LEAST_1, 'v_dim': AT_LEAST_1,
      'dropout_rate': FRACTION, 'attention_dropout_rate': FRACTION,
      'relu_dropout_rate': FRACTION, 'max_len': Range(2), 'attention_window': AT_LEAST_0,
      'norm_epsilon': POSITIVE}
  ACTIVATIONS = ('relu', 'swish', 'gelu')
  # What a fine-tuning run may change (`--init-from`): the others fix what the params mean.
  FINE_TUNABLE = ('dropout_rate', 'attention_dropout_rate', 'relu_dropout_rate', 'max_len')

  def __post_init__(self):
    check_fields(self, 'model', self.RANGES)
    if self.activation not in self.ACTIVATIONS:
      raise SettingError(f'model.activation must be one of {self.ACTIVATIONS}, got '
                         f'{self.activation!r}.')
    if self.d_model % self.num_heads and (self.qk_dim is None or self.v_dim is None):
      raise SettingError(f'd_model={self.d_model} is not divisible by num_heads='
                       f'{self.num_heads}: set qk_dim and v_dim.')
    if self.d_model % 2 and not self.learned_positions:
      raise SettingError(f'model.d_model={self.d_model} is odd, and the sinusoidal positions '
                         '(§3.5) pair a sine with a cosine per frequency: use an even d_model, '
                         'or set model.learned_positions=true.')
    if self.execution.attention == 'fused' and self.key_dim != self.value_dim:
      raise SettingError(f'fused attention needs d_k == d_v, got {self.key_dim} and '
                       f"{self.value_dim}: use attention='einsum'.")
    if self.execution.attention == 'fused' and self.attention_dropout_rate:
      raise SettingError('fused attention has no attention dropout: set attention_dropout_rate=0 '
                       "or attention='einsum'.")

  @property
  def key_dim(self) -> int:
    """d_k: query/key width per head (§3.2.2: d_model / h unless qk_dim is set)."""
    return self.qk_dim or self.d_model // self.num_heads

  @property
  def value_dim(self) -> int:
    """d_v: value width per head (§3.2.2: d_model / h unless v_dim is set)."""
    return self.v_dim or self.d_model // self.num_heads

  def replace(self, **changes: Any) -> 'TransformerConfig':
    """A copy with some fields changed."""
    return dataclasses.replace(self, **changes)

  def with_execution(self, **changes: Any) -> 'TransformerConfig':
    """A copy computed differently: some fields of `execution` changed."""
    return self.replace(execution=dataclasses.replace(self.execution, **changes))


def check_fine_tune(parent: TransformerConfig, config: TransformerConfig, where: str) -> None:
  """SettingError naming the first setting in which `config` differs from `parent` (the model at
  `where` that it fine-tunes) where only FINE_TUNABLE ones may (and max_len only with
  sinusoidal positions: a learned table has max_len rows)."""
  pinned_len = {'max_len'} if parent.learned_positions else set()
  tunable = set(TransformerConfig.FINE_TUNABLE) - pinned_len
  for name in (f.name for f in dataclasses.fields(TransformerConfig)):
    if name not in tunable and name != 'execution' and (
        getattr(parent, name) != getattr(config, name)):
      raise SettingError(
          f'model.{name}={getattr(config, name)} differs from the model it fine-tunes ({where}: '
          f"{getattr(parent, name)}): a fine-tuning run keeps its parent's model; only "
          f'{", ".join(sorted(tunable))} may change.')


def fast_path(config: TransformerConfig, backend: str | None = None) -> TransformerConfig:
  """`config` computed the fastest way on `backend` (default: jax's): on GPU, bfloat16 compute
  and residual stream (float32 params, LayerNorm statistics, softmax and loss), cuDNN's fused
  attention when attention dropout is off and d_k == d_v, the loss in chunks of 4096 positions
  and dropout bits from XLA's RngBitGenerator; elsewhere unchanged (on CPU, float32 einsum
  attention is the faster path). docs/BENCHMARKS.md ("GPU") has the measurements behind each."""
  if (backend or jax.default_backend()) != 'gpu':
    return config
  fused = not config.attention_dropout_rate and config.key_dim == config.value_dim
  return config.with_execution(dtype=jnp.bfloat16, attention='fused' if fused else 'einsum',
                               norm_dtype=jnp.bfloat16, loss_chunk=4096, dropout_rng='rbg')


def base(vocab_size: int = 37000) -> TransformerConfig:
  """Table 3, row "base": N=6, d_model=512, d_ff=2048, h=8, P_drop=0.1, eps_ls=0.1."""
  return TransformerConfig(vocab_size=vocab_size)


def big(vocab_size: int = 37000) -> TransformerConfig:
  """Table 3, row "big": N=6, d_model=1024, d_ff=4096, h=16, P_drop=0.3, eps_ls=0.1."""
  return TransformerConfig(
      vocab_size=vocab_size, d_model=1024, d_ff=4096, num_heads=16, dropout_rate=0.3)


def tiny(vocab_size: int = 64) -> TransformerConfig:
  """A two-layer model small enough for CPU tests (not from the paper)."""
  return TransformerConfig(
      vocab_size=vocab_size, num_layers=2, d_model=32, d_ff=64, num_heads=4, max_len=64)


# Validation metrics that can rank checkpoints (average_best), and which way is better.
BEST_METRICS = {'loss': 'min', 'bleu': 'max'}


# --- the training run -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  """How the model is trained (§5.3, §5.4): the learning rate, Adam, clipping, weight decay and
  label smoothing. Checkpoints record it but do not pin it: a resume may change any of it (the
  change is logged), and a fine-tuning run (`--init-from`) starts its optimiser afresh."""
  warmup_steps: int = setting(4000, 'warmup_steps of the lrate schedule (§5.3)')
  learning_rate: float | None = setting(
      None, 'peak learning rate, reached linearly over warmup_steps and then decayed as the '
      "inverse square root of the step (fairseq's --lr with inverse_sqrt; e.g. 1e-4 to "
      "fine-tune); none: the paper's d_model^-0.5 * warmup_steps^-0.5")
  lr_scale: float = setting(1.0, 'multiplies the learning rate at every step (e.g. 0.5 to resume '
                            'after a non-finite loss)')
  adam_b1: float = setting(0.9, 'Adam beta_1 (§5.3)')
  adam_b2: float = setting(0.98, 'Adam beta_2 (§5.3)')
  adam_eps: float = setting(1e-9, 'Adam epsilon (§5.3)')
  grad_clip_norm: float | None = setting(None, 'clip gradients to this global norm (none: the '
                                         "paper's no clipping)")
  weight_decay: float = setting(0.0, "decoupled (AdamW) weight decay (the paper's: 0)")
  label_smoothing: float = setting(0.1, 'epsilon_ls: the label smoothing mass (§5.4)')

  RANGES = {'warmup_steps': AT_LEAST_1, 'learning_rate': POSITIVE, 'lr_scale': POSITIVE,
            'adam_b1': FRACTION, 'adam_b2': FRACTION, 'adam_eps': POSITIVE,
            'grad_clip_norm': POSITIVE, 'weight_decay': AT_LEAST_0, 'label_smoothing': FRACTION}

  def __post_init__(self):
    check_fields(self, 'optim', self.RANGES)

  def changes(self, old: 'OptimConfig') -> list[str]:
    """'name old -> new' for every setting that differs from `old`."""
    return [f'{f.name} {getattr(old, f.name)} -> {getattr(self, f.name)}'
            for f in dataclasses.fields(self) if getattr(old, f.name) != getattr(self, f.name)]


def optim_from_dict(fields: dict[str, Any]) -> OptimConfig:
  """OptimConfig of recorded fields; those this jaxformer does not know are ignored (a newer
  jaxformer's settings do not stop an older one from resuming)."""
  return OptimConfig(**{f.name: fields[f.name] for f in dataclasses.fields(OptimConfig)
                        if f.name in fields})


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """How to train: batch size, schedule of checkpoints, evaluation and logging. The workdir is
  not a setting: it is passed beside the config (as in flax's examples)."""
  num_steps: int = setting(100_000, 'updates (§5.2: 100k for base, 300k for big)')
  tokens_per_batch: int = setting(25_000, 'token slots per side per update, all devices '
                                  'together (§5.1)')
  accum_steps: int = setting(1, 'micro-batches per update (for fewer devices than 8)')
  row_len: int = setting(256, 'packed row length of the longer side')
  seed: int = setting(0, 'params, dropout, shuffling and vocabulary sample')
  checkpoint_every_secs: float | None = setting(600.0, 'seconds between checkpoints (the '
                                                "paper's 10 minutes; none: off)")
  checkpoint_every_steps: int | None = setting(None, 'steps between checkpoints (none: off)')
  checkpoint_steps_to_average: bool = setting(False, 'checkpoint_every_steps makes only the '
                                              'last average_last checkpoints (those averaged); '
                                              'before them, checkpoint_every_secs makes them')
  keep_checkpoints: int = setting(20, 'checkpoints kept (raised to average_last if smaller)')
  keep_train_state: int = setting(2, 'the newest checkpoints that keep the optimiser state '
                                  'for resuming (the others keep params only, for averaging)')
  average_last: int = setting(5, 'average this many checkpoints at the end (0: none)')
  average_best: int = setting(0, 'also average this many checkpoints with the best '
                              'validation best_metric at the end, saving one at every '
                              'evaluation and keeping the best beside the newest (0: none)')
  best_metric: str = setting('loss', "what average_best ranks by: 'loss' (validation loss, "
                             "lower is better) or 'bleu' (needs bleu_sentences)")
  eval_every_steps: int = setting(1000, 'steps between evaluations on the validation set')
  log_every_steps: int = setting(100, 'steps between logged training metrics')
  skip_nonfinite: bool = setting(False, 'skip and count updates with a non-finite loss instead '
                                 'of stopping')
  bleu_sentences: int = setting(0, 'at each evaluation, sacreBLEU of this many validation '
                                'sentences decoded with beam 4 (0: none)')
  sample_translations: int = setting(3, 'at each evaluation, this many validation sentences '
                                     'translated into TensorBoard (0: none)')
  spm_sample_size: int = setting(2_000_000, 'sentences sampled to train the vocabulary')
  fast_path: bool | None = setting(None, 'the GPU fast path: bfloat16 compute, cuDNN '
                                   'attention, loss chunks of 4096, rbg dropout bits '
                                   '(none: on GPU only)')
  require_accelerator: bool = setting(False, "refuse a CPU backend (the paper's recipes set it)")
  init_from: str | None = setting(None, 'fine-tune: start from the params and vocabulary of this '
                                  'model (a workdir, a checkpoint or an exported folder) at '
                                  'step 0, with a fresh optimiser; its model settings are kept',
                                  metavar='MODEL')
  reset_data: bool = setting(False, "resume the checkpoint's params, optimiser state and step "
                             'on a fresh data stream (after changing the corpus or the seed)')
  host_sync_every_steps: int = setting(10, 'several hosts agree on preemption and timed saves '
                                       '(one all-gather) every this many steps')
  patience: int | None = setting(None, 'stop early, saving, when the validation loss has not '
                                 "improved for this many evaluations in a row (fairseq's "
                                 '--patience; none: train all num_steps)')

  RANGES = {
      **dict.fromkeys(('num_steps', 'tokens_per_batch', 'accum_steps', 'row_len',
                       'log_every_steps', 'eval_every_steps', 'host_sync_every_steps',
                       'keep_checkpoints', 'keep_train_state', 'spm_sample_size', 'patience'),
                      AT_LEAST_1),
      **dict.fromkeys(('average_last', 'average_best', 'bleu_sentences', 'sample_translations'),
                      AT_LEAST_0),
      'seed': SEEDS, 'checkpoint_every_steps': POSITIVE,
      'checkpoint_every_secs': POSITIVE}

  def __post_init__(self):
    check_fields(self, 'train', self.RANGES)
    if self.best_metric not in BEST_METRICS:
      raise SettingError(f'best_metric must be one of {sorted(BEST_METRICS)}, got '
                         f'{self.best_metric!r}.')
    if self.best_metric == 'bleu' and self.average_best and not self.bleu_sentences:
      raise SettingError('best_metric=bleu needs validation BLEU: set bleu_sentences (e.g. '
                         '--set train.bleu_sentences=1000).')

  def step_checkpoints_from(self) -> int | None:
    """With checkpoint_steps_to_average, the step of the first averaged checkpoint: from it
    checkpoints come by the step count only, before it by the clock only (None: off)."""
    every, count = self.checkpoint_every_steps, self.average_last
    if not (self.checkpoint_steps_to_average and every and count):
      return None
    before = (self.num_steps - 1) // every  # the count's saves before the last step's
    first = max(before + 1 - count, 0)  # the first averaged one's place among them all
    return self.num_steps if first == before else (first + 1) * every

  def check_rows(self, config: TransformerConfig) -> None:
    """SettingError when rows are shorter than a fresh model's longest sentences. A fine-tuned
    model's max_len is its parent's, what it translates, not what its rows must hold: its pairs
    longer than a row are dropped and counted (data.pipeline.build)."""
    if self.row_len < config.max_len and not self.init_from:
      raise SettingError(f'row_len={self.row_len} is shorter than max_len={config.max_len}: the '
                         f'longest pairs would not fit in a row; make row_len (--row-len) '
                         f'{config.max_len} or more.')

  def computed(self, config: TransformerConfig) -> TransformerConfig:
    """The config the steps compute with: the fast path's when it is on (by default on GPU)."""
    on = jax.default_backend() == 'gpu' if self.fast_path is None else self.fast_path
    return fast_path(config, 'gpu') if on else config


# --- where the pairs come from --------------------------------------------------------------------


# WMT14's directions, (source, target): the paper's two and the reverse ones (back-translation).
WMT14_DIRECTIONS = (('en', 'de'), ('de', 'en'), ('en', 'fr'), ('fr', 'en'))


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Where the training and validation pairs come from (data.pipeline.sources reads them)."""
  source: str = setting('text', "'wmt14' (tfds; the wmt extra), 'text' (files) or 'embedded' "
                        '(generated)', metavar='NAME')
  source_language: str = setting('en', 'the source language (ISO 639: en, de, zh, ...); wmt14 '
                                 'reads en->de, de->en, en->fr or fr->en', metavar='LANG')
  target_language: str = setting('de', 'the target language (ISO 639)', metavar='LANG')
  tfds_data_dir: str | None = setting(None, 'wmt14: the tfds data folder (none: '
                                      '$TFDS_DATA_DIR)', metavar='DIR')
  download: bool = setting(False, 'wmt14: let tfds download and prepare it (needs internet; '
                           'hours)')
  train_src: str | None = setting(None, 'text: the training source file', metavar='FILE')
  train_tgt: str | None = setting(None, 'text: the training target file, line-aligned',
                                  metavar='FILE')
  eval_src: str | None = setting(None, 'text: the validation source file (optional)',
                                 metavar='FILE')
  eval_tgt: str | None = setting(None, 'text: the validation target file', metavar='FILE')
  train_pairs: int = setting(60_000, 'embedded: generated training pairs')
  validation_pairs: int = setting(1000, 'embedded: generated validation pairs')
  test_pairs: int = setting(1000, 'embedded: generated test pairs')

  RANGES = {'train_pairs': AT_LEAST_1, 'validation_pairs': AT_LEAST_0, 'test_pairs': AT_LEAST_0}
  SOURCES = ('wmt14', 'text', 'embedded')

  def __post_init__(self):
    check_fields(self, 'data', self.RANGES)
    if self.source not in self.SOURCES:
      raise SettingError(f"data.source must be 'wmt14', 'text' or 'embedded', got "
                         f'{self.source!r}.')
    for name in ('source_language', 'target_language'):
      if not re.fullmatch(r'[a-z]{2,3}', getattr(self, name)):
        raise SettingError(f'data.{name} must be an ISO 639 code such as en, de or zh, got '
                           f'{getattr(self, name)!r}.')
    pair = (self.source_language, self.target_language)
    if self.source == 'wmt14' and pair not in WMT14_DIRECTIONS:
      raise SettingError(f'WMT14 has no {"->".join(pair)} direction: set data.source_language '
                         f'and data.target_language to one of '
                         f'{", ".join("->".join(d) for d in WMT14_DIRECTIONS)}.')
    for name in ('tfds_data_dir', 'train_src', 'train_tgt', 'eval_src', 'eval_tgt'):
      if getattr(self, name) is not None and not getattr(self, name).strip():
        raise SettingError(f'data.{name} must be a path, got {getattr(self, name)!r}.')
    for src, tgt in (('train_src', 'train_tgt'), ('eval_src', 'eval_tgt')):
      if (getattr(self, src) is None) != (getattr(self, tgt) is None):
        raise SettingError(f'data.{src} and data.{tgt} go together: give both files or '
                           'neither.')
    files = [name for name in ('train_src', 'eval_src') if getattr(self, name) is not None]
    if files and self.source != 'text':
      raise SettingError(f'data.{files[0]} is read only from a text source, and this one is '
                         f'{self.source!r}: add --source text to train on your files.')

  @property
  def has_validation(self) -> bool:
    """Whether the run has validation pairs to evaluate on."""
    return {'wmt14': True, 'embedded': self.validation_pairs > 0,
            'text': self.eval_src is not None}[self.source]

  def in_use(self) -> dict[str, Any]:
    """The fields that apply to this source, as a record of the run states them: a field whose
    help names another source ('embedded: generated training pairs') is left out."""
    others = tuple(f'{name}:' for name in self.SOURCES if name != self.source)
    return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)
            if not field.metadata['help'].startswith(others)}


# --- serialisation (checkpoints' meta, TensorBoard's hparams) -------------------------------------


def config_to_dict(config: TransformerConfig) -> dict[str, Any]:
  """The config as JSON-able fields ('execution' a nested dict, its dtypes by name)."""
  fields = dataclasses.asdict(config)
  for name in _DTYPE_FIELDS:
    fields['execution'][name] = jnp.dtype(fields['execution'][name]).name
  return fields


_OPTIM_FIELDS = frozenset(f.name for f in dataclasses.fields(OptimConfig))


def config_from_dict(fields: dict[str, Any]) -> TransformerConfig:
  """The inverse of config_to_dict (SettingError for fields this jaxformer does not know); also
  reads older configs: jaxformer 0.1's, whose execution fields sat at the top level, and those
  from before OptimConfig, whose optimisation fields it drops (optim_from_dict reads them)."""
  fields = {k: v for k, v in fields.items() if k not in _OPTIM_FIELDS}
  execution = dict(fields.pop('execution', {}))
  for name in (f.name for f in dataclasses.fields(Execution)):
    if name in fields:
      execution[name] = fields.pop(name)
  known = {f.name for f in dataclasses.fields(TransformerConfig)}
  unknown = sorted(set(fields) - known) + sorted(
      set(execution) - {f.name for f in dataclasses.fields(Execution)})
  if unknown:
    raise SettingError(f'config has fields this jaxformer does not know: {unknown}')
  for name in set(_DTYPE_FIELDS) & set(execution):
    execution[name] = jnp.dtype(execution[name])
  return TransformerConfig(**fields, execution=Execution(**execution))
