"""Block accounting and the prefix cache, as a unit and under random operation sequences."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from parity.engine.block_manager import BlockManager


def test_allocate_release_and_lookup():
    bm = BlockManager(4, 2)
    a = bm.allocate(2)
    assert a == [0, 1] and bm.num_free == 2
    bm.register(a[0], 11, [5, 6])
    bm.register(a[1], 12, [7, 8])
    bm.release(a)
    assert bm.num_free == 4
    # freed but still cached: found by hash + tokens, and a token mismatch is a miss
    assert bm.lookup([11, 12], [5, 6, 7, 8]) == [0, 1]
    assert bm.lookup([11, 12], [5, 6, 7, 9]) == [0]
    bm.acquire([0])
    assert bm.ref[0] == 1 and bm.num_free == 3


def test_reallocation_evicts_least_recently_freed_first():
    bm = BlockManager(2, 2)
    a, b = bm.allocate(2)
    bm.register(a, 1, [1, 1])
    bm.register(b, 2, [2, 2])
    bm.release([a])
    bm.release([b])
    (c,) = bm.allocate(1)
    assert c == a
    assert bm.lookup([1], [1, 1]) == []
    assert bm.lookup([2], [2, 2]) == [b]


def test_clear_cache_forgets_everything():
    bm = BlockManager(2, 2)
    (a,) = bm.allocate(1)
    bm.register(a, 7, [3, 4])
    bm.clear_cache()
    assert bm.lookup([7], [3, 4]) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["alloc", "release", "hit"]), st.integers(0, 5)), max_size=40))
def test_reference_counts_stay_consistent(ops):
    bm = BlockManager(8, 1)
    held: list[list[int]] = []
    for op, k in ops:
        if op == "alloc" and bm.num_free >= k:
            blocks = bm.allocate(k)
            for b in blocks:
                bm.register(b, 1000 + b * 7 + k, [b])
            held.append(blocks)
        elif op == "release" and held:
            bm.release(held.pop(k % len(held)))
        elif op == "hit" and bm.cached:
            h, b = next(iter(bm.cached.items()))
            assert bm.lookup([h], [bm.block_key[b][1][0]]) == [b]
            bm.acquire([b])
            held.append([b])
        refs = [0] * 8
        for blocks in held:
            for b in blocks:
                refs[b] += 1
        assert refs == bm.ref
        assert set(bm.free) == {b for b in range(8) if refs[b] == 0}
