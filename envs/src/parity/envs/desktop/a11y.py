"""The accessibility tree as text for models: a tab-separated table capped by a token budget."""

from __future__ import annotations

import string
from collections.abc import Callable

COLUMNS = ("tag", "name", "text", "class", "description", "position", "size")
PRINTABLE = frozenset(string.printable) - set("\x0b\x0c\r")
"""Characters an observation may hold (the Text spaces' charset); others become '?'."""


def clean(text: str) -> str:
    """`text` with characters outside PRINTABLE replaced by '?'."""
    return "".join(c if c in PRINTABLE else "?" for c in text)


def approx_tokens(text: str) -> int:
    """A tokenizer-free token estimate: about 4 characters per token."""
    return (len(text) + 3) // 4


def _field(value: object, limit: int = 200) -> str:
    text = " ".join(str(value).split())  # tabs and newlines would break the table
    return text if len(text) <= limit else text[: limit - 3] + "..."


def linearize(rows: list[dict], max_tokens: int = 2000,
              count_tokens: Callable[[str], int] = approx_tokens) -> str:
    """Rows {tag, name, text, class, description, x, y, w, h} → the table, at most `max_tokens`.

    Rows past the budget are dropped and counted on a last line.
    """
    lines = ["\t".join(COLUMNS)]
    used = count_tokens(lines[0])
    for i, r in enumerate(rows):
        line = "\t".join([_field(r["tag"]), _field(r["name"]), _field(r["text"]), _field(r["class"]),
                          _field(r["description"]), f"({r['x']}, {r['y']})", f"({r['w']}, {r['h']})"])
        cost = count_tokens(line) + 1
        if used + cost > max_tokens:
            lines.append(f"... ({len(rows) - i} more rows cut at {max_tokens} tokens)")
            break
        lines.append(line)
        used += cost
    return clean("\n".join(lines))
