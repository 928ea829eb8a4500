"""`parity/Math-v0`: math problems answered in `\\boxed{}`, checked by math-verify.

Single-turn by default (the episode terminates after the model's answer). With
`multi_turn=True` a wrong or missing answer gets feedback and another try, up to
`limits.max_turns` turns. Equivalent forms score alike (`1/2`, `0.5`, `\\frac{1}{2}`).

Synthetic tasks (seeded, offline): arithmetic, fractions and simple linear equations.
Task files: rows with `question`/`answer`, GSM8K rows (`answer` ending in `#### 42`) and
MATH rows (`problem` + `solution` with a `\\boxed{}` answer) are all accepted.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np

from parity.envs.answers import last_boxed
from parity.envs.core import Response, TextEnv
from parity.envs.data import Task
from parity.envs.episode import Episode, EpisodeLimits, Message
from parity.envs.rubric import Criterion, Rubric
from parity.envs.verifier import MathVerifier, Verdict, default_verifier

KINDS = ("arithmetic", "fractions", "algebra")
ANSWER_HINT = "Put the final answer in \\boxed{}."


def arithmetic_task(rng: np.random.Generator, difficulty: int) -> Task:
    """`a op b op c` with numbers of `difficulty` + 1 digits; precedence matters."""
    hi = 10 ** (difficulty + 1)
    a, b, c = (int(x) for x in rng.integers(2, hi, size=3))
    form = int(rng.integers(3))
    question, value = [
        (f"{a}+{b}*{c}", a + b * c),
        (f"{a}*{b}-{c}", a * b - c),
        (f"({a}+{b})*{c}", (a + b) * c),
    ][form]
    return {"question": f"Compute {question}.", "answer": str(value), "kind": "arithmetic"}


def fractions_task(rng: np.random.Generator, difficulty: int) -> Task:
    """A sum or difference of two fractions; the answer in lowest terms."""
    hi = 4 + 4 * difficulty
    n1, n2 = (int(x) for x in rng.integers(1, hi, size=2))
    d1, d2 = (int(x) for x in rng.integers(2, hi + 1, size=2))
    op = "+" if rng.integers(2) else "-"
    value = Fraction(n1, d1) + (Fraction(n2, d2) if op == "+" else -Fraction(n2, d2))
    return {"question": f"Compute {n1}/{d1} {op} {n2}/{d2}.", "answer": str(value), "kind": "fractions"}


def algebra_task(rng: np.random.Generator, difficulty: int) -> Task:
    """`a x + b = c` with an integer solution."""
    hi = 10 ** difficulty + 1
    a = int(rng.integers(2, 10))
    x = int(rng.integers(-hi, hi + 1))
    b = int(rng.integers(-hi, hi + 1))
    lhs = f"{a}x + {b}" if b >= 0 else f"{a}x - {-b}"
    return {"question": f"Solve for x: {lhs} = {a * x + b}.", "answer": str(x), "kind": "algebra"}


GENERATORS = {"arithmetic": arithmetic_task, "fractions": fractions_task, "algebra": algebra_task}


def gsm8k_row(row: Task) -> Task:
    """A GSM8K row: the gold answer follows `####` at the end of the worked solution."""
    text = str(row["answer"])
    if "####" not in text:
        raise ValueError("field 'answer' has no '#### <answer>' line")
    return {"question": row["question"], "answer": text.rsplit("####", 1)[1].strip().replace(",", "")}


def math_row(row: Task) -> Task:
    """A MATH-style row: `problem`, and `answer` or the last \\boxed{} of `solution`."""
    answer = row.get("answer") or last_boxed(str(row["solution"]))
    if not answer:
        raise ValueError("field 'solution' has no \\boxed{} answer and there is no 'answer'")
    return {"question": row["problem"], "answer": str(answer)}


ROW_FORMATS = {"gsm8k": gsm8k_row, "math": math_row, "plain": dict}


class MathEnv(TextEnv):
    """Math problems answered in \\boxed{}, verified by math-verify."""

    def __init__(
        self,
        *,
        multi_turn: bool = False,
        kinds: tuple[str, ...] = KINDS,
        difficulty: int = 1,
        verifier: MathVerifier | None = None,
        system_prompt: str | None = None,
        task_format: str = "auto",
        limits: EpisodeLimits | None = None,
        **kwargs: Any,
    ) -> None:
        """`kinds`: synthetic task kinds to draw from; `difficulty` >= 0 sets number sizes;
        `verifier`: defaults to the process-wide one (one worker process); `task_format` of
        task files: "gsm8k", "math", "plain" (question/answer) or "auto" (by the fields)."""
        unknown = [k for k in kinds if k not in GENERATORS]
        if unknown or not kinds:
            raise ValueError(f"kinds: unknown {unknown}; choose from {list(GENERATORS)}")
        if difficulty < 0:
            raise ValueError(f"difficulty must be >= 0, got {difficulty}")
        if task_format != "auto" and task_format not in ROW_FORMATS:
            raise ValueError(f"task_format: unknown {task_format!r}; choose auto or one of {list(ROW_FORMATS)}")
        self.task_format = task_format
        limits = limits or EpisodeLimits(max_turns=3 if multi_turn else 1)
        super().__init__(limits=limits, **kwargs)
        self.multi_turn = multi_turn
        self.kinds = kinds
        self.difficulty = difficulty
        self.verifier = verifier or default_verifier()
        self.system_prompt = system_prompt
        self._verdicts: dict[str, Verdict] = {}
        self.rubric = Rubric([
            Criterion(self._correct, 1.0, "correct"),
            Criterion(self._boxed, 0.0, "boxed"),
            Criterion(self._timed_out, 0.0, "verify_timeout"),
        ])

    def convert_row(self, row: Task) -> Task:
        fmt = self.task_format
        if fmt == "auto":
            fmt = "math" if "problem" in row else "gsm8k" if "####" in str(row.get("answer")) else "plain"
        return ROW_FORMATS[fmt](row)

    def generate_task(self, rng: np.random.Generator) -> Task:
        kind = self.kinds[int(rng.integers(len(self.kinds)))]
        return GENERATORS[kind](rng, self.difficulty)

    def prompt_messages(self, task: Task) -> list[Message]:
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*system, {"role": "user", "content": f"{task['question']}\n{ANSWER_HINT}"}]

    async def areset(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        self._verdicts = {}
        return await super().areset(**kwargs)

    async def _verdict(self, text: str) -> Verdict | None:
        """The verdict on the \\boxed{} answer in `text` (None: no answer); cached per text."""
        answer = last_boxed(text)
        if answer is None:
            return None
        if text not in self._verdicts:
            assert self.episode is not None
            self._verdicts[text] = await self.verifier.verify(str(self.episode.task["answer"]), answer)
        return self._verdicts[text]

    async def respond(self, text: str) -> Response:
        if not self.multi_turn:
            return Response(done=True, reason="answer")
        verdict = await self._verdict(text)
        if verdict is not None and verdict.correct:
            return Response(done=True, reason="answer")
        if verdict is None:
            msg = f"error: no \\boxed{{}} answer found. {ANSWER_HINT}"
            return Response([{"role": "user", "content": msg}], metrics={"parse_errors": 1})
        return Response([{"role": "user", "content": "That is not correct. Try again."}])

    def oracle(self) -> str:
        assert self.episode is not None
        return f"The answer is \\boxed{{{self.episode.task['answer']}}}."

    async def _correct(self, ep: Episode) -> float:
        verdict = await self._verdict(ep.last_model_text)
        return float(verdict is not None and verdict.correct)

    async def _boxed(self, ep: Episode) -> float:
        return float(last_boxed(ep.last_model_text) is not None)

    async def _timed_out(self, ep: Episode) -> float:
        verdict = await self._verdict(ep.last_model_text)
        return float(verdict is not None and verdict.status == "timeout")
