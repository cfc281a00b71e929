"""Model FLOPs of the Transformer, counted analytically (for MFU).

Counts every matrix product of the forward pass at 2 FLOPs per multiply-add: the attention
projections, the attention scores (QK^T) and their weighted sum of values, the FFN, and the
softmax projection onto the shared embedding. Embedding lookups, masks, softmaxes, layer norms
and other elementwise work are not counted. Attention is counted over whole rows, as it is
computed: a packed row attends across its full length (masked), and causal attention is not
halved. The backward pass costs two products per forward product, so training is 3x forward.
"""

from jaxformer.config import TransformerConfig


def _attention(cfg: TransformerConfig, queries: int, keys: int) -> int:
  """One multi-head attention for one row: `queries` positions attending over `keys`."""
  qk, v, d = cfg.num_heads * cfg.key_dim, cfg.num_heads * cfg.value_dim, cfg.d_model
  projections = queries * d * qk + keys * d * (qk + v) + queries * v * d
  products = queries * keys * (qk + v)  # scores over K, then the weighted sum over J
  return 2 * (projections + products)


def forward_flops(cfg: TransformerConfig, rows: int, src_len: int, tgt_len: int) -> int:
  """Forward FLOPs of teacher-forced logits for `rows` rows of src_len / tgt_len tokens."""
  ffn = lambda length: 2 * 2 * length * cfg.d_model * cfg.d_ff  # noqa: E731
  encoder = _attention(cfg, src_len, src_len) + ffn(src_len)
  decoder = (_attention(cfg, tgt_len, tgt_len) + _attention(cfg, tgt_len, src_len)
             + ffn(tgt_len))
  softmax = 2 * tgt_len * cfg.d_model * cfg.vocab_size
  return rows * (cfg.num_layers * (encoder + decoder) + softmax)


def train_flops(cfg: TransformerConfig, rows: int, src_len: int, tgt_len: int) -> int:
  """FLOPs of one training step: forward + backward = 3x forward."""
  return 3 * forward_flops(cfg, rows, src_len, tgt_len)
