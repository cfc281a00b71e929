"""jaxformer.search: the segmented search, whose finished sentences leave, and the one program's
groups of stragglers, against the search of a batch at all its rows in one program."""

import collections
import functools
import re

import jax
import numpy as np
import pytest
from helpers import CFG

from jaxformer import model as model_lib
from jaxformer import search
from jaxformer.config import DecodingConfig
from jaxformer.model import Transformer

MAX_LEN = 24  # two stages: 16, 24


@pytest.fixture(scope='module')
def params():
  dummy = np.ones((1, 8), np.int32)
  return jax.jit(Transformer(CFG).init)(jax.random.key(0), dummy, dummy)['params']


def _batch(rows: int = search.MIN_ROWS, max_lengths: np.ndarray | None = None,
           prefixed: int = 1) -> search.Batch:
  """rows sentences (one of them padding: nothing to search) whose limits end them at many
  steps, so that 8 rows shrink to 2 and end in 2; row `prefixed` with a forced prefix."""
  rng = np.random.default_rng(0)
  src = rng.integers(3, CFG.vocab_size, (rows, 12)).astype(np.int32)
  src[:, 9:] = 0
  if max_lengths is None:
    max_lengths = np.array([3, 24, 5, 9, 2, 12, 7, 0][:rows], np.int32)
  prefix = np.zeros((rows, MAX_LEN), np.int32)
  prefix[prefixed, :3] = [7, 8, 9]
  return search.Batch(src, max_lengths, prefix, np.uint32(5), np.arange(rows, dtype=np.int32))


@pytest.mark.parametrize('decoding, num_results', [
    (DecodingConfig(beam_size=2), None), (DecodingConfig(beam_size=3, alpha=0.6), 2),
    (DecodingConfig(sampling=True, top_k=20), 2)], ids=['beam', 'beam-nbest', 'samples'])
def test_segments_give_the_one_programs_outputs(params, decoding, num_results):
  """Beam search, its n best and samples (keys follow their sentences into fewer rows), with
  a forced prefix and a padding row: the same ids, the same scores up to float rounding."""
  batch = _batch()
  whole = jax.device_get(jax.jit(lambda *a: search.decode_batch(
      *a, config=CFG, max_len=MAX_LEN, decoding=decoding, num_results=num_results))(
          params, batch))
  segmented = search.Segmented(CFG, decoding)
  found = segmented(params, batch, max_len=MAX_LEN, num_results=num_results)
  np.testing.assert_array_equal(found[0], whole[0])
  for ours, theirs in zip(found[1:], whole[1:]):
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
  assert found[0][1].reshape(-1, MAX_LEN)[0, :3].tolist() == [7, 8, 9]  # the prefix
  rows = {int(re.search(r'(\d+)x12\]', what)[1])  # the sources [rows, 12], the state's last
          for what, _ in segmented.compiled if what.startswith('the search (steps)')}
  per = num_results if decoding.sampling else 1  # a sentence's samples are rows of their own
  assert rows == {8 * per, 2 * per}, segmented.compiled  # 8 sentences, then 8 / SHRINK


@pytest.mark.parametrize('decoding, rows', [(DecodingConfig(), 4),
                                             (DecodingConfig(beam_size=1), search.MIN_ROWS)],
                         ids=['few-rows', 'greedy'])
def test_few_rows_and_greedy_search_are_one_program(params, decoding, rows):
  segmented = search.Segmented(CFG, decoding)
  batch = _first_sentences(_batch(search.MIN_ROWS), rows)
  found = segmented(params, batch, max_len=MAX_LEN)
  assert [what.split(' [')[0] for what, _ in segmented.compiled] == ['the search']
  np.testing.assert_array_equal(found[0], jax.jit(lambda *a: search.decode_batch(
      *a, config=CFG, max_len=MAX_LEN, decoding=decoding))(params, batch)[0])


def test_compiling_ahead_leaves_the_full_rows_nothing_to_compile(params):
  segmented = search.Segmented(CFG, DecodingConfig(beam_size=2))
  batch = _batch()
  segmented.compile(params, batch, max_len=MAX_LEN)
  ahead = len(segmented.compiled)
  every_row_live = batch._replace(max_lengths=np.full(search.MIN_ROWS, MAX_LEN, np.int32))
  segmented(params, every_row_live, max_len=MAX_LEN)
  assert len(segmented.compiled) == ahead == 5  # start, steps in 16, room 24, its steps, results


def _first_sentences(batch: search.Batch, count: int) -> search.Batch:
  """The batch of `batch`'s first `count` sentences."""
  return batch._replace(**{name: getattr(batch, name)[:count]
                           for name in ('src', 'max_lengths', 'prefix', 'indices')})


def _long_tails() -> search.Batch:
  """32 sentences, most limited to the first stage (16 tokens), five to more (random weights
  seldom end a sentence earlier), one of the five with a forced prefix, one with a limit of 0."""
  max_lengths = np.random.default_rng(1).integers(2, 17, 32).astype(np.int32)
  max_lengths[[3, 8, 9, 20, 31]] = [17, 24, 19, 22, 20]
  max_lengths[5] = 0
  return _batch(32, max_lengths, prefixed=9)


@pytest.mark.parametrize('decoding, num_results', [
    (DecodingConfig(beam_size=3), None), (DecodingConfig(beam_size=3, alpha=0.6), 2),
    (DecodingConfig(sampling=True, top_k=20), 2), (DecodingConfig(beam_size=1), None),
    (DecodingConfig(sampling=True, top_k=20), None)],
    ids=['beam', 'beam-nbest', 'samples', 'greedy', 'one-sample'])
def test_stragglers_in_groups_give_the_same_outputs(params, decoding, num_results):
  """32 sentences, five of them past the first stage's room: those still live when the first
  stage ends go on four at a time (greedy search eight, the last group padded) in one
  program, and every output is the search's at all rows."""
  batch = _long_tails()
  rows = search._hypotheses(decoding, num_results)  # pylint: disable=protected-access
  group = search._group(32, rows)  # pylint: disable=protected-access
  assert group == (4 if rows > 1 else 8)
  def run(stragglers):
    fn = jax.jit(lambda *a: search.decode_batch(
        *a, config=CFG, max_len=MAX_LEN, decoding=decoding, num_results=num_results,
        stragglers=stragglers))
    grouped = f'tensor<{group * rows}x{MAX_LEN}xi32>' in fn.lower(params, batch).as_text()
    return grouped, jax.device_get(fn(params, batch))
  (grouped, found), (whole_grouped, whole) = run(True), run(False)
  assert grouped and not whole_grouped  # a group's state [4 sentences' rows, MAX_LEN] exists
  np.testing.assert_array_equal(found[0], whole[0])
  np.testing.assert_allclose(found[1], whole[1], rtol=1e-5)
  assert found[0][9].reshape(-1, MAX_LEN)[0, :3].tolist() == [7, 8, 9]  # the prefix
  lengths = (found[0].reshape(32, -1, MAX_LEN) > 0).sum(-1).max(-1)
  assert lengths[[8, 20]].tolist() == [24, 22]  # the stragglers ran on


@pytest.mark.parametrize('beam', [1, 3], ids=['greedy', 'beam'])
def test_the_first_stage_ends_once_half_the_batch_is_done(params, monkeypatch, beam):
  """Steps counted by their rows: the first stage's at all 32 sentences' rows end by the step
  at which the limits leave at most 16 sentences live (before the first stage's 16; random
  weights may end some sooner), and the groups' steps go on from there. Beam search's first
  step is one row a sentence (decode.Beam.first_step)."""
  steps = _counting_steps(monkeypatch)
  batch = _long_tails()
  jax.block_until_ready(jax.jit(lambda *a: search.decode_batch(
      *a, config=CFG, max_len=MAX_LEN, decoding=DecodingConfig(beam_size=beam),
      stragglers=True))(params, batch))
  jax.effects_barrier()
  half = next(s for s in range(MAX_LEN) if (batch.max_lengths > s).sum() <= 16)
  group = search._group(32, beam)  # pylint: disable=protected-access
  first = steps.pop(32) if beam > 1 else 0  # beam search's first step, at 32 rows
  assert first == (beam > 1) and 0 < first + steps[32 * beam] <= half < 16
  assert steps[group * beam] > 0 and set(steps) == {32 * beam, group * beam}


def _counting_steps(monkeypatch) -> collections.Counter:
  """A Counter that the searches compiled from here on count their decoder steps in, by the
  rows each step decodes."""
  steps, plain = collections.Counter(), search._tokens_to_logits  # pylint: disable=protected-access

  def counting(*args):
    fn = plain(*args)
    def step(tokens, cache):
      jax.debug.callback(functools.partial(steps.update, [tokens.shape[0]]))
      return fn(tokens, cache)
    return step
  monkeypatch.setattr(search, '_tokens_to_logits', counting)
  return steps


def test_a_batch_of_few_sentences_steps_all_its_beams_from_the_first(params, monkeypatch):
  """Beam search's first step is once a sentence in a batch of MIN_ROWS sentences, at every
  beam's row in a batch of fewer (a server's request: there it saves nothing measurable and
  costs a decoder step's compile); both find the same n best, prefix and limits included."""
  steps, decoding = _counting_steps(monkeypatch), DecodingConfig(beam_size=3, alpha=0.6)
  found, rows = {}, {}
  for count in (search.MIN_ROWS, 4):
    steps.clear()
    found[count] = jax.device_get(jax.jit(lambda *a: search.decode_batch(
        *a, config=CFG, max_len=MAX_LEN, decoding=decoding, num_results=2))(
            params, _first_sentences(_batch(), count)))
    jax.effects_barrier()
    rows[count] = set(steps)
  full = search.MIN_ROWS  # the steps' rows: sentences, or sentences x 3 beams
  assert rows == {full: {full, 3 * full}, 4: {3 * 4}}
  np.testing.assert_array_equal(found[4][0], found[full][0][:4])
  np.testing.assert_allclose(found[4][1], found[full][1][:4], rtol=1e-5)


@pytest.mark.parametrize('decoding, num_results', [
    (DecodingConfig(beam_size=3, alpha=0.6), 2), (DecodingConfig(beam_size=1), None)],
    ids=['beam-nbest', 'greedy'])
@pytest.mark.parametrize('segmented', [False, True], ids=['one-program', 'segments'])
def test_the_transposed_embedding_gives_the_same_outputs(params, decoding, num_results,
                                                         segmented):
  """A search given model.output_projection (a Translator's on a CPU) multiplies by it at
  every step, first stage and groups, and finds what it finds without."""
  batch, projection = _long_tails(), model_lib.output_projection(params)
  if segmented:
    run = functools.partial(search.Segmented(CFG, decoding), max_len=MAX_LEN,
                            num_results=num_results)
  else:
    run = jax.jit(functools.partial(search.decode_batch, config=CFG, max_len=MAX_LEN,
                                    decoding=decoding, num_results=num_results,
                                    stragglers=True))
    compiled = run.lower(params, batch, projection).compile().as_text()
    contracted = re.findall(rf'= f32\[\d+,{CFG.vocab_size}\]\{{1,0\}} dot\([^\n]*?'
                            r'rhs_contracting_dims=\{(\d)\}', compiled)
    # both loops' logits (and beam search's first step's): [rows, D] x [D, V], not x [V, D]
    assert contracted == ['0'] * (2 + (decoding.beam_size > 1))
  (ids, scores), (plain_ids, plain_scores) = (
      jax.device_get(run(params, batch, *extra)) for extra in ((projection,), ()))
  np.testing.assert_array_equal(ids, plain_ids)
  np.testing.assert_allclose(scores, plain_scores, rtol=1e-5)


@pytest.mark.parametrize('decoding, rows', [(DecodingConfig(beam_size=1), 4),
                                             (DecodingConfig(beam_size=3), 4)],
                         ids=['greedy', 'beam'])
def test_a_search_at_all_rows_goes_on_in_the_whole_room_after_its_first_stage(params, decoding,
                                                                             rows):
  """With `stragglers` (a CPU's default), a batch searched at all its rows (fewer than
  MIN_ROWS rows) runs its first stage (16 tokens) and then the rest of its 48 in one loop, two
  loops where stages of 16, 32 and 48 take three: the same ids."""
  long = _long_tails()
  max_lengths = long.max_lengths.copy()
  max_lengths[[1, 3, 8]] = [48, 40, 33]  # (rows 1 and 3 in the few rows)
  batch = long._replace(src=long.src[:rows], max_lengths=max_lengths[:rows],
                        prefix=np.pad(long.prefix[:rows], ((0, 0), (0, 24))),
                        indices=long.indices[:rows])
  def run(stragglers):
    fn = jax.jit(lambda *a: search.decode_batch(*a, config=CFG, max_len=48, decoding=decoding,
                                                stragglers=stragglers))
    return fn.lower(params, batch).as_text().count('stablehlo.while'), jax.device_get(
        fn(params, batch))
  (loops, found), (staged_loops, staged) = run(True), run(False)
  assert (loops, staged_loops) == (2, 3)
  np.testing.assert_array_equal(found[0], staged[0])
  np.testing.assert_allclose(found[1], staged[1], rtol=1e-5)
  assert (found[0][1] > 0).sum() > 32  # (a sentence that ran into the whole room)


def test_few_rows_have_no_groups():
  assert search._group(search.MIN_ROWS - 1, 4) == 0  # pylint: disable=protected-access
  assert search._group(search.MIN_ROWS, 4) == 1  # pylint: disable=protected-access
  assert search._group(64, 4) == 8  # pylint: disable=protected-access
  assert search._group(64, 1) == 16  # pylint: disable=protected-access
