"""One episode, owned in one place: its token sequence, its chat, its limits and its clock.

The env (`parity.envs.core.TextEnv`) makes an `Episode` at reset and, at every step, hands
it the model's turn and its own answer in text; the episode does everything in tokens:

    ep = Episode(task, prompt_messages, renderer, limits)  # the prompt's tokens (mask 0)
    text = ep.act(action)                    # the model's tokens as given (mask 1) and text
    delta = ep.observation_delta(messages)   # the env's answer in tokens (RenderError)
    reason = ep.limit_reached(len(delta))    # "max_turns", "max_tokens" or ""
    ep.observe(messages, delta)              # appended (mask 0), or else
    ep.end(reason, failure)                  # the episode is over

Model tokens are never re-tokenized: the sequence holds the action's token ids exactly. The
runner (`parity.envs.runner`) attaches what the engine recorded about each model turn
(`sampled`) and what gymnasium wrappers made of each observation (`observed`), and turns
the finished episode into the learner's `Trajectory`. Reward functions read the episode.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from parity.core.types import Completion, Trajectory, TurnTiming
from parity.envs.data import Task
from parity.envs.render import Renderer

Message = dict[str, str]


@dataclass(frozen=True)
class EpisodeLimits:
    """Per-episode limits. `max_turns`: model turns; `max_tokens`: prompt + model +
    observation tokens (16K–128K for real models; smaller for tiny ones); `timeout_s`:
    wall-clock seconds from reset. Hitting any of them truncates the episode; `timeout_s`
    guards against stalls (a hung sandbox or service, an overloaded engine) and so also
    marks it failed ("timeout"): the agent's own budget is its turns and tokens, and its
    code's time is its sandbox's timeout."""

    max_turns: int = 4
    max_tokens: int = 16384
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_tokens", "timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"EpisodeLimits.{name} must be > 0, got {getattr(self, name)}")


class Episode:
    """The state of one episode.

    `task`: the task played. `messages`: the whole chat so far, model turns as role
    "assistant". `tokens`, `loss_mask`, `logprobs`, `versions`: the token sequence as the
    policy sees it, as in `Trajectory` (prompt, then per turn the model's tokens and the
    observation's); a model turn's logprobs are 0.0 and its versions -1 until the runner
    attaches the engine's (`sampled`). `turns`: model turns read. `metrics`: the env's
    counters (`Response.metrics`) summed over the turns. `turn_timings`: one `TurnTiming`
    per answered turn. `reward_components`: every reward function's score by name, once
    scored; `reward_s`: the seconds they took. `finish_reason`: why the episode ended, ""
    while it runs. `failure`: None, or the kind of failure outside the agent that ended it
    (parity.envs.core lists them). `start`: `time.monotonic()` at reset.
    """

    def __init__(self, task: Task, messages: Sequence[Mapping[str, str]], renderer: Renderer,
                 limits: EpisodeLimits, max_action_chars: int = 200_000) -> None:
        """`messages`: the prompt; `max_action_chars`: longer model turns are cut (in text;
        their tokens stay whole)."""
        self.task = task
        self.messages: list[Message] = [dict(m) for m in messages]
        self.renderer = renderer
        self.limits = limits
        self.max_action_chars = max_action_chars
        self.tokens: list[int] = []
        self.loss_mask: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self._append(renderer.prompt(messages), 0)
        self._turn = slice(0, 0)  # the last model turn's place in the sequence
        self._observation_at = 0  # where the last observation (first, the prompt) starts
        self.turns = 0
        self.metrics: dict[str, float] = {}
        self.turn_timings: list[TurnTiming] = []
        self.reward_components: dict[str, float] = {}
        self.reward_s = 0.0
        self.finish_reason = ""
        self.failure: str | None = None
        self.start = time.monotonic()

    @property
    def num_tokens(self) -> int:
        """The length of the token sequence (prompt + model + observation tokens)."""
        return len(self.tokens)

    @property
    def done(self) -> bool:
        return bool(self.finish_reason)

    @property
    def last_model_text(self) -> str:
        return next((m["content"] for m in reversed(self.messages) if m["role"] == "assistant"), "")

    # ---- the model's turn -----------------------------------------------------------------

    def act(self, action: Any, prefix: str = "") -> str:
        """Take the model's turn from a step's action: its token ids, exactly as given, join
        the sequence (mask 1) and its text the chat; returns the text. `prefix`: the text
        the turn began with that the model did not sample (tokens the env put in the
        sequence first, mask 0). Anything malformed becomes an empty turn, never an error."""
        text, ids = self._read_action(action)
        text = prefix + text
        self.turns += 1
        self._turn = slice(len(self.tokens), len(self.tokens) + len(ids))
        self._append(ids, 1)
        self._observation_at = len(self.tokens)
        self.messages.append({"role": "assistant", "content": text})
        return text

    def sampled(self, completion: Completion, model_s: float) -> None:
        """Attach what the engine recorded about the model turn last taken (`completion`,
        generated in `model_s` seconds): its tokens' logprobs and policy versions."""
        if self.tokens[self._turn] != list(completion.token_ids):
            raise ValueError("the env took a different model turn than the engine sampled "
                             "(did a wrapper change the action?)")
        self.logprobs[self._turn] = completion.logprobs
        self.versions[self._turn] = completion.versions
        self.turn_timings[-1] = replace(self.turn_timings[-1], model_s=model_s)

    # ---- the env's answer -----------------------------------------------------------------

    def seconds_left(self, now: float) -> float:
        """Seconds left before `limits.timeout_s` runs out, at `now` (time.monotonic)."""
        return self.limits.timeout_s - (now - self.start)

    def observation_delta(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """The tokens that would append `messages` after the last model turn (RenderError if
        the chat template cannot)."""
        return self.renderer.observation_delta(messages, self.tokens[self._turn])

    def limit_reached(self, delta_tokens: int) -> str:
        """"max_turns" or "max_tokens" if the episode must end before an observation of
        `delta_tokens` tokens (no room left for the model's next turn), else ""."""
        if self.turns >= self.limits.max_turns:
            return "max_turns"
        if self.num_tokens + delta_tokens >= self.limits.max_tokens:
            return "max_tokens"
        return ""

    def observe(self, messages: Sequence[Mapping[str, str]], delta: Sequence[int]) -> None:
        """Append the env's answer: `messages` to the chat, `delta` to the sequence (mask 0)."""
        self.messages += [dict(m) for m in messages]
        self._append(delta, 0)

    def observed(self, token_ids: Sequence[int]) -> None:
        """The last observation as the policy got it, after any gymnasium wrappers: its
        tokens replace the env's own."""
        at = self._observation_at
        del self.tokens[at:], self.loss_mask[at:], self.logprobs[at:], self.versions[at:]
        self._append(token_ids, 0)

    def count(self, metrics: Mapping[str, float]) -> None:
        for k, v in metrics.items():
            self.metrics[k] = self.metrics.get(k, 0.0) + v

    def time_turn(self, start: float, sandbox_s: float) -> None:
        """Record the env's time for the turn it began answering at `start` (monotonic)."""
        self.turn_timings.append(TurnTiming(0.0, time.monotonic() - start, sandbox_s))

    def end(self, reason: str, failure: str | None = None) -> None:
        """The episode is over: why, and the kind of failure if it was one."""
        self.finish_reason = reason
        self.failure = failure

    def trajectory(self, group_id: str, reward: float) -> Trajectory:
        """The episode as the learner sees it, with `reward` (the env's, through wrappers)."""
        return Trajectory(
            group_id=group_id, tokens=list(self.tokens), loss_mask=list(self.loss_mask),
            logprobs=list(self.logprobs), versions=list(self.versions), reward=float(reward),
            reward_components=dict(self.reward_components), num_turns=self.turns,
            finish_reason=self.finish_reason, failure=self.failure, task=dict(self.task),
            messages=[dict(m) for m in self.messages], metrics=dict(self.metrics),
            turn_timings=list(self.turn_timings), reward_s=self.reward_s,
        )

    # ---- helpers --------------------------------------------------------------------------

    def _append(self, ids: Sequence[int], mask: int) -> None:
        n = len(ids)
        self.tokens += [int(i) for i in ids]
        self.loss_mask += [mask] * n
        self.logprobs += [0.0] * n
        self.versions += [-1] * n

    def _read_action(self, action: Any) -> tuple[str, list[int]]:
        """(text, token ids) of a model turn; anything malformed becomes empty, never raises.
        A plain string is a turn of people and oracles: its tokens are the encoded text plus
        the end-of-turn token."""
        tok = self.renderer.tokenizer
        if isinstance(action, str):
            return action[: self.max_action_chars], [*tok.encode(action), tok.eos_token_id]
        if isinstance(action, Mapping):
            text, raw_ids = action.get("text"), action.get("token_ids")
        else:
            text, raw_ids = getattr(action, "text", None), getattr(action, "token_ids", None)
        try:
            ids = [int(i) for i in raw_ids] if raw_ids is not None else []
        except (TypeError, ValueError):
            ids = []
        if not isinstance(text, str):
            end = len(ids) - 1 if ids and ids[-1] in tok.stop_token_ids else len(ids)
            text = tok.decode(ids[:end])
        for stop in tok.stop_token_ids:  # the end-of-turn token is not part of the content
            s = tok.decode([stop])
            if s and text.endswith(s):
                text = text[: -len(s)]
                break
        return text[: self.max_action_chars], ids
