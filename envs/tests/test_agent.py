"""AgentEnv: an OpenAI-SDK agent against the loopback endpoint, with a deterministic engine."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from agent_engine import TASK, Engine, play

from parity.envs import EpisodeLimits
from parity.envs.agent import AgentEnv, run_agent_episode
from parity.envs.agent.server import endpoint


def test_tool_calls_and_exact_tokens() -> None:
    seen = {}

    async def agent(client, task):
        tools = [{"type": "function", "function": {"name": "python", "parameters": {}}}]
        messages = [{"role": "user", "content": task["question"]}]
        r = await client.chat.completions.create(model="policy", messages=messages, tools=tools,
                                                 logprobs=True)
        seen["first"] = r
        call = r.choices[0].message.tool_calls[0]
        messages += [r.choices[0].message, {"role": "tool", "tool_call_id": call.id, "content": "42"}]
        r = await client.chat.completions.create(model="policy", messages=messages, tools=tools)
        return float(r.choices[0].message.content == "<ans>42</ans>")

    call = '<tool_call>{"name": "python", "arguments": {"code": "print(6*7)"}}</tool_call>'
    tok, engine, [traj] = play(agent, ["Let me run it." + call, "<ans>42</ans>"])
    first = seen["first"].choices[0]
    assert first.finish_reason == "tool_calls" and first.message.content == "Let me run it."
    assert first.message.tool_calls[0].function.name == "python"
    assert json.loads(first.message.tool_calls[0].function.arguments) == {"code": "print(6*7)"}
    turn1 = tok.encode("Let me run it." + call + "<|im_end|>")
    assert first.model_extra["token_ids"] == turn1
    assert [lp.logprob for lp in first.logprobs.content] == [-1 / 8] * len(turn1)
    assert "".join(lp.token for lp in first.logprobs.content) == tok.decode(turn1)

    prompt = tok.encode("<|im_start|>user\nQ: 6*7=?<|im_end|>\n<|im_start|>assistant\n")
    delta = tok.encode("\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n")
    turn2 = tok.encode("<ans>42</ans><|im_end|>")
    assert traj.tokens.tolist() == prompt + turn1 + delta + turn2
    assert traj.loss_mask.tolist() == [0] * len(prompt) + [1] * len(turn1) + [0] * len(delta) + [1] * len(turn2)
    assert traj.logprobs.tolist() == [0.0] * len(prompt) + [-1 / 8] * len(turn1) + [0.0] * len(delta) + [-2 / 8] * len(turn2)
    assert traj.versions.tolist() == [-1] * len(prompt) + [1] * len(turn1) + [-1] * len(delta) + [2] * len(turn2)
    assert engine.prompts == [prompt, prompt + turn1 + delta]  # the engine saw the buffer itself
    assert engine.sampling[0].stop_token_ids == tuple(tok.stop_token_ids)
    assert (traj.group_id, traj.reward, traj.failure, traj.finish_reason, traj.num_turns) == \
        ("g", 1.0, None, "done", 2)
    assert traj.metrics == {"agent/segments": 1.0, "agent/requests": 2.0, "agent/refused": 0.0}
    assert len(traj.turn_timings) == 2 and traj.task == TASK


def test_malformed_tool_call_comes_back_as_text_and_no_tools_means_no_parsing() -> None:
    replies = []

    async def agent(client, task):
        tools = [{"type": "function", "function": {"name": "python"}}]
        for kwargs in ({"tools": tools}, {}):
            r = await client.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": f"{len(replies)}"}], **kwargs)
            replies.append(r.choices[0])
        return 0.0

    bad = '<tool_call>{"name": "python", "arguments": </tool_call>'
    good = '<tool_call>{"name": "python", "arguments": {}}</tool_call>'
    _, _, trajs = play(agent, [bad, good])
    assert [(c.message.content, c.message.tool_calls, c.finish_reason) for c in replies] == \
        [(bad, None, "stop"), (good, None, "stop")]
    assert len(trajs) == 2  # the second request rewrote the first's history


def test_rewritten_history_starts_a_new_segment() -> None:
    async def agent(client, task):
        chat = [{"role": "user", "content": "a"}]
        r = await client.chat.completions.create(model="policy", messages=chat)
        chat += [{"role": "assistant", "content": r.choices[0].message.content},
                 {"role": "user", "content": "b"}]
        await client.chat.completions.create(model="policy", messages=chat)
        chat[0]["content"] = "A"  # the agent edits its history: a new segment from here
        await client.chat.completions.create(model="policy", messages=chat)
        return 1.0

    tok, _, trajs = play(agent, ["x", "y", "z"])
    assert len(trajs) == 2
    first, second = trajs
    assert tok.decode(first.tokens) == ("<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nx"
                                        "<|im_end|>\n<|im_start|>user\nb<|im_end|>\n"
                                        "<|im_start|>assistant\ny<|im_end|>")
    assert tok.decode(second.tokens) == ("<|im_start|>user\nA<|im_end|>\n<|im_start|>assistant\nx"
                                         "<|im_end|>\n<|im_start|>user\nb<|im_end|>\n"
                                         "<|im_start|>assistant\nz<|im_end|>")
    # in the new segment the old model turn is prompt (mask 0); only "z" is trained on
    assert tok.decode([t for t, m in zip(second.tokens, second.loss_mask, strict=True) if m]) == \
        "z<|im_end|>"
    assert first.finish_reason == "rewritten" and second.finish_reason == "done"
    assert [t.reward for t in trajs] == [1.0, 1.0]
    assert second.metrics["agent/segments"] == 2.0


def test_bad_requests_get_400_naming_the_field_and_the_episode_goes_on() -> None:
    errors = []

    async def agent(client, task):
        chat = [{"role": "user", "content": "hi"}]
        bad = [{"model": "gpt-4o"}, {"n": 2}, {"temperature": 0.5},
               {"messages": [{"role": "robot", "content": "x"}]}, {"max_tokens": 0},
               {"messages": [{"role": "user", "content": "x" * 600}]}]
        for extra in bad:
            try:
                await client.chat.completions.create(**{"model": "policy", "messages": chat, **extra})
            except openai.BadRequestError as e:
                errors.append((e.status_code, e.body["param"], e.body["message"]))
        async with httpx.AsyncClient(base_url=str(client.base_url)) as http:
            for path, body in (("chat/completions", b"{nope"), ("chat/completions", b"[]"),
                               ("embeddings", b"{}")):
                r = await http.post(path, content=body)
                errors.append((r.status_code, None, r.json()["error"]["message"]))
        reader, writer = await asyncio.open_connection("127.0.0.1", client.base_url.port)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")  # only this connection ends
        errors.append(await reader.read())
        writer.close()
        r = await client.chat.completions.create(model="policy", messages=chat)
        chat += [r.choices[0].message, {"role": "user", "content": "again"}]
        try:  # max_turns = 1: no second model turn
            await client.chat.completions.create(model="policy", messages=chat)
        except openai.BadRequestError as e:
            errors.append((e.status_code, e.body["param"], e.body["message"]))
        return 1.0

    _, engine, [traj] = play(agent, ["ok"], limits=EpisodeLimits(max_turns=1, max_tokens=512))
    assert errors == [
        (400, "model", "model: unknown model 'gpt-4o'; this endpoint serves 'policy'"),
        (400, "n", "n: only n=1 is supported, got 2"),
        (400, "temperature", "temperature: this episode samples at temperature 1 (the learner's); got 0.5"),
        (400, "messages[0].role", "messages[0].role: must be one of system, developer, user, assistant, tool"),
        (400, "max_tokens", "max_tokens: must be an integer >= 1, got 0"),
        (400, "messages", "messages: the prompt has 619 tokens, over the episode's limit of 512 (max_tokens)"),
        (400, None, "body: not valid JSON: Expecting property name enclosed in double quotes: "
                    "line 1 column 2 (char 1)"),
        (400, None, "body: must be a JSON object"),
        (404, None, "no route POST /v1/embeddings"),
        b"",
        (400, "messages", "messages: the episode has reached its 1 model turns (max_turns)"),
    ]
    assert len(engine.prompts) == 1
    assert (traj.reward, traj.failure, traj.finish_reason) == (1.0, None, "max_turns")
    assert traj.metrics["agent/refused"] == 7.0 and traj.metrics["agent/requests"] == 8.0


def test_tool_choice_starts_the_turn_with_the_call_it_forces() -> None:
    tools = [{"type": "function", "function": {"name": "python", "parameters": {}}},
             {"type": "function", "function": {"name": "shell", "parameters": {}}}]
    named = {"type": "function", "function": {"name": "shell"}}
    got, errors = [], []

    async def agent(client, task):
        chat = [{"role": "user", "content": "hi"}]
        for bad in ({"type": "function", "function": {"name": "rm"}}, "always", {"type": "x"}):
            try:
                await client.chat.completions.create(model="policy", messages=chat, tools=tools,
                                                     tool_choice=bad)
            except openai.BadRequestError as e:
                errors.append((e.body["param"], e.body["message"]))
        for choice in ("required", named, "none"):
            r = await client.chat.completions.create(model="policy", messages=chat, tools=tools,
                                                     tool_choice=choice)
            got.append(r.choices[0])
            chat = [*chat, r.choices[0].message, {"role": "user", "content": "next"}]
        return 1.0

    call = '{"name": "python", "arguments": {"code": "1"}}</tool_call>'
    replies = [call, '{"cmd": "ls"}}</tool_call>', "<tool_call>" + call]
    tok, engine, [traj] = play(agent, replies)
    assert errors == [
        ("tool_choice", 'tool_choice: names function "rm", which is not one of the request\'s '
                        "tools (python, shell)"),
        ("tool_choice", "tool_choice: must be 'auto', 'none', 'required' or {'type': 'function', "
                        "'function': {'name': str}}, got \"always\""),
        ("tool_choice", "tool_choice: must be 'auto', 'none', 'required' or {'type': 'function', "
                        "'function': {'name': str}}, got {\"type\": \"x\"}"),
    ]
    required, by_name, none = got
    assert [c.finish_reason for c in got] == ["tool_calls", "tool_calls", "stop"]
    assert (required.message.tool_calls[0].function.name, by_name.message.tool_calls[0].function.name) \
        == ("python", "shell")
    assert json.loads(by_name.message.tool_calls[0].function.arguments) == {"cmd": "ls"}
    assert none.message.content == "<tool_call>" + call and not none.message.tool_calls
    # the forced start is in the sequence the engine continued, unsampled (mask 0)
    forced = [tok.encode("<tool_call>"), tok.encode('<tool_call>{"name": "shell", "arguments": ')]
    for prompt, start in zip(engine.prompts, forced, strict=False):
        assert prompt[-len(start):] == start
    tokens, mask = traj.tokens.tolist(), traj.loss_mask.tolist()
    at = len(engine.prompts[0])
    assert mask[at - len(forced[0]):at] == [0] * len(forced[0])
    assert tokens[at:at + len(tok.encode(call)) + 1] == [*tok.encode(call), tok.eos_token_id]
    assert mask[at:at + len(tok.encode(call)) + 1] == [1] * (len(tok.encode(call)) + 1)
    assert traj.messages[1] == {"role": "assistant", "content": "<tool_call>" + call}


def test_too_many_rewrites_are_refused() -> None:
    said = []

    async def agent(client, task):
        for i in range(3):
            try:
                await client.chat.completions.create(
                    model="policy", messages=[{"role": "user", "content": str(i)}])
            except openai.BadRequestError as e:
                said.append(e.body["message"])
        return 0.0

    _, _, trajs = play(agent, ["a", "b"], max_segments=2)
    assert len(trajs) == 2
    assert said == ["messages: the request does not extend the episode (it rewrites earlier "
                    "messages) and the episode already has 2 segments, its limit (max_segments)"]


def test_episodes_are_isolated_and_ended_ones_refused() -> None:
    urls = {}

    async def agent(client, task):
        urls[task["question"]] = str(client.base_url)
        for _ in range(2):  # interleaved with the other episode's requests
            await client.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": task["question"]}])
            await asyncio.sleep(0)
        return 1.0

    async def main():
        tasks = [{"question": "one", "answer": "1"}, {"question": "two", "answer": "2"}]
        env1, env2 = (AgentEnv(agent=agent, tasks=[t]) for t in tasks)
        engine = Engine(env1.tokenizer, reply=lambda prompt: prompt.split("\n")[1].removesuffix("<|im_end|>"))
        keep = await endpoint()  # a live episode keeps the server up after these end
        keep.sessions["keep"] = None
        t1, t2 = await asyncio.gather(run_agent_episode(env1, engine, seed=0),
                                      run_agent_episode(env2, engine, seed=0))
        async with httpx.AsyncClient() as http:
            body = {"model": "policy", "messages": [{"role": "user", "content": "x"}]}
            ended = await http.post(urls["one"] + "/chat/completions", json=body)
            unknown = await http.post(urls["one"].replace("/episodes/", "/episodes/0") +
                                      "/chat/completions", json=body)
        del keep.sessions["keep"]
        return t1, t2, ended, unknown

    t1, t2, ended, unknown = asyncio.run(main())
    assert urls["one"] != urls["two"]
    tok = AgentEnv(agent=agent).tokenizer
    for traj, q in ((t1, "one"), (t2, "two")):
        answer = [t for t, m in zip(traj.tokens, traj.loss_mask, strict=True) if m]
        assert tok.decode(answer) == q + "<|im_end|>"
        assert traj.metrics["agent/segments"] == 2.0  # the same prompt twice: a rewrite
    key = urls["one"].rstrip("/").split("/")[-2]
    assert ended.status_code == 410 and ended.json()["error"]["message"] == f"episode {key} has ended"
    assert unknown.status_code == 404
    assert unknown.json()["error"]["message"] == f"unknown episode 0{key}"


def test_stream_and_completions() -> None:
    got = {}

    async def agent(client, task):
        stream = await client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "q"}], stream=True)
        got["chunks"] = [c.choices[0] async for c in stream]
        r = await client.completions.create(model="policy", prompt="<|im_start|>user\nq",
                                            max_tokens=50, logprobs=0)
        got["text"] = r.choices[0]
        return 1.0

    tok, engine, trajs = play(agent, ["hello", "world"])
    chunks = got["chunks"]
    assert [c.delta.content for c in chunks] == ["hello", None]
    assert [c.finish_reason for c in chunks] == [None, "stop"]
    assert got["text"].text == "world<|im_end|>"
    assert got["text"].logprobs.token_logprobs == [-2 / 8] * 6
    assert engine.prompts[1] == tok.encode("<|im_start|>user\nq")
    assert len(trajs) == 2


def test_completions_extend_by_token_ids_and_text() -> None:
    async def agent(client, task):
        p = tok.encode("abc")
        r = await client.completions.create(model="policy", prompt=p, max_tokens=8)
        p = [*p, *r.choices[0].model_extra["token_ids"], *tok.encode("d")]
        r = await client.completions.create(model="policy", prompt=p, max_tokens=8)
        text = tok.decode([*p, *r.choices[0].model_extra["token_ids"]])
        await client.completions.create(model="policy", prompt=text + "e", max_tokens=8)
        return 1.0

    tok = AgentEnv(agent=lambda c, t: 0).tokenizer
    _, _, [traj] = play(agent, ["1", "2", "3"])
    assert tok.decode(traj.tokens) == "abc1<|im_end|>d2<|im_end|>e3<|im_end|>"
    assert tok.decode([t for t, m in zip(traj.tokens, traj.loss_mask, strict=True) if m]) == \
        "1<|im_end|>2<|im_end|>3<|im_end|>"


def test_constructor_checks() -> None:
    with pytest.raises(ValueError, match="exactly one of agent"):
        AgentEnv()
    with pytest.raises(ValueError, match="command: must be a non-empty list"):
        AgentEnv(command="python agent.py")


def test_tools_are_shown_by_a_template_that_shows_them() -> None:
    from parity.envs.tokenizer import CHATML_TEMPLATE, Tokenizer, build_project_tokenizer

    base = build_project_tokenizer()
    shows_tools = ("{%- if tools %}{{- '<|im_start|>system\\ntools:' }}{%- for t in tools %}"
                   "{{- ' ' + t['function']['name'] }}{%- endfor %}{{- '<|im_end|>\\n' }}"
                   "{%- endif %}" + CHATML_TEMPLATE)
    tok = Tokenizer(base.backend, shows_tools, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tools = [{"type": "function", "function": {"name": "python"}}]

    async def agent(client, task):
        chat = [{"role": "user", "content": "q"}]
        r = await client.chat.completions.create(model="policy", messages=chat, tools=tools)
        chat += [r.choices[0].message, {"role": "tool", "content": "2"}]
        await client.chat.completions.create(model="policy", messages=chat, tools=tools)
        await client.chat.completions.create(model="policy", messages=chat)  # tools dropped
        return 1.0

    env = AgentEnv(agent=agent, tasks=[TASK], tokenizer=tok)
    trajs = asyncio.run(run_agent_episode(env, Engine(tok, ["a", "b", "c"]), seed=0)).segments
    assert [tok.decode(t.tokens) for t in trajs] == [
        "<|im_start|>system\ntools: python<|im_end|>\n<|im_start|>user\nq<|im_end|>\n"
        "<|im_start|>assistant\na<|im_end|>\n<|im_start|>tool\n2<|im_end|>\n"
        "<|im_start|>assistant\nb<|im_end|>",
        "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n"
        "<|im_start|>tool\n2<|im_end|>\n<|im_start|>assistant\nc<|im_end|>",
    ]
