"""The data section: tokenise-and-cache time and peak memory on Multi30k; packing efficiency
(real-token fraction per side) on Multi30k train and newstest2014; packed target tokens/s from
the cache on one core; packing-plan time for 1M WMT-like pairs."""

import os
import pathlib
import tempfile
import time

import numpy as np

from bench.common import peak_rss_mb
from jaxformer import data


def _efficiency(corpus: data.TokenizedCorpus, row_len: int) -> dict:
  """Real-token fraction of the slots over one epoch of full batches (4 rows each)."""
  src_len, tgt_len = data.row_lengths(corpus, row_len)
  stream = data.PackedBatches(corpus, src_len=src_len, tgt_len=tgt_len, rows_per_device=4)
  src, tgt = data.padding_efficiency(stream, stream.rows_in_epoch(0) // 4)
  return {'row_lengths': [src_len, tgt_len], 'src': round(src, 4), 'tgt': round(tgt, 4)}


def run(data_dir: pathlib.Path) -> dict:
  results = {}
  multi30k, newstest = data_dir / 'multi30k', data_dir / 'newstest2014'
  with tempfile.TemporaryDirectory() as tmp:
    # Tokenise and cache Multi30k train (first, so the peak RSS is this step's).
    rss_before = peak_rss_mb()
    start = time.perf_counter()
    text = data.read_parallel_text(multi30k / 'train.en', multi30k / 'train.de')
    tokenizer = data.train_tokenizer(text.src + text.tgt, pathlib.Path(tmp, 'spm.model'), 8000)
    trained = time.perf_counter()
    corpus = data.tokenize_corpus(text, tokenizer, max_len=256, cache_dir=tmp)
    done = time.perf_counter()
    start_load = time.perf_counter()
    data.tokenize_corpus(text, tokenizer, max_len=256, cache_dir=tmp)
    results['multi30k_tokenise'] = {
        'pairs': len(text), 'vocab_size': tokenizer.vocab_size,
        'read_and_train_spm_s': round(trained - start, 3),
        'tokenise_and_cache_s': round(done - trained, 3),
        'reload_from_cache_s': round(time.perf_counter() - start_load, 3),
        'peak_rss_mb_before': round(rss_before, 1), 'peak_rss_mb_after': round(peak_rss_mb(), 1)}

    # Padding efficiency. newstest2014 gets its own 8k vocabulary so that its token lengths
    # look like WMT's (a Multi30k vocabulary splits news text into many more pieces).
    results['efficiency_multi30k_train'] = _efficiency(corpus, 256)
    news = data.read_parallel_text(newstest / 'newstest2014.en', newstest / 'newstest2014.de')
    news_tok = data.train_tokenizer(news.src + news.tgt, pathlib.Path(tmp, 'news.model'), 8000)
    news_corpus = data.tokenize_corpus(news, news_tok, max_len=256)
    results['efficiency_newstest2014'] = _efficiency(news_corpus, 256)
    results['newstest2014_mean_tokens'] = [round(float(news_corpus.src_lengths.mean()), 1),
                                           round(float(news_corpus.tgt_lengths.mean()), 1)]

    # Throughput on one core: 25k-token batches for 5 epochs, packing plans included.
    cores = os.sched_getaffinity(0) if hasattr(os, 'sched_setaffinity') else None
    if cores:
      os.sched_setaffinity(0, {min(cores)})
    src_len, tgt_len = data.row_lengths(corpus, 256)
    rows = data.rows_per_device(25000, tgt_len, 1)
    stream = data.PackedBatches(corpus, src_len=src_len, tgt_len=tgt_len, rows_per_device=rows)
    epochs = 5
    num_batches = epochs * stream.rows_in_epoch(0) // rows
    stream = data.PackedBatches(corpus, src_len=src_len, tgt_len=tgt_len, rows_per_device=rows)
    tokens = 0.0
    start = time.perf_counter()
    for _ in range(num_batches):
      tokens += next(stream)['weights'].sum()
    seconds = time.perf_counter() - start
    if cores:
      os.sched_setaffinity(0, cores)  # the other sections use every core
    results['pipeline_one_core'] = {
        'batches': num_batches, 'rows_per_batch': rows, 'epochs': epochs,
        'target_tokens_per_s': round(tokens / seconds), 'seconds': round(seconds, 3)}

    # Planning (pack_rows) cost at WMT scale: 1M pairs with newstest2014's lengths.
    rng = np.random.default_rng(0)
    pick = rng.integers(0, len(news_corpus), 1_000_000)
    start = time.perf_counter()
    planned = data.pack_rows(news_corpus.src_lengths[pick], news_corpus.tgt_lengths[pick],
                             *data.row_lengths(news_corpus, 256), rng=rng)
    results['pack_rows_1M_pairs'] = {'seconds': round(time.perf_counter() - start, 2),
                                     'rows': int(planned.max()) + 1}
  return results
