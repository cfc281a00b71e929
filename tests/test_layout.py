"""jaxformer.layout: where each pair lies in a packed row."""

import jax.numpy as jnp
import numpy as np

from jaxformer.layout import FIELDS, Layout


def test_without_a_layout_a_row_is_one_sentence_from_position_0():
  src = jnp.array([[5, 6, 1, 0], [7, 1, 0, 0]])
  segments, positions = Layout().source(src)
  np.testing.assert_array_equal(segments, [[1, 1, 1, 0], [1, 1, 0, 0]])
  np.testing.assert_array_equal(positions, [[0, 1, 2, 3], [0, 1, 2, 3]])
  tgt_segments, _ = Layout().target(jnp.array([[0, 5, 6, 0]]))  # token 0 starts decoding
  np.testing.assert_array_equal(tgt_segments, [[1, 1, 1, 1]])


def test_a_packed_batch_carries_its_layout():
  batch = {'src': jnp.zeros((1, 4)), 'src_segments': jnp.array([[1, 1, 2, 0]]),
           'src_positions': jnp.array([[0, 1, 0, 0]])}
  layout = Layout.of(batch)
  assert layout.tgt_segments is None and set(FIELDS) == {
      'src_segments', 'src_positions', 'tgt_segments', 'tgt_positions'}
  segments, positions = layout.source(batch['src'])
  np.testing.assert_array_equal(segments, [[1, 1, 2, 0]])
  np.testing.assert_array_equal(positions, [[0, 1, 0, 0]])
