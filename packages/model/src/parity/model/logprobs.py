"""The learner's training forward: per-token log-probabilities with autograd."""

from __future__ import annotations

import torch

from parity.model.decoder import Decoder, DenseKV
from parity.model.layout import SeqLayout


def _sequence_rows(tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    return torch.cat([tokens[b, : int(n)] for b, n in enumerate(lengths)])


def token_logprobs(
    model: Decoder,
    tokens: torch.Tensor,
    temperature: float = 1.0,
    lengths: torch.Tensor | None = None,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """log p(tokens[b, t+1] | tokens[b, :t+1]) under logits / temperature, shape [B, T-1].

    `tokens` [B, T] (long); `lengths` [B] gives each row's real length (default T); entries
    at or past a row's length - 1 are 0. In aligned mode the result is bit-identical to what
    the engine records for the same weights and tokens, whatever the batch. `chunk_size`
    runs each sequence's forward in chunks of that many tokens (bounded activation memory
    for long episodes) with exactly the same per-token result.
    """
    if tokens.dim() != 2:
        raise ValueError(f"tokens must be [batch, time], got shape {tuple(tokens.shape)}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    b, t = tokens.shape
    lengths = torch.full((b,), t) if lengths is None else lengths.to(torch.long)
    out = torch.zeros(b, max(t - 1, 0), dtype=torch.float32)
    if chunk_size is None:
        lens = [int(n) for n in lengths]
        layout = SeqLayout.from_lengths(lens)
        hidden = model(_sequence_rows(tokens, lengths), layout, DenseKV())
        rows = _next_token_logprobs(model, hidden, layout, tokens, temperature)
        for s, lp in enumerate(rows):
            out[s, : lp.shape[0]] = lp
        return out
    for s in range(b):
        n, kv, done = int(lengths[s]), DenseKV(), 0
        pieces = []
        while done < n:
            m = min(chunk_size, n - done)
            layout = SeqLayout.from_lengths([m], [done])
            hidden = model(tokens[s, done : done + m], layout, kv)
            nxt = tokens[s, done + 1 : min(done + m + 1, n)]  # never past the row's end
            lp = model.logprobs(hidden[: nxt.shape[0]], temperature)
            pieces.append(lp.gather(-1, nxt[:, None]).squeeze(-1))
            done += m
        out[s, : n - 1] = torch.cat(pieces)
    return out


def _next_token_logprobs(
    model: Decoder, hidden: torch.Tensor, layout: SeqLayout, tokens: torch.Tensor,
    temperature: float,
) -> list[torch.Tensor]:
    # Only rows that have a next token need the vocabulary projection.
    keep, targets, sizes = [], [], []
    for s, (start, n) in enumerate(zip(layout.starts, layout.lengths, strict=True)):
        keep.append(torch.arange(start, start + n - 1))
        targets.append(tokens[s, 1:n])
        sizes.append(n - 1)
    idx = torch.cat(keep)
    lp = model.logprobs(hidden[idx], temperature).gather(-1, torch.cat(targets)[:, None]).squeeze(-1)
    return list(lp.split(sizes))
