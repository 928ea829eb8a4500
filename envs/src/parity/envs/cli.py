"""`parity envs list|check|play|osworld-coverage`: list the environments, check one, play one by hand,
measure how much of a folder of OSWorld task files the desktop loads."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

import typer

app = typer.Typer(no_args_is_help=True)

KWARG_HELP = ("A constructor argument, KEY=VALUE (repeatable): VALUE is a TOML value as in "
              "`parity train --set` (length=4, kinds='[\"mul\"]'), else a string.")


def _make(name: str, kwarg: list[str] | None) -> tuple[Any, dict[str, Any]]:
    """The env and the kwargs it was made with; a bad id, a module that does not import or
    a bad argument is one line on stderr and exit 2 (bad input, no traceback)."""
    from parity.core.config import apply_overrides
    from parity.envs import make_env

    try:
        if bad := [k for k in kwarg or [] if "=" not in k]:
            raise ValueError(f"--kwarg {bad[0]!r}: expected KEY=VALUE, e.g. length=4")
        kwargs = apply_overrides({}, kwarg or [])
        return make_env(name, **kwargs), kwargs
    except (ValueError, TypeError) as e:  # TypeError: an argument the constructor does not take
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e


@app.command("list")
def list_envs(json_: bool = typer.Option(False, "--json", help="A JSON list of {id, description}.")) -> None:
    """List the registered environments."""
    from parity.envs import list_envs as registered

    envs = registered()
    if json_:
        typer.echo(json.dumps(envs, indent=2))
        return
    width = max((len(e["id"]) for e in envs), default=0)
    for e in envs:
        typer.echo(f"{e['id']:<{width}}  {e['description']}")


@app.command("check")
def check(
    name: str,
    seed: int = typer.Option(0, help="Seed of the oracle episode."),
    kwarg: list[str] | None = typer.Option(None, "--kwarg", help=KWARG_HELP),
    json_: bool = typer.Option(False, "--json"),
) -> None:
    """Run gymnasium's check_env and one scripted oracle episode; exit 1 unless check_env
    passes and the oracle reaches its expected reward."""
    from dataclasses import asdict

    from gymnasium.utils.env_checker import check_env

    from parity.envs.agent import AgentEnv
    from parity.envs.preflight import EnvPreflightError, oracle_episode

    env, kwargs = _make(name, kwarg)
    report: dict[str, object] = {"id": name, "kwargs": kwargs}
    try:
        if isinstance(env.unwrapped, AgentEnv):  # its agent, not reset/step, plays it
            report["check_env"] = "ok (an agent env: its oracle episode is the check)"
        else:
            check_env(env.unwrapped)  # gymnasium's advice: the checker on the env itself
            report["check_env"] = "ok"
    except Exception as e:
        report["check_env"] = f"failed: {type(e).__name__}: {e}"
    oracle_ok = False
    try:
        oracle = oracle_episode(env, seed, name)
        report.update({f"oracle_{k}": v for k, v in asdict(oracle).items() if k != "env_id"})
        oracle_ok = oracle.ok
    except EnvPreflightError as e:
        report["oracle"] = str(e)
    except Exception as e:
        report["oracle"] = f"failed: {type(e).__name__}: {e}"
    finally:
        env.close()
    ok = str(report["check_env"]).startswith("ok") and oracle_ok
    report["ok"] = ok
    if json_:
        typer.echo(json.dumps(report, indent=2))
    else:
        for k, v in report.items():
            typer.echo(f"{k}: {v}")
    if not ok:
        raise typer.Exit(1)


@app.command("play")
def play(
    name: str,
    seed: int = typer.Option(0, help="Seed of the task."),
    oracle: bool = typer.Option(False, "--oracle", help="Show the oracle's turn as a hint."),
    kwarg: list[str] | None = typer.Option(None, "--kwarg", help=KWARG_HELP),
) -> None:
    """Play an episode by hand: you type the model's turns (one line each; a literal \\n
    becomes a newline). End of input stops the episode; its end shows the expected answer.
    An agent env's agent runs as in training; you answer each of its model calls."""
    from parity.envs.agent import AgentEnv

    env, _ = _make(name, kwarg)
    try:
        if isinstance(env.unwrapped, AgentEnv):
            _play_agent(env, seed, oracle)
            return
        obs, _ = env.reset(seed=seed)
        _show(obs["messages"])
        while True:
            line = _read_turn(env.unwrapped.oracle_action() if oracle else None)
            if line is None:
                return
            obs, reward, terminated, truncated, info = env.step(line)
            _show(obs["messages"])
            if terminated or truncated:
                typer.echo(f"episode over: reward={reward} finish_reason={info['finish_reason']} "
                           f"components={info['reward_components']}")
                answer = _expected_answer(env)
                if answer is not None:
                    typer.echo(f"expected answer: {answer}")
                return
    finally:
        env.close()


def _play_agent(env: Any, seed: int, oracle: bool) -> None:
    """`play` for an AgentEnv: its agent calls the model; each call shows the messages the
    model has not seen yet and takes your line as the model's turn."""
    import asyncio

    from parity.envs.runner import oracle_generate, run_episode

    shown: list[Any] = [None, 0]  # the segment shown, and how many of its messages

    def turn(inner: Any) -> str:
        segment = inner.session.segments[-1]
        if segment is not shown[0]:
            if shown[0] is not None:
                typer.echo(f"(the agent rewrote its history: segment {len(inner.session.segments)})")
            shown[:] = [segment, 0]
        _show(tuple(segment.messages[shown[1]:]))
        line = _read_turn(inner.oracle_action() if oracle else None)
        if line is None:
            raise EOFError("end of input")
        shown[1] = len(segment.messages) + 1  # the assistant turn is shown as typed
        return line

    traj = asyncio.run(run_episode(env, oracle_generate(env, turn), seed=seed))
    if traj.failure == "generate_error":  # the end of input ended it
        return
    _show(tuple(traj.messages[shown[1]:]))
    typer.echo(f"episode over: reward={traj.reward} finish_reason={traj.finish_reason} "
               f"segments={len(traj.segments)}")
    if isinstance(traj.task, Mapping) and traj.task.get("answer") is not None:
        typer.echo(f"expected answer: {traj.task['answer']}")


def _read_turn(hint: str | None) -> str | None:
    """The model's turn as you type it (a literal \\n is a newline), after the oracle's
    `hint` when asked for; None at the end of input."""
    if hint is not None:
        typer.echo(f"[oracle] {hint}")
    typer.echo("assistant> ", nl=False)
    line = sys.stdin.readline()
    if not line:
        typer.echo("\n(end of input)")
        return None
    return line.rstrip("\n").replace("\\n", "\n")


def _show(messages: tuple) -> None:
    for m in messages:
        typer.echo(f"{m['role']}> {m['content']}")


def _expected_answer(env: Any) -> Any:
    """The episode's task answer, for a TextEnv whose tasks have one (`episode.task`)."""
    task = getattr(getattr(env.unwrapped, "episode", None), "task", None)
    return task.get("answer") if isinstance(task, Mapping) else None


@app.command("osworld-coverage")
def osworld_coverage(
    directory: str = typer.Argument(..., help="A folder of OSWorld task files, e.g. evaluation_examples/examples."),
    exclude: list[str] | None = typer.Option(None, "--exclude", help="A folder or file under DIR to skip (repeatable)."),
    json_: bool = typer.Option(False, "--json", help="One JSON object: per app and in all."),
) -> None:
    """How many OSWorld task files the desktop's loader accepts, per app folder, with the
    reasons for the rest (files they download stand in as placeholders)."""
    from pathlib import Path

    from parity.envs.desktop.osworld import coverage, report

    if not Path(directory).is_dir():
        typer.echo(f"error: {directory} is not a folder", err=True)
        raise typer.Exit(2)
    result = coverage(directory, exclude)
    typer.echo(json.dumps(result, indent=2) if json_ else report(result))
