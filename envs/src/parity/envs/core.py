"""The environment interface: a gymnasium `Env`, token-in-token-out, async first.

An episode is a chat. A new env subclasses `TextEnv` and fills in five hooks, all in text
(see docs/environments.md), plus `async release()` if it holds per-episode resources:

    generate_task(rng) -> Task          seeded synthetic task (used when no task data is given)
    prompt_messages(task) -> messages   the first prompt
    async respond(text) -> Response     the env's answer to one model turn
    oracle() -> str                     the ideal next model turn (for SFT demonstrations)
    rubric: Rubric                      scored once, when the episode ends

Everything in tokens is the episode's (`parity.envs.episode.Episode`, `self.episode`): the
prompt's tokens, the model's tokens exactly as sampled (never re-tokenized), the
observations' token deltas, the limits. What `reset` and `step` return:

    reset(seed, options) -> (obs, info)
      obs["messages"]     tuple of {"role", "content"} dicts: the prompt
      obs["token_ids"]    tuple of ints: the prompt's tokens, ending in the generation prompt
      info["task"]        the task dict played
      info["prompt_tokens"]  len(obs["token_ids"])
      options: {"task": a task dict} or {"task_index": i}; otherwise a task drawn with the
      seeded `np_random` (from the task data, or `generate_task`)
    step(action) -> (obs, reward, terminated, truncated, info)
      action              {"token_ids": the model's turn, ending in its stop token; "text":
                          optional, else decoded from the tokens}; a plain string is taken
                          for people and oracles: its tokens are the encoded text plus EOS
      obs["messages"]     the env's answer as chat messages; () when the episode ended
      obs["token_ids"]    the tokens to append after the model's turn: the rest of the chat
                          template, the answer and the next generation prompt; () when the
                          episode ended
      reward              the rubric's reward when the episode ended, else 0.0; 0.0 too
                          when a failure ended it (such an episode is not scored)
      terminated          the task is over (`Response.done`), not failed
      truncated           it ended otherwise: a limit, or a failure
      info["turn"]        the model turns so far
      and when the episode ended:
      info["finish_reason"]      why ("answer", "max_turns", "max_tokens", "timeout", ...)
      info["num_tokens"]         the sequence's length (prompt + model + observations)
      info["reward_components"]  every reward function's score by name (weight 0 too)
      info["reward_errors"]      reward functions that raised or returned non-finite values
      info["tool_calls"], info["parse_errors"]  those counters of `info["metrics"]`, as ints
      info["metrics"]            the env's counters (`Response.metrics`) summed over turns
    `info` is for people and gymnasium code: the runner and the trainer read nothing from it.

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
from parity.envs.episode import Episode, EpisodeLimits, Message
from parity.envs.render import Renderer
from parity.envs.rubric import Rubric, RubricScore
from parity.envs.tokenizer import Tokenizer, build_project_tokenizer, load_tokenizer

log = logging.getLogger(__name__)

Observation = dict[str, Any]
T = TypeVar("T")

# The event loop a wrapper chain was entered from; set only in the env's wrapper thread.
_CALLER_LOOP: contextvars.ContextVar[asyncio.AbstractEventLoop | None] = contextvars.ContextVar(
    "parity_env_caller_loop", default=None)


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
        """Start an episode (the module docstring defines the options and what it returns)."""
        gym.Env.reset(self, seed=seed)
        await self.release()
        task = self.draw_task(options or {})
        messages = self.prompt_messages(task)
        ep = self.episode = Episode(task, messages, self.renderer, self.limits, self.max_action_chars)
        obs = {"messages": tuple(dict(m) for m in messages), "token_ids": tuple(ep.tokens)}
        return obs, {"task": dict(task), "prompt_tokens": ep.num_tokens}

    def draw_task(self, options: Mapping[str, Any]) -> Task:
        """The task of an episode reset with `options` (the module docstring defines them),
        drawn with the seeded `np_random` when they name none."""
        if "task" in options:
            return check_rows([options["task"]], self.required_fields, "options['task']",
                              self.field_types)[0]
        if self.tasks is not None:
            return self.tasks[options.get("task_index", int(self.np_random.integers(len(self.tasks))))]
        return self.generate_task(self.np_random)

    async def astep(self, action: Any) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        """One model turn. Never raises on bad actions or env failures: a bad action ends the
        turn with an error observation; a failure outside the agent ends the episode, failed
        (`Episode.failure`) and unscored (reward 0 that the trainer does not use)."""
        ep = self.episode
        if ep is None or ep.done:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        t0 = time.monotonic()
        text = ep.act(action)
        resp: Response | None = None
        delta: list[int] = []
        reason, failure = "", None
        try:
            left = ep.seconds_left(t0)
            if left <= 0:
                reason = failure = "timeout"
            else:
                resp = await asyncio.wait_for(self.respond(text), timeout=left)
                ep.count(resp.metrics)
                if resp.failure is not None:
                    reason, failure = resp.reason, resp.failure
                elif resp.done:
                    reason = resp.reason
                else:
                    delta = ep.observation_delta(resp.messages)
        except TimeoutError:
            reason = failure = "timeout"
        except Exception:  # an env bug must not take the rollout worker down
            log.exception("env %s failed on turn %d", type(self).__name__, ep.turns)
            reason = failure = "env_error"
        terminated = resp is not None and resp.done and failure is None
        reason = reason or ep.limit_reached(len(delta))
        sandbox_s = resp.sandbox_s if resp else 0.0
        if not reason:
            assert resp is not None
            ep.observe(resp.messages, delta)
            ep.time_turn(t0, sandbox_s)
            obs = {"messages": tuple(dict(m) for m in resp.messages), "token_ids": tuple(delta)}
            return obs, 0.0, False, False, {"turn": ep.turns}
        ep.end(reason, failure)
        t1 = time.monotonic()
        # a failed episode is not scored: its reward would not be the agent's, and reward
        # functions may need what failed
        score = RubricScore(0.0) if ep.failure else await self.rubric.score(ep)
        if score.counted_errors and ep.failure is None:
            ep.failure = "reward_error"
        ep.reward_components = dict(score.components)
        ep.reward_s = time.monotonic() - t1
        await self.release()  # e.g. a pooled sandbox goes back as soon as the episode ends
        ep.time_turn(t0, sandbox_s)
        info = {
            "turn": ep.turns,
            "finish_reason": reason,
            "num_tokens": ep.num_tokens,
            "reward_components": dict(score.components),
            "reward_errors": score.errors,
            "tool_calls": int(ep.metrics.get("tool_calls", 0)),
            "parse_errors": int(ep.metrics.get("parse_errors", 0)),
            "metrics": dict(ep.metrics),
        }
        return {"messages": (), "token_ids": ()}, float(score.reward), terminated, not terminated, info

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
        if self.episode is None or self.episode.done:
            raise RuntimeError("oracle_action() needs a running episode; call reset() first")
        return self.oracle()

    # ---- helpers --------------------------------------------------------------------------

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
