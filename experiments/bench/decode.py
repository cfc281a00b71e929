"""The decode section. On a GPU: greedy and beam-4 target tokens/s at base dimensions in
bfloat16, batches of 128 newstest2014 sources (base_fast_path). On CPU: target tokens/s at base
dimensions (random weights, 64 output tokens):
greedy and beam 4, with and without the key/value cache; the first top-k of a beam-4 step
(jax.lax.top_k against decode.top_k's block maxima); beam-4 sentences/s of the tiny config
on newstest2014 sources (and of a trained model with --demo-model). When ctranslate2 is
installed, jaxformer and CTranslate2 side by side on the same weights and sources, in this run:
tokens/s of each, the ratio and the agreement of their outputs (`ctranslate2`): base dims with
random weights, and the small trained models given with --demo-model (make demo's) and
--multi30k-model (make train-multi30k's, or any model of the multi30k recipe's dims). With
--multi30k-model, base dims again with their sentences ending where that model's translations
end, searched with the stragglers' groups and at all rows (`ending_as_translations`)."""

import functools
import importlib.util
import pathlib
import statistics
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import uncached_decoding
from bench.common import median_time
from jaxformer import checkpoint, config, data, decode, export, search, shapes, train
from jaxformer.translation import Translator
from jaxformer.data import embedded
from jaxformer.model import Transformer


def _newstest_throughput(translator: Translator, sources: list[str]) -> dict:
  """Beam-4 sentences/s of a Translator (bucketing and batching included), compiled first."""
  translator.translate(sources[:64])
  start = time.perf_counter()
  outputs = translator.translate(sources)
  seconds = time.perf_counter() - start
  return {'sentences': len(sources), 'sentences_per_s': round(len(sources) / seconds, 2),
          'seconds': round(seconds, 2), 'mean_output_pieces': round(float(np.mean(
              [len(x) for x in translator.tokenizer.encode(outputs)])), 1)}


def _alternating(fns: dict, repeats: int) -> tuple[dict, dict]:
  """(last result, median seconds) of each function, run `repeats` times in turn, so that a
  slow spell of a shared machine falls on both."""
  results, seconds = {}, {name: [] for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      start = time.perf_counter()
      results[name] = fn()
      seconds[name].append(time.perf_counter() - start)
  return results, {name: statistics.median(times) for name, times in seconds.items()}


def compare_ctranslate2(translator: Translator, model_dir: pathlib.Path,
                        sentences: list[str], *, threads: int = 2, repeats: int = 5,
                        variants: tuple[str, ...] = ('drop_finished', 'all_rows')) -> dict:
  """jaxformer and a CTranslate2 export of the same weights on the same sentences: greedy and
  beam 4 with the translator's alpha and length limit, batches of the translator's size, each
  compiled / loaded and warmed up first, then timed `repeats` times in turn (medians).

  jaxformer searches `translator.workers` batches side by side. CTranslate2 runs in three ways,
  and the fastest counts: one batch at a time on 1 and on `threads` intra-op threads
  ('1x1', '1x2'), and `threads` batches side by side on one thread each (inter_threads,
  '2x1'). Per search: tokens/s of each (output pieces, EOS excluded), jaxformer / the fastest
  CTranslate2, and the fraction of sentences with the same output ids; beside it the same
  search with each of `variants` (DecodingConfig's drop_finished, all_rows), and whether
  their outputs are the default's.
  """
  import ctranslate2  # pylint: disable=g-import-not-at-top  (an optional extra)
  engines = _engines(model_dir, threads)
  tok = translator.tokenizer
  pieces = [tok.pieces(ids + [data.EOS_ID]) for ids in tok.encode(sentences)]
  results, decoding = {}, translator.decoding
  for name, beam in (('greedy', 1), ('beam4', 4)):
    ours = translator.replace(beam_size=beam)
    others = {variant: ours.replace(**{variant: True}) for variant in variants}

    def theirs(engine, beam=beam):
      found = engine.translate_batch(
          pieces, max_batch_size=decoding.batch_size, beam_size=beam,
          length_penalty=decoding.alpha, min_decoding_length=0,
          max_decoding_length=min(max(map(len, pieces)) + decoding.extra_length,
                                  translator.config.max_len),  # jaxformer's limits too
          suppress_sequences=[tok.pieces([data.PAD_ID])])
      return [tok.piece_ids(r.hypotheses[0]) for r in found]
    searches = {'jaxformer': ours, **others}
    fns = {**{n: functools.partial(t.translate_ids, sentences) for n, t in searches.items()},
           **{n: functools.partial(theirs, engine) for n, engine in engines.items()}}
    programs = {}
    for key, fn in fns.items():  # compile every width bucket; load and warm up
      start = time.perf_counter()
      fn()
      if key in searches:
        programs[key] = {'seconds': round(time.perf_counter() - start, 2),
                         'programs': len(searches[key]._search.compiled)}  # pylint: disable=protected-access
    outputs, seconds = _alternating(fns, repeats)
    rates = {k: sum(map(len, outputs[k])) / seconds[k] for k in fns}
    best = max(engines, key=rates.get)
    results[name] = {
        'jaxformer_tokens_per_s': round(rates['jaxformer'], 1),
        'ctranslate2_tokens_per_s': round(rates[best], 1),
        'ctranslate2_tokens_per_s_by_way': {n: round(rates[n], 1) for n in engines},
        'ratio': round(rates['jaxformer'] / rates[best], 3),
        'same_output': round(float(np.mean([a == b for a, b in
                                            zip(outputs['jaxformer'], outputs[best])])), 4),
        # The same search with drop_finished (finished sentences leave the batch), and with
        # all_rows (every batch at all its rows to its end, as before the groups of stragglers):
        **{f'{n}_{what}': value for n in others for what, value in (
            ('tokens_per_s', round(rates[n], 1)), ('ratio', round(rates[n] / rates[best], 3)),
            ('same_outputs', outputs['jaxformer'] == outputs[n]))},
        # The first call of each, compiles included (programs: all its settings' so far):
        'first_call': programs}
  return {'ctranslate2': ctranslate2.__version__, 'sentences': len(sentences),
          'ctranslate2_ways': sorted(engines), 'jaxformer_workers': translator.workers,
          'batch_size': translator.decoding.batch_size,
          'repeats': repeats, **results}


def _newstest(data_dir: pathlib.Path, tmp: str) -> tuple[data.ParallelText, data.Tokenizer]:
  """newstest2014 and an 8k sentencepiece vocabulary trained on it (in folder `tmp`)."""
  news = data.read_parallel_text(data_dir / 'newstest2014' / 'newstest2014.en',
                                 data_dir / 'newstest2014' / 'newstest2014.de')
  return news, data.train_tokenizer(news.src + news.tgt, pathlib.Path(tmp, 'spm.model'), 8000)


def base_fast_path(data_dir: pathlib.Path, *, batch_size: int = 128,
                   sentences: int = 1024, preset: str = 'base') -> dict:
  """Greedy and beam-4 target tokens/s of `preset`'s dimensions with random weights, in the fast
  path's execution (bfloat16 on GPU), through the Translator: batches of
  `batch_size` newstest2014 sources of 17-31 pieces (one 32-wide bucket: one compiled program
  per search, compiled on the first batch before timing), outputs to source length + 50 (random
  weights almost never emit EOS)."""
  with tempfile.TemporaryDirectory() as tmp:
    news, tokenizer = _newstest(data_dir, tmp)
  texts = [t for t, ids in zip(news.src, tokenizer.encode(news.src))
           if 16 < len(ids) < 32][:sentences]
  cfg = getattr(config, preset)(vocab_size=tokenizer.vocab_size)
  cfg = config.fast_path(cfg)
  params = train.create_train_state(cfg, jax.random.key(0)).params
  results = {'preset': preset, 'dtype': jnp.dtype(cfg.execution.dtype).name,
             'attention': cfg.execution.attention, 'batch_size': batch_size,
             'sentences': len(texts)}
  for name, beam in (('greedy', 1), ('beam4', 4)):
    translator = Translator(params, cfg, tokenizer, beam_size=beam, batch_size=batch_size)
    start = time.perf_counter()
    translator.translate_ids(texts[:batch_size])
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    tokens = sum(map(len, translator.translate_ids(texts)))
    seconds = time.perf_counter() - start
    results[name] = {'target_tokens_per_s': round(tokens / seconds, 1), 'tokens': tokens,
                     'seconds': round(seconds, 3), 'compile_and_first_batch_s': round(compile_s, 2)}
  return results


def _op_times(fns: dict, rows: int, vocabs: tuple[int, ...]) -> dict:
  """Milliseconds of each jitted fn on random [rows, V] float32 for each V, median of 20
  calls: {'<name>_ms_vocab_<V>': ms}."""
  results = {}
  for vocab in vocabs:
    x = jax.random.normal(jax.random.key(0), (rows, vocab))
    for name, fn in fns.items():
      _, median = median_time(lambda fn=jax.jit(fn): fn(x), runs=20)
      results[f'{name}_ms_vocab_{vocab}'] = round(median * 1e3, 3)
  return results


def _top_k_times(rows: int = 128, k: int = 8) -> dict:
  """One beam-4 step's first top-k (8 of each of 32 sentences x 4 beams' rows) over the
  vocabularies of the multi30k recipe and the paper: jax.lax.top_k against decode.top_k
  (block maxima)."""
  fns = {'lax': functools.partial(jax.lax.top_k, k=k),
         'blocks': functools.partial(decode.top_k, k=k)}
  return {'rows': rows, 'k': k, **_op_times(fns, rows, (8000, 37000))}


def _argmax_times(rows: int = 32) -> dict:
  """One greedy step's argmax (32 sentences) over the vocabularies of the demo, the multi30k
  recipe and the paper: jnp.argmax against decode.argmax."""
  fns = {'jnp': functools.partial(jnp.argmax, axis=-1), 'two_passes': decode.argmax}
  return {'rows': rows, **_op_times(fns, rows, (1000, 8000, 37000))}


def step_costs(translator: Translator, model_dir: pathlib.Path, sentences: list[str], *,
               rows: tuple[int, ...] = (1, 32), steps: tuple[int, int] = (8, 24),
               repeats: int = 7) -> dict:
  """Milliseconds one decoder step of `rows` sentences costs, jaxformer against CTranslate2 on
  the same weights: each search forced to run `steps` steps (jaxformer: search.advance with no
  early stop, from a state made beforehand, with the Translator's output projection;
  CTranslate2: min and max decoding length both the count), the step's cost the difference of
  the two times over the difference of the counts, so that encoding, the call and the results
  cancel out. Every step computes every row, as at the start of a batch: the cost of a step,
  not of finished rows. Medians of `repeats` runs in turn; CTranslate2 on 1 and 2 intra-op
  threads."""
  import ctranslate2  # pylint: disable=g-import-not-at-top  (an optional extra)
  engines = {f'ctranslate2_{t}_thread{"s" * (t > 1)}': ctranslate2.Translator(
      str(model_dir), device='cpu', inter_threads=1, intra_threads=t) for t in (1, 2)}
  tok, cfg, params = translator.tokenizer, translator.config, translator.params
  projection = translator._projection  # pylint: disable=protected-access  (its searches')
  src_ids = [ids + [data.EOS_ID] for ids in tok.encode(sentences)]
  room = decode.stage_lengths(max(steps))[-1]
  results = {}
  for name, beam in (('greedy', 1), ('beam4', 4)):
    decoding = config.DecodingConfig(beam_size=beam)
    first = jax.jit(lambda p, src, lengths, decoding=decoding: search.grow(search.start(
        p, search.Batch(src, lengths), config=cfg, max_len=room, decoding=decoding),
        room=room))
    advance = jax.jit(functools.partial(search.advance, config=cfg, decoding=decoding))
    for count in rows:
      chosen = src_ids[:count]
      src = np.zeros((count, max(map(len, chosen))), np.int32)
      for r, ids in enumerate(chosen):
        src[r, :len(ids)] = ids
      state = first(params, src, jnp.full((count,), room, jnp.int32))
      pieces = [tok.pieces(ids) for ids in chosen]

      def ours(k, state=state):
        return jax.block_until_ready(advance(params, state, jnp.int32(k), 0, projection))

      def theirs(engine, k, pieces=pieces, beam=beam):
        return engine.translate_batch(pieces, beam_size=beam, min_decoding_length=k,
                                      max_decoding_length=k, length_penalty=0.6)
      fns = {f'{system}_{k}': functools.partial(fn, k=k) for k in steps for system, fn in
             (('jaxformer', ours), *((n, functools.partial(theirs, e))
                                     for n, e in engines.items()))}
      for fn in fns.values():
        fn()  # compile, load and warm up
      _, seconds = _alternating(fns, repeats)
      per_step = {system: round(1000 * (seconds[f'{system}_{steps[1]}'] - seconds[
          f'{system}_{steps[0]}']) / (steps[1] - steps[0]), 3)
                  for system in ('jaxformer', *engines)}
      best = min(engines, key=per_step.get)
      results[f'{name}_{count}_rows'] = {**{f'{k}_ms': v for k, v in per_step.items()},
                                         'ratio_to_ctranslate2': round(
                                             per_step[best] / per_step['jaxformer'], 3)}
  return {'steps': list(steps), 'repeats': repeats, **results}


def ending_as_translations(translator: Translator, sentences: list[str],
                           cfg: config.TransformerConfig | None = None, *,
                           repeats: int = 2) -> dict:
  """Seconds of a search of `sentences` (a Translator's batches of 32, its workers side by side)
  with the stragglers' groups and at all rows, by random weights of `cfg` (default: base dims
  at the translator's vocabulary) whose sentences end where `translator`'s own translations of
  them end: each one's limit is its output's length and EOS, to which random weights run.
  Random weights alone never end a sentence, where the groups lose; a trained model's
  sentences end apart."""
  cfg = cfg or config.base(vocab_size=translator.config.vocab_size)
  params = jax.jit(lambda: train.create_train_state(cfg, jax.random.key(0)).params)()
  ids = translator._sources(sentences)  # pylint: disable=protected-access
  groups = shapes.groups(list(range(len(ids))), [len(x) for x in ids], 32, translator.workers)
  order = [i for chosen in groups for i in chosen]  # a Translator's batches, longest first
  results = {'sentences': len(ids), 'dims': [cfg.num_layers, cfg.d_model, cfg.vocab_size]}
  for name, beam in (('greedy', 1), ('beam4', 4)):
    ends = [len(x) + 1 for x in translator.replace(beam_size=beam).translate_ids(sentences)]
    batches = []
    for chosen in groups:
      src = shapes.padded([ids[i] + [data.EOS_ID] for i in chosen],
                          (len(chosen), shapes.bucket(len(ids[chosen[0]]) + 1)))
      batches.append((search.Batch(jnp.asarray(src), jnp.asarray([ends[i] for i in chosen])),
                      min(max(ends[i] for i in chosen), cfg.max_len)))

    def searches(in_groups: bool, beam: int = beam, batches: list = batches) -> Any:
      fn = jax.jit(functools.partial(search.decode_batch, config=cfg, stragglers=in_groups,
                                     decoding=config.DecodingConfig(beam_size=beam)),
                   static_argnames='max_len')

      def one(chosen: list[int], peers: list[list[int]]) -> np.ndarray:
        batch, max_len = batches[chosen[0]]
        return jax.device_get(fn(params, batch, max_len=max_len)[0])
      return lambda: [out for _, out in shapes.run_batches(  # as a Translator's workers do
          [[i] for i in range(len(batches))], translator.workers, one, False, '')]
    run_all = {'groups_s': searches(True), 'all_rows_s': searches(False)}
    _alternating(run_all, 1)  # compiles
    outputs, seconds = _alternating(run_all, repeats)
    found = [np.count_nonzero(row) for rows in outputs['groups_s'] for row in rows]
    results[name] = {**{way: round(t, 3) for way, t in seconds.items()},
                     'groups_speedup': round(seconds['all_rows_s'] / seconds['groups_s'], 3),
                     'same_outputs': all(np.array_equal(a, b) for a, b in zip(
                         outputs['groups_s'], outputs['all_rows_s'])),
                     'ran_to_their_ends': found == [ends[i] for i in order]}
  return results


def _side_by_side(data_dir: pathlib.Path, trained: dict[str, str]) -> dict:
  """compare_ctranslate2 at base dimensions with random weights (64 newstest2014 sources of 20
  pieces each, outputs to the length limit) and on each trained model given: 'demo' on 256
  embedded test sentences, 'multi30k' on the first 256 of test_2016_flickr and on all 1,000."""
  results = {}
  with tempfile.TemporaryDirectory() as tmp:
    news, tokenizer = _newstest(data_dir, tmp)
    sources = [ids[:20] for ids in tokenizer.encode(news.src) if len(ids) >= 20]
    texts = [t for t, ids in zip(tokenizer.decode(sources), sources)
             if tokenizer.encode([t])[0] == ids][:64]  # 20 pieces again when re-encoded
    cfg = config.base(vocab_size=tokenizer.vocab_size)
    params = train.create_train_state(cfg, jax.random.key(0)).params
    translator = Translator(params, cfg, tokenizer, extra_length=44)  # 64 tokens
    model_dir = export.save_ctranslate2(pathlib.Path(tmp, 'ct2'), params, cfg,
                                        tokenizer.model_proto)
    results['base_random_weights'] = compare_ctranslate2(translator, model_dir, texts)
    for name, path in trained.items():
      sentences = (embedded.splits(10, 10, 256)['test'].src if name == 'demo' else
                   data.read_lines(data_dir / 'multi30k' / 'test_2016_flickr.en')[:256])
      params, cfg, spm_model, _ = checkpoint.load(path)
      model_dir = export.save_ctranslate2(pathlib.Path(tmp, name), params, cfg, spm_model)
      translator = Translator.from_checkpoint(path)
      results[f'{name}_model'] = {'model': path, **compare_ctranslate2(
          translator, model_dir, sentences)}
      results[f'{name}_model_step_costs'] = step_costs(translator, model_dir, sentences)
      if name == 'multi30k':  # the whole test set too
        results['multi30k_model_1000'] = {'model': path, **compare_ctranslate2(
            translator, model_dir, data.read_lines(
                data_dir / 'multi30k' / 'test_2016_flickr.en'), repeats=3)}
  return results


def score_run(data_dir: pathlib.Path, multi30k_model: str | None = None) -> dict:
  """Scoring (forced decoding): test_2016_flickr's 1,000 sources with their references scored by
  the `multi30k` recipe's model (a workdir or checkpoint), against translating the same sources
  greedily and, when ctranslate2 is installed, against CTranslate2's score_batch on the same
  weights (batches of 32 pairs, its three ways as in compare_ctranslate2, the fastest
  counting). Each is compiled or warmed up first (the first call's seconds and programs are
  jaxformer's cold start), then timed alternately, 5 rounds."""
  if not multi30k_model:
    raise SystemExit('--only score needs --multi30k-model (make train-multi30k makes one)')
  text = data.read_parallel_text(data_dir / 'multi30k' / 'test_2016_flickr.en',
                                 data_dir / 'multi30k' / 'test_2016_flickr.de')
  translator = Translator.from_checkpoint(multi30k_model)
  greedy = translator.replace(beam_size=1)
  fns = {'score': lambda: [s.log_prob for s in translator.score(text.src, text.tgt)],
         'greedy': lambda: greedy.translate(text.src)}
  with tempfile.TemporaryDirectory() as tmp:
    engines = _ctranslate2_scorers(translator, multi30k_model, pathlib.Path(tmp), text)
    fns.update(engines)
    start = time.perf_counter()
    fns['score']()
    first = {'seconds': round(time.perf_counter() - start, 2),
             'programs': len(translator._scores.compiled)}  # pylint: disable=protected-access
    for fn in fns.values():  # compile every shape; load and warm up
      fn()
    results, seconds = _alternating(fns, repeats=5)
  out = {'model': multi30k_model, 'pairs': len(text), 'workers': translator.workers,
         'batch_size': translator.decoding.batch_size, 'first_call': first,
         **{f'{name}_s': round(t, 3) for name, t in seconds.items()},
         'score_over_greedy': round(seconds['score'] / seconds['greedy'], 3)}
  if engines:
    best = min(engines, key=seconds.get)
    out['ctranslate2_fastest'] = best
    out['ratio'] = round(seconds[best] / seconds['score'], 3)  # > 1: jaxformer faster
    out['largest_difference'] = float(np.max(np.abs(
        np.array(results['score']) - np.array(results[best]))))
  return out


def _ctranslate2_scorers(translator: Translator, model: str, tmp: pathlib.Path,
                         text: data.ParallelText) -> dict:
  """CTranslate2's score_batch of `text` on an export of the model, one function per way
  (name 'ctranslate2_IxJ', as compare_ctranslate2's), each giving the pairs' log-probabilities
  (pieces and EOS); {} without ctranslate2."""
  if importlib.util.find_spec('ctranslate2') is None:
    return {}
  tok = translator.tokenizer
  model_dir = export.save_ctranslate2(tmp / 'ct2', translator.params, translator.config,
                                      tok.model_proto)
  src = [tok.pieces(ids + [data.EOS_ID]) for ids in tok.encode(text.src)]
  tgt = [tok.pieces(ids) for ids in tok.encode_target(text.tgt)]
  def scorer(engine: Any):
    return lambda: [sum(r.log_probs) for r in engine.score_batch(
        src, tgt, max_batch_size=translator.decoding.batch_size)]
  return {f'ctranslate2_{way}': scorer(engine) for way, engine in _engines(model_dir).items()}


def _engines(model_dir: pathlib.Path, threads: int = 2) -> dict[str, Any]:
  """CTranslate2 translators of an export, one per way ('IxJ': I batches side by side on J
  intra-op threads each): 1x1, 1x`threads` and `threads`x1."""
  import ctranslate2  # pylint: disable=g-import-not-at-top  (an optional extra)
  ways = {(1, 1), (1, threads), (threads, 1)}
  return {f'{inter}x{intra}': ctranslate2.Translator(
      str(model_dir), device='cpu', inter_threads=inter, intra_threads=intra)
          for inter, intra in sorted(ways)}


def run(data_dir: pathlib.Path, demo_model: str | None = None,
        multi30k_model: str | None = None) -> dict:
  if jax.default_backend() == 'gpu':  # the GPU's case: base dims, bf16, batches of 128
    return {'base_newstest2014': base_fast_path(data_dir)}
  results = {}
  cfg = config.base()
  params = jax.jit(Transformer(cfg).init)(jax.random.key(0), jnp.ones((1, 8), jnp.int32),
                                          jnp.ones((1, 8), jnp.int32))['params']
  batch, src_len, out_len = 4, 32, 64
  src = jnp.asarray(np.random.default_rng(0).integers(3, cfg.vocab_size, (batch, src_len)),
                    jnp.int32)
  lengths = jnp.full((batch,), out_len, jnp.int32)  # random weights almost never emit EOS
  for beam in (1, 4):
    for cached in (True, False):
      decode_batch = search.decode_batch if cached else uncached_decoding.decode_batch
      fn = jax.jit(functools.partial(decode_batch, config=cfg, max_len=out_len,
                                     decoding=config.DecodingConfig(beam_size=beam)))
      first, median = median_time(lambda: fn(params, search.Batch(src, lengths)), runs=2)
      results[f'{"greedy" if beam == 1 else "beam4"}_{"cached" if cached else "uncached"}'] = {
          'target_tokens_per_s': round(batch * out_len / median, 1),
          'seconds': round(median, 3), 'compile_and_first_s': round(first, 2)}
  for name in ('greedy', 'beam4'):
    results[f'{name}_cache_speedup'] = round(
        results[f'{name}_cached']['target_tokens_per_s']
        / results[f'{name}_uncached']['target_tokens_per_s'], 1)
  results['setup'] = {'batch': batch, 'source_tokens': src_len, 'output_tokens': out_len}
  results['top_k'] = _top_k_times()
  results['argmax'] = _argmax_times()

  # The tiny config through the Translator (bucketing, batching) on newstest2014 sources.
  with tempfile.TemporaryDirectory() as tmp:
    news, tokenizer = _newstest(data_dir, tmp)
  tiny = config.tiny(vocab_size=tokenizer.vocab_size).replace(max_len=256)
  tiny_params = train.create_train_state(tiny, jax.random.key(0)).params
  translator = Translator(tiny_params, tiny, tokenizer, batch_size=32)
  results['tiny_beam4_newstest2014'] = {
      **_newstest_throughput(translator, news.src[:512]),
      'weights': 'random (untrained): outputs run to the length limit, the slowest case'}
  if demo_model:  # the trained demo model (make demo), e.g. workdirs/demo/average-last5
    results['demo_model_beam4_newstest2014'] = {
        **_newstest_throughput(Translator.from_checkpoint(demo_model, batch_size=32),
                               news.src[:512]), 'model': demo_model}
  if multi30k_model:  # base dims whose sentences end where a trained model's do
    results['base_ending_as_translations'] = ending_as_translations(
        Translator.load(multi30k_model), data.read_lines(
            data_dir / 'multi30k' / 'test_2016_flickr.en')[:256])
  if importlib.util.find_spec('ctranslate2') is not None:
    trained = {'demo': demo_model, 'multi30k': multi30k_model}
    results['ctranslate2'] = _side_by_side(
        data_dir, {name: path for name, path in trained.items() if path})
  return results
