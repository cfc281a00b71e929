"""A MarianMT folder laid out exactly as an OPUS-MT model's on the Hub, made here, since the
Hub is out of reach (pip install 'jaxformer[test]' brings torch and transformers):

  python experiments/opus_mt_folder.py OUT --src train.en --tgt train.de

A sentencepiece model for each side trained on the given text (as Marian's: <unk> 0, <s> 1,
</s> 2), a joint vocab.json with </s> first, <unk> second and <pad> last, a MarianConfig
with OPUS-MT's field values (swish, static sinusoids, shared embeddings, pad as the decoder's
start, bad_words_ids [[pad]], beam 4 and max_length 512 in its generation config) at small
dimensions, random weights with a nonzero final_logits_bias, all saved by transformers' own
classes (save_pretrained). With the Hub, a real one is one command away instead:

  huggingface-cli download Helsinki-NLP/opus-mt-en-de --local-dir opus-mt-en-de
"""

import argparse
import io
import json
import os
import pathlib
import sys
import tempfile

import sentencepiece as spm

os.environ.setdefault('HF_HUB_OFFLINE', '1')
# pylint: disable=wrong-import-position
import torch  # noqa: E402
import transformers  # noqa: E402


def _spm(sentences: list[str], vocab_size: int) -> bytes:
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=model,
                                 vocab_size=vocab_size, model_type='unigram',
                                 character_coverage=1.0, minloglevel=2, num_threads=1)
  return model.getvalue()


def make(out: str | os.PathLike, sources: list[str], targets: list[str], *, vocab_size: int = 400,
         d_model: int = 64, layers: int = 2, heads: int = 4, ffn: int = 128, seed: int = 0,
         activation: str = 'swish', init_std: float = 0.15, eos_bias: float = 4.0,
         **config: object) -> pathlib.Path:
  """The folder `out` (see the module's docstring); `config` overrides MarianConfig fields."""
  out = pathlib.Path(out)
  models = {'source.spm': _spm(sources, vocab_size), 'target.spm': _spm(targets, vocab_size)}
  pieces: dict[str, None] = {}
  for model in models.values():
    processor = spm.SentencePieceProcessor(model_proto=model)
    pieces.update((processor.id_to_piece(i), None) for i in range(processor.get_piece_size()))
  ordinary = [p for p in pieces if p not in ('<unk>', '<s>', '</s>', '<pad>')]
  vocab = {piece: i for i, piece in enumerate(['</s>', '<unk>', *ordinary, '<pad>'])}
  pad = len(vocab) - 1
  fields = dict(
      vocab_size=len(vocab), decoder_vocab_size=len(vocab), d_model=d_model,
      encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=heads,
      decoder_attention_heads=heads, encoder_ffn_dim=ffn, decoder_ffn_dim=ffn,
      activation_function=activation, max_position_embeddings=512, scale_embedding=True,
      share_encoder_decoder_embeddings=True, pad_token_id=pad, eos_token_id=0,
      decoder_start_token_id=pad, forced_eos_token_id=0, init_std=init_std,
      # OPUS-MT's config.json carries these BART-era fields too; its generation settings:
      static_position_embeddings=True, normalize_embedding=False, normalize_before=False,
      add_final_layer_norm=False, add_bias_logits=False, bad_words_ids=[[pad]], num_beams=4,
      max_length=512)
  fields.update(config)
  torch.manual_seed(seed)
  model = transformers.MarianMTModel(transformers.MarianConfig(**fields)).eval()
  with torch.no_grad():
    model.final_logits_bias.normal_(0.0, 0.5)
    model.final_logits_bias[0, 0] += eos_bias  # outputs that end, at lengths that vary
  model.generation_config = transformers.GenerationConfig(
      bad_words_ids=[[pad]], num_beams=4, max_length=512, decoder_start_token_id=pad,
      eos_token_id=0, pad_token_id=pad, forced_eos_token_id=0)
  model.save_pretrained(out)
  with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    for name, content in models.items():
      (tmp / name).write_bytes(content)
    (tmp / 'vocab.json').write_text(json.dumps(vocab, ensure_ascii=False))
    tokenizer = transformers.MarianTokenizer(
        str(tmp / 'source.spm'), str(tmp / 'target.spm'), str(tmp / 'vocab.json'),
        source_lang='en', target_lang='de', model_max_length=512)
    tokenizer.save_pretrained(out)
  return out


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('out', help='the folder to write (new)')
  parser.add_argument('--src', required=True, help="the source side's text, one a line")
  parser.add_argument('--tgt', required=True, help="the target side's text, one a line")
  parser.add_argument('--lines', type=int, default=5000, help='lines of each to train on')
  args = parser.parse_args()
  read = lambda path: pathlib.Path(path).read_text(encoding='utf-8').splitlines()[:args.lines]  # noqa: E731
  transformers.logging.set_verbosity_error()
  print(make(args.out, read(args.src), read(args.tgt)))
  return 0


if __name__ == '__main__':
  sys.exit(main())
