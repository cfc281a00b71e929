"""jaxformer.protocol: requests checked once, read from and written as the server's JSON, merged
as a server merges them; jax-free."""

import subprocess
import sys

import pytest

from jaxformer import protocol
from jaxformer.errors import DataError
from jaxformer.settings import DecodingConfig, ServerLimits, SettingError

Translate, Score = protocol.TranslateRequest, protocol.ScoreRequest


def test_a_request_round_trips_through_its_json():
  full = Translate(['a', 'b'], nbest=2, prefix=['x', ''], first_index=7,
                   settings={'sampling': True, 'top_k': 5})
  assert full.to_json() == {'src': ['a', 'b'], 'nbest': 2, 'prefix': ['x', ''],
                            'first_index': 7, 'sampling': True, 'top_k': 5}
  assert Translate.from_json(full.to_json()) == full
  assert Translate(['a']).to_json() == {'src': ['a']}  # defaults are left out
  assert Translate.from_json({'src': ['a']}) == Translate(['a'])
  score = Score(['a'], ['b'], token_log_probs=True)
  assert Score.from_json(score.to_json()) == score
  # A server's beam is not a sampling request's (sampling reads none of it), and back:
  assert full.decoding(DecodingConfig(beam_size=6, alpha=1.0)) == DecodingConfig(
      sampling=True, top_k=5)
  assert Translate(['a'], settings={'sampling': False}).decoding(DecodingConfig(
      sampling=True, top_p=0.5, batch_size=8)) == DecodingConfig(batch_size=8)
  assert Translate(['a']).decoding(DecodingConfig(beam_size=6)) == DecodingConfig(beam_size=6)


@pytest.mark.parametrize('body, error', [
    (['a'], 'the request must be a JSON object'),
    ({'src': ['a'], 'beam_size': 8}, 'sets "beam_size", which it cannot'),
    ({'src': 'a'}, 'needs "src": a list of strings'),
    ({'src': ['a', 3]}, 'needs "src": a list of strings'),
    ({'src': ['a'], 'nbest': 0}, '"nbest" must be an integer from 1 to 100, got 0'),
    ({'src': ['a'], 'nbest': True}, '"nbest" must be an integer'),
    ({'src': ['a'], 'first_index': -1}, '"first_index" must be an integer from 0'),
    ({'src': ['a'], 'prefix': ['x', 'y']}, '2 prefixes for 1 sentences'),
    ({'src': ['a\ud800']}, r'src\[0\] is not valid text at character 1'),
])
def test_a_bad_translation_request_is_one_line(body, error):
  with pytest.raises(protocol.RequestError, match=error):
    Translate.from_json(body)


def test_settings_are_checked_as_decoding_checks_them():
  with pytest.raises(SettingError, match='top_p'):
    Translate.from_json({'src': ['a'], 'top_p': 2.0})
  with pytest.raises(protocol.RequestError, match='"alpha" is not a setting a request may'):
    Translate(['a'], settings={'alpha': 1.0})  # (from Python, past from_json's field check)


def test_sampling_settings_alone_are_judged_against_the_models_own_search():
  """A request of a temperature alone was refused as 'for sampling only: turn it on' by a
  server that samples."""
  alone = Translate.from_json({'src': ['a'], 'temperature': 0.5})
  assert alone.decoding(DecodingConfig(sampling=True)) == DecodingConfig(sampling=True,
                                                                         temperature=0.5)
  with pytest.raises(SettingError, match='temperature=0.5: .* for sampling only'):
    alone.decoding(DecodingConfig())
  with pytest.raises(SettingError, match='temperature=0.5: .* for sampling only'):
    Translate.from_json({'src': ['a'], 'sampling': False, 'temperature': 0.5})


def test_nbest_fits_the_beam_or_the_samples():
  protocol.check_nbest(4, DecodingConfig())
  protocol.check_nbest(100, DecodingConfig(sampling=True))
  for n, settings, error in ((5, {}, '5-best needs a beam of at least 5 .this search has 4.'),
                             (0, {}, 'n-best needs n >= 1, got 0'),
                             (101, {'sampling': True}, '101 samples a sentence: at most 100')):
    with pytest.raises(SettingError, match=error):
      protocol.check_nbest(n, DecodingConfig(**settings))


def test_scores_need_one_target_a_source_and_a_boolean():
  with pytest.raises(DataError, match='2 sources and 1 targets'):
    Score.from_json({'src': ['a', 'b'], 'tgt': ['c']})
  with pytest.raises(protocol.RequestError, match='"token_log_probs" must be true or false, got '
                     '"yes"'):
    Score.from_json({'src': ['a'], 'tgt': ['b'], 'token_log_probs': 'yes'})
  with pytest.raises(protocol.RequestError, match='sets "nbest"'):
    Score.from_json({'src': ['a'], 'tgt': ['b'], 'nbest': 2})


def test_a_servers_limits_are_413s():
  limits = ServerLimits(max_sentences=2, max_chars=5)
  with pytest.raises(protocol.TooLarge, match='"src" has 3 sentences, more than .* \\(2\\)'):
    Translate.from_json({'src': ['a'] * 3}, limits)
  with pytest.raises(protocol.TooLarge, match=r'tgt\[1\] has 6 characters'):
    Score.from_json({'src': ['a', 'b'], 'tgt': ['c', 'dddddd']}, limits)
  assert Translate.from_json({'src': ['a'] * 3}).src == ['a'] * 3  # no server, no bound


def test_merged_requests_keep_their_order_and_their_prefixes_apart():
  merged = protocol.merged([Translate(['a', 'b']), Translate(['c'], prefix=['p']),
                            Translate(['d'])])
  assert merged == Translate(['a', 'b', 'c', 'd'], prefix=['', '', 'p', ''])
  assert protocol.merged([Translate(['a']), Translate(['b'])]) == Translate(['a', 'b'])
  assert protocol.merged([Score(['a'], ['b']), Score(['c', 'd'], ['e', 'f'])]) == Score(
      ['a', 'c', 'd'], ['b', 'e', 'f'])


def test_answers_are_read_as_they_were_written():
  nbest, plain, score = Translate(['a'], nbest=2), Translate(['a']), Score(['a'], ['b'], True)

  class Found:  # a TargetScore's JSON form
    def as_dict(self, token_log_probs):
      return {'log_prob': -1.0, **({'token_log_probs': [-1.0]} if token_log_probs else {})}
  assert nbest.read(nbest.answer([[['x', -1.0]]])) == [[['x', -1.0]]]
  assert plain.answer(['x']) == {'translations': ['x']}
  assert plain.read({'translations': ['x']}) == ['x']
  assert score.read(score.answer([Found()])) == [{'log_prob': -1.0, 'token_log_probs': [-1.0]}]


def test_it_imports_no_jax():
  found = subprocess.run([sys.executable, '-c', 'import sys, jaxformer.protocol; '
                          'print("jax" in sys.modules)'], capture_output=True, text=True)
  assert found.stdout.strip() == 'False', found.stderr
