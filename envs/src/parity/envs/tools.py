"""Tool-call parsers: turn a model's text into at most one tool call, or an error message.

Two formats:
  * Hermes: `<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>`
  * tagged code: `<py>print(1)</py>` (the tag is configurable), a call to tool `python`
    with argument `code`.

Parsers never raise on model text: malformed JSON, an unclosed tag or several calls in one
turn come back as `ParsedCall.error`, which the env shows to the model and counts.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    """One call: the tool's name and its keyword arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ParsedCall:
    """The result of parsing one model turn: `call` is None when the turn made no call.

    `error` is a message for the model when the turn tried to call a tool and failed.
    """

    call: ToolCall | None = None
    error: str | None = None


def one_block(text: str, open_tag: str, close_tag: str, what: str, verb: str) -> str | ParsedCall:
    """The body of the one `open_tag`...`close_tag` block in `text`; else the ParsedCall a
    parser returns: no call when there is no block, an error for several or an unclosed one."""
    n_open = text.count(open_tag)
    if n_open == 0:
        return ParsedCall()
    if n_open > 1:
        return ParsedCall(error=f"error: {n_open} {what} in one turn; {verb} exactly one")
    body = text.split(open_tag, 1)[1]
    if close_tag not in body:
        return ParsedCall(error=f"error: {open_tag} is not closed by {close_tag}")
    return body.split(close_tag, 1)[0]


class HermesParser:
    """`<tool_call>{json}</tool_call>`; the JSON needs `name` (str) and `arguments` (object)."""

    open_tag = "<tool_call>"
    close_tag = "</tool_call>"

    def parse(self, text: str) -> ParsedCall:
        body = one_block(text, self.open_tag, self.close_tag, "tool calls", "make")
        if isinstance(body, ParsedCall):
            return body
        try:
            obj = json.loads(body)
        except (json.JSONDecodeError, RecursionError) as e:
            return ParsedCall(error=f"error: tool call is not valid JSON: {e}")
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return ParsedCall(error='error: tool call needs {"name": str, "arguments": {...}}')
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some models send the arguments JSON-encoded
            with contextlib.suppress(json.JSONDecodeError):
                args = json.loads(args)
        if not isinstance(args, dict):
            return ParsedCall(error="error: tool call arguments must be a JSON object")
        return ParsedCall(call=ToolCall(obj["name"], args))

    def format(self, call: ToolCall) -> str:
        """The text a model writes to make `call` (used by oracles)."""
        payload = json.dumps({"name": call.name, "arguments": call.arguments})
        return f"{self.open_tag}{payload}{self.close_tag}"


class TaggedCodeParser:
    """`<py>code</py>`: a call to tool `tool` with argument `code`."""

    def __init__(self, tag: str = "py", tool: str = "python") -> None:
        if not re.fullmatch(r"[A-Za-z][\w-]*", tag):
            raise ValueError(f"tag: {tag!r} is not a valid tag name")
        self.open_tag, self.close_tag, self.tool = f"<{tag}>", f"</{tag}>", tool

    def parse(self, text: str) -> ParsedCall:
        code = one_block(text, self.open_tag, self.close_tag, f"{self.open_tag} blocks", "write")
        if isinstance(code, ParsedCall):
            return code
        if not code.strip():
            return ParsedCall(error=f"error: empty {self.open_tag} block")
        return ParsedCall(call=ToolCall(self.tool, {"code": code}))

    def format(self, call: ToolCall) -> str:
        return f"{self.open_tag}{call.arguments['code']}{self.close_tag}"


def make_parser(name: str) -> HermesParser | TaggedCodeParser:
    """A parser by name: "hermes" or "tagged"."""
    if name == "hermes":
        return HermesParser()
    if name == "tagged":
        return TaggedCodeParser()
    raise ValueError(f"tool_format: unknown {name!r}; expected 'hermes' or 'tagged'")


def extract_tag(text: str, tag: str) -> str | None:
    """Content of the last `<tag>...</tag>` in `text`, or None."""
    hits = re.findall(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, flags=re.DOTALL)
    return hits[-1] if hits else None
