"""The decoder (Qwen2 / Qwen3 / Llama), with Hugging Face parameter names.

One forward serves every caller: the learner's training forward, the engine's prefill,
chunked prefill, prefix-cache continuation and decode. Callers differ only in the
`KVStore` that turns each layer's new keys/values into the per-sequence key/value
tensors attention reads.
"""

from __future__ import annotations

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
        self.heads, self.kv_heads, self.head_dim = hq, hkv, d
        self.scale = d**-0.5


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)


class Layer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Body(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_hidden_layers))
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

    def _norm(self, norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
        return self.kernels.rms_norm(x, norm.weight, norm.eps)

    def _attention(
        self, attn: Attention, x: torch.Tensor, layer: int, layout: SeqLayout, kv: KVStore,
        cos: torch.Tensor, sin: torch.Tensor,
    ) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.kernels.linears(
            x, [(p.weight, p.bias) for p in (attn.q_proj, attn.k_proj, attn.v_proj)]
        )
        q = q.view(n, attn.heads, attn.head_dim)
        k = k.view(n, attn.kv_heads, attn.head_dim)
        v = v.view(n, attn.kv_heads, attn.head_dim)
        if self.config.qk_norm:
            q = self._norm(attn.q_norm, q)
            k = self._norm(attn.k_norm, k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        keys, values = kv.update(layer, k, v, layout)
        o = self.kernels.attention(q, keys, values, layout, attn.scale)
        return self.kernels.linear(o.reshape(n, -1), attn.o_proj.weight, None)

    def forward(self, tokens: torch.Tensor, layout: SeqLayout, kv: KVStore) -> torch.Tensor:
        """Final-norm hidden states [N, hidden] for the flat token rows `tokens` [N]."""
        cos, sin = self.rope.lookup(layout.positions)
        h = self.model.embed_tokens(tokens).to(self.compute_dtype)
        for i, layer in enumerate(self.model.layers):
            a = self._attention(
                layer.self_attn, self._norm(layer.input_layernorm, h), i, layout, kv, cos, sin
            )
            h = h + a
            x = self._norm(layer.post_attention_layernorm, h)
            mlp = layer.mlp
            gate, up = self.kernels.linears(x, [(mlp.gate_proj.weight, None), (mlp.up_proj.weight, None)])
            h = h + self.kernels.linear(self.kernels.silu_mul(gate, up), mlp.down_proj.weight, None)
        return self._norm(self.model.norm, h)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.kernels.linear(hidden, self.lm_head_weight, None)

    def logprobs(self, hidden: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        """fp32 log-probabilities [N, V] of the next token, under logits / temperature."""
        logits = self.logits(hidden).float()
        if temperature != 1.0:
            logits = logits / temperature
        return self.kernels.log_softmax(logits)
