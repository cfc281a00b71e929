"""Preparing a run's data once per filesystem: the shared vocabulary and the token caches.

Every process of a run calls `prepare`. The first to take the workdir's lock trains the
vocabulary and writes the caches; the others wait for the lock, then find both and map the
caches from disk. On a filesystem shared by the cluster one process prepares for all; with a
workdir on each host's own disk, one process per host does. Preparation is deterministic (the
same vocabulary file and cache for the same inputs), so every host ends with the same data.
"""

import contextlib
import fcntl
import logging
import pathlib
from collections.abc import Iterator

from jaxformer.data.cache import TokenizedCorpus, tokenize_corpus
from jaxformer.data.sources import PairSource
from jaxformer.data.tokenizer import Tokenizer, train_tokenizer

log = logging.getLogger(__name__)


@contextlib.contextmanager
def exclusive(lock_path: pathlib.Path) -> Iterator[None]:
  """Holds an exclusive lock on `lock_path` (created if needed) across processes and hosts that
  share its filesystem; released when the holder exits, even on kill -9."""
  lock_path.parent.mkdir(parents=True, exist_ok=True)
  with open(lock_path, 'a', encoding='utf-8') as f:
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      log.info('waiting for another process to prepare the data (%s)', lock_path)
      fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


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
  with exclusive(workdir / '.prepare.lock'):
    tokenizer = train_tokenizer(train_text, workdir / 'spm.model', vocab_size,
                                sample_size=sample_size, seed=seed,
                                check_existing=check_vocabulary)
    corpus = tokenize_corpus(train_text, tokenizer, max_len, workdir / 'cache')
    eval_corpus = None if eval_text is None else tokenize_corpus(eval_text, tokenizer, max_len,
                                                                 workdir / 'cache')
  return tokenizer, corpus, eval_corpus
