"""The benches' bf16 side: both dtypes measured in one case, with what each figure is made of."""

from __future__ import annotations

import pytest


def test_engine_bench_times_fp32_and_bf16_side_by_side():
    from parity.engine.bench import Case, run_case

    r = run_case(Case("tiny 4 x 8 new", "tiny", batch=4, prompt_len=16, new_tokens=8, repeats=2),
                 bandwidth=1e10)
    b = r["bf16"]
    assert r["rounds"] == 2
    assert b["weight_bytes"] * 2 == r["weight_bytes"]  # the bf16 bound streams half the bytes
    assert b["bandwidth_limit_tokens_per_s"] == pytest.approx(2 * r["bandwidth_limit_tokens_per_s"], rel=1e-3)
    for into in (r, b):
        a, s = into["aligned_tokens_per_s"], into["standard_tokens_per_s"]
        assert len(a["rounds"]) == len(s["rounds"]) == 2 and min(a["rounds"]) > 0
        # the rounds are reported to 0.1 tokens/s, so their ratio agrees to that rounding only
        rounds = [x / y for x, y in zip(a["rounds"], s["rounds"], strict=True)]
        assert into["ratio"]["rounds"] == pytest.approx(rounds, rel=1e-2)
    for m in ("aligned", "standard"):
        assert len(b[f"{m}_over_fp32"]["rounds"]) == 2


def test_a_ratio_whose_rounds_disagree_is_no_result():
    from parity.engine.bench import figure, ratio

    assert ratio([100.0, 110.0, 90.0], [100.0, 100.0, 100.0]) == {
        "value": None, "rounds": [1.0, 1.1, 0.9], "spread": 0.2}
    assert ratio([100.0, 105.0, 95.0], [100.0, 100.0, 100.0]) == {
        "value": 1.0, "rounds": [1.0, 1.05, 0.95], "spread": 0.1}
    assert figure([287.0, 4951.0, 3621.0]) == {
        "median": 3621.0, "rounds": [287.0, 4951.0, 3621.0], "spread": 1.288}


def test_learner_bench_times_fp32_and_bf16_side_by_side():
    from parity.model.bench import Case, bench_case

    r = bench_case(Case("tiny", 2, 16, 1))
    for kind in ("fwd_bwd", "fwd"):
        f, b = r[kind], r["bf16"][kind]
        for m in ("aligned", "standard"):
            assert b[f"{m}_over_fp32"] == pytest.approx(b[f"{m}_tokens_per_s"] / f[f"{m}_tokens_per_s"], rel=1e-2)
        assert b["ratio"] == pytest.approx(b["aligned_tokens_per_s"] / b["standard_tokens_per_s"], rel=1e-2)


def test_engine_bench_multi_turn_serves_each_turns_prefix_from_the_cache():
    from parity.engine.bench import run_multi_turn_case
    from parity.engine.multi_turn import BLOCK_SIZE, MultiTurnCase

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
        ms = {m: into[m]["turn_ms_mean_rounds"] for m in ("aligned", "standard")}
        assert into["standard_over_aligned_latency"]["rounds"] == pytest.approx(
            [s / a for s, a in zip(ms["standard"], ms["aligned"], strict=True)], abs=2e-3)


def test_vllm_runs_asked_for_eager_compiled_or_both():
    from parity.engine.bench import vllm_modes

    assert vllm_modes(False, False) == []
    assert vllm_modes(True, False) == ["vllm", "vllm_aligned"]
    assert vllm_modes(False, True) == ["vllm_compiled"]
    assert vllm_modes(True, True) == ["vllm", "vllm_aligned", "vllm_compiled"]


def test_an_unknown_case_is_an_error_naming_the_cases():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "from parity.trainer.cli import main; main()",
                          "bench", "engine", "--case", "no such case"],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.startswith("error: --case 'no such case' matches no case; the cases: tiny")
