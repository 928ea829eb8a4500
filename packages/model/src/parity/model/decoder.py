"""The decoder (Qwen2 / Qwen3 / Llama), with Hugging Face parameter names.

One forward serves every caller: the learner's training forward, the engine's prefill,
chunked prefill, prefix-cache continuation and decode. Callers differ only in the
`KVStore` that turns each layer's new keys/values into the per-sequence key/value
tensors attention reads.

Each layer is a module called once per forward (`Layer.forward`), on all of the forward's
rows; a forward may hold several calls (`Call`: the chunks of the learner's chunked
forward), which every layer computes in order. A sharded learner's FSDP units are the
layers: each gathers its weights once per forward and once per backward, whatever the
number of calls, so ranks with different chunks still meet in the same collectives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from parity.model import fused
from parity.model.config import ModelConfig
from parity.model.devices import get_kernels, require_alignment
from parity.model.kernels import KernelMode, Kernels
from parity.model.layout import SeqLayout
from parity.model.rope import RotaryTable, apply_rotary


class KVStore(Protocol):
    """Where a forward call's keys and values live.

    `update(layer, k, v, layout)` receives the new rows' keys/values [N, Hkv, D] (after
    RoPE), stores them (rounded to the store's dtype), and returns every sequence's keys
    and values from absolute position 0 as [S, Hkv, L, D] with L = layout.max_kv_len;
    positions at or past a sequence's kv_len must hold finite values (zeros are fine).
    A paged store may instead return them as `PagedKeys`, left in its pool, when
    `Decoder.reads_paged` says attention reads them in place.

    A store may also define `rotate_and_update(layer, q, k, v, cos, sin, layout)` ->
    (rotated queries, keys, values), taking keys before RoPE: `apply_rotary` on q and k,
    then `update`, with their bits, in fewer calls (the engine's paged store: one C call
    per layer where attention reads the pool in place).
    """

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, layout: SeqLayout
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


class DenseKV:
    """A KVStore for the learner: keys/values of whole sequences held as dense tensors.

    Differentiable: gradients flow from attention back to each layer's k/v projections.
    Successive calls continue the sequences (chunked training forward).
    """

    def __init__(self) -> None:
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}

    def update(self, layer, k, v, layout):
        seq, pos = layout.seq_of_row, layout.positions
        shape = (len(layout.lengths), layout.max_kv_len, k.shape[1], k.shape[2])
        out = []
        for store, new in ((self.k, k), (self.v, v)):
            old = store.get(layer)
            base = new.new_zeros(shape)
            if old is not None:
                base = torch.cat([old, base[:, old.shape[1] :]], dim=1) if old.shape[1] < shape[1] else old
            full = base.index_put((seq, pos), new)
            store[layer] = full
            out.append(full.transpose(1, 2))
        return out[0], out[1]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps


@dataclass(frozen=True)
class Call:
    """One model call inside a forward: its `rows` of the forward's flat rows, how they split
    into sequences (`layout`), the store their keys and values go to, and their rotary
    tables (`cos`, `sin`: [rows, D])."""

    rows: slice
    layout: SeqLayout
    kv: KVStore
    cos: torch.Tensor
    sin: torch.Tensor


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d, hq, hkv = cfg.dim_per_head, cfg.num_attention_heads, cfg.kv_heads
        self.q_proj = nn.Linear(cfg.hidden_size, hq * d, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, hkv * d, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, hkv * d, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(hq * d, cfg.hidden_size, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm
        self.heads, self.kv_heads, self.head_dim = hq, hkv, d
        self.scale = d**-0.5

    def compute(self, k: Kernels, x: torch.Tensor, layer: int, c: Call) -> torch.Tensor:
        n = x.shape[0]
        q, key, v = k.linears(x, [(p.weight, p.bias) for p in (self.q_proj, self.k_proj, self.v_proj)])
        q = q.view(n, self.heads, self.head_dim)
        key = key.view(n, self.kv_heads, self.head_dim)
        v = v.view(n, self.kv_heads, self.head_dim)
        if self.qk_norm:
            q = k.rms_norm(q, self.q_norm.weight, self.q_norm.eps)
            key = k.rms_norm(key, self.k_norm.weight, self.k_norm.eps)
        rotate = getattr(c.kv, "rotate_and_update", None)
        if rotate is not None:
            q, keys, values = rotate(layer, q, key, v, c.cos, c.sin, c.layout)
        else:
            q, key = apply_rotary(q, c.cos, c.sin), apply_rotary(key, c.cos, c.sin)
            keys, values = c.kv.update(layer, key, v, c.layout)
        o = k.attention(q, keys, values, c.layout, self.scale)
        return k.linear(o.reshape(n, -1), self.o_proj.weight, None)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def compute(self, k: Kernels, x: torch.Tensor) -> torch.Tensor:
        gate, up = k.linears(x, [(self.gate_proj.weight, None), (self.up_proj.weight, None)])
        return k.linear(k.silu_mul(gate, up), self.down_proj.weight, None)


class Layer(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.index = index

    def forward(self, h: torch.Tensor, kernels: Kernels, calls: Sequence[Call]) -> torch.Tensor:
        """The residual stream after this layer, for the rows of every call in `calls`, each
        call computed after the ones before it (a later chunk attends to an earlier one's
        keys)."""
        if len(calls) == 1:
            return self._call(h, kernels, calls[0])
        return torch.cat([self._call(h[c.rows], kernels, c) for c in calls])

    def _call(self, h: torch.Tensor, k: Kernels, c: Call) -> torch.Tensor:
        ln1, ln2 = self.input_layernorm, self.post_attention_layernorm
        h = h + self.self_attn.compute(k, k.rms_norm(h, ln1.weight, ln1.eps), self.index, c)
        return h + self.mlp.compute(k, k.rms_norm(h, ln2.weight, ln2.eps))


class Body(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Layer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Decoder(nn.Module):
    """A causal decoder whose reducing ops come from `kernels` ("aligned" or "standard").

    Choosing aligned kernels first proves them on this machine for the model's shapes
    (`parity.model.selfcheck`, cached per machine) and raises AlignmentError if they are not
    row-invariant here.

    `dtype` is what it computes in: activations and keys/values are `dtype` between ops, and
    the weights are used rounded to it whatever dtype the parameters are held in (fp32
    masters in the learner, `dtype` itself in the engine)."""

    def __init__(self, cfg: ModelConfig, kernels: KernelMode | str = "aligned",
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.config = cfg
        self.compute_dtype = dtype
        self.model = Body(cfg)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rope = RotaryTable(cfg)
        self.set_kernels(kernels)

    def cast(self, dtype: torch.dtype) -> Decoder:
        """Compute in `dtype` and hold the parameters in it (the engine's form of a model)."""
        self.compute_dtype = dtype
        return self.to(dtype)

    def set_kernels(self, mode: KernelMode | str) -> None:
        kernels = get_kernels(mode)
        if kernels.mode == "aligned":
            require_alignment(self.config)
        self.kernels: Kernels = kernels

    @property
    def reads_paged(self) -> bool:
        """Whether attention reads a paged KV pool in place (`PagedKeys`): aligned kernels
        served by the fused kernel. Otherwise stores hand it dense keys."""
        return self.kernels.mode == "aligned" and fused.available()

    @property
    def lm_head_weight(self) -> torch.Tensor:
        if self.config.tie_word_embeddings:
            return self.model.embed_tokens.weight
        return self.lm_head.weight

    def forward(self, tokens: torch.Tensor, layout: SeqLayout | None = None,
                kv: KVStore | None = None, *,
                calls: Sequence[tuple[slice, SeqLayout, KVStore]] | None = None) -> torch.Tensor:
        """Final-norm hidden states [N, hidden] for the flat token rows `tokens` [N]: one
        call (`layout`, `kv`) over all rows, or `calls`, each (rows, layout, kv) computed in
        order by every layer (the chunks of a chunked forward, rows back to back)."""
        if calls is None:
            if layout is None or kv is None:
                raise TypeError("Decoder.forward needs a layout and a KVStore, or calls")
            calls = [(slice(0, tokens.shape[0]), layout, kv)]
        plan = [Call(r, lay, store, *self.rope.lookup(lay.positions)) for r, lay, store in calls]
        h = self.model.embed_tokens(tokens).to(self.compute_dtype)
        for layer in self.model.layers:
            h = layer(h, self.kernels, plan)
        norm = self.model.norm
        return self.kernels.rms_norm(h, norm.weight, norm.eps)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.kernels.linear(hidden, self.lm_head_weight, None)

    def logprobs(self, hidden: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        """fp32 log-probabilities [N, V] of the next token, under logits / temperature."""
        logits = self.logits(hidden).float()
        if temperature != 1.0:
            logits = logits / temperature
        return self.kernels.log_softmax(logits)
