"""How attention reads the pool. Without the fused kernel: the running batch's dense K/V,
where decode writes new rows instead of gathering every sequence's keys from the pool at
every step, reading exactly the bits a gather would. With it: the pool in place."""

from __future__ import annotations

import torch

from parity.engine import Engine, EngineConfig, SamplingParams
from parity.engine.kv_cache import DenseBatch, KVPool, PagedKV
from parity.engine.shapes import random_model
from parity.model import SeqLayout, token_logprobs
from parity.model.rope import apply_rotary, rotate_and_store


def _prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 101, (n, length), generator=g).tolist()


def _run(model, prompts, params, dense_kv_mib: int):
    eng = Engine(model, EngineConfig(kv_blocks=256, dense_kv_mib=dense_kv_mib))
    return eng, eng.generate(prompts, params)


def test_decode_gathers_only_at_admission_and_when_it_outgrows_the_capacity(model,
                                                                          gemm_attention):
    prompts = _prompts(8, 16, seed=1)
    params = [SamplingParams(max_new_tokens=120, seed=i) for i in range(8)]
    dense, outs = _run(model, prompts, params, dense_kv_mib=64)
    gathered, ref = _run(model, prompts, params, dense_kv_mib=0)
    # the prefill step (16 keys, read as one tile of 64), then keys 65 and 129 (new tiles)
    assert dense.runner.dense.rebuilds == 3 and dense.num_steps == 120
    assert gathered.runner.dense.rebuilds == 0
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    assert [o.logprobs for o in outs] == [o.logprobs for o in ref]
    learner = token_logprobs(model, torch.tensor([prompts[3] + outs[3].token_ids]), 1.0)[0, 15:]
    assert torch.equal(torch.tensor(outs[3].logprobs, dtype=torch.float32), learner)


def test_a_batch_that_changes_is_gathered_again(model, gemm_attention):
    prompts = _prompts(3, 16, seed=2)
    params = [SamplingParams(max_new_tokens=n, seed=n) for n in (4, 8, 12)]
    dense, outs = _run(model, prompts, params, dense_kv_mib=64)
    _, ref = _run(model, prompts, params, dense_kv_mib=0)
    assert dense.runner.dense.rebuilds == 3  # admission, then after each of two finishes
    assert [o.logprobs for o in outs] == [o.logprobs for o in ref]


def test_claim_serves_rebuilds_or_declines(model):
    cfg = model.config
    pool = KVPool(cfg, num_blocks=8, block_size=16, dtype=torch.float32)
    per_slot = KVPool.bytes_per_token(cfg, torch.float32)  # every layer's K and V of one key
    dense = DenseBatch(pool, max_bytes=2 * 128 * per_slot)
    assert dense.claim([0, 1], [0, 0], 64) is True  # 2 sequences x 64 keys: fits
    assert dense.capacity == 64
    dense.written([16, 16])
    assert dense.claim([0, 1], [16, 16], 64) is False  # continues where it ended: served
    dense.written([17, 17])
    assert dense.claim([0, 1], [17, 16], 64) is True  # a sequence did not continue
    dense.written([18, 17])
    assert dense.claim([1, 0], [17, 18], 64) is True  # another order
    dense.written([18, 19])
    assert dense.claim([1, 0], [18, 19], 128) is True and dense.capacity == 128  # a new tile
    dense.written([19, 20])
    dense.forget()  # new weights
    assert dense.claim([1, 0], [19, 20], 128) is True
    assert dense.claim([0, 1, 2], [0, 0, 0], 128) is None  # 3 x 128 keys exceed the budget
    assert dense.claim([0, 1], [0, 0], 64) is True and dense.rebuilds == 6
    # a step that did not write its last layer leaves nothing to serve
    assert dense.claim([0, 1], [0, 0], 64) is True


def test_the_fused_kernel_reads_the_pool_in_place(model):
    prompts = _prompts(4, 70, seed=3)
    params = [SamplingParams(max_new_tokens=70, seed=i) for i in range(4)]
    eng, outs = _run(model, prompts, params, dense_kv_mib=64)
    assert model.reads_paged and eng.runner.dense.rebuilds == 0
    for i in range(4):
        learner = token_logprobs(model, torch.tensor([prompts[i] + outs[i].token_ids]), 1.0)
        assert torch.equal(torch.tensor(outs[i].logprobs, dtype=torch.float32),
                           learner[0, 69:])


def test_blocks_larger_than_a_key_tile_are_read_whole(model):
    """vLLM's CPU cache uses blocks of 128 keys, two of the kernel's key tiles: a call whose
    padded length (192 keys here) ends inside a block still reads that block's keys, and the
    hidden states are the bits of 64-key blocks (failed when the table was cut to L // 128
    blocks: the first sequence's second block had no entry)."""
    tokens = torch.tensor(_prompts(1, 140, seed=4)[0] + _prompts(1, 100, seed=5)[0])
    hidden = {}
    for bs, tables in ((64, [[1, 2, 3], [4, 5]]), (128, [[1, 2], [3]])):
        pool = KVPool(model.config, num_blocks=6, block_size=bs, dtype=torch.float32)
        layout = SeqLayout.from_lengths([140, 100])
        kv = PagedKV.build(pool, tables, layout, in_place=True)
        with torch.no_grad():
            hidden[bs] = model(tokens, layout, kv)
    assert model.reads_paged and layout.max_kv_len == 192
    assert torch.equal(hidden[64], hidden[128])


def test_rope_and_the_pool_writes_in_one_call_give_their_bits() -> None:
    """Where RoPE is a C call (head dim 64, the embedded model's), the paged store rotates
    the queries and writes the rotated keys and the values into the pool in one C call: the
    queries and the pool are those of `apply_rotary` then `update`, and the engine's logprobs
    the learner's (both failed when the C call scaled the values by 1 + 1e-7)."""
    model = random_model("tiny", "aligned", seed=0)
    cfg = model.config
    hq, hkv, d = cfg.num_attention_heads, cfg.kv_heads, cfg.dim_per_head
    layout = SeqLayout.from_lengths([3, 5], [70, 0])
    n = layout.positions.shape[0]
    qkv = torch.randn(n, (hq + 2 * hkv) * d, generator=torch.Generator().manual_seed(0))
    q, k, v = (t.view(n, -1, d) for t in qkv.split([hq * d, hkv * d, hkv * d], -1))
    cos, sin = model.rope.lookup(layout.positions)
    got, want = (KVPool(cfg, num_blocks=5, block_size=64, dtype=torch.float32) for _ in range(2))
    tables = [[3, 1], [2]]
    kv = PagedKV.build(got, tables, layout, in_place=True)
    assert rotate_and_store(q, k, v, cos, sin, got.k[1].view(-1, d), got.v[1].view(-1, d),
                            kv.slots) is not None  # the one-call path serves this layout
    q_rot, _, _ = kv.rotate_and_update(0, q, k, v, cos, sin, layout)
    PagedKV.build(want, tables, layout, in_place=True).update(
        0, apply_rotary(k, cos, sin), v, layout)
    assert torch.equal(q_rot, apply_rotary(q, cos, sin))
    assert torch.equal(got.k[0], want.k[0]) and torch.equal(got.v[0], want.v[0])

    prompts = _prompts(4, 20, seed=6)
    params = [SamplingParams(max_new_tokens=12, seed=i) for i in range(4)]
    _, outs = _run(model, prompts, params, dense_kv_mib=64)
    for p, out in zip(prompts, outs, strict=True):
        learner = token_logprobs(model, torch.tensor([p + out.token_ids]), 1.0)[0, 19:]
        assert torch.equal(torch.tensor(out.logprobs, dtype=torch.float32), learner)
