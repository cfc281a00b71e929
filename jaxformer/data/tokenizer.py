"""One sentencepiece BPE vocabulary shared by source and target (§5.1)."""

import io
import os
import pathlib
import re
import tempfile
from collections.abc import Sequence

import numpy as np
import sentencepiece as spm

from jaxformer.data.sources import DataError

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
_ONE_LINE = {ord(c): ' ' for c in '\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029'}  # as str.splitlines


class Tokenizer:
  """A loaded sentencepiece model: text <-> ids, with 0 = pad, 1 = eos, 2 = unk."""

  def __init__(self, model_path: str | os.PathLike, model_proto: bytes | None = None):
    self.path = pathlib.Path(model_path)
    try:
      self._sp = spm.SentencePieceProcessor(model_file=str(self.path)) if model_proto is None \
          else spm.SentencePieceProcessor(model_proto=model_proto)
    except (OSError, RuntimeError, TypeError) as e:
      raise DataError(f'{self.path}: not a sentencepiece model ({e}).') from None
    if (self._sp.pad_id(), self._sp.eos_id(), self._sp.unk_id()) != (PAD_ID, EOS_ID, UNK_ID):
      raise DataError(f'{self.path}: expected pad=0, eos=1, unk=2; train it with '
                      'jaxformer.data.train_tokenizer.')
    self.model_proto: bytes = self._sp.serialized_model_proto()  # what checkpoints store

  @classmethod
  def from_bytes(cls, model_proto: bytes, name: str = '<checkpoint>') -> 'Tokenizer':
    """A model stored in memory (e.g. in a checkpoint); `name` is shown in messages."""
    return cls(name, model_proto=model_proto)

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  def encode(self, texts: Sequence[str], num_threads: int = -1) -> list[list[int]]:
    """Token ids of each text, without EOS."""
    return self._sp.encode(list(texts), num_threads=num_threads)

  def pieces(self, ids: Sequence[int]) -> list[str]:
    """The sentencepiece string of each id (for plots, debugging and CTranslate2)."""
    return [self._sp.id_to_piece(int(i)) for i in ids]

  def piece_ids(self, pieces: Sequence[str]) -> list[int]:
    """The id of each sentencepiece string (the inverse of `pieces`)."""
    return [self._sp.piece_to_id(p) for p in pieces]

  def decode(self, ids: Sequence[Sequence[int]] | np.ndarray) -> list[str]:
    """Text of each id sequence; stops at the first EOS and ignores padding.

    Byte-fallback pieces can spell line breaks; they become spaces, so that one sentence is
    always one line of output.
    """
    texts = []
    for row in ids:
      row = [int(i) for i in row]
      if EOS_ID in row:
        row = row[:row.index(EOS_ID)]
      texts.append(self._sp.decode([i for i in row if i != PAD_ID]).translate(_ONE_LINE))
    return texts


def _training_failure(message: str, vocab_size: int, sentences: int) -> str:
  """sentencepiece's training error as what to change, in one line."""
  if high := re.search(r'Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+)',
                       message):
    return (f'vocab_size={vocab_size} is more pieces than sentencepiece can make of these '
            f'{sentences} sentences (at most {high[1]}): lower vocab_size, or train on more text.')
  if low := re.search(r'smaller than required_chars\. \d+ vs (\d+)', message):
    return (f'vocab_size={vocab_size} is too small: the 256 byte-fallback pieces, the special ids '
            f'and the characters of this text need at least {low[1]}: raise vocab_size.')
  return (f'sentencepiece training failed for vocab_size={vocab_size} on {sentences} sentences: '
          f'{message.strip().splitlines()[0]}')


def train_tokenizer(texts: Sequence[str], model_path: str | os.PathLike, vocab_size: int, *,
                    sample_size: int = 2_000_000, seed: int = 0) -> Tokenizer:
  """Trains a BPE model on a seeded sample of `texts` (both sides), unless the file exists.

  Text is NFKC-normalised and whitespace runs are collapsed (sentencepiece's nmt_nfkc); any
  character unseen in training still round-trips through byte fallback, so nothing maps to unk.
  The same texts, size and seed give the same model file.
  """
  model_path = pathlib.Path(model_path)
  if model_path.exists():
    return Tokenizer(model_path)
  rng = np.random.default_rng(seed)
  chosen = rng.choice(len(texts), size=sample_size, replace=False) \
      if len(texts) > sample_size else np.arange(len(texts))
  model_path.parent.mkdir(parents=True, exist_ok=True)
  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=(texts[i].replace('\n', ' ') for i in np.sort(chosen)),
        model_writer=model, vocab_size=vocab_size, model_type='bpe',
        pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1, byte_fallback=True,
        character_coverage=0.9999, input_sentence_size=0, shuffle_input_sentence=False,
        num_threads=1, minloglevel=2)
  except RuntimeError as e:
    raise DataError(_training_failure(str(e), vocab_size, len(chosen))) from None
  # A temporary file of this writer's own, renamed into place: readers never see half a model,
  # and hosts that train the same (deterministic) model at once never share a temporary file.
  with tempfile.NamedTemporaryFile(dir=model_path.parent, prefix=f'.{model_path.name}.',
                                   suffix='.partial', delete=False) as partial:
    partial.write(model.getvalue())
  os.replace(partial.name, model_path)
  return Tokenizer(model_path)
