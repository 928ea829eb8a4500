"""The benches' bf16 side: both dtypes measured in one case, with what each figure is made of."""

from __future__ import annotations

import pytest


def test_engine_bench_times_fp32_and_bf16_side_by_side():
    from parity.engine.bench import Case, run_case

    r = run_case(Case("tiny 4 x 8 new", "tiny", batch=4, prompt_len=16, new_tokens=8, repeats=1),
                 bandwidth=1e10)
    b = r["bf16"]
    assert b["weight_bytes"] * 2 == r["weight_bytes"]  # the bf16 bound streams half the bytes
    assert b["bandwidth_limit_tokens_per_s"] == pytest.approx(2 * r["bandwidth_limit_tokens_per_s"], rel=1e-3)
    for m in ("aligned", "standard"):
        assert b[f"{m}_tokens_per_s"] > 0
        assert b[f"{m}_over_fp32"] == pytest.approx(b[f"{m}_tokens_per_s"] / r[f"{m}_tokens_per_s"], rel=1e-2)


def test_learner_bench_times_fp32_and_bf16_side_by_side():
    from parity.model.bench import Case, bench_case

    r = bench_case(Case("tiny", 2, 16, 1))
    for kind in ("fwd_bwd", "fwd"):
        f, b = r[kind], r["bf16"][kind]
        for m in ("aligned", "standard"):
            assert b[f"{m}_over_fp32"] == pytest.approx(b[f"{m}_tokens_per_s"] / f[f"{m}_tokens_per_s"], rel=1e-2)
        assert b["ratio"] == pytest.approx(b["aligned_tokens_per_s"] / b["standard_tokens_per_s"], rel=1e-2)


def test_engine_bench_multi_turn_serves_each_turns_prefix_from_the_cache():
    from parity.engine.bench import BLOCK_SIZE, MultiTurnCase, run_multi_turn_case

    case = MultiTurnCase("tiny multi-turn", "tiny", episodes=2, turns=3, observation_len=40,
                         new_tokens=8)
    r = run_multi_turn_case(case)
    # turn k's prompt: turn k-1's prompt + its 8 new tokens + 40 observation tokens; the cache
    # holds the full blocks of what turn k-1 computed, its prompt and all but its last token
    lengths = [40 + k * (40 + 8) for k in range(3)]
    cached = sum((n + 8 - 1) // BLOCK_SIZE * BLOCK_SIZE for n in lengths[:-1])
    assert (r["turns"], r["context_len"]) == (3, 3 * 48)
    for into in (r, r["bf16"]):
        for m in ("aligned", "standard"):
            e = into[m]
            assert e["prompt_tokens"] == 2 * sum(lengths)
            assert e["cached_tokens"] == 2 * cached
            assert e["prefilled_tokens"] == e["prompt_tokens"] - e["cached_tokens"]
            assert 0 < e["turn_ms_p50"] <= e["turn_ms_p90"] <= e["turn_ms_max"]
            assert e["episode_s"] * 1000 == pytest.approx(3 * e["turn_ms_mean"], rel=1e-2)
        assert into["standard_over_aligned_latency"] == pytest.approx(
            into["standard"]["turn_ms_mean"] / into["aligned"]["turn_ms_mean"], rel=1e-2)


def test_vllm_runs_asked_for_eager_compiled_or_both():
    from parity.engine.bench import vllm_modes

    assert vllm_modes(False, False) == []
    assert vllm_modes(True, False) == ["vllm", "vllm_aligned"]
    assert vllm_modes(False, True) == ["vllm_compiled"]
    assert vllm_modes(True, True) == ["vllm", "vllm_aligned", "vllm_compiled"]
