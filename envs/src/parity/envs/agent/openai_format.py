"""The OpenAI chat wire format, read and written: requests checked field by field, chat
messages turned into the chat template's messages, and tool calls parsed from the model's
own text.

A request's messages are compared by their normalized form (`normalize`): role, text
content and tool calls by name and parsed arguments. That is what an agent sends back of an
assistant message it was given, whatever the SDK adds (ids, `refusal`, `annotations`).

Tool calls are read from the model's text in its chat format (Qwen's and Hermes'):

    I will compute it.<tool_call>{"name": "python", "arguments": {"code": "print(2)"}}</tool_call>

comes back as `content` "I will compute it." and one `tool_calls` entry. A turn with any
malformed block comes back as plain text, its tool calls unparsed (the agent sees what the
model wrote).

`tool_choice` is kept by what the turn starts with, never by changing what is sampled:
"required" starts the model's turn with `<tool_call>`, a named function with
`<tool_call>{"name": "f", "arguments": `; those tokens join the sequence unsampled (mask
0), the model writes the rest. "none" returns the turn as text, calls unparsed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from parity.envs.tools import HermesParser, ToolCall

ROLES = ("system", "developer", "user", "assistant", "tool")
_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_HERMES = HermesParser()


class RequestError(ValueError):
    """A request the endpoint refuses: `status` (400, 404, 410) and a message that names the
    field (`param`)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status

    def body(self) -> dict[str, Any]:
        """The error as OpenAI's API writes it."""
        kind = "invalid_request_error" if self.status == 400 else "not_found_error"
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": None}}


def field(body: Mapping[str, Any], name: str, types: type | tuple[type, ...], default: Any = None,
          check: Any = None, must: str = "") -> Any:
    """`body[name]`, or `default` when absent or null; RequestError naming the field when it
    is not of `types` or fails `check` (`must` says what it must be)."""
    value = body.get(name)
    if value is None:
        return default
    bad_bool = isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,))
    if bad_bool or not isinstance(value, types) or (check is not None and not check(value)):
        what = must or " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
        raise RequestError(f"{name}: must be {what}, got {json.dumps(value)[:80]}", name)
    return value


def text_of(content: Any, where: str) -> str:
    """The text of a message's `content`: a string, null, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    raise RequestError(f"{where}.content: must be a string or a list of text parts", where)


def _call_of(raw: Any, where: str) -> ToolCall:
    fn = raw.get("function") if isinstance(raw, Mapping) else None
    name = fn.get("name") if isinstance(fn, Mapping) else None
    args = fn.get("arguments", "{}") if isinstance(fn, Mapping) else None
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            args = None
    if not isinstance(name, str) or not isinstance(args, dict):
        raise RequestError(f"{where}: must be {{'type': 'function', 'function': {{'name': str, "
                           "'arguments': a JSON object}}}", where)
    return ToolCall(name, args)


def normalize(messages: Any) -> list[dict[str, Any]]:
    """The request's `messages` as {"role", "content", "tool_calls": [ToolCall]} dicts
    (RequestError naming the message and field when one is malformed)."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages: must be a non-empty list of messages", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, Mapping) or m.get("role") not in ROLES:
            raise RequestError(f"{where}.role: must be one of {', '.join(ROLES)}", f"{where}.role")
        calls = m.get("tool_calls") or []
        if not isinstance(calls, list) or (calls and m["role"] != "assistant"):
            raise RequestError(f"{where}.tool_calls: must be a list, on an assistant message",
                               f"{where}.tool_calls")
        out.append({"role": m["role"], "content": text_of(m.get("content"), where),
                    "tool_calls": [_call_of(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)]})
    return out


def template_message(m: Mapping[str, Any]) -> dict[str, str]:
    """A normalized message as the chat template takes it: tool calls written into the
    content in the model's own format; "developer" is the system turn."""
    calls = "".join(_HERMES.format(c) for c in m["tool_calls"])
    role = "system" if m["role"] == "developer" else m["role"]
    return {"role": role, "content": m["content"] + calls}


def forced_call(choice: Any, tools: Sequence[Any]) -> str | None:
    """What a request's `tool_choice` makes the model's turn start with: None when no tool
    calls are read from the turn ("none", or no tools), "" when the model chooses ("auto",
    the default), else the start of the call it must make (RequestError naming the field for
    a choice that is malformed or names no tool of the request)."""
    names = [t["function"].get("name") for t in tools]
    if choice is None or choice == "auto":
        return "" if tools else None
    if choice == "none":
        return None
    if choice == "required" or (isinstance(choice, Mapping) and choice.get("type") == "function"):
        name = choice["function"].get("name") if isinstance(choice, Mapping) and isinstance(
            choice.get("function"), Mapping) else None
        if choice != "required" and name not in names:
            raise RequestError(f"tool_choice: names function {json.dumps(name)}, which is not one "
                               f"of the request's tools ({', '.join(map(str, names)) or 'none'})",
                               "tool_choice")
        if not tools:
            raise RequestError("tool_choice: 'required' needs tools", "tool_choice")
        start = _HERMES.open_tag
        return start if choice == "required" else f'{start}{{"name": {json.dumps(name)}, "arguments": '
    raise RequestError("tool_choice: must be 'auto', 'none', 'required' or {'type': 'function', "
                       f"'function': {{'name': str}}}}, got {json.dumps(choice)[:80]}", "tool_choice")


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """(content, tool calls) of a model turn's text; the whole text and no calls when it has
    no `<tool_call>` block or a malformed one."""
    bodies = _BLOCK.findall(text)
    if not bodies or text.count("<tool_call>") != len(bodies):
        return text, []
    calls = []
    for body in bodies:
        parsed = _HERMES.parse(f"{_HERMES.open_tag}{body}{_HERMES.close_tag}")
        if parsed.call is None:
            return text, []
        calls.append(parsed.call)
    return _BLOCK.sub("", text).strip(), calls


def wire_tool_calls(calls: Sequence[ToolCall], prefix: str) -> list[dict[str, Any]]:
    """Tool calls as OpenAI's `tool_calls` entries, with ids `prefix`-0, `prefix`-1, ..."""
    return [{"id": f"{prefix}-{i}", "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for i, c in enumerate(calls)]
