"""`parity bench desktop`: the lead registers `bench_desktop` under the `bench` command group."""

from __future__ import annotations

import json

import typer


def bench_desktop(
    json_: bool = typer.Option(False, "--json", help="print one JSON object"),
    backend: str = typer.Option("local", help="local (bubblewrap) or docker"),
) -> None:
    """Desktop step latency p50/p99 and its breakdown, reset time, settle vs fixed sleep, and
    how many desktops run at once on this machine; every task's oracle and wrong solution."""
    from parity.envs.desktop.bench import run_benchmark

    if backend not in ("local", "docker"):
        typer.echo(f"parity bench desktop: --backend must be local or docker, not {backend!r}", err=True)
        raise typer.Exit(2)
    r = run_benchmark(backend)
    typer.echo(json.dumps(r, indent=2) if json_ else report(r))


def _failed(summary: dict) -> str:
    """' (scored below 1: a, b)' naming the tasks whose oracle failed, or ''."""
    return f" (scored below 1: {', '.join(summary['failed'])})" if summary["failed"] else ""


def report(r: dict) -> str:
    """The text `parity bench desktop` prints for a result of `run_benchmark`."""
    from parity.envs.desktop.bench import PHASES

    lines: list[str] = []
    s, f = r["settle"], r["fixed_sleep"]
    lines.append(f"desktop ({r['backend']}, {r['cpus']} CPUs, {r['screen']}, {r['obs_mode']}): "
                 f"{s['episodes']} oracle episodes, {s['steps']} steps, success {s['success_rate']:.2f}"
                 + _failed(s))
    w = r["wrong"]
    lines.append(f"  {w['episodes']} wrong-solution episodes" + (
        f", scored above 0: {', '.join(w['scored_above_zero'])}" if w["scored_above_zero"] else ", all scored 0"))
    lines.append(f"  step p50 {s['step_p50_s'] * 1e3:.0f} ms, p99 {s['step_p99_s'] * 1e3:.0f} ms; "
                 f"reset p50 {s['reset_p50_s'] * 1e3:.0f} ms, p99 {s['reset_p99_s'] * 1e3:.0f} ms; "
                 f"cold start {r['cold_start_s']:.2f} s")
    lines.append("  where a step goes: " + ", ".join(
        f"{p[:-2]} {s['breakdown_mean_s'][p] * 1e3:.0f} ms ({s['breakdown_share'][p]:.0%})" for p in PHASES))
    for app, a in r["by_app"].items():
        lines.append(f"  {app}: {a['episodes']} episodes, step p50 {a['step_p50_s'] * 1e3:.0f} ms, p99 "
                     f"{a['step_p99_s'] * 1e3:.0f} ms, reset p50 {a['reset_p50_s']:.2f} s; " + ", ".join(
                       f"{p[:-2]} {a['breakdown_mean_s'][p] * 1e3:.0f} ms" for p in PHASES))
    lines.append(f"  OSWorld-style fixed {f['sleep_s']:g} s sleep: step p50 {f['step_p50_s']:.2f} s = "
                 f"{f['step_p50_ratio_vs_settle']:.1f}x the settle-until-stable step")
    for c in [*r["concurrency"], *({**c, "desktops": f"{c['desktops']} office"} for c in r["office_concurrency"]),
              *({**c, "desktops": f"{c['desktops']} real-app"} for c in r["real_concurrency"]["levels"])]:
        rss = f"{c['rss_mb_per_desktop']:.0f} MB" if c["rss_mb_per_desktop"] else "n/a"
        lines.append(f"  {c['desktops']} desktops at once: step p50 {c['step_p50_s'] * 1e3:.0f} ms, "
                     f"p99 {c['step_p99_s'] * 1e3:.0f} ms, {c['steps_per_s']:.1f} steps/s, "
                     f"success {c['success_rate']:.2f}{_failed(c)}, {rss} each"
                     + (f"; first error: {c['errors'][0]}" if c["errors"] else ""))
    lines.append(f"  desktops within a {r['p99_budget_s']:g} s step p99: {r['max_concurrent_desktops_within_budget']} "
                 f"(Tk apps), {r['max_concurrent_office_desktops_within_budget']} (LibreOffice), "
                 f"{r['max_concurrent_real_desktops_within_budget']} (Mousepad and Firefox: "
                 f"{', '.join(r['real_concurrency']['tasks'])})")
    return "\n".join(lines)
