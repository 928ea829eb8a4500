"""The bf16 C row-wise ops give the bits of their definition: the fp32 op on the bf16 values,
rounded to bf16 once (`parity.model.kernels`), which torch's conversions around the fp32 call
also give. Compared bit for bit (int16 views: NaNs too), on values that stress the rounding:
ties, subnormals, infinities and NaNs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parity.model import rowwise
from parity.model.kernels import in_fp32
from parity.model.rope import RotaryTable, apply_rotary, rotate_and_store
from parity.model.shapes import SHAPES

pytestmark = pytest.mark.skipif(rowwise.c_library() is None, reason="no C compiler here")
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SPECIAL = [0.0, -0.0, 1e-40, -3e-39, 1.1754942e-38, 3.3895e38, float("inf"), float("-inf"),
           float("nan"), 1.00390625, 1.01171875]  # subnormals, the largest bf16, ties


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def _values(seed: int, rows: int, width: int, special: bool) -> torch.Tensor:
    """Random bf16 values of a few magnitudes, with special values strewn in if asked."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=g) * 10.0 ** torch.randint(-3, 4, (rows, 1), generator=g)
    if special:
        at = torch.randint(0, rows * width, (len(SPECIAL),), generator=g)
        x.view(-1)[at] = torch.tensor(SPECIAL)
    return x.bfloat16()


@SETTINGS
@given(seed=st.integers(0, 2**16), rows=st.integers(1, 40), width=st.sampled_from([16, 64, 256, 896]),
       special=st.booleans())
def test_rms_norm_in_bf16_is_the_fp32_op_rounded_once(seed, rows, width, special):
    x = _values(seed, rows, width, special)
    w = _values(seed + 1, 1, width, False)[0]
    got = rowwise.rms_norm_bf16(x, w, 1e-6)
    assert got is not None and got.dtype == torch.bfloat16
    assert torch.equal(_bits(got), _bits(in_fp32(rowwise.rms_norm_aligned)(x, w, 1e-6)))


@SETTINGS
@given(seed=st.integers(0, 2**16), rows=st.integers(1, 40), width=st.sampled_from([16, 64, 768, 4864]),
       special=st.booleans())
def test_silu_mul_in_bf16_is_the_fp32_op_rounded_once(seed, rows, width, special):
    both = _values(seed, rows, 2 * width, special)  # gate and up: column slices of one output
    gate, up = both[:, :width], both[:, width:]
    got = rowwise.silu_mul_bf16(gate, up)
    assert got is not None
    assert torch.equal(_bits(got), _bits(in_fp32(rowwise.silu_mul_aligned)(gate, up)))


@SETTINGS
@given(seed=st.integers(0, 2**16), rows=st.integers(1, 20), special=st.booleans())
def test_rope_and_the_paged_store_in_bf16_are_apply_rotary_and_copies(seed, rows, special):
    hq, hkv, d = 4, 2, 64
    heads = _values(seed, rows, (hq + 2 * hkv) * d, special).view(rows, hq + 2 * hkv, d)
    q, k, v = heads[:, :hq], heads[:, hq:hq + hkv], heads[:, hq + hkv:]  # rows apart
    cos, sin = RotaryTable(SHAPES["tiny"]).lookup(torch.arange(rows) * 7 + seed % 100)
    k_rows = torch.zeros(3 * rows * hkv, d, dtype=torch.bfloat16)
    v_rows = torch.zeros_like(k_rows)
    slots = torch.randperm(3 * rows * hkv, generator=torch.Generator().manual_seed(seed))[:rows * hkv]
    q_rot = rotate_and_store(q, k, v, cos, sin, k_rows, v_rows, slots)
    assert q_rot is not None and q_rot.dtype == torch.bfloat16
    assert torch.equal(_bits(q_rot), _bits(apply_rotary(q, cos, sin)))
    assert torch.equal(_bits(k_rows[slots]), _bits(apply_rotary(k, cos, sin).reshape(-1, d)))
    assert torch.equal(_bits(v_rows[slots]), _bits(v.reshape(-1, d)))


def test_with_gradients_the_bf16_ops_leave_it_to_the_differentiable_path():
    x = torch.randn(4, 64, dtype=torch.bfloat16, requires_grad=True)
    assert rowwise.rms_norm_bf16(x, torch.ones(64, dtype=torch.bfloat16), 1e-6) is None
    assert rowwise.silu_mul_bf16(x, x) is None
    assert rowwise.rms_norm_bf16(torch.randn(4, 40).bfloat16(), torch.ones(40), 1e-6) is None


def test_the_start_up_proof_refuses_a_bf16_rounding_other_than_torchs(monkeypatch):
    from parity.model import selfcheck

    assert selfcheck.verify(SHAPES["tiny"], cache=False).ok
    monkeypatch.setattr(rowwise, "rms_norm_bf16", _truncating(rowwise.rms_norm_bf16))
    verdict = selfcheck.verify(SHAPES["tiny"], cache=False)
    assert not verdict.ok and "bf16 rms_norm width 256 (C vs torch's rounding)" in verdict.failure


def _truncating(op):
    def run(x, w, eps):  # the C call with each output's last bit cleared
        y = op(x, w, eps)
        return (y.view(torch.int16) & ~1).view(torch.bfloat16)
    return run
