"""jaxformer.formats: the registry of export formats, and the Hugging Face (MarianMT) export
checked against transformers itself (greedy outputs and teacher-forced logits)."""

import json
import subprocess
import sys

import jax
import numpy as np
import pytest
from helpers import TESTS, one_line_error

from jaxformer import cli, config, data, export, files, formats, recipes, train, translation
from jaxformer.formats import card, huggingface
from jaxformer.model import sinusoidal_positions
from jaxformer.recipes import auto

sys.path.insert(0, str(TESTS.parent / 'experiments'))
import huggingface_parity  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position



def test_the_registry_gives_the_command_its_formats_and_each_folder_its_kind(workdir, tmp_path):
  assert set(formats.REGISTRY) == {'jaxformer', 'ctranslate2', 'huggingface'}
  exporting = cli._subcommands(cli.build_parser())['export']  # pylint: disable=protected-access
  flag = next(action for action in exporting._actions if action.dest == 'format')  # pylint: disable=protected-access
  assert flag.choices == sorted(formats.REGISTRY)
  assert all(f'{name}: {f.summary}' in flag.help for name, f in formats.REGISTRY.items())
  assert set(files.EXPORT_MARKERS.values()) == {f.kind for f in formats.REGISTRY.values()} - {
      files.EXPORT}
  for name, chosen in formats.REGISTRY.items():
    out = tmp_path / name
    assert cli.main(['export', '--model', str(workdir), str(out), '--format', name]) == 0
    assert files.describe(out) == chosen.kind


def test_the_huggingface_folder_is_recognised_and_kept(workdir, tmp_path):
  out = tmp_path / 'hf'
  assert cli.main(['export', '--model', str(workdir), str(out), '--format', 'huggingface']) == 0
  assert {'config.json', 'generation_config.json', 'model.safetensors', 'source.spm',
          'target.spm', 'vocab.json', 'tokenizer_config.json', 'README.md'} == {
              p.name for p in out.iterdir()}
  assert one_line_error('export', '--model', str(workdir), str(out), '--format',
                        'huggingface') == (
      f'error: {out}: is a Hugging Face model already: pass --overwrite to replace it.')
  assert one_line_error('export', '--model', str(workdir), str(out)) == (
      f'error: {out}: is a Hugging Face model, where a new or empty folder for the export '
      'belongs.')
  # ... and read back as a model, the same one: its epsilon recorded, its output bias zeros.
  sentences = ['a small test.', 'two dogs run in the park.']
  assert translation.Translator.load(str(out)).translate(sentences) == \
      translation.Translator.load(str(workdir)).translate(sentences)
  text = (out / 'README.md').read_text()
  assert 'library_name: transformers' in text and 'GNMT' in text and '1e-5' in text


@pytest.mark.parametrize('setting,value,named', [
    ('pre_ln', True, 'model.pre_ln=true'),
    ('learned_positions', True, 'model.learned_positions=true'),
    ('qk_dim', 4, 'model.qk_dim=4, model.v_dim=8'),
])
def test_what_marian_cannot_express_is_one_line_naming_the_setting(setting, value, named,
                                                                   tmp_path):
  cfg = config.tiny(vocab_size=280).replace(**{setting: value})
  spm = data.train_tokenizer(['a b c d e f g', 'h i j k l m n'] * 50, tmp_path / 'v.model',
                             vocab_size=280)
  params = train.create_train_state(cfg, jax.random.key(0)).params
  model = export.save(tmp_path / 'model', params, cfg, spm.model_proto, step=1)
  line = one_line_error('export', '--model', str(model), str(tmp_path / 'hf'), '--format',
                        'huggingface')
  assert line.startswith(f'error: the huggingface format cannot express {named} (')
  assert not (tmp_path / 'hf').exists()


def test_the_permutation_puts_jaxformers_table_in_marians_order():
  """Marian's table (transformers' create_weight: the sines of frequency i at i, the cosines
  at d/2 + i) is jaxformer's with its columns taken in `permutation`'s order."""
  d, positions = 16, np.arange(10)
  ours = np.asarray(sinusoidal_positions(positions, d))
  exponent = 2 * (np.arange(d) // 2) / d
  angles = positions[:, None] / np.power(10000, exponent)[None, :]
  marian = np.concatenate([np.sin(angles[:, 0::2]), np.cos(angles[:, 1::2])], axis=1)
  np.testing.assert_allclose(ours[:, huggingface.permutation(d)], marian, atol=1e-5)


def test_transformers_generates_what_jaxformer_does_and_its_logits_agree(demo_sized, tmp_path):
  """The demo-sized model's 100 test sentences: MarianTokenizer gives jaxformer's ids,
  MarianMTModel's greedy outputs (with jaxformer's length limit, min(input + 50, max_len)) are
  jaxformer's for at least 99 of them, and teacher-forced logits agree to 2e-4 (measured:
  docs/BENCHMARKS.md; the layer norms' epsilons differ, 1e-5 against 1e-6)."""
  torch, transformers = huggingface_parity.torch, huggingface_parity.transformers
  transformers.logging.set_verbosity_error()
  workdir, sentences = demo_sized
  out = tmp_path / 'hf'
  assert cli.main(['export', '--model', str(workdir), str(out), '--format', 'huggingface']) == 0
  tokenizer = transformers.MarianTokenizer.from_pretrained(out)
  model = transformers.MarianMTModel.from_pretrained(out).eval()
  ours = translation.Translator.from_checkpoint(str(workdir))
  ids = [row + [data.EOS_ID] for row in ours.tokenizer.encode(sentences)]
  assert [list(row) for row in tokenizer(sentences).input_ids] == ids
  greedy = ours.replace(beam_size=1).translate(sentences)
  theirs = []
  for start in range(0, len(sentences), 25):
    batch = tokenizer(sentences[start:start + 25], return_tensors='pt', padding=True)
    limit = min(batch['input_ids'].shape[1] + 50, model.config.max_position_embeddings)
    with torch.no_grad():
      made = model.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=limit)
    theirs += tokenizer.batch_decode(made, skip_special_tokens=True)
  same = sum(a == b for a, b in zip(greedy, theirs))
  assert same >= 99, [(a, b) for a, b in zip(greedy, theirs) if a != b][:3]
  assert sum(map(len, greedy)) > 5 * len(greedy)  # real output
  gap = huggingface_parity.teacher_forced_gap(out, workdir, sentences[:32], greedy[:32])
  assert gap < 2e-4, gap


def test_the_card_and_the_configs_say_what_transformers_is_told(workdir, tmp_path):
  out = tmp_path / 'hf'
  assert cli.main(['export', '--model', str(workdir), str(out), '--format', 'huggingface']) == 0
  cfg = export.load_model(workdir)[1]
  marian = json.loads((out / 'config.json').read_text())
  assert (marian['d_model'], marian['encoder_layers'], marian['vocab_size'],
          marian['max_position_embeddings'], marian['activation_function'],
          marian['scale_embedding'], marian['decoder_start_token_id']) == (
              cfg.d_model, cfg.num_layers, cfg.vocab_size, cfg.max_len, 'relu', True, 0)
  generation = json.loads((out / 'generation_config.json').read_text())
  assert (generation['num_beams'], generation['length_penalty'], generation['max_length'],
          generation['bad_words_ids']) == (4, 0.6, cfg.max_len + 1, [[0]])
  vocab = json.loads((out / 'vocab.json').read_text())
  tokenizer = data.Tokenizer(workdir / 'spm.model')
  assert list(vocab) == tokenizer.pieces(range(cfg.vocab_size))
  assert list(vocab.values()) == list(range(cfg.vocab_size))
  done = subprocess.run([sys.executable, '-c', 'import jaxformer.formats.huggingface, sys; '
                         'sys.exit("torch" in sys.modules or "transformers" in sys.modules)'],
                        capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr  # exporting needs neither


def test_the_model_card_reads_the_metrics_as_records_another_tool_wrote(tmp_path):
  """A BLEU of null (what JSON tools write for NaN) is no measurement: the card says the last
  number (it was a traceback); a BLEU that is no number is a one-line RecordError."""
  lines = [{'split': 'eval', 'step': 2, 'bleu': 12.5}, {'split': 'train', 'step': 3},
           {'split': 'eval', 'step': 4, 'bleu': None}]
  (tmp_path / 'metrics.jsonl').write_text(''.join(json.dumps(x) + '\n' for x in lines))
  assert card.last_validation_bleu(tmp_path).startswith(
      '12.50 sacreBLEU at step 2, on the first validation sentences')
  (tmp_path / 'metrics.jsonl').write_text(json.dumps({'split': 'eval', 'bleu': 'high'}) + '\n')
  with pytest.raises(files.RecordError, match=r'metrics\.jsonl:1: "bleu" must be an integer or '
                     r'a number or null, got "high"\.$'):
    card.last_validation_bleu(tmp_path)


def test_the_model_card_states_the_automatic_recipes_rules_and_the_users_settings(tmp_path):
  """The rules' 450 steps and the user's --num-steps 30 over them: the card said only the
  first."""
  recipe = recipes.override(recipes.AUTO, ['data.train_src=a.en', 'data.train_tgt=a.de'])
  rules = ('schedule     450 steps of 8,192 tokens', 'dropout      0.3: fewer than 10,000 pairs')
  auto.record(tmp_path, auto.Sizing(recipe, 'head', rules, ('train.num_steps=30',)))
  data_section, lines = card.recorded_data(tmp_path)
  assert data_section['train_src'] == 'a.en'
  text = card.markdown(tmp_path, config.tiny(), 30, data_section, lines)
  assert ('- **Recipe:** the automatic recipe:\n  - schedule 450 steps of 8,192 tokens\n'
          '  - dropout 0.3: fewer than 10,000 pairs\n  - then your settings: train.num_steps=30\n'
          ) in text
  auto.record(tmp_path, auto.Sizing(recipe, 'head', rules, ()))
  assert card.recorded_data(tmp_path)[1] == list(rules)
