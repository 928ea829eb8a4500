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
