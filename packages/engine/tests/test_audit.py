"""The audit's scenarios as tests: aligned kernels are bit-identical everywhere; standard are not."""

from __future__ import annotations

import pytest

from parity.engine.audit import SCENARIOS, Auditor
from parity.engine.shapes import random_model


@pytest.fixture(scope="module")
def auditor():
    return Auditor(random_model("test", "aligned", seed=3), seed=1)


@pytest.mark.parametrize("sid", SCENARIOS)
def test_aligned_scenario_is_bit_identical(auditor, sid):
    result = auditor.run_scenario(sid)
    assert result.tokens_compared > 0
    assert result.bitwise_equal, result
    assert result.max_abs_diff == 0.0


def test_standard_kernels_show_differences():
    auditor = Auditor(random_model("test", "standard", seed=3), seed=1)
    results = [auditor.run_scenario(s) for s in ("learner", "chunk-7", "batch")]
    assert not all(r.bitwise_equal for r in results)
    assert max(r.max_abs_diff for r in results) > 0
