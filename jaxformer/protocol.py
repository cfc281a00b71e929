"""What is asked of a model and what comes back, for `jaxformer translate` here, the server
and its client alike: `TranslateRequest` and `ScoreRequest`, each checked once when it is made
(its fields, counts and settings), read from and written as the server's JSON, and answered
by `Translator.run`. Standard library and jaxformer's jax-free modules only: the client
imports it. The rules a request obeys live here and nowhere else; what only a server bounds
(sentences and characters a request) is `ServerLimits`, applied by `from_json`.

The JSON, every field but "src" (and "tgt") optional::

  /translate  {"src": [...], "nbest": N, "prefix": [...], "first_index": I,
               "sampling": true, "temperature": T, "top_k": K, "top_p": P, "seed": S}
    -> {"translations": [...]}, or with nbest {"nbest": [[[text, score], ...], ...]}
  /score      {"src": [...], "tgt": [...], "token_log_probs": true}
    -> {"scores": [{"log_prob": L, "tokens": N, "mean": M, "token_log_probs": [...]}, ...]}
"""

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from jaxformer import text
from jaxformer.errors import JaxformerError
from jaxformer.settings import MAX_NBEST, DecodingConfig, ServerLimits, SettingError

MAX_FIRST_INDEX = 2**31  # sampling's keys count sentences in an int32


class RequestError(JaxformerError):
  """A request that cannot be answered as it is (a server's 400): the message says why."""


class TooLarge(RequestError):
  """A request over a server's size limit (413)."""


def _check_int(name: str, value: Any, low: int, high: int) -> None:
  if type(value) is not int or not low <= value <= high:
    raise RequestError(f'"{name}" must be an integer from {low} to {high}, got {value!r}.')


def _sentences(body: dict[str, Any], name: str, limits: ServerLimits | None) -> list[str]:
  """body[name], a list of valid text (within `limits`' sentences and characters)."""
  value = body.get(name)
  if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
    raise RequestError(f'the request needs "{name}": a list of strings (one sentence each).')
  if limits and len(value) > limits.max_sentences:
    raise TooLarge(f'"{name}" has {len(value)} sentences, more than the server takes at once '
                   f'({limits.max_sentences}): send them in parts.')
  for i, sentence in enumerate(value):
    if limits and len(sentence) > limits.max_chars:
      raise TooLarge(f'{name}[{i}] has {len(sentence)} characters, more than the server '
                     f'takes ({limits.max_chars}).')
    try:
      sentence.encode('utf-8')
    except UnicodeEncodeError as e:  # a lone surrogate, sent as a JSON escape
      raise RequestError(f'{name}[{i}] is not valid text at character {e.start} '
                         f'({e.reason}).') from None
  return value


def _fields(body: Any, fields: Sequence[str], example: str) -> dict[str, Any]:
  """body, checked to be a JSON object of no other fields than `fields`."""
  if not isinstance(body, dict):
    raise RequestError(f'the request must be a JSON object: {example}.')
  if unknown := [name for name in body if name not in fields]:
    raise RequestError(f'the request sets "{unknown[0]}", which it cannot (its fields: '
                       f"{', '.join(fields)}; the search is the server's).")
  return body


def check_nbest(n: int, decoding: DecodingConfig) -> None:
  """SettingError unless a search with `decoding` gives n results a sentence: beam search at
  most its beam, sampling at most MAX_NBEST samples."""
  if n < 1:
    raise SettingError(f'n-best needs n >= 1, got {n}.')
  if not decoding.sampling and n > decoding.beam_size:
    raise SettingError(f'{n}-best needs a beam of at least {n} (this search has '
                       f'{decoding.beam_size}), or sampling.')
  if n > MAX_NBEST:
    raise SettingError(f'{n} samples a sentence: at most {MAX_NBEST}.')


@dataclasses.dataclass(frozen=True)
class TranslateRequest:
  """Sentences to translate: their best translations, or with `nbest` each one's n best (with
  sampling, n samples) as (text, score); `prefix` (one a sentence, '' for none) starts each
  output; `first_index` is src[0]'s index in the whole input, from which sampling's keys are
  made; `settings` are DecodingConfig.PER_REQUEST fields that change the search (sampling)."""
  src: Sequence[str]
  nbest: int | None = None
  prefix: Sequence[str] | None = None
  first_index: int = 0
  settings: dict[str, Any] = dataclasses.field(default_factory=dict)

  FIELDS = ('src', 'nbest', 'prefix', 'first_index', *DecodingConfig.PER_REQUEST)

  def __post_init__(self):
    if self.nbest is not None:
      _check_int('nbest', self.nbest, 1, MAX_NBEST)
    _check_int('first_index', self.first_index, 0, MAX_FIRST_INDEX)
    if self.prefix is not None and len(self.prefix) != len(self.src):
      raise RequestError(f'{len(self.prefix)} prefixes for {len(self.src)} sentences: give one '
                         "a sentence ('' for none).")
    if unknown := [name for name in self.settings if name not in DecodingConfig.PER_REQUEST]:
      raise RequestError(f'"{unknown[0]}" is not a setting a request may change (those are: '
                         f"{', '.join(DecodingConfig.PER_REQUEST)}).")
    # SettingError for a value out of its range, or sampling's settings beside "sampling":
    # false. Whether they fit the model's own search is decoding()'s to say: a server that
    # samples takes a temperature alone.
    DecodingConfig(**{'sampling': True, **self.settings})

  def decoding(self, base: DecodingConfig) -> DecodingConfig:
    """The search of this request on a model that searches with `base`. A request that turns
    sampling on (or off) leaves `base`'s settings of the other way (a server's beam size, say)
    at their defaults: the way it asks for does not read them."""
    if self.settings.get('sampling', base.sampling) != base.sampling:
      unread = DecodingConfig.SAMPLING if base.sampling else DecodingConfig.SEARCH
      base = base.replace(**{name: DecodingConfig.__dataclass_fields__[name].default
                             for name in unread})
    return base.replace(**self.settings)

  @classmethod
  def from_json(cls, body: Any, limits: ServerLimits | None = None) -> 'TranslateRequest':
    """The request a decoded JSON body asks; RequestError (TooLarge) for anything else."""
    body = _fields(body, cls.FIELDS, '{"src": [sentences], ...}')
    return cls(_sentences(body, 'src', limits), body.get('nbest'),
               _sentences(body, 'prefix', limits) if 'prefix' in body else None,
               body.get('first_index', 0),
               {name: body[name] for name in DecodingConfig.PER_REQUEST if name in body})

  def to_json(self) -> dict[str, Any]:
    """The body of this request (from_json's inverse; defaults left out)."""
    return {'src': list(self.src), **({'nbest': self.nbest} if self.nbest else {}),
            **({'prefix': list(self.prefix)} if self.prefix is not None else {}),
            **({'first_index': self.first_index} if self.first_index else {}), **self.settings}

  def answer(self, found: list[Any]) -> dict[str, Any]:
    """The JSON answer of `found` (Translator.run's result for this request)."""
    return {'translations': found} if self.nbest is None else {'nbest': found}

  def read(self, answer: dict[str, Any]) -> list[Any]:
    """answer's results (a server's JSON answer to this request)."""
    return answer['translations' if self.nbest is None else 'nbest']


@dataclasses.dataclass(frozen=True)
class ScoreRequest:
  """Pairs to score (one target a source): each target's log-probability given its source,
  with each token's if `token_log_probs`."""
  src: Sequence[str]
  tgt: Sequence[str]
  token_log_probs: bool = False

  FIELDS = ('src', 'tgt', 'token_log_probs')

  def __post_init__(self):
    text.check_pairs(self.src, self.tgt)  # before a server merges it with other requests
    if type(self.token_log_probs) is not bool:
      raise RequestError('"token_log_probs" must be true or false, got '
                         f'{json.dumps(self.token_log_probs)[:60]}.')

  @classmethod
  def from_json(cls, body: Any, limits: ServerLimits | None = None) -> 'ScoreRequest':
    """As TranslateRequest.from_json."""
    body = _fields(body, cls.FIELDS, '{"src": [sentences], "tgt": [translations]}')
    return cls(_sentences(body, 'src', limits), _sentences(body, 'tgt', limits),
               body.get('token_log_probs', False))

  def to_json(self) -> dict[str, Any]:
    """The body of this request."""
    return {'src': list(self.src), 'tgt': list(self.tgt),
            'token_log_probs': self.token_log_probs}

  def answer(self, found: list[Any]) -> dict[str, Any]:
    """The JSON answer of `found` (TargetScores)."""
    return {'scores': [s.as_dict(self.token_log_probs) for s in found]}

  def read(self, answer: dict[str, Any]) -> list[Any]:
    """answer's scores (TargetScore.as_dict's fields)."""
    return answer['scores']


Request = TranslateRequest | ScoreRequest


def merged(requests: Sequence[Request]) -> Request:
  """One request of several of one kind and search (a server's batch): their sentences in
  order, prefixes '' where one had none; the first's first_index (requests that sample are
  never merged: their keys follow their own)."""
  first = requests[0]
  if len(requests) == 1:
    return first
  join = lambda lists: [s for part in lists for s in part]  # noqa: E731
  if isinstance(first, ScoreRequest):
    return ScoreRequest(join(r.src for r in requests), join(r.tgt for r in requests),
                        first.token_log_probs)
  prefix = None if all(r.prefix is None for r in requests) else join(
      r.prefix if r.prefix is not None else [''] * len(r.src) for r in requests)
  return dataclasses.replace(first, src=join(r.src for r in requests), prefix=prefix)
