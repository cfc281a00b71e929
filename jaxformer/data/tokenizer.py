"""One sentencepiece BPE vocabulary shared by source and target (§5.1)."""

import hashlib
import io
import itertools
import json
import logging
import os
import pathlib
import re
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from jaxformer import files
from jaxformer.data.sources import DataError, PairSource
from jaxformer.errors import reason

log = logging.getLogger(__name__)

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
_ONE_LINE = {ord(c): ' ' for c in '\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029'}  # as str.splitlines


class Tokenizer:
  """A loaded sentencepiece model: text <-> ids, with 0 = pad, 1 = eos, 2 = unk.

  The same model reads the source and the target (`encode`, `encode_target`). A model made
  elsewhere with one per side over a joint vocabulary (a MarianMT folder's) loads as a
  SidedTokenizer, from the same constructor: the bytes say which (SIDED_MAGIC)."""

  def __new__(cls, model_path: str | os.PathLike, model_proto: bytes | None = None):
    if cls is Tokenizer and _content(model_path, model_proto).startswith(SIDED_MAGIC):
      cls = SidedTokenizer
    return super().__new__(cls)

  def __init__(self, model_path: str | os.PathLike, model_proto: bytes | None = None):
    self.path = pathlib.Path(model_path)
    self._sp = _processor(self.path, _content(model_path, model_proto))
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
    """The number of pieces, the ids 0 (pad), 1 (EOS) and 2 (unk) included."""
    return self._sp.get_piece_size()

  def encode(self, texts: Sequence[str], num_threads: int = -1) -> list[list[int]]:
    """Token ids of each source text, without EOS. One text (a server's request, a terminal's
    line) is encoded alone: sentencepiece's list call costs several times its encoding."""
    if len(texts) == 1:
      return [self._sp.encode(texts[0])]
    return self._sp.encode(list(texts), num_threads=num_threads)

  def encode_target(self, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each target text (a reference, a forced prefix), without EOS."""
    return self.encode(texts)

  def files(self) -> dict[str, bytes]:
    """The sentencepiece file(s) that tokenize for this vocabulary outside jaxformer, by the
    names an export writes them under."""
    return {'spm.model': self.model_proto}

  def sides(self) -> tuple[bytes, bytes]:
    """The sentencepiece models of the source and of the target (this one, twice)."""
    return self.model_proto, self.model_proto

  def coverage(self, texts: Sequence[str]) -> dict[str, float]:
    """How well this vocabulary fits `texts`: the share of their characters spelled with
    byte-fallback pieces or unk (characters the vocabulary has never seen), and the pieces per
    word (higher: a vocabulary made for other text)."""
    chars = sum(len(text) for text in texts)
    words = sum(len(text.split()) for text in texts)
    ids = self.encode(texts)
    pieces = sum(map(len, ids))
    fallback = sum(1 for row in ids for i in row if self._unseen(i))
    return {'fallback_share': fallback / max(chars, 1), 'pieces_per_word': pieces / max(words, 1)}

  def _unseen(self, i: int) -> bool:
    """Whether piece i spells a character the vocabulary has not seen (counted once)."""
    # A character in byte pieces is its UTF-8 lead byte plus continuation bytes (0b10xxxxxx).
    return i == UNK_ID or (self._sp.is_byte(i) and int(self._sp.id_to_piece(i)[1:-1], 16) >> 6
                           != 2)  # ('<0xNN>')

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
    return [self._decode_row([i for i in _until_eos(row) if i != PAD_ID]).translate(_ONE_LINE)
            for row in ids]

  def _decode_row(self, ids: list[int]) -> str:
    return self._sp.decode(ids)


# The first bytes of a SidedTokenizer's serialisation (what checkpoints and exports store as
# their spm.model), then a line of JSON ({'pieces', 'source', 'target'}: the joint vocabulary
# in id order, and the byte sizes of the two sentencepiece models), then the two models.
SIDED_MAGIC = b'jaxformer two-sided vocabulary 1\n'


class SidedTokenizer(Tokenizer):
  """Two sentencepiece models, one for the source and one for the target, over one joint
  vocabulary of pieces (a MarianMT's source.spm, target.spm and vocab.json): text becomes the
  side's pieces, and pieces the joint vocabulary's ids, a piece it lacks unk, as transformers'
  MarianTokenizer does. A leading language code (`>>fr<<`, multilingual OPUS-MT models) is one
  piece of its own, as there. Ids 0, 1 and 2 are pad, EOS and unk, as for every jaxformer
  vocabulary (`sided_bytes` makes it so)."""

  def __init__(self, model_path: str | os.PathLike, model_proto: bytes | None = None):
    self.path = pathlib.Path(model_path)
    self.model_proto = _content(model_path, model_proto)
    try:
      header, rest = self.model_proto[len(SIDED_MAGIC):].split(b'\n', 1)
      layout = json.loads(header)
      source, target = rest[:layout['source']], rest[layout['source']:]
      self._pieces: list[str] = layout['pieces']
    except (ValueError, KeyError, TypeError) as e:
      raise DataError(f'{self.path}: a damaged two-sided vocabulary ({e}).') from None
    self._source, self._sp = _processor(self.path, source), _processor(self.path, target)
    self._ids = {piece: i for i, piece in enumerate(self._pieces)}

  @property
  def vocab_size(self) -> int:
    """The number of pieces of the joint vocabulary."""
    return len(self._pieces)

  def encode(self, texts: Sequence[str], num_threads: int = -1) -> list[list[int]]:
    """Token ids of each source text (by the source model), without EOS."""
    return [self._joint_ids(self._source, text) for text in texts]

  def encode_target(self, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each target text (by the target model), without EOS."""
    return [self._joint_ids(self._sp, text) for text in texts]

  def _joint_ids(self, model: spm.SentencePieceProcessor, text: str) -> list[int]:
    code = []
    if text.startswith('>>') and (end := text.find('<<')) != -1:
      code, text = [text[:end + 2]], text[end + 2:]
    return self.piece_ids(code + model.encode(text, out_type=str))

  def files(self) -> dict[str, bytes]:
    """source.spm and target.spm, as a MarianMT folder names them."""
    return dict(zip(('source.spm', 'target.spm'), self.sides()))

  def sides(self) -> tuple[bytes, bytes]:
    """The sentencepiece models of the source and of the target."""
    return self._source.serialized_model_proto(), self._sp.serialized_model_proto()

  def _unseen(self, i: int) -> bool:
    return i == UNK_ID

  def pieces(self, ids: Sequence[int]) -> list[str]:
    """The joint vocabulary's piece of each id."""
    return [self._pieces[int(i)] for i in ids]

  def piece_ids(self, pieces: Sequence[str]) -> list[int]:
    """The joint vocabulary's id of each piece; unk for a piece it lacks."""
    return [self._ids.get(p, UNK_ID) for p in pieces]

  def _decode_row(self, ids: list[int]) -> str:
    # A joint vocabulary's piece may be the source model's alone, which the target model's
    # decoder passes through as it is: its word boundaries go as transformers' do.
    return self._sp.decode_pieces(self.pieces(ids)).replace('\u2581', ' ').strip()


def sided_bytes(source: bytes, target: bytes, pieces: Sequence[str]) -> bytes:
  """A SidedTokenizer's serialisation: the source and target sentencepiece models and the
  joint vocabulary's pieces in id order (pad, EOS and unk first)."""
  header = json.dumps({'pieces': list(pieces), 'source': len(source), 'target': len(target)},
                      ensure_ascii=False).encode()
  return SIDED_MAGIC + header + b'\n' + source + target


def _content(model_path: str | os.PathLike, model_proto: bytes | None) -> bytes:
  """The model's bytes: `model_proto`, else the file's (a DataError if it cannot be read)."""
  if model_proto is not None:
    return model_proto
  try:
    return pathlib.Path(model_path).read_bytes()
  except OSError as e:
    raise DataError(f'{model_path}: not a sentencepiece model ({reason(e)}).') from None


def _processor(path: pathlib.Path, model: bytes) -> spm.SentencePieceProcessor:
  try:
    return spm.SentencePieceProcessor(model_proto=model)
  except (OSError, RuntimeError, TypeError) as e:
    raise DataError(f'{path}: not a sentencepiece model ({reason(e)}).') from None


def _until_eos(row: Sequence[int]) -> list[int]:
  row = [int(i) for i in row]
  return row[:row.index(EOS_ID)] if EOS_ID in row else row


class VocabularyTooLarge(DataError):
  """More pieces asked for than sentencepiece can make of the text; `largest` is the most it
  can."""

  def __init__(self, message: str, largest: int):
    super().__init__(message)
    self.largest = largest


def _training_failure(message: str, vocab_size: int, sentences: int) -> DataError:
  """sentencepiece's training error as what to change, in one line."""
  if high := re.search(r'Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+)',
                       message):
    return VocabularyTooLarge(
        f'vocab_size={vocab_size} is more pieces than sentencepiece can make of these '
        f'{sentences} sentences (at most {high[1]}): --set model.vocab_size={high[1]} (or '
        'less), or train on more text.', int(high[1]))
  if low := re.search(r'smaller than required_chars\. \d+ vs (\d+)', message):
    return DataError(f'vocab_size={vocab_size} is too small: the 256 byte-fallback pieces, the '
                     f'special ids and the characters of this text need at least {low[1]}: '
                     f'--set model.vocab_size={low[1]} (or more).')
  return DataError(f'sentencepiece training failed for vocab_size={vocab_size} on {sentences} '
                   f'sentences: {message.strip().splitlines()[0]}')


def sample(texts: 'Sequence[str] | PairSource', sample_size: int, seed: int) -> Iterator[str]:
  """A seeded sample of the sentences, in order. A PairSource's sentences are numbered as the
  list of its source sentences followed by its target sentences, so it gives the same sample as
  that list would; each side is streamed once."""
  rng = np.random.default_rng(seed)
  count = len(texts) * (1 if isinstance(texts, Sequence) else 2)
  chosen = np.sort(rng.choice(count, size=sample_size, replace=False)) \
      if count > sample_size else np.arange(count)
  if isinstance(texts, Sequence):
    return (texts[i] for i in chosen)
  pairs = len(texts)
  picks = (chosen[chosen < pairs], chosen[chosen >= pairs] - pairs)
  return itertools.chain.from_iterable(
      _select(texts.side(index), picks[index]) for index in (0, 1))


def _select(sentences: Iterator[str], indices: np.ndarray) -> Iterator[str]:
  """The sentences at the given sorted indices."""
  wanted = iter(indices.tolist())
  target = next(wanted, None)
  for i, sentence in enumerate(sentences):
    if target is None:
      return
    if i == target:
      yield sentence
      target = next(wanted, None)


def vocabulary_record(texts: 'Sequence[str] | PairSource', vocab_size: int, sample_size: int,
                      seed: int) -> dict[str, Any]:
  """What a vocabulary is trained on, as stored beside it (spm.model.json)."""
  corpus = texts.fingerprint() if hasattr(texts, 'fingerprint') else hashlib.sha256(
      '\n'.join(texts).encode('utf-8', 'surrogatepass')).hexdigest()[:20]
  return {'corpus': corpus, 'sentences': len(texts) * (1 if isinstance(texts, Sequence) else 2),
          'sample_size': sample_size, 'seed': seed, 'vocab_size': vocab_size}


def _check_record(model_path: pathlib.Path, record: dict[str, Any]) -> None:
  """A one-line error when the existing vocabulary was trained on something else."""
  record_path = model_path.with_name(model_path.name + '.json')
  if not record_path.exists():  # a vocabulary from before records were kept, or given by hand
    log.warning('%s: its training data is not recorded (no %s beside it); using it as given',
                model_path, record_path.name)
    return
  saved = files.read_record(record_path, 'the vocabulary record')
  if 'inherited_from' in saved:  # a fine-tuning run's: its parent's, never trained here
    return
  changed = [f'{key} {saved.get(key)} -> {value}' for key, value in record.items()
             if saved.get(key) != value]
  if changed:
    raise DataError(
        f'{model_path} was trained on other data or settings ({", ".join(changed)}): use a new '
        f'workdir for this corpus, or delete {model_path} and {record_path.name} (and the '
        "workdir's cache/) to train a new vocabulary.")


def _save(model_path: pathlib.Path, model: bytes, record: dict[str, Any]) -> None:
  """The vocabulary and its record beside it, each written whole (files.write_atomically); the
  record goes again if the vocabulary cannot be written, so that no record describes a
  vocabulary that is not there."""
  record_path = model_path.with_name(model_path.name + '.json')
  files.write_atomically(record_path, json.dumps(record, indent=1).encode(),
                         "the vocabulary's record")
  try:
    files.write_atomically(model_path, model, 'the vocabulary')
  except files.WriteError:
    record_path.unlink(missing_ok=True)
    raise


def train_tokenizer(texts: 'Sequence[str] | PairSource', model_path: str | os.PathLike,
                    vocab_size: int, *, sample_size: int = 2_000_000, seed: int = 0,
                    check_existing: bool = True, what: str = 'vocabulary') -> Tokenizer:
  """Trains a BPE model on a seeded sample of `texts` (a list of sentences, or both sides of a
  PairSource, streamed), unless the file exists.

  Text is NFKC-normalised and whitespace runs are collapsed (sentencepiece's nmt_nfkc); any
  character unseen in training still round-trips through byte fallback, so nothing maps to unk.
  sentencepiece trains on every core, and the same texts, size and seed give the same model
  file whatever the number of cores. What the model was trained on is recorded beside it
  (MODEL.json); an existing model trained on something else is a DataError, unless
  check_existing is off (the trainer turns it off when a checkpoint pins the vocabulary).
  `what` names it in the log line.
  """
  model_path = pathlib.Path(model_path)
  record = vocabulary_record(texts, vocab_size, sample_size, seed)
  if model_path.exists():
    if check_existing:
      _check_record(model_path, record)
    return Tokenizer(model_path)
  try:
    model_path.parent.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise files.cannot_write(model_path.parent, 'the vocabulary', e) from None
  model = io.BytesIO()
  log.info('training a %d-piece %s on a sample of %d of %d sentences', vocab_size, what,
           min(sample_size, record['sentences']), record['sentences'])
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=(s.replace('\n', ' ') for s in sample(texts, sample_size, seed)),
        model_writer=model, vocab_size=vocab_size, model_type='bpe',
        pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1, byte_fallback=True,
        character_coverage=0.9999, input_sentence_size=0, shuffle_input_sentence=False,
        num_threads=len(os.sched_getaffinity(0)), minloglevel=2)
  except RuntimeError as e:
    raise _training_failure(str(e), vocab_size, min(sample_size, record['sentences'])) from None
  # The thread count is the one field that differs between hosts: stored as 1, so that the file
  # is the same everywhere (the pieces and scores do not depend on it).
  proto = sentencepiece_model_pb2.ModelProto.FromString(model.getvalue())
  proto.trainer_spec.num_threads = 1
  record['coverage'] = Tokenizer.from_bytes(proto.SerializeToString()).coverage(
      first_sentences(texts, COVERAGE_SAMPLE))  # what a fine-tuning run compares with
  _save(model_path, proto.SerializeToString(), record)
  return Tokenizer(model_path)


COVERAGE_SAMPLE = 10_000  # sentences whose coverage a vocabulary's record keeps


def first_sentences(texts: 'Sequence[str] | PairSource', count: int) -> list[str]:
  """The first `count` sentences: of a list, or of both sides of a PairSource's first pairs."""
  if isinstance(texts, Sequence):
    return list(texts[:count])
  src, tgt = next(iter(texts.chunks(count // 2)), ([], []))
  return src + tgt


def inherit_vocabulary(model: bytes, model_path: str | os.PathLike, origin: str,
                       coverage: dict[str, float] | None = None, *,
                       parent: str | None = None) -> Tokenizer:
  """Writes a trained model's vocabulary to `model_path` for a run that fine-tunes it, with a
  record saying where it came from (`origin`, and `parent`: the model's resolved path, which a
  rerun of the same fine-tuning command is recognised by) and its `coverage` of the new data,
  so that train_tokenizer uses it as it is; a DataError when another vocabulary is there
  already."""
  model_path = pathlib.Path(model_path)
  if model_path.exists() and model_path.read_bytes() != model:
    raise DataError(f'{model_path} is another vocabulary than that of {origin}: fine-tune in a '
                    'new workdir.')
  record = {'inherited_from': origin, 'parent': parent,
            'vocab_size': Tokenizer.from_bytes(model).vocab_size, 'coverage': coverage}
  _save(model_path, model, record)
  return Tokenizer(model_path)


def record_near(model: str | os.PathLike) -> dict[str, Any] | None:
  """The vocabulary record (spm.model.json) of the training workdir that a model folder is or
  lies in (files.record_near), or None (an exported folder, or a vocabulary from before
  records were kept)."""
  found = files.record_near(model, 'spm.model.json')
  return found and found[1]
