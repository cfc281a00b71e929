"""jaxformer.settings: the parts of every settings dataclass, and DecodingConfig."""

import dataclasses
import subprocess
import sys

import pytest

from jaxformer import config, settings
from jaxformer.settings import DecodingConfig, Range


def test_ranges_say_what_they_hold():
  assert [x in Range(0, 1, low_open=True, high_open=False) for x in (0, 0.5, 1, 1.5)] == [
      False, True, True, False]
  assert str(Range(0, 1, low_open=True, high_open=False)) == 'in (0, 1]'
  assert str(Range(0, 1)) == 'in [0, 1)' and str(Range(1)) == '>= 1'
  assert str(Range(0, low_open=True)) == '> 0'


def test_decoding_defaults_are_the_papers_and_config_reexports_them():
  assert DecodingConfig() == config.DecodingConfig(beam_size=4, alpha=0.6, extra_length=50)
  assert config.SettingError is settings.SettingError and config.setting is settings.setting
  assert DecodingConfig().describe() == 'beam 4, alpha 0.6, max length input + 50'
  assert DecodingConfig(sampling=True, top_k=40, seed=3).describe() == (
      'sampling (temperature 1.0, top-k 40, top-p 1.0, seed 3), max length input + 50')


@pytest.mark.parametrize('fields, message', [
    ({'sampling': True, 'temperature': 0.0}, r'^decoding\.temperature must be > 0, got 0\.0\.$'),
    ({'sampling': True, 'top_p': 0.0}, r'^decoding\.top_p must be in \(0, 1\], got 0\.0\.$'),
    ({'sampling': True, 'top_k': -1}, r'^decoding\.top_k must be >= 0, got -1\.$'),
    ({'sampling': True, 'seed': 2**32}, r'^decoding\.seed must be in \[0, 4294967296\)'),
    ({'alpha': float('nan')}, r'^decoding\.alpha must be a finite number, got nan\.$'),
    ({'beam_size': True}, r'^decoding\.beam_size must be int, got bool True\.$'),
    ({'temperature': 0.5, 'seed': 1}, r'^temperature=0\.5, seed=1: temperature, top_k, top_p '
     r'and seed are for sampling only: turn it on \(--sampling\)\.$'),
    ({'sampling': True, 'alpha': 1.0}, r"^alpha=1\.0: beam_size and alpha are beam search's"),
])
def test_decoding_settings_refused_with_one_line(fields, message):
  with pytest.raises(settings.SettingError, match=message):
    DecodingConfig(**fields)


def test_every_decoding_setting_has_help_and_a_range_where_it_is_a_number():
  for field in dataclasses.fields(DecodingConfig):
    assert field.metadata['help'], field.name
    if field.type is not bool:  # (sampling, drop_finished: on or off)
      assert field.name in DecodingConfig.RANGES, field.name
  assert set(DecodingConfig.PER_REQUEST) >= set(DecodingConfig.SAMPLING)


def test_settings_import_no_jax():
  code = 'import sys, jaxformer.settings; print("jax" in sys.modules)'
  result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          timeout=60, check=True)
  assert result.stdout.strip() == 'False'
