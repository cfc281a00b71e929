"""Greedy and beam search against hand-built distributions and brute force."""

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer import _cpu_ops, decode

EOS = 1
# A Markov chain over {0 pad/start, 1 eos, 2 a, 3 b}: LOG_P[previous token, next token].
P = np.array([
    [0.0, 0.05, 0.55, 0.40],   # start: greedy takes a, but b leads to a likelier sentence
    [0.0, 1.00, 0.00, 0.00],   # after eos (never used)
    [0.0, 0.30, 0.35, 0.35],   # after a
    [0.0, 0.90, 0.05, 0.05],   # after b
])
LOG_P = np.log(np.where(P > 0, P, 1e-30))


def markov(tokens, cache):
  """tokens [N, 1] -> logits [N, V]; the cache counts calls (a shared scalar)."""
  return jnp.asarray(LOG_P, jnp.float32)[tokens[:, 0]], cache + 1


def brute_force_best(max_length: int, alpha: float) -> tuple[tuple[int, ...], float]:
  """Every sequence that ends in EOS or at max_length, scored log p / lp(length)."""
  best = ((), -math.inf)
  for n in range(1, max_length + 1):
    for seq in itertools.product((1, 2, 3), repeat=n):
      if EOS in seq[:-1] or (seq[-1] != EOS and n < max_length):
        continue
      log_p = sum(LOG_P[prev, tok] for prev, tok in zip((0,) + seq, seq))
      score = log_p / ((5 + n) / 6) ** alpha
      if score > best[1]:
        best = (seq, score)
  return best


def _beam(max_lengths, max_len, beam_size, alpha):
  return jax.jit(lambda ml: decode.beam_search(
      markov, jnp.int32(0), ml, max_len, beam_size=beam_size, alpha=alpha))(
          jnp.array(max_lengths, jnp.int32))


def test_greedy_takes_the_argmax_each_step():
  out = jax.jit(lambda ml: decode.greedy_search(markov, jnp.int32(0), ml, 6))(
      jnp.array([6, 2], jnp.int32))
  # start -> a (0.55); a -> a or b tie at 0.35: argmax takes the first (a); ... never eos
  np.testing.assert_array_equal(out, [[2, 2, 2, 2, 2, 2], [2, 2, 0, 0, 0, 0]])


def test_beam_finds_the_better_sentence_greedy_misses():
  seqs, scores = _beam([5], 5, beam_size=2, alpha=0.0)
  np.testing.assert_array_equal(seqs[0], [3, 1, 0, 0, 0])  # b eos: 0.4 * 0.9 = 0.36
  assert float(scores[0]) == pytest.approx(math.log(0.36), rel=1e-5)


@pytest.mark.parametrize('alpha', [0.0, 0.6, 2.0])
@pytest.mark.parametrize('max_length', [1, 2, 4])
def test_wide_beam_equals_brute_force(alpha, max_length):
  seq, score = brute_force_best(max_length, alpha)
  seqs, scores = _beam([max_length], 4, beam_size=8, alpha=alpha)
  assert tuple(int(t) for t in seqs[0][:len(seq)]) == seq
  assert np.all(np.asarray(seqs[0][len(seq):]) == 0)
  assert float(scores[0]) == pytest.approx(score, rel=1e-5)


def brute_force_ranking(max_length: int, alpha: float) -> list[tuple[tuple[int, ...], float]]:
  """Every sequence that ends in EOS or at max_length with its score, best first."""
  ranked = []
  for n in range(1, max_length + 1):
    for seq in itertools.product((1, 2, 3), repeat=n):
      if EOS in seq[:-1] or (seq[-1] != EOS and n < max_length):
        continue
      log_p = sum(LOG_P[prev, tok] for prev, tok in zip((0,) + seq, seq))
      ranked.append((seq, log_p / ((5 + n) / 6) ** alpha))
  return sorted(ranked, key=lambda item: -item[1])


@pytest.mark.parametrize('alpha', [0.0, 0.6])
def test_n_best_equals_the_brute_force_ranking(alpha):
  expected = brute_force_ranking(3, alpha)[:3]
  seqs, scores = jax.jit(lambda ml: decode.beam_search(
      markov, jnp.int32(0), ml, 4, beam_size=8, alpha=alpha, num_results=3))(
          jnp.array([3], jnp.int32))
  assert seqs.shape == (1, 3, 4) and scores.shape == (1, 3)
  for (seq, score), got, got_score in zip(expected, seqs[0], scores[0]):
    assert tuple(int(t) for t in got[:len(seq)]) == seq and not np.any(got[len(seq):])
    assert float(got_score) == pytest.approx(score, rel=1e-5)


def test_n_best_fills_with_live_beams_when_the_limit_cuts_the_search():
  # max_len 1 < max_lengths: only "eos" finishes; the live "a" and "b" follow it, best first.
  seqs, scores = jax.jit(lambda ml: decode.beam_search(
      markov, jnp.int32(0), ml, 1, beam_size=3, alpha=0.0, num_results=3))(
          jnp.array([5], jnp.int32))
  np.testing.assert_array_equal(seqs[0, :, 0], [1, 2, 3])
  np.testing.assert_allclose(scores[0], np.log([0.05, 0.55, 0.40]), rtol=1e-5)


def test_length_penalty_changes_the_winner():
  # Without a penalty the short "b eos" wins; a strong penalty favours longer sentences.
  short, _ = brute_force_best(4, 0.0)
  long, _ = brute_force_best(4, 8.0)
  assert short == (3, 1) and len(long) > 2
  for alpha, want in ((0.0, short), (8.0, long)):
    seqs, _ = _beam([4], 4, beam_size=8, alpha=alpha)
    assert tuple(int(t) for t in seqs[0][:len(want)]) == want


def test_beam_size_one_equals_greedy():
  greedy = jax.jit(lambda ml: decode.greedy_search(markov, jnp.int32(0), ml, 6))(
      jnp.array([6, 3], jnp.int32))
  seqs, _ = _beam([6, 3], 6, beam_size=1, alpha=0.6)
  np.testing.assert_array_equal(seqs, greedy)


def test_each_sentence_keeps_its_own_length_limit():
  seqs, _ = _beam([1, 2, 6], 6, beam_size=3, alpha=0.6)
  for row, limit in zip(np.asarray(seqs), (1, 2, 6)):
    assert np.all(row[limit:] == 0)
    assert np.count_nonzero(row) <= limit
  np.testing.assert_array_equal(seqs[2][:2], [3, 1])


def test_beam_search_stops_when_no_live_beam_can_win():
  """b eos (p = 0.36) finishes at step 2; no live beam can beat it, so the search stops long
  before the 50-token limit."""
  steps = []

  def counting(tokens, cache):
    jax.debug.callback(lambda: steps.append(1))
    return markov(tokens, cache)

  seqs, _ = jax.jit(lambda ml: decode.beam_search(
      counting, jnp.int32(0), ml, 50, beam_size=2, alpha=0.6))(jnp.array([50], jnp.int32))
  jax.effects_barrier()
  np.testing.assert_array_equal(seqs[0][:2], [3, 1])
  assert 2 <= len(steps) <= 6, f'{len(steps)} steps'


def test_greedy_never_emits_padding_and_agrees_with_beam_1():
  """A model whose favourite token is the padding id 0: both searches take the next best."""
  def prefers_padding(tokens, cache):
    return jnp.tile(jnp.log(jnp.array([0.6, 0.02, 0.3, 0.08])), (tokens.shape[0], 1)), cache

  greedy = decode.greedy_search(prefers_padding, jnp.int32(0), jnp.array([3]), 3)
  beam, _ = decode.beam_search(prefers_padding, jnp.int32(0), jnp.array([3]), 3, beam_size=1,
                               alpha=0.6)
  np.testing.assert_array_equal(greedy, [[2, 2, 2]])
  np.testing.assert_array_equal(beam, greedy)


def test_a_growing_cache_gives_the_same_search():
  """A per-hypothesis history of input tokens [N, room] as the cache (reordered with the
  beams): searches in stages of room 16, 32 and 40 find what one search over a full cache
  finds."""
  assert decode.stage_lengths(40) == [16, 32, 40] and decode.stage_lengths(9) == [9]

  def step(tokens, cache):
    history = jax.lax.dynamic_update_slice_in_dim(cache['history'], tokens, cache['i'], axis=1)
    # The next distribution depends on the whole history, so a lost or misplaced entry shows;
    # EOS is unlikely, so that searches run into the later stages.
    logits = 2.0 * jnp.sin(jnp.arange(4.0) * (1.0 + history.sum(axis=1, keepdims=True) % 7))
    return (logits.at[:, EOS].add(-50.0),
            {'history': history, 'i': cache['i'] + 1})

  def grow(cache, room):
    return {**cache, 'history': jnp.pad(cache['history'],
                                        ((0, 0), (0, room - cache['history'].shape[1])))}

  max_lengths = jnp.array([40, 25, 33], jnp.int32)
  for search in (functools.partial(decode.beam_search, beam_size=3, alpha=0.6, num_results=2),
                 decode.greedy_search):
    rows = 9 if search is not decode.greedy_search else 3
    full = {'history': jnp.zeros((rows, 40), jnp.int32), 'i': jnp.int32(0)}
    small = {'history': jnp.zeros((rows, 16), jnp.int32), 'i': jnp.int32(0)}
    expected = jax.jit(lambda c: search(step, c, max_lengths, 40))(full)
    staged = jax.jit(lambda c: search(step, c, max_lengths, 40, grow_cache=grow))(small)
    jax.tree.map(np.testing.assert_array_equal, staged, expected)
    assert (jax.tree.leaves(staged)[0][0] != 0).sum() > 32  # ran into the last stage


@pytest.mark.parametrize('vocab', [1, 7, 300, 1000, 8001])
def test_argmax_equals_jnp_argmax(vocab):
  """Ties (to the lower index), -inf entries, and a row of -inf; a row with NaN gives an id."""
  x = jnp.round(jax.random.normal(jax.random.key(vocab), (5, vocab)), 1)  # many ties
  x = x.at[1].set(-jnp.inf).at[2, :vocab // 2].set(-jnp.inf).at[3].set(2.0)
  got = jax.jit(decode.argmax)(x)
  assert got.dtype == jnp.int32
  np.testing.assert_array_equal(got, jnp.argmax(x, axis=-1))
  assert 0 <= decode.argmax(x.at[0, 0].set(jnp.nan))[0] < vocab


@pytest.mark.parametrize('vocab', [600, 2048, 8000, 8001, 37000])
def test_top_k_of_long_rows_equals_lax_top_k(vocab):
  """The block-maxima path, ties included: across blocks, inside the short last block, and
  between the last block and the one before it (which the last block's window overlaps)."""
  x = jax.random.normal(jax.random.key(vocab), (6, vocab))
  x = x.at[:, 3].set(x[:, vocab - 1]).at[:, 40].set(x[:, vocab - 40])
  x = x.at[1].set(x[1].at[vocab - 1].set(9.0).at[vocab - 33].set(9.0))
  x = x.at[2].set(jnp.where(jnp.arange(vocab) < vocab - 5, -jnp.inf, x[2]))  # 5 finite entries
  for k in (1, 8, 12):
    got, expected = jax.jit(functools.partial(decode.top_k, k=k))(x), jax.lax.top_k(x, k)
    np.testing.assert_array_equal(got[1], expected[1])
    np.testing.assert_array_equal(got[0], expected[0])


@pytest.mark.parametrize('vocab', [5, 1000, 2048, 8001])
def test_top_k_and_max_leaves_padding_out_of_the_top_but_not_the_maximum(vocab):
  """Against lax.top_k with entry 0 at the fill value, and jnp.max: padding the row's maximum
  (row 0), tied with another entry of its block (row 1), the only finite entry of its block
  (row 2), and ties across blocks (row 3)."""
  x = jnp.round(jax.random.normal(jax.random.key(vocab), (4, vocab)), 1)
  x = x.at[0, 0].set(9.0).at[1, 0].set(7.0).at[1, min(5, vocab - 1)].set(7.0)
  x = x.at[2, 1:32].set(-jnp.inf).at[3, vocab - 1].set(8.0).at[3, vocab // 2].set(8.0)
  for k in (1, min(8, vocab)):
    top, indices, most = jax.jit(functools.partial(_cpu_ops.top_k_and_max, k=k,
                                                   fill=decode.NEG_INF))(x)
    expected = jax.lax.top_k(x.at[:, 0].set(decode.NEG_INF), k)
    np.testing.assert_array_equal(indices, expected[1])
    np.testing.assert_array_equal(top, expected[0])
    np.testing.assert_array_equal(most, jnp.max(x, axis=-1, keepdims=True))


@pytest.mark.parametrize('vocab', [5, 1000, 8001])
def test_continuations_are_the_best_of_all_beams_candidates(vocab):
  """Against the one-step definition: log-softmax of every beam, padding's set to NEG_INF, added
  to the beam's log-probability, the n best of all K * V candidates (ties to the lower beam,
  then token). Beams at NEG_INF (as all but the first are at step 0; with V=5 the first has
  too few tokens, so padding fills in at NEG_INF) and a tie across beams."""
  batch, k, n = 3, 4, 8
  logits = 3.0 * jax.random.normal(jax.random.key(vocab), (batch * k, vocab))
  logits = logits.at[1].set(logits[0])  # beams 0 and 1 of sentence 0: the same continuations
  alive = jnp.array([[-1.0, -1.0, -2.0, -3.0], [-0.5, decode.NEG_INF, -4.0, -4.5],
                     [0.0] + [decode.NEG_INF] * 3])
  log_probs, beam, token = decode.continuations(alive, logits, n)

  every = np.array(jax.nn.log_softmax(logits)).reshape(batch, k, vocab)
  every[:, :, 0] = decode.NEG_INF
  every = (np.asarray(alive)[:, :, None] + every).reshape(batch, k * vocab)
  best = np.argsort(-every, axis=1, kind='stable')[:, :n]
  np.testing.assert_array_equal(beam, best // vocab)
  np.testing.assert_array_equal(token, best % vocab)
  np.testing.assert_allclose(log_probs, np.take_along_axis(every, best, axis=1), rtol=1e-6)
  assert not np.any(np.asarray(token)[np.asarray(log_probs) > decode.NEG_INF / 2] == 0)


def test_take_rows_promises_nothing_about_the_rows_order():
  """Beam search reorders by parents in score order, not sorted: the gather must not tell XLA
  that its indices are sorted (a promise XLA may act on; CPU results would not show it)."""
  rows = jnp.array([2, 0, 1])
  x = jnp.arange(12.0).reshape(3, 4)
  np.testing.assert_array_equal(decode.take_rows(x, rows), np.asarray(x)[[2, 0, 1]])

  def gathers(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == 'gather':
        yield eqn
      for inner in (eqn.params.get('jaxpr'),):  # jnp.take is a jit of its own
        yield from gathers(getattr(inner, 'jaxpr', inner)) if inner is not None else ()
  found = list(gathers(jax.make_jaxpr(decode.take_rows)(x, rows).jaxpr))
  assert len(found) == 1 and found[0].params['indices_are_sorted'] is False


# --- sampling and forced prefixes --------------------------------------------------------------

# Next-token probabilities over {0 pad, 1 eos, 2..5}, the same after every token.
FLAT = np.array([0.0, 0.05, 0.5, 0.2, 0.15, 0.1])


def _fixed(tokens, cache):
  """tokens [N, 1] -> the same logits [N, V] for every row (log FLAT)."""
  logits = jnp.log(jnp.where(FLAT > 0, FLAT, 1e-30)).astype(jnp.float32)
  return jnp.broadcast_to(logits, (tokens.shape[0], len(FLAT))), cache


def _kept(temperature: float, top_k: int, top_p: float) -> np.ndarray:
  """The distribution filter_logits leaves, as probabilities [V]."""
  logits = decode.filter_logits(jnp.log(jnp.asarray(FLAT[None] + 1e-30, jnp.float32)),
                                temperature, top_k, top_p)
  return np.asarray(jax.nn.softmax(logits)[0])


def test_filters_apply_temperature_then_top_k_then_top_p():
  # top-k first: of the 3 kept (0.5, 0.2, 0.15 renormalised: 0.59, 0.24, 0.18) the first
  # alone reaches 0.55; top-p first would have kept two (0.5 < 0.55).
  np.testing.assert_allclose(_kept(1.0, 3, 0.55), [0, 0, 1, 0, 0, 0], atol=1e-6)
  # temperature first: at 2 the likeliest has 0.34 < 0.45, so two are kept; at 1, one.
  assert (_kept(2.0, 0, 0.45) > 0).sum() == 2 and (_kept(1.0, 0, 0.45) > 0).sum() == 1
  flat = np.sqrt(FLAT[2:4]) / np.sqrt(FLAT[2:4]).sum()
  np.testing.assert_allclose(_kept(2.0, 0, 0.45)[2:4], flat, rtol=1e-5)
  np.testing.assert_allclose(_kept(1.0, 0, 1.0), FLAT / FLAT.sum(), rtol=1e-5)  # no filter
  np.testing.assert_allclose(_kept(1.0, 2, 1.0)[2:4], [5 / 7, 2 / 7], rtol=1e-5)


@pytest.mark.parametrize('temperature, top_k, top_p', [(1.0, 0, 1.0), (0.7, 0, 1.0),
                                                       (1.0, 3, 0.8)])
def test_first_sampled_tokens_follow_the_filtered_softmax(temperature, top_k, top_p):
  """4,000 first tokens, each row with its own key: every token's frequency within 5 standard
  errors of its probability (a fixed seed: the test cannot flake)."""
  n = 4000
  keys = decode.sample_keys(jnp.uint32(7), jnp.arange(n), 1)
  ids, _ = jax.jit(lambda: decode.sample_search(
      _fixed, jnp.int32(0), jnp.full((n,), 1, jnp.int32), 1, keys, temperature=temperature,
      top_k=top_k, top_p=top_p))()
  expected = _kept(temperature, top_k, top_p)
  counts = np.bincount(np.asarray(ids[:, 0]), minlength=len(FLAT)) / n
  tolerance = 5 * np.sqrt(expected * (1 - expected) / n) + 1e-9
  assert (np.abs(counts - expected) <= tolerance).all(), (counts, expected)
  assert counts[0] == 0  # never padding


def test_top_k_1_and_a_cold_temperature_sample_greedy_search():
  log_p = np.log(np.maximum(P + np.array([0, 0, 0.04, -0.04]) * (P[:, 2] == 0.35)[:, None],
                            1e-30))  # P without its tie after a: (a 0.39, b 0.31)
  chain = lambda tokens, cache: (jnp.asarray(log_p, jnp.float32)[tokens[:, 0]], cache)  # noqa: E731
  max_lengths = jnp.array([6, 4, 6], jnp.int32)
  greedy = decode.greedy_search(chain, jnp.int32(0), max_lengths, 6)
  keys = decode.sample_keys(jnp.uint32(0), jnp.arange(3), 1)
  for settings in ({'top_k': 1}, {'temperature': 1e-4}):
    sampled, log_prob = decode.sample_search(chain, jnp.int32(0), max_lengths, 6, keys,
                                             **settings)
    np.testing.assert_array_equal(sampled, greedy)
  expected = [sum(log_p[a, b] for a, b in zip([0, *row], row) if b) for row in
              np.asarray(greedy).tolist()]  # the model's own log-probability, untempered
  np.testing.assert_allclose(log_prob, expected, rtol=1e-5)


def test_a_sample_depends_on_its_key_alone():
  keys = decode.sample_keys(jnp.uint32(3), jnp.arange(40), 2)  # [80]: 40 sentences x 2
  run = lambda k: decode.sample_search(markov, jnp.int32(0), jnp.full((k.shape[0],), 8), 8,  # noqa: E731
                                       k)[0]
  together = np.asarray(run(keys))
  np.testing.assert_array_equal(np.asarray(run(keys[10:13])), together[10:13])
  assert len({tuple(row) for row in together}) > 10  # samples differ from one another


def test_a_prefix_is_forced_and_the_search_goes_on_from_it():
  # Greedy takes a (2) first; forced to start with b (3), it goes on as from b: then EOS.
  prefix = jnp.zeros((2, 6), jnp.int32).at[0, :1].set(3).at[1, :2].set(jnp.array([2, 3]))
  max_lengths = jnp.array([6, 6])
  greedy = decode.greedy_search(markov, jnp.int32(0), max_lengths, 6, prefix=prefix)
  assert np.asarray(greedy).tolist() == [[3, 1, 0, 0, 0, 0], [2, 3, 1, 0, 0, 0]]
  ids, scores = decode.beam_search(markov, jnp.int32(0), max_lengths, 6, beam_size=3,
                                   alpha=0.0, prefix=prefix)
  assert np.asarray(ids).tolist() == [[3, 1, 0, 0, 0, 0], [2, 3, 1, 0, 0, 0]]
  np.testing.assert_allclose(scores, [LOG_P[0, 3] + LOG_P[3, 1],
                                      LOG_P[0, 2] + LOG_P[2, 3] + LOG_P[3, 1]], rtol=1e-5)
  keys = decode.sample_keys(jnp.uint32(0), jnp.arange(2), 1)
  sampled = np.asarray(decode.sample_search(markov, jnp.int32(0), max_lengths, 6, keys,
                                            prefix=prefix)[0])
  assert sampled[0, 0] == 3 and sampled[1, :2].tolist() == [2, 3]


def test_take_sentences_moves_a_sentences_rows_and_keeps_scalars():
  """3 sentences of 2 hypotheses: arrays [3, ...] by sentence, [6, ...] by hypothesis."""
  state = {'step': jnp.int32(5), 'by_sentence': jnp.arange(3) * 10,
           'by_hypothesis': jnp.arange(12).reshape(6, 2)}
  taken = decode.take_sentences(state, jnp.array([2, 0]), 3)
  assert int(taken['step']) == 5
  np.testing.assert_array_equal(taken['by_sentence'], [20, 0])
  np.testing.assert_array_equal(taken['by_hypothesis'], [[8, 9], [10, 11], [0, 1], [2, 3]])
  with pytest.raises(ValueError, match='an array of 4 rows in a state of 3 sentences'):
    decode.take_sentences({'x': jnp.zeros(4)}, jnp.array([0]), 3)


@pytest.mark.parametrize('vocab', [4, 12])  # fewer tokens than 2W continuations, and more
@pytest.mark.parametrize('forced', [False, True])
def test_the_first_step_once_a_sentence_is_the_step_at_every_beam(vocab, forced):
  """Beam.first_step from each sentence's logits gives `step`'s state from the same logits at
  every beam's row (the other beams' continuations at NEG_INF), prefixes and all."""
  beam, batch, max_len = decode.Beam(beam_size=3), 2, 5
  logits = jax.random.normal(jax.random.key(vocab), (batch, vocab))
  prefix = jnp.array([[2, 3, 0, 0, 0], [0, 0, 0, 0, 0]]) if forced else None
  start = beam.start(jnp.zeros(batch * 3), jnp.array([4, 1]), max_len, prefix)
  every = beam.step(lambda tokens, cache: (jnp.repeat(logits, 3, axis=0), cache + 1), start)
  once = beam.first_step(logits, start.replace(cache=start.cache + 1))
  for ours, theirs in zip(jax.tree.leaves(once), jax.tree.leaves(every), strict=True):
    np.testing.assert_array_equal(ours, theirs)
  assert int(once.step) == 1 and bool(once.finished_scores[1, 0] > decode.NEG_INF / 2)
