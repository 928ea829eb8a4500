"""The learner's training forward: per-token log-probabilities with autograd."""

from __future__ import annotations

import itertools

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
    for long episodes) with exactly the same per-token result. The padded form of
    `packed_logprobs`.
    """
    if tokens.dim() != 2:
        raise ValueError(f"tokens must be [batch, time], got shape {tuple(tokens.shape)}")
    b, t = tokens.shape
    lengths = torch.full((b,), t) if lengths is None else lengths.to(torch.long)
    lens = [int(n) for n in lengths]
    lp = packed_logprobs(model, _sequence_rows(tokens, lengths), lens, temperature, chunk_size)
    out = torch.zeros(b, max(t - 1, 0), dtype=torch.float32)
    out[torch.arange(out.shape[1]) < (lengths - 1)[:, None]] = lp
    return out


def packed_logprobs(
    model: Decoder,
    tokens: torch.Tensor,
    lengths: list[int],
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """The logprobs of packed sequences, packed: shape [N - S], fp32.

    `tokens` [N] (long) holds S sequences back to back, sequence s `lengths[s]` tokens long;
    the result holds each sequence's n - 1 values log p(x[t+1] | x[:t+1]) under
    logits / temperature, in the same order. Bit-identical per sequence whatever the other
    sequences (aligned mode) and whatever `chunk_size`, which runs each sequence's forward
    in chunks of that many tokens (bounded activation memory for long episodes).
    """
    if tokens.dim() != 1:
        raise ValueError(f"tokens must be packed [N], got shape {tuple(tokens.shape)}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size is None:
        layout = SeqLayout.from_lengths(lengths)
        hidden = model(tokens, layout, DenseKV())
        # only rows that have a next token need the vocabulary projection
        last = torch.tensor([s + n - 1 for s, n in zip(layout.starts, lengths, strict=True)])
        keep = torch.ones(tokens.shape[0], dtype=torch.bool).index_fill_(0, last, False)
        idx = keep.nonzero().squeeze(-1)
        return _gather(model.logprobs(hidden[idx], temperature), tokens[idx + 1])
    # one model call whose calls are every sequence's chunks: each layer computes them in
    # order, a chunk after the ones it attends to (a sharded learner gathers a layer once)
    calls, heads = [], []  # heads: (a chunk's first row, the next tokens of its rows)
    for start, n in zip(itertools.accumulate(lengths, initial=0), lengths, strict=False):
        kv = DenseKV()
        for done in range(0, n, chunk_size):
            m = min(chunk_size, n - done)
            calls.append((slice(start + done, start + done + m), SeqLayout.from_lengths([m], [done]), kv))
            nxt = tokens[start + done + 1 : start + min(done + m + 1, n)]  # never past its end
            if len(nxt):  # a last chunk of one token has none (an empty GEMM fails backward)
                heads.append((start + done, nxt))
    hidden = model(tokens, calls=calls)
    # the vocabulary projection a chunk at a time: bounded logits for long episodes
    pieces = [_gather(model.logprobs(hidden[r : r + len(nxt)], temperature), nxt) for r, nxt in heads]
    return torch.cat(pieces) if pieces else torch.zeros(0)


def _gather(lp: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return lp.gather(-1, targets[:, None]).squeeze(-1)
