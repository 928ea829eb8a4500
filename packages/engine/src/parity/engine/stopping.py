"""When a sequence's turn ends: stop tokens, stop strings, max_new_tokens, the context limit."""

from __future__ import annotations

from typing import Protocol

from parity.engine.sequence import Sequence


class Detokenizer(Protocol):
    def decode(self, ids: list[int]) -> str: ...


def finish_reason(seq: Sequence, tokenizer: Detokenizer | None) -> str | None:
    """"stop", "length" or None (go on), judged right after a token was appended.

    A stop string is searched in the decoded tail of the generated tokens that could hold a
    new occurrence, so the check costs O(longest stop string) per token, not O(turn). The
    token that completes a stop string stays in the output (token-in-token-out: nothing
    already sampled is cut).
    """
    p = seq.params
    if seq.tokens[-1] in p.stop_token_ids:
        return "stop"
    if p.stop_strings and tokenizer is not None:
        longest = max(len(s) for s in p.stop_strings)
        # every token decodes to >= 1 character except partial multi-byte ones: a margin
        tail = seq.tokens[max(seq.num_prompt, len(seq.tokens) - longest - 4) :]
        text = tokenizer.decode(tail)
        prev = tokenizer.decode(tail[:-1])
        if any(s in text and s not in prev for s in p.stop_strings):
            return "stop"
    if seq.num_generated >= p.max_new_tokens or len(seq.tokens) >= seq.max_len:
        return "length"
    return None
