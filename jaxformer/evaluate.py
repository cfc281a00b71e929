"""Translate with a trained model, and score BLEU the two ways the literature does.

- sacreBLEU (detokenized, 13a, with its signature) is the headline: comparable across papers.
- "Tokenized BLEU" reproduces the paper's protocol (tensor2tensor's get_ende_bleu.sh): both sides
  tokenized (intl) and hyphenated compounds split ("a-b" -> "a ##AT##-##AT## b"), which counts
  each part of a compound as a match and reads about 1-1.5 BLEU higher. Never mix the two.
"""

import functools
import logging
import re
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import sacrebleu
from sacrebleu.tokenizers.tokenizer_intl import TokenizerV14International
from tqdm import tqdm

from jaxformer import checkpoint, decode
from jaxformer.config import TransformerConfig
from jaxformer.data.tokenizer import EOS_ID, Tokenizer
from jaxformer.model import Transformer

Array = jax.Array
log = logging.getLogger(__name__)


# --- model glue: tokens_to_logits over the Transformer --------------------------------------------


def cached_tokens_to_logits(model: Transformer, params: Any, src: Array
                            ) -> decode.TokensToLogits:
  """One decoder step per call over the key/value cache of `Transformer.init_cache`."""
  def fn(tokens, cache):
    logits, cache = model.apply({'params': params}, None, src, tokens, cache=cache,
                                method=Transformer.decode)
    return logits[:, 0], cache
  return fn


def uncached_tokens_to_logits(model: Transformer, params: Any, src: Array, encoded: Array
                              ) -> decode.TokensToLogits:
  """The same scores without a cache: every step reruns the decoder over the whole prefix
  buffer (the baseline for the cache's speed-up). Its cache is {'tokens' [N, L], 'index'}."""
  def fn(tokens, cache):
    buffer = cache['tokens'].at[:, cache['index']].set(tokens[:, 0])
    logits = model.apply({'params': params}, encoded, src, buffer, method=Transformer.decode)
    return logits[:, cache['index']], {'tokens': buffer, 'index': cache['index'] + 1}
  return fn


def search(params: Any, src: Array, max_lengths: Array, *, config: TransformerConfig,
           max_len: int, beam_size: int, alpha: float, cached: bool = True) -> Array:
  """Encodes src [B, S] once and decodes [B, max_len] ids (greedy when beam_size is 1)."""
  model = Transformer(config)
  encoded = model.apply({'params': params}, src, method=Transformer.encode)  # [B, S, D]
  src, encoded = (jnp.repeat(x, beam_size, axis=0) for x in (src, encoded))  # beams adjacent
  if cached:
    cache = model.apply({'params': params}, encoded, max_len, method=Transformer.init_cache)
    step = cached_tokens_to_logits(model, params, src)
  else:
    cache = {'tokens': jnp.zeros((src.shape[0], max_len), jnp.int32), 'index': jnp.array(0)}
    step = uncached_tokens_to_logits(model, params, src, encoded)
  if beam_size == 1:
    return decode.greedy_search(step, cache, max_lengths, max_len)
  return decode.beam_search(step, cache, max_lengths, max_len, beam_size=beam_size,
                            alpha=alpha)[0]


def _bucket(length: int) -> int:
  """Source lengths are padded to powers of two (at least 8): few compiled programs."""
  return max(8, 1 << (length - 1).bit_length())


class Translator:
  """Translates text with a model and its sentencepiece vocabulary, by the paper's settings:
  beam 4, alpha 0.6, at most (source length + 50) tokens."""

  def __init__(self, params: Any, config: TransformerConfig, tokenizer: Tokenizer, *,
               beam_size: int = 4, alpha: float = 0.6, extra_length: int = 50,
               batch_size: int = 32):
    self.params, self.config, self.tokenizer = params, config, tokenizer
    self.beam_size, self.alpha, self.extra_length = beam_size, alpha, extra_length
    self.batch_size = batch_size
    self._search = jax.jit(functools.partial(search, config=config, beam_size=beam_size,
                                             alpha=alpha), static_argnames='max_len')

  @classmethod
  def from_checkpoint(cls, path: str, average_last: int | None = None,
                      **kwargs: Any) -> 'Translator':
    """From a workdir, its checkpoints folder or an averaged checkpoint; with average_last,
    the mean of the workdir's last N checkpoints."""
    params, config, spm_model, _ = checkpoint.load(path)
    if average_last:
      params = checkpoint.average_checkpoints(path, average_last)
    return cls(params, config, Tokenizer.from_bytes(spm_model), **kwargs)

  def translate(self, sentences: Sequence[str], progress: bool = False) -> list[str]:
    """One output line per input line; blank inputs give empty outputs without decoding.

    A source longer than the model's max_len (with its EOS) is cut to that length, with a
    warning naming the lines (0-based indices); outputs stop at max_len tokens as well.
    """
    ids = self.tokenizer.encode(sentences)
    limit = self.config.max_len - 1  # pieces, leaving room for EOS
    cut = [i for i, x in enumerate(ids) if len(x) > limit]
    if cut:
      log.warning('%d source(s) longer than the model\'s %d tokens were cut to that length '
                  '(indices %s%s).', len(cut), self.config.max_len,
                  ', '.join(map(str, cut[:10])), ', ...' if len(cut) > 10 else '')
      for i in cut:
        ids[i] = ids[i][:limit]
    todo = sorted((i for i, x in enumerate(ids) if x), key=lambda i: len(ids[i]))
    out = [''] * len(sentences)
    bar = tqdm(total=len(todo), desc='translating', unit='sent', disable=not progress)
    for start in range(0, len(todo), self.batch_size):
      chosen = todo[start:start + self.batch_size]
      rows = [ids[i] + [EOS_ID] for i in chosen]
      width = min(_bucket(max(map(len, rows))), self.config.max_len)
      src = np.zeros((self.batch_size, width), np.int32)  # a fixed batch: one compile per width
      for r, row in enumerate(rows):
        src[r, :len(row)] = row
      max_lengths = np.zeros(self.batch_size, np.int32)
      max_lengths[:len(rows)] = [len(row) + self.extra_length for row in rows]
      max_len = min(width + self.extra_length, self.config.max_len)
      result = self._search(self.params, src, np.minimum(max_lengths, max_len), max_len=max_len)
      for i, text in zip(chosen, self.tokenizer.decode(np.asarray(result)[:len(rows)])):
        out[i] = text
      bar.update(len(chosen))
    bar.close()
    return out


# --- BLEU -----------------------------------------------------------------------------------------


def sacre_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[float, str]:
  """(BLEU, signature): sacreBLEU's default, detokenized, 13a tokenization."""
  bleu = sacrebleu.metrics.BLEU()
  score = bleu.corpus_score(list(hypotheses), [list(references)])
  return score.score, str(bleu.get_signature())


_intl = TokenizerV14International()
_COMPOUND = re.compile(r'(\S)-(\S)')


def paper_tokenize(text: str) -> str:
  """intl tokenization, then t2t's compound split ("##AT##-##AT##").

  intl already separates most hyphens ("a-b" -> "a - b", one token each side, as the compound
  split does); the split rule then catches those it keeps, between digits ("3-4").
  """
  return _COMPOUND.sub(r'\1 ##AT##-##AT## \2', _intl(text.strip()))


def tokenized_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
  """BLEU as in the paper's tables: computed on tokenized, compound-split text."""
  hyps = [paper_tokenize(h) for h in hypotheses]
  refs = [paper_tokenize(r) for r in references]
  # multi-bleu.perl, which the paper's script ends with, does not smooth.
  bleu = sacrebleu.metrics.BLEU(tokenize='none', smooth_method='none', force=True)
  return bleu.corpus_score(hyps, [refs]).score
