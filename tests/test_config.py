"""jaxformer.config: settings check themselves, the fast path, (de)serialisation."""

import dataclasses
import typing

import jax.numpy as jnp
import pytest

from jaxformer import checkpoint, config, errors
from jaxformer import config as config_lib


def test_config_rejects_indivisible_heads():
  with pytest.raises(ValueError, match='divisible'):
    config_lib.base().replace(num_heads=7)


def test_fast_path_on_gpu_only():
  """bfloat16, cuDNN attention, loss chunks of 4096, rbg dropout bits, bfloat16 LayerNorm
  output: what trained on packed rows on an H100 (docs/BENCHMARKS.md, "GPU, part 4")."""
  base = config_lib.base()
  gpu = config_lib.fast_path(base, 'gpu')
  assert gpu.execution == config_lib.Execution(
      dtype=jnp.bfloat16, attention='fused', loss_chunk=4096, dropout_rng='rbg',
      norm_dtype=jnp.bfloat16)
  # Fused attention has neither attention dropout nor d_k != d_v: those keep einsum.
  for other in (base.replace(attention_dropout_rate=0.1), base.replace(qk_dim=32, v_dim=128)):
    assert config_lib.fast_path(other, 'gpu').execution.attention == 'einsum'
  assert gpu == base.replace(execution=gpu.execution)  # nothing else changes
  assert config_lib.fast_path(base, 'cpu') == base and base.execution == config_lib.Execution()
  # Fused attention has no attention dropout.
  with pytest.raises(ValueError, match='no attention dropout'):
    base.with_execution(attention='fused').replace(attention_dropout_rate=0.1)
  with pytest.raises(ValueError, match="attention must be 'einsum' or 'fused'"):
    base.with_execution(attention='flash')


def test_configs_round_trip_and_old_flat_checkpoint_configs_load():
  cfg = config_lib.tiny().with_execution(dtype=jnp.bfloat16, remat=True)
  fields = config.config_to_dict(cfg)
  assert fields['execution'] == {'dtype': 'bfloat16', 'attention': 'einsum', 'remat': True,
                                 'loss_chunk': 1024, 'norm_dtype': 'float32',
                                 'dropout_rng': 'threefry'}
  assert config.config_from_dict(fields) == cfg
  # Equal configs hash alike (a checkpoint's config finds the programs compiled for the run's).
  assert hash(config.config_from_dict(config.config_to_dict(config_lib.tiny()))) == hash(
      config_lib.tiny())
  # jaxformer 0.1 wrote the execution fields at the top level.
  old = {k: v for k, v in fields.items() if k != 'execution'}
  old.update(dtype='float32', attention='einsum', remat=False, loss_chunk=1024)
  assert config.config_from_dict(old) == config_lib.tiny()
  checkpoint.check_compatible({'config': old, 'spm_sha256': checkpoint.make_meta(
      cfg, b'x')['spm_sha256']}, 'old', config=cfg, spm_model=b'x')  # execution ignored
  with pytest.raises(config.SettingError, match=r"does not know: \['colour'\]"):
    config.config_from_dict({**fields, 'colour': 'red'})
  with pytest.raises(checkpoint.CheckpointError, match=r"does not know: \['colour'\]"):
    checkpoint.meta_config({'config': {**fields, 'colour': 'red'}})


@pytest.mark.parametrize('changes,message', [
    ({'num_steps': 0}, r'^train\.num_steps must be >= 1, got 0\.$'),
    ({'keep_train_state': 0}, r'^train\.keep_train_state must be >= 1, got 0\.$'),
    ({'average_last': -1}, r'^train\.average_last must be >= 0, got -1\.$'),
    ({'checkpoint_every_secs': 0.0},
     r'^train\.checkpoint_every_secs must be > 0 \(or unset\), got 0'),
    ({'patience': 0}, r'^train\.patience must be >= 1 \(or unset\), got 0\.$'),
])
def test_train_settings_check_themselves(changes, message):
  with pytest.raises(config.SettingError, match=message):
    config.TrainConfig(**changes)
  with pytest.raises(config.SettingError, match="data.source must be 'wmt14', 'text' or"):
    config.DataConfig(source='web')
  assert issubclass(config.SettingError, errors.JaxformerError)  # the CLI's one-line errors
  assert config.TrainConfig(checkpoint_every_secs=None).checkpoint_every_secs is None


@pytest.mark.parametrize('cls,changes,message', [
    (config.TransformerConfig, {'num_heads': 0}, r'^model\.num_heads must be >= 1, got 0\.$'),
    (config.OptimConfig, {'warmup_steps': 0}, r'^optim\.warmup_steps must be >= 1'),
    (config.TransformerConfig, {'dropout_rate': 1.5},
     r'^model\.dropout_rate must be in \[0, 1\), got 1\.5\.$'),
    (config.OptimConfig, {'label_smoothing': -3}, r'^optim\.label_smoothing must be in'),
    (config.OptimConfig, {'adam_eps': 0.0}, r'^optim\.adam_eps must be > 0, got 0\.0'),
    (config.OptimConfig, {'grad_clip_norm': -1.0}, r'must be > 0 \(or unset\), got -1'),
    (config.OptimConfig, {'learning_rate': 0.0}, r'^optim\.learning_rate must be > 0 \(or unset\)'),
    (config.OptimConfig, {'lr_scale': float('nan')}, r'^optim\.lr_scale must be a finite number'),
    (config.OptimConfig, {'learning_rate': float('inf')}, r'must be a finite number, got inf'),
    (config.TransformerConfig, {'vocab_size': '8000'},
     r"^model\.vocab_size must be int, got str '8000'\.$"),
    (config.TransformerConfig, {'pre_ln': 1}, r'^model\.pre_ln must be bool, got int 1\.$'),
    (config.TransformerConfig, {'execution': {}}, r'^model\.execution must be Execution, got dict'),
    (config.TrainConfig, {'seed': -1}, r'^train\.seed must be in \[0, 4294967296\), got -1\.$'),
    (config.TrainConfig, {'spm_sample_size': -5}, r'^train\.spm_sample_size must be >= 1'),
    (config.TrainConfig, {'tokens_per_batch': 0.5}, r'must be int, got float 0\.5\.$'),
    (config.TrainConfig, {'checkpoint_every_secs': '600'}, r'must be float or none, got str'),
    (config.DataConfig, {'train_pairs': 0}, r'^data\.train_pairs must be >= 1, got 0\.$'),
    (config.DataConfig, {'target_language': 'Spanish'},
     r"^data\.target_language must be an ISO 639 code such as en, de or zh, got 'Spanish'\.$"),
    (config.DataConfig, {'source': 'wmt14', 'target_language': 'es'},
     r'^WMT14 has no en->es direction: set data\.source_language and data\.target_language to '
     r'one of en->de, de->en, en->fr, fr->en\.$'),
    (config.DataConfig, {'eval_src': 'val.en'}, r'^data\.eval_src and data\.eval_tgt go together'),
    (config.DataConfig, {'source': 'embedded', 'train_src': 'a', 'train_tgt': 'b'},
     r"^data\.train_src is read only from a text source, and this one is 'embedded': add "
     r'--source text'),
])
def test_settings_out_of_range_or_of_the_wrong_type_name_themselves(cls, changes, message):
  with pytest.raises(config.SettingError, match=message):
    cls(**changes)


@pytest.mark.parametrize('cls', [config.TransformerConfig, config.TrainConfig, config.DataConfig])
def test_every_number_setting_has_a_range(cls):
  hints = typing.get_type_hints(cls)
  numbers = {f.name for f in dataclasses.fields(cls)
             if {int, float} & {hints[f.name], *typing.get_args(hints[f.name])}}
  assert numbers and numbers <= set(cls.RANGES), numbers - set(cls.RANGES)
  for name in numbers:  # every default is in its own range
    default = getattr(cls(), name)
    assert default is None or default in cls.RANGES[name], name


def test_the_steps_compute_on_the_fast_path_when_asked_or_on_gpu():
  base = config.base()
  assert config.TrainConfig().computed(base) == base  # the tests' backend is the CPU
  assert config.TrainConfig(fast_path=True).computed(base) == config.fast_path(base, 'gpu')
  assert config.TrainConfig(fast_path=False).computed(base) == base


@pytest.mark.parametrize('cls', [config_lib.TransformerConfig, config_lib.Execution])
def test_every_model_field_has_an_attribute_docstring(cls):
  """Attribute docstrings (which generated references read), not `#` comments."""
  import ast  # pylint: disable=g-import-not-at-top
  import inspect  # pylint: disable=g-import-not-at-top
  import textwrap  # pylint: disable=g-import-not-at-top
  body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
  documented = {node.target.id for node, after in zip(body, body[1:])
                if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)}
  assert documented == {field.name for field in dataclasses.fields(cls)}
