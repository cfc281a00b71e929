"""A training run's validation: the loss, perplexity and token accuracy of the validation set
(every host's share), and on the first process sacreBLEU of its first sentences with sample
translations for TensorBoard, decoded as in §6.1 by the run's one Translator.
"""

import collections
import logging
from typing import Any

import jax
import numpy as np

from jaxformer import monitor, parallel, scoring
from jaxformer import data as data_lib
from jaxformer.config import TrainConfig
from jaxformer.data import pipeline as pipeline_lib
from jaxformer.train import TrainState
from jaxformer.translation import Translator

log = logging.getLogger(__name__)


def metrics(p_eval_step: Any, p_state: TrainState,
                       pipeline: pipeline_lib.Pipeline) -> dict[str, float]:
  """Loss, perplexity and token accuracy over one pass of the validation set (all hosts)."""
  totals = collections.Counter()  # (every batch queued, then one read: no wait per batch)
  for sums in jax.device_get([p_eval_step(p_state, b) for b in pipeline.validation_batches()]):
    totals.update({k: float(np.sum(v)) for k, v in sums.items()})
  totals = parallel.all_hosts(np.array([totals[k] for k in ('loss_sum', 'nll_sum', 'correct',
                                                            'tokens')])).sum(0)
  loss_sum, nll_sum, correct, tokens = map(float, totals)
  tokens = max(tokens, 1.0)
  return {'loss': loss_sum / tokens, 'perplexity': float(np.exp(nll_sum / tokens)),
          'accuracy': correct / tokens, 'tokens': tokens}


def translated(translator: Translator, text: data_lib.ParallelText, train_cfg: TrainConfig,
               sink: monitor.MetricsSink, step: int) -> dict[str, float]:
  """{'bleu': sacreBLEU of the first bleu_sentences validation sentences} (empty without
  them), and to TensorBoard a markdown table of the first sample_translations (source,
  hypothesis, reference), decoded as in §6.1 by `translator` (the run's model at this step;
  its searches compiled once for the run: Run.translator)."""
  count = max(train_cfg.bleu_sentences, train_cfg.sample_translations)
  hypotheses = translator.translate(text.src[:count])
  if step == train_cfg.num_steps and (warning := scoring.undertrained(hypotheses, step)):
    log.warning('validation at step %d: %s', step, warning)  # (earlier, expected)
  if train_cfg.sample_translations:
    cell = lambda s: s.replace('|', '\\|')  # noqa: E731
    rows = [f'| {cell(src)} | {cell(hyp)} | {cell(ref)} |' for src, hyp, ref in
            list(zip(text.src, hypotheses, text.tgt))[:train_cfg.sample_translations]]
    sink.text(step, 'samples', '\n'.join(['| source | hypothesis | reference |', '|---|---|---|',
                                          *rows]))
  if not train_cfg.bleu_sentences:
    return {}
  return {'bleu': scoring.sacre_bleu(hypotheses, text.tgt[:train_cfg.bleu_sentences])[0]}
