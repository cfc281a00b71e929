"""jaxformer.data.tokenizer: the shared sentencepiece vocabulary."""

import io
import json
import pathlib
import re
import subprocess
import sys
import time

import numpy as np
import pytest
import sentencepiece as spm
from helpers import synthetic_text

from jaxformer import data, files
from jaxformer.data import DataError


def test_tokenizer_is_deterministic_and_reused(tmp_path):
  text = synthetic_text(500, seed=3)
  texts = text.src + text.tgt
  a = data.train_tokenizer(texts, tmp_path / 'a.model', vocab_size=300, seed=5)
  b = data.train_tokenizer(texts, tmp_path / 'b.model', vocab_size=300, seed=5)
  assert (tmp_path / 'a.model').read_bytes() == (tmp_path / 'b.model').read_bytes()
  before = (tmp_path / 'a.model').stat().st_mtime_ns
  again = data.train_tokenizer(texts, tmp_path / 'a.model', vocab_size=300, seed=5)
  assert (tmp_path / 'a.model').stat().st_mtime_ns == before and again.vocab_size == 300
  assert a.vocab_size == b.vocab_size == 300


def test_a_vocabulary_trained_on_other_data_is_a_clear_error(tmp_path):
  """spm.model.json records the corpus, sample, seed and size: a workdir's vocabulary is never
  silently reused for another corpus."""
  text = synthetic_text(500, seed=3)
  data.train_tokenizer(text, tmp_path / 'spm.model', vocab_size=300, seed=5)
  assert json.loads((tmp_path / 'spm.model.json').read_text())['corpus'] == text.fingerprint()
  for other, change in ((dict(texts=synthetic_text(500, seed=4)), 'corpus'),
                        (dict(seed=6), 'seed 5 -> 6'), (dict(vocab_size=320), 'vocab_size'),
                        (dict(sample_size=100), 'sample_size')):
    settings = dict(texts=text, vocab_size=300, seed=5) | other
    with pytest.raises(DataError, match=rf'spm\.model was trained on other data or settings '
                       rf'\(.*{change}.*\): use a new workdir'):
      data.train_tokenizer(settings.pop('texts'), tmp_path / 'spm.model', **settings)
  (tmp_path / 'spm.model.json').write_text('[')  # a record another tool (or a hand) broke
  with pytest.raises(files.RecordError, match=r'spm\.model\.json: cannot read the vocabulary '
                     r'record \(Expecting value'):
    data.train_tokenizer(text, tmp_path / 'spm.model', vocab_size=300, seed=5)


def test_vocabulary_training_threads_do_not_change_the_model(tmp_path, monkeypatch):
  """sentencepiece trains on every core; the model file is the same with one."""
  text = synthetic_text(3000, seed=3)
  data.train_tokenizer(text, tmp_path / 'many.model', vocab_size=400)
  monkeypatch.setattr(data.tokenizer.os, 'sched_getaffinity', lambda pid: {0})
  data.train_tokenizer(text, tmp_path / 'one.model', vocab_size=400)
  assert (tmp_path / 'many.model').read_bytes() == (tmp_path / 'one.model').read_bytes()


def test_a_streamed_source_samples_the_same_sentences_as_its_list(tmp_path):
  """A PairSource (streamed side by side) gives the model its list of sentences gives."""
  text = synthetic_text(3000, seed=3)
  (tmp_path / 'a.en').write_text('\n'.join(text.src) + '\n')
  (tmp_path / 'a.de').write_text('\n'.join(text.tgt) + '\n')
  files = data.TextFiles(tmp_path / 'a.en', tmp_path / 'a.de')
  data.train_tokenizer(files, tmp_path / 'files.model', vocab_size=400, sample_size=2500)
  data.train_tokenizer(text.src + text.tgt, tmp_path / 'list.model', vocab_size=400,
                       sample_size=2500)
  assert (tmp_path / 'files.model').read_bytes() == (tmp_path / 'list.model').read_bytes()


def test_tokenizer_round_trips_and_has_fixed_special_ids(tokenizer):
  texts = ['the small dog walks under the red house', 'Grüße, €5 😀 — new words too']
  ids = tokenizer.encode(texts)
  assert data.UNK_ID not in {i for row in ids for i in row}  # byte fallback, never unk
  assert tokenizer.decode([row + [data.EOS_ID, 7, 7] for row in ids]) == texts
  assert [tokenizer.encode([text])[0] for text in texts] == ids  # one text: encoded alone
  assert (data.PAD_ID, data.EOS_ID, data.UNK_ID) == (0, 1, 2)


def test_tokenizer_rejects_a_file_that_is_not_a_model(tmp_path):
  (tmp_path / 'bad.model').write_text('not a model')
  with pytest.raises(DataError, match='not a sentencepiece model'):
    data.Tokenizer(tmp_path / 'bad.model')


@pytest.mark.parametrize('vocab_size,message', [
    (5000, r'^vocab_size=5000 is more pieces than sentencepiece can make of these 600 sentences '
           r'\(at most (\d+)\): --set model.vocab_size=\1 \(or less\), or train on more text\.$'),
    (100, r'^vocab_size=100 is too small: the 256 byte-fallback pieces, the special ids and the '
          r'characters of this text need at least (\d+): --set model.vocab_size=\1 '
          r'\(or more\)\.$')])
def test_vocabulary_sizes_sentencepiece_cannot_make_say_what_to_change(tmp_path, vocab_size,
                                                                       message):
  """The error names the setting and the value that works: that value trains."""
  text = synthetic_text(300, seed=2)
  with pytest.raises(DataError, match=message) as error:
    data.train_tokenizer(text.src + text.tgt, tmp_path / 'spm.model', vocab_size)
  assert not list(tmp_path.iterdir())  # no model, no temporary file left behind
  works = int(re.match(message, str(error.value))[1])
  assert data.train_tokenizer(text.src + text.tgt, tmp_path / 'spm.model', works).vocab_size \
      == works


_RACE = """
import pathlib, sys, time
sys.path.insert(0, {tests!r})
from helpers import WORDS, synthetic_text
from jaxformer import data
text = synthetic_text(400, seed=11)
go = pathlib.Path({go!r})
(go.parent / f'ready-{{sys.argv[1]}}').touch()
while not go.exists():
  time.sleep(0.001)
for round in range(25):  # the same 25 models, one after another, in every worker
  tokenizer = data.train_tokenizer(text.src + text.tgt, go.parent / f'spm-{{round}}.model', 300)
  print(round, tokenizer.vocab_size, len(tokenizer.model_proto))
"""


def test_hosts_training_the_vocabulary_at_once_never_see_half_a_model(tmp_path):
  """Six processes train the same 25 models into the same paths, released together (as hosts
  sharing a workdir do): each reads every model whole, and only the models are left."""
  tests = str(pathlib.Path(__file__).resolve().parent)
  code = _RACE.format(tests=tests, go=str(tmp_path / 'go'))
  workers = [subprocess.Popen([sys.executable, '-c', code, str(i)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(6)]
  deadline = time.monotonic() + 120
  while len(list(tmp_path.glob('ready-*'))) < 6 and time.monotonic() < deadline:
    time.sleep(0.05)  # every worker imported and waiting at the start line
  (tmp_path / 'go').touch()
  results = [w.communicate(timeout=300) for w in workers]
  assert all(w.returncode == 0 for w in workers), [err[-800:] for _, err in results]
  expected = '\n'.join(f'{r} 300 {(tmp_path / f"spm-{r}.model").stat().st_size}'
                       for r in range(25))
  assert [out.strip() for out, _ in results] == [expected] * 6
  assert {p.name for p in tmp_path.iterdir() if not p.name.startswith('ready-')} == {
      'go', *(f'spm-{r}.model{ext}' for r in range(25) for ext in ('', '.json'))}  # nothing


def test_a_tokenizer_from_checkpoint_bytes_caches_like_one_from_a_file(tokenizer, tmp_path):
  """Its model bytes are kept on the object (a checkpoint's tokenizer has no file to read)."""
  assert tokenizer.model_proto == tokenizer.path.read_bytes()
  loaded = data.Tokenizer.from_bytes(tokenizer.model_proto)
  text = synthetic_text(200, seed=6)
  from_bytes = data.tokenize_corpus(text, loaded, max_len=64, cache_dir=tmp_path)
  from_file = data.tokenize_corpus(text, tokenizer, max_len=64, cache_dir=tmp_path)
  assert len(list(tmp_path.glob('tokens-*'))) == 1  # the same fingerprint: one cache
  np.testing.assert_array_equal(from_bytes.tgt_tokens, from_file.tgt_tokens)


def test_decoded_text_is_always_one_line(tokenizer):
  newline_bytes = [tokenizer._sp.piece_to_id(f'<0x{b:02X}>') for b in (0x0A, 0x0D, 0x0B)]
  ids = tokenizer.encode(['the man'])[0]
  text = tokenizer.decode([ids + newline_bytes + ids])[0]
  assert text.splitlines() == [text] and text.startswith('the man')


def test_a_vocabulary_without_its_record_is_used_with_a_warning(tmp_path, caplog):
  """A vocabulary placed by hand, or from before records were kept, is reused, and the log says
  that what it was trained on is unknown (before: reused without a word)."""
  text = synthetic_text(300)
  first = data.train_tokenizer(text.src + text.tgt, tmp_path / 'spm.model', 300)
  (tmp_path / 'spm.model.json').unlink()
  again = data.train_tokenizer(synthetic_text(300, seed=1).src, tmp_path / 'spm.model', 300)
  assert again.model_proto == first.model_proto
  assert (f'{tmp_path / "spm.model"}: its training data is not recorded (no spm.model.json '
          'beside it); using it as given') in caplog.text


def _side(texts: list[str], vocab_size: int) -> bytes:
  """A sentencepiece model as Marian's are made (its own ids: <unk> 0, <s> 1, </s> 2)."""
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=model,
                                 vocab_size=vocab_size, minloglevel=2, num_threads=1)
  return model.getvalue()


def test_a_two_sided_vocabulary_reads_each_side_with_its_own_model(tmp_path):
  """Source text by the source model, targets by the target model, both onto one joint list
  of pieces; a piece the list lacks is unk, as a leading language code is one piece; the bytes
  load from a file as any vocabulary does, and decode as the target model spells."""
  text = synthetic_text(300, seed=2)
  source, target = _side(text.src, 34), _side(text.tgt, 36)
  pieces = ['<pad>', '</s>', '<unk>', '>>de<<']
  for model in (source, target):
    processor = spm.SentencePieceProcessor(model_proto=model)
    pieces += [p for p in (processor.id_to_piece(i) for i in range(3, processor.get_piece_size()))
               if p not in pieces]
  dropped = pieces.pop()  # one piece the joint vocabulary lacks: unk
  (tmp_path / 'spm.model').write_bytes(data.tokenizer.sided_bytes(source, target, pieces))
  tok = data.Tokenizer(tmp_path / 'spm.model')
  assert isinstance(tok, data.SidedTokenizer) and tok.vocab_size == len(pieces)
  src_pieces = spm.SentencePieceProcessor(model_proto=source).encode(text.src[:20], out_type=str)
  tgt_pieces = spm.SentencePieceProcessor(model_proto=target).encode(text.tgt[:20], out_type=str)
  expect = lambda rows: [[pieces.index(p) if p in pieces else data.UNK_ID for p in row]  # noqa: E731
                         for row in rows]
  assert tok.encode(text.src[:20]) == expect(src_pieces)
  assert tok.encode_target(text.tgt[:20]) == expect(tgt_pieces)
  assert tok.encode_target(text.tgt[:20]) != tok.encode(text.tgt[:20])  # two models
  assert tok.encode(['>>de<<' + text.src[0]])[0] == [3] + tok.encode(text.src[:1])[0]
  assert tok.decode(tok.encode_target(text.tgt[:5])) == [' '.join(t.split()) for t in text.tgt[:5]]
  assert tok.piece_ids([dropped, '</s>']) == [data.UNK_ID, data.EOS_ID]
  assert tok.files() == {'source.spm': source, 'target.spm': target}
  assert data.Tokenizer.from_bytes(tok.model_proto).encode(text.src[:3]) == tok.encode(text.src[:3])
  for damaged in (b'{"pieces": 3}\n', b'cut short'):
    with pytest.raises(DataError, match='damaged two-sided vocabulary'):
      data.Tokenizer.from_bytes(data.tokenizer.SIDED_MAGIC + damaged)
