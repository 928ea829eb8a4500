"""Choosing the next token, vectorised over a step's sampling rows.

What is recorded: the sampled token's log-probability under log_softmax(logits / T), the
exact value the learner recomputes with `token_logprobs(model, tokens, temperature=T)`.
top-k and top-p only restrict which tokens can be drawn (the draw is renormalised over the
kept set); the recorded value is not renormalised, so learner and engine agree bit for bit
and an importance weight needs nothing from the sampler's truncation. Temperature 0 is
greedy (argmax) and records the temperature-1 log-probability.

Randomness is counter-based: the uniform for a row is a hash of (request seed, position),
so a request with a seed draws the same tokens whatever else is in the batch, however it
was chunked or preempted.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import numpy as np
import torch

from parity.engine.sequence import Sequence
from parity.model import Decoder, native

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def uniforms(seeds: list[int], positions: list[int]) -> torch.Tensor:
    """One float64 in [0, 1) per (seed, position): splitmix64 of the pair."""
    with np.errstate(over="ignore"):
        x = np.array(seeds, dtype=np.uint64) * _GOLDEN + np.array(positions, dtype=np.uint64)
        for shift, mul in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
            x = (x ^ (x >> np.uint64(shift))) * np.uint64(mul)
        x ^= x >> np.uint64(31)
    return torch.from_numpy((x >> np.uint64(11)).astype(np.float64) * 2.0**-53)


def _draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw per row of unnormalised probabilities [B, V] (fp64 running sums)."""
    cdf = probs.cumsum(-1, dtype=torch.float64)
    idx = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1), right=True)
    return idx.squeeze(-1).clamp_(max=probs.shape[-1] - 1)


@functools.cache
def _c_draw() -> ctypes.CDLL | None:
    dll, _ = native.build(Path(__file__).parent / "csrc" / "draw.c")
    if dll is not None:
        p, i = ctypes.c_void_p, ctypes.c_int64
        dll.parity_draw.argtypes = [p, i, i, i, p, p, i]
        dll.parity_draw.restype = ctypes.c_int
    return dll


def draw_logprobs(lp: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The inverse-CDF draw of `_draw(lp.exp(), u)` per row of log-probabilities [B, V], in
    one C call where a compiler exists (csrc/draw.c: no [B, V] buffers of probabilities and
    fp64 sums; the same rule, its own exp and sums, so a token on a boundary may differ
    from the torch path's, never between batches)."""
    dll = _c_draw()
    if dll is None or lp.dtype != torch.float32 or lp.stride(-1) != 1:
        return _draw(lp.exp(), u)
    out = torch.empty(lp.shape[0], dtype=torch.long)
    u = u.to(torch.float64).contiguous()
    threads = min(torch.get_num_threads(), lp.shape[0])
    if dll.parity_draw(lp.data_ptr(), lp.shape[0], lp.shape[1], lp.stride(0), u.data_ptr(),
                       out.data_ptr(), threads):
        raise MemoryError("the sampler's draw: out of memory for its buffers")
    return out


def sample(
    lp: torch.Tensor,
    greedy: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    u: torch.Tensor,
) -> torch.Tensor:
    """Token ids [B] from log-probabilities `lp` [B, V] (fp32, temperature applied).

    greedy [B] bool; top_k [B] long (0 = off); top_p [B] float64 (1 = off); u [B] uniforms.
    """
    drawn = ~greedy
    restricted = drawn & ((top_k > 0) | (top_p < 1))
    plain = drawn & ~restricted
    if bool(plain.all()):  # the usual step: every row a plain draw, drawn without row copies
        return draw_logprobs(lp, u)
    out = lp.argmax(-1)
    if not bool(drawn.any()):
        return out
    if bool(plain.any()):
        out[plain] = draw_logprobs(lp[plain], u[plain])
    if bool(restricted.any()):
        p_sorted, order = lp[restricted].exp().sort(-1, descending=True)
        k, p = top_k[restricted].unsqueeze(-1), top_p[restricted].unsqueeze(-1)
        rank = torch.arange(p_sorted.shape[-1]).unsqueeze(0)
        mass_before = p_sorted.cumsum(-1, dtype=torch.float64) - p_sorted
        keep = ((k == 0) | (rank < k)) & ((p >= 1) | (mass_before < p))
        keep[:, 0] = True
        j = _draw(p_sorted * keep, u[restricted])
        out[restricted] = order.gather(-1, j.unsqueeze(-1)).squeeze(-1)
    return out


def next_tokens(
    model: Decoder, hidden: torch.Tensor, seqs: list[Sequence]
) -> tuple[list[int], list[float]]:
    """The next token of each sequence from its last hidden row [B, H], and the logprob to
    record: `model.logprobs` (the learner's function) at the request's temperature."""
    temps = [s.params.temperature or 1.0 for s in seqs]  # greedy records T=1
    if len(set(temps)) == 1:
        lp = model.logprobs(hidden, temps[0])
    else:
        lp = torch.empty(len(seqs), model.config.vocab_size)
        for t in set(temps):
            idx = [j for j, x in enumerate(temps) if x == t]
            lp[idx] = model.logprobs(hidden[idx], t)
    tokens = sample(
        lp,
        torch.tensor([s.params.temperature == 0 for s in seqs]),
        torch.tensor([s.params.top_k for s in seqs]),
        torch.tensor([s.params.top_p for s in seqs], dtype=torch.float64),
        uniforms([s.seed for s in seqs], [len(s.tokens) for s in seqs]),
    )
    chosen = lp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return tokens.tolist(), chosen.tolist()
