"""`parity envs list|check|play`: list the environments, check one, play one by hand."""

from __future__ import annotations

import json
import sys

import typer

app = typer.Typer(no_args_is_help=True)


def _make(name: str) -> object:
    from parity.envs import make_env

    try:
        return make_env(name)
    except ValueError as e:
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
    json_: bool = typer.Option(False, "--json"),
) -> None:
    """Run gymnasium's check_env and one scripted oracle episode; exit 1 unless check_env
    passes and the oracle reaches its expected reward."""
    from dataclasses import asdict

    from gymnasium.utils.env_checker import check_env

    from parity.envs.preflight import EnvPreflightError, oracle_episode

    env = _make(name)
    report: dict[str, object] = {"id": name}
    try:
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
    ok = report["check_env"] == "ok" and oracle_ok
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
) -> None:
    """Play an episode by hand: you type the model's turns (one line each; a literal \\n
    becomes a newline). End of input stops the episode."""
    env = _make(name)
    try:
        obs, _ = env.reset(seed=seed)
        _show(obs["messages"])
        while True:
            if oracle:
                typer.echo(f"[oracle] {env.unwrapped.oracle_action()}")
            typer.echo("assistant> ", nl=False)
            line = sys.stdin.readline()
            if not line:
                typer.echo("\n(end of input)")
                return
            obs, reward, terminated, truncated, info = env.step(line.rstrip("\n").replace("\\n", "\n"))
            _show(obs["messages"])
            if terminated or truncated:
                typer.echo(f"episode over: reward={reward} finish_reason={info['finish_reason']} "
                           f"components={info['reward_components']}")
                return
    finally:
        env.close()


def _show(messages: tuple) -> None:
    for m in messages:
        typer.echo(f"{m['role']}> {m['content']}")
