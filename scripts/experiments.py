"""Reproduce the seeds' comparisons at small scale and write docs/experiments.md.

    uv run python scripts/experiments.py                 # all experiments (long: see --only)
    uv run python scripts/experiments.py --only kernels  # one group
    uv run python scripts/experiments.py --only bf16 --steps 200  # the bf16 drift experiment
    uv run python scripts/experiments.py --only vllm-bf16 --steps 40  # needs build_vllm_env.sh
    uv run python scripts/experiments.py --report-only   # rebuild the page from runs/experiments

Each run is a plain `parity train` of the embedded default with overrides; runs go to
runs/experiments/<name>, plots to docs/img/, the tables to docs/experiments.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "runs" / "experiments"
IMG = ROOT / "docs" / "img"

COMMON = ["output.progress=false", "eval.heldout_episodes=0"]
HELDOUT = ["eval.heldout_episodes=64"]  # later --set wins: these runs report held-out success
GROUPS: dict[str, dict[str, list[str]]] = {
    "kernels": {
        "aligned": ["model.kernels=\"aligned\""],
        "standard": ["model.kernels=\"standard\""],
        "standard+gate": ["model.kernels=\"standard\"", "loss.gate_kl=0.001"],
    },
    "async": {
        "sync": ["train.mode=\"sync\""],
        "async-lag2": ["train.mode=\"async\"", "train.max_lag=2"],
        "async-lag8": ["train.mode=\"async\"", "train.max_lag=8"],
    },
    "vllm": {  # the same job on parity's aligned engine and on vLLM (docs/vllm.md)
        "parity-aligned": [],
        "vllm": ["rollout.engine=\"vllm\""],
        "vllm+tis": ["rollout.engine=\"vllm\"", "loss.is_mode=\"tis\""],
        "vllm+gate": ["rollout.engine=\"vllm\"", "loss.gate_kl=0.001"],
    },
    "vllm-bf16": {  # the same job in bf16 on vLLM: parity's decoder in it vs vLLM's own
        "vllm-aligned-bf16": ["rollout.engine=\"vllm-aligned\"", "model.dtype=\"bfloat16\"",
                              *HELDOUT],
        "vllm-bf16": ["rollout.engine=\"vllm\"", "model.dtype=\"bfloat16\"", *HELDOUT],
        "vllm-bf16+gate": ["rollout.engine=\"vllm\"", "model.dtype=\"bfloat16\"",
                           "loss.gate_kl=0.001", *HELDOUT],
    },
    "bf16": {  # the seeds' comparison in bf16, where standard kernels' mismatch is not ~1e-13
        "bf16-aligned": ["model.dtype=\"bfloat16\"", *HELDOUT],
        "bf16-standard": ["model.dtype=\"bfloat16\"", "model.kernels=\"standard\"", *HELDOUT],
        "bf16-standard+tis": ["model.dtype=\"bfloat16\"", "model.kernels=\"standard\"",
                              "loss.is_mode=\"tis\"", *HELDOUT],
        "bf16-standard+gate": ["model.dtype=\"bfloat16\"", "model.kernels=\"standard\"",
                               "loss.gate_kl=0.001", *HELDOUT],
        "bf16-aligned-lag8": ["model.dtype=\"bfloat16\"", "train.max_lag=8", *HELDOUT],
        "bf16-standard-lag8": ["model.dtype=\"bfloat16\"", "model.kernels=\"standard\"",
                               "train.max_lag=8", *HELDOUT],
    },
    "vcpo": {
        "lag8-vcpo-off": ["train.max_lag=8"],
        "lag8-vcpo-on": ["train.max_lag=8", "loss.vcpo_lr=\"linear\"", "loss.vcpo_baseline=true"],
    },
}


def run(name: str, overrides: list[str], steps: int) -> None:
    out = RUNS / name
    cmd = ["uv", "run", "parity", "train", "--out", str(out), "--set", f"train.steps={steps}"]
    for o in COMMON + overrides:
        cmd += ["--set", o]
    print(f"== {name}: {' '.join(cmd)}", flush=True)
    t0 = time.time()
    # a run that learned nothing exits 1 with its summary written: it is a result here
    rc = subprocess.run(cmd, cwd=ROOT).returncode
    print(f"== {name}: {time.time() - t0:.0f}s, exit {rc}", flush=True)


def metrics(name: str) -> list[dict]:
    path = RUNS / name / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summary(name: str) -> dict:
    return json.loads((RUNS / name / "summary.json").read_text())


def window(rows: list[dict], key: str, first: bool, frac: float = 0.25) -> float:
    n = max(1, int(len(rows) * frac))
    part = rows[:n] if first else rows[-n:]
    vals = [r[key] for r in part if key in r]
    return statistics.median(vals) if vals else float("nan")


def peak_over_median(rows: list[dict], key: str = "is/d3") -> float:
    vals = [r[key] for r in rows if key in r]
    med = statistics.median(vals) if vals else 0.0
    return max(vals) / med if med > 0 else float("inf") if vals and max(vals) > 0 else 1.0


def plot(names: list[str], key: str, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    for n in names:
        rows = metrics(n)
        ax.plot([r["step"] for r in rows], [r.get(key, float("nan")) for r in rows], label=n)
    ax.set_xlabel("update")
    ax.set_ylabel(key)
    ax.set_title(title)
    if key.startswith(("is/d3", "kl/")):
        ax.set_yscale("symlog", linthresh=1e-9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def heldout(s: dict) -> str:
    """Held-out success before → after from a run's summary; "—" for a run without it."""
    if "heldout_success_after" not in s:
        return "—"
    return f"{s['heldout_success_before']:.1%} → {s['heldout_success_after']:.1%}"


def finished(group: str) -> list[str]:
    """The runs of `group` that have finished (their summary.json exists)."""
    return [n for n in GROUPS[group] if (RUNS / n / "summary.json").is_file()]


def mismatch_plots(names: list[str], prefix: str) -> list[str]:
    """D3 mismatch, KL and reward of the runs, as docs/img/<prefix>_*.png; their markdown."""
    plots = (("d3_mismatch", "is/d3_mismatch", "D3 mismatch (same weights)"),
             ("kl", "kl/rollout_learner", "rollout-to-learner KL"), ("reward", "reward/mean", "reward"))
    for file, key, title in plots:
        plot(names, key, IMG / f"{prefix}_{file}.png", title)
    return ["", " ".join(f"![{title}](img/{prefix}_{file}.png)" for file, _, title in plots), ""]


def report(groups: list[str]) -> str:
    IMG.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    if "kernels" in groups:
        names = finished("kernels")
        lines += ["### Aligned vs standard kernels", "",
                  "| run | D3 peak/median | D3 mismatch max | KL first→last (median) | KL rise | reward first→last | gate rejected (last window) |",
                  "|---|---|---|---|---|---|---|"]
        for n in names:
            rows, s = metrics(n), summary(n)
            k0, k1 = window(rows, "kl/rollout_learner", True), window(rows, "kl/rollout_learner", False)
            rise = k1 / k0 if k0 > 0 else float("nan")
            lines.append(
                f"| {n} | {peak_over_median(rows):.2f}× | {s.get('is/d3_mismatch/max', 0):.3g} | "
                f"{k0:.3g} → {k1:.3g} | {rise:.2f}× | {window(rows, 'reward/mean', True):.2f} → "
                f"{window(rows, 'reward/mean', False):.2f} | {window(rows, 'gate/rejected_frac', False):.1%} |")
        lines += mismatch_plots(names, "kernels")
    if "async" in groups:
        names = finished("async")
        base = summary("sync")["wall_s"] if "sync" in names else None
        lines += ["### Async vs sync", "", "| run | updates | wall s | speed-up vs sync | final reward (last window) | lag mean/max |",
                  "|---|---|---|---|---|---|"]
        for n in names:
            rows, s = metrics(n), summary(n)
            sp = f"{base / s['wall_s']:.2f}×" if base else "—"
            lines.append(f"| {n} | {s['steps']} | {s['wall_s']:.0f} | {sp} | "
                         f"{window(rows, 'reward/mean', False):.2f} | "
                         f"{s.get('lag/mean/mean', 0):.2f}/{s.get('lag/max/max', 0):.0f} |")
        plot(names, "reward/mean", IMG / "async_reward.png", "reward by update")
        lines += ["", "![reward](img/async_reward.png)", ""]
    for group, title in (("vllm", "parity's aligned engine vs vLLM"),
                         ("vllm-bf16", "bf16 on vLLM: parity's decoder in vLLM vs vLLM's own")):
        if group not in groups:
            continue
        names = finished(group)
        lines += [f"### {title}", "",
                  "| run | D3 peak/median | D3 mismatch median / max | KL first→last (median) | reward first→last | held-out before→after | gate rejected (mean) | wall s |",
                  "|---|---|---|---|---|---|---|---|"]
        for n in names:
            rows, s = metrics(n), summary(n)
            mm = [r["is/d3_mismatch"] for r in rows if "is/d3_mismatch" in r]
            gate = [r.get("gate/rejected_frac", 0.0) for r in rows]
            lines.append(
                f"| {n} | {peak_over_median(rows):.2f}× | {statistics.median(mm):.3g} / {max(mm):.3g} | "
                f"{window(rows, 'kl/rollout_learner', True):.3g} → {window(rows, 'kl/rollout_learner', False):.3g} | "
                f"{window(rows, 'reward/mean', True):.2f} → {window(rows, 'reward/mean', False):.2f} | "
                f"{heldout(s)} | {statistics.mean(gate):.1%} | {s['wall_s']:.0f} |")
        lines += mismatch_plots(names, group.replace("-", "_"))
    if "bf16" in groups:
        names = finished("bf16")
        lines += ["### bf16: aligned vs standard, TIS, the sequence gate, lag 8", "",
                  "| run | updates | lag mean | D3 peak/median | D3 mismatch median / max | mismatch first→last quarter (median) | D3 lag median | mismatch ÷ lag | "
                  "KL first→last quarter (median) | KL rise | reward first→last quarter | held-out before→after | gate rejected (mean) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for n in names:
            rows, s = metrics(n), summary(n)
            mm = [r["is/d3_mismatch"] for r in rows if "is/d3_mismatch" in r]
            lag = statistics.median([r["is/d3_lag"] for r in rows if "is/d3_lag" in r])
            k0, k1 = window(rows, "kl/rollout_learner", True), window(rows, "kl/rollout_learner", False)
            gate = [r.get("gate/rejected_frac", 0.0) for r in rows]
            ratio = statistics.median(mm) / lag if lag > 0 else float("nan")
            lines.append(
                f"| {n} | {s['updates']} | {s.get('lag/mean/mean', 0):.2f} | {peak_over_median(rows):.2f}× | "
                f"{statistics.median(mm):.3g} / {max(mm):.3g} | {window(rows, 'is/d3_mismatch', True):.3g} → {window(rows, 'is/d3_mismatch', False):.3g} | {lag:.3g} | {ratio:.2g} | {k0:.3g} → {k1:.3g} | {k1 / k0 if k0 > 0 else float('nan'):.2f}× | "
                f"{window(rows, 'reward/mean', True):.2f} → {window(rows, 'reward/mean', False):.2f} | "
                f"{heldout(s)} | "
                f"{statistics.mean(gate):.1%} |")
        lines += mismatch_plots(names, "bf16")
        plot(names, "is/d3_lag", IMG / "bf16_d3_lag.png", "D3 lag (weights moved)")
        lines += ["![D3 lag](img/bf16_d3_lag.png)", ""]
    if "vcpo" in groups:
        names = finished("vcpo")
        lines += ["### VCPO at lag 8", "", "| run | ESS frac median | steps with ESS > 0.6N | grad-norm variance | final reward |",
                  "|---|---|---|---|---|"]
        for n in names:
            rows = metrics(n)
            ess = [r["is/ess_frac"] for r in rows]
            gn = [r["grad/norm"] for r in rows]
            lines.append(f"| {n} | {statistics.median(ess):.3f} | {sum(e > 0.6 for e in ess) / len(ess):.0%} | "
                         f"{statistics.pvariance(gn):.4g} | {window(rows, 'reward/mean', False):.2f} |")
        plot(names, "is/ess_frac", IMG / "vcpo_ess.png", "ESS / N")
        lines += ["", "![ESS](img/vcpo_ess.png)", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=list(GROUPS), action="append")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    groups = args.only or list(GROUPS)
    if not args.report_only:
        for g in groups:
            for name, overrides in GROUPS[g].items():
                run(name, overrides, args.steps)
    print(report(groups))


if __name__ == "__main__":
    sys.exit(main())
