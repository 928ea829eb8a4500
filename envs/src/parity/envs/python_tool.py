"""`parity/PythonTool-v0`: the model writes Python, a sandbox runs it, the model answers.

    user       Q: 5831*47=?
    assistant  <py>print(5831*47)</py>
    tool       274057
    assistant  <ans>274057</ans>              -> reward 1 (numbers compare by value)

The code runs in a `parity.sandboxes` sandbox opened on the episode's first call (a fresh
process per call, or one persistent REPL per episode with `persistent=True`); its output
comes back cut to head and tail. What the code does is the model's: an exception, a timeout,
an exit, a REPL it ends, or a call the sandbox refuses as bad input is shown to the model. A
sandbox that cannot start, dies or is lost is not the model's doing: the episode ends there,
failed ("sandbox"), and the trainer leaves it out; the next episode gets a new sandbox.

The default synthetic tasks (big-number arithmetic and list processing) are not reliably
solvable without the tool; `difficulty` (>= 0; 0 is 3-digit times 1-digit) sets number
sizes and list lengths.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from parity.envs.answers import head_tail, same_answer
from parity.envs.core import Response, TextEnv
from parity.envs.data import Task
from parity.envs.episode import Episode, EpisodeLimits, Message
from parity.envs.held_sandbox import HeldSandbox
from parity.envs.rubric import Criterion, Rubric
from parity.envs.tools import ToolCall, extract_tag, make_parser

if TYPE_CHECKING:
    from parity.sandboxes import Limits, SandboxPool

log = logging.getLogger(__name__)

KINDS = ("mul", "add", "sumsq", "sorted")
ANSWER_TAG = "ans"


def _ints(rng: np.random.Generator, n: int, lo: int, hi: int) -> list[int]:
    return [int(x) for x in rng.integers(lo, hi, size=n)]


def generate_task(rng: np.random.Generator, difficulty: int, kinds: tuple[str, ...] = KINDS) -> Task:
    """One task: `question` (a Python expression to evaluate), `answer`, and `code`, the
    expression the oracle prints."""
    kind = kinds[int(rng.integers(len(kinds)))]
    d = difficulty
    if kind == "mul":
        a, b = _ints(rng, 1, 10 ** (d + 2), 10 ** (d + 3))[0], _ints(rng, 1, 10**d, 10 ** (d + 1))[0]
        code, value = f"{a}*{b}", a * b
    elif kind == "add":
        a, b = _ints(rng, 2, 10 ** (3 * d + 3), 10 ** (3 * d + 4))
        code, value = f"{a}+{b}", a + b
    elif kind == "sumsq":
        xs = _ints(rng, 3 + 2 * d, 1, 100)
        code, value = f"sum(x*x for x in {xs})", sum(x * x for x in xs)
    else:
        xs = _ints(rng, 4 + 2 * d, 1, 1000)
        k = int(rng.integers(len(xs)))
        code, value = f"sorted({xs})[{k}]", sorted(xs)[k]
    return {"question": f"Q: {code}=?", "answer": str(value), "code": code, "kind": kind}


def _limits(limits: dict[str, Any]) -> Limits:
    from parity.sandboxes import Limits

    return Limits(**{"timeout_s": 10, **limits})


class PythonToolEnv(TextEnv):
    """Multi-turn: write Python in a sandbox, read its output, answer in <ans>...</ans>."""

    def __init__(
        self,
        *,
        difficulty: int = 1,
        kinds: tuple[str, ...] = KINDS,
        tool_format: str = "tagged",
        persistent: bool = False,
        backend: str = "local",
        sandbox_limits: dict[str, Any] | None = None,
        sandbox_factory: Callable[[], Any] | None = None,
        sandbox_pool: Any = None,
        output_chars: int = 2000,
        sandbox_latency_s: float = 0.0,
        tool_role: str = "tool",
        system_prompt: str | None = None,
        limits: EpisodeLimits | None = None,
        **kwargs: Any,
    ) -> None:
        """`tool_format`: "tagged" (<py>code</py>) or "hermes" (<tool_call>{json}</tool_call>,
        tool "python", argument "code"). `persistent`: one REPL per episode, state kept.
        `backend`/`sandbox_limits`: passed to `parity.sandboxes.open_sandbox` (limits as
        keyword arguments of `Limits`); `sandbox_factory` (a callable returning a sandbox)
        replaces both; `sandbox_pool` (a `parity.sandboxes.SandboxPool`) lends one sandbox
        per episode instead, returned on reset/close.
        `output_chars`: tool output shown to the model (head + tail).
        `sandbox_latency_s`: seconds each call waits before it runs, as the round trip to a
        remote sandbox service would (network, queueing); the wait uses no CPU and counts in
        the call's sandbox time. 0: none (the sandbox runs on this machine)."""
        unknown = [k for k in kinds if k not in KINDS]
        if unknown or not kinds:
            raise ValueError(f"kinds: unknown {unknown}; choose from {list(KINDS)}")
        if difficulty < 0:
            raise ValueError(f"difficulty must be >= 0, got {difficulty}")
        if not sandbox_latency_s >= 0:
            raise ValueError(f"sandbox_latency_s must be >= 0 seconds, got {sandbox_latency_s}")
        super().__init__(limits=limits or EpisodeLimits(max_turns=4), **kwargs)
        self.difficulty = difficulty
        self.kinds = kinds
        self.parser = make_parser(tool_format)
        self.persistent = persistent
        self.output_chars = output_chars
        self.sandbox_latency_s = sandbox_latency_s
        self.tool_role = tool_role
        self.system_prompt = system_prompt
        self._held = HeldSandbox(sandbox_factory or self._open_default(backend, sandbox_limits or {}),
                                 sandbox_pool)
        self._session: Any = None
        self.rubric = Rubric([
            Criterion(self._correct, 1.0, "correct"),
            Criterion(lambda ep: float(ep.metrics.get("tool_calls", 0) > 0), 0.0, "used_tool"),
        ])

    @staticmethod
    def _open_default(backend: str, limits: dict[str, Any]) -> Callable[[], Any]:
        def open_() -> Any:
            from parity.sandboxes import open_sandbox

            return open_sandbox(backend, limits=_limits(limits))

        return open_

    @classmethod
    def pool_for(cls, size: int, *, backend: str = "local",
                 sandbox_limits: dict[str, Any] | None = None, **_: Any) -> SandboxPool:
        """A `parity.sandboxes.SandboxPool` of `size` warm sandboxes like the ones episodes
        made with these kwargs open, for their `sandbox_pool`: a rollout worker keeps one
        and its episodes lease from it instead of starting and stopping a sandbox each."""
        from parity.sandboxes import SandboxPool

        return SandboxPool(backend, size=size, limits=_limits(sandbox_limits or {}))

    def generate_task(self, rng: np.random.Generator) -> Task:
        return generate_task(rng, self.difficulty, self.kinds)

    def prompt_messages(self, task: Task) -> list[Message]:
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*system, {"role": "user", "content": str(task["question"])}]

    async def respond(self, text: str) -> Response:
        if extract_tag(text, ANSWER_TAG) is not None:
            return Response(done=True, reason="answer")
        parsed = self.parser.parse(text)
        error = parsed.error
        if error is None and parsed.call is None:
            error = f"error: no tool call and no <{ANSWER_TAG}>answer</{ANSWER_TAG}> found"
        elif parsed.call is not None and (
            parsed.call.name != "python" or not isinstance(parsed.call.arguments.get("code"), str)
        ):
            error = 'error: the only tool is "python" with one string argument "code"'
        if error is not None:
            return Response([{"role": "user", "content": error}], metrics={"parse_errors": 1})
        assert parsed.call is not None
        t0 = time.monotonic()
        if self.sandbox_latency_s:
            await asyncio.sleep(self.sandbox_latency_s)
        try:
            output, metrics = await self._execute(parsed.call.arguments["code"])
        except Exception as e:  # not the model's doing: this episode cannot go on
            log.warning("sandbox failed: %s: %s", type(e).__name__, e)
            await self.release()
            return Response(done=True, reason=f"sandbox_error: {type(e).__name__}: {e}",
                            failure="sandbox", metrics={"tool_calls": 1},
                            sandbox_s=time.monotonic() - t0)
        return Response([{"role": self.tool_role, "content": output}],
                        metrics={"tool_calls": 1, **metrics}, sandbox_s=time.monotonic() - t0)

    async def _execute(self, code: str) -> tuple[str, dict[str, float]]:
        """(output for the model, counters). A call the sandbox refuses as bad input is
        shown to the model; any other error of the sandbox (it could not start, died, was
        lost) is raised."""
        from parity.sandboxes import SandboxInputError

        try:
            sandbox = await self._held.get()
            if self.persistent:
                if self._session is None:
                    self._session = sandbox.python_session()
                result = await self._session.arun(code)
            else:
                result = await sandbox.arun_python(code)
        except SandboxInputError as e:
            return head_tail(f"error: {e}", self.output_chars), {"rejected_calls": 1}
        notes = [n for n, on in (("timed out", result.timed_out), ("out of memory", result.oom),
                                 ("output truncated", result.output_truncated)) if on]
        if result.exit_code not in (0, None):
            notes.append(f"exit code {result.exit_code}")
        metrics: dict[str, float] = {}
        if result.error:
            notes.append(str(result.error))
            if self.persistent:  # the REPL is gone; the next call starts a new one
                await self.release()
                metrics["repl_restarts"] = 1
        out = result.stdout + result.stderr + (f"[{'; '.join(notes)}]" if notes else "")
        return head_tail(out, self.output_chars), metrics

    async def release(self) -> None:
        self._session = None
        await self._held.release()

    def oracle(self) -> str:
        ep = self.episode
        assert ep is not None
        tool_outputs = [m["content"] for m in ep.messages if m["role"] == self.tool_role]
        if "code" in ep.task and not tool_outputs:
            return self.parser.format(ToolCall("python", {"code": f"print({ep.task['code']})"}))
        answer = tool_outputs[-1].strip() if tool_outputs else str(ep.task["answer"])
        return f"<{ANSWER_TAG}>{answer}</{ANSWER_TAG}>"

    @staticmethod
    def _correct(ep: Episode) -> float:
        answer = extract_tag(ep.last_model_text, ANSWER_TAG)
        return float(answer is not None and same_answer(answer, str(ep.task["answer"])))
