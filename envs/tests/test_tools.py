"""Tool-call parsers: valid calls, and every malformed form as an error, never an exception."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parity.envs.tools import (
    HermesParser,
    ParsedCall,
    TaggedCodeParser,
    ToolCall,
    extract_tag,
    make_parser,
)


def test_hermes_valid_and_round_trip() -> None:
    p = HermesParser()
    text = 'Let me run it. <tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>'
    assert p.parse(text) == ParsedCall(call=ToolCall("python", {"code": "print(1)"}))
    call = ToolCall("python", {"code": "x = '</tool'\nprint(x)"})
    assert p.parse(p.format(call)).call == call
    # arguments sent as a JSON string are accepted
    assert p.parse('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>').call == ToolCall("f", {"a": 1})


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("<tool_call>{not json}</tool_call>", "error: tool call is not valid JSON"),
        ('<tool_call>{"name": "a"}</tool_call><tool_call>{"name": "b"}</tool_call>', "error: 2 tool calls in one turn"),
        ('<tool_call>{"name": "a"', "error: <tool_call> is not closed by </tool_call>"),
        ('<tool_call>[1, 2]</tool_call>', 'error: tool call needs {"name": str'),
        ('<tool_call>{"name": "a", "arguments": [1]}</tool_call>', "error: tool call arguments must be a JSON object"),
        ("<tool_call>" + "[" * 100000 + "</tool_call>", "error: tool call is not valid JSON"),
    ],
)
def test_hermes_errors(text: str, error: str) -> None:
    parsed = HermesParser().parse(text)
    assert parsed.call is None
    assert parsed.error is not None and parsed.error.startswith(error)


def test_tagged() -> None:
    p = TaggedCodeParser()
    assert p.parse("<py>print(5831*47)</py>") == ParsedCall(call=ToolCall("python", {"code": "print(5831*47)"}))
    assert p.parse("no call here") == ParsedCall()
    assert p.parse("<py>a</py><py>b</py>").error == "error: 2 <py> blocks in one turn; write exactly one"
    assert p.parse("<py>print(1)").error == "error: <py> is not closed by </py>"
    assert p.parse("<py> \n</py>").error == "error: empty <py> block"
    with pytest.raises(ValueError, match="tag: '<x>' is not a valid tag name"):
        TaggedCodeParser(tag="<x>")
    with pytest.raises(ValueError, match="tool_format: unknown 'xml'"):
        make_parser("xml")


def test_extract_tag() -> None:
    assert extract_tag("<ans>1</ans> then <ans> 2 </ans>", "ans") == " 2 "
    assert extract_tag("<ans>1", "ans") is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([*'<>/{}"[]:,\\ ', "<tool_call>", "</tool_call>", "<py>", "</py>", '"name"', '"arguments"'])).map("".join))
def test_parsers_never_raise(text: str) -> None:
    for parser in (HermesParser(), TaggedCodeParser()):
        parsed = parser.parse(text)
        assert parsed.call is None or parsed.error is None
