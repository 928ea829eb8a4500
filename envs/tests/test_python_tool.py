"""parity/PythonTool-v0 on the real local sandbox: oracle episodes, sessions, failures."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from parity.core.types import Completion
from parity.envs.preflight import oracle_episode
from parity.envs.python_tool import KINDS, PythonToolEnv, generate_task
from parity.envs.runner import oracle_generate, run_episode
from parity.sandboxes import SandboxError

MUL = {"question": "Q: 5831*47=?", "answer": "274057", "code": "5831*47"}


@pytest.fixture
def env():
    e = PythonToolEnv()
    yield e
    e.close()


@pytest.mark.parametrize("kind", KINDS)
def test_oracle_solves_every_kind(kind: str) -> None:
    env = PythonToolEnv(kinds=(kind,), difficulty=2)
    traj = asyncio.run(run_episode(env, oracle_generate(env), seed=11))
    env.close()
    assert traj.reward == 1.0 and traj.finish_reason == "answer"
    assert traj.reward_components == {"correct": 1.0, "used_tool": 1.0}
    assert traj.num_turns == 2 and traj.metrics["tool_calls"] == 1
    assert traj.turn_timings[0].sandbox_s > 0


def test_sandbox_latency_is_waited_in_each_call_and_counted_as_sandbox_time() -> None:
    env = PythonToolEnv(kinds=("mul",), sandbox_latency_s=0.5)
    traj = asyncio.run(run_episode(env, oracle_generate(env), seed=11))
    env.close()
    assert traj.reward == 1.0 and traj.metrics["tool_calls"] == 1
    assert sum(t.sandbox_s for t in traj.turn_timings) >= 0.5  # asyncio.sleep waits at least that long
    with pytest.raises(ValueError, match="sandbox_latency_s must be >= 0 seconds, got -1"):
        PythonToolEnv(sandbox_latency_s=-1)


def test_embedded_format_transcript(env) -> None:
    obs, _ = env.reset(options={"task": MUL})
    assert env.oracle_action() == "<py>print(5831*47)</py>"
    obs, reward, terminated, truncated, _ = env.step(env.oracle_action())
    assert obs["messages"] == ({"role": "tool", "content": "274057\n"},)
    assert env.tokenizer.decode(obs["token_ids"]) == (
        "\n<|im_start|>tool\n274057\n<|im_end|>\n<|im_start|>assistant\n"
    )
    assert env.oracle_action() == "<ans>274057</ans>"
    _, reward, terminated, truncated, _info = env.step("<ans> 274,057.0 </ans>")
    assert (reward, terminated, truncated) == (1.0, True, False)


def test_wrong_answer_and_no_tool(env) -> None:
    env.reset(options={"task": MUL})
    _, reward, terminated, _, info = env.step("<ans>274058</ans>")
    assert (reward, terminated) == (0.0, True)
    assert info["reward_components"] == {"correct": 0.0, "used_tool": 0.0}


def test_errors_traceback_and_timeout_reach_the_model() -> None:
    env = PythonToolEnv(sandbox_limits={"timeout_s": 1})
    env.reset(options={"task": MUL})
    obs, *_ = env.step("<py>1/0</py>")
    out = obs["messages"][0]["content"]
    assert "ZeroDivisionError" in out and out.endswith("[exit code 1]")
    obs, *_ = env.step("<py>while True: pass</py>")
    assert "timed out" in obs["messages"][0]["content"]
    env.close()


def test_huge_output_is_cut_head_and_tail() -> None:
    env = PythonToolEnv(output_chars=100)
    env.reset(options={"task": MUL})
    obs, *_ = env.step("<py>print('A' * 5000 + 'Z' * 5000)</py>")
    out = obs["messages"][0]["content"]
    assert out == "A" * 50 + "\n...[9901 characters cut]...\n" + "Z" * 49 + "\n"
    env.close()


def test_persistent_session_keeps_state() -> None:
    env = PythonToolEnv(persistent=True, limits=None)
    env.reset(options={"task": MUL})
    env.step("<py>x = 5831</py>")
    obs, *_ = env.step("<py>print(x*47)</py>")
    assert obs["messages"][0]["content"] == "274057\n"
    # a new episode gets a new interpreter
    env.reset(options={"task": MUL})
    obs, *_ = env.step("<py>print('x' in globals())</py>")
    assert obs["messages"][0]["content"] == "False\n"
    env.close()


def _kill_helper(sandbox) -> None:
    """SIGKILL a local sandbox's helper, PID 1 inside it (bubblewrap's only child), from
    outside: as the OOM killer, a lost node or a reaped container would end it."""
    pid = sandbox._proc.pid
    helper = int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])
    os.kill(helper, signal.SIGKILL)


def test_a_sandbox_killed_during_a_step_fails_the_episode_not_the_agent() -> None:
    """The model's second call is running when its real bubblewrap sandbox dies: the episode
    comes back failed ("sandbox"), not scored 0 as if the model had answered wrong; the
    env's next episode gets a new sandbox and is scored as usual."""
    env = PythonToolEnv(kinds=("mul",))
    tok = env.tokenizer
    turns = iter(["<py>print(1)</py>", "<py>import time; time.sleep(30)</py>", "<ans>0</ans>"])

    async def generate(prompt, sampling):
        text = next(turns)
        if "sleep" in text:  # dies half a second into the call
            threading.Timer(0.5, _kill_helper, [env._held.sandbox]).start()
        ids = [*tok.encode(text), tok.eos_token_id]
        return Completion(ids, [-0.5] * len(ids), [0] * len(ids), "stop")

    t0 = time.monotonic()
    traj = asyncio.run(run_episode(env, generate, seed=0))
    assert time.monotonic() - t0 < 8  # the call ended with its sandbox, not at its 10 s limit
    assert (traj.failure, traj.num_turns, traj.reward) == ("sandbox", 2, 0.0)
    assert traj.finish_reason.startswith("sandbox_error: SandboxError: local sandbox failed")
    assert traj.reward_components == {}  # not scored
    assert env._held.sandbox is None  # released; the next call opens a new one
    again = asyncio.run(run_episode(env, oracle_generate(env), seed=1))
    env.close()
    assert (again.failure, again.reward) == (None, 1.0)


def test_a_sandbox_that_cannot_start_fails_the_oracle_episode_saying_why() -> None:
    def no_sandbox():
        raise SandboxError("the local backend needs a working bubblewrap")

    env = PythonToolEnv(sandbox_factory=no_sandbox)
    report = oracle_episode(env, 0, "parity/PythonTool-v0")
    env.close()
    assert (report.ok, report.failure, report.turns) == (False, "sandbox", 1)
    assert report.problem() == (
        "env parity/PythonTool-v0 cannot run here: its oracle episode failed (sandbox): "
        "sandbox_error: SandboxError: the local backend needs a working bubblewrap")


def test_a_call_the_sandbox_refuses_is_the_models_error(env) -> None:
    """Code the sandbox cannot take (a NUL byte: no command line carries one) is bad input
    from the model: shown to it like any tool error, not a failure of the sandbox."""
    env.reset(options={"task": MUL})
    obs, _, terminated, truncated, _ = env.step("<py>print('\x00')</py>")
    assert obs["messages"][0]["content"] == (
        "error: argv[2] contains a NUL byte, which no command line can carry")
    assert (terminated, truncated, env.episode.failure) == (False, False, None)
    _, reward, _, _, info = env.step("<ans>274057</ans>")
    assert (reward, info["metrics"], env.episode.failure) == (
        1.0, {"tool_calls": 1, "rejected_calls": 1}, None)


def test_code_killing_its_parent_does_not_crash_the_env() -> None:
    env = PythonToolEnv(persistent=True, limits=None)
    env.reset(options={"task": MUL})
    obs, _, terminated, truncated, _ = env.step("<py>import os, signal; os.kill(os.getppid(), signal.SIGKILL)</py>")
    assert (terminated, truncated) == (False, False)
    obs, *_ = env.step("<py>print(7)</py>")
    assert obs["messages"][0]["content"] == "7\n"
    env.close()


def test_hermes_format() -> None:
    env = PythonToolEnv(tool_format="hermes")
    traj = asyncio.run(run_episode(env, oracle_generate(env), seed=0))
    assert traj.reward == 1.0
    assert traj.messages[1]["content"].startswith('<tool_call>{"name": "python"')
    env.reset(options={"task": MUL})
    obs, *_ = env.step('<tool_call>{"name": "shell", "arguments": {"cmd": "ls"}}</tool_call>')
    assert obs["messages"][0]["content"] == 'error: the only tool is "python" with one string argument "code"'
    env.close()


def test_parse_errors_are_counted(env) -> None:
    env.reset(options={"task": MUL})
    obs, *_ = env.step("<py>print(1)</py><py>print(2)</py>")
    assert obs["messages"][0]["content"] == "error: 2 <py> blocks in one turn; write exactly one"
    obs, *_ = env.step("I don't know")
    assert obs["messages"][0]["content"] == "error: no tool call and no <ans>answer</ans> found"
    assert env.episode.metrics == {"parse_errors": 2}


def test_difficulty_grows_numbers() -> None:
    small = generate_task(np.random.default_rng(0), 1, ("mul",))
    big = generate_task(np.random.default_rng(0), 3, ("mul",))
    assert len(big["answer"]) > len(small["answer"]) + 2
    assert generate_task(np.random.default_rng(4), 2) == generate_task(np.random.default_rng(4), 2)
    assert generate_task(np.random.default_rng(0), 0, ("mul",))["question"] == "Q: 865*6=?"
    with pytest.raises(ValueError, match="difficulty must be >= 0"):
        PythonToolEnv(difficulty=-1)


def test_sandbox_pool_lends_one_sandbox_per_episode() -> None:
    from parity.sandboxes import SandboxPool

    async def main(pool):
        envs = [PythonToolEnv(sandbox_pool=pool, persistent=True) for _ in range(4)]
        trajs = await asyncio.gather(*(run_episode(e, oracle_generate(e), seed=i) for i, e in enumerate(envs)))
        for e in envs:
            await e.release()
        return trajs

    with SandboxPool("local", size=2) as pool:
        trajs = asyncio.run(main(pool))
        assert [t.reward for t in trajs] == [1.0] * 4
        assert pool.created == 2
