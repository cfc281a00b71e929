"""The one entry point of a run's data: `sources` reads a DataConfig, `build` turns the pairs
into a Pipeline (vocabulary, this host's packed training batches on the devices, validation
batches).

Preparation happens once per filesystem: every process of a run calls `prepare` (build does).
The first to take the workdir's lock trains the vocabulary and writes the caches; the others
wait for the lock, then find both and map the caches from disk. On a filesystem shared by the
cluster one process prepares for all; with a workdir on each host's own disk, one process per
host does. Preparation is deterministic (the same vocabulary file and cache for the same
inputs), so every host ends with the same data.
"""

import dataclasses
import logging
import pathlib
from collections.abc import Generator, Iterator
from typing import Any

import jax
import numpy as np

from jaxformer import files, parallel
from jaxformer.config import DataConfig, SettingError, TrainConfig, TransformerConfig
from jaxformer.data import embedded
from jaxformer.data.cache import TokenizedCorpus, tokenize_corpus
from jaxformer.data.packing import PackedBatches, row_lengths, rows_per_device
from jaxformer.data.sources import (DataError, PairSource, ParallelText, TextFiles, load_wmt14,
                                    read_parallel_text, wmt14)
from jaxformer.data.tokenizer import Tokenizer, train_tokenizer

log = logging.getLogger(__name__)


def prepare(workdir: pathlib.Path, train_text: PairSource, eval_text: PairSource | None, *,
            vocab_size: int, max_len: int, sample_size: int, seed: int,
            check_vocabulary: bool = True
            ) -> tuple[Tokenizer, TokenizedCorpus, TokenizedCorpus | None]:
  """(vocabulary, training corpus, validation corpus or None) of a run in `workdir`: trained
  and tokenised by the first process to get here, loaded by the others. With check_vocabulary
  off, an existing vocabulary is used whatever it was trained on (see train_tokenizer)."""
  for text in (train_text, eval_text):
    if text is not None:
      text.fingerprint()  # read and hashed by every process at once, before the lock
  with files.locked(workdir, 'prepare', 'preparing the data', wait=True):
    tokenizer = train_tokenizer(train_text, workdir / 'spm.model', vocab_size,
                                sample_size=sample_size, seed=seed,
                                check_existing=check_vocabulary)
    corpus = tokenize_corpus(train_text, tokenizer, max_len, workdir / 'cache')
    eval_corpus = None if eval_text is None else tokenize_corpus(eval_text, tokenizer, max_len,
                                                                 workdir / 'cache')
  return tokenizer, corpus, eval_corpus


def sources(data: DataConfig) -> tuple[PairSource, ParallelText | None]:
  """The training pairs (streamed: any size) and the validation pairs (in memory; None when
  there are none) of `data`."""
  if data.source == 'wmt14':
    direction = {'source_language': data.source_language, 'data_dir': data.tfds_data_dir}
    train = wmt14(data.target_language, 'train', download=data.download, **direction)
    return train, load_wmt14(data.target_language, 'validation', **direction)
  if data.source == 'embedded':
    corpus = embedded.splits(data.train_pairs, data.validation_pairs, data.test_pairs)
    return corpus['train'], corpus['validation']
  if not (data.train_src and data.train_tgt):
    raise DataError('a text source needs --train-src and --train-tgt.')
  validation = read_parallel_text(data.eval_src, data.eval_tgt) \
      if data.eval_src and data.eval_tgt else None
  return TextFiles(data.train_src, data.train_tgt), validation


@dataclasses.dataclass
class Pipeline:
  """A run's data, prepared: the vocabulary, this host's training batches, the validation
  pairs (text and tokens) and the shapes every batch has."""
  tokenizer: Tokenizer
  train: PackedBatches              # this host's share, shuffled, endless; resumable
  validation: TokenizedCorpus | None
  validation_text: ParallelText | None
  src_len: int                      # packed row lengths
  tgt_len: int
  rows: int                         # rows per device per micro-batch

  def device_batches(self) -> Generator[tuple[dict[str, jax.Array], Any], None, None]:
    """(batch on the local devices, the stream's position after it), prepared ahead by
    background threads (parallel.prefetch); close it to stop them."""
    return parallel.prefetch(self.train)

  def validation_batch_shapes(self) -> dict[str, jax.ShapeDtypeStruct]:
    """The shapes and dtypes of every validation batch (to compile the eval step ahead)."""
    batches = PackedBatches(
        self.validation, src_len=self.src_len, tgt_len=self.tgt_len, rows_per_device=self.rows,
        num_devices=jax.local_device_count(), shuffle=False, num_epochs=1)
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), batches.empty_batch())

  def validation_batches(self) -> Iterator[dict[str, np.ndarray]]:
    """One pass of the validation pairs in batches of the training shapes; every host yields
    the same number of batches (the largest share, padded with empty batches), so that every
    host makes the same pmap calls."""
    batches = PackedBatches(
        self.validation, src_len=self.src_len, tgt_len=self.tgt_len, rows_per_device=self.rows,
        num_devices=jax.local_device_count(), shuffle=False, num_epochs=1,
        process_index=jax.process_index(), process_count=jax.process_count())
    rows = int(parallel.all_hosts(np.array([batches.rows_in_epoch(0)])).max())
    for _ in range(-(-rows // (self.rows * jax.local_device_count()))):
      yield next(batches, None) or batches.empty_batch()


def build(workdir: str | pathlib.Path, model: TransformerConfig, train: TrainConfig,
          train_pairs: PairSource, validation: ParallelText | None = None) -> Pipeline:
  """The Pipeline of a run in `workdir`: its vocabulary and token caches (prepared by one
  process per filesystem), checked to be the same on every process, and this host's share of
  the training pairs as packed batches, positioned at the start of the stream.

  A fresh run refuses a vocabulary trained on other data or settings; a run that resumes keeps
  the one its checkpoints hold (their data positions say whether the data changed)."""
  workdir = files.make_workdir(workdir)
  resuming = files.has_checkpoints(workdir)
  tokenizer, corpus, validation_corpus = prepare(  # (pairs that fit a row: TrainConfig.check_rows)
      workdir, train_pairs, validation, vocab_size=model.vocab_size,
      max_len=min(model.max_len, train.row_len),
      sample_size=train.spm_sample_size, seed=train.seed, check_vocabulary=not resuming)
  if tokenizer.vocab_size != model.vocab_size:
    raise DataError(f"{tokenizer.path} has {tokenizer.vocab_size} pieces, and this run's model "
                    f'vocab_size={model.vocab_size}: the workdir holds a run with another '
                    'vocabulary. Use a new workdir, or the settings its checkpoints were trained '
                    'with.')
  ids = parallel.all_hosts(np.array([PackedBatches.corpus_id(corpus)])).ravel().tolist()
  if len(set(ids)) > 1:
    raise DataError(f'the processes prepared different training data (corpus ids {ids}): '
                    'every process must read the same corpus with the same settings.')
  src_len, tgt_len = row_lengths(corpus, train.row_len, also=validation_corpus)
  try:
    rows = rows_per_device(train.tokens_per_batch // train.accum_steps, max(src_len, tgt_len),
                           jax.device_count())
  except ValueError as e:
    raise SettingError(f'{e} Raise tokens_per_batch or lower accum_steps.') from None
  batches = PackedBatches(
      corpus, src_len=src_len, tgt_len=tgt_len, rows_per_device=rows * train.accum_steps,
      num_devices=jax.local_device_count(), seed=train.seed, process_index=jax.process_index(),
      process_count=jax.process_count())
  return Pipeline(tokenizer, batches, validation_corpus, validation, src_len, tgt_len, rows)
