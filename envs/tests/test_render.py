"""render(all messages) == prompt + model tokens + observation deltas, for three templates."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parity.envs.render import Renderer, RenderError
from parity.envs.tokenizer import Tokenizer

_words = st.text(alphabet="abcdefghij0123456789 +*=?()<>/[],.:", min_size=1, max_size=30).map(
    lambda s: "x" + s.strip() + "y"
)
_roles = st.sampled_from(["user", "tool"])


def _episode_tokens(tok: Tokenizer, system: str, question: str, turns, truncated_last: bool):
    """Build the token sequence a rollout would produce and the full message list."""
    r = Renderer(tok)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    seq = r.prompt(messages)
    stop = tok.eos_token_id
    model_ids: list[int] = []
    for i, (answer, obs) in enumerate(turns):
        cut = truncated_last and i == len(turns) - 1
        model_ids = tok.encode(answer) + ([] if cut else [stop])
        seq += model_ids
        messages.append({"role": "assistant", "content": answer})
        if obs:
            seq += r.observation_delta(obs, model_ids)
            messages += obs
    seq += tok.encode(r.closing(model_ids))
    return seq, messages


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    system=_words, question=_words, truncated_last=st.booleans(),
    turns=st.lists(
        st.tuples(_words, st.lists(st.builds(lambda r, c: {"role": r, "content": c}, _roles, _words),
                                   min_size=1, max_size=2)),
        min_size=1, max_size=3,
    ),
)
def test_render_all_equals_concatenated_deltas(any_tokenizer, system, question, turns, truncated_last):
    turns = [*turns[:-1], (turns[-1][0], [])]  # the episode ends on a model turn
    seq, messages = _episode_tokens(any_tokenizer, system, question, turns, truncated_last)
    assert seq == any_tokenizer.apply_chat_template(messages)


def test_chatml_delta_is_exact(project_tokenizer):
    r = Renderer(project_tokenizer)
    assert r.after_assistant == "<|im_end|>\n"
    model = project_tokenizer.encode("<py>print(1)</py><|im_end|>")
    delta = r.observation_delta([{"role": "tool", "content": "1\n"}], model)
    assert project_tokenizer.decode(delta) == "\n<|im_start|>tool\n1\n<|im_end|>\n<|im_start|>assistant\n"
    # cut by the token limit: the template's end of turn is supplied by the env
    cut = r.observation_delta([{"role": "user", "content": "go on"}], model[:-1])
    assert project_tokenizer.decode(cut).startswith("<|im_end|>\n<|im_start|>user\ngo on")


def test_llama3_has_no_newline_after_eot(llama3_tokenizer):
    r = Renderer(llama3_tokenizer)
    assert r.after_assistant == "<|eot_id|>"
    model = llama3_tokenizer.encode("hi<|eot_id|>")
    delta = llama3_tokenizer.decode(r.observation_delta([{"role": "user", "content": "ok"}], model))
    assert delta == "<|start_header_id|>user<|end_header_id|>\n\nok<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"


def test_qwen2_tool_messages_merge_into_one_user_turn(qwen2_tokenizer):
    r = Renderer(qwen2_tokenizer)
    model = qwen2_tokenizer.encode("call<|im_end|>")
    obs = [{"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}]
    assert qwen2_tokenizer.decode(r.observation_delta(obs, model)) == (
        "\n<|im_start|>user\n<tool_response>\n1\n</tool_response>\n<tool_response>\n2\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_template_that_rewrites_history_is_refused(tmp_path, project_tokenizer):
    from parity.envs.tokenizer import Tokenizer

    # drops every assistant message but the last: not append-only
    template = (
        "{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}"
        "[{{ m['role'] }}:{{ m['content'] }}]{% endif %}{% endfor %}"
    )
    tok = Tokenizer(project_tokenizer.backend, template, eos_token="<|im_end|>")
    r = Renderer(tok)
    with pytest.raises(RenderError, match="rewrites earlier turns"):
        r.observation_delta([{"role": "user", "content": "x"}], [2])
