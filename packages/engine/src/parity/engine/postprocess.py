"""The bookkeeping after one engine step: what the forward computed and what it sampled
lands in the sequences, and sequences whose turn ended are released."""

from __future__ import annotations

from parity.engine.model_runner import Sampled
from parity.engine.scheduler import Batch, Scheduler
from parity.engine.sequence import Sequence
from parity.engine.stopping import Detokenizer, finish_reason


def postprocess(
    scheduler: Scheduler,
    batch: Batch,
    sampled: Sampled,
    version: int,
    tokenizer: Detokenizer | None,
) -> list[Sequence]:
    """Every scheduled row now has K/V in the cache (newly full blocks join the prefix
    cache); each sampled token is appended with its logprob and the weights' version.
    Returns the sequences that finished."""
    for seq, n in zip(batch.seqs, batch.num_new, strict=True):
        scheduler.computed(seq, n)
    finished = []
    for seq, t, logp in zip(sampled.seqs, sampled.tokens, sampled.logprobs, strict=True):
        seq.tokens.append(t)
        seq.logprobs.append(logp)
        seq.versions.append(version)
        reason = finish_reason(seq, tokenizer)
        if reason is not None:
            scheduler.finish(seq, reason)
            finished.append(seq)
    return finished
