"""One agent episode behind its endpoint: the append-only token sequence its requests
extend, and what the engine sampled for each of them.

Each chat request's messages must repeat the episode's chat so far (its prompt, the
model's turns as they were returned, what the agent added) and add to it; the added
messages are rendered as an observation delta after the model's last turn
(`parity.envs.render.Renderer`), so the model's tokens stay exactly as sampled. A request
that edits or drops earlier messages starts a new segment, an `Episode` of its own from
its prompt, never a re-tokenized copy. A `/v1/completions` prompt of token ids extends the
sequence when it starts with it; one of text, when it starts with the sequence's text.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from itertools import accumulate
from typing import Any

from parity.core.types import Completion, SamplingParams
from parity.envs.agent.openai_format import (
    RequestError,
    field,
    forced_call,
    normalize,
    parse_tool_calls,
    template_message,
    wire_tool_calls,
)
from parity.envs.data import Task
from parity.envs.episode import Episode, EpisodeLimits
from parity.envs.render import Renderer, RenderError
from parity.envs.runner import Generate


class AgentSession:
    """The state of one agent episode.

    `segments`: its `Episode`s, one per stretch of requests that extend each other, in
    order. `requests` / `refused`: requests served / answered with an error. `overhead_s`:
    per request answered with a model turn, its seconds in the endpoint outside the engine
    call (from its body read to its answer, less the engine's time). `failure`:
    None, or the kind of failure outside the agent ("generate_error") that ended it;
    `finish_reason` then says what. `limit`: "max_turns" or "max_tokens" once a request was
    refused for that episode limit. `ended`: no more requests are served.
    """

    def __init__(self, key: str, task: Task, renderer: Renderer, limits: EpisodeLimits,
                 generate: Generate, sampling: SamplingParams, *, model: str,
                 max_segments: int, max_action_chars: int) -> None:
        """`key`: the episode's part of its base URL. `sampling`: how the episode samples
        (the learner's temperature, stop tokens); a request may set max_tokens and stop.
        `model`: the one model name served. `max_segments`: history rewrites allowed + 1."""
        self.key = key
        self.task = task
        self.renderer = renderer
        self.limits = limits
        self.generate = generate
        self.sampling = sampling
        self.model = model
        self.max_segments = max_segments
        self.max_action_chars = max_action_chars
        self.segments: list[Episode] = []
        self.requests = 0
        self.refused = 0
        self.overhead_s: list[float] = []
        self.failure: str | None = None
        self.finish_reason = ""
        self.limit = ""
        self.ended = False
        self._seen: list[dict[str, Any]] | None = None  # the chat so far, as requests write it
        self._tools: list[Any] = []  # the tools the segment's prompt shows
        self._pending: tuple[Completion, float, float] | None = None  # the turn not yet closed
        self._lock = asyncio.Lock()  # one request at a time: each extends the one before
        self._serving: set[asyncio.Task] = set()  # requests in flight, cancelled at the end
        self._engine_s = 0.0  # the last engine call's seconds

    # ---- requests -------------------------------------------------------------------------

    async def chat(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Serve one `/v1/chat/completions` request body (RequestError if refused)."""
        return await self._serve(body, self._chat)

    async def complete(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Serve one `/v1/completions` request body (RequestError if refused)."""
        return await self._serve(body, self._complete)

    async def _serve(self, body: Mapping[str, Any], serve: Callable[..., Awaitable[dict]]) -> dict:
        task = asyncio.current_task()
        assert task is not None
        self._serving.add(task)
        t0 = time.perf_counter()
        try:
            answer = await self._serve_locked(body, serve)
        finally:
            self._serving.discard(task)
        self.overhead_s.append(time.perf_counter() - t0 - self._engine_s)
        return answer

    async def _serve_locked(self, body: Mapping[str, Any],
                            serve: Callable[..., Awaitable[dict]]) -> dict:
        async with self._lock:
            if self.ended:
                why = f" ({self.finish_reason})" if self.finish_reason else ""
                raise RequestError(f"episode {self.key} has ended{why}", None, 410)
            self.requests += 1
            try:
                return await serve(body)
            except RequestError:
                self.refused += 1
                raise

    async def _chat(self, body: Mapping[str, Any]) -> dict[str, Any]:
        turn = self._check(body)
        messages = normalize(body.get("messages"))
        tools = field(body, "tools", list, [], lambda v: all(
            isinstance(t, Mapping) and isinstance(t.get("function"), Mapping) for t in v),
            "a list of {'type': 'function', 'function': {...}}")
        forced = forced_call(body.get("tool_choice"), tools)
        calls_wanted = forced is not None
        ep = self._extend_chat(messages, tools)
        completion, text = await self._sample(ep, turn, forced or "")
        content, calls = parse_tool_calls(text) if calls_wanted else (text, [])
        assert self._seen is not None
        self._seen.append({"role": "assistant", "content": content, "tool_calls": calls})
        turn_id = f"{self.key[:8]}-{len(self.segments)}-{ep.turns}"
        message: dict[str, Any] = {"role": "assistant", "content": content or (None if calls else "")}
        if calls:
            message["tool_calls"] = wire_tool_calls(calls, f"call-{turn_id}")
        finish = "tool_calls" if calls else _finish(completion)
        choice = {"index": 0, "message": message, "finish_reason": finish,
                  "logprobs": self._chat_logprobs(completion) if body.get("logprobs") else None,
                  "token_ids": list(completion.token_ids)}
        return {"id": f"chatcmpl-{turn_id}", "object": "chat.completion", "created": int(time.time()),
                "model": self.model, "choices": [choice], "usage": _usage(ep, completion)}

    async def _complete(self, body: Mapping[str, Any]) -> dict[str, Any]:
        turn = self._check(body)
        want_logprobs = field(body, "logprobs", int, None, lambda v: v >= 0, "an integer >= 0")
        ep = self._extend_tokens(body.get("prompt"))
        completion, _ = await self._sample(ep, turn)
        self._seen = None  # the chat, if any, is no longer what the sequence holds
        tok = self.renderer.tokenizer
        pieces = [tok.decode([i]) for i in completion.token_ids]
        logprobs = None
        if want_logprobs is not None:
            logprobs = {"tokens": pieces, "token_logprobs": list(completion.logprobs),
                        "top_logprobs": None,
                        "text_offset": [0, *accumulate(map(len, pieces[:-1]))]}
        choice = {"index": 0, "text": "".join(pieces), "logprobs": logprobs,
                  "finish_reason": _finish(completion), "token_ids": list(completion.token_ids)}
        return {"id": f"cmpl-{self.key[:8]}-{len(self.segments)}-{ep.turns}",
                "object": "text_completion", "created": int(time.time()), "model": self.model,
                "choices": [choice], "usage": _usage(ep, completion)}

    # ---- the token sequence ---------------------------------------------------------------

    def _extend_chat(self, messages: list[dict[str, Any]], tools: list[Any]) -> Episode:
        """The segment `messages` (and `tools`) extend, the new ones appended; else a new
        segment."""
        seen = self._seen
        if self.segments and seen is not None and len(messages) > len(seen) and \
                messages[:len(seen)] == seen and tools == self._tools:
            ep = self.segments[-1]
            new = [template_message(m) for m in messages[len(seen):]]
            try:
                delta = ep.observation_delta(new)
            except RenderError as e:
                raise RequestError(f"messages: {e}", "messages") from e
            self._append(ep, new, delta)
            seen += messages[len(seen):]
            return ep
        chat = [template_message(m) for m in messages]
        ep = self._new_segment(chat, self.renderer.prompt(chat, tools) if tools else None)
        self._seen, self._tools = list(messages), tools
        return ep

    def _extend_tokens(self, prompt: Any) -> Episode:
        """The segment a `/v1/completions` prompt (text or token ids) extends, else a new one."""
        tok = self.renderer.tokenizer
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]  # a batch of one
        is_ids = isinstance(prompt, list) and prompt and all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < tok.vocab_size for i in prompt)
        if not (is_ids or (isinstance(prompt, str) and prompt)):
            raise RequestError("prompt: must be one non-empty string or one list of token ids "
                               f"in [0, {tok.vocab_size})", "prompt")
        ep = self.segments[-1] if self.segments else None
        if ep is not None:
            done = ep.tokens
            if is_ids and prompt[:len(done)] == done and len(prompt) > len(done):
                delta = [int(i) for i in prompt[len(done):]]
            elif not is_ids and prompt.startswith(text := tok.decode(done)) and len(prompt) > len(text):
                delta = tok.encode(prompt[len(text):])
            else:
                delta = None
            if delta is not None:
                self._append(ep, [], delta)
                return ep
        return self._new_segment([], [int(i) for i in prompt] if is_ids else tok.encode(prompt))

    def _append(self, ep: Episode, messages: list[dict[str, str]], delta: list[int]) -> None:
        """The agent's turn after the model's: close the model's, then append `delta`."""
        reason = ep.limit_reached(len(delta))
        if reason:
            self.limit = reason
            limit = (f"its {self.limits.max_turns} model turns (max_turns)" if reason == "max_turns"
                     else f"its limit of {self.limits.max_tokens} tokens (max_tokens) with "
                          f"{ep.num_tokens + len(delta)} tokens")
            raise RequestError(f"messages: the episode has reached {limit}", "messages")
        self._close_turn(ep)
        ep.observe(messages, delta)

    def _new_segment(self, messages: list[dict[str, str]], token_ids: list[int] | None) -> Episode:
        """A segment of `messages`, its prompt `token_ids` when not theirs alone (tools, a
        raw prompt)."""
        if len(self.segments) >= self.max_segments:
            raise RequestError(
                f"messages: the request does not extend the episode (it rewrites earlier "
                f"messages) and the episode already has {len(self.segments)} segments, its "
                f"limit (max_segments)", "messages")
        ep = Episode(self.task, messages, self.renderer, self.limits, self.max_action_chars)
        if token_ids is not None:
            ep.observed(token_ids)  # the prompt as given replaces the one of messages alone
        if ep.num_tokens >= self.limits.max_tokens:
            self.limit = "max_tokens"
            raise RequestError(f"messages: the prompt has {ep.num_tokens} tokens, over the "
                               f"episode's limit of {self.limits.max_tokens} (max_tokens)",
                               "messages")
        if self.segments:
            self.close_segment(self.segments[-1], "rewritten")
        self.segments.append(ep)
        return ep

    # ---- sampling -------------------------------------------------------------------------

    def _check(self, body: Mapping[str, Any]) -> SamplingParams:
        """Fields every request shares: the model, n, and sampling the learner reproduces;
        the turn's sampling, its max_new_tokens as asked (capped later to the room left)."""
        model = body.get("model")
        if model != self.model:
            raise RequestError(f"model: unknown model {model!r}; this endpoint serves "
                               f"{self.model!r}", "model")
        if field(body, "n", int, 1) != 1:
            raise RequestError(f"n: only n=1 is supported, got {body['n']}", "n")
        for name, ours in (("temperature", self.sampling.temperature), ("top_p", self.sampling.top_p)):
            v = field(body, name, (int, float), ours)
            if float(v) != ours:  # the learner scores the tokens at the episode's sampling
                raise RequestError(f"{name}: this episode samples at {name} {ours:g} (the "
                                   f"learner's); got {v:g}", name)
        asked = field(body, "max_completion_tokens", int, None, lambda v: v >= 1, "an integer >= 1")
        asked = field(body, "max_tokens", int, asked, lambda v: v >= 1, "an integer >= 1")
        stop = field(body, "stop", (str, list), [], lambda v: (isinstance(v, str) and v) or (
            len(v) <= 4 and all(isinstance(s, str) and s for s in v)), "a string or up to 4 strings")
        return self.sampling.model_copy(update={
            "max_new_tokens": asked or self.sampling.max_new_tokens,
            "stop_strings": (stop,) if isinstance(stop, str) else tuple(stop)})

    async def _sample(self, ep: Episode, turn: SamplingParams, forced: str = ""
                      ) -> tuple[Completion, str]:
        """Generate the model's turn after `ep`'s tokens and take it into `ep`; the turn
        starts with `forced` (tool_choice), put in the sequence as given, not sampled."""
        if forced:
            ids = self.renderer.tokenizer.encode(forced)
            if ep.limit_reached(len(ids)):  # the turn limit was checked as the request came
                self.limit = "max_tokens"
                raise RequestError(f"tool_choice: the call it forces does not fit the episode's "
                                   f"limit of {self.limits.max_tokens} tokens (max_tokens)",
                                   "tool_choice")
            ep.observe([], ids)
        room = self.limits.max_tokens - ep.num_tokens
        turn = turn.model_copy(update={"max_new_tokens": min(turn.max_new_tokens, room)})
        t0 = time.monotonic()
        try:
            completion = await self.generate(list(ep.tokens), turn)
        except Exception as e:  # the engine's failure ends this episode, not the worker
            self.end(f"generate_error: {type(e).__name__}: {e}", "generate_error")
            raise RequestError(f"the engine failed: {type(e).__name__}: {e}", None, 500) from e
        t1 = time.monotonic()
        self._engine_s = t1 - t0
        text = ep.act({"token_ids": completion.token_ids}, forced)
        self._pending = (completion, t1 - t0, t1)
        return completion, text

    def _chat_logprobs(self, completion: Completion) -> dict[str, Any]:
        tok = self.renderer.tokenizer
        return {"content": [
            {"token": (s := tok.decode([i])), "logprob": lp, "bytes": list(s.encode()),
             "top_logprobs": []} for i, lp in zip(completion.token_ids, completion.logprobs, strict=True)
        ]}

    # ---- the end --------------------------------------------------------------------------

    def _close_turn(self, ep: Episode) -> None:
        """Attach the engine's record of `ep`'s last model turn, and the agent's time since."""
        if self._pending is not None:
            completion, model_s, done_at = self._pending
            self._pending = None
            ep.time_turn(done_at, 0.0)
            ep.sampled(completion, model_s)

    def close_segment(self, ep: Episode, reason: str, failure: str | None = None) -> None:
        self._close_turn(ep)
        ep.end(reason, failure)

    def end(self, reason: str, failure: str | None = None) -> None:
        """No more requests; the last segment ends with `reason` (and `failure`). Requests
        still in flight (an agent that timed out mid-call) are cancelled, their engine calls
        with them."""
        self.ended = True
        for task in self._serving - {asyncio.current_task()}:
            task.cancel()
        self.finish_reason = self.finish_reason or reason
        self.failure = self.failure or failure
        if self.segments:
            self.close_segment(self.segments[-1], self.finish_reason, self.failure)


def _finish(completion: Completion) -> str:
    return "length" if completion.finish_reason == "length" else "stop"


def _usage(ep: Episode, completion: Completion) -> dict[str, int]:
    n = len(completion.token_ids)
    return {"prompt_tokens": ep.num_tokens - n, "completion_tokens": n, "total_tokens": ep.num_tokens}
