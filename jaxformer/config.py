"""Model and optimiser hyperparameters: one frozen dataclass and the paper's presets."""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Execution:
  """How the model is computed, not what it computes: it may differ between the run that saved
  a checkpoint and the one that loads it (the compatibility check ignores it). `fast_path`
  picks one per backend."""

  dtype: Any = jnp.float32    # compute dtype; params, softmax, LayerNorm, loss: float32
  attention: str = 'einsum'   # 'einsum', or 'fused': jax.nn.dot_product_attention (cuDNN's
                              # fused kernel on GPU; no attention dropout)
  remat: bool = False         # recompute each layer's activations in the backward pass
  loss_chunk: int = 1024      # positions per chunk of the training softmax and loss

  def __post_init__(self):
    if self.attention not in ('einsum', 'fused'):
      raise ValueError(f"attention must be 'einsum' or 'fused', got {self.attention!r}.")
    if jnp.dtype(self.dtype) not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
      raise ValueError(f'dtype must be float32 or bfloat16, got {self.dtype}.')
    if self.loss_chunk < 1:
      raise ValueError(f'loss_chunk must be >= 1, got {self.loss_chunk}.')


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Hyperparameters of the encoder-decoder Transformer (Vaswani et al., 2017)."""

  vocab_size: int = 37000            # shared source/target vocabulary (§5.1); id 0 is padding
  num_layers: int = 6                # N: layers in each of the encoder and the decoder
  d_model: int = 512                 # width of every sub-layer output and of the embeddings
  d_ff: int = 2048                   # inner width of the position-wise feed-forward network
  num_heads: int = 8                 # h: parallel attention heads
  qk_dim: int | None = None          # d_k per head; None: d_model / h (Table 3 rows A, B)
  v_dim: int | None = None           # d_v per head; None: d_model / h
  dropout_rate: float = 0.1          # P_drop: on sub-layer outputs and embeddings + PE (§5.4)
  attention_dropout_rate: float = 0.0  # on attention weights; 0.0 as in t2t at publication
  relu_dropout_rate: float = 0.0     # after the FFN's ReLU; 0.0 as in t2t at publication
  label_smoothing: float = 0.1       # epsilon_ls (§5.4)
  pre_ln: bool = False               # False: the paper's LayerNorm(x + Dropout(Sublayer(x)))
  max_len: int = 256                 # longest sentence (tokens) the data pipeline and decoder allow
  learned_positions: bool = False    # a learned [max_len, D] table per stack (Table 3 row E)
  attention_window: int | None = None  # restricted self-attention: keys within +-r only (§4)
  warmup_steps: int = 4000           # warmup_steps of the lrate schedule (§5.3)
  adam_b1: float = 0.9               # Adam beta_1 (§5.3)
  adam_b2: float = 0.98              # Adam beta_2 (§5.3)
  adam_eps: float = 1e-9             # Adam epsilon (§5.3)
  grad_clip_norm: float | None = None  # global-norm clipping; the paper uses none
  weight_decay: float = 0.0          # decoupled (AdamW) weight decay; the paper uses none
  execution: Execution = Execution()  # how it is computed (dtype, attention kernel, remat)

  def __post_init__(self):
    if self.d_model % self.num_heads and (self.qk_dim is None or self.v_dim is None):
      raise ValueError(f'd_model={self.d_model} is not divisible by num_heads='
                       f'{self.num_heads}: set qk_dim and v_dim.')
    if self.attention_window is not None and self.attention_window < 0:
      raise ValueError(f'attention_window must be >= 0, got {self.attention_window}.')
    if self.execution.attention == 'fused' and self.key_dim != self.value_dim:
      raise ValueError(f'fused attention needs d_k == d_v, got {self.key_dim} and '
                       f"{self.value_dim}: use attention='einsum'.")
    if self.execution.attention == 'fused' and self.attention_dropout_rate:
      raise ValueError('fused attention has no attention dropout: set attention_dropout_rate=0 '
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

  def run_as(self, **changes: Any) -> 'TransformerConfig':
    """A copy computed differently: some fields of `execution` changed."""
    return self.replace(execution=dataclasses.replace(self.execution, **changes))


def fast_path(config: TransformerConfig, backend: str | None = None) -> Execution:
  """How `config` computes fastest on `backend` (default: jax's): on GPU, bfloat16 compute
  (float32 params, LayerNorm, softmax and loss) and fused attention when attention dropout is
  off; elsewhere its own execution (on CPU, float32 einsum attention is the faster path)."""
  if (backend or jax.default_backend()) != 'gpu':
    return config.execution
  fused = not config.attention_dropout_rate and config.key_dim == config.value_dim
  return dataclasses.replace(config.execution, dtype=jnp.bfloat16,
                             attention='fused' if fused else 'einsum')


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
      vocab_size=vocab_size, num_layers=2, d_model=32, d_ff=64, num_heads=4,
      max_len=64, warmup_steps=100)
