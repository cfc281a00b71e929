"""jaxformer.scoring: sacreBLEU, the paper's tokenized BLEU and chrF, checked independently."""

import collections
import math
import re
import subprocess
import sys

import pytest
import sacrebleu
from sacrebleu.tokenizers.tokenizer_intl import TokenizerV14International

from jaxformer import scoring


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


def test_lowercased_tokenized_bleu_is_the_multi30k_protocol():
  """Multi30k's lc.norm.tok text (the first line of test_2016_flickr.lc.norm.tok.de, as the
  dataset ships it), then unsmoothed BLEU of those tokens; case no longer counts."""
  assert scoring.lowercase_tokenize('Ein Mann mit einem orangefarbenen Hut, der etwas '
                                    'anstarrt.') == ('ein mann mit einem orangefarbenen hut , '
                                                     'der etwas anstarrt .')
  expected = _hand_bleu(scoring.lowercase_tokenize(_HYP).split(),
                        scoring.lowercase_tokenize(_REF).split())
  assert scoring.lowercase_tokenized_bleu([_HYP], [_REF]) == pytest.approx(expected, rel=1e-9)
  cased = ['Ein Hund läuft über die Wiese im Park.']
  lower = ['ein hund läuft über die wiese im park.']
  assert scoring.lowercase_tokenized_bleu(cased, lower) == pytest.approx(100.0)
  assert scoring.sacre_bleu(cased, lower)[0] < 100.0
  result = scoring.scores(cased, lower)
  assert result['lowercase_tokenized_bleu'] == 100.0 and result['sacrebleu'] < 100.0
  report = scoring.report(result, lang='de', origin='x', segments=1, decoding='beam 4')
  assert report[2].startswith('lowercased tokenized BLEU 100.00  (Moses normalize + tokenize')


def test_sacrebleu_tokenizes_as_the_target_language_says():
  """Chinese is scored on characters (sacreBLEU's zh tokenizer); an unspaced Chinese sentence
  is one 13a token. Other languages keep 13a."""
  hyp, ref = ['我喜欢吃苹果'], ['我喜欢吃香蕉']
  zh, zh_signature = scoring.sacre_bleu(hyp, ref, 'zh')
  assert 'tok:zh' in zh_signature and zh == pytest.approx(
      sacrebleu.corpus_bleu(hyp, [ref], tokenize='zh').score)
  assert 0 < zh < 100 and scoring.sacre_bleu(hyp, ref)[0] == 0.0  # one 13a word, and wrong
  assert 'tok:13a' in scoring.sacre_bleu(['Hola.'], ['Hola.'], 'es')[1]
  assert 'tok:zh' in scoring.scores(hyp, ref, 'zh')['signature']


@pytest.mark.parametrize('lang,extra', [('ja', 'sacrebleu[ja]'), ('ko', 'sacrebleu[ko]')])
def test_a_tokenizer_whose_package_is_missing_names_the_extra(lang, extra):
  pytest.importorskip('sacrebleu')
  try:  # where MeCab is installed, there is nothing to say
    sacrebleu.metrics.BLEU(trg_lang=lang)
    pytest.skip(f'sacrebleu[{lang}] is installed here')
  except RuntimeError:
    pass
  with pytest.raises(scoring.ScoringError, match=rf"^sacreBLEU's tokenizer for {lang} needs a "
                     rf"package that is not installed: pip install '{re.escape(extra)}'\.$"):
    scoring.check_language(lang)
  with pytest.raises(scoring.ScoringError, match='expected an ISO 639 code'):
    scoring.check_language('Spanish')


def test_moses_rules_follow_the_language_and_fall_back_to_english():
  # Spanish's nonbreaking prefixes keep "Sra." whole; English's split it.
  assert scoring.paper_tokenize('La Sra. García llegó.', 'es') == 'La Sra. García llegó .'
  assert scoring.paper_tokenize('La Sra. García llegó.', 'en') == 'La Sra . García llegó .'
  assert scoring.moses_language('es') == 'es' and scoring.moses_language('sw') == 'en'
  report = scoring.report(scoring.scores(['Habari'], ['Habari'], 'sw'), lang='sw', origin='x',
                          segments=1, decoding='beam 4')
  assert '(Moses -l en [Moses has no rules for sw] + compound splitting' in report[1]


@pytest.mark.parametrize('hypotheses,warned', [
    (['', '', 'a house'], '2 of 3 translations are empty'),
    (['ein Mann .', 'ein Mann .', 'ein Hund .'], "2 of 3 translations are the same ('ein Mann .')"),
    (['ein Mann .', 'ein Hund .', ''], None), (['ein Mann .'], None)])
def test_undertrained_output_is_named(hypotheses, warned):
  warning = scoring.undertrained(hypotheses, 120)
  if warned is None:
    assert warning is None
  else:
    assert warning == f'{warned}: the model is undertrained after 120 steps; train it longer ' \
        '(more --num-steps), or on more data.'
