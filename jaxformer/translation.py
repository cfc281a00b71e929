"""Translating text with a trained model, and scoring given translations: the compiled search
and scoring programs, and `Translator` (batches in the shapes of jaxformer.shapes, n-best,
samples, forced prefixes, scores; loading from a checkpoint or an exported folder). Decoding
follows §6.1 by default: beam 4, alpha 0.6, at most the source length + 50 tokens
(jaxformer.config.DecodingConfig).
"""

import dataclasses
import functools
import logging
import math
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer import compilation, export, layout, losses, protocol, search, shapes, text
from jaxformer.config import DecodingConfig, SettingError, TransformerConfig
from jaxformer.data.tokenizer import EOS_ID, Tokenizer
from jaxformer.errors import DataError
from jaxformer.model import Transformer, output_projection
from jaxformer.search import cached_tokens_to_logits, decode_batch  # noqa: F401  (their old home)
from jaxformer.shapes import MAX_WORKERS, default_workers, fixed_shapes_on  # noqa: F401  (idem)

Array = jax.Array
log = logging.getLogger(__name__)


# --- the compiled programs ---------------------------------------------------------------------


SCORE_CHUNK = 256  # target positions projected at a time when scoring
SCORE_ROW = 128  # a score's rows hold this many tokens a side (fewer if max_len is), or more


def target_log_probs(params: Any, src: Array, tgt: Array, where: layout.Layout | None = None, *,
                     config: TransformerConfig, chunk: int = SCORE_CHUNK) -> Array:
  """Forced decoding: the log-probability [B, T] of each target token tgt [B, T] (its pieces,
  then EOS, then padding 0, whose entries are 0) given the source src [B, S] and the tokens
  before it, from one teacher-forced pass, as training computes its loss. With `where` (a
  jaxformer.layout.Layout), rows hold several pairs each, as training packs them.

  The softmax projection runs over `chunk` positions at a time, each one's log-probability its
  logit less the log-sum-exp of its row, as the training loss projects in chunks: the
  [B, T, V] logits and their log-softmax are never written whole, so a large batch of packed
  rows stays in the caches (measured in docs/benchmarks-log.md)."""
  model = Transformer(config)
  tgt_in = jnp.pad(tgt[:, :-1], ((0, 0), (1, 0)))  # decoding starts from token 0
  if where is not None:  # ... for every pair of a row
    tgt_in = jnp.where(where.tgt_positions == 0, 0, tgt_in)
  hidden = model.apply({'params': params}, src, tgt_in, where, method=Transformer.forward_hidden)

  def chunk_log_probs(chunk_of: tuple[Array, Array]) -> Array:
    states, targets = chunk_of  # [C, D], [C]
    logits = model.apply({'params': params}, states, method=Transformer.logits)  # [C, V]
    chosen = jnp.take_along_axis(logits, targets[:, None], axis=-1)[:, 0]
    return chosen - jax.nn.logsumexp(logits, axis=-1)

  positions = tgt.size
  chunk = min(chunk, positions)
  log_probs = jax.lax.map(chunk_log_probs, (losses.chunks(hidden.reshape(positions, -1), chunk),
                                            losses.chunks(tgt.reshape(-1), chunk)))
  return jnp.where(tgt > 0, log_probs.reshape(-1)[:positions].reshape(tgt.shape), 0.0)


fixed_shapes = fixed_shapes_on  # its name before Translator took a setting of that name


@functools.lru_cache(maxsize=32)  # (a server's requests may ask for several sampling settings)
def _jitted_search(config: TransformerConfig, decoding: DecodingConfig, fixed: bool
                   ) -> compilation.Programs | search.Segmented:
  """The search of one model shape and `decoding` (without its seed, which the programs take as
  an input), made once per process: Translators of equal settings (a run's evaluations, a
  second run) reuse its compiled programs. A batch's whole search in one program, or with
  decoding.drop_finished (and shapes not fixed: fixed_shapes_on) in segments, finished
  sentences leaving (jaxformer.search); where shapes are not fixed (a CPU) and unless
  decoding.all_rows, a batch's stragglers go on in groups (search.decode_batch's
  `stragglers`)."""
  if decoding.drop_finished and not fixed:
    return search.Segmented(config, decoding)
  return compilation.Programs('the search', jax.jit(
      functools.partial(search.decode_batch, config=config, decoding=decoding,
                        stragglers=not (fixed or decoding.all_rows)),
      static_argnames=('max_len', 'num_results')))


@functools.lru_cache(maxsize=8)
def _jitted_scores(config: TransformerConfig) -> compilation.Programs:
  """target_log_probs jitted for one model shape, made once per process."""
  return compilation.Programs('the scores', jax.jit(
      functools.partial(target_log_probs, config=config)))


@dataclasses.dataclass(frozen=True)
class TargetScore:
  """The model's log-probability of one target given its source (forced decoding): natural
  log, summed over the target's sentencepiece pieces and its EOS."""
  log_prob: float          # nan when skipped
  tokens: int              # pieces + EOS: what log_prob sums over
  token_log_probs: tuple[float, ...]  # each piece's, then EOS's; () when skipped
  skipped: str | None = None          # why this pair was not scored (too long for the model)

  @property
  def mean(self) -> float:
    """log_prob / tokens: the per-token log-probability (nan when skipped)."""
    return self.log_prob / self.tokens

  def as_dict(self, token_log_probs: bool = False) -> dict[str, Any]:
    """JSON-able fields (None for nan), with each token's log-probability if asked."""
    fields = {'log_prob': None if self.skipped else self.log_prob, 'tokens': self.tokens,
              'mean': None if self.skipped else self.mean}
    if token_log_probs:
      fields['token_log_probs'] = list(self.token_log_probs)
    return {**fields, **({'skipped': self.skipped} if self.skipped else {})}


def _texts(texts: Sequence[str], what: str) -> Sequence[str]:
  """`texts`, a sequence of strings; TypeError otherwise, naming the first that is not: a lone
  string would be read as one sentence a character, and sentencepiece's own error names no
  index."""
  if isinstance(texts, (str, bytes)):
    raise TypeError(f'{what} must be a list of strings, one a sentence, got one '
                    f'{type(texts).__name__}: wrap it in a list ([text]).')
  bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
  if bad is not None:
    raise TypeError(f'{what}[{bad}] is {type(texts[bad]).__name__}, not a string.')
  return texts


class Translator:
  """Translates text with a model and its sentencepiece vocabulary, and scores given
  translations. `decoding` (a DecodingConfig; by default the paper's beam 4, alpha 0.6, at most
  input + 50 tokens), with any of its fields given by name changed, says how. Batches of its
  batch_size sentences are searched by `workers` threads side by side (default_workers());
  outputs keep the inputs' order whatever the workers. `fixed_shapes`: every batch in one
  shape, searched in one program (default: on an accelerator; see fixed_shapes_on)."""

  def __init__(self, params: Any, config: TransformerConfig, tokenizer: Tokenizer,
               decoding: DecodingConfig | None = None, *, workers: int | None = None,
               fixed_shapes: bool | None = None, step: int | None = None, **settings: Any):
    self.params = _on_device(params)
    self.step = step  # the model's training step, when loaded (`load`)
    self.config, self.tokenizer = config, tokenizer
    self.decoding = (decoding or DecodingConfig()).replace(**settings)
    if workers is not None and (type(workers) is not int or workers < 1):
      raise SettingError(f'workers must be an integer >= 1, got {workers!r}.')
    self.workers = default_workers() if workers is None else workers
    self.fixed_shapes = fixed_shapes_on() if fixed_shapes is None else fixed_shapes
    self._search = _jitted_search(config, self.decoding.replace(seed=None), self.fixed_shapes)
    self._scores = _jitted_scores(config)

  @classmethod
  def load(cls, path: str, average_last: int | None = None, **kwargs: Any) -> 'Translator':
    """From any model path (export.load_model's kinds: a workdir, its checkpoints folder, an
    averaged checkpoint, an export); with average_last, the mean of a workdir's last N
    checkpoints. Its `step` is the model's training step."""
    params, config, spm_model, step = export.load_model(path, average_last)
    return cls(params, config, Tokenizer.from_bytes(spm_model, f'the vocabulary of {path}'),
               step=step, **kwargs)

  @classmethod
  def from_checkpoint(cls, path: str, average_last: int | None = None,
                      **kwargs: Any) -> 'Translator':
    """`load` (its older name, for a workdir or checkpoint)."""
    return cls.load(path, average_last, **kwargs)

  @classmethod
  def from_pretrained(cls, path: str, **kwargs: Any) -> 'Translator':
    """`load` (its older name, for a folder written by `jaxformer export`)."""
    return cls.load(path, **kwargs)

  def replace(self, params: Any = None, **settings: Any) -> 'Translator':
    """This translator over other params (a run's evaluations: one per checkpoint) or with
    some decoding settings changed (a server's request); the rest as it is."""
    translator = Translator(self.params if params is None else params, self.config,
                            self.tokenizer, self.decoding.replace(**settings),
                            workers=self.workers, fixed_shapes=self.fixed_shapes,
                            step=self.step if params is None else None)
    if params is None and '_projection' in vars(self):  # made once for these weights
      translator._projection = self._projection  # pylint: disable=protected-access
    return translator

  # --- translating --------------------------------------------------------------------------------

  def translate(self, sentences: Sequence[str], progress: bool = False, *,
                prefixes: Sequence[str] | None = None, first_index: int = 0) -> list[str]:
    """One output line per input line; blank inputs give empty outputs without decoding.

    A source longer than the model's max_len (with its EOS) is cut to that length, with a
    warning naming the lines (0-based indices); outputs stop at max_len tokens as well. With
    `prefixes` (one a sentence; '' for none), each output starts with its prefix's pieces and
    is searched from there. `first_index` is sentences[0]'s index in the whole input, from
    which sampling's keys are made: give it when translating an input in parts.
    """
    return self.tokenizer.decode(self.translate_ids(sentences, progress, prefixes=prefixes,
                                                    first_index=first_index))

  def translate_ids(self, sentences: Sequence[str], progress: bool = False, *,
                    prefixes: Sequence[str] | None = None, first_index: int = 0
                    ) -> list[list[int]]:
    """As translate, but the output pieces' ids (without EOS; [] for a blank input)."""
    out: list[list[int]] = [[] for _ in sentences]
    for chosen, ids, _ in self._searches(sentences, progress, None, prefixes, first_index):
      for i, row in zip(chosen, _until_eos(ids)):
        out[i] = row
    return out

  def translate_nbest(self, sentences: Sequence[str], n: int, progress: bool = False, *,
                      prefixes: Sequence[str] | None = None, first_index: int = 0
                      ) -> list[list[tuple[str, float]]]:
    """The n best translations of each sentence with their scores (log-probability / GNMT
    length penalty, the length counting EOS), best first; [] for a blank sentence. Needs
    n <= beam_size. With sampling: n samples in the order drawn, each scored by its
    log-probability (no length penalty), as `score` would score it."""
    protocol.check_nbest(n, self.decoding)
    out: list[list[tuple[str, float]]] = [[] for _ in sentences]
    for chosen, ids, scores in self._searches(sentences, progress, n, prefixes, first_index):
      texts = self.tokenizer.decode(ids.reshape(-1, ids.shape[-1]))
      for row, i in enumerate(chosen):
        out[i] = list(zip(texts[row * n:(row + 1) * n], map(float, scores[row])))
    return out

  def _searches(self, sentences: Sequence[str], progress: bool, num_results: int | None,
                prefixes: Sequence[str] | None, first_index: int
                ) -> Iterator[tuple[list[int], np.ndarray, np.ndarray | None]]:
    """(indices, ids, scores or None) per decoded batch."""
    ids = self._sources(sentences)
    forced = self._prefixes(prefixes, len(sentences), first_index)
    todo = [i for i, x in enumerate(ids) if x or forced[i]]

    def run_batch(chosen: list[int], peers: list[list[int]]
                  ) -> tuple[np.ndarray, np.ndarray | None]:
      args, static = self._search_arguments(chosen, peers, ids, forced, first_index,
                                            num_results)
      found, scores = jax.device_get(self._search(*args, **static))
      return found[:len(chosen)], None if num_results is None else scores[:len(chosen)]

    batches = self._batches(todo, [len(x) for x in ids])
    for chosen, (found, scores) in shapes.run_batches(batches, self.workers, run_batch, progress,
                                                      'translating'):
      yield chosen, found, scores

  def compile_ahead(self, sentences: Sequence[str], num_results: int | None = None) -> None:
    """Compiles the searches that translating `sentences` takes (translate, or translate_nbest
    with num_results) without running them, e.g. in a background thread: a training run's
    first validation then finds its search compiled."""
    ids = self._sources(sentences)
    forced = [[] for _ in ids]
    batches = self._batches([i for i, x in enumerate(ids) if x], [len(x) for x in ids])
    for chosen in batches:
      args, static = self._search_arguments(
          chosen, shapes.peers(batches, chosen, self.workers), ids, forced, 0, num_results)
      self._search.compile(*args, **static)

  def _batches(self, todo: list[int], lengths: list[int]) -> list[list[int]]:
    """`todo`'s batches for this Translator's batch_size and workers (shapes.groups)."""
    return shapes.groups(todo, lengths, self.decoding.batch_size, self.workers)

  def _search_arguments(self, chosen: list[int], peers: list[list[int]], ids: list[list[int]],
                        forced: list[list[int]], first_index: int, num_results: int | None
                        ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """decode_batch's arguments and static arguments for the sentences `chosen` of `ids`, in
    the shape of the largest of `peers` (shapes.peers)."""
    cfg, decoding = self.config, self.decoding
    rows = [ids[i] + [EOS_ID] for i in chosen]
    length = {i: max(len(ids[i]), len(forced[i])) + 1 for peer in peers for i in peer}
    lengths = [length[i] for i in chosen]
    size, width = shapes.shape(list(length.values()), max(map(len, peers)), decoding.batch_size,
                               cfg.max_len, self.fixed_shapes)
    max_len = min(width + decoding.extra_length, cfg.max_len)
    padded = shapes.padded
    max_lengths = padded([[n + decoding.extra_length] for n in lengths], (size, 1))[:, 0]
    prefix = None if not any(forced) else padded([forced[i] for i in chosen], (size, max_len))
    indices = padded([[first_index + i] for i in chosen], (size, 1))[:, 0]
    batch = search.Batch(padded(rows, (size, width)), np.minimum(max_lengths, max_len), prefix,
                         np.uint32(decoding.seed or 0), indices)
    return (self.params, batch, self._projection), {'max_len': max_len,
                                                     'num_results': num_results}

  @functools.cached_property
  def _projection(self) -> Any:
    """The searches' output projection (model.output_projection) on a CPU, made once for
    these weights; None elsewhere, where it was not measured faster."""
    if jax.default_backend() != 'cpu':
      return None
    if isinstance(self.params['embed']['embedding'], jax.ShapeDtypeStruct):  # to compile ahead
      return _on_device(jax.eval_shape(output_projection, self.params))
    return output_projection(self.params)

  def _sources(self, sentences: Sequence[str]) -> list[list[int]]:
    """The sentences' pieces, each cut to the model's max_len with its EOS (with a warning)."""
    ids = self.tokenizer.encode(_texts(sentences, 'sentences'))
    limit = self.config.max_len - 1  # pieces, leaving room for EOS
    cut = [i for i, x in enumerate(ids) if len(x) > limit]
    if cut:
      log.warning('%d source(s) longer than the model\'s %d tokens were cut to that length '
                  '(indices %s%s).', len(cut), self.config.max_len,
                  ', '.join(map(str, cut[:10])), ', ...' if len(cut) > 10 else '')
      for i in cut:
        ids[i] = ids[i][:limit]
    return ids

  def _prefixes(self, prefixes: Sequence[str] | None, count: int, first_index: int
                ) -> list[list[int]]:
    """The prefixes' pieces ([] each without prefixes); DataError for a count that is not the
    sentences' or a prefix that leaves no room for EOS."""
    if prefixes is None:
      return [[] for _ in range(count)]
    if len(_texts(prefixes, 'prefixes')) != count:
      raise DataError(f'{len(prefixes)} prefixes for {count} sentences: give one a sentence '
                      "('' for none).")
    ids = self.tokenizer.encode_target(prefixes)
    for i, pieces in enumerate(ids):
      if len(pieces) >= self.config.max_len:
        raise DataError(f'the prefix of sentence {first_index + i + 1} has {len(pieces)} '
                        f"pieces; the model's outputs hold at most {self.config.max_len - 1} "
                        'and EOS.')
    return ids

  def run(self, request: protocol.Request, progress: bool = False) -> list[Any]:
    """The answer to a request (protocol's): translations, n-best lists or TargetScores, as
    translate, translate_nbest or score give them, with the request's search settings."""
    if isinstance(request, protocol.ScoreRequest):
      return self.score(request.src, request.tgt, progress)
    model = self.replace(**dataclasses.asdict(request.decoding(self.decoding))) \
        if request.settings else self
    if request.nbest is None:
      return model.translate(request.src, progress, prefixes=request.prefix,
                             first_index=request.first_index)
    return model.translate_nbest(request.src, request.nbest, progress, prefixes=request.prefix,
                                 first_index=request.first_index)

  # --- scoring -----------------------------------------------------------------------------------

  def score(self, sources: Sequence[str], targets: Sequence[str], progress: bool = False
            ) -> list[TargetScore]:
    """The model's log-probability of each target given its source (natural log, summed over
    the target's pieces and EOS, as `translate_nbest` scores before its length penalty): one
    TargetScore a pair, in order. A pair whose source or target (with EOS) is longer than the
    model's max_len is not scored but marked (`skipped` says why), never dropped. DataError for
    a count that differs or an empty target (a blank source is scored as an empty one)."""
    text.check_pairs(_texts(sources, 'sources'), _texts(targets, 'targets'))
    src_ids, tgt_ids = self.tokenizer.encode(sources), self.tokenizer.encode_target(targets)
    if empty := [i + 1 for i, t in enumerate(tgt_ids) if not t]:
      raise DataError(f'target {empty[0]} is empty ({len(empty)} empty in all): there is '
                      'nothing to score; remove or fill it.')
    limit = self.config.max_len
    out: list[TargetScore | None] = [None] * len(sources)
    for i, (src, tgt) in enumerate(zip(src_ids, tgt_ids)):
      if len(src) >= limit or len(tgt) >= limit:
        side, pieces = ('source', len(src)) if len(src) >= limit else ('target', len(tgt))
        out[i] = TargetScore(math.nan, len(tgt) + 1, (), f'the {side} has {pieces} pieces and '
                             f"EOS, more than the model's {limit} tokens")
    if skipped := [i for i, s in enumerate(out) if s]:
      log.warning('%d of %d pairs were not scored, longer than the model\'s %d tokens (indices '
                  '%s%s): their scores are none.', len(skipped), len(out), limit,
                  ', '.join(map(str, skipped[:10])), ', ...' if len(skipped) > 10 else '')
    todo = [i for i, s in enumerate(out) if s is None]
    pairs = [(src_ids[i] + [EOS_ID], tgt_ids[i] + [EOS_ID]) for i in todo]  # as `todo`
    # Pairs are packed into rows of one width (jaxformer.layout), so that a whole call compiles
    # one program (two when shapes.groups' even batches fall either side of a power of two, as 17
    # and 16 rows) and pads little.
    longest = max((len(side) for pair in pairs for side in pair), default=1)
    width = limit if self.fixed_shapes else min(limit, max(SCORE_ROW, shapes.bucket(longest)))
    rows = layout.first_fit([(len(src), len(tgt)) for src, tgt in pairs], width)

    def run(chosen: list[int], peers: list[list[int]]) -> np.ndarray:
      size, _ = shapes.shape([width], max(map(len, peers)), self.decoding.batch_size, limit,
                             self.fixed_shapes)
      src, tgt, where = layout.packed([[pairs[j] for j in rows[r]] for r in chosen], size,
                                      width)
      return np.asarray(self._scores(self.params, src, tgt, where))

    # (first_fit gives the rows longest first: their order is the batches' order.)
    batches = self._batches(list(range(len(rows))), [0] * len(rows))
    for chosen, log_probs in shapes.run_batches(batches, self.workers, run, progress, 'scoring',
                                                lambda chosen: sum(len(rows[r]) for r in chosen)):
      for r, row in enumerate(chosen):
        start = 0
        for j in rows[row]:
          tokens = len(pairs[j][1])
          each = log_probs[r, start:start + tokens].astype(float)
          out[todo[j]] = TargetScore(float(each.sum()), tokens, tuple(map(float, each)))
          start += tokens
    return out


def _on_device(params: Any) -> Any:
  """The weights on jax's default device, once: numpy weights (a loaded checkpoint's) would be
  copied to it again by every program call. Arrays are committed to that device, and shapes
  alone (to compile ahead) get its sharding, so that the programs are one whoever made the
  weights: a training run's validation compiles (and leaves in the compilation cache) the
  search that an eval of its checkpoints then calls (an uncommitted array lowers without the
  sharding, another program to jax's cache)."""
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  def put(x: Any) -> Any:
    if isinstance(x, jax.ShapeDtypeStruct):
      return x if x.sharding is not None else jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                                   sharding=device)
    return jax.device_put(x, device) if isinstance(x, (np.ndarray, jax.Array)) else x
  return jax.tree.map(put, params)


def _until_eos(ids: np.ndarray) -> list[list[int]]:
  """Each searched row's ids [B, T] before its EOS (or its padding), found for the whole batch
  at once: row by row in Python was a measurable part of a small model's call
  (docs/benchmarks-log.md)."""
  ends = np.argmax(np.pad(ids, ((0, 0), (0, 1))) <= EOS_ID, axis=1)
  return [row[:end].tolist() for row, end in zip(ids, ends)]
