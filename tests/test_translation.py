"""jaxformer.translation: the Translator and its search glue."""

import functools
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import CFG, synthetic_text, uncached_decoding

from jaxformer import config, layout, losses, search, shapes, trainer, translation
from jaxformer.model import Transformer

SENTENCES = ['the man sees a dog', 'a small red house under the garden with a big cat',
             'Größe — ünïcode ✓', 'the dog']


@pytest.mark.parametrize('beam_size', [1, 4])
def test_cached_and_uncached_search_agree(translator, beam_size):
  # max_len 40: the cached search grows its cache through stages of 16, 32 and 40 tokens.
  src = jnp.array([[5, 9, 13, 1, 0, 0, 0, 0], [7, 8, 1, 0, 0, 0, 0, 0]])
  lengths = jnp.array([40, 23])
  run = lambda fn: fn(  # noqa: E731
      translator.params, search.Batch(src, lengths), config=translator.config, max_len=40,
      decoding=config.DecodingConfig(beam_size=beam_size))[0]
  cached = jax.jit(lambda: run(search.decode_batch))()
  assert (cached[0] != 0).sum() > 16  # the untrained model ran into the second stage
  np.testing.assert_array_equal(cached, jax.jit(lambda: run(uncached_decoding.decode_batch))())


def test_a_rows_ids_end_before_its_eos_or_padding():
  ids = np.array([[5, 6, 1, 7], [5, 6, 7, 8], [1, 5, 6, 7], [5, 0, 6, 1]], np.int32)
  out = translation._until_eos(ids)
  assert out == [[5, 6], [5, 6, 7, 8], [], [5]]
  assert all(type(t) is int for row in out for t in row)  # JSON-ready, not numpy scalars


def test_batch_padding_does_not_change_a_translation(translator):
  together = translator.translate(SENTENCES)
  alone = [translator.translate([s])[0] for s in SENTENCES]
  assert together == alone
  assert len(set(together)) > 1


def test_an_accelerators_one_shape_changes_no_output_and_compiles_one_program(translator):
  """translation.fixed_shapes_on (on a GPU): every batch in batch_size rows of max_len tokens. The
  translations, n-best scores and target scores are those of the CPU's length buckets, and a
  call of many lengths and batch sizes compiles one search and one scoring program."""
  sentences = SENTENCES + [' '.join(SENTENCES)] * 3  # lengths in several buckets
  bucketed = translation.Translator(translator.params, translator.config, translator.tokenizer,
                                    batch_size=4, workers=1)
  fixed = translation.Translator(translator.params, translator.config, translator.tokenizer,
                                 batch_size=4, workers=1, beam_size=3, fixed_shapes=True)
  bucketed = bucketed.replace(beam_size=3)  # (the two share their programs: fixed's first)
  before = len(fixed._search.compiled)
  translations = fixed.translate(sentences), fixed.translate(sentences[:1])
  assert len(fixed._search.compiled) == before + 1
  assert translations == (bucketed.translate(sentences), bucketed.translate(sentences[:1]))
  for (text, score), (text2, score2) in zip(sum(fixed.translate_nbest(sentences, 2), []),
                                            sum(bucketed.translate_nbest(sentences, 2), [])):
    assert text == text2 and score == pytest.approx(score2, abs=1e-4)
  targets = (SENTENCES[::-1] * 2)[:len(sentences)]
  assert [s.log_prob for s in fixed.score(sentences, targets)] == pytest.approx(
      [s.log_prob for s in bucketed.score(sentences, targets)], abs=1e-4)
  assert translation.fixed_shapes_on('gpu') and not translation.fixed_shapes_on('cpu')


def test_a_search_compiled_ahead_is_not_compiled_again(translator):
  """compile_ahead (a run's first validation, in a background thread) compiles the programs
  that translating the sentences takes; translating them then compiles nothing."""
  model = translation.Translator(translator.params, translator.config, translator.tokenizer,
                                 batch_size=2, workers=1, beam_size=2, alpha=0.3)
  model.compile_ahead(SENTENCES)
  compiled = list(model._search.compiled)
  assert len(compiled) == 2 and all('the search' in what for what, _ in compiled)
  model.translate(SENTENCES)
  assert model._search.compiled == compiled


def test_the_search_is_one_program_whoever_made_the_weights(translator):
  """A run's validation compiles its search from shapes (or calls it with the device's
  arrays); an eval of its checkpoint calls it with numpy weights, a library user perhaps with
  arrays never placed: all lower to one program text, hence one entry in jax's compilation
  cache (before, numpy weights lowered without the device's sharding: another program)."""
  params = translator.params
  sources = {'shapes': jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params),
             'numpy': jax.tree.map(np.asarray, params),
             'unplaced': jax.tree.map(jnp.asarray, jax.tree.map(np.asarray, params))}
  texts = set()
  for weights in sources.values():
    model = translation.Translator(weights, translator.config, translator.tokenizer,
                                   fixed_shapes=True, batch_size=2, beam_size=2)
    ids = model._sources(SENTENCES[:2])  # pylint: disable=protected-access
    args, static = model._search_arguments([0, 1], [[0, 1]], ids, [[], []], 0, None)
    texts.add(model._search.transformed.lower(*args, **static).as_text())
  assert len(texts) == 1


def test_the_output_projection_is_made_once_for_the_weights(translator):
  """On a CPU the searches take the embedding transposed (model.output_projection), made on
  first use and kept by replace while the weights stay (a server's request settings)."""
  model = translator.replace()
  projection = model._projection  # pylint: disable=protected-access
  np.testing.assert_array_equal(projection, np.asarray(model.params['embed']['embedding']).T)
  assert model.replace(beam_size=2)._projection is projection
  assert model.replace(model.params)._projection is not projection  # other weights, made anew


def test_a_calls_batches_are_even_so_a_short_last_one_is_no_program_of_its_own(translator):
  """Nine sentences of one length bucket in batches of at most four: three batches of three
  (4 rows each, one program), not 4 + 4 + 1 (a second program for a batch of one row)."""
  model = translation.Translator(translator.params, translator.config, translator.tokenizer,
                                 batch_size=4, workers=1, beam_size=2, alpha=0.4)
  sentences = [f'the dog {n}' for n in range(9)]
  assert model.translate(sentences) == [model.translate([s])[0] for s in sentences]
  assert len(model._search.compiled) == 2  # 4 rows (the call), 1 row (each sentence alone)


def test_a_calls_batches_that_run_at_once_take_one_shape(translator, monkeypatch):
  """Three sentences of two length buckets on two workers: batches of two and one sentence,
  searched side by side in one shape (2 rows, the longer bucket: one program), and three
  packed rows of pairs scored as two batches of 2 rows; the same translations and scores as
  each batch in its own shape (one worker, one after the other)."""
  sentences = [SENTENCES[1], SENTENCES[0], SENTENCES[3]]  # (longest first: 2 + 1)
  long = [' '.join(SENTENCES)] * 3  # a pair a packed row
  two, one = (translation.Translator(translator.params, translator.config, translator.tokenizer,
                                     batch_size=2, workers=w, beam_size=2, alpha=0.5)
              for w in (2, 1))
  shapes_of = {'_search': [], '_scores': []}
  for name, calls in shapes_of.items():
    program = getattr(two, name)
    monkeypatch.setattr(two, name, lambda *args, program=program, calls=calls, **kwargs: (
        calls.append(jax.tree.leaves(args[1])[0].shape) or program(*args, **kwargs)))
  nbest, scores = two.translate_nbest(sentences, 2), two.score(long, long)
  assert shapes_of == {'_search': [(2, 16)] * 2, '_scores': [(2, 64)] * 2}
  alone = one.translate_nbest(sentences, 2)
  assert [[t for t, _ in n] for n in nbest] == [[t for t, _ in n] for n in alone]
  assert [s for n in nbest for _, s in n] == pytest.approx([s for n in alone for _, s in n],
                                                           rel=1e-5)
  assert [s.log_prob for s in scores] == pytest.approx([s.log_prob for s in one.score(long, long)],
                                                       rel=1e-5)


def test_workers_search_batches_side_by_side_and_keep_the_order(translator, monkeypatch):
  sentences = [f'{s} {n}' for n in range(3) for s in SENTENCES]  # 12: six batches of two
  one = translation.Translator(translator.params, translator.config, translator.tokenizer,
                               batch_size=2, workers=1)
  expected, expected_nbest = one.translate(sentences), one.translate_nbest(sentences, 2)
  three = translation.Translator(translator.params, translator.config, translator.tokenizer,
                                 batch_size=2, workers=3)
  search, meeting, threads = three._search, threading.Barrier(3, timeout=60), set()

  def side_by_side(*args, **kwargs):  # three searches must be under way at once to pass
    meeting.wait()
    threads.add(threading.get_ident())
    return search(*args, **kwargs)
  monkeypatch.setattr(three, '_search', side_by_side)
  assert three.translate(sentences) == expected
  assert len(threads) == 3
  threads.clear()
  assert three.translate_nbest(sentences, 2) == expected_nbest
  assert len(threads) == 3


def test_an_error_in_a_batch_stops_the_translation(translator, monkeypatch):
  two = translation.Translator(translator.params, translator.config, translator.tokenizer,
                               batch_size=1, workers=2)
  calls = []

  def failing(*args, **kwargs):
    calls.append(1)
    time.sleep(0.5)  # the caller sees the first failure long before 10 calls could start
    raise RuntimeError('out of memory')
  monkeypatch.setattr(two, '_search', failing)
  with pytest.raises(RuntimeError, match='out of memory'):
    two.translate(SENTENCES * 10)  # 40 batches: those not started are cancelled
  assert len(calls) < 10


def test_workers_are_a_positive_integer():
  with pytest.raises(ValueError, match='workers must be an integer >= 1, got 0'):
    translation.Translator(None, CFG, None, workers=0)


def test_blank_lines_stay_blank_and_counts_are_kept(translator):
  lines = ['', SENTENCES[0], '   ', SENTENCES[2], '']
  out = translator.translate(lines)
  assert len(out) == 5 and out[0] == out[2] == out[4] == ''
  assert out[1] == translator.translate([SENTENCES[0]])[0]


def test_a_lone_string_or_a_sentence_that_is_no_string_is_a_type_error(translator):
  """translate('the dog') translated each character as a sentence (and score('a', 'b') scored
  them): the library's calls take lists of sentences and say so, naming what is not one."""
  for call, said in (
      (lambda: translator.translate(SENTENCES[0]), r'^sentences must be a list of strings, '
       r'one a sentence, got one str: wrap it in a list \(\[text\]\)\.$'),
      (lambda: translator.translate_nbest([SENTENCES[0], None], 2),
       r'^sentences\[1\] is NoneType, not a string\.$'),
      (lambda: translator.translate([SENTENCES[0]], prefixes=b'der'),
       r'^prefixes must be a list of strings, one a sentence, got one bytes'),
      (lambda: translator.score(['a'], 'b'), r'^targets must be a list of strings'),
      (lambda: translator.score([0], ['b']), r'^sources\[0\] is int, not a string\.$')):
    with pytest.raises(TypeError, match=said):
      call()


def test_nothing_to_search_is_an_empty_answer(translator):
  """Blank lines only, no sentence at all, or pairs all too long to score: empty answers in
  the inputs' counts, and no search of zero rows (it raised 'range() arg 3 must not be
  zero')."""
  for lines in (['', '  ', '\t'], []):
    assert translator.translate(lines) == [''] * len(lines)
    assert translator.translate_nbest(lines, 2) == [[]] * len(lines)
    assert translator.replace(sampling=True).translate(lines) == [''] * len(lines)
  assert translator.score([], []) == []
  too_long = ' '.join(['the dog'] * translator.config.max_len)
  scores = translator.score([too_long, 'the dog'], ['the dog', too_long])
  assert [bool(s.skipped) for s in scores] == [True, True]


def test_outputs_respect_the_length_limit(workdir):
  short = translation.Translator.from_checkpoint(str(workdir), batch_size=4, extra_length=2)
  ids = short.tokenizer.encode(short.translate(SENTENCES))
  sources = short.tokenizer.encode(SENTENCES)
  assert all(len(out) <= len(src) + 1 + 2 for out, src in zip(ids, sources))


def test_averaged_translator_loads(workdir):
  averaged = translation.Translator.from_checkpoint(str(workdir), average_last=2, batch_size=4)
  from_dir = translation.Translator.load(str(workdir / 'average-last2'), batch_size=4)
  for a, b in zip(jax.tree.leaves(averaged.params), jax.tree.leaves(from_dir.params)):
    np.testing.assert_allclose(a, b, rtol=1e-6)
  assert averaged.translate(SENTENCES[:2]) == from_dir.translate(SENTENCES[:2])
  # `load` reads any kind of model path, and says the model's step (kept by replace, unless
  # other params come in).
  newest = translation.Translator.load(str(workdir / 'checkpoints'), batch_size=4)
  assert (averaged.step, from_dir.step, newest.step) == (4, 4, 4)
  assert newest.replace(beam_size=2).step == 4 and newest.replace(newest.params).step is None


def test_over_long_sources_are_cut_to_the_model_and_counted(translator, caplog):
  """A source of thousands of words is cut to max_len pieces (with a warning naming it), and
  decoding stays within max_len: one output line per input, no out-of-memory."""
  sentences = ['the dog', 'the man sees a dog ' * 800, 'the house']
  with caplog.at_level('WARNING', logger='jaxformer.evaluate'):
    outputs = translator.translate(sentences)
  assert len(outputs) == 3 and outputs[0] == translator.translate(['the dog'])[0]
  assert "1 source(s) longer than the model's 64 tokens were cut to that length (indices 1)" \
      in caplog.text
  limit = translator.config.max_len - 1
  cut = translator.tokenizer.decode([translator.tokenizer.encode([sentences[1]])[0][:limit]])
  assert outputs[1] == translator.translate(cut)[0]  # the same as translating the cut source


def test_learned_positions_translate_sources_longer_than_the_table(tmp_path):
  """Table 3 row E: the width bucket plus 50 used to pass max_len and break init_cache."""
  cfg = CFG.replace(learned_positions=True)  # max_len 64 = row_len
  settings = config.TrainConfig(num_steps=1, tokens_per_batch=1024, row_len=64,
                                checkpoint_every_secs=None, average_last=0)
  trainer.train(cfg, settings, tmp_path, synthetic_text(200))
  row_e = translation.Translator.from_checkpoint(str(tmp_path), batch_size=2)
  outputs = row_e.translate(['the dog', 'a small red house with a big cat ' * 5, 'the man ' * 40])
  assert len(outputs) == 3 and all(len(row_e.tokenizer.encode([o])[0]) <= 64 for o in outputs)


# --- sampling, prefixes, scores ------------------------------------------------------------------

MORE = [f'{s} {n}' for n in range(3) for s in SENTENCES]  # 12 sentences


def test_the_same_seed_samples_the_same_whatever_the_batches_workers_and_parts(translator):
  sample = lambda **kw: translation.Translator(  # noqa: E731
      translator.params, translator.config, translator.tokenizer, sampling=True, seed=11,
      extra_length=6, **kw)
  def texts(nbest):  # (their scores agree to float rounding: batches of other widths)
    return [[text for text, _ in options] for options in nbest]
  first = sample(batch_size=1, workers=1).translate_nbest(MORE, 2)
  expected = texts(first)
  together = sample(batch_size=4, workers=2).translate_nbest(MORE, 2)
  assert texts(together) == expected
  np.testing.assert_allclose([s for o in together for _, s in o], [s for o in first for _, s in o],
                             rtol=1e-5)
  parts = sample(batch_size=3, workers=1)
  assert texts(parts.translate_nbest(MORE[:5], 2) + parts.translate_nbest(
      MORE[5:], 2, first_index=5)) == expected
  assert [options[0] for options in expected] == sample(batch_size=4).translate(MORE)
  assert texts(sample(batch_size=4).replace(seed=12).translate_nbest(MORE, 2)) != expected
  assert len({text for options in expected for text in options}) > 12  # samples vary


def _search_ids(model: translation.Translator, sentences: list[str], n: int):
  """(ids [n, T], scores [n]) of each sentence's n-best, searched alone."""
  return [next(model._searches([s], False, n, None, 0))[1:] for s in sentences]


def test_nbest_scores_are_the_outputs_log_probabilities_over_the_length_penalty(translator):
  """translate_nbest's score * ((5 + length) / 6)^alpha is the forced decoding of its ids,
  beam search's and sampling's (whose scores have no penalty)."""
  for model, penalised in ((translator.replace(extra_length=6), True),
                           (translator.replace(extra_length=6, sampling=True), False)):
    for sentence in SENTENCES[:2]:
      (ids, scores), = [(ids[0], scores[0]) for ids, scores in _search_ids(model, [sentence], 3)]
      src = shapes.padded([translator.tokenizer.encode([sentence])[0] + [1]], (1, 32))
      forced = np.asarray(translation.target_log_probs(
          translator.params, np.repeat(src, 3, axis=0), ids, config=translator.config)).sum(-1)
      length = (ids > 0).sum(-1)
      penalty = ((5 + length) / 6) ** 0.6 if penalised else 1.0
      np.testing.assert_allclose(scores * penalty, forced, rtol=2e-6)


def test_scores_are_the_training_loss_without_smoothing(translator):
  sources, targets = SENTENCES[:3], ['der mann sieht einen hund', 'ein haus', 'der hund']
  scores = translator.score(sources, targets)
  tok = translator.tokenizer
  src = shapes.padded([x + [1] for x in tok.encode(sources)], (3, 32))
  tgt = shapes.padded([x + [1] for x in tok.encode(targets)], (3, 32))
  logits = Transformer(translator.config).apply({'params': translator.params}, src,
                                                np.pad(tgt[:, :-1], ((0, 0), (1, 0))))
  for row, score in enumerate(scores):
    loss, weight = losses.smoothed_cross_entropy(logits[row:row + 1], tgt[row:row + 1],
                                                 (tgt[row:row + 1] > 0).astype(np.float32), 0.0)
    assert score.tokens == int(weight) == len(tok.encode([targets[row]])[0]) + 1
    np.testing.assert_allclose(score.log_prob, -float(loss), rtol=1e-5)
    np.testing.assert_allclose(score.mean, score.log_prob / score.tokens)
    np.testing.assert_allclose(sum(score.token_log_probs), score.log_prob, rtol=1e-6)


def test_packed_scores_are_each_pairs_scored_alone(translator):
  """score packs several pairs a row (one program a call); each pair's token log-probabilities
  are those of the pair alone in a row of its own, the unpacked teacher-forced pass."""
  tok = translator.tokenizer
  sources = [' '.join(['the dog'] * (1 + i % 5)) for i in range(14)]
  targets = [' '.join(['der hund'] * (1 + (i * 3) % 7)) for i in range(14)]
  pairs = [(s + [1], t + [1]) for s, t in zip(tok.encode(sources), tok.encode(targets))]
  assert len(layout.first_fit([(len(s), len(t)) for s, t in pairs], 32)) < 14  # rows shared
  scores = translator.replace(batch_size=2).score(sources, targets)  # batches of packed rows
  for (src, tgt), score in zip(pairs, scores):
    alone = np.asarray(translation.target_log_probs(
        translator.params, shapes.padded([src], (1, 32)),
        shapes.padded([tgt], (1, 32)), config=translator.config, chunk=5))[0]
    np.testing.assert_allclose(score.token_log_probs, alone[:len(tgt)], rtol=1e-5, atol=1e-5)
    assert not alone[len(tgt):].any()


def test_scoring_marks_what_it_cannot_score_and_refuses_what_is_empty(translator, caplog):
  long = ' '.join(['dog'] * 200)  # more pieces than the tiny model's 64 positions
  scores = translator.score(['the dog', long, 'a cat'], [long, 'der hund', 'eine katze'])
  assert [s.skipped is None for s in scores] == [False, False, True]
  assert scores[0].skipped.startswith('the target has') and np.isnan(scores[0].log_prob)
  assert scores[1].skipped.startswith('the source has')
  assert scores[0].as_dict()['log_prob'] is None and 'skipped' in scores[0].as_dict()
  assert '2 of 3 pairs were not scored, longer than' in caplog.text
  with pytest.raises(translation.DataError, match=r'^target 2 is empty'):
    translator.score(['a', 'b'], ['x', ''])
  with pytest.raises(translation.DataError, match=r'^2 sources and 1 targets'):
    translator.score(['a', 'b'], ['x'])


def test_a_prefix_starts_the_output_and_the_search_goes_on_from_it(translator):
  """Greedy search from a prefix is the argmax of the teacher-forced model after it, step by
  step (an independent loop); beam search's outputs start with the prefix too."""
  tok, cfg = translator.tokenizer, translator.config
  greedy = translator.replace(beam_size=1, extra_length=5)
  prefix = 'der mann'
  out = greedy.translate_ids([SENTENCES[0]], prefixes=[prefix])[0]
  forced = tok.encode([prefix])[0]
  src = shapes.padded([tok.encode([SENTENCES[0]])[0] + [1]], (1, 32))
  ids, limit = list(forced), len(src[0].nonzero()[0]) + 5
  # One program over a fixed-width decoder input: the causal mask makes position t's logits
  # those of the first t + 1 inputs, whatever follows them.
  forward = jax.jit(functools.partial(Transformer(cfg).apply, {'params': translator.params}))
  while len(ids) < limit and (not ids or ids[-1] != 1):
    tgt_in = np.zeros((1, limit + 1), np.int32)
    tgt_in[0, 1:len(ids) + 1] = ids
    ids.append(int(np.argmax(np.asarray(forward(src, tgt_in))[0, len(ids), 1:])) + 1)
  assert out == [t for t in ids if t != 1]
  assert out[:len(forced)] == forced
  beam = translator.replace(extra_length=5).translate_ids(SENTENCES[:2], prefixes=['', prefix])
  assert beam[1][:len(forced)] == forced
  assert beam[0] == translator.replace(extra_length=5).translate_ids(SENTENCES[:1])[0]
  with pytest.raises(translation.DataError, match=r"^1 prefixes for 2 sentences"):
    translator.translate(SENTENCES[:2], prefixes=['x'])
  with pytest.raises(translation.DataError, match=r'^the prefix of sentence 4 has \d+ pieces'):
    translator.translate(['a'], prefixes=[' '.join(['dog'] * 200)], first_index=3)


def test_the_first_sampled_tokens_of_a_model_follow_its_softmax(translator):
  """2,000 samples of one sentence from the tiny model: each first token's frequency within 5
  standard errors of the model's probability for it (a fixed seed: the test cannot flake)."""
  n, sentence = 2000, SENTENCES[0]
  sampler = translator.replace(sampling=True, seed=0, extra_length=0)
  ids = [row[:1] for row in translation._until_eos(next(
      sampler._searches([sentence], False, n, None, 0))[1][0])]  # n samples' ids
  assert len(ids) == n
  src = shapes.padded([translator.tokenizer.encode([sentence])[0] + [1]], (1, 32))
  logits = Transformer(translator.config).apply({'params': translator.params}, src,
                                                np.zeros((1, 1), np.int32))[0, 0]
  expected = np.asarray(jax.nn.softmax(logits.at[0].set(-1e9)))  # (padding is never drawn)
  counts = np.bincount([row[0] if row else 1 for row in ids], minlength=len(expected)) / n
  tolerance = 5 * np.sqrt(expected * (1 - expected) / n) + 1e-9
  assert (np.abs(counts - expected) <= tolerance).all()
  assert (counts > 0).sum() > 20  # an untrained model: many first tokens
