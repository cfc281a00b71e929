"""What every settings dataclass is made of (a field with its help text, the range of a number,
one check of types and ranges, SettingError), and the settings of decoding (DecodingConfig).

Standard library only: the client of `jaxformer serve` and the command line's argument
declarations (jaxformer.arguments) read DecodingConfig without importing jax. jaxformer.config
builds the model's and the run's settings on the same parts and re-exports them.
"""

import dataclasses
import functools
import math
import types
import typing
from typing import Any

from jaxformer.errors import JaxformerError


class SettingError(JaxformerError, ValueError):
  """A setting that is unknown, of the wrong type, or refused with the others."""


@dataclasses.dataclass(frozen=True)
class Range:
  """The values a numeric setting accepts: low <= x (low < x if low_open), and x < high
  (x <= high if not high_open) when high is given."""
  low: float
  high: float | None = None
  low_open: bool = False
  high_open: bool = True

  def __contains__(self, x: float) -> bool:
    return (x > self.low if self.low_open else x >= self.low) and (
        self.high is None or (x < self.high if self.high_open else x <= self.high))

  def __str__(self) -> str:
    low, high = (str(int(x)) if float(x).is_integer() else f'{x:g}'
                 for x in (self.low, self.high or 0))
    if self.high is not None:
      return f'in {"(" if self.low_open else "["}{low}, {high}{")" if self.high_open else "]"}'
    return f'{">" if self.low_open else ">="} {low}'


AT_LEAST_1, AT_LEAST_0, FRACTION = Range(1), Range(0), Range(0, 1)
POSITIVE = Range(0, low_open=True)
SEEDS = Range(0, 2**32)


def setting(default: Any, help: str, metavar: str | None = None,  # pylint: disable=redefined-builtin
            flag: str | None = None) -> Any:
  """A settings field with its help text, the name its flag's value has in --help if not N, and
  its flag's name if not the field's (the command line's flags and --help read them)."""
  return dataclasses.field(default=default,
                           metadata={'help': help, 'metavar': metavar, 'flag': flag})


def check_fields(settings: Any, section: str, ranges: dict[str, Range]) -> None:
  """SettingError, naming the setting as --set does (`section`.field), for a value of the wrong
  type (a recipe file's get_config() may give anything) or, for a number, outside its range in
  `ranges`."""
  hints = _type_hints(type(settings))
  for field in dataclasses.fields(settings):
    value, hint = getattr(settings, field.name), hints[field.name]
    allowed = typing.get_args(hint) if typing.get_origin(hint) is types.UnionType else (hint,)
    if hint is Any or any(_is_a(value, kind) for kind in allowed):
      if isinstance(value, float) and not math.isfinite(value):
        raise SettingError(f'{section}.{field.name} must be a finite number, got {value}.')
      if field.name in ranges and value is not None and value not in ranges[field.name]:
        unset = ' (or unset)' if type(None) in allowed else ''
        raise SettingError(f'{section}.{field.name} must be {ranges[field.name]}{unset}, got '
                           f'{value}.')
      continue
    names = ' or '.join('none' if kind is type(None) else kind.__name__ for kind in allowed)
    raise SettingError(f'{section}.{field.name} must be {names}, got {type(value).__name__} '
                       f'{value!r}.')


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
  """typing.get_type_hints of a settings class, read once: a server checks every request's
  settings, and reading the hints costs about what the checks do."""
  return typing.get_type_hints(cls)


def _is_a(value: Any, kind: type) -> bool:
  """isinstance, but a bool is no number and an int is a float, as in the type hints' intent."""
  if kind in (int, float) and isinstance(value, bool):
    return False
  return isinstance(value, (int, float) if kind is float else kind)


# Upper bounds of the sizes a user gives a search, the command's and the server's alike. A
# search holds batch_size x beam (or x samples) hypotheses, each with a decoding cache of up to
# the model's max_len positions in every layer: a beam of 256 in the default batch of 32 is
# 8,192 hypotheses, tens of gigabytes of cache for a base model: past the bounds no search
# could run, and they refuse it before the model loads. Outputs never pass the model's max_len,
# so a longer extra_length changes nothing; its bound keeps lengths far inside int32.
MAX_BEAM = 256
MAX_BATCH = 4096
MAX_NBEST = 100  # translations (samples; n-best is also bounded by the beam) a sentence
MAX_EXTRA_LENGTH = 100_000


@dataclasses.dataclass(frozen=True)
class DecodingConfig:
  """How a model's outputs are chosen: by default the paper's beam search (§6.1: beam 4,
  alpha 0.6, at most input + 50 tokens); greedy search with beam_size 1; or, with sampling,
  each token drawn from the model's distribution.

  Sampling reshapes the next token's distribution in a fixed order: the logits are divided by
  `temperature`; then only the `top_k` likeliest tokens are kept; then, of those, only the
  fewest likeliest whose probabilities (renormalised after top-k) reach `top_p`; the token is
  drawn from what is left, renormalised. The draws of sentence i's sample j use a key of their
  own, made from (seed, i, j) and the step: the same seed gives the same samples whatever the
  batch size, the order of the batches and the number of workers.
  """
  beam_size: int = setting(4, f'beam size (1: greedy search; at most {MAX_BEAM})', flag='beam')
  alpha: float = setting(0.6, "length penalty exponent: scores are log-probability / "
                         "((5 + length) / 6)^alpha (GNMT's, §6.1)")
  extra_length: int = setting(50, 'an output stops at its input length + this many tokens (and '
                             f"at the model's max_len; at most {MAX_EXTRA_LENGTH:,})")
  batch_size: int = setting(32, 'the most sentences searched together (a call is split into '
                                f'batches as even as can be; at most {MAX_BATCH})')
  all_rows: bool = setting(False, 'on a CPU: every batch steps at all its rows until its last '
                           'sentence ends, instead of its sentences still searching once half '
                           'are done going on an eighth of its rows at a time, a quarter for '
                           'greedy search (the same outputs; faster only where every sentence '
                           'runs to its limit, as with random weights)')
  drop_finished: bool = setting(False, 'on a CPU, beam search and samples: the search stops '
                                'whenever its live sentences fit in fewer rows and goes on in '
                                'those (the same outputs; many more programs to compile, and '
                                "slower than the default's groups on the models measured)")
  sampling: bool = setting(False, "draw each output token from the model's distribution "
                           'instead of searching (with --nbest N: N samples a sentence)')
  temperature: float = setting(1.0, 'sampling: the logits are divided by this (below 1: '
                               'closer to greedy search)')
  top_k: int = setting(0, 'sampling: only from the k likeliest tokens (0: all)', metavar='K')
  top_p: float = setting(1.0, 'sampling: only from the fewest likeliest tokens whose '
                         'probability reaches p, after top-k (nucleus sampling; 1: all)',
                         metavar='P')
  seed: int | None = setting(None, "sampling's seed (none: 0)")

  RANGES = {'beam_size': Range(1, MAX_BEAM, high_open=False), 'alpha': AT_LEAST_0,
            'extra_length': Range(0, MAX_EXTRA_LENGTH, high_open=False),
            'batch_size': Range(1, MAX_BATCH, high_open=False), 'temperature': POSITIVE,
            'top_k': AT_LEAST_0,
            'top_p': Range(0, 1, low_open=True, high_open=False), 'seed': SEEDS}
  SAMPLING = ('temperature', 'top_k', 'top_p', 'seed')  # what only sampling reads
  SEARCH = ('beam_size', 'alpha')                      # what only beam search reads
  PER_REQUEST = ('sampling', *SAMPLING)                # what a server's client may choose

  def __post_init__(self):
    check_fields(self, 'decoding', self.RANGES)
    unused = self.SEARCH if self.sampling else self.SAMPLING
    changed = [f'{name}={getattr(self, name)}' for name in unused
               if getattr(self, name) != DecodingConfig.__dataclass_fields__[name].default]
    if changed:
      raise SettingError(f'{", ".join(changed)}: ' + (
          "beam_size and alpha are beam search's, and sampling searches nothing (--nbest N "
          'draws N samples a sentence).' if self.sampling else
          'temperature, top_k, top_p and seed are for sampling only: turn it on (--sampling).'))

  def describe(self) -> str:
    """The settings in words, as `jaxformer eval` prints them beside its scores."""
    limit = f'max length input + {self.extra_length}'
    if not self.sampling:
      return f'beam {self.beam_size}, alpha {self.alpha}, {limit}'
    return (f'sampling (temperature {self.temperature}, top-k {self.top_k or "all"}, top-p '
            f'{self.top_p}, seed {self.seed or 0}), {limit}')

  def replace(self, **changes: Any) -> 'DecodingConfig':
    """A copy with some fields changed (checked as a new one)."""
    return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class ServerLimits:
  """What `jaxformer serve` bounds: every wait has a timeout, every input a size, every pool a
  maximum, and each limit answers with a status and a one-line JSON error."""
  max_connections: int = setting(128, 'connections served at once; one more takes the place of '
                                 'the connection idle the longest, or, when all are answering, '
                                 'is answered 503 (with Retry-After) at once')
  idle_timeout: float = setting(60.0, 'seconds a connection may stay silent (idle between '
                                'requests, or sending one) before the server closes it',
                                metavar='SECONDS')
  max_wait: float = setting(120.0, 'seconds a request may wait for the model before it is '
                            'answered 503', metavar='SECONDS')
  max_sentences: int = setting(4096, 'sentences a request (413 above)')
  max_chars: int = setting(10_000, 'characters a sentence (413 above)')
  max_batch: int = setting(1024, 'sentences of several requests searched together')
  batch_wait: float = setting(0.01, 'seconds after a search during which the next waits for the '
                              'clients it answered to send again, so that they are searched '
                              "together (at most half the search's time; a lone client's next "
                              'request never waits)', metavar='SECONDS')
  drain_timeout: float = setting(30.0, 'seconds Ctrl-C or SIGTERM waits for the requests in '
                                 'flight before the server stops', metavar='SECONDS')

  RANGES = {'max_connections': AT_LEAST_1, 'idle_timeout': POSITIVE, 'max_wait': POSITIVE,
            'max_sentences': AT_LEAST_1, 'max_chars': AT_LEAST_1, 'max_batch': AT_LEAST_1,
            'batch_wait': AT_LEAST_0, 'drain_timeout': AT_LEAST_0}

  def __post_init__(self):
    check_fields(self, 'server', self.RANGES)
