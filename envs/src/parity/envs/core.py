"""The environment base class: a gymnasium `Env`, token-in-token-out, async first.

An episode is a chat. `reset` returns the prompt; each `step` takes one model turn and
returns the observation both as chat messages and as the exact token delta to append to the
token sequence (loss mask 0). Model tokens are never re-tokenized.

Observation: {"messages": tuple of {"role", "content"} dicts, "token_ids": tuple of ints}
Action: {"text": str, "token_ids": sequence of ints} (the model's completion; `text` may be
omitted and is then decoded from the tokens). A plain string is accepted too, for people and
oracles: its tokens are the encoded text plus the end-of-turn token.

A new env subclasses `TextEnv` and fills in five hooks (see docs/environments.md), plus
`async release()` if it holds per-episode resources:

    generate_task(rng) -> Task          seeded synthetic task (used when no task data is given)
    prompt_messages(task) -> messages   the first prompt
    async respond(text) -> Response     the env's answer to one model turn
    oracle() -> str                     the ideal next model turn (for SFT demonstrations)
    rubric: Rubric                      scored once, when the episode ends

An episode that ends for a reason outside the agent is marked failed (`Episode.failure`,
then `Trajectory.failure`) with its kind; the trainer leaves it out (docs/training.md §2):

    "sandbox"         its sandbox could not start, died or was lost (`Response.failure`)
    "env_error"       the env's `respond` raised
    "reward_error"    a reward function of weight ≠ 0 raised or returned a non-finite value
    "timeout"         the episode's wall-clock limit (`EpisodeLimits.timeout_s`) ran out
    "generate_error"  the engine raised (set by the runner)

An env may name other kinds. What the agent did (a malformed tool call, code that fails or
times out in its sandbox, a wrong answer, running out of turns or tokens) is never a failure:
it is scored as usual.

`areset`/`astep` are the primary path (a rollout worker runs many episodes concurrently on
one event loop); `reset`/`step` run them on the env's private event loop, or, called through
gymnasium wrappers from `through_wrappers` (what the runner does), on the caller's loop.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from parity.envs.data import Task, check_rows, load_tasks
from parity.envs.render import Renderer
from parity.envs.rubric import Rubric, RubricScore
from parity.model.tokenizer import Tokenizer, build_project_tokenizer, load_tokenizer

log = logging.getLogger(__name__)

Message = dict[str, str]
Observation = dict[str, Any]
T = TypeVar("T")

# The event loop a wrapper chain was entered from; set only in the env's wrapper thread.
_CALLER_LOOP: contextvars.ContextVar[asyncio.AbstractEventLoop | None] = contextvars.ContextVar(
    "parity_env_caller_loop", default=None)


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


@dataclass
class Response:
    """The env's answer to one model turn.

    `messages`: the observation for the model (unused when `done` or failed). `done`: the
    task is over (the episode terminates). `reason`: why it ended (the finish_reason), when
    done or failed. `failure`: the turn failed for a reason outside the agent (its sandbox
    died, a service it needs is gone): the kind, e.g. "sandbox"; the episode ends there,
    truncated and marked failed, and is not scored. `metrics`: counters for this turn,
    summed over the episode (e.g. tool_calls, parse_errors). `sandbox_s`: seconds spent in
    a sandbox this turn.
    """

    messages: list[Message] = field(default_factory=list)
    done: bool = False
    reason: str = "done"
    failure: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    sandbox_s: float = 0.0


@dataclass
class Episode:
    """The state of one episode; reward functions read it.

    `messages` is the whole chat so far, model turns as role "assistant". `num_tokens` is the
    length of the token sequence (prompt + model + observation tokens). `turn_timings` has
    per turn `env_s` (all of the env's time, reward included on the last turn) and
    `sandbox_s`; `reward_s` is the rubric's time. `failure`: None, or the kind of failure
    outside the agent that ended the episode (the module docstring lists them).
    """

    task: Task
    messages: list[Message]
    num_tokens: int
    start: float = field(default_factory=time.monotonic)
    turns: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    turn_timings: list[dict[str, float]] = field(default_factory=list)
    finish_reason: str = ""
    failure: str | None = None
    reward_s: float = 0.0

    @property
    def last_model_text(self) -> str:
        return next((m["content"] for m in reversed(self.messages) if m["role"] == "assistant"), "")

    def time_turn(self, start: float, sandbox_s: float) -> None:
        """Record the env's time for the turn that began at `start` (monotonic seconds)."""
        self.turn_timings.append({"env_s": time.monotonic() - start, "sandbox_s": sandbox_s})

    def count(self, metrics: Mapping[str, float]) -> None:
        for k, v in metrics.items():
            self.metrics[k] = self.metrics.get(k, 0.0) + v


class TextSpace(spaces.Space[str]):
    """Any string of at most `max_length` characters (gymnasium's Text only allows a charset)."""

    def __init__(self, max_length: int, seed: int | None = None) -> None:
        self.max_length = max_length
        super().__init__(None, None, seed)

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        n = int(self.np_random.integers(0, min(self.max_length, 64) + 1))
        # any code point below the surrogates: random garbage is a valid action
        return "".join(map(chr, self.np_random.integers(1, 0xD7FF, size=n)))

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length


class MessagesSpace(spaces.Space[tuple]):
    """A tuple of chat messages, each a dict with string `role` and `content`."""

    def __init__(self, seed: int | None = None) -> None:
        super().__init__(None, None, seed)

    def sample(self, mask: Any = None, probability: Any = None) -> tuple:
        role = ("user", "tool")[int(self.np_random.integers(2))]
        return ({"role": role, "content": str(self.np_random.integers(10**6))},)

    def contains(self, x: Any) -> bool:
        return isinstance(x, tuple) and all(
            isinstance(m, Mapping) and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
            for m in x
        )


class TextEnv(gym.Env[Observation, Any]):
    """Base class of token-in-token-out chat environments (see the module docstring)."""

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 (gymnasium's convention)
    required_fields: tuple[str, ...] = ("question", "answer")
    field_types: ClassVar[dict[str, tuple[type, ...]]] = {"question": (str,), "answer": (str, int, float)}
    rubric: Rubric

    def __init__(
        self,
        *,
        tokenizer: Tokenizer | str | Path | None = None,
        limits: EpisodeLimits | Mapping[str, Any] | None = None,
        tasks: Sequence[Task] | str | None = None,
        max_action_chars: int = 200_000,
    ) -> None:
        """`tokenizer`: a Tokenizer, a local HF tokenizer dir, or None for the project one.
        `limits`: EpisodeLimits or a dict of its fields (as a TOML config gives it).
        `tasks`: task rows, a JSONL/Parquet path or hub dataset name, or None for the
        synthetic generator. `max_action_chars`: longer model turns are cut before parsing."""
        if tokenizer is None:
            tokenizer = build_project_tokenizer()
        elif isinstance(tokenizer, str | Path):
            tokenizer = load_tokenizer(tokenizer)
        self.tokenizer = tokenizer
        self.renderer = Renderer(tokenizer)
        if isinstance(limits, Mapping):
            limits = EpisodeLimits(**limits)
        self.limits = limits or EpisodeLimits()
        if isinstance(tasks, str):
            tasks = load_tasks(tasks, convert=self.convert_row, required=self.required_fields,
                               types=self.field_types)
        elif tasks is not None:
            tasks = check_rows(tasks, self.required_fields, "tasks", self.field_types)
        self.tasks: list[Task] | None = tasks
        self.max_action_chars = max_action_chars
        tokens = spaces.Sequence(spaces.Discrete(tokenizer.vocab_size))
        self.action_space = spaces.Dict({"text": TextSpace(max_action_chars), "token_ids": tokens})
        self.observation_space = spaces.Dict({"messages": MessagesSpace(), "token_ids": tokens})
        self.episode: Episode | None = None
        self._done = True
        self._timings = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wrapper_thread: ThreadPoolExecutor | None = None

    # ---- hooks for subclasses -------------------------------------------------------------

    def generate_task(self, rng: np.random.Generator) -> Task:
        """A synthetic task drawn with `rng` (the env's seeded `np_random`)."""
        raise NotImplementedError

    def prompt_messages(self, task: Task) -> list[Message]:
        """The chat that starts an episode on `task`."""
        raise NotImplementedError

    async def respond(self, text: str) -> Response:
        """React to the model's turn `text` (already appended to `self.episode.messages`)."""
        raise NotImplementedError

    def oracle(self) -> str:
        """The ideal text of the next model turn, given `self.episode`."""
        raise NotImplementedError

    async def release(self) -> None:
        """Free per-episode resources (sandboxes); awaited when an episode ends (after the
        rubric, which may still use them), on reset and on close. Must be idempotent."""

    def convert_row(self, row: Task) -> Task:
        """Map one row of a task file to this env's task fields (identity by default)."""
        return row

    # ---- the gymnasium API ----------------------------------------------------------------

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        """Start an episode. options: {"task": a task dict} or {"task_index": i}, and
        {"timings": True} for each step's seconds in its info (off by default: gymnasium's
        checker wants equal infos for equal seeds and actions)."""
        gym.Env.reset(self, seed=seed)
        await self.release()
        options = options or {}
        self._timings = bool(options.get("timings"))
        if "task" in options:
            task = check_rows([options["task"]], self.required_fields, "options['task']",
                              self.field_types)[0]
        elif self.tasks is not None:
            i = options.get("task_index", int(self.np_random.integers(len(self.tasks))))
            task = self.tasks[i]
        else:
            task = self.generate_task(self.np_random)
        messages = self.prompt_messages(task)
        prompt = self.renderer.prompt(messages)
        self.episode = Episode(task=task, messages=[dict(m) for m in messages], num_tokens=len(prompt))
        self._done = False
        obs = {"messages": tuple(dict(m) for m in messages), "token_ids": tuple(prompt)}
        return obs, {"task": dict(task), "prompt_tokens": len(prompt)}

    async def astep(self, action: Any) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        """One model turn. Never raises on bad actions or env failures: a bad action ends the
        turn with an error observation; a failure outside the agent ends the episode, failed
        (`Episode.failure`) and unscored (reward 0 that the trainer does not use)."""
        ep = self.episode
        if ep is None or self._done:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        t0 = time.monotonic()
        text, ids = self._read_action(action)
        ep.turns += 1
        ep.num_tokens += len(ids)
        ep.messages.append({"role": "assistant", "content": text})
        resp: Response | None = None
        delta: list[int] = []
        remaining = self.limits.timeout_s - (t0 - ep.start)
        reason = ""
        try:
            if remaining <= 0:
                reason = ep.failure = "timeout"
            else:
                resp = await asyncio.wait_for(self.respond(text), timeout=remaining)
                ep.count(resp.metrics)
                if resp.failure is not None:
                    reason, ep.failure = resp.reason, resp.failure
                elif resp.done:
                    reason = resp.reason
                else:
                    delta = self.renderer.observation_delta(resp.messages, ids)
        except TimeoutError:
            reason = ep.failure = "timeout"
        except Exception:  # an env bug must not take the rollout worker down
            log.exception("env %s failed on turn %d", type(self).__name__, ep.turns)
            reason = ep.failure = "env_error"
        terminated = resp is not None and resp.done and ep.failure is None
        if not reason:
            if ep.turns >= self.limits.max_turns:
                reason = "max_turns"
            elif ep.num_tokens + len(delta) >= self.limits.max_tokens:
                reason = "max_tokens"  # no room left for the model's next turn
        if not reason:
            assert resp is not None
            ep.messages += [dict(m) for m in resp.messages]
            ep.num_tokens += len(delta)
            ep.time_turn(t0, resp.sandbox_s)
            obs = {"messages": tuple(dict(m) for m in resp.messages), "token_ids": tuple(delta)}
            return obs, 0.0, False, False, self._turn_info(ep, text)
        self._done = True
        ep.finish_reason = reason
        t1 = time.monotonic()
        # a failed episode is not scored: its reward would not be the agent's, and reward
        # functions may need what failed
        score = RubricScore(0.0) if ep.failure else await self.rubric.score(ep)
        if score.counted_errors and ep.failure is None:
            ep.failure = "reward_error"
        ep.reward_s = time.monotonic() - t1
        await self.release()  # e.g. a pooled sandbox goes back as soon as the episode ends
        ep.time_turn(t0, resp.sandbox_s if resp else 0.0)
        info = {
            **self._turn_info(ep, text),
            "finish_reason": reason,
            "num_tokens": ep.num_tokens,
            "reward_components": dict(score.components),
            "reward_errors": score.errors,
            "tool_calls": int(ep.metrics.get("tool_calls", 0)),
            "parse_errors": int(ep.metrics.get("parse_errors", 0)),
            "metrics": dict(ep.metrics),
        }
        if self._timings:
            info["timings"]["reward_s"] = ep.reward_s
        obs = {"messages": (), "token_ids": ()}
        return obs, float(score.reward), terminated, not terminated, info

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        return self._run(self.areset(seed=seed, options=options))

    def step(self, action: Any) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        return self._run(self.astep(action))

    async def through_wrappers(self, call: Callable[[], T]) -> T:
        """`call()`, a synchronous reset or step through gymnasium wrappers over this env, run
        on this env's own thread so the wrappers' code runs as written, while this env's
        coroutine runs back on the caller's event loop (where its sandboxes and clients live,
        shared by the other episodes on it). The thread is the env's; `close()` ends it."""
        if self._wrapper_thread is None:
            self._wrapper_thread = ThreadPoolExecutor(1, thread_name_prefix="parity-env-wrappers")
        loop = asyncio.get_running_loop()
        ctx = contextvars.copy_context()
        ctx.run(_CALLER_LOOP.set, loop)
        return await loop.run_in_executor(self._wrapper_thread, ctx.run, call)

    def close(self) -> None:
        """Release resources; safe to call twice. Inside a running event loop it blocks
        that loop until the release is done (there, prefer `await env.release()`)."""
        if self._wrapper_thread is not None:
            self._wrapper_thread.shutdown(wait=False)
            self._wrapper_thread = None
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            loop = self._loop or asyncio.new_event_loop()
            loop.run_until_complete(self.release())
            loop.close()
            self._loop = None
            return
        worker = threading.Thread(target=asyncio.run, args=(self.release(),))
        worker.start()
        worker.join()

    def oracle_action(self) -> str:
        """The oracle's next model turn for the current episode."""
        if self.episode is None or self._done:
            raise RuntimeError("oracle_action() needs a running episode; call reset() first")
        return self.oracle()

    # ---- helpers --------------------------------------------------------------------------

    def _turn_info(self, ep: Episode, text: str) -> dict[str, Any]:
        """What every step's info holds: the turn's number, the model's turn as the env read
        it (`text`: the chat message), and with the `timings` reset option its seconds."""
        info: dict[str, Any] = {"turn": ep.turns, "text": text}
        if self._timings:
            info["timings"] = dict(ep.turn_timings[-1])
        return info

    def _run(self, coro: Any) -> Any:
        caller = _CALLER_LOOP.get()
        if caller is not None:  # through wrappers, on the env's `through_wrappers` thread
            return asyncio.run_coroutine_threadsafe(coro, caller).result()
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
            return self._loop.run_until_complete(coro)
        coro.close()
        raise RuntimeError("reset()/step() inside a running event loop; await areset()/astep()")

    def _read_action(self, action: Any) -> tuple[str, list[int]]:
        """(text, token ids) of a model turn; anything malformed becomes empty, never raises."""
        tok = self.tokenizer
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
