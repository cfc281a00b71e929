"""A batch's search over the Transformer: the glue between jaxformer.model and the
model-agnostic searches of jaxformer.decode, run one of two ways.

- **In one program** (`decode_batch`): encode, then the whole search, stage after stage of a
  growing cache. This is the default everywhere: one program per batch shape, few to compile.
  On an accelerator (one shape) a batch steps until its last sentence ends; on a CPU a
  search's first stage runs at all rows (until half its sentences are done), and the sentences
  still live then go on a few at a time, each group to its own end (`stragglers`,
  `_by_groups`), in the same program.
- **In segments** (`Segmented`, DecodingConfig.drop_finished, on a CPU): the same search,
  stopped at the end of each stage and as soon as the live sentences fit in a quarter of the
  rows (SHRINK). The sentences that are done give their results, and the live ones go on in
  those fewer rows, their whole state moved with them by one `decode.take_sentences`. On a CPU
  every row costs its share of each step, finished or not; but each row count is a program of
  its own for every stage and source width, several times the programs of the first way, and
  since the first way's groups it is the slower of the two on the models measured
  (docs/BENCHMARKS.md). Outputs are the one program's: a sentence
  that is not live never changes its result (decode's "common frame"), and every computation
  of a search is row by row.

The search's cache is the model's (jaxformer.cache) with the source ids beside it, since each
decoder step masks the encoder's padding: {'src': [B, S], 'model': ...}; with n samples a
sentence, each sample is a sentence of its own to the cache (B * n rows, `start`).
"""

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer import cache as cache_lib
from jaxformer import compilation, decode
from jaxformer.config import DecodingConfig, TransformerConfig
from jaxformer.data.tokenizer import EOS_ID
from jaxformer.model import Transformer

Array = jax.Array
MIN_ROWS = 8  # a batch of fewer sentences is searched in one program at all its rows (and beam
              # search's first step at every beam's): little to gain, a compile to pay
SHRINK = 4  # a batch's rows go from R to R / 4, R / 16, ...: few programs to compile
STRAGGLER_GROUPS = 8  # a batch's sentences still live after its first stage go on R / 8 at a time
GREEDY_GROUPS = 4  # (R / 4 for a row a sentence: greedy search, one sample)


class Batch(NamedTuple):
  """What a search takes of each sentence of a batch (a pytree: one argument of the jitted
  search, its None fields absent from the program)."""
  src: Array                   # [B, S] source ids, EOS included, 0 after
  max_lengths: Array           # [B] the most tokens each output may have, EOS included
  prefix: Array | None = None  # [B, max_len] forced first tokens (decode's module docstring)
  seed: Array | None = None    # [] sampling's seed
  indices: Array | None = None  # [B] each sentence's index in the whole input: its samples'
                                # keys are decode.sample_keys(seed, indices, n), whatever its row


def cached_tokens_to_logits(model: Transformer, params: Any, src: Array,
                            projection: Array | None = None) -> decode.TokensToLogits:
  """One decoder step per call over the key/value cache of `Transformer.init_cache`
  (`projection`: Transformer.logits')."""
  def fn(tokens, cache):
    return model.apply({'params': params}, src, tokens, cache, None, projection,
                       method=Transformer.decode_step)
  return fn


def _tokens_to_logits(model: Transformer, params: Any, projection: Array | None
                      ) -> decode.TokensToLogits:
  """As cached_tokens_to_logits, over the search's cache of the module's docstring."""
  def fn(tokens, cache):
    logits, inner = cached_tokens_to_logits(model, params, cache['src'], projection)(
        tokens, cache['model'])
    return logits, {**cache, 'model': inner}
  return fn


def _reorder(cache: dict[str, Any], parents: Array) -> dict[str, Any]:
  return {**cache, 'model': cache_lib.reorder(cache['model'], parents)}


def _room(state: Any) -> int:
  """The positions the state's cache has room for."""
  return state.cache['model']['slots'].shape[1]


def _hypotheses(decoding: DecodingConfig, num_results: int | None) -> int:
  """Rows a sentence: its beams, or with sampling its samples."""
  return (num_results or 1) if decoding.sampling else decoding.beam_size


def _search_of(decoding: DecodingConfig, num_results: int | None) -> decode.Path | decode.Beam:
  """decoding's search: sampling, greedy (beam 1 without n-best) or beam search."""
  if decoding.sampling:
    return decode.Path(EOS_ID, (decoding.temperature, decoding.top_k, decoding.top_p),
                       scored=True)
  if decoding.beam_size == 1 and num_results is None:
    return decode.Path(EOS_ID)
  return decode.Beam(decoding.beam_size, decoding.alpha, EOS_ID, num_results, _reorder)


# --- the pieces of a search, each a pure function ------------------------------------------------


def start(params: Any, batch: Batch, projection: Array | None = None, *,
          config: TransformerConfig, max_len: int, decoding: DecodingConfig = DecodingConfig(),
          num_results: int | None = None) -> Any:
  """The search's first state: the batch's sources encoded once, the hypotheses of a sentence
  sharing its encoder keys/values, the cache made for the first stage. On a CPU a beam search
  of MIN_ROWS sentences or more takes its first step here, once a sentence rather than once a
  beam (decode.Beam.first_step): until then a sentence's beams are one, and a step at a row a
  sentence costs a W-th of one at all rows, for a decoder step more to compile in each program
  (docs/benchmarks-log.md). A batch of fewer (a server's request, a terminal's line) steps all
  its rows from the first: there that step's rows cost nothing measurable and its compile
  does. An accelerator would autotune the step's products as well, unmeasured, so it steps all
  rows from the first. `projection`: decode_batch's."""
  src, max_lengths, prefix = batch.src, batch.max_lengths, batch.prefix
  model = Transformer(config)
  encoded = model.apply({'params': params}, src, method=Transformer.encode)  # [B, S, D]
  rows = _hypotheses(decoding, num_results)
  search = _search_of(decoding, num_results)
  once = (isinstance(search, decode.Beam) and jax.default_backend() == 'cpu'
          and len(src) >= MIN_ROWS)
  cache = {'src': src, 'model': model.apply({'params': params}, encoded,
                                            decode.stage_lengths(max_len)[0],
                                            1 if once or decoding.sampling else rows,
                                            method=Transformer.init_cache)}
  if once:
    logits, cache = _tokens_to_logits(model, params, projection)(
        jnp.zeros((src.shape[0], 1), jnp.int32), cache)  # decoding starts from token 0
    cache = {**cache, 'model': cache_lib.expand(cache['model'], rows)}
    return search.first_step(logits, search.start(cache, max_lengths, max_len, prefix))
  if not decoding.sampling:
    return search.start(cache, max_lengths, max_len, prefix)
  repeat = functools.partial(jnp.repeat, repeats=rows, axis=0)  # a sentence's samples adjacent
  # Samples are never reordered, so each is a sentence of its own to the cache (its encoder
  # keys/values repeated): a sentence's W beams attend to all W slots (jaxformer.cache), which
  # for n samples would cost n times the self-attention products of each. The cache's memory
  # grows by the repeats, n times the encoder keys/values, beside the n histories it holds.
  cache = jax.tree.map(lambda x: x if x.ndim == 0 else repeat(x), cache)
  return search.start(cache, repeat(max_lengths), max_len,
                      None if prefix is None else repeat(prefix),
                      decode.sample_keys(batch.seed, batch.indices, rows), per_sentence=rows)


def grow(state: Any, *, room: int) -> Any:
  """The state with room for `room` positions in its cache."""
  if _room(state) >= room:
    return state
  return state.replace(cache={**state.cache, 'model': cache_lib.grow(state.cache['model'], room)})


def advance(params: Any, state: Any, until: Array, fewest: Array | int = 1,
            projection: Array | None = None, *, config: TransformerConfig,
            decoding: DecodingConfig = DecodingConfig(), num_results: int | None = None
            ) -> tuple[Any, Array]:
  """The state stepped until `until` (at most its cache's room), or until fewer than `fewest`
  sentences are live; and which sentences are live [B]. `projection`: decode_batch's."""
  search = _search_of(decoding, num_results)
  state = decode.run(search, _tokens_to_logits(Transformer(config), params, projection), state,
                     until, fewest)
  return state, search.live(state)


def finish(state: Any, *, decoding: DecodingConfig = DecodingConfig(),
           num_results: int | None = None) -> tuple[Array, Array]:
  """(ids [B, T], scores [B]) of each sentence, or with num_results=n (ids [B, n, T],
  scores [B, n]): beam search's results, or the samples and their log-probabilities."""
  ids, scores = _search_of(decoding, num_results).results(state)
  if decoding.sampling and num_results:
    rows = _hypotheses(decoding, num_results)
    return ids.reshape(-1, rows, ids.shape[-1]), scores.reshape(-1, rows)
  return ids, scores


def take(state: Any, kept: Array, *, decoding: DecodingConfig = DecodingConfig(),
         num_results: int | None = None) -> Any:
  """The state of its sentences at `kept` [b] (indices) alone, in that order."""
  count = _search_of(decoding, num_results).live(state).shape[0]
  return decode.take_sentences(state, kept, count)


def decode_batch(params: Any, batch: Batch, projection: Array | None = None, *,
                 config: TransformerConfig, max_len: int,
                 decoding: DecodingConfig = DecodingConfig(), num_results: int | None = None,
                 stragglers: bool = False) -> tuple[Array, Array]:
  """The whole search of a batch in one program, by `decoding`'s search (greedy when its
  beam_size is 1): `finish`'s (ids [B, max_len], scores [B]), or with num_results=n its n best
  and their scores (samples and their log-probabilities). Greedy search scores nothing: zeros.
  `projection`: model.output_projection(params), made once for many searches, or None
  (Transformer.logits').

  With `stragglers` (a CPU's default), the search runs its first stage at all rows until its
  end or until at most half the sentences are live, and those still live then go on a few at
  a time (`_by_groups`); a batch of fewer than MIN_ROWS rows, searched at all its rows, goes
  on from its first stage in the whole room at once rather than in stages each twice the
  last: the same outputs, and half the loops or fewer to compile, where the later stages'
  shorter attention saved nothing measurable (docs/benchmarks-log.md)."""
  settings = {'decoding': decoding, 'num_results': num_results}
  state = start(params, batch, projection, config=config, max_len=max_len, **settings)
  rooms = decode.stage_lengths(max_len)
  group = _group(len(batch.src), _hypotheses(decoding, num_results)) if stragglers else 0
  if group and len(rooms) > 1:
    # The first stage ends at its room's end or once at most half the batch is live: the
    # groups' rows then cost less than the finished rows would (docs/benchmarks-log.md).
    state, live = advance(params, state, rooms[0], len(batch.src) // 2 + 1, projection,
                          config=config, **settings)
    return _by_groups(params, projection, state, live, group, max_len, config=config,
                      **settings)
  if stragglers and len(rooms) > 2:
    rooms = [rooms[0], rooms[-1]]
  for room in rooms:
    state, _ = advance(params, grow(state, room=room), room, 1, projection, config=config,
                       **settings)
  return finish(state, **settings)


def _group(rows: int, hypotheses: int) -> int:
  """Sentences a group of a batch's stragglers (`_by_groups`), or 0: at all rows (fewer
  than MIN_ROWS, a server's request or a terminal's line, where a group would be all of them
  or one). A row a sentence (greedy search, one sample) steps a group of a few rows at
  nearly the cost of all of them, so its groups are twice a beam search's: as fast on the
  models measured, and a model that never ends its sentences loses less by them
  (docs/benchmarks-log.md)."""
  if rows < MIN_ROWS:
    return 0
  return max(1, rows // (STRAGGLER_GROUPS if hypotheses > 1 else GREEDY_GROUPS))


def _by_groups(params: Any, projection: Array | None, state: Any, live: Array, group: int,
               room: int, *, config: TransformerConfig, decoding: DecodingConfig,
               num_results: int | None) -> tuple[Array, Array]:
  """finish's results of a batch whose `live` [B] sentences go on from `state`, `group` at a
  time, each group to its own end in a cache of `room` positions.

  On a CPU every row costs its share of a step, finished or not, and most of a batch's
  sentences end within the first stage while a few run on: they would hold all its rows to
  their end. A group's rows are gathered with their whole state (decode.take_sentences); a
  sentence that is not live keeps the results it has (decode's "common frame"). One cache
  room for the groups (rather than stages) keeps the program's loops, and so its compile, as
  few as the search at all rows has; a group's few rows attend over it cheaply. Where every
  sentence runs on to the same end (a model that never ends a sentence), the groups cost more
  than all rows would (docs/BENCHMARKS.md); translations end apart."""
  settings = {'decoding': decoding, 'num_results': num_results}
  count, searching = live.shape[0], jnp.sum(live)
  # The live sentences first, in order; whole groups, padded with the last sentence (one that
  # is done when any is), whose extra rows are searched but never kept.
  order = jnp.pad(jnp.argsort(~live, stable=True), (0, -count % group), mode='edge')

  def one(i: Array, found: tuple[Array, Array]) -> tuple[Array, Array]:
    taken = jax.lax.dynamic_slice_in_dim(order, i * group, group)
    part = grow(decode.take_sentences(state, taken, count), room=room)
    part, _ = advance(params, part, room, 1, projection, config=config, **settings)
    kept = jnp.where(i * group + jnp.arange(group) < searching, taken, count)  # count: dropped
    return jax.tree.map(lambda x, y: x.at[kept].set(y, mode='drop'), found,
                        finish(part, **settings))

  return jax.lax.fori_loop(0, (searching + group - 1) // group, one, finish(state, **settings))


# --- in segments, finished sentences leaving ------------------------------------------------------


class Segmented:
  """A search run in segments (the module's docstring), for one model shape
  and `decoding` (without its seed): its programs, compiled per shape on first use and counted
  (`compiled`). Called as decode_batch is, with numpy results.

  The batches `_in_one_program` names are searched in one program (decode_batch's) all the
  same: there leaving costs more (each segment's call, its results, the gather of the cache)
  than the finished rows do."""

  def __init__(self, config: TransformerConfig, decoding: DecodingConfig):
    self._decoding = decoding
    jit = lambda name, fn, *static, donate=(): compilation.Programs(name, jax.jit(  # noqa: E731
        functools.partial(fn, decoding=decoding), static_argnames=static,
        donate_argnames=donate))
    self._whole = jit('the search', functools.partial(decode_batch, config=config,
                                                      stragglers=True),  # (a CPU's: 2 loops)
                      'max_len', 'num_results')
    self._start = jit('the search (start)', functools.partial(start, config=config),
                      'max_len', 'num_results')
    self._grow = compilation.Programs('the search (room)', jax.jit(
        grow, static_argnames='room'))
    # The steps' state is given up (donated): they update its buffers in place rather than
    # copy the whole cache first, which costs about what a step does on a small model.
    self._advance = jit('the search (steps)', functools.partial(advance, config=config),
                        'num_results', donate='state')
    self._take = jit('the search (rows)', take, 'num_results')
    self._finish = jit('the search (results)', finish, 'num_results')
    self._programs = (self._whole, self._start, self._grow, self._advance, self._take,
                      self._finish)

  @property
  def compiled(self) -> list[tuple[str, float]]:
    """(description, seconds) of each program compiled, as compilation.Programs'."""
    return [entry for programs in self._programs for entry in programs.compiled]

  def _in_one_program(self, rows: int, num_results: int | None) -> bool:
    """Whether a batch of `rows` sentences is searched in one program rather than in
    segments: one of fewer than MIN_ROWS rows (a server's request, a terminal's line), or one
    of a row a sentence (greedy search, one sample), whose step costs a few times less than a
    beam's (measured in docs/benchmarks-log.md)."""
    return rows < MIN_ROWS or _hypotheses(self._decoding, num_results) == 1

  def compile(self, params: Any, batch: Batch, projection: Array | None = None, *, max_len: int,
              num_results: int | None = None) -> None:
    """Compiles the programs a batch of these arguments takes while all its rows are live
    (those of fewer rows compile when a search first needs them), running nothing."""
    rest = {'num_results': num_results}
    if self._in_one_program(len(batch.src), num_results):
      self._whole.compile(params, batch, projection, max_len=max_len, **rest)
      return
    self._start.compile(params, batch, projection, max_len=max_len, **rest)
    state = _shapes(lambda *a: self._start.transformed(*a, max_len=max_len, **rest), params,
                    batch, projection)
    for room in decode.stage_lengths(max_len):
      if _room(state) < room:
        self._grow.compile(state, room=room)
        state = _shapes(lambda s, room=room: grow(s, room=room), state)
      self._advance.compile(params, state, np.int32(0), np.int32(0), projection, **rest)
    self._finish.compile(state, **rest)

  def __call__(self, params: Any, batch: Batch, projection: Array | None = None, *,
               max_len: int, num_results: int | None = None) -> tuple[Any, Any]:
    rest = {'num_results': num_results}
    if self._in_one_program(len(batch.src), num_results):
      return self._whole(params, batch, projection, max_len=max_len, **rest)
    state = self._start(params, batch, projection, max_len=max_len, **rest)
    rows = np.arange(len(batch.src))  # the batch row each row of the state holds; -1: none
    found = _Found(len(rows))
    for room in decode.stage_lengths(max_len):
      if _room(state) < room:
        state = self._grow(state, room=room)
      while True:  # until the stage's end, or until the live sentences fit in fewer rows
        fewer = len(rows) // SHRINK  # rows after the next shrink
        state, live = self._advance(params, state, np.int32(room), np.int32(fewer + 1),
                                    projection, **rest)
        live = np.asarray(live)
        if live.sum() > fewer:  # the stage's end
          break
        size = _rows(int(live.sum()), len(rows))
        found.put(rows, ~live, self._finish(state, **rest))
        if not live.any():
          return found.results()
        index = _kept(live, size)
        state = self._take(state, index, **rest)
        rows = np.where(np.arange(size) < live.sum(), rows[index], -1)
    found.put(rows, rows >= 0, self._finish(state, **rest))
    return found.results()


def _shapes(fn: Any, *args: Any) -> Any:
  """fn's outputs as a jitted fn returns them (shapes, dtypes, one device's sharding), to
  compile the next program for them without running fn."""
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                      jax.eval_shape(fn, *args))


def _rows(sentences: int, rows: int) -> int:
  """The rows for `sentences` live ones of a state of `rows`: rows / SHRINK^k, the fewest that
  hold them (0 for none)."""
  while sentences and rows // SHRINK >= sentences:
    rows //= SHRINK
  return rows if sentences else 0


def _kept(live: np.ndarray, size: int) -> np.ndarray:
  """The rows of the live sentences, in order, then repeats of a done one up to `size` (rows
  that are never live, whose results are never read)."""
  keep = np.flatnonzero(live)
  return np.concatenate([keep, np.full(size - len(keep), np.argmin(live))]).astype(np.int32)


class _Found:
  """A segmented search's results, gathered in the batch's order as its sentences leave."""

  def __init__(self, batch: int):
    self.batch, self.arrays = batch, None

  def put(self, rows: np.ndarray, which: np.ndarray, found: tuple[Array, Array]) -> None:
    """The results `found` of the state's rows `which`, which hold the batch's rows `rows`."""
    found = jax.device_get(found)
    if self.arrays is None:
      self.arrays = [np.zeros((self.batch, *x.shape[1:]), x.dtype) for x in found]
    which = which & (rows >= 0)
    for out, x in zip(self.arrays, found):
      out[rows[which]] = x[which]

  def results(self) -> tuple[Any, Any]:
    """As decode_batch returns them: (ids, scores)."""
    return tuple(self.arrays)
