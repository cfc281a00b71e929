"""Translation with a trained model, and the BLEU plumbing."""

import collections
import json
import math
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sacrebleu
from sacrebleu.tokenizers.tokenizer_intl import TokenizerV14International

from helpers import synthetic_text
from jaxformer import cache as cache_lib
from jaxformer import checkpoint, cli, config, decode, scoring, trainer, translation
from jaxformer.model import Transformer

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope='module')
def workdir(tmp_path_factory):
  """A tiny model trained for a few steps (translation quality does not matter here)."""
  path = tmp_path_factory.mktemp('trained')
  settings = config.TrainConfig(num_steps=4, tokens_per_batch=1024, row_len=64,
                                checkpoint_every_steps=2, checkpoint_every_secs=None,
                                average_last=2, log_every_steps=2)
  trainer.train(config.tiny(vocab_size=400), settings, path, synthetic_text(800))
  return path


@pytest.fixture(scope='module')
def translator(workdir):
  return translation.Translator.from_checkpoint(str(workdir), batch_size=4)


SENTENCES = ['the man sees a dog', 'a small red house under the garden with a big cat',
             'Größe — ünïcode ✓', 'the dog']


def test_cached_and_uncached_steps_give_the_same_logits(translator):
  model, params = Transformer(translator.config), translator.params
  src = jnp.array([[5, 9, 13, 1, 0, 0], [7, 8, 1, 0, 0, 0]])
  encoded = model.apply({'params': params}, src, method=Transformer.encode)
  cached = translation.cached_tokens_to_logits(model, params, src)
  uncached = translation.uncached_tokens_to_logits(model, params, src, encoded)
  c_cache = model.apply({'params': params}, encoded, 8, method=Transformer.init_cache)
  u_cache = {'tokens': jnp.zeros((2, 8), jnp.int32), 'index': jnp.array(0)}
  for token in ([0, 0], [17, 4], [33, 33], [9, 200]):
    tokens = jnp.array(token)[:, None]
    c_logits, c_cache = cached(tokens, c_cache)
    u_logits, u_cache = uncached(tokens, u_cache)
    np.testing.assert_allclose(c_logits, u_logits, atol=1e-5)


def test_reordered_beams_attend_to_their_own_histories(translator):
  """Beam search reorders only the cache's slot map: after any choice of parents (a swap, one
  parent twice), each hypothesis's logits are those of its own token history."""
  model, params, beams = Transformer(translator.config), translator.params, 3
  src = jnp.array([[5, 9, 13, 1, 0, 0], [7, 8, 1, 0, 0, 0]])
  encoded = model.apply({'params': params}, src, method=Transformer.encode)
  cache = model.apply({'params': params}, encoded, 8, beams, method=Transformer.init_cache)
  per_hypothesis = [x for x in jax.tree.leaves(cache) if x.ndim and x.shape[0] == 2 * beams]
  assert [x.shape for x in per_hypothesis] == [(2 * beams, 8)]  # only the slot map is reordered
  cached = jax.jit(translation.cached_tokens_to_logits(model, params, src))
  uncached = translation.uncached_tokens_to_logits(
      model, params, jnp.repeat(src, beams, axis=0), jnp.repeat(encoded, beams, axis=0))
  history = jnp.zeros((2 * beams, 0), jnp.int32)
  tokens = jnp.zeros((2 * beams, 1), jnp.int32)
  for step, parents in enumerate([[[0, 0, 0], [0, 0, 0]], [[2, 0, 1], [1, 1, 2]],
                                  [[1, 1, 0], [2, 0, 2]], [[0, 2, 1], [0, 1, 1]]]):
    if step:  # choose parents as decode.beam_search does, then the next tokens
      parents = jnp.array(parents)
      cache = cache_lib.reorder(cache, (parents + jnp.arange(2)[:, None] * beams).reshape(-1))
      history = decode._flatten(decode._gather(decode._unflatten(history, beams), parents))
      tokens = jnp.arange(2 * beams)[:, None] * 7 + 10 + step
    history = jnp.concatenate([history, tokens], axis=1)
    logits, cache = cached(tokens, cache)
    expected, _ = uncached(tokens, {'tokens': jnp.pad(history, ((0, 0), (0, 8 - step - 1))),
                                    'index': jnp.array(step)})
    np.testing.assert_allclose(logits, expected, atol=1e-5, err_msg=f'step {step}')


@pytest.mark.parametrize('beam_size', [1, 4])
def test_cached_and_uncached_search_agree(translator, beam_size):
  # max_len 40: the cached search grows its cache through stages of 16, 32 and 40 tokens.
  src = jnp.array([[5, 9, 13, 1, 0, 0, 0, 0], [7, 8, 1, 0, 0, 0, 0, 0]])
  lengths = jnp.array([40, 23])
  run = lambda cached: translation.decode_batch(  # noqa: E731
      translator.params, src, lengths, config=translator.config, max_len=40,
      beam_size=beam_size, alpha=0.6, cached=cached)
  cached = jax.jit(lambda: run(True))()
  assert (cached[0] != 0).sum() > 16  # the untrained model ran into the second stage
  np.testing.assert_array_equal(cached, jax.jit(lambda: run(False))())


def test_batch_padding_does_not_change_a_translation(translator):
  together = translator.translate(SENTENCES)
  alone = [translator.translate([s])[0] for s in SENTENCES]
  assert together == alone
  assert len(set(together)) > 1


def test_blank_lines_stay_blank_and_counts_are_kept(translator):
  lines = ['', SENTENCES[0], '   ', SENTENCES[2], '']
  out = translator.translate(lines)
  assert len(out) == 5 and out[0] == out[2] == out[4] == ''
  assert out[1] == translator.translate([SENTENCES[0]])[0]


def test_outputs_respect_the_length_limit(workdir):
  short = translation.Translator.from_checkpoint(str(workdir), batch_size=4, extra_length=2)
  ids = short.tokenizer.encode(short.translate(SENTENCES))
  sources = short.tokenizer.encode(SENTENCES)
  assert all(len(out) <= len(src) + 1 + 2 for out, src in zip(ids, sources))


def test_averaged_translator_loads(workdir):
  averaged = translation.Translator.from_checkpoint(str(workdir), average_last=2, batch_size=4)
  from_dir = translation.Translator.from_checkpoint(str(workdir / 'average-last2'), batch_size=4)
  for a, b in zip(jax.tree.leaves(averaged.params), jax.tree.leaves(from_dir.params)):
    np.testing.assert_allclose(a, b, rtol=1e-6)
  assert averaged.translate(SENTENCES[:2]) == from_dir.translate(SENTENCES[:2])


# --- BLEU ---------------------------------------------------------------------------------------


def test_references_against_themselves_score_100(shared_data):
  refs = (shared_data / 'newstest2014' / 'newstest2014.de').read_text(encoding='utf-8')
  refs = refs.splitlines()
  assert len(refs) == 3003
  score, signature = scoring.sacre_bleu(refs, refs)
  assert score == pytest.approx(100.0)
  assert 'tok:13a' in signature and 'version:2.6.0' in signature
  assert scoring.tokenized_bleu(refs, refs) == pytest.approx(100.0)


def test_sacre_bleu_equals_the_sacrebleu_command_line(shared_data, tmp_path):
  refs = (shared_data / 'newstest2014' / 'newstest2014.de').read_text(encoding='utf-8')
  refs = refs.splitlines()[:300]
  # A fixed, imperfect hypothesis: every reference with its last word dropped and two swapped.
  hyps = []
  for i, ref in enumerate(refs):
    words = ref.split()[:-1]
    if i % 3 == 0 and len(words) > 2:
      words[0], words[1] = words[1], words[0]
    hyps.append(' '.join(words))
  (tmp_path / 'ref.de').write_text('\n'.join(refs) + '\n', encoding='utf-8')
  (tmp_path / 'hyp.de').write_text('\n'.join(hyps) + '\n', encoding='utf-8')
  cli = subprocess.run([sys.executable, '-m', 'sacrebleu', str(tmp_path / 'ref.de'), '-i',
                        str(tmp_path / 'hyp.de'), '-b'], capture_output=True, text=True,
                       check=True)
  score, _ = scoring.sacre_bleu(hyps, refs)
  assert f'{score:.1f}' == cli.stdout.strip()
  assert 0 < score < 100


def _hand_bleu(hyp: list[str], ref: list[str]) -> float:
  """Unsmoothed BLEU-4 of one tokenized sentence pair, from its definition."""
  log_precisions = []
  for n in range(1, 5):
    h = collections.Counter(tuple(hyp[i:i + n]) for i in range(len(hyp) - n + 1))
    r = collections.Counter(tuple(ref[i:i + n]) for i in range(len(ref) - n + 1))
    log_precisions.append(math.log(sum((h & r).values()) / sum(h.values())))
  brevity = min(0.0, 1 - len(ref) / len(hyp))
  return 100 * math.exp(brevity + sum(log_precisions) / 4)


_HYP = ('Dr. Müller\'s EU-Kommission zahlt 1,000.50 Euro, u.a. für "Kinder-Garten-Gruppen" in '
        '3-4 Wochen.')
_REF = 'Dr. Müller\'s EU-Kommission zahlt 1,000.50 Euro, u.a. für "Kinder-Garten" in 3-4 Wochen.'


def test_paper_tokenization_is_moses_then_the_compound_split():
  # Worked by hand from tokenizer.perl -l de (the German nonbreaking prefixes keep "Dr." and
  # "u.a."; numbers keep their separators; hyphens inside words stay; quotes and apostrophes are
  # split off and escaped) and get_ende_bleu.sh's s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g.
  assert scoring.paper_tokenize(_HYP) == (
      'Dr. Müller &apos; s EU ##AT##-##AT## Kommission zahlt 1,000.50 Euro , u.a. für &quot; '
      'Kinder ##AT##-##AT## Garten ##AT##-##AT## Gruppen &quot; in 3 ##AT##-##AT## 4 Wochen .')
  # sacreBLEU's intl splits all of these differently: the paper's protocol is not intl's.
  intl = TokenizerV14International()
  assert intl(_HYP).startswith("Dr . Müller ' s EU - Kommission") and 'u . a .' in intl(_HYP)
  assert scoring.paper_tokenize('a-b-c') == 'a ##AT##-##AT## b-c'  # perl's /g does not overlap


def test_tokenized_bleu_is_unsmoothed_bleu_of_the_paper_tokens():
  expected = _hand_bleu(scoring.paper_tokenize(_HYP).split(),
                        scoring.paper_tokenize(_REF).split())
  assert scoring.tokenized_bleu([_HYP], [_REF]) == pytest.approx(expected, rel=1e-9)
  assert scoring.tokenized_bleu([_HYP], [_REF]) == pytest.approx(85.314136, abs=1e-5)
  # English text goes through English rules ("It's" -> "It 's"), chosen by the target language.
  assert scoring.paper_tokenize("It's 3-4 days.", 'en') == "It &apos;s 3 ##AT##-##AT## 4 days ."


def test_scores_put_chrf_beside_bleu():
  result = scoring.scores([_HYP], [_REF])
  assert result['chrf'] == pytest.approx(
      round(sacrebleu.metrics.CHRF().corpus_score([_HYP], [[_REF]]).score, 2))
  assert 'nc:6' in result['chrf_signature'] and 'tok:13a' in result['signature']
  assert 0 < result['chrf'] < 100 and result['tokenized_bleu'] == pytest.approx(85.31)


# --- command lines --------------------------------------------------------------------------------


def test_translate_command_keeps_lines_and_non_ascii(workdir):
  lines = ['the man sees a dog', '', 'Größe — ünïcode ✓ 😀', '', '', 'the dog']
  result = subprocess.run(
      [sys.executable, '-m', 'jaxformer.cli', 'translate', '--workdir', str(workdir),
       '--batch-size', '2'], input='\n'.join(lines) + '\n', capture_output=True, text=True,
      encoding='utf-8', timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  out = result.stdout.split('\n')
  assert out[-1] == '' and len(out[:-1]) == len(lines)
  assert [o == '' for o in out[:-1]] == [line == '' for line in lines]
  translator = translation.Translator.from_checkpoint(str(workdir), batch_size=2)
  assert out[:-1] == translator.translate(lines)


def test_translate_command_missing_checkpoint_is_one_line(tmp_path):
  result = subprocess.run([sys.executable, '-m', 'jaxformer.cli', 'translate', '--workdir',
                           str(tmp_path / 'none')], input='x\n', capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1].startswith('error: ')
  assert 'no such checkpoint folder' in result.stderr


def test_eval_script_scores_local_files(workdir, tmp_path):
  text = synthetic_text(12, seed=4)
  (tmp_path / 'test.src').write_text('\n'.join(text.src) + '\n')
  (tmp_path / 'test.ref').write_text('\n'.join(text.tgt) + '\n')
  result = subprocess.run(
      [sys.executable, str(ROOT / 'experiments' / 'eval.py'), '--workdir', str(workdir),
       '--src', str(tmp_path / 'test.src'), '--ref', str(tmp_path / 'test.ref'),
       '--output', str(tmp_path / 'hyps.txt')], capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  summary = json.loads(result.stdout.strip().splitlines()[-1])
  hyps = (tmp_path / 'hyps.txt').read_text().splitlines()
  assert len(hyps) == 12 and summary['segments'] == 12
  assert summary['sacrebleu'] == pytest.approx(round(scoring.sacre_bleu(hyps, text.tgt)[0], 2))
  assert result.stdout.startswith('sacreBLEU ')


def test_eval_script_errors_are_one_line(workdir, tmp_path):
  missing = subprocess.run([sys.executable, str(ROOT / 'experiments' / 'eval.py'), '--workdir',
                            str(tmp_path / 'nowhere')], capture_output=True, text=True,
                           timeout=120)
  assert missing.returncode == 1 and 'error: ' in missing.stderr.splitlines()[-1]
  no_data = subprocess.run([sys.executable, str(ROOT / 'experiments' / 'eval.py'), '--workdir',
                            str(workdir), '--tfds-data-dir', str(tmp_path)], capture_output=True,
                           text=True, timeout=120)
  assert no_data.returncode == 1
  assert 'not prepared' in no_data.stderr.splitlines()[-1]


# --- bad input ------------------------------------------------------------------------------------


def _tree_snapshot(folder: pathlib.Path) -> dict[str, tuple[int, int]]:
  """Every file under `folder` with its size and modification time."""
  return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
          for p in sorted(folder.rglob('*')) if p.is_file()}


def test_translate_refuses_invalid_utf8_naming_the_line(workdir):
  result = subprocess.run(
      [sys.executable, '-m', 'jaxformer.cli', 'translate', '--workdir', str(workdir),
       '--batch-size', '1'], input=b'the dog\n\xff\xfe not utf-8\nthe man\n',
      capture_output=True, timeout=300)
  assert result.returncode == 1
  assert result.stderr.decode().strip().splitlines()[-1] == (
      'error: stdin:2: not valid UTF-8 (byte 0: invalid start byte); re-encode it as UTF-8.')
  assert 'Traceback' not in result.stderr.decode()
  assert len(result.stdout.decode().splitlines()) == 1  # line 1 was translated before it


def test_translate_into_a_closed_pipe_ends_quietly(workdir):
  """`jaxformer translate < many-lines | head -1`: no BrokenPipeError traceback."""
  command = (f'yes "the dog" | head -40 | {sys.executable} -m jaxformer.cli translate '
             f'--workdir {workdir} --batch-size 8 | head -1')
  result = subprocess.run(['bash', '-c', command], capture_output=True, text=True, timeout=300)
  assert len(result.stdout.splitlines()) == 1
  assert 'Traceback' not in result.stderr and 'Error' not in result.stderr, result.stderr


def _eval_main(argv: list[str]) -> int:
  """`jaxformer eval`, in this process (the cases below stop before translating)."""
  return cli.main(['eval', *argv])


def test_eval_refuses_an_invalid_utf8_source_file(workdir, tmp_path, capsys):
  (tmp_path / 'test.src').write_bytes(b'the dog\nthe \xe9t\xe9\n')
  (tmp_path / 'test.ref').write_text('der hund\ndas haus\n')
  assert _eval_main(['--workdir', str(workdir), '--src', str(tmp_path / 'test.src'), '--ref',
                     str(tmp_path / 'test.ref'), '--output', str(tmp_path / 'hyps.txt')]) == 1
  assert capsys.readouterr().err.strip().splitlines() == [
      f'error: {tmp_path / "test.src"}:2: not valid UTF-8 (byte 4: invalid continuation byte); '
      're-encode it as UTF-8.']
  assert not (tmp_path / 'hyps.txt').exists()


def test_eval_checks_the_output_folder_before_translating(workdir, tmp_path, capsys):
  (tmp_path / 'test.src').write_text('the dog\n')
  (tmp_path / 'test.ref').write_text('der hund\n')
  assert _eval_main(['--workdir', str(workdir), '--src', str(tmp_path / 'test.src'), '--ref',
                     str(tmp_path / 'test.ref'), '--output',
                     str(tmp_path / 'missing' / 'hyps.txt')]) == 1
  err = capsys.readouterr().err
  assert 'translating' not in err
  assert err.strip().splitlines() == [
      f'error: {tmp_path / "missing"}: no such folder for the hypotheses.']


def test_eval_interrupted_while_translating_ends_quietly(workdir, tmp_path, capsys,
                                                       monkeypatch):
  (tmp_path / 'test.src').write_text('the dog\n')
  (tmp_path / 'test.ref').write_text('der hund\n')

  def interrupted(*args, **kwargs):
    raise KeyboardInterrupt
  monkeypatch.setattr(translation.Translator, 'translate', interrupted)
  assert _eval_main(['--workdir', str(workdir), '--src', str(tmp_path / 'test.src'), '--ref',
                     str(tmp_path / 'test.ref'), '--output', str(tmp_path / 'hyps.txt')]) == 130
  assert capsys.readouterr().err.strip().splitlines() == ['interrupted: no hypotheses written']
  assert not (tmp_path / 'hyps.txt').exists()


def test_over_long_sources_are_cut_to_the_model_and_counted(translator, caplog):
  """A source of thousands of words is cut to max_len pieces (with a warning naming it), and
  decoding stays within max_len: one output line per input, no out-of-memory."""
  sentences = ['the dog', 'the man sees a dog ' * 800, 'the house']
  with caplog.at_level('WARNING', logger='jaxformer.evaluate'):
    outputs = translator.translate(sentences)
  assert len(outputs) == 3 and outputs[0] == translator.translate(['the dog'])[0]
  assert "1 source(s) longer than the model's 64 tokens were cut to that length (indices 1)" \
      in caplog.text
  limit = translator.config.max_len - 1
  cut = translator.tokenizer.decode([translator.tokenizer.encode([sentences[1]])[0][:limit]])
  assert outputs[1] == translator.translate(cut)[0]  # the same as translating the cut source


def test_learned_positions_translate_sources_longer_than_the_table(tmp_path):
  """Table 3 row E: the width bucket plus 50 used to pass max_len and break init_cache."""
  cfg = config.tiny(vocab_size=400).replace(learned_positions=True)  # max_len 64 = row_len
  settings = config.TrainConfig(num_steps=1, tokens_per_batch=1024, row_len=64,
                                checkpoint_every_secs=None, average_last=0)
  trainer.train(cfg, settings, tmp_path, synthetic_text(200))
  row_e = translation.Translator.from_checkpoint(str(tmp_path), batch_size=2)
  outputs = row_e.translate(['the dog', 'a small red house with a big cat ' * 5, 'the man ' * 40])
  assert len(outputs) == 3 and all(len(row_e.tokenizer.encode([o])[0]) <= 64 for o in outputs)


def test_reading_commands_create_and_change_nothing(workdir, tmp_path, caplog):
  from jaxformer import checkpoint, cli  # pylint: disable=g-import-not-at-top
  caplog.set_level('WARNING')
  missing = tmp_path / 'no-such-workdir'
  assert cli.main(['average', '--workdir', str(missing), '--last', '2']) == 1
  assert not missing.exists()
  for read in (checkpoint.load, lambda p: checkpoint.average_checkpoints(p, 1),
               translation.Translator.from_checkpoint):
    with pytest.raises(checkpoint.CheckpointError, match='no such checkpoint folder'):
      read(missing)
    assert not missing.exists()
  before = _tree_snapshot(workdir)
  checkpoint.load(workdir)
  checkpoint.average_checkpoints(workdir, 2)
  translation.Translator.from_checkpoint(str(workdir), average_last=2).translate(['the dog'])
  assert _tree_snapshot(workdir) == before
  assert not caplog.records, caplog.text  # read-only managers, and nothing to warn about
  with pytest.raises(checkpoint.CheckpointError, match='must be >= 1, got 0'):
    checkpoint.average_checkpoints(workdir, 0)


# --- attention plots ------------------------------------------------------------------------------


def test_cross_attention_rows_are_distributions_over_real_source_pieces(translator):
  from jaxformer import plots
  src, tgt, layers = plots.cross_attention(translator, SENTENCES[0])
  assert len(layers) == translator.config.num_layers
  for weights in layers:
    assert weights.shape == (translator.config.num_heads, len(tgt), len(src))
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
  assert src[-1] == '</s>' and tgt[-1] == '</s>'


def test_plot_attention_writes_images(workdir, tmp_path):
  from matplotlib import image
  result = subprocess.run(
      [sys.executable, str(ROOT / 'experiments' / 'plot_attention.py'), '--workdir', str(workdir),
       '--sentence', 'the man who sees the dog walks', '--out', str(tmp_path)],
      capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  names = sorted(p.name for p in tmp_path.glob('*.png'))
  assert names == ['attention_layer1.png', 'attention_layer1_heads.png', 'attention_layer2.png',
                   'attention_layer2_heads.png', 'positional_encoding.png']
  for name in names:
    pixels = image.imread(tmp_path / name)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100
    assert pixels.std() > 0.01  # not a blank image


# --- export, n-best, files and terminals ----------------------------------------------------------


def test_export_round_trips_through_from_pretrained(workdir, tmp_path):
  out = tmp_path / 'export'
  assert cli.main(['export', str(workdir), str(out), '--average-last', '2']) == 0
  assert sorted(p.name for p in out.iterdir()) == ['config.json', 'params.safetensors',
                                                   'spm.model']
  averaged = translation.Translator.from_checkpoint(str(workdir), average_last=2, batch_size=4)
  exported = translation.Translator.from_pretrained(str(out), batch_size=4)
  assert exported.config == averaged.config
  assert exported.tokenizer.model_proto == averaged.tokenizer.model_proto
  assert jax.tree.structure(exported.params) == jax.tree.structure(averaged.params)
  for a, b in zip(jax.tree.leaves(exported.params), jax.tree.leaves(averaged.params)):
    np.testing.assert_array_equal(a, b)
  sentences = ['the man sees a dog', 'a small red house', '']
  assert exported.translate(sentences) == averaged.translate(sentences)
  assert json.loads((out / 'config.json').read_text())['step'] == 4


def test_a_damaged_or_partial_export_is_a_one_line_error(workdir, tmp_path, capsys):
  out = tmp_path / 'export'
  assert cli.main(['export', str(workdir), str(out)]) == 0
  (out / 'params.safetensors').write_bytes(b'not safetensors')
  with pytest.raises(checkpoint.CheckpointError, match='damaged export'):
    translation.Translator.from_pretrained(str(out))
  (out / 'spm.model').unlink()
  with pytest.raises(checkpoint.CheckpointError, match=r'not an exported model \(missing spm'):
    translation.Translator.from_pretrained(str(out))
  capsys.readouterr()
  assert cli.main(['translate', '--workdir', str(out)]) == 1
  assert capsys.readouterr().err.strip().splitlines()[-1].startswith('error: ')


def test_nbest_lists_the_beams_best_first_in_moses_format(workdir, translator, tmp_path):
  lines = ['the man sees a dog', '', 'a red cat']
  (tmp_path / 'in.txt').write_text('\n'.join(lines) + '\n')
  assert cli.main(['translate', '--workdir', str(workdir), '--input', str(tmp_path / 'in.txt'),
                   '--output', str(tmp_path / 'out.txt'), '--nbest', '3', '--batch-size',
                   '2']) == 0
  rows = [line.split(' ||| ') for line in (tmp_path / 'out.txt').read_text().splitlines()]
  assert [int(r[0]) for r in rows] == [0, 0, 0, 2, 2, 2]  # blank line 1 has none
  scores = [float(r[2]) for r in rows]
  assert scores[:3] == sorted(scores[:3], reverse=True) and all(s < 0 for s in scores)
  best = translator.translate(lines)
  assert [rows[0][1], rows[3][1]] == [best[0], best[2]]
  assert cli.main(['translate', '--workdir', str(workdir), '--nbest', '5']) == 1


def test_translate_files_with_a_progress_bar(workdir, translator, tmp_path):
  lines = ['the man sees a dog', '', 'Größe 😀', 'the dog']
  (tmp_path / 'in.txt').write_text('\n'.join(lines) + '\n', encoding='utf-8')
  result = subprocess.run(
      [sys.executable, '-m', 'jaxformer.cli', 'translate', '--workdir', str(workdir), '--input',
       str(tmp_path / 'in.txt'), '--output', str(tmp_path / 'out.txt')], capture_output=True,
      text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  assert 'translating: 100%' in result.stderr
  out = (tmp_path / 'out.txt').read_text(encoding='utf-8').split('\n')
  assert out[:-1] == translator.translate(lines) and out[-1] == ''


def test_translate_answers_each_line_typed_at_a_terminal(workdir, translator):
  """stdin a terminal: the translation of a line comes before the next line (or EOF) is sent."""
  import os  # pylint: disable=g-import-not-at-top
  import pty  # pylint: disable=g-import-not-at-top
  import select  # pylint: disable=g-import-not-at-top
  leader, follower = pty.openpty()
  process = subprocess.Popen([sys.executable, '-m', 'jaxformer.cli', 'translate', '--workdir',
                              str(workdir)], stdin=follower, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL)
  os.close(follower)
  try:
    expected = translator.translate(['the man sees a dog', 'a red cat'])
    for sentence, translation in zip(['the man sees a dog', 'a red cat'], expected):
      os.write(leader, sentence.encode() + b'\n')
      ready, _, _ = select.select([process.stdout], [], [], 240)
      assert ready, 'no answer before the next line'
      assert process.stdout.readline().decode().rstrip('\n') == translation
    os.write(leader, b'\x04')  # Ctrl-D: end of input
    assert process.wait(timeout=60) == 0
  finally:
    process.kill()
    os.close(leader)
