"""The PyTorch peer of the bench's train section, as PyTorch users write a Transformer today:
nn.Transformer (its attention is F.scaled_dot_product_attention, the causal one by its is_causal
hint), bfloat16 autocast on GPU, fused Adam and torch.compile; on the same shapes; prints JSON.

  python experiments/bench_torch.py [--case base --case big] [--compile/--no-compile] [--eager]
  (make bench runs it beside jaxformer's train cases when torch is installed: pip install
  'jaxformer[bench]', and prints the ratio jaxformer / torch per case)

'cases' holds the peer as its users run it (compiled on GPU by default; --compile elsewhere),
'cases_eager' the same model and optimiser without torch.compile (the second row; on GPU by
default, --eager elsewhere), so that a ratio says which peer it is against.

The same model and recipe as jaxformer's: PyTorch's nn.Transformer (post-LN, ReLU) at the
case's dimensions (a preset's or a recipe's), one embedding shared by source, target and the
softmax (scaled by sqrt(d_model), plus sinusoids), dropout P_drop, and on attention weights and
after the ReLU the config's own rates (nn.Transformer's one rate would drop them at P_drop),
label smoothing 0.1, Adam(0.9, 0.98, 1e-9) on the paper's lrate. nn.Transformer also puts a
LayerNorm after each stack (jaxformer's post-LN stacks have none): 2 x d_model extra work per
token, negligible. bfloat16 autocast on GPU,
float32 on CPU; Adam's fused kernel (fused=True) on both. A compile that fails falls back to
eager and says so ('compiled': false). Timed as the bench times jaxformer: the same rows of
random tokens, two warm-up steps (and compilation) excluded, then the median of the timed steps.
"""

import argparse
import json
import math
import pathlib
import statistics
import sys
import time

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench.train import TRAIN_CASES, case_config  # noqa: E402  (one table for both frameworks)
from jaxformer import config  # noqa: E402

OPTIM = config.OptimConfig()  # the paper's Adam, lrate and label smoothing, as jaxformer trains


class PaperTransformer(nn.Module):
  """nn.Transformer with the paper's shared, scaled embedding and sinusoidal positions."""

  def __init__(self, cfg: config.TransformerConfig):
    super().__init__()
    self.d_model = cfg.d_model
    self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
    nn.init.normal_(self.embed.weight, std=cfg.d_model ** -0.5)
    self.core = nn.Transformer(cfg.d_model, cfg.num_heads, cfg.num_layers, cfg.num_layers,
                               cfg.d_ff, cfg.dropout_rate, batch_first=True)
    for layer in [*self.core.encoder.layers, *self.core.decoder.layers]:
      # nn.Transformer's one rate also drops attention weights and ReLU outputs: these take the
      # config's own rates, so both frameworks drop the same activations.
      for attention in (layer.self_attn, getattr(layer, 'multihead_attn', layer.self_attn)):
        attention.dropout = cfg.attention_dropout_rate
      layer.dropout.p = cfg.relu_dropout_rate
    position = torch.arange(cfg.max_len, dtype=torch.float32)[:, None]
    timescale = torch.exp(torch.arange(0, cfg.d_model, 2) * (-math.log(10000.0) / cfg.d_model))
    table = torch.zeros(cfg.max_len, cfg.d_model)
    table[:, 0::2] = torch.sin(position * timescale)
    table[:, 1::2] = torch.cos(position * timescale)
    self.register_buffer('positions', table)
    self.dropout = nn.Dropout(cfg.dropout_rate)

  def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
    x = self.embed(tokens) * self.d_model ** 0.5 + self.positions[:tokens.shape[1]]
    return self.dropout(x)

  def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
    causal = nn.Transformer.generate_square_subsequent_mask(tgt_in.shape[1], device=src.device)
    hidden = self.core(self._embed(src), self._embed(tgt_in), tgt_mask=causal, tgt_is_causal=True)
    return hidden @ self.embed.weight.T  # [B, T, V]: the softmax shares the embedding


def _lrate(cfg: config.TransformerConfig, warmup_steps: int = OPTIM.warmup_steps):
  """The paper's lrate at 1-based step_num (LambdaLR passes the 0-based count)."""
  return lambda count: cfg.d_model ** -0.5 * min((count + 1) ** -0.5,
                                                 (count + 1) * warmup_steps ** -1.5)


def time_case(cfg: config.TransformerConfig, rows: int, length: int, accum_steps: int,
              timed_steps: int, device: torch.device, compile_model: bool) -> dict:
  """Median step time of one Adam update on rows x length random tokens per side."""
  torch.manual_seed(0)
  model = PaperTransformer(cfg).to(device)
  optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(OPTIM.adam_b1, OPTIM.adam_b2),
                               eps=OPTIM.adam_eps, fused=True)  # one kernel for all params
  schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, _lrate(cfg))
  tokens = torch.from_numpy(np.random.default_rng(0).integers(
      3, cfg.vocab_size, (rows, length)).astype(np.int64)).to(device)
  forward, compiled = model, False
  if compile_model:
    forward, compiled = torch.compile(model), True
  autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == 'cuda')

  def step(forward) -> float:
    optimizer.zero_grad(set_to_none=True)
    for micro in tokens.chunk(accum_steps):
      with autocast:
        logits = forward(micro, micro)
      loss = F.cross_entropy(logits.float().flatten(0, 1), micro.flatten(),
                             label_smoothing=OPTIM.label_smoothing)
      (loss / accum_steps).backward()
    optimizer.step()
    schedule.step()
    return loss.item()  # waits for the device

  start = time.perf_counter()
  try:
    step(forward)
  except Exception as e:  # pylint: disable=broad-except  (torch.compile's many failure types)
    if not compiled:
      raise
    print(f'torch.compile failed ({type(e).__name__}); timing eager mode', file=sys.stderr)
    forward, compiled = model, False
    step(forward)
  first_s = time.perf_counter() - start
  times = []
  for i in range(timed_steps + 1):  # one more warm-up step, then the timed ones
    start = time.perf_counter()
    step(forward)
    if i >= 1:
      times.append(time.perf_counter() - start)
  median = statistics.median(times)
  return {'rows': rows, 'row_len': length, 'accum_steps': accum_steps,
          'target_tokens_per_step': rows * length,
          'dtype': 'bfloat16 autocast' if device.type == 'cuda' else 'float32',
          'compiled': compiled, 'fused_adam': optimizer.defaults['fused'],
          'first_step_s': round(first_s, 2), 'timed_steps': timed_steps,
          'step_s_median': round(median, 4),
          'step_s_range': [round(min(times), 4), round(max(times), 4)],
          'target_tokens_per_s': round(rows * length / median, 1)}


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--case', action='append',
                      help="only these of the bench's train cases (repeatable; default: all)")
  parser.add_argument('--compile', action=argparse.BooleanOptionalAction,
                      help="'cases': torch.compile'd (default: on GPU only)")
  parser.add_argument('--eager', action=argparse.BooleanOptionalAction,
                      help="also 'cases_eager', the model without torch.compile (default: on "
                      'GPU only)')
  args = parser.parse_args(argv)
  device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
  compile_model = device.type == 'cuda' if args.compile is None else args.compile
  eager_row = compile_model and (device.type == 'cuda' if args.eager is None else args.eager)
  cases = TRAIN_CASES['gpu' if device.type == 'cuda' else 'cpu']
  known = [name for name, *_ in cases]
  if args.case and set(args.case) - set(known):
    parser.error(f'unknown case(s) {sorted(set(args.case) - set(known))}; choose from {known}')
  results = {'torch': torch.__version__, 'device': torch.cuda.get_device_name() if
             device.type == 'cuda' else 'cpu', 'threads': torch.get_num_threads(), 'cases': {},
             **({'cases_eager': {}} if eager_row else {})}
  for name, preset, rows, length, accum, remat, timed in cases:
    if (args.case and name not in args.case) or remat:  # remat: a jaxformer memory option
      continue
    for row, compiled in (('cases', compile_model), ('cases_eager', False)):
      if row in results:
        result = time_case(case_config(preset), rows, length, accum, timed, device, compiled)
        results[row][name] = result
        print(f'torch {name} ({"compiled" if result["compiled"] else "eager"}): '
              f'{result["target_tokens_per_s"]} tokens/s', file=sys.stderr, flush=True)
  print(json.dumps(results, indent=2))
  return 0


if __name__ == '__main__':
  sys.exit(main())
