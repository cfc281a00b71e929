"""Scoring translations the ways the literature does.

- sacreBLEU (detokenized, with its signature) is the headline: comparable across papers. Its
  tokenizer follows the target language as sacreBLEU's own `trg_lang` picks it: 13a, `zh` for
  Chinese, `ja-mecab` and `ko-mecab` for Japanese and Korean (which need sacrebleu[ja] or
  sacrebleu[ko]).
- "Tokenized BLEU" reproduces the paper's protocol (tensor2tensor's get_ende_bleu.sh): both sides
  tokenized by Moses' tokenizer.perl for the target language (sacremoses; English's rules for a
  language Moses has none for, and `moses_language` says so), hyphenated compounds
  split ("a-b" -> "a ##AT##-##AT## b"), then unsmoothed corpus BLEU (multi-bleu.perl). Counting
  each part of a compound as a match reads about 1-1.5 BLEU higher. Never mix the two.
- "Lowercased tokenized BLEU" is the protocol of most small-data papers (Multi30k's
  `lc.norm.tok` files): both sides punctuation-normalized and tokenized by Moses for the target
  language, lowercased, then unsmoothed corpus BLEU (multi-bleu.perl). Lowercasing alone raises
  German scores; it is there to stand beside such papers, never as the headline.
- chrF (sacreBLEU's, character 6-grams, beta 2) beside them.

`report` is what `jaxformer eval` prints.
"""

import collections
import functools
import re
from collections.abc import Sequence
from typing import Any

import sacrebleu

from jaxformer.errors import JaxformerError

# sacremoses is imported where the Moses tools are first made: it takes about 0.35 s, which every
# command would otherwise pay (translate and export never use it).


class ScoringError(JaxformerError, ValueError):
  """A target language that cannot be scored here; the message says what to install."""


LANGUAGE = re.compile(r'[a-z]{2,3}')  # an ISO 639-1 or 639-3 code, as sacreBLEU and Moses take


def _bleu(lang: str | None) -> sacrebleu.metrics.BLEU:
  """sacreBLEU's BLEU with the tokenizer of target language `lang` (None: 13a); a one-line
  ScoringError for a code that is not one, or a tokenizer whose package is not installed."""
  if lang is not None and not LANGUAGE.fullmatch(lang):
    raise ScoringError(f'target language {lang!r}: expected an ISO 639 code such as de, es, zh.')
  try:
    return sacrebleu.metrics.BLEU(trg_lang=lang or '')
  except RuntimeError as e:  # sacreBLEU's: "... requires extra dependencies ... sacrebleu[ja]"
    extra = re.search(r'pip install (\S+)', str(e))
    raise ScoringError(f"sacreBLEU's tokenizer for {lang} needs a package that is not installed: "
                       f"pip install '{extra[1] if extra else f'sacrebleu[{lang}]'}'.") from None


def check_language(lang: str | None) -> None:
  """Raises the ScoringError `sacre_bleu` would for target language `lang`, before any work."""
  _bleu(lang)


def sacre_bleu(hypotheses: Sequence[str], references: Sequence[str], lang: str | None = None
               ) -> tuple[float, str]:
  """(BLEU, signature): sacreBLEU, detokenized, with target language `lang`'s tokenizer."""
  bleu = _bleu(lang)
  score = bleu.corpus_score(list(hypotheses), [list(references)])
  return score.score, str(bleu.get_signature())


def chrf(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[float, str]:
  """(chrF, signature): sacreBLEU's character n-gram F-score (n = 6, beta = 2)."""
  metric = sacrebleu.metrics.CHRF()
  score = metric.corpus_score(list(hypotheses), [list(references)])
  return score.score, str(metric.get_signature())


_COMPOUND = re.compile(r'(\S)-(\S)')


def moses_language(lang: str) -> str:
  """The language whose Moses rules tokenize `lang` text: `lang` where sacremoses has its
  nonbreaking prefixes, else English (as tokenizer.perl falls back)."""
  from sacremoses.corpus import NonbreakingPrefixes  # pylint: disable=g-import-not-at-top
  return lang if lang in NonbreakingPrefixes().available_langs.values() else 'en'


@functools.cache
def _moses(lang: str) -> Any:
  from sacremoses import MosesTokenizer  # pylint: disable=g-import-not-at-top
  return MosesTokenizer(lang=moses_language(lang))


def paper_tokenize(text: str, lang: str = 'de') -> str:
  r"""get_ende_bleu.sh's text: `tokenizer.perl -l LANG` (sacremoses, escaping as the script
  does), then its compound split `s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g`."""
  tokens = _moses(lang).tokenize(text.strip(), return_str=True, escape=True)
  return _COMPOUND.sub(r'\1 ##AT##-##AT## \2', tokens)


def tokenized_bleu(hypotheses: Sequence[str], references: Sequence[str], lang: str = 'de'
                   ) -> float:
  """BLEU as in the paper's tables: on Moses-tokenized, compound-split text of language `lang`
  (the test set's target language), without smoothing (multi-bleu.perl)."""
  return _unsmoothed_bleu([paper_tokenize(h, lang) for h in hypotheses],
                         [paper_tokenize(r, lang) for r in references])


@functools.cache
def _normalizer(lang: str) -> Any:
  from sacremoses import MosesPunctNormalizer  # pylint: disable=g-import-not-at-top
  return MosesPunctNormalizer(lang=moses_language(lang))


def lowercase_tokenize(text: str, lang: str = 'de') -> str:
  """Multi30k's `lc.norm.tok` text: Moses' normalize-punctuation.perl and tokenizer.perl for
  `lang` (sacremoses), lowercased."""
  normalized = _normalizer(lang).normalize(text.strip())
  return _moses(lang).tokenize(normalized, return_str=True, escape=False).lower()


def _unsmoothed_bleu(hypotheses: list[str], references: list[str]) -> float:
  """multi-bleu.perl's corpus BLEU of already tokenized text."""
  bleu = sacrebleu.metrics.BLEU(tokenize='none', smooth_method='none', force=True)
  return bleu.corpus_score(hypotheses, [references]).score


def lowercase_tokenized_bleu(hypotheses: Sequence[str], references: Sequence[str],
                             lang: str = 'de') -> float:
  """BLEU as small-data papers report it (e.g. on Multi30k): on lowercased, Moses-normalized
  and tokenized text of language `lang`, without smoothing."""
  return _unsmoothed_bleu([lowercase_tokenize(h, lang) for h in hypotheses],
                          [lowercase_tokenize(r, lang) for r in references])


def scores(hypotheses: Sequence[str], references: Sequence[str], lang: str = 'de'
           ) -> dict[str, Any]:
  """sacreBLEU with its signature, the paper's tokenized BLEU, the lowercased tokenized BLEU of
  small-data papers, and chrF with its signature."""
  bleu, bleu_signature = sacre_bleu(hypotheses, references, lang)
  chrf_score, chrf_signature = chrf(hypotheses, references)
  return {'sacrebleu': round(bleu, 2), 'signature': bleu_signature,
          'tokenized_bleu': round(tokenized_bleu(hypotheses, references, lang), 2),
          'lowercase_tokenized_bleu': round(
              lowercase_tokenized_bleu(hypotheses, references, lang), 2),
          'chrf': round(chrf_score, 2), 'chrf_signature': chrf_signature}


def undertrained(hypotheses: Sequence[str], steps: int) -> str | None:
  """A one-line warning when most translations are empty or one and the same (what a model
  that has not yet learned to translate outputs, and BLEU only reads as a low score); None
  otherwise."""
  count = len(hypotheses)
  empty = sum(not h.strip() for h in hypotheses)
  same, repeats = collections.Counter(hypotheses).most_common(1)[0] if count else ('', 0)
  if empty * 2 > count:
    what = f'{empty} of {count} translations are empty'
  elif count > 1 and repeats * 2 > count:
    what = f'{repeats} of {count} translations are the same ({same[:40]!r})'
  else:
    return None
  return (f'{what}: the model is undertrained after {steps} steps; train it longer (more '
          '--num-steps), or on more data.')


NEWSTEST2014_FULL, NEWSTEST2014_FILTERED = 3003, 2737


def report(result: dict[str, Any], *, lang: str, origin: str, segments: int,
           decoding: str) -> list[str]:
  """The lines `jaxformer eval` prints for `scores`'s result on a test set of `segments`
  sentences from `origin` (which newstest2014 it is, when it is one), decoded as `decoding`."""
  variant = {NEWSTEST2014_FULL: 'the full newstest2014 (3003 segments, as tfds and the paper)',
             NEWSTEST2014_FILTERED: "sacreBLEU's filtered wmt14 (2737 segments)"}.get(
                 segments, f'{segments} segments')
  moses = moses_language(lang)
  moses = moses if moses == lang else f'{moses} [Moses has no rules for {lang}]'
  return [f'sacreBLEU {result["sacrebleu"]:.2f}  ({result["signature"]})',
          f'tokenized BLEU {result["tokenized_bleu"]:.2f}  (Moses -l {moses} + compound '
          "splitting, unsmoothed: the paper's protocol; do not mix with sacreBLEU)",
          f'lowercased tokenized BLEU {result["lowercase_tokenized_bleu"]:.2f}  (Moses '
          f'normalize + tokenize -l {moses}, lowercased, unsmoothed: the protocol of small-data '
          'papers such as those on Multi30k)',
          f'chrF {result["chrf"]:.2f}  ({result["chrf_signature"]})',
          f'test set: {origin}: {variant}; {decoding}']
