"""The attention cost rule: what `attention_scores` counts is what the groups attention walks
materialise, and `rows_within` gives the most rows that fit a budget by that count."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from parity.model.layout import ATTENTION_ROW_MULTIPLE, SeqLayout, attention_scores, rows_within

HEADS = [(1, 1), (4, 2), (12, 2), (8, 8)]


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 300), st.integers(0, 700)), min_size=1, max_size=5),
    st.sampled_from(HEADS),
)
def test_scores_count_the_score_matrices_of_the_groups(seqs, heads):
    h, hkv = heads
    lengths, offsets = [n for n, _ in seqs], [o for _, o in seqs]
    layout = SeqLayout.from_lengths(lengths, offsets)
    walked = sum(
        grp.rows.shape[0] * hkv * grp.matrix_rows * grp.kv_len for grp in layout.groups(h // hkv)
    )
    assert layout.attention_scores(h, hkv) == walked
    assert attention_scores(lengths, layout.kv_lens, h, hkv) == walked


def test_scores_of_a_decode_row_and_a_prefill_chunk():
    # one decode row at 100 keys: 1 row x 2 query heads per KV head, padded to 8 rows; 128 keys
    assert attention_scores([1], [100], 4, 2) == 2 * 8 * 128
    # 70 rows: a piece of 64 (keys 64+30) and one of 6 rows padded to 8 (keys 100)
    assert attention_scores([70], [100], 4, 2) == 2 * 128 * 128 + 2 * 16 * 128


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 2**22), st.integers(0, 5000), st.integers(1, 600), st.sampled_from(HEADS))
def test_rows_within_is_the_most_that_fit(budget, offset, limit, heads):
    h, hkv = heads
    n = rows_within(budget, offset, limit, h, hkv)
    assert min(limit, ATTENTION_ROW_MULTIPLE) <= n <= limit
    if n > ATTENTION_ROW_MULTIPLE:
        assert attention_scores([n], [offset + n], h, hkv) <= budget
    if n < limit:
        assert attention_scores([n + 1], [offset + n + 1], h, hkv) > budget
