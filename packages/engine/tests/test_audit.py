"""The audit's scenarios as tests: aligned kernels are bit-identical everywhere; standard are not."""

from __future__ import annotations

import pytest
import torch

from parity.engine.audit import SCENARIOS, Auditor
from parity.engine.shapes import random_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@pytest.fixture(scope="module", params=list(DTYPES))
def auditor(request):
    return Auditor(random_model("test", "aligned", seed=3, dtype=DTYPES[request.param]), seed=1)


@pytest.mark.parametrize("sid", SCENARIOS)
def test_aligned_scenario_is_bit_identical(auditor, sid):
    result = auditor.run_scenario(sid)
    assert result.tokens_compared > 0
    assert result.bitwise_equal, result
    assert result.max_abs_diff == 0.0


def test_bf16_audit_compares_bf16_engine_with_fp32_master_learner():
    auditor = Auditor(random_model("test", "aligned", seed=3, dtype=torch.bfloat16), seed=1)
    assert {p.dtype for p in auditor.model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in auditor.learner.parameters()} == {torch.float32}
    assert auditor.learner.compute_dtype == torch.bfloat16
    assert auditor.engine().runner.pool.k.dtype == torch.bfloat16  # the KV cache is bf16


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_standard_kernels_show_differences(dtype):
    auditor = Auditor(random_model("test", "standard", seed=3, dtype=DTYPES[dtype]), seed=1)
    results = [auditor.run_scenario(s) for s in ("learner", "chunk-7", "batch")]
    assert not all(r.bitwise_equal for r in results)
    assert max(r.max_abs_diff for r in results) > 0


def test_bf16_standard_differences_dwarf_fp32():
    # the point of running bf16: native bf16 kernels differ by far more than fp32 ones do
    worst = {}
    for name, dtype in DTYPES.items():
        auditor = Auditor(random_model("test", "standard", seed=3, dtype=dtype), seed=1)
        worst[name] = max(auditor.run_scenario(s).max_abs_diff for s in ("learner", "batch"))
    assert worst["bfloat16"] > 100 * worst["float32"] > 0, worst
