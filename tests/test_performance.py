"""The fast paths give the same answers: chunked loss, heads-first and fused attention, remat,
bfloat16, the analytic FLOP count, the prefetch thread, and execution fields in checkpoints."""

import functools
import math
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer import checkpoint, config, flops, losses, parallel, train, translation
from jaxformer import config as config_lib
from jaxformer.model import Transformer
from test_train import reverse_batch


def _hidden_case(seed=0, n_batch=3, length=7, d=16, vocab=50, dtype=jnp.float32):
  rng = np.random.default_rng(seed)
  hidden = jnp.asarray(rng.standard_normal((n_batch, length, d)), dtype)
  embedding = jnp.asarray(rng.standard_normal((vocab, d)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, vocab, (n_batch, length)))
  weights = jnp.asarray(rng.random((n_batch, length)) > 0.3, jnp.float32)
  return hidden, embedding, targets, weights


def _reference(hidden, embedding, targets, weights, epsilon):
  """The loss through whole [..., V] logits and autodiff: (loss, (weight_sum, correct))."""
  logits = jnp.dot(hidden, embedding.astype(hidden.dtype).T, preferred_element_type=jnp.float32)
  loss_sum, weight_sum = losses.smoothed_cross_entropy(logits, targets, weights, epsilon)
  correct, _ = losses.accuracy(logits, targets, weights)
  return loss_sum, (weight_sum, correct)


@pytest.mark.parametrize('epsilon', [0.1, 0.0])
@pytest.mark.parametrize('chunk', [4, 21, 64])  # 21 positions: ragged, exact, one padded chunk
def test_chunked_loss_equals_the_loss_of_whole_logits(epsilon, chunk):
  case = _hidden_case()

  def chunked(hidden, embedding, targets, weights):
    loss_sum, weight_sum, correct = losses.chunked_smoothed_cross_entropy(
        hidden, embedding, targets, weights, epsilon, chunk=chunk)
    return loss_sum, (weight_sum, correct)

  grad = functools.partial(jax.value_and_grad, argnums=(0, 1), has_aux=True)
  (want, (want_n, want_c)), want_grads = grad(_reference)(*case, epsilon)
  (got, (got_n, got_c)), got_grads = jax.jit(grad(chunked))(*case)
  assert float(got) == pytest.approx(float(want), rel=1e-5)
  assert float(got_n) == float(want_n) == float(case[3].sum())
  assert float(got_c) == float(want_c)
  for g, w in zip(got_grads, want_grads):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)


def test_chunked_loss_scales_its_gradient_by_the_cotangent():
  hidden, embedding, targets, weights = _hidden_case()
  loss = lambda h, s: s * losses.chunked_smoothed_cross_entropy(  # noqa: E731
      h, embedding, targets, weights, 0.1, chunk=8)[0]
  np.testing.assert_allclose(jax.grad(loss)(hidden, 3.0), 3 * jax.grad(loss)(hidden, 1.0),
                             rtol=1e-6)


def test_chunked_loss_in_bfloat16_is_close_to_float32():
  case32 = _hidden_case(d=32, vocab=300)
  case16 = (case32[0].astype(jnp.bfloat16), *case32[1:])
  want, _ = _reference(*case32, 0.1)
  got, _, _ = losses.chunked_smoothed_cross_entropy(*case16, 0.1, chunk=8)
  assert float(got) == pytest.approx(float(want), rel=2e-2)
  d_hidden = jax.grad(lambda h: losses.chunked_smoothed_cross_entropy(
      h, *case16[1:], 0.1, chunk=8)[0])(case16[0])
  assert d_hidden.dtype == jnp.bfloat16


# --- FLOPs ---------------------------------------------------------------------------------------


def _dot_flops(jaxpr) -> int:
  """2 x multiply-adds of every dot_general in a jaxpr (scan bodies times their length)."""
  total = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'dot_general':
      (lhs_contract, _), _ = eqn.params['dimension_numbers']
      lhs_shape = eqn.invars[0].aval.shape
      total += 2 * math.prod(eqn.outvars[0].aval.shape) * math.prod(
          lhs_shape[d] for d in lhs_contract)
    repeat = eqn.params.get('length', 1) if eqn.primitive.name == 'scan' else 1
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else [param]:
        if isinstance(sub, jax.extend.core.ClosedJaxpr):
          total += repeat * _dot_flops(sub.jaxpr)
        elif isinstance(sub, jax.extend.core.Jaxpr):
          total += repeat * _dot_flops(sub)
  return total


# Unequal d_k and d_v, source and target lengths: each term of the count is checked.
FLOPS_CONFIG = config_lib.TransformerConfig(
    vocab_size=97, num_layers=2, d_model=24, d_ff=40, num_heads=3, qk_dim=4, v_dim=6,
    dropout_rate=0.0, execution=config_lib.Execution(loss_chunk=16))


def _flops_batch(rows=2, src_len=7, tgt_len=5):
  rng = np.random.default_rng(0)
  return {'src': jnp.asarray(rng.integers(3, 97, (rows, src_len))),
          'tgt_in': jnp.asarray(rng.integers(3, 97, (rows, tgt_len))),
          'tgt_out': jnp.asarray(rng.integers(3, 97, (rows, tgt_len))),
          'weights': jnp.ones((rows, tgt_len))}


def test_forward_flops_equal_the_dots_of_the_forward_pass():
  batch = _flops_batch()
  model = Transformer(FLOPS_CONFIG)
  params = model.init(jax.random.key(0), batch['src'], batch['tgt_in'])['params']
  jaxpr = jax.make_jaxpr(lambda p: model.apply({'params': p}, batch['src'], batch['tgt_in']))
  assert _dot_flops(jaxpr(params).jaxpr) == flops.forward_flops(FLOPS_CONFIG, 2, 7, 5)


def test_train_flops_equal_the_dots_of_the_train_step():
  batch = _flops_batch()
  state = train.create_train_state(FLOPS_CONFIG, jax.random.key(0))
  jaxpr = jax.make_jaxpr(train.train_step)(state, batch, jax.random.key(1))
  counted = _dot_flops(jaxpr.jaxpr)
  assert counted == flops.train_flops(FLOPS_CONFIG, 2, 7, 5) == 3 * flops.forward_flops(
      FLOPS_CONFIG, 2, 7, 5)


def test_forward_flops_of_base_by_hand():
  """One 256-token row per side: 6 x (enc + dec) layers plus the softmax, written out."""
  d, f, v, n = 512, 2048, 37000, 256
  attention = 2 * (4 * n * d * d + 2 * n * n * d)
  ffn = 2 * 2 * n * d * f
  expected = 6 * ((attention + ffn) + (2 * attention + ffn)) + 2 * n * d * v
  assert flops.forward_flops(config_lib.base(), 1, n, n) == expected


# --- attention, remat, bfloat16 -----------------------------------------------------------------


def _packed_inputs():
  """Two rows: one with two packed pairs and padding, one with a single pair."""
  src = jnp.array([[5, 6, 7, 8, 9, 0], [11, 12, 13, 14, 15, 16]])
  src_segments = jnp.array([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 1]])
  src_positions = jnp.array([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]])
  tgt = jnp.array([[0, 21, 22, 0, 23, 0, 0], [0, 31, 32, 33, 34, 35, 36]])
  tgt_segments = jnp.array([[1, 1, 1, 2, 2, 0, 0], [1, 1, 1, 1, 1, 1, 1]])
  tgt_positions = jnp.array([[0, 1, 2, 0, 1, 0, 0], [0, 1, 2, 3, 4, 5, 6]])
  return dict(src=src, tgt_in=tgt, src_segments=src_segments, tgt_segments=tgt_segments,
              src_positions=src_positions, tgt_positions=tgt_positions)


def test_fused_attention_agrees_with_einsum_attention(tiny_model, tiny_config):
  _, params = tiny_model
  inputs = _packed_inputs()
  real = np.asarray(inputs['tgt_segments'] > 0)
  outputs = {}
  for attention in ('einsum', 'fused'):
    cfg = tiny_config.run_as(attention=attention)
    logits = Transformer(cfg).apply({'params': params}, **inputs)
    greedy = translation.decode_batch(params, inputs['src'][1:], jnp.array([9]), config=cfg,
                                      max_len=10, beam_size=1, alpha=0.6)
    outputs[attention] = (np.asarray(logits)[real], np.asarray(greedy))
  np.testing.assert_allclose(outputs['fused'][0], outputs['einsum'][0], rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(outputs['fused'][1], outputs['einsum'][1])


def test_fused_attention_names_cudnn_on_gpu_with_full_masks(tiny_model, tiny_config,
                                                            monkeypatch):
  """On a GPU (faked here), fused bfloat16 attention asks for cuDNN's kernel by name where its
  lengths are even, with each mask broadcast to the [B, 1, T, L] bias cuDNN needs; odd lengths
  keep XLA's lowering. The fake runs XLA's lowering, so the answers must equal the CPU path's."""
  _, params = tiny_model
  cfg = tiny_config.run_as(attention='fused', dtype=jnp.bfloat16)
  xla, calls = jax.nn.dot_product_attention, []

  def fake(q, k, v, *, mask, scale, implementation=None):
    calls.append((implementation, mask.shape, (q.shape[0], 1, q.shape[1], k.shape[1])))
    return xla(q, k, v, mask=mask, scale=scale)
  even = {name: jnp.pad(x, ((0, 0), (0, 1))) if name.startswith('tgt') else x
          for name, x in _packed_inputs().items()}  # targets of 8
  on_cpu = Transformer(cfg).apply({'params': params}, **even)
  monkeypatch.setattr(jax.nn, 'dot_product_attention', fake)
  monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
  on_gpu = Transformer(cfg).apply({'params': params}, **even)
  np.testing.assert_array_equal(np.asarray(on_gpu), np.asarray(on_cpu))
  assert len(calls) == 3 * cfg.num_layers  # encoder self, decoder self and cross, per layer
  assert all(kernel == 'cudnn' and mask == bias for kernel, mask, bias in calls)
  calls.clear()
  Transformer(cfg).apply({'params': params}, **_packed_inputs())  # targets of 7
  assert [kernel for kernel, _, _ in calls] == ['cudnn'] * 2 + [None] * 4
  calls.clear()
  Transformer(cfg.run_as(dtype=jnp.float32)).apply({'params': params}, **even)
  assert {kernel for kernel, _, _ in calls} == {None}  # cuDNN's kernel is bf16/fp16 only


def test_remat_changes_neither_params_nor_loss_nor_gradients():
  """With dropout on: the recomputed forward pass must draw the same masks."""
  cfg = config_lib.tiny(vocab_size=32)
  batch = reverse_batch(np.random.default_rng(0), batch=4, length=6, vocab=32)
  params = train.create_train_state(cfg, jax.random.key(0)).params
  results = []
  for remat in (False, True):
    model = Transformer(cfg.run_as(remat=remat))  # the same params fit both: names unchanged

    def loss(p, model=model):
      logits = model.apply({'params': p}, batch['src'], batch['tgt_in'], deterministic=False,
                           rngs={'dropout': jax.random.key(1)})
      return losses.smoothed_cross_entropy(logits, batch['tgt_out'], batch['weights'], 0.1)[0]
    results.append(jax.jit(jax.value_and_grad(loss))(params))
  (value, grads), (value_r, grads_r) = results
  assert float(value_r) == pytest.approx(float(value), rel=1e-6)
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_r)):
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


def test_bfloat16_trains_and_stays_close_to_float32():
  """Same init, same fixed batch, 60 steps: bf16 compute learns, and tracks float32."""
  cfg = config_lib.tiny(vocab_size=32).replace(dropout_rate=0.0)
  batch = reverse_batch(np.random.default_rng(0), batch=16, length=8, vocab=32)
  curves = {}
  for dtype in (jnp.float32, jnp.bfloat16):
    state = train.create_train_state(cfg.run_as(dtype=dtype), jax.random.key(0))
    step = jax.jit(train.train_step)
    curve = []
    for i in range(60):
      state, metrics = step(state, batch, jax.random.key(i))
      curve.append(float(metrics['loss']))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.params))  # master weights
    curves[dtype] = np.array(curve)
  f32, bf16 = curves[jnp.float32], curves[jnp.bfloat16]
  assert bf16[0] == pytest.approx(f32[0], rel=1e-3)  # the same function, in less precision
  assert bf16[-1] < 0.1 * bf16[0]  # it learns (3.31 -> 0.07 here)
  np.testing.assert_allclose(bf16, f32, rtol=0.15, atol=0.03)  # and follows float32 throughout


def test_bfloat16_keeps_layer_norm_softmax_and_logits_in_float32(tiny_model, tiny_config):
  _, params = tiny_model
  inputs = _packed_inputs()
  cfg = tiny_config.run_as(dtype=jnp.bfloat16)
  logits, state = Transformer(cfg).apply({'params': params}, **inputs,
                                         mutable=['intermediates'])
  hidden = Transformer(cfg).apply({'params': params}, **inputs,
                                 method=Transformer.forward_hidden)
  weights = state['intermediates']['decoder']['layers_0']['self_attention']['attention_weights']
  assert logits.dtype == jnp.float32 and hidden.dtype == jnp.float32  # after the final LN
  assert weights[0].dtype == jnp.bfloat16  # the softmax ran in float32, its output is cast
  np.testing.assert_allclose(np.asarray(weights[0], np.float32).sum(-1), 1.0, atol=1e-2)


# --- configuration -------------------------------------------------------------------------------


def test_fast_path_is_bfloat16_and_fused_attention_on_gpu_only():
  base = config_lib.base()
  gpu = config_lib.fast_path(base, 'gpu')
  assert gpu.execution == config_lib.Execution(dtype=jnp.bfloat16, attention='fused')
  assert gpu == base.replace(execution=gpu.execution)  # nothing else changes
  assert config_lib.fast_path(base, 'cpu') == base and base.execution == config_lib.Execution()
  # Fused attention has no attention dropout and needs d_k == d_v: einsum then.
  assert config_lib.fast_path(base.replace(attention_dropout_rate=0.1),
                              'gpu').execution.attention == 'einsum'
  assert config_lib.fast_path(base.replace(qk_dim=16), 'gpu').execution.attention == 'einsum'
  with pytest.raises(ValueError, match='no attention dropout'):
    base.run_as(attention='fused').replace(attention_dropout_rate=0.1)
  with pytest.raises(ValueError, match="attention must be 'einsum' or 'fused'"):
    base.run_as(attention='flash')


def test_checkpoints_accept_other_execution_fields_only():
  meta = checkpoint.make_meta(config_lib.base(), b'spm')
  fast = config_lib.base().run_as(remat=True, loss_chunk=4096, dtype=jnp.bfloat16)
  checkpoint.check_compatible(meta, 'ckpt', config=fast, spm_model=b'spm')  # no error
  with pytest.raises(checkpoint.IncompatibleCheckpointError, match='d_ff'):
    checkpoint.check_compatible(meta, 'ckpt', config=fast.replace(d_ff=1024), spm_model=b'spm')


def test_configs_round_trip_and_old_flat_checkpoint_configs_load():
  cfg = config_lib.tiny().run_as(dtype=jnp.bfloat16, remat=True)
  fields = config.config_to_dict(cfg)
  assert fields['execution'] == {'dtype': 'bfloat16', 'attention': 'einsum', 'remat': True,
                                 'loss_chunk': 1024}
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


# --- prefetching ----------------------------------------------------------------------------------


class _Counter:
  """Batches {'x': i} for i = 1..n, with a state; raises at `fail_at`."""

  def __init__(self, n, fail_at=None):
    self.i, self.n, self.fail_at = 0, n, fail_at

  def __iter__(self):
    return self

  def __next__(self):
    if self.i == self.fail_at:
      raise ValueError(f'bad batch {self.i}')
    if self.i == self.n:
      raise StopIteration
    self.i += 1
    return {'x': np.full((jax.local_device_count(), 2), self.i, np.int32)}

  def get_state(self):
    return {'row': self.i}


def _prefetch_threads():
  return [t for t in threading.enumerate() if t.name == 'prefetch']


def test_prefetch_keeps_order_and_states_and_stops_its_thread():
  got = [(int(batch['x'][0, 0]), state) for batch, state in parallel.prefetch(_Counter(5))]
  assert got == [(i, {'row': i}) for i in range(1, 6)]
  stream = parallel.prefetch(_Counter(100), size=2)
  batch, _ = next(stream)
  assert isinstance(batch['x'], jax.Array) and batch['x'].shape == (jax.local_device_count(), 2)
  stream.close()
  assert not _prefetch_threads()


def test_prefetch_raises_the_iterators_error_at_its_batch():
  stream = parallel.prefetch(_Counter(10, fail_at=3))
  assert [int(b['x'][0, 0]) for _, (b, _) in zip(range(3), stream)] == [1, 2, 3]
  with pytest.raises(ValueError, match='bad batch 3'):
    next(stream)
  assert not _prefetch_threads()
