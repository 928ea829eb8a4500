"""Why a training run stops, and how an actor's error reads in one line."""

from __future__ import annotations


class RunStopped(RuntimeError):
    """The run cannot make progress (its env fails, its groups are all dropped)."""


class LearnerDied(RuntimeError):
    """The learner actor's process is gone; train.py restarts the run from its checkpoint."""


def cause(err: BaseException) -> str:
    """The exception an actor or task raised, in one line: `Type: message`."""
    inner = getattr(err, "cause", None)
    if isinstance(inner, BaseException) and inner is not err:
        err = inner
    text = " ".join(str(err).split()) or "(no message)"
    return f"{type(err).__name__}: {text[:500]}"
