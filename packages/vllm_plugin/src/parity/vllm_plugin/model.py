"""parity's `Decoder` as a vLLM model: vLLM schedules, pages, caches prefixes and samples;
parity computes.

Runs inside vLLM's worker process (vLLM's torch, not the workspace's). The forward is
`Decoder.forward` itself, the learner's: only its `KVStore` differs, one that writes each
layer's new keys and values into vLLM's paged CPU cache, with the index arithmetic parity's
own engine uses (`parity.engine.kv_cache.PagedKV`, over `VllmCache`). Attention reads that
cache in place through vLLM's block table, with the fused kernel the learner runs
(`parity.model.fused`, `Decoder.reads_paged`). Where that kernel cannot be built, every
sequence's keys are gathered back instead and, as in parity's engine, the running batch's
keys and values stay dense between decode steps (`DenseBatch`), told apart by vLLM's request
ids in batch order (`request_ids`, attached by the guest server's worker extension). vLLM's
per-layer `Attention` modules are
created only so that vLLM allocates those caches and builds their metadata; their own
forward never runs.

vLLM internals read here (vLLM 0.32, CPU): `get_forward_context().attn_metadata[name]`
(`num_actual_tokens`, `query_start_loc`, `seq_lens`, `block_table`), the cache of layer
`name` bound to its Attention module's `kv_cache`, laid out [blocks, Hkv, block_size, 2·D]
with each (block, head) holding its key rows, then its value rows; and vLLM's per-weight
oneDNN handle, the route of parity's GEMMs where it gives torch's bits (`onednn`).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from typing import Any

import torch

from parity.engine.kv_cache import DenseBatch, PagedKV
from parity.engine.weights import apply_update, check_update
from parity.model import Decoder, DenseKV, ModelConfig, SeqLayout
from parity.model.layout import KV_TILE
from parity.vllm_plugin import PluginError, onednn

logger = logging.getLogger(__name__)

DENSE_KV_BYTES = 2**30  # the running batch's keys and values kept dense (as engine.dense_kv_mib)


class VllmCache:
    """vLLM's paged CPU cache, every layer, as a pool parity's `PagedKV` and `DenseBatch`
    read (`parity.engine.kv_cache.KVPool`'s protocol): `caches[layer]` [blocks, Hkv,
    block_size, 2·D], contiguous, so seen as [blocks·Hkv·2, block_size, D] the key slab of
    (block, head) is slab 2·(block·Hkv + head) and its value slab the next one."""

    stride = 2

    def __init__(self, caches: list[torch.Tensor]) -> None:
        _, kv_heads, self.block_size, two_d = caches[0].shape
        self.caches = caches
        self.heads = torch.arange(kv_heads)
        self.layers, self.head_dim, self.dtype = len(caches), two_d // 2, caches[0].dtype

    def stores(self, layer: int) -> list[tuple[torch.Tensor, int, int]]:
        cache = self.caches[layer]
        return [(cache, 0, 0), (cache, self.block_size, 1)]


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Any:
    """vLLM builds models under its dtype as torch's default; parity's constructor (its
    rotary table) must see float32, as the learner's does."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


class ParityForCausalLM(Decoder):
    """parity's decoder (aligned kernels, the model directory's own config.json read by
    parity) with the interface vLLM's model runner calls. Its parameters are parity's, named
    as in the checkpoint."""

    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        from vllm.model_executor.layers.attention import Attention

        model_config = vllm_config.model_config
        cfg = ModelConfig.from_pretrained(model_config.model)
        dtype = model_config.dtype
        with _default_dtype(torch.float32):
            # the GEMMs' route first: the proof (selfcheck, at construction) and the
            # fingerprint at /health run on it
            logger.info("parity's oneDNN GEMMs: %s", onednn.install(cfg))
            super().__init__(cfg, "aligned", dtype=dtype)
        self.to(dtype)
        block_size = vllm_config.cache_config.block_size
        # read in place (the fused kernel): whole key tiles per block, vLLM's CPU default of
        # 128 among them; gathered: blocks that divide a tile
        if (block_size % KV_TILE) if self.reads_paged else (KV_TILE % block_size):
            fits = "a multiple" if self.reads_paged else "a divisor"
            raise PluginError(f"vLLM's block_size {block_size} does not fit parity's key tile "
                              f"({KV_TILE}): start vLLM with {fits} of {KV_TILE}")
        # one per layer: vLLM allocates its cache and builds its metadata (a plain list, not
        # submodules: no parameters of vLLM's among parity's)
        self.attn_names = [f"{prefix}{'.' if prefix else ''}model.layers.{i}.self_attn.attn"
                           for i in range(cfg.num_hidden_layers)]
        self.vllm_attention = [
            Attention(cfg.num_attention_heads, cfg.dim_per_head, cfg.dim_per_head ** -0.5,
                      num_kv_heads=cfg.kv_heads, cache_config=vllm_config.cache_config,
                      prefix=name)
            for name in self.attn_names
        ]
        # vLLM's request ids in batch order (the worker extension's `parity_attach`); without
        # them every step gathers its keys from the cache
        self.request_ids: Callable[[], list[str]] | None = None
        self.pool: VllmCache | None = None  # vLLM binds the caches after construction
        self.dense: DenseBatch | None = None

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids).to(self.compute_dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,  # type: ignore[override]
                intermediate_tensors: Any = None, inputs_embeds: Any = None) -> torch.Tensor:
        """Final-norm hidden states for vLLM's flat batch: Decoder.forward on the rows vLLM
        scheduled (rows past them, padding, are zeros). Without metadata (vLLM's dummy runs
        that size memory) the rows are one sequence on a dense store."""
        from vllm.forward_context import get_forward_context

        if inputs_embeds is not None:
            raise PluginError("vllm-aligned takes token ids, not input embeddings")
        meta = get_forward_context().attn_metadata
        if isinstance(meta, dict):
            meta = meta.get(self.attn_names[0])
        if meta is None:
            n = input_ids.shape[0]
            layout = SeqLayout.from_lengths([n])
            kv: Any = DenseKV()
        else:
            n = int(meta.num_actual_tokens)
            starts = meta.query_start_loc.tolist()
            layout = SeqLayout(starts[:-1], [b - a for a, b in itertools.pairwise(starts)],
                               positions[:n].long(), meta.seq_lens.tolist())
            kv = self._paged(meta.block_table, layout)
        hidden = super().forward(input_ids[:n].long(), layout, kv)
        if n < input_ids.shape[0]:
            hidden = torch.cat([hidden, hidden.new_zeros(input_ids.shape[0] - n, hidden.shape[1])])
        return hidden

    def _paged(self, block_table: torch.Tensor, layout: SeqLayout) -> PagedKV:
        """The call's KVStore over vLLM's caches, with the dense running batch when the
        request ids are known."""
        if self.pool is None:
            caches = [a.kv_cache[0] if isinstance(a.kv_cache, list) else a.kv_cache
                      for a in self.vllm_attention]
            self.pool = VllmCache(caches)
            self.dense = DenseBatch(self.pool, DENSE_KV_BYTES)
        ids = self.request_ids()[: len(layout.lengths)] if self.request_ids else None
        return PagedKV.build(self.pool, block_table, layout, self.dense if ids else None, ids,
                             in_place=self.reads_paged)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The learner's logits (`Decoder.logits`); vLLM's sampler then takes
        `logits.float() / T` and its log-softmax, op for op `Decoder.logprobs`."""
        return self.logits(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Every tensor of the checkpoint, all or nothing (`parity.engine.weights`); a tied
        head's `lm_head.weight` is the embedding. Returns the parameters loaded."""
        expected = self.state_dict()
        state = {name: t.to(expected[name].dtype) if name in expected else t
                 for name, t in weights}
        check_update(self, state, 0)
        apply_update(self, state)
        if self.dense is not None:  # its keys and values were computed by the old weights
            self.dense.forget()
        return set(expected)

