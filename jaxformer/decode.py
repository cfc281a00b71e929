"""Greedy search, beam search (§6.1) and sampling over a `tokens_to_logits` callback; no model
code here.

`tokens_to_logits(tokens [N, 1], cache) -> (logits [N, V], cache)` scores the next token after
`tokens`, the last token of each hypothesis (0 before the first). The cache is any pytree; beam
search reorders it as beams are chosen with `reorder_cache(cache, parents)` (hypothesis i
continues hypothesis parents[i]). The default, `reorder_rows`, takes every array with a leading
axis as per hypothesis [N, ...] and leaves scalars (a position counter) as they are; a cache
with other shared parts (the model's: see jaxformer.cache) passes its own.

Shapes: B sentences, W beams per sentence (N = B * W hypotheses), T output positions, V vocabulary
(T and V as in jaxformer.model; W for the beams, since K is the model's key width per head).
Lengths count generated tokens, EOS included. Sentence b stops at EOS or after max_lengths[b]
tokens, whichever comes first; the paper uses max_lengths = source length + 50.

Every search takes an optional forced prefix [B, T] (0 after each sentence's prefix): while
prefix[b, t] is not 0, sentence b's token t is prefix[b, t], scored by the model as any other
token, and the search goes on from there (a forced target prefix, as in CTranslate2's
target_prefix). max_lengths must leave room after it.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp

from jaxformer import _cpu_ops
from jaxformer._cpu_ops import argmax, top_k  # noqa: F401  (decode.argmax, decode.top_k)

Array = jax.Array
Cache = Any
TokensToLogits = Callable[[Array, Cache], tuple[Array, Cache]]
NEG_INF = -1.0e7  # finite, so that -inf - -inf never makes a NaN
FIRST_STAGE = 16  # tokens of room in the first stage of a search with a growing cache


def stage_lengths(max_len: int) -> list[int]:
  """The room of each stage of a search whose cache grows: 16, 32, 64, ..., max_len tokens."""
  rooms = [min(FIRST_STAGE, max_len)]
  while rooms[-1] < max_len:
    rooms.append(min(2 * rooms[-1], max_len))
  return rooms


def length_penalty(length: Array, alpha: float) -> Array:
  """GNMT's ((5 + length) / 6)^alpha (Wu et al., 2016), used by the paper with alpha = 0.6."""
  return ((5.0 + length.astype(jnp.float32)) / 6.0) ** alpha


# --- the searches' common frame ------------------------------------------------------------------
#
# A search is a state (a flax dataclass whose per-sentence data travel in it: limits, prefixes,
# sampling keys and the cache) and three pure functions of it: `step` (one token more), `live`
# (the sentences whose result may still change) and `results`. `run` steps a state until a
# given step or until fewer sentences than asked are live (by default: none); `complete` runs
# the whole of it, in stages whose cache grows. Since a sentence that is not live never changes
# its result, a driver may also stop once few sentences are live, take out the results of the
# sentences that are done, and go on with the live ones gathered into fewer rows
# (`take_sentences`): jaxformer.search does that.


def take_sentences(state: Any, indices: Array, count: int) -> Any:
  """`state` with only its sentences at `indices` [b] (in that order) of its `count`: every
  array whose leading axis holds the sentences [count, ...] or their hypotheses
  [count * W, ...] (a sentence's W adjacent) is gathered along it; scalars (a step, a cache
  position) are kept. The one gather that moves a search to fewer rows."""
  def take(x: Array) -> Array:
    if x.ndim == 0:
      return x
    per = x.shape[0] // count
    if per * count != x.shape[0]:
      raise ValueError(f'an array of {x.shape[0]} rows in a state of {count} sentences')
    rows = (indices[:, None] * per + jnp.arange(per)).reshape(-1)
    return take_rows(x, rows)
  return jax.tree.map(take, state)


def run(search: Any, tokens_to_logits: TokensToLogits, state: Any, until: int | Array,
        fewest: int | Array = 1) -> Any:
  """`search.step` while state.step < until and at least `fewest` sentences are live (a
  driver that moves the live ones into fewer rows stops when that pays)."""
  return jax.lax.while_loop(
      lambda s: (s.step < until) & (jnp.sum(search.live(s)) >= fewest),
      lambda s: search.step(tokens_to_logits, s), state)


def complete(search: Any, tokens_to_logits: TokensToLogits, state: Any, max_len: int,
             grow_cache: Callable[[Cache, int], Cache] | None = None) -> Any:
  """The whole search from `state` to max_len tokens; with grow_cache, in the stages of
  stage_lengths(max_len), the cache grown before each."""
  if grow_cache is None:
    return run(search, tokens_to_logits, state, max_len)
  for room in stage_lengths(max_len):
    state = run(search, tokens_to_logits, state.replace(cache=grow_cache(state.cache, room)),
                room)
  return state


# --- greedy search and sampling ------------------------------------------------------------------


@flax.struct.dataclass
class PathState:
  """The state of `Path`: one path per row, `per_sentence` rows a sentence (a sentence's
  samples, adjacent)."""
  step: Array           # [] tokens generated so far
  last: Array           # [N] the last token of each row
  out: Array            # [N, T]
  log_prob: Array       # [N] the model's log-probability of out (untempered, unfiltered)
  done: Array           # [N]
  max_lengths: Array    # [N] the most tokens each row may generate
  prefix: Array | None  # [N, T] forced tokens, 0 after each row's prefix
  keys: Array | None    # [N] sampling's keys (None: greedy)
  cache: Cache
  per_sentence: int = flax.struct.field(pytree_node=False, default=1)


@dataclasses.dataclass(frozen=True)
class Path:
  """One path per row: the argmax token at every step (greedy search), or with `sampling`
  (temperature, top_k, top_p: filter_logits' settings) a token drawn from the model's
  next-token distribution, row n's draw at step t with fold_in(keys[n], t), so that a row's
  sample depends on its key alone, not on the other rows of the batch. `scored`: the path's
  log-probability is summed (greedy search spares the log-softmax)."""
  eos_id: int = 1
  sampling: tuple[float, int, float] | None = None
  scored: bool = False

  def start(self, cache: Cache, max_lengths: Array, max_len: int, prefix: Array | None = None,
            keys: Array | None = None, per_sentence: int = 1) -> PathState:
    """The first state: nothing generated, rows of max_lengths <= 0 done at once."""
    rows = max_lengths.shape[0]
    return PathState(step=jnp.array(0), last=jnp.zeros(rows, jnp.int32),
                     out=jnp.zeros((rows, max_len), jnp.int32),
                     log_prob=jnp.zeros(rows, jnp.float32), done=max_lengths <= 0,
                     max_lengths=max_lengths, prefix=prefix, keys=keys, cache=cache,
                     per_sentence=per_sentence)

  def live(self, s: PathState) -> Array:
    """[B] whether each sentence has a row still searching."""
    return ~jnp.all(s.done.reshape(-1, s.per_sentence), axis=1)

  def step(self, tokens_to_logits: TokensToLogits, s: PathState) -> PathState:
    """One token more on every row (0 on rows that are done)."""
    logits, cache = tokens_to_logits(s.last[:, None], s.cache)  # --> [N, V]
    token = self._choose(_no_padding(logits), s)
    if s.prefix is not None:
      forced = s.prefix[:, s.step]
      token = jnp.where(forced > 0, forced, token)
    token = jnp.where(s.done, 0, token)
    log_prob = s.log_prob
    if self.scored:
      chosen = jax.nn.log_softmax(logits.astype(jnp.float32))
      log_prob += jnp.where(s.done, 0.0, jnp.take_along_axis(chosen, token[:, None], 1)[:, 0])
    done = s.done | (token == self.eos_id) | (s.step + 1 >= s.max_lengths)
    return s.replace(step=s.step + 1, last=token, out=s.out.at[:, s.step].set(token),
                     log_prob=log_prob, done=done, cache=cache)

  def _choose(self, logits: Array, s: PathState) -> Array:
    if self.sampling is None:
      return argmax(logits)
    step_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(s.keys, s.step)
    filtered = filter_logits(logits, *self.sampling)
    return jax.vmap(jax.random.categorical)(step_keys, filtered).astype(jnp.int32)

  def results(self, s: PathState) -> tuple[Array, Array]:
    """(ids [N, T], 0 after EOS or the limit; log_prob [N])."""
    return s.out, s.log_prob


def greedy_search(tokens_to_logits: TokensToLogits, cache: Cache, max_lengths: Array,
                  max_len: int, eos_id: int = 1,
                  grow_cache: Callable[[Cache, int], Cache] | None = None,
                  prefix: Array | None = None) -> Array:
  """The argmax token at every step. Returns [B, max_len] ids, 0 after EOS or the limit.
  `grow_cache` as in beam_search; `prefix` as in the module's docstring."""
  path = Path(eos_id)
  final = complete(path, tokens_to_logits, path.start(cache, max_lengths, max_len, prefix),
                 max_len, grow_cache)
  return path.results(final)[0]


def sample_search(tokens_to_logits: TokensToLogits, cache: Cache, max_lengths: Array,
                  max_len: int, keys: Array, *, temperature: float = 1.0, top_k: int = 0,
                  top_p: float = 1.0, eos_id: int = 1,
                  grow_cache: Callable[[Cache, int], Cache] | None = None,
                  prefix: Array | None = None) -> tuple[Array, Array]:
  """Each token drawn from the model's next-token distribution, reshaped by `filter_logits`,
  row b's draw with keys[b] (see Path).

  Returns (ids [B, max_len], 0 after EOS or the limit; log_prob [B], the sum of the drawn
  tokens' log-probabilities under the model itself, before temperature and filtering).
  """
  path = Path(eos_id, (temperature, top_k, top_p), scored=True)
  final = complete(path, tokens_to_logits, path.start(cache, max_lengths, max_len, prefix, keys),
                 max_len, grow_cache)
  return path.results(final)


def sample_keys(seed: Array, sentences: Array, samples: int) -> Array:
  """Sampling's keys [B * samples] (samples of a sentence adjacent): sample j of sentence i
  (sentences [B], each one's index in the whole input) draws with
  fold_in(fold_in(key(seed), i), j), so that a sample does not depend on its batch."""
  base = jax.random.key(seed)
  per_sentence = jax.vmap(lambda i: jax.vmap(lambda j: jax.random.fold_in(
      jax.random.fold_in(base, i), j))(jnp.arange(samples)))(sentences)  # --> [B, samples]
  return per_sentence.reshape(-1)


def filter_logits(logits: Array, temperature: float, top_k: int, top_p: float) -> Array:
  """logits [N, V] reshaped for sampling, in this order: divided by `temperature`; all but the
  `top_k` largest at NEG_INF (0: none; ties with the k-th are kept); then all but the fewest
  largest whose softmax probabilities sum to at least `top_p` at NEG_INF (1: none; the likeliest
  token is always kept). Padding (id 0) is at NEG_INF from the start."""
  logits = _no_padding(logits.astype(jnp.float32)) / temperature
  if top_k and top_k < logits.shape[-1]:
    kth = _cpu_ops.top_k(logits, top_k)[0][:, -1:]  # (the argument hides the function)
    logits = jnp.where(logits < kth, NEG_INF, logits)
  if top_p < 1.0:
    ordered = jnp.sort(logits, axis=-1)[:, ::-1]  # --> [N, V], largest first
    probs = jax.nn.softmax(ordered, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # the mass of the tokens likelier than each
    smallest = jnp.min(jnp.where(before < top_p, ordered, jnp.inf), axis=-1, keepdims=True)
    logits = jnp.where(logits < smallest, NEG_INF, logits)
  return logits


# --- beam search ---------------------------------------------------------------------------------


def _flatten(x: Array) -> Array:
  return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def _unflatten(x: Array, beam: int) -> Array:
  return x.reshape(x.shape[0] // beam, beam, *x.shape[1:])


def _gather(x: Array, indices: Array) -> Array:
  """x [B, W, ...] -> [B, N, ...], taking beam indices[b, n] for each sentence b."""
  return jnp.take_along_axis(x, indices.reshape(*indices.shape, *([1] * (x.ndim - 2))), axis=1)


def take_rows(x: Array, rows: Array) -> Array:
  """x's rows in the order `rows` [N] (in bounds): one gather along the leading axis (XLA:CPU
  lowers take_along_axis on [B, W, ...] to a slow select; mode='clip' spares the default
  mode's select as well). `rows` may be in any order: beam search passes each sentence's
  parents in score order, so the gather makes no sortedness promise XLA could rely on."""
  return jnp.take(x, rows, axis=0, mode='clip')


def reorder_rows(cache: Cache, parents: Array) -> Cache:
  """The default `reorder_cache`: every array's rows in the order `parents` [N]; scalars kept."""
  return jax.tree.map(lambda x: x if x.ndim == 0 else take_rows(x, parents), cache)


def _no_padding(logits: Array) -> Array:
  """logits [N, V] with padding's (id 0) at NEG_INF: padding is never generated."""
  return jnp.where(jnp.arange(logits.shape[-1]) == 0, NEG_INF, logits)


@jax.named_scope('continuations')  # (experiments/profile_step.py sums its ops by this name)
def continuations(alive_log_probs: Array, logits: Array, n: int, forced: Array | None = None
                  ) -> tuple[Array, Array, Array]:
  """The n best one-token continuations of W live beams per sentence, by log-probability:
  (log-probabilities [B, n], beam [B, n], token [B, n]), best first. Given the beams'
  log-probabilities [B, W] and next-token logits [B * W, V]; where forced [B * W] is not 0,
  that token is a hypothesis's only continuation (with its log-probability under the model).

  The same as jax.lax.top_k over all W * V candidates with padding's log-probability at
  NEG_INF, in two steps: the n best of a sentence are among the n likeliest tokens of each of
  its beams (fewer when V < n), so the full log-softmax [B * W, V] is never written: its
  normaliser is a reduction, and only the chosen entries are normalised, as
  jax.nn.log_softmax computes them.
  """
  batch, k = alive_log_probs.shape
  per_beam = min(n, logits.shape[-1])
  logits = logits.astype(jnp.float32)
  if forced is None:
    top, tokens, most = _cpu_ops.top_k_and_max(logits, per_beam, NEG_INF)  # [B * W, per_beam]
  else:
    most = jnp.max(logits, axis=-1, keepdims=True)
    top, tokens = top_k(jnp.where(
        (forced[:, None] > 0) & (jnp.arange(logits.shape[-1]) != forced[:, None]), NEG_INF,
        _no_padding(logits)), per_beam)
  normaliser = jnp.log(jnp.sum(jnp.exp(logits - most), axis=-1, keepdims=True))
  log_probs = jnp.where((tokens == 0) | (top <= NEG_INF), NEG_INF, (top - most) - normaliser)
  candidates = alive_log_probs[:, :, None] + _unflatten(log_probs, k)
  log_probs, indices = jax.lax.top_k(candidates.reshape(batch, k * per_beam), n)
  return (log_probs, indices // per_beam,
          jnp.take_along_axis(tokens.reshape(batch, k * per_beam), indices, axis=1))


def _top_k(scores: Array, k: int, *arrays: Array) -> tuple[Array, ...]:
  """The k best entries of scores [B, N], and the same entries of each [B, N, ...] array."""
  top_scores, indices = jax.lax.top_k(scores, k)
  return (top_scores, indices, *(_gather(a, indices) for a in arrays))


@flax.struct.dataclass
class BeamState:
  """The state of `Beam`: live and finished hypotheses of every sentence."""
  step: Array             # [] tokens generated so far
  alive_seqs: Array       # [B, W, T]
  alive_log_probs: Array  # [B, W] sum of log-probabilities
  finished_seqs: Array    # [B, W, T]
  finished_scores: Array  # [B, W] log-probability / length penalty; NEG_INF where empty
  max_lengths: Array      # [B] the most tokens each sentence may generate
  prefix: Array | None    # [B, T] forced tokens, 0 after each sentence's prefix
  cache: Cache            # for B * W hypotheses


@dataclasses.dataclass(frozen=True)
class Beam:
  """Beam search with GNMT's length penalty (alpha), `beam_size` hypotheses a sentence; a
  sentence is live until no live beam can beat its best finished one (its n-th best, with
  num_results=n) or it reaches its limit. `reorder_cache(cache, parents [B * W]) -> cache`
  after beams are chosen (see the module's docstring)."""
  beam_size: int = 4
  alpha: float = 0.6
  eos_id: int = 1
  num_results: int | None = None
  reorder_cache: Callable[[Cache, Array], Cache] = reorder_rows

  def start(self, cache: Cache, max_lengths: Array, max_len: int, prefix: Array | None = None
            ) -> BeamState:
    """The first state: one live beam a sentence (the others at NEG_INF), nothing finished."""
    batch, k = max_lengths.shape[0], self.beam_size
    # Only beam 0 is live at first, so the first step does not choose k copies of one token.
    init_log_probs = jnp.tile(jnp.array([0.0] + [NEG_INF] * (k - 1)), (batch, 1))
    return BeamState(
        step=jnp.array(0), alive_seqs=jnp.zeros((batch, k, max_len), jnp.int32),
        alive_log_probs=init_log_probs, finished_seqs=jnp.zeros((batch, k, max_len), jnp.int32),
        finished_scores=jnp.full((batch, k), NEG_INF), max_lengths=max_lengths, prefix=prefix,
        cache=cache)

  def live(self, s: BeamState) -> Array:
    """[B] whether each sentence's result may still change: a live beam's log-probability only
    falls, and its penalty is at most that at the sentence's limit."""
    best_alive = s.alive_log_probs[:, 0] / length_penalty(s.max_lengths, self.alpha)
    return ((best_alive > s.finished_scores[:, (self.num_results or 1) - 1])
            & (s.step < s.max_lengths))

  def step(self, tokens_to_logits: TokensToLogits, s: BeamState) -> BeamState:
    """One token more: the 2W best continuations of each sentence's live beams, the W best
    that did not end live on, those that ended join the finished ones."""
    k = self.beam_size
    last = jnp.where(s.step > 0, s.alive_seqs[:, :, jnp.maximum(s.step - 1, 0)], 0)  # [B, W]
    logits, cache = tokens_to_logits(_flatten(last)[:, None], s.cache)
    # The 2W best continuations: enough to keep W live ones even if W of them end here.
    forced = None if s.prefix is None else jnp.repeat(s.prefix[:, s.step], k)  # --> [B * W]
    return self._chosen(s.replace(cache=cache),
                        *continuations(s.alive_log_probs, logits, 2 * k, forced))  # [B, 2W]

  def first_step(self, logits: Array, s: BeamState) -> BeamState:
    """`step`'s state from `start`'s, given each sentence's first logits [B, V] (computed once
    a sentence: until then its beams are one, beam 0) and s.cache after that step for B * W
    hypotheses (the model's: jaxformer.cache.expand), as CTranslate2 expands its beams after
    the first step. Beam 0's 2W best continuations are the 2W best of all its beams."""
    k, forced = self.beam_size, None if s.prefix is None else s.prefix[:, 0]
    if logits.shape[-1] < 2 * k:  # fewer tokens than 2W: the other beams' continuations count
      return self._chosen(s, *continuations(s.alive_log_probs, jnp.repeat(logits, k, axis=0),
                                            2 * k, None if forced is None else
                                            jnp.repeat(forced, k)))
    return self._chosen(s, *continuations(s.alive_log_probs[:, :1], logits, 2 * k, forced))

  def _chosen(self, s: BeamState, top_log_probs: Array, beam_of: Array, token: Array
              ) -> BeamState:
    """The state after a step whose 2W best continuations [B, 2W] are given (their
    log-probabilities, beams and tokens), s.cache after the step's token."""
    batch, k = s.alive_log_probs.shape
    seqs = _gather(s.alive_seqs, beam_of)  # --> [B, 2W, T]
    seqs = seqs.at[:, :, s.step].set(token)
    length = s.step + 1
    # Candidates of no real hypothesis (the empty beams of the first step, those a prefix
    # leaves) neither end nor finish.
    real = top_log_probs > NEG_INF / 2
    ends = real & ((token == self.eos_id) | (length >= s.max_lengths)[:, None])  # --> [B, 2W]

    # Live beams: the W best that did not end.
    _, alive_idx, alive_seqs, alive_log_probs = _top_k(
        jnp.where(ends, NEG_INF, top_log_probs), k, seqs, top_log_probs)
    alive_log_probs = jnp.where(_gather(ends, alive_idx), NEG_INF, alive_log_probs)
    parents = _gather(beam_of, alive_idx) + jnp.arange(batch)[:, None] * k  # --> [B, W]
    cache = self.reorder_cache(s.cache, parents.reshape(-1))

    # Finished: the W best of those finished before and those ending now, by penalised score.
    new_scores = jnp.where(ends, top_log_probs / length_penalty(length, self.alpha), NEG_INF)
    finished_scores, _, finished_seqs = _top_k(
        jnp.concatenate([s.finished_scores, new_scores], axis=1), k,
        jnp.concatenate([s.finished_seqs, seqs], axis=1))
    return s.replace(step=length, alive_seqs=alive_seqs, alive_log_probs=alive_log_probs,
                     finished_seqs=finished_seqs, finished_scores=finished_scores, cache=cache)

  def results(self, s: BeamState) -> tuple[Array, Array]:
    """The best (or the num_results best) hypotheses of each sentence and their scores:
    (ids [B, T], score [B]), or ([B, n, T], [B, n]), best first. Finished hypotheses rank
    first; live ones (only when max_len cut the search short) fill what is left. A sentence
    that is not live has its final results, whatever step the state is at."""
    alive_scores = s.alive_log_probs / length_penalty(s.step, self.alpha)
    if self.num_results is None:
      # A sentence with nothing finished (only if max_len < max_lengths): its best live beam.
      has_finished = s.finished_scores[:, 0] > NEG_INF / 2
      seqs = jnp.where(has_finished[:, None], s.finished_seqs[:, 0], s.alive_seqs[:, 0])
      return seqs, jnp.where(has_finished, s.finished_scores[:, 0], alive_scores[:, 0])
    k = self.beam_size
    scores = jnp.concatenate([s.finished_scores, alive_scores], axis=1)  # [B, 2W]
    valid = jnp.concatenate([s.finished_scores, s.alive_log_probs], axis=1) > NEG_INF / 2
    finished = jnp.arange(2 * k) < k
    rank = jnp.where(valid, scores - jnp.where(finished, 0.0, -NEG_INF), 2 * NEG_INF)
    _, _, seqs, scores = _top_k(
        rank, self.num_results, jnp.concatenate([s.finished_seqs, s.alive_seqs], axis=1), scores)
    return seqs, scores


def beam_search(tokens_to_logits: TokensToLogits, cache: Cache, max_lengths: Array,
                max_len: int, *, beam_size: int = 4, alpha: float = 0.6,
                eos_id: int = 1, num_results: int | None = None,
                grow_cache: Callable[[Cache, int], Cache] | None = None,
                reorder_cache: Callable[[Cache, Array], Cache] = reorder_rows,
                prefix: Array | None = None) -> tuple[Array, Array]:
  """Beam search (`Beam`) of every sentence to its end.

  Args:
    tokens_to_logits: the callback above, called on B * beam_size hypotheses.
    cache: its initial state for B * beam_size hypotheses (each sentence repeated beam_size
      times, beams of a sentence adjacent).
    max_lengths: [B] the most tokens each sentence may generate.
    max_len: a static bound on max_lengths (the output length).
    num_results: None for the best hypothesis only; n <= beam_size for the n best.
    grow_cache: with `grow_cache(cache, room) -> cache` for `room` tokens, the search runs in
      stages of `stage_lengths(max_len)` tokens and grows the cache before each, so that
      reordering beams copies only the part that early steps can fill (the cache passed in may
      then be smaller than max_len).
    reorder_cache: as in Beam.
    prefix: [B, max_len] forced tokens (see the module's docstring); its log-probability counts
      in the scores.

  Returns:
    Beam.results: (ids [B, max_len], score [B]) of the best hypothesis of each sentence, 0
    after EOS; with num_results=n, (ids [B, n, max_len], scores [B, n]), best first. Scores
    are log-probability / length penalty.
  """
  beam = Beam(beam_size, alpha, eos_id, num_results, reorder_cache)
  final = complete(beam, tokens_to_logits, beam.start(cache, max_lengths, max_len, prefix),
                 max_len, grow_cache)
  return beam.results(final)
