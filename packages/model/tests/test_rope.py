"""The rotary table: a position's cos/sin rows never depend on how the table grew."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from parity.model.rope import _CHUNK, RotaryTable, apply_rotary, inverse_frequencies
from parity.model.shapes import SHAPES

CFG = SHAPES["tiny"]


def chunk_rows(start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk of the table computed by hand, as every chunk is: cos, sin."""
    freqs = torch.outer(torch.arange(start, start + _CHUNK, dtype=torch.float32),
                        inverse_frequencies(CFG))
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 3000), min_size=1, max_size=8))
def test_rows_do_not_depend_on_how_the_table_grew(reach: list[int]) -> None:
    table = RotaryTable(CFG)
    for n in reach:  # grown by lookups of positions up to n - 1, in any order
        table.lookup(torch.tensor([n - 1]))
    top = max(reach)
    positions = torch.arange(top)
    cos, sin = table.lookup(positions)
    at_once = RotaryTable(CFG)
    cos1, sin1 = at_once.lookup(positions)
    assert torch.equal(cos, cos1) and torch.equal(sin, sin1)
    c, s = chunk_rows(_CHUNK * ((top - 1) // _CHUNK))
    last = (top - 1) % _CHUNK
    assert torch.equal(cos[-1, 0], c[last]) and torch.equal(sin[-1, 0], s[last])
    assert table.rows == -(-top // _CHUNK) * _CHUNK


def test_rotation_and_its_gradient_are_the_formulas():
    # whichever path serves it here (one C call in fp32, or torch's ops): the rotate-half
    # formula to fp32 rounding, and the formula's own gradient (the rotation's transpose)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(37, 4, 64, generator=g, requires_grad=True)
    cos, sin = RotaryTable(CFG).lookup(torch.arange(37) * 7)
    y = apply_rotary(x, cos, sin)
    half = torch.cat([-x[..., 32:], x[..., :32]], dim=-1)
    ref = x * cos + half * sin
    assert (y - ref).abs().max() <= 4 * torch.finfo(torch.float32).eps * ref.abs().max()
    grad = torch.randn(y.shape, generator=g)
    (got,) = torch.autograd.grad(y, x, grad)
    (want,) = torch.autograd.grad(ref, x, grad)
    assert torch.equal(got, want)
    bf = apply_rotary(x.detach().bfloat16(), cos, sin)  # bf16: the fp32 math, rounded once
    assert bf.dtype == torch.bfloat16
    assert torch.equal(bf, apply_rotary(x.detach().bfloat16().float(), cos, sin).bfloat16())


def test_a_column_slice_rotates_as_its_copy():
    """Queries and keys are column slices of the stacked QKV output, rows apart: read in
    place (no copy), they give the bits of their contiguous copies (failed when the C call
    took rows to be heads × d apart)."""
    g = torch.Generator().manual_seed(1)
    qkv = torch.randn(9, (4 + 2 + 2) * 64, generator=g)
    cos, sin = RotaryTable(CFG).lookup(torch.arange(9) * 3)
    q, k = qkv[:, :256].view(9, 4, 64), qkv[:, 256:384].view(9, 2, 64)
    assert not q.is_contiguous() and not k.is_contiguous()
    for x in (q, k):
        assert torch.equal(apply_rotary(x, cos, sin), apply_rotary(x.contiguous(), cos, sin))
