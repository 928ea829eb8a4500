"""The parity audit: engine-recorded logprobs against the learner's, bit for bit.

Every scenario runs the engine under one condition (batch composition, chunking, cache
state, preemption, threads, weight version ...) and compares each recorded logprob with
`packed_logprobs(model, tokens, lengths, temperature)` — the learner's training forward —
on the same weights and the same tokens, or, for decode vs prefill, with the engine's own
prefill of the same prefix. In aligned kernel mode every scenario must be bit-identical; in
standard mode several are expected to differ (the audit can fail).

With a vLLM backend (`parity audit --engine vllm`) the scenarios that only need the
engine's contract (requests, weight updates) run against vLLM instead, those of
SERVER_SCENARIOS on a server started with settings of its own (chunked prefill and
preemption forced),
and the report shows by how much its logprobs differ from the learner's; the others need the
parity engine's step-level control and are listed as not run.

An audit is only as good as the distributions it compares: a saturated softmax (logprobs of
0) hides every difference. Each result counts the compared tokens that carry real
uncertainty (logprob < UNCERTAIN), and a report with too few of them is inconclusive.
"""

from __future__ import annotations

import asyncio
import copy
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from parity.core.types import Completion, SamplingParams, Trajectory
from parity.engine.config import EngineConfig
from parity.engine.engine import Engine
from parity.model import KV_TILE, Decoder, packed_logprobs
from parity.model.batch import collate

if TYPE_CHECKING:
    pass

TEMPERATURE = 0.8
BLOCK = 16
UNCERTAIN = -0.1  # a token whose logprob is below this has visible probability elsewhere
MIN_UNCERTAIN_FRACTION = 0.1  # of compared tokens, for a conclusive audit
MIN_UNCERTAIN_TOKENS = 20


@dataclass
class ScenarioResult:
    name: str
    tokens_compared: int
    max_abs_diff: float
    bitwise_equal: bool
    uncertain_tokens: int = 0  # compared tokens with logprob < UNCERTAIN
    tokens_differing: int = 0
    preemptions: int | None = None  # the preemption scenario's: sequences preempted


@dataclass
class Case:
    """One finished request: its full token list, where generation began, what was recorded."""

    tokens: list[int]
    start: int
    logprobs: list[float]
    temperature: float = TEMPERATURE

    @classmethod
    def of(cls, prompt: list[int], c: Completion, temperature: float = TEMPERATURE) -> Case:
        return cls(list(prompt) + c.token_ids, len(prompt), c.logprobs, temperature)

    def trajectory(self) -> Trajectory:
        """The tokens from `start` on marked generated (compared); μ and versions are left
        empty (0, -1): the reference forward reads only the tokens."""
        n = len(self.tokens)
        return Trajectory("audit", self.tokens, [0] * self.start + [1] * (n - self.start),
                          [0.0] * n, [-1] * n)


def learner_logprobs(model: Decoder, cases: list[Case]) -> list[torch.Tensor]:
    """The learner's per-token logprobs of each case's generated tokens, all cases at one
    temperature in one batch, collated as the learner collates trajectories."""
    out: list[torch.Tensor | None] = [None] * len(cases)
    for t in sorted({c.temperature for c in cases}):
        idx = [i for i, c in enumerate(cases) if c.temperature == t]
        b = collate([cases[i].trajectory() for i in idx])
        with torch.no_grad():
            lp = b.rows(packed_logprobs(model, b.tokens, b.lengths.tolist(), t))
        for row, i in enumerate(idx):
            out[i] = lp[row][b.mask[row].bool()]
    return [o for o in out if o is not None]


def compare(name: str, a: list[torch.Tensor], b: list[torch.Tensor]) -> ScenarioResult:
    """Engine-side values `a` against reference values `b`, token by token."""
    x = torch.cat([t.float().flatten() for t in a])
    y = torch.cat([t.float().flatten() for t in b])
    uncertain = int((y < UNCERTAIN).sum())
    if x.shape != y.shape:
        n = int(min(x.numel(), y.numel()))
        return ScenarioResult(name, n, float("inf"), False, uncertain, n)
    diff = (x - y).abs()
    return ScenarioResult(name, int(x.numel()), float(diff.max()) if x.numel() else 0.0,
                          bool(torch.equal(x, y)), uncertain, int((diff > 0).sum()))


def check_cases(name: str, model: Decoder, cases: list[Case]) -> ScenarioResult:
    recorded = [torch.tensor(c.logprobs, dtype=torch.float32) for c in cases]
    return compare(name, recorded, learner_logprobs(model, cases))


class Auditor:
    """Runs the scenarios on one model; `rng` makes prompts and request seeds reproducible."""

    def __init__(self, model: Decoder, seed: int = 0, new_tokens: int = 12,
                 backend: Any = None) -> None:
        self.model = model
        # the learner's side: fp32 master weights computing in the model's dtype, as the
        # trainer's learner holds them (the model itself in fp32)
        self.learner = learner_copy(model)
        self.backend = backend  # a vLLM backend serving `model`'s weights, or None
        self.rng = random.Random(seed)
        self.vocab = model.config.vocab_size
        self.new_tokens = new_tokens

    def prompt(self, n: int) -> list[int]:
        return [self.rng.randrange(self.vocab) for _ in range(n)]

    def params(self, **kw) -> SamplingParams:
        kw.setdefault("max_new_tokens", self.new_tokens)
        kw.setdefault("temperature", TEMPERATURE)
        kw.setdefault("seed", self.rng.randrange(2**31))
        return SamplingParams(**kw)

    def engine(self, **kw) -> Engine:
        if self.backend is not None:  # a server's settings are its own: kw do not apply
            return self.backend
        kw.setdefault("kv_blocks", 512)
        kw.setdefault("block_size", BLOCK)
        return Engine(self.model, EngineConfig(**kw))

    def run(self, prompts: list[list[int]], params: list[SamplingParams], **kw) -> list[Case]:
        outs = self.engine(**kw).generate(prompts, params)
        return [Case.of(p, c, sp.temperature or 1.0) for p, c, sp in zip(prompts, outs, params, strict=True)]

    # ------------------------------------------------------------------ scenarios

    def learner_vs_engine(self, temperatures: tuple[float, ...] = (0.8, 0.8, 1.0, 0.0, 0.8, 1.3,
                                                                   0.8, 1.0),
                          name: str = "learner full-sequence forward vs engine") -> ScenarioResult:
        prompts = [self.prompt(self.rng.randint(1, 90)) for _ in temperatures]
        params = [self.params(temperature=t) for t in temperatures]
        return check_cases(name, self.learner, self.run(prompts, params))

    def learner_at(self, temperature: float) -> ScenarioResult:
        """The learner comparison with every request at one sampling temperature (the
        learner scores at it)."""
        name = f"learner forward vs engine at T={temperature:g}"
        return self.learner_vs_engine((temperature,) * 8, name)

    def server_chunked_prefill(self) -> ScenarioResult:
        """A backend whose server steps at most `max_num_batched_tokens` tokens (vLLM, its
        own server: SERVER_SCENARIOS): each prompt is longer, so it is prefilled in several
        chunks, at T 1.0 and 0.7. Unseeded: vLLM's CPU build dies rewinding a seeded
        request's generator after a partial prefill (docs/vllm.md); the comparison needs no
        seed, the learner scores whatever was sampled."""
        budget = self.backend.settings.max_num_batched_tokens
        prompts = [self.prompt(self.rng.randint(budget + 1, 4 * budget)) for _ in range(8)]
        params = [self.params(temperature=t, seed=None) for t in (1.0, 0.7) * 4]
        cases = self.run(prompts, params)
        return check_cases(f"chunked prefill, {budget}-token steps", self.learner, cases)

    def batch_one_vs_many(self) -> ScenarioResult:
        target, sp = self.prompt(40), self.params()
        alone = self.run([target], [sp])
        others = [self.prompt(self.rng.randint(5, 80)) for _ in range(15)]
        many = self.run([target, *others], [sp] + [self.params() for _ in others])
        # engine batch 1 vs learner batch 16, engine batch 16 vs learner batch 1
        a = [torch.tensor(alone[0].logprobs), torch.tensor(many[0].logprobs)]
        b = [learner_logprobs(self.learner, [alone[0], *many[1:]])[0], learner_logprobs(self.learner, [many[0]])[0]]
        return compare("batch size 1 vs many", a, b)

    def needle_in_batch(self) -> ScenarioResult:
        eng = self.engine(max_batch_tokens=96)
        others = [self.prompt(self.rng.randint(3, 70)) for _ in range(12)]
        target, sp = self.prompt(33), self.params()
        at = self.rng.randrange(len(others) + 1)
        prompts = [*others[:at], target, *others[at:]]
        params = [self.params(max_new_tokens=self.rng.randint(1, 20)) for _ in prompts]
        params[at] = sp
        seqs = [eng.make_sequence(p, s) for p, s in zip(prompts, params, strict=True)]
        for s in seqs[:at]:
            eng.add(s)
        for _ in range(self.rng.randint(0, 6)):  # the target arrives mid-flight
            eng.step()
        for s in seqs[at:]:
            eng.add(s)
        while eng.scheduler.has_work():
            eng.step()
        case = Case.of(target, seqs[at].completion())
        return compare("sequence hidden among random others at a random position",
                       [torch.tensor(case.logprobs)], learner_logprobs(self.learner, [case]))

    def decode_vs_prefill(self) -> ScenarioResult:
        prompt, sp = self.prompt(21), self.params()
        dec = self.run([prompt], [sp])[0]
        prefixes = [dec.tokens[: dec.start + j] for j in range(len(dec.logprobs))]
        # each prefix prefilled in one forward; the same seed draws the same token at that position
        pre = self.run(prefixes, [sp.model_copy(update={"max_new_tokens": 1})] * len(prefixes))
        a = [torch.tensor(dec.logprobs)]
        b = [torch.tensor([c.logprobs[0] for c in pre])]
        same_tokens = all(c.tokens[-1] == dec.tokens[c.start] for c in pre)
        r = compare("decode vs prefill for every token", a, b)
        r.bitwise_equal = r.bitwise_equal and same_tokens
        return r

    def chunked_prefill(self, chunk: int) -> ScenarioResult:
        prompt = self.prompt(100)
        cases = self.run([prompt], [self.params(max_new_tokens=6)], max_batch_tokens=chunk)
        return check_cases(f"chunked prefill, chunk size {chunk}", self.learner, cases)

    def prefix_cache(self) -> ScenarioResult:
        eng = self.engine()
        base = self.prompt(70)
        cold = eng.generate([base], self.params())[0]
        group = [self.params() for _ in range(4)]
        hot = eng.generate([base] * 4, group)
        ext = base + cold.token_ids + self.prompt(9)
        cont = eng.generate([ext], self.params())[0]
        hit = eng.num_cached_tokens > 0
        cases = [Case.of(base, cold)] + [Case.of(base, c) for c in hot] + [Case.of(ext, cont)]
        r = check_cases("prefix-cache hit vs miss", self.learner, cases)
        r.bitwise_equal = r.bitwise_equal and hit
        return r

    def preemption(self) -> ScenarioResult:
        if self.backend is not None:
            return self.server_preemption()
        eng = self.engine(kv_blocks=16, max_batch_tokens=64)
        prompts = [self.prompt(self.rng.randint(30, 60)) for _ in range(4)]
        params = [self.params(max_new_tokens=24) for _ in prompts]
        outs = eng.generate(prompts, params)
        cases = [Case.of(p, c) for p, c in zip(prompts, outs, strict=True)]
        r = check_cases("forced preemption and recompute", self.learner, cases)
        r.preemptions = eng.scheduler.num_preemptions
        r.bitwise_equal = r.bitwise_equal and r.preemptions > 0
        return r

    def server_preemption(self) -> ScenarioResult:
        """A backend whose KV pool is too small for the batch (vLLM, its own server:
        SERVER_SCENARIOS): it preempts sequences and recomputes them, which its counter must
        show. Unseeded, as in server_chunked_prefill: a recompute may be prefilled in chunks."""
        before = self.backend.preemptions()
        prompts = [self.prompt(self.rng.randint(40, 120)) for _ in range(8)]
        params = [self.params(max_new_tokens=40, temperature=t, seed=None) for t in (1.0, 0.7) * 4]
        r = check_cases("forced preemption and recompute", self.learner, self.run(prompts, params))
        r.preemptions = self.backend.preemptions() - before
        r.bitwise_equal = r.bitwise_equal and r.preemptions > 0
        return r

    def multi_turn(self) -> ScenarioResult:
        eng = self.engine()
        tokens, recorded, turns = self.prompt(30), [], []
        for _ in range(3):  # each turn's prompt = everything so far + an observation
            c = eng.generate([tokens], self.params())[0]
            turns.append((len(tokens), len(c.token_ids)))
            recorded += c.logprobs
            tokens = tokens + c.token_ids + self.prompt(self.rng.randint(1, 20))
        full = learner_logprobs(self.learner, [Case(tokens, 1, [])])[0]
        ref = [full[s - 1 : s - 1 + n] for s, n in turns]
        r = compare("multi-turn continuation", [torch.tensor(recorded)], ref)
        r.bitwise_equal = r.bitwise_equal and eng.num_cached_tokens > 0
        return r

    def threads(self) -> ScenarioResult:
        prompts = [self.prompt(self.rng.randint(5, 60)) for _ in range(6)]
        params = [self.params() for _ in prompts]
        before = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            one = self.run(prompts, params)
            torch.set_num_threads(2)
            two = self.run(prompts, params)
            ref_two = learner_logprobs(self.learner, one)  # learner at 2 threads vs engine at 1
            torch.set_num_threads(1)
            ref_one = learner_logprobs(self.learner, two)  # learner at 1 thread vs engine at 2
        finally:
            torch.set_num_threads(before)
        a = [torch.tensor(c.logprobs) for c in one + two]
        return compare("1 vs 2 threads", a, ref_two + ref_one)

    def weight_update(self) -> ScenarioResult:
        if self.backend is not None:
            return self.weight_update_between_requests()
        eng = self.engine(max_batch_tokens=64)
        prompts = [self.prompt(self.rng.randint(10, 60)) for _ in range(5)]
        params = [self.params(max_new_tokens=16) for _ in prompts]
        seqs = [eng.make_sequence(p, s) for p, s in zip(prompts, params, strict=True)]
        for s in seqs:
            eng.add(s)
        for _ in range(5):
            eng.step()
        old, new = self._new_weights()
        old_cases = [_version_case(s, 0) for s in seqs]
        eng.update_weights(new, 1)
        self.learner.load_state_dict(new)
        try:
            while eng.scheduler.has_work():
                eng.step()
            new_cases = [_version_case(s, 1) for s in seqs]
            a = [torch.tensor(c.logprobs) for c in new_cases]
            b = learner_logprobs(self.learner, new_cases)
        finally:
            eng.update_weights(old, 2)
            self.learner.load_state_dict(old)
        a += [torch.tensor(c.logprobs) for c in old_cases]
        b += learner_logprobs(self.learner, old_cases)
        return compare("after a weight update", a, b)

    def weight_update_between_requests(self) -> ScenarioResult:
        """A backend in another process (vLLM): requests before and after an update."""
        prompts = [self.prompt(self.rng.randint(10, 60)) for _ in range(5)]
        params = [self.params(max_new_tokens=16) for _ in prompts]
        old, new = self._new_weights()
        before = self.run(prompts, params)
        a = [torch.tensor(c.logprobs) for c in before]
        b = learner_logprobs(self.learner, before)
        v = self.backend.version
        asyncio.run(self.backend.update_weights(new, v + 1))
        self.learner.load_state_dict(new)
        try:
            after = self.run(prompts, params)
            a += [torch.tensor(c.logprobs) for c in after]
            b += learner_logprobs(self.learner, after)
        finally:
            self.learner.load_state_dict(old)
            asyncio.run(self.backend.update_weights(old, v + 2))
        return compare("after a weight update", a, b)

    def _new_weights(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The engine's weights now, and a perturbed copy of them in their dtype."""
        old = {k: v.clone() for k, v in self.model.state_dict().items()}
        g = torch.Generator().manual_seed(self.rng.randrange(2**31))
        new = {k: (v + 0.02 * torch.randn(v.shape, generator=g)).to(v.dtype) for k, v in old.items()}
        return old, new

    def run_scenario(self, sid: str) -> ScenarioResult:
        """One scenario by its id (see SCENARIOS)."""
        if sid.startswith("chunk-"):
            return self.chunked_prefill(int(sid.removeprefix("chunk-")))
        if sid.startswith("learner-t"):
            return self.learner_at(float(sid.removeprefix("learner-t")))
        return getattr(self, _METHODS[sid])()


_CHUNKS = sorted({1, 7, KV_TILE - 1, KV_TILE, KV_TILE + 1, BLOCK - 1, BLOCK + 1})
_METHODS = {
    "learner": "learner_vs_engine", "batch": "batch_one_vs_many", "needle": "needle_in_batch",
    "decode-prefill": "decode_vs_prefill", "prefix-cache": "prefix_cache",
    "preemption": "preemption", "multi-turn": "multi_turn", "threads": "threads",
    "weight-update": "weight_update", "chunked-prefill": "server_chunked_prefill",
}
SCENARIOS: tuple[str, ...] = (
    "learner", "batch", "needle", "decode-prefill", *[f"chunk-{c}" for c in _CHUNKS],
    "prefix-cache", "preemption", "multi-turn", "threads", "weight-update",
)
# what a backend reached through requests and weight updates alone can run
# (decode vs prefill needs the parity engine's per-position seeds: the same draw at a position)
BACKEND_SCENARIOS: tuple[str, ...] = (
    "learner", "learner-t1.0", "learner-t0.7", "batch", "prefix-cache", "multi-turn",
    "weight-update",
)
# backend scenarios that need a server of their own, all run on one server started with
# SERVER_SETTINGS (on top of the audit's): the learner comparison under vLLM's own scheduling
SERVER_SCENARIOS: tuple[str, ...] = ("chunked-prefill", "preemption")
SERVER_SETTINGS: dict[str, int] = {
    # 32-token steps (and so at most 32 sequences: vLLM's bound) force chunked prefill
    "max_num_batched_tokens": 32, "max_num_seqs": 32,
    # 4 KV blocks, one of them vLLM's null block: 192 tokens aligned (64-token blocks), 384
    # stock (128), for 8 sequences of up to 160 tokens, force preemption (6 blocks did not
    # preempt stock vLLM)
    "num_kv_blocks": 4, "max_model_len": 192,
}


def learner_copy(model: Decoder) -> Decoder:
    """`model` as the trainer's learner holds it: its weights as fp32 masters (exact copies),
    computing in the model's dtype. The model itself when it is fp32."""
    if all(p.dtype == torch.float32 for p in model.parameters()):
        return model
    return copy.deepcopy(model).float()


def _version_case(seq, version: int) -> Case:
    """The tokens of `seq` generated under `version`, as a Case cut at its last such token."""
    gen = seq.tokens[seq.num_prompt :]
    idx = [i for i, v in enumerate(seq.versions) if v == version]
    if not idx:
        return Case(seq.tokens[: seq.num_prompt + 1], seq.num_prompt + 1, [])
    first, last = idx[0], idx[-1]
    tokens = seq.tokens[: seq.num_prompt] + gen[: last + 1]
    return Case(tokens, seq.num_prompt + first, seq.logprobs[first : last + 1], seq.params.temperature or 1.0)
