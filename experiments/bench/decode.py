"""The decode section: target tokens/s at base dimensions (random weights, 64 output tokens):
greedy and beam 4, with and without the key/value cache; beam-4 sentences/s of the tiny config
on newstest2014 sources (and of a trained model with --demo-model)."""

import functools
import pathlib
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from bench.common import median_time
from jaxformer import config, data, evaluate, train
from jaxformer.model import Transformer


def _newstest_throughput(translator: evaluate.Translator, sources: list[str]) -> dict:
  """Beam-4 sentences/s of a Translator (bucketing and batching included), compiled first."""
  translator.translate(sources[:64])
  start = time.perf_counter()
  outputs = translator.translate(sources)
  seconds = time.perf_counter() - start
  return {'sentences': len(sources), 'sentences_per_s': round(len(sources) / seconds, 2),
          'seconds': round(seconds, 2), 'mean_output_pieces': round(float(np.mean(
              [len(x) for x in translator.tokenizer.encode(outputs)])), 1)}


def run(data_dir: pathlib.Path, demo_model: str | None = None) -> dict:
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
      fn = jax.jit(functools.partial(evaluate.search, config=cfg, max_len=out_len,
                                     beam_size=beam, alpha=0.6, cached=cached))
      first, median = median_time(lambda: fn(params, src, lengths), runs=2)
      results[f'{"greedy" if beam == 1 else "beam4"}_{"cached" if cached else "uncached"}'] = {
          'target_tokens_per_s': round(batch * out_len / median, 1),
          'seconds': round(median, 3), 'compile_and_first_s': round(first, 2)}
  for search in ('greedy', 'beam4'):
    results[f'{search}_cache_speedup'] = round(
        results[f'{search}_cached']['target_tokens_per_s']
        / results[f'{search}_uncached']['target_tokens_per_s'], 1)
  results['setup'] = {'batch': batch, 'source_tokens': src_len, 'output_tokens': out_len}

  # The tiny config through the Translator (bucketing, batching) on newstest2014 sources.
  news = data.read_parallel_text(data_dir / 'newstest2014' / 'newstest2014.en',
                                 data_dir / 'newstest2014' / 'newstest2014.de')
  with tempfile.TemporaryDirectory() as tmp:
    tokenizer = data.train_tokenizer(news.src + news.tgt, pathlib.Path(tmp, 'spm.model'), 8000)
  tiny = config.tiny(vocab_size=tokenizer.vocab_size).replace(max_len=256)
  tiny_params = train.create_train_state(tiny, jax.random.key(0)).params
  translator = evaluate.Translator(tiny_params, tiny, tokenizer, batch_size=32)
  results['tiny_beam4_newstest2014'] = {
      **_newstest_throughput(translator, news.src[:512]),
      'weights': 'random (untrained): outputs run to the length limit, the slowest case'}
  if demo_model:  # the trained demo model (make demo), e.g. workdirs/demo/average-last5
    results['demo_model_beam4_newstest2014'] = {
        **_newstest_throughput(evaluate.Translator.from_checkpoint(demo_model, batch_size=32),
                               news.src[:512]), 'model': demo_model}
  return results
