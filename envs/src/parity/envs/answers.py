"""Small helpers for reading answers out of model text and showing tool output."""

from __future__ import annotations

from fractions import Fraction


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, braces balanced; None
    if there is none or it is not closed."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def as_number(text: str) -> Fraction | None:
    """`text` as an exact number ("42", "42.0", "-1/2", "1,234"), or None."""
    s = text.strip().replace(",", "").replace("_", "")
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def same_answer(pred: str, gold: str) -> bool:
    """Numbers compare by value ("42.0" == "42"), anything else by whitespace-normalised text."""
    a, b = as_number(pred), as_number(gold)
    if a is not None and b is not None:
        return a == b
    return " ".join(pred.split()) == " ".join(gold.split())


def head_tail(text: str, max_chars: int) -> str:
    """`text` cut to about `max_chars`: its head and tail, and how much was cut between."""
    if len(text) <= max_chars:
        return text
    head = max_chars // 2
    tail = max_chars - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n...[{cut} characters cut]...\n{text[-tail:]}"
