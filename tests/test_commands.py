"""jaxformer.commands: what each command does (translate, eval, score, average): outputs,
progress, prefixes and samples, one-line errors; mostly through cli.main, as a user runs them."""

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
import sacrebleu
from helpers import assert_log_lines, assert_trees_equal

from jaxformer import checkpoint, cli, commands, search, translation

TESTS = pathlib.Path(__file__).resolve().parent
ROOT = TESTS.parent


def test_nbest_past_the_beam_is_one_line_before_any_input_is_read(workdir, capsys, monkeypatch):
  monkeypatch.setattr('sys.stdin', None)  # (read, it would fail otherwise)
  assert cli.main(['translate', '--model', str(workdir), '--nbest', '5']) == 1
  assert capsys.readouterr().err.strip().splitlines()[-1] == (
      'error: 5-best needs a beam of at least 5 (this search has 4), or sampling.')


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


def test_nothing_to_search_is_an_empty_answer_from_the_command(workdir, tmp_path):
  """Blank lines only, with and without --nbest, and a score whose every pair is too long:
  exit 0 with the answers' lines (each was 'range() arg 3 must not be zero')."""
  command = [sys.executable, '-m', 'jaxformer', 'translate', '--model', str(workdir)]
  for extra, expected in (([], '\n\n\n'), (['--nbest', '2'], '')):
    result = subprocess.run(command + extra, input='\n  \n\t\n', capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0 and result.stdout == expected, result.stderr[-2000:]
  (tmp_path / 'long').write_text(' '.join(['the dog'] * 200) + '\n')
  result = subprocess.run([sys.executable, '-m', 'jaxformer', 'score', '--model', str(workdir),
                           '--src', str(tmp_path / 'long'), '--tgt', str(tmp_path / 'long')],
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  assert json.loads(result.stdout)['skipped'].startswith('the source has')
  # (every command's log in one format, warnings up: 'WARNING:jaxformer...' before, absl's)
  assert "WARNING jaxformer.translation: 1 of 1 pairs were not scored, longer than the model's" \
      in result.stderr and result.stderr.count('not scored') == 1  # (the command said it again)
  assert_log_lines(result.stderr)


def test_translate_refuses_invalid_utf8_naming_the_line(workdir):
  result = subprocess.run(
      [sys.executable, '-m', 'jaxformer.cli', 'translate', '--workdir', str(workdir),
       '--batch-size', '4'], input=b'the dog\nthe cat\n\xff\xfe not utf-8\nthe man\n',
      capture_output=True, timeout=300)
  assert result.returncode == 1
  assert result.stderr.decode().strip().splitlines()[-1] == (
      'error: stdin:3: not valid UTF-8 (byte 0: invalid start byte); re-encode it as UTF-8.')
  assert 'Traceback' not in result.stderr.decode()
  assert len(result.stdout.decode().splitlines()) == 2  # the lines before it, translated


def test_translate_into_a_closed_pipe_ends_quietly(workdir):
  """`jaxformer translate < many-lines | head -1`: no BrokenPipeError traceback."""
  command = (f'yes "the dog" | head -40 | {sys.executable} -m jaxformer.cli translate '
             f'--workdir {workdir} --batch-size 8 | head -1')
  result = subprocess.run(['bash', '-c', command], capture_output=True, text=True, timeout=300)
  assert len(result.stdout.splitlines()) == 1
  assert 'Traceback' not in result.stderr and 'error' not in result.stderr.lower(), \
      result.stderr  # ('error: cannot write to None (Broken pipe).' was printed)


def _eval_main(argv: list[str]) -> int:
  """`jaxformer eval`, in this process (the cases below stop before translating)."""
  return cli.main(['eval', *argv])


def test_eval_refuses_an_invalid_utf8_source_file(workdir, tmp_path, capsys):
  (tmp_path / 'test.src').write_bytes(b'the dog\nthe \xe9t\xe9\n')
  (tmp_path / 'test.ref').write_text('der hund\ndas haus\n')
  assert _eval_main(['--model', str(workdir), '--src', str(tmp_path / 'test.src'), '--ref',
                     str(tmp_path / 'test.ref'), '--output', str(tmp_path / 'hyps.txt')]) == 1
  assert capsys.readouterr().err.strip().splitlines() == [
      f'error: {tmp_path / "test.src"}:2: not valid UTF-8 (byte 4: invalid continuation byte); '
      're-encode it as UTF-8.']
  assert not (tmp_path / 'hyps.txt').exists()


def test_eval_checks_the_output_folder_before_translating(workdir, tmp_path, capsys):
  (tmp_path / 'test.src').write_text('the dog\n')
  (tmp_path / 'test.ref').write_text('der hund\n')
  assert _eval_main(['--model', str(workdir), '--src', str(tmp_path / 'test.src'), '--ref',
                     str(tmp_path / 'test.ref'), '--output',
                     str(tmp_path / 'missing' / 'hyps.txt')]) == 1
  err = capsys.readouterr().err
  assert 'translating' not in err
  assert err.strip().splitlines() == [
      f'error: {tmp_path / "missing"}: no such folder for the hypotheses.']


def test_score_checks_its_output_before_reading_or_scoring(tmp_path, capsys):
  """files.check_output, the one check of an output path, comes before the work: the model
  named here does not exist, and the output's missing folder is what is said (it was said
  after every pair was scored); a folder in the output's place likewise."""
  for output, said in ((tmp_path / 'missing' / 'scores.jsonl',
                        f'{tmp_path / "missing"}: no such folder for the scores.'),
                       (tmp_path, f'{tmp_path}: a folder, where the file for the scores belongs.')):
    assert cli.main(['score', '--model', str(tmp_path / 'no-model'), '--src', 'a', '--tgt', 'b',
                     '--output', str(output)]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [f'error: {said}']


def test_a_dash_is_stdin_or_stdout(workdir, translator, tmp_path, monkeypatch, capsys):
  """`--input -` and `--output -`, as other tools take them: they named files called '-'; a
  path flag that cannot take a stream refuses -."""
  reader, writer = os.pipe()
  os.write(writer, b'the dog\n')
  os.close(writer)
  monkeypatch.setattr(sys, 'stdin', os.fdopen(reader))
  assert cli.main(['translate', '--model', str(workdir), '--input', '-', '--output', '-']) == 0
  assert capsys.readouterr().out == translator.translate(['the dog'])[0] + '\n'
  (tmp_path / 'src').write_text('the dog\n')
  (tmp_path / 'tgt').write_text('der hund\n')
  assert cli.main(['score', '--model', str(workdir), '--src', str(tmp_path / 'src'), '--tgt',
                   str(tmp_path / 'tgt'), '--output', '-']) == 0
  assert json.loads(capsys.readouterr().out)['log_prob'] == pytest.approx(
      translator.score(['the dog'], ['der hund'])[0].log_prob)
  with pytest.raises(SystemExit):  # eval prints its scores on stdout: - is not its --output
    cli.main(['eval', '--model', str(workdir), '--src', 'a', '--ref', 'b', '--output', '-'])
  assert 'argument --output: must be a path: - (stdin or stdout) is not taken here; a file ' \
      'called - is ./-' in capsys.readouterr().err
  assert not (pathlib.Path.cwd() / '-').exists()


def test_translate_reads_its_input_and_prefixes_before_the_model_loads(tmp_path, capsys):
  """An input file that is missing, or prefixes of another count of lines, were found once the
  model had loaded; the model named here does not exist, and the input's fault is what is
  said, locally and with a server (whose address answers nothing)."""
  (tmp_path / 'in.txt').write_text('a\nb\n')
  (tmp_path / 'p.txt').write_text('x\n')
  for where in (['--model', str(tmp_path / 'no-model')], ['--server', 'http://127.0.0.1:9']):
    assert cli.main(['translate', *where, '--input', str(tmp_path / 'nowhere.txt')]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f'error: {tmp_path / "nowhere.txt"}: no such file.']
    assert cli.main(['translate', *where, '--input', str(tmp_path / 'in.txt'), '--prefix',
                     str(tmp_path / 'p.txt')]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f'error: {tmp_path / "p.txt"} has 1 lines and {tmp_path / "in.txt"} 2: give one prefix '
        'a line (an empty line for none).']


def test_eval_scores_any_target_language_and_says_when_the_model_is_undertrained(
    workdir, tmp_path, capsys, monkeypatch):
  """A Chinese target is scored with sacreBLEU's zh tokenizer; a language whose tokenizer is
  not installed is refused before the model is read; a model whose translations are all alike
  gets a one-line warning with its step (the workdir's model has 4 steps)."""
  (tmp_path / 'test.src').write_text('the dog\nthe cat\nthe house\n')
  (tmp_path / 'test.ref').write_text('狗\n猫\n房子\n')
  monkeypatch.setattr(translation.Translator, 'translate', lambda self, s, **k: ['狗'] * len(s))
  args = ['--model', str(workdir), '--src', str(tmp_path / 'test.src'), '--ref',
          str(tmp_path / 'test.ref'), '--output', str(tmp_path / 'hyps.txt')]
  assert _eval_main([*args, '--target-language', 'zh']) == 0
  out, err = capsys.readouterr()
  assert 'tok:zh' in out.splitlines()[0] and '(Moses -l zh' in out
  assert err.strip().splitlines()[-1] == (
      "warning: 3 of 3 translations are the same ('狗'): the model is undertrained after 4 "
      'steps; train it longer (more --num-steps), or on more data.')
  try:
    sacrebleu.metrics.BLEU(trg_lang='ja')
  except RuntimeError:  # (where MeCab is installed, Japanese is scored like any other)
    assert _eval_main([*args[:1], str(tmp_path / 'nowhere'), *args[2:],
                       '--target-language', 'ja']) == 1
    assert capsys.readouterr().err.strip() == (
        "error: sacreBLEU's tokenizer for ja needs a package that is not installed: pip "
        "install 'sacrebleu[ja]'.")


def test_eval_interrupted_while_translating_ends_quietly(workdir, tmp_path, capsys,
                                                       monkeypatch):
  (tmp_path / 'test.src').write_text('the dog\n')
  (tmp_path / 'test.ref').write_text('der hund\n')

  def interrupted(*args, **kwargs):
    raise KeyboardInterrupt
  monkeypatch.setattr(translation.Translator, 'translate', interrupted)
  assert _eval_main(['--model', str(workdir), '--src', str(tmp_path / 'test.src'), '--ref',
                     str(tmp_path / 'test.ref'), '--output', str(tmp_path / 'hyps.txt')]) == 130
  assert capsys.readouterr().err.strip().splitlines() == ['interrupted']  # (errors.exit_code's)
  assert not (tmp_path / 'hyps.txt').exists()


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


@pytest.mark.parametrize('stdin', ['terminal', 'pipe'])
def test_translate_answers_each_line_before_the_next_is_sent(workdir, translator, stdin):
  """The translation of a line comes before the next line (or EOF) is sent: typed at a
  terminal, or written through a pipe by a program that waits for each answer (through a pipe
  it waited for 64 lines, or EOF: such a program and the command waited for each other)."""
  import pty  # pylint: disable=g-import-not-at-top
  import select  # pylint: disable=g-import-not-at-top
  writer, reader = pty.openpty() if stdin == 'terminal' else os.pipe()[::-1]
  process = subprocess.Popen([sys.executable, '-m', 'jaxformer.cli', 'translate', '--workdir',
                              str(workdir)], stdin=reader, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL)
  os.close(reader)
  try:
    expected = translator.translate(['the man sees a dog', 'a red cat'])
    for sentence, translation in zip(['the man sees a dog', 'a red cat'], expected):
      os.write(writer, sentence.encode() + b'\n')
      ready, _, _ = select.select([process.stdout], [], [], 240)
      assert ready, 'no answer before the next line'
      assert process.stdout.readline().decode().rstrip('\n') == translation
    if stdin == 'terminal':
      os.write(writer, b'\x04')  # Ctrl-D: end of input
    else:
      os.close(writer)  # end of input
      writer = None
    assert process.wait(timeout=60) == 0
  finally:
    process.kill()
    if writer is not None:
      os.close(writer)


def test_average_command_saves_a_loadable_checkpoint(trained, capsys):

  assert cli.main(['average', '--workdir', str(trained), '--last', '2']) == 0
  assert 'average-last2' in capsys.readouterr().out
  params, _, _, _ = checkpoint.load(trained / 'average-last2')
  manager = checkpoint.make_manager(trained / 'checkpoints')
  expected = jax.tree.map(lambda a, b: (a + b) / 2, checkpoint.restore(manager, 4)['params'],
                          checkpoint.restore(manager, 6)['params'])
  assert_trees_equal(params, expected, rtol=1e-6)
  assert cli.main(['average', '--workdir', str(trained / 'nowhere'), '--last', '2']) == 1
  assert capsys.readouterr().err.startswith('error: ')
  assert cli.main(['average', '--workdir', str(trained), '--best', '2']) == 1
  assert 'but only 0 recorded it' in capsys.readouterr().err  # trained without average_best
  # --metric without --best was ignored: the last 2 averaged, as if it were not given
  assert cli.main(['average', '--workdir', str(trained), '--last', '2', '--metric', 'bleu']) == 1
  assert capsys.readouterr().err == ('error: --metric bleu ranks checkpoints for --best N; '
                                     'without it, the last N are averaged.\n')


def test_score_writes_a_line_for_every_pair_in_json_or_tsv(workdir, translator, tmp_path,
                                                          capsys, caplog):
  src, tgt = tmp_path / 'src.txt', tmp_path / 'tgt.txt'
  src.write_text('the dog\nthe man sees a dog\n' + 'dog ' * 200 + '\n', encoding='utf-8')
  tgt.write_text('der hund\nder mann\nhund\n', encoding='utf-8')
  expected = translator.score(src.read_text().splitlines(), tgt.read_text().splitlines())
  caplog.clear()
  assert cli.main(['score', '--model', str(workdir), '--src', str(src), '--tgt', str(tgt),
                   '--token-log-probs']) == 0
  out, err = capsys.readouterr()
  records = [json.loads(line) for line in out.splitlines()]
  assert [r['log_prob'] for r in records[:2]] == pytest.approx([s.log_prob for s in
                                                                expected[:2]])
  assert records[0]['token_log_probs'] == pytest.approx(list(expected[0].token_log_probs))
  assert records[2]['log_prob'] is None and 'source has' in records[2]['skipped']
  assert [r.getMessage() for r in caplog.records if 'not scored' in r.getMessage()] == [
      "1 of 3 pairs were not scored, longer than the model's 64 tokens (indices 2): their scores "
      'are none.'] and 'not scored' not in err  # said once (the command said it again)
  assert cli.main(['score', '--model', str(workdir), '--src', str(src), '--tgt', str(tgt),
                   '--format', 'tsv', '--output', str(tmp_path / 'scores.tsv')]) == 0
  rows = [line.split('\t') for line in (tmp_path / 'scores.tsv').read_text().splitlines()]
  assert len(rows) == 3 and rows[2][0] == 'nan' and int(rows[1][1]) == expected[1].tokens
  assert float(rows[1][2]) == pytest.approx(expected[1].mean, abs=1e-6)


@pytest.mark.parametrize('lines, message', [
    ('der hund\n\n', r'tgt\.txt:2: an empty target line \(1 in all\)'),
    ('der hund\n', r'src\.txt has 2 lines but .*tgt\.txt has 1'),
])
def test_score_refuses_what_it_cannot_score_in_one_line(workdir, tmp_path, capsys, lines,
                                                       message):
  (tmp_path / 'src.txt').write_text('the dog\na cat\n')
  (tmp_path / 'tgt.txt').write_text(lines)
  assert cli.main(['score', '--model', str(workdir), '--src', str(tmp_path / 'src.txt'),
                   '--tgt', str(tmp_path / 'tgt.txt')]) == 1
  assert re.search(f'^error: .*{message}', capsys.readouterr().err.strip())


def test_translate_with_prefixes_and_samples(workdir, translator, tmp_path, capsys):
  (tmp_path / 'in.txt').write_text('the dog\nthe man sees a dog\n')
  (tmp_path / 'prefix.txt').write_text('der\n\n')
  base = ['translate', '--model', str(workdir), '--input', str(tmp_path / 'in.txt'),
          '--extra-length', '4']
  assert cli.main([*base, '--prefix', str(tmp_path / 'prefix.txt')]) == 0
  out = capsys.readouterr().out.splitlines()
  assert out == translator.replace(extra_length=4).translate(
      ['the dog', 'the man sees a dog'], prefixes=['der', ''])
  assert out[0].startswith('der')
  assert cli.main([*base, '--sampling', '--seed', '3', '--nbest', '3']) == 0
  lines = capsys.readouterr().out.splitlines()
  assert [line.split(' ||| ')[0] for line in lines] == ['0'] * 3 + ['1'] * 3
  (tmp_path / 'prefix.txt').write_text('der\n')
  assert cli.main([*base, '--prefix', str(tmp_path / 'prefix.txt')]) == 1
  assert capsys.readouterr().err.strip().endswith(
      'prefix.txt has 1 lines and ' + str(tmp_path / 'in.txt') + ' 2: give one prefix a line '
      '(an empty line for none).')


@pytest.mark.parametrize('flags, message', [
    (['--sampling', '--temperature', '0'], "argument --temperature: must be a finite number > 0, "
     "got '0'"),
    (['--sampling', '--top-p', '0'], "argument --top-p: must be a finite number in (0, 1], got "
     "'0'"),
    (['--top-k', '5'], 'error: top_k=5: temperature, top_k, top_p and seed are for sampling only: '
     'turn it on (--sampling).'),
    (['--sampling', '--beam', '5'], "error: beam_size=5: beam_size and alpha are beam search's"),
])
def test_sampling_settings_refused_in_one_line(workdir, capsys, flags, message):
  try:
    code = cli.main(['translate', '--model', str(workdir), *flags])
  except SystemExit as e:
    code = e.code
  assert code in (1, 2)
  assert message in capsys.readouterr().err.strip().splitlines()[-1]


def test_drop_finished_and_all_rows_translate_as_the_default_search(workdir, tmp_path,
                                                                    monkeypatch):
  """--drop-finished (beam search, batches of 8 rows or more, which then shrink as their
  sentences finish) and --all-rows (every batch at all its rows to its end, no groups of
  stragglers) write the default search's n-best lists: the same translations, and scores
  equal to the float rounding that a search at other rows gives (XLA's products of other
  shapes sum in another order)."""
  words = ['the', 'man', 'sees', 'a', 'dog', 'with', 'a', 'red', 'cat', 'under', 'the', 'house']
  lines = [' '.join(words[:1 + i % len(words)]) for i in range(16)]  # lengths 1 to 12
  (tmp_path / 'in.txt').write_text('\n'.join(lines) + '\n', encoding='utf-8')
  shrinks = []
  monkeypatch.setattr(search, '_kept', lambda *a, kept=search._kept: shrinks.append(1) or kept(*a))
  outputs = []
  for i, extra in enumerate(([], ['--drop-finished'], ['--all-rows'])):
    out = tmp_path / f'out{i}.txt'
    assert cli.main(['translate', '--model', str(workdir), '--input', str(tmp_path / 'in.txt'),
                     '--output', str(out), '--nbest', '2', *extra]) == 0
    outputs.append(out.read_text(encoding='utf-8'))
  nbest = [[line.rsplit(' ||| ', 1) for line in out.splitlines()] for out in outputs]
  assert len(nbest[0]) == 2 * len(lines)
  for other in nbest[1:]:
    assert [text for text, _ in other] == [text for text, _ in nbest[0]]
    np.testing.assert_allclose([float(s) for _, s in other], [float(s) for _, s in nbest[0]],
                               rtol=1e-5)
  assert shrinks  # the second search did go on in fewer rows


def test_the_target_language_is_the_flags_else_the_runs_record_else_german(tmp_path, capsys):
  run = tmp_path / 'run'
  run.mkdir()
  def args(model, given=None):
    return argparse.Namespace(model=str(model), target_language=given)
  assert commands.target_language(args(run, 'ja')) == 'ja'
  assert commands.target_language(args(run)) == 'de' and capsys.readouterr().err == ''
  (run / 'recipe.json').write_text(json.dumps({'data': {'target_language': 'fr'}}))
  assert commands.target_language(args(run / 'average-last5')) == 'fr'
  assert f'scoring as fr, the target language recorded in {run / "recipe.json"}' in \
      capsys.readouterr().err
