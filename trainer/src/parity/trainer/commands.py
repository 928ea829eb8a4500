"""`parity train`, `eval`, `profile`, `audit` and `bench async`. Heavy imports stay inside."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer


def train(
    config: Annotated[Path | None, typer.Argument(
        help="A TOML config; the embedded default if omitted.")] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="Override a key: --set optim.lr=3e-4")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", help="Run directory (default runs/<time>).")] = None,
    resume: Annotated[Path | None, typer.Option(
        "--resume", help="Continue the run in this directory.")] = None,
    ray_address: Annotated[str | None, typer.Option(
        "--ray-address", help="Join this Ray cluster instead of a local one.")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="--out names a directory holding a run: delete that run (what it "
        "wrote; other files stay) and start over.")] = False,
) -> None:
    """Train with asynchronous REINFORCE Zero.

    A directory that holds a run is never trained into without --resume (or --force).
    Every failure is one line on stderr: exit 2 for bad input (config, model directory, env
    id or arguments, task file, run directory), 1 for a fault (this machine, the env, a dead
    process, a full disk), with the full traceback in RUN_DIR/error.log and, when a checkpoint
    exists, the command that resumes the run. Ctrl-C stops the run (exit 130) and says where
    it can resume from."""
    from parity.core.config import ConfigError
    from parity.trainer.rundir import clear_run, describe_run, holds_run
    from parity.trainer.train import RunFinished, run_training
    from parity.trainer.train_cli import RunDirError, load_for_cli

    try:
        cfg, run_dir = load_for_cli(config, set_ or [], out, resume, ray_address, force)
    except (ConfigError, FileNotFoundError, RunDirError) as e:
        typer.echo(f"parity train: {_one_line(e)}", err=True)
        raise typer.Exit(2) from None
    if resume is None and run_dir.is_dir():  # a run (--force) or what a failed start left
        what = describe_run(run_dir) if holds_run(run_dir) else ""
        gone = clear_run(run_dir)
        if what:
            typer.echo(f"parity train: --force: deleted the run in {run_dir} ({what}: "
                       f"{', '.join(gone)})", err=True)
    try:
        summary = run_training(cfg, run_dir, resume=resume is not None,
                               progress=cfg.output.progress)
    except RunFinished as e:
        typer.echo(f"parity train: {e}", err=True)
        _print_summary(json.loads((run_dir / "summary.json").read_text()), run_dir)
        return
    except KeyboardInterrupt:
        typer.echo(f"parity train: interrupted; {_where(run_dir, cfg.train.steps)}", err=True)
        raise typer.Exit(130) from None
    except Exception as e:  # every failure ends as one line and an exit code
        line, code = _failure(e, run_dir)
        typer.echo(f"parity train: {line}", err=True)
        raise typer.Exit(code) from None
    _print_summary(summary, run_dir)


def _where(run_dir: Path, steps: int) -> str:
    """How far an interrupted run got and how to continue it."""
    from parity.trainer.checkpoint import CheckpointError, latest_checkpoint
    from parity.trainer.rundir import read_metrics

    done = len(read_metrics(run_dir))
    try:
        ckpt = latest_checkpoint(run_dir / "checkpoints")
    except CheckpointError as e:
        return f"{done} of {steps} steps logged; {e}"
    if ckpt is None:
        return (f"{done} of {steps} steps logged, no checkpoint yet: a resume starts over "
                f"(parity train --resume {run_dir})")
    return (f"{done} of {steps} steps logged, last checkpoint {ckpt}; resume with: "
            f"parity train --resume {run_dir}")


def _failure(err: Exception, run_dir: Path) -> tuple[str, int]:
    """A failed run's one line and exit code; its traceback goes to RUN_DIR/error.log."""
    import traceback

    from parity.core.config import ConfigError
    from parity.envs.data import TaskDataError
    from parity.envs.preflight import EnvConfigError
    from parity.model import ModelConfigError, WeightsError
    from parity.model.dtypes import DtypeError
    from parity.trainer.checkpoint import CheckpointError, CheckpointFormatError, latest_checkpoint

    bad_input = (ConfigError, FileNotFoundError, ModelConfigError, WeightsError, DtypeError,
                 TaskDataError, EnvConfigError, CheckpointFormatError)
    line = _one_line(err)
    if run_dir.is_dir():
        log = run_dir / "error.log"
        log.write_text("".join(traceback.format_exception(err)))
        if not isinstance(err, bad_input):
            line += f" (traceback: {log})"
        with contextlib.suppress(CheckpointError):  # a damaged directory has no resume
            if latest_checkpoint(run_dir / "checkpoints") is not None and \
                    not isinstance(err, CheckpointFormatError):
                line += f"; resume with: parity train --resume {run_dir}"
    return line, 2 if isinstance(err, bad_input) else 1


def _one_line(err: BaseException) -> str:
    """The error itself: a Ray error's cause, a traceback text's last error line."""
    cause = getattr(err, "cause", None)
    if isinstance(cause, BaseException) and cause is not err:
        return _one_line(cause)
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    ours = type(err).__module__.startswith("parity.")
    if len(lines) > 1 and not ours:  # a remote traceback as text: its last "SomeError: ..."
        errors = [ln for ln in lines if ln.split(":")[0].endswith(("Error", "Exception"))]
        return (errors or lines)[-1]
    text = "; ".join(lines) or type(err).__name__  # ours: a config error lists every key
    return text if ours or isinstance(err, FileNotFoundError) else f"{type(err).__name__}: {text}"


def audit(
    model: Annotated[list[Path] | None, typer.Option(
        "--model", help="An HF model directory to audit (repeatable).")] = None,
    shape: Annotated[list[str] | None, typer.Option(
        "--shape", help="A named random shape to audit (repeatable): tiny, qwen3-small, "
        "llama-wide, test, qwen2-0.5b. Default, with no --model: tiny, qwen3-small and "
        "llama-wide.")] = None,
    kernels: Annotated[str, typer.Option("--kernels", help="aligned or standard")] = "aligned",
    dtype: Annotated[str, typer.Option("--dtype", help="float32, bfloat16, or auto (a --model's "
                                       "torch_dtype; float32 for --shape)")] = "auto",
    engine: Annotated[str, typer.Option("--engine", help="parity (its aligned engine), "
                                        "vllm-aligned (vLLM running parity's decoder: must be "
                                        "bit-identical) or vllm (vLLM's own model: measure its "
                                        "differences from the learner); both vLLM engines run in "
                                        "vLLM's environment, scripts/build_vllm_env.sh")] = "parity",
    json_: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    seed: Annotated[int, typer.Option("--seed", help="Seeds prompts and sampling.")] = 0,
    ray_address: Annotated[str | None, typer.Option(
        "--ray-address", help="Also run a fixed probe on every node of this Ray cluster and "
        "compare their bits.")] = None,
) -> None:
    """Engine vs learner logprobs, bit for bit, in 16 scenarios per model.

    Exit 0 when the mode shows what it must: aligned, every model bit-identical on a
    conclusive audit (enough uncertain tokens) and, with --ray-address, every node agreeing;
    standard, differences in every model; --engine vllm-aligned, bit-identical in the 9
    scenarios vLLM servers can run (chunked prefill and preemption on a server of their own,
    a small KV pool); --engine vllm, a conclusive measurement of them. Exit 1 otherwise, 2 on
    bad input."""
    from parity.engine.audit_report import audit_models
    from parity.engine.cli import audit_targets, render_audit
    from parity.engine.vllm import VllmEnvError, VllmError
    from parity.model import ModelConfigError, WeightsError

    if kernels not in ("aligned", "standard"):
        typer.echo(f"parity audit: --kernels must be 'aligned' or 'standard', not {kernels!r}",
                   err=True)
        raise typer.Exit(2)
    if engine not in ("parity", "vllm", "vllm-aligned"):
        typer.echo(f"parity audit: --engine must be 'parity', 'vllm-aligned' or 'vllm', not "
                   f"{engine!r}", err=True)
        raise typer.Exit(2)
    if engine == "vllm-aligned" and kernels != "aligned":
        typer.echo("parity audit: --engine vllm-aligned runs parity's aligned kernels; "
                   "--kernels standard does not apply", err=True)
        raise typer.Exit(2)
    try:
        targets = audit_targets(model or [], shape or [], kernels, dtype)
        vllm = _audit_vllm(engine == "vllm-aligned") if engine != "parity" else None
        report = audit_models(targets, kernels, seed, vllm=vllm)
        if ray_address:
            report["cluster"] = _audit_cluster(ray_address, model or [], shape or [])
            report["passed"] = report["passed"] and report["cluster"]["agree"]
    except (ValueError, ModelConfigError, WeightsError, FileNotFoundError) as e:
        typer.echo(f"parity audit: {e}", err=True)
        raise typer.Exit(2) from None
    except (VllmEnvError, VllmError) as e:
        typer.echo(f"parity audit: {_one_line(e)}", err=True)
        raise typer.Exit(1) from None
    if json_:
        typer.echo(json.dumps(report, indent=2))
    else:
        render_audit(report)
        if ray_address:
            c = report["cluster"]
            for name, m in c["models"].items():
                state = "nodes agree" if m["disagreement"] is None else f"DISAGREE: {m['disagreement']}"
                typer.echo(f"{name} on {c['nodes']} node(s) of {c['address']}: {state}")
    if not report["passed"]:
        raise typer.Exit(1)


def _audit_vllm(aligned: bool):
    """vLLM's settings for an audit (its environment checked first: VllmEnvError says how
    to build it, or that it lacks parity's plugin); a short context, the audit's prompts are
    short."""
    from parity.engine.vllm import VllmSettings, check_vllm_env

    check_vllm_env(aligned=aligned)
    return VllmSettings(max_model_len=1024, max_num_seqs=64, aligned=aligned)


def _audit_cluster(address: str, model_dirs: list[Path], shapes: list[str]) -> dict:
    """The multi-node probe for the audited models' configs (shapes suffice: no weights)."""
    from parity.engine.shapes import AUDIT_SHAPES, SHAPES
    from parity.model import ModelConfig
    from parity.trainer.nodes import probe_cluster

    configs = {str(d): ModelConfig.from_pretrained(d) for d in model_dirs}
    configs.update({s: SHAPES[s] for s in shapes or ([] if model_dirs else AUDIT_SHAPES)})
    return probe_cluster(address, configs)


def _print_summary(s: dict, run_dir: Path) -> None:
    """The end-of-run report: held-out success, parity, where the time went, episodes that
    failed outside the agent (when any did), the outputs."""
    from rich.console import Console
    from rich.table import Table

    from parity.trainer.profile import wall_line
    from parity.trainer.rundir import WALL_PARTS

    def pct(v: float | None) -> str:
        return "—" if v is None else f"{100 * v:.1f}%"

    t = Table(title=f"parity train: {s.get('updates', 0)} updates in {s.get('wall_s', 0):.0f} s",
              show_header=False)
    t.add_row("held-out success", f"{pct(s.get('heldout_success_before'))} → "
              f"{pct(s.get('heldout_success_after'))}")
    t.add_row("reward (first → last update)", f"{s.get('reward/first', 0):.3f} → "
              f"{s.get('reward/last', 0):.3f}")
    t.add_row("is/d3_mismatch (max)", f"{s.get('is/d3_mismatch_max', 0):.3g}")
    t.add_row("is/d3_lag (mean)", f"{s.get('is/d3_lag/mean', 0):.3g}")
    t.add_row("lag (mean / max)", f"{s.get('lag/mean/mean', 0):.2f} / {s.get('lag/max/max', 0):.0f}")
    busy = {k: s.get(f"timing/{k}_s/total", 0.0) for k in ("gen", "env", "learner", "sync",
                                                           "learner_wait")}
    t.add_row("actor-seconds", "  ".join(f"{k} {v:.0f}" for k, v in busy.items()))
    if all(k in s for k in WALL_PARTS):
        t.add_row("time", wall_line(s))
    t.add_row("dropped / restarts / skipped", f"{s.get('dropped', 0)} / "
              f"{s.get('worker_restarts', 0)} / {s.get('skipped_nonfinite', 0)}")
    if s.get("env/failures/total"):
        kinds = ", ".join(f"{k.removeprefix('env/failures/')} {v}" for k, v in s.items()
                          if k.startswith("env/failures/") and k != "env/failures/total")
        t.add_row("env failures (not trained on)", f"{s['env/failures/total']} episodes: {kinds}")
    t.add_row("outputs", f"{run_dir}/ (summary.json, metrics.jsonl, samples.jsonl, "
              "trace.json, plots/, checkpoints/, tb/)")
    Console().print(t)
    Console().print(f"profile it: uv run parity profile {run_dir}")


def eval_checkpoint(
    checkpoint: Annotated[Path, typer.Argument(
        help="A run directory (its latest checkpoint), a checkpoint or a model directory.")],
    env: Annotated[str | None, typer.Option(
        "--env", help="Another env id (its kwargs then come from --set env.kwargs.* only).")
    ] = None,
    n: Annotated[int | None, typer.Option(
        "--n", min=1, help="episodes (default: as many as the run's eval.heldout_episodes)"
    )] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="Override a key of the run's config: --set env.kwargs.difficulty=1")
    ] = None,
    show: Annotated[int, typer.Option(
        "--show", min=0, help="Print this many episodes whole: the chat, reward and its "
        "parts, tool calls, parse errors, the expected answer.")] = 0,
    json_: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Evaluate a checkpoint on held-out tasks (task seeds never trained on).

    Bad input (a path, env id, env kwargs or key) is one line on stderr and exit 2."""
    from parity.core.config import ConfigError
    from parity.envs.preflight import EnvConfigError
    from parity.trainer.checkpoint import CheckpointError
    from parity.trainer.evaluate import evaluate
    from parity.trainer.rundir import sample_markdown

    try:
        res = evaluate(checkpoint, env_id=env, n=n, overrides=set_ or [], show=show)
    except (FileNotFoundError, ConfigError, EnvConfigError, CheckpointError) as e:
        typer.echo(f"parity eval: {_one_line(e)}", err=True)
        raise typer.Exit(2) from None
    if json_:
        typer.echo(json.dumps(res, indent=2))
        return
    for i, sample in enumerate(res.pop("samples", [])):
        typer.echo(f"--- episode {i} ---\n{sample_markdown(sample)}\n")
    typer.echo(f"{res['checkpoint']} on {res['env']}: held-out success "
               f"{100 * res['pass_rate']:.1f}% over {res['n']} episodes, mean reward "
               f"{res['reward_mean']:.3f}")


def profile(
    run_dir: Annotated[Path, typer.Argument(help="A run directory.")],
    json_: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Where a run's wall time went."""
    from parity.trainer.plots import timing_plot
    from parity.trainer.profile import profile_run, render

    try:
        report = profile_run(run_dir)
    except FileNotFoundError as e:
        typer.echo(f"parity profile: {e}", err=True)
        raise typer.Exit(2) from None
    (run_dir / "plots").mkdir(exist_ok=True)
    states = {track: st["per_step"] for track, st in report["states"].items()}
    report["plot"] = str(timing_plot(states, run_dir / "plots" / "timing.png"))
    if json_:
        typer.echo(json.dumps(report, indent=2))
    else:
        render(report)
        typer.echo(f"plot: {report['plot']}")


def bench_async(
    json_: Annotated[bool, typer.Option("--json")] = False,
    config: Annotated[Path | None, typer.Option(
        "--config", help="default: the embedded default job")] = None,
    steps: Annotated[int, typer.Option("--steps", min=1, help="updates per run")] = 8,
    seeds: Annotated[int, typer.Option(
        "--seeds", min=1, help="runs per arm, on seeds train.seed, train.seed + 1, ...")] = 1,
    lag: Annotated[list[int] | None, typer.Option(
        "--lag", min=1, help="an async arm's max_lag, repeatable (default 2, 8 and 64); "
        "sync always runs")] = None,
    split: Annotated[str, typer.Option(
        "--split", help="the D3 split (train.track_mismatch): on, off or both")] = "both",
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="Override a key in every run: --set model.path=DIR")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", help="A new directory for the runs (default runs/bench-async-DATE-TIME).")] = None,
) -> None:
    """Sync vs async (lag 2, 8, 64), with and without the D3 split: updates per hour,
    held-out success (with --seeds N: its mean and paired difference from sync, each with
    its standard error) and per-actor utilisation."""
    from parity.core.config import ConfigError
    from parity.trainer.bench import LAGS
    from parity.trainer.bench import bench_async as run_bench

    tracks = {"on": (True,), "off": (False,), "both": (True, False)}
    if split not in tracks:
        typer.echo(f"parity bench async: --split: {split!r} is not one of on, off, both", err=True)
        raise typer.Exit(2)
    out = out or Path("runs") / time.strftime("bench-async-%Y%m%d-%H%M%S")
    try:
        res = run_bench(config, steps, out, set_ or [], seeds, tuple(lag or LAGS),
                        tracks[split], log=lambda line: typer.echo(line, err=True))
    except (ConfigError, FileNotFoundError, FileExistsError) as e:
        typer.echo(f"parity bench async: {e}", err=True)
        raise typer.Exit(2) from None
    if json_:
        typer.echo(json.dumps(res, indent=2))
        return
    for arm in res["arms"]:
        busy = ", ".join(f"{a} {100 * u:.0f}%" for a, u in arm["utilisation"].items())
        typer.echo(f"{arm['name']:>20}: {arm['updates_per_hour']:8.0f} updates/h "
                   f"({arm['speedup_vs_sync']:.2f}x sync), held-out success "
                   f"{_heldout(arm)}, busy: {busy}")


def bench_agent(
    json_: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    engine: Annotated[str, typer.Option(
        "--engine", help="stand-in (waits --engine-ms a call: the endpoint alone) or parity "
        "(the embedded model on parity's engine, batching the agents' calls)")] = "stand-in",
    episodes: Annotated[int, typer.Option("--episodes", min=1, help="agent episodes at once")] = 64,
    turns: Annotated[int, typer.Option("--turns", min=1, help="model calls per episode")] = 4,
    tokens: Annotated[int, typer.Option("--tokens", min=1, help="tokens a call generates (at "
                                        "most, with the parity engine)")] = 32,
    engine_ms: Annotated[float, typer.Option(
        "--engine-ms", min=0.0, help="the stand-in engine's time per call")] = 20.0,
) -> None:
    """What the OpenAI endpoint adds to a model call (p50/p99), agents using the SDK and
    agents posting JSON, with many agent episodes on one worker."""
    from parity.envs.agent.bench import report_lines, run_benchmark, stand_in

    if engine not in ("stand-in", "parity"):
        typer.echo(f"parity bench agent: --engine: {engine!r} is not one of stand-in, parity",
                   err=True)
        raise typer.Exit(2)
    make, tokenizer = stand_in(engine_ms, tokens), None
    if engine == "parity":
        from parity.engine import Engine, EngineConfig
        from parity.model import load_model
        from parity.trainer.embedded import EMBEDDED_DIR

        real = Engine(load_model(EMBEDDED_DIR, kernels="aligned"),
                      EngineConfig(kv_blocks=4096, max_batch_tokens=2048))
        make, tokenizer = (lambda tok: real.agenerate), str(EMBEDDED_DIR)
    report = {kind: run_benchmark(episodes, turns, tokens, kind == "json", make, tokenizer)
              for kind in ("sdk", "json")}
    if json_:
        typer.echo(json.dumps({"engine": engine, **report}, indent=2))
        return
    for line in report_lines(report, engine if engine == "parity" else f"stand-in {engine_ms:g} ms"):
        typer.echo(line)


def _heldout(arm: dict[str, Any]) -> str:
    """'48.4%' from one seed; '48.4% ± 2.3 (sync -1.6 ± 1.9)' from several."""
    if "heldout_success_after" not in arm:
        return "not evaluated"
    text = f"{100 * arm['heldout_success_after']:.1f}%"
    if arm["heldout_success_after_sem"] is None:
        return text
    return (f"{text} ± {100 * arm['heldout_success_after_sem']:.1f} (sync "
            f"{100 * arm['heldout_vs_sync']:+.1f} ± {100 * arm['heldout_vs_sync_sem']:.1f})")
