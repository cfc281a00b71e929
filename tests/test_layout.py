"""jaxformer.layout: where each pair lies in a packed row."""

import jax.numpy as jnp
import numpy as np

from jaxformer.layout import FIELDS, Layout, first_fit, packed


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


def test_first_fit_puts_every_pair_once_within_the_width_on_both_sides():
  rng = np.random.default_rng(0)
  lengths = [(int(a), int(b)) for a, b in rng.integers(1, 12, (60, 2))]
  rows = first_fit(lengths, 16)
  assert sorted(sum(rows, [])) == list(range(60))
  assert all(sum(lengths[i][side] for i in row) <= 16 for row in rows for side in (0, 1))
  assert len(rows) < 60 / 1.5  # rows are shared: about 16 / 6 pairs each
  assert first_fit([(16, 16), (1, 1)], 16) == [[0], [1]]  # a full row takes no more


def test_packed_rows_give_each_pair_its_segment_and_positions_from_0():
  src, tgt, where = packed([[([5, 1], [7, 8, 1]), ([6, 1], [9, 1])], [([4, 4, 1], [3, 1])]],
                           size=3, width=6)
  np.testing.assert_array_equal(src, [[5, 1, 6, 1, 0, 0], [4, 4, 1, 0, 0, 0], [0] * 6])
  np.testing.assert_array_equal(tgt, [[7, 8, 1, 9, 1, 0], [3, 1, 0, 0, 0, 0], [0] * 6])
  np.testing.assert_array_equal(where.tgt_segments, [[1, 1, 1, 2, 2, 0], [1, 1, 0, 0, 0, 0],
                                                     [0] * 6])
  np.testing.assert_array_equal(where.tgt_positions[0], [0, 1, 2, 0, 1, 0])
  np.testing.assert_array_equal(where.src_positions[1], [0, 1, 2, 0, 0, 0])
  np.testing.assert_array_equal(where.src_segments[0], [1, 1, 2, 2, 0, 0])
