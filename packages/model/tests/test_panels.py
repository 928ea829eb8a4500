"""parity's fp32 GEMM over column panels: oneDNN's bits where it uses oneDNN's K block, taken
as the route of aligned fp32 GEMMs only after the two are compared on every GEMM shape."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from parity.model import Decoder, SeqLayout, gemm, panels
from parity.model.decoder import DenseKV
from parity.model.selfcheck import route_difference
from parity.model.shapes import TINY

pytestmark = pytest.mark.skipif(not gemm.ONEDNN or panels.c_library() is None,
                                reason="needs oneDNN and a C compiler")


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


def onednn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return gemm.TORCH_ONEDNN.run(x, gemm.TORCH_ONEDNN.prepare(w), b)


@pytest.fixture
def route():
    """The process's route, restored after the test."""
    before = gemm.onednn()
    yield before
    gemm.use_onednn(before)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 150), k=st.integers(1, 1200), tiles=st.integers(1, 5),
       bias=st.booleans(), threads=st.sampled_from([1, 2]), bf16_values=st.booleans(),
       seed=st.integers(0, 2**31))
def test_panels_give_onednns_bits_with_its_k_block(n, k, tiles, bias, threads, bf16_values, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g)
    if bf16_values:  # a bf16 model's weights: held as bf16 panels, widened in the kernel
        w = w.to(torch.bfloat16).float()
    b = torch.randn(n, generator=g) if bias else None
    x = torch.randn(8 * tiles, k, generator=g)
    kb = panels.k_block(gemm.TORCH_ONEDNN, n, k)
    assert kb is not None, f"no K block gives oneDNN's bits at {k} -> {n}"
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    packed = panels.pack(w, kb)
    assert packed.data.dtype == (torch.bfloat16 if bf16_values else torch.float32)
    try:
        got = panels.multiply(x, packed, b)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(bits(got), bits(onednn(x, w, b)))


def test_a_single_output_column_stays_on_onednn():
    # oneDNN computes an N = 1 GEMM in another order (a reduction across k): no block gives it
    assert panels.k_block(gemm.TORCH_ONEDNN, 1, 64) is None
    assert not isinstance(panels.PanelGemm(gemm.TORCH_ONEDNN).prepare(torch.randn(1, 64)),
                          panels.Panels)


def test_a_wrong_k_block_is_seen_and_zeros_infinities_and_nans_keep_onednns_bits():
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(96, 896, generator=g), torch.randn(8, 896, generator=g)
    assert panels.k_block(gemm.TORCH_ONEDNN, 96, 896) == 512  # measured on Sapphire Rapids
    assert not torch.equal(panels.multiply(x, panels.pack(w, 896), None), onednn(x, w, None))
    w[:4], w[4:8] = 0.0, -0.0
    x[0], x[1, 3], x[2, 5], x[3, 7] = -0.0, float("inf"), float("nan"), -float("inf")
    assert torch.equal(bits(panels.multiply(x, panels.pack(w, 512), None)), bits(onednn(x, w, None)))


def test_take_wraps_the_route_for_fp32_only_and_linears_then_run_on_panels(route):
    gemm.use_onednn(gemm.TORCH_ONEDNN)
    assert panels.take(TINY) == ("parity C panels (fp32), torch mkldnn (oneDNN's bits on every "
                                 "GEMM shape of the model)")
    taken = gemm.onednn()
    assert isinstance(taken, panels.PanelGemm) and taken.fallback is gemm.TORCH_ONEDNN
    w = torch.randn(384, 256)
    assert isinstance(taken.prepare(w), panels.Panels)
    assert not isinstance(taken.prepare(w.to(torch.bfloat16)), panels.Panels)
    assert panels.take(TINY) == taken.name  # once per process


def test_take_keeps_onednn_where_the_routes_differ_or_when_told(route, monkeypatch):
    gemm.use_onednn(gemm.TORCH_ONEDNN)
    monkeypatch.setenv("PARITY_GEMM_PANELS", "0")
    assert panels.take(TINY) == "torch mkldnn (PARITY_GEMM_PANELS=0)"
    monkeypatch.delenv("PARITY_GEMM_PANELS")
    # a K block one short of oneDNN's: the comparison names the first shape that differs
    monkeypatch.setattr(panels, "k_block", lambda fallback, n, k: max(k - 1, 1))
    monkeypatch.setattr(panels, "_COMPARED", {})
    assert panels.take(TINY) == (
        "torch mkldnn (parity C panels (fp32), torch mkldnn and torch's oneDNN route differ on "
        "the GEMM 256 -> 128 in torch.float32 at 8 rows, 1 thread(s))")
    assert gemm.onednn() is gemm.TORCH_ONEDNN


def test_a_decoder_gives_the_same_bits_on_panels_and_on_onednn(route):
    torch.manual_seed(0)
    model = Decoder(TINY, "aligned")
    tokens = torch.randint(0, TINY.vocab_size, (37,))
    layout = SeqLayout.from_lengths([20, 17], [0, 0])

    def logprobs() -> torch.Tensor:
        with torch.no_grad():
            return model.logprobs(model(tokens, layout, DenseKV()))

    assert isinstance(gemm.onednn(), panels.PanelGemm)  # the model's proof took them
    on_panels = logprobs()
    gemm.use_onednn(gemm.TORCH_ONEDNN)
    assert torch.equal(on_panels, logprobs())
    assert route_difference(route, TINY, (torch.float32,)) is None


def test_rows_not_a_multiple_of_the_tile_are_padded_with_the_same_bits():
    route = panels.PanelGemm(gemm.TORCH_ONEDNN)
    g = torch.Generator().manual_seed(1)
    w, b = torch.randn(200, 300, generator=g), torch.randn(200, generator=g)
    x = torch.randn(13, 300, generator=g)
    got = route.run(x, route.prepare(w), b)
    assert got.shape == (13, 200)
    assert torch.equal(bits(got), bits(onednn(torch.cat([x, x.new_zeros(3, 300)]), w, b)[:13]))
