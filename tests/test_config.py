"""jaxformer.config: settings check themselves, the fast path, (de)serialisation."""

import dataclasses

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
    ({'num_steps': 0}, r'^num_steps must be >= 1, got 0\.$'),
    ({'keep_train_state': 0}, r'^keep_train_state must be >= 1, got 0\.$'),
    ({'average_last': -1}, r'^average_last must be >= 0, got -1\.$'),
    ({'checkpoint_every_secs': 0.0}, r'^checkpoint_every_secs must be > 0 \(or unset\), got 0'),
    ({'patience': 0}, r'^patience must be >= 1 \(or unset\), got 0\.$'),
])
def test_train_settings_check_themselves(changes, message):
  with pytest.raises(config.SettingError, match=message):
    config.TrainConfig(**changes)
  with pytest.raises(config.SettingError, match="data.source must be 'wmt14', 'text' or"):
    config.DataConfig(source='web')
  assert issubclass(config.SettingError, errors.JaxformerError)  # the CLI's one-line errors
  assert config.TrainConfig(checkpoint_every_secs=None).checkpoint_every_secs is None


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
