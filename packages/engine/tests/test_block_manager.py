"""Block accounting and the prefix cache, as a unit and under random operation sequences."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from parity.engine import SamplingParams
from parity.engine.block_manager import BlockManager
from parity.engine.sequence import Sequence


def _seq(tokens: list[int], computed: int = 0, table: list[int] | None = None) -> Sequence:
    seq = Sequence(0, tokens, SamplingParams(), 0, 1000)
    seq.num_computed, seq.block_table = computed, table or []
    return seq


def test_allocate_release_and_lookup():
    bm = BlockManager(4, 2)
    a = bm.allocate(2)
    assert a == [0, 1] and bm.num_free == 2
    bm.register(_seq([5, 6, 7, 8], computed=4, table=a), 0)
    bm.release(a)
    assert bm.num_free == 4
    # freed but still cached: found by hash + tokens (short of the last token's block), and a
    # token mismatch is a miss
    assert bm.lookup(_seq([5, 6, 7, 8, 1]), set()) == [0, 1]
    assert bm.lookup(_seq([5, 6, 7, 8]), set()) == [0]
    assert bm.lookup(_seq([5, 6, 7, 9, 1]), set()) == [0]
    bm.acquire([0])
    assert bm.ref[0] == 1 and bm.num_free == 3


def test_hashes_chain_the_prefix():
    bm = BlockManager(4, 2)
    a, b = _seq([1, 2, 3, 4]), _seq([9, 9, 3, 4])
    assert bm.hashes(a, 2)[0] != bm.hashes(b, 2)[0]
    assert bm.hashes(a, 2)[1] != bm.hashes(b, 2)[1]  # same tokens, different parents
    assert bm.hashes(a, 1) == bm.hashes(_seq([1, 2, 7, 7]), 1)


def test_lookup_defers_to_a_block_being_computed():
    bm = BlockManager(4, 2)
    running = _seq([5, 6, 7, 8, 9], computed=2, table=bm.allocate(3))
    pending = set(bm.to_compute(running))
    assert len(pending) == 1  # its second block; the first already has K/V
    bm.register(_seq([5, 6], computed=2, table=running.block_table[:1]), 0)
    assert bm.lookup(_seq([5, 6, 7, 8, 1]), pending) is None
    assert bm.lookup(_seq([5, 6, 0, 0, 1]), pending) == [running.block_table[0]]


def test_prefix_caching_off_finds_and_registers_nothing():
    bm = BlockManager(4, 2, prefix_caching=False)
    bm.register(_seq([5, 6], computed=2, table=bm.allocate(1)), 0)
    assert not bm.cached and bm.to_compute(_seq([5, 6, 7])) == []
    assert bm.lookup(_seq([5, 6, 7]), set()) == []


def test_reallocation_evicts_least_recently_freed_first():
    bm = BlockManager(2, 2)
    a, b = bm.allocate(2)
    bm.register(_seq([1, 1], computed=2, table=[a]), 0)
    bm.register(_seq([2, 2], computed=2, table=[b]), 0)
    bm.release([a])
    bm.release([b])
    (c,) = bm.allocate(1)
    assert c == a
    assert bm.lookup(_seq([1, 1, 0]), set()) == []
    assert bm.lookup(_seq([2, 2, 0]), set()) == [b]


def test_clear_cache_forgets_everything():
    bm = BlockManager(2, 2)
    (a,) = bm.allocate(1)
    bm.register(_seq([3, 4], computed=2, table=[a]), 0)
    bm.clear_cache()
    assert bm.lookup(_seq([3, 4, 0]), set()) == []


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["alloc", "release", "hit"]), st.integers(0, 5)), max_size=40
    )
)
def test_reference_counts_stay_consistent(ops):
    bm = BlockManager(8, 1)
    held: list[list[int]] = []
    for op, k in ops:
        if op == "alloc" and bm.num_free >= k:
            blocks = bm.allocate(k)
            for b in blocks:
                bm.register(_seq([b * 7 + k], computed=1, table=[b]), 0)
            held.append(blocks)
        elif op == "release" and held:
            bm.release(held.pop(k % len(held)))
        elif op == "hit" and bm.cached:
            b = next(iter(bm.cached.values()))
            assert bm.lookup(_seq([*bm.block_key[b][1], 0]), set()) == [b]
            bm.acquire([b])
            held.append([b])
        refs = [0] * 8
        for blocks in held:
            for b in blocks:
                refs[b] += 1
        assert refs == bm.ref
        assert set(bm.free) == {b for b in range(8) if refs[b] == 0}
