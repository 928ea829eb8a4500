"""Where a desktop step's time goes: latency percentiles, the per-phase breakdown, reset time,
per application (LibreOffice Calc and Writer, PCManFM, Firefox, Mousepad, xterm, the Tk apps),
settle-until-stable against OSWorld's fixed sleep, and how many desktops share 2 cores: with
the light Tk apps, with LibreOffice, and with the real GTK apps (Mousepad and Firefox).

Every episode plays a task's scripted oracle solution through the env's real step(), so a
"step" here is exactly what an agent's step costs minus the model; then every task's wrong
solution is played too, and those that scored above 0 are named (with the oracles below 1,
this is every task's check on a backend: CI plays only `sample.CI_SAMPLE`).
"""

from __future__ import annotations

import os
import statistics
import threading
import time

from .env import DesktopEnv
from .solutions import play
from .tasks import load_tasks

PHASES = ("parse_s", "action_s", "settle_s", "screenshot_s", "tree_s", "marks_s", "eval_s", "overhead_s")
RESET_PHASES = ("sandbox_s", "reset_s", "setup_s", "screenshot_s", "tree_s")
TK_APPS = ("files", "textedit", "sheet", "settings")
"""The repo's small Tk apps: the concurrency levels up to 32 desktops play their tasks."""
REAL_APPS = ("mousepad", "firefox")
"""Real apps whose oracles never WAIT (PCManFM's wait a second for dialogs, which would be the
p99 by design; LibreOffice has its own levels): the real-app concurrency levels play them."""
OSWORLD_SLEEP_S = 2.0
"""OSWorld's pause after every action (its `sleep_after_execution` in the published runs)."""
SEED_TRAINING_STEP_S = (884.17, 944.25)
"""The seed's OSWorld seconds per training step (standard + gate, aligned)."""


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0.0


def _rss_mb(root: int) -> float:
    """Resident memory of a process tree in MB (from /proc)."""
    total, stack, children = 0, [root], {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                children.setdefault(int(fields[1]), []).append((int(entry), int(fields[21])))
            except (OSError, IndexError):
                continue
    while stack:
        for pid, rss_pages in children.get(stack.pop(), []):
            total += rss_pages
            stack.append(pid)
    return total * os.sysconf("SC_PAGE_SIZE") / 1e6


Episode = tuple[str, float, list[dict]]
"""(task id, reward, env.last_timing after the reset and after each step)."""


def _episodes(env: DesktopEnv, task_ids: list[str], errors: list[str], which: str = "oracle") -> list[Episode]:
    """Play each task's oracle (or `which` solution).

    An episode that raises (e.g. an app too slow to open under load) scores 0, has no
    timings, and its message is appended to `errors`.
    """
    played: list[Episode] = []
    for task_id in task_ids:
        try:
            reward, timings = play(env, task_id, which)
        except Exception as e:  # measured, not fatal: the report counts it
            errors.append(f"{task_id}: {e}")
            played.append((task_id, 0.0, []))
            continue
        played.append((task_id, reward, timings))
    return played


def _summary(played: list[Episode]) -> dict:
    steps = [t for _, _, timings in played for t in timings[1:]]
    resets = [timings[0] for _, _, timings in played if timings]
    rewards = [reward for _, reward, _ in played]
    step_s = [t["step_s"] for t in steps]
    reset_s = [t["reset_s"] + t["setup_s"] + t["sandbox_s"] for t in resets]
    total = sum(step_s) or 1.0
    return {
        "episodes": len(rewards), "steps": len(steps), "success_rate": sum(rewards) / max(1, len(rewards)),
        "failed": sorted({task_id for task_id, reward, _ in played if reward < 1.0}),
        "step_p50_s": _pct(step_s, 0.5), "step_p99_s": _pct(step_s, 0.99), "step_mean_s": statistics.fmean(step_s),
        "breakdown_mean_s": {p: statistics.fmean(t.get(p, 0.0) for t in steps) for p in PHASES},
        "breakdown_share": {p: sum(t.get(p, 0.0) for t in steps) / total for p in PHASES},
        "reset_p50_s": _pct(reset_s, 0.5), "reset_p99_s": _pct(reset_s, 0.99),
        "reset_breakdown_mean_s": {p: statistics.fmean(t[p] for t in resets) if resets else 0.0
                                   for p in RESET_PHASES},
    }


def _by_app(played: list[Episode], app_of: dict[str, str]) -> dict[str, dict]:
    """The summary of each application's episodes (its tasks' first related app)."""
    apps = sorted({app_of[task_id] for task_id, _, _ in played})
    return {app: _summary([e for e in played if app_of[e[0]] == app]) for app in apps}


def _concurrent(n: int, task_ids: list[str], backend: str) -> dict:
    envs = [DesktopEnv(backend=backend, obs_mode="screenshot_a11y_tree") for _ in range(n)]
    out: list[list[Episode]] = [[] for _ in range(n)]
    rss: list[float] = [0.0] * n
    errors: list[str] = []

    def run(i: int) -> None:
        out[i] = _episodes(envs[i], task_ids, errors)
        if envs[i].sandbox is not None and (pid := envs[i].sandbox.guest.pid) is not None:
            rss[i] = _rss_mb(pid)

    start = time.monotonic()
    try:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for e in envs:
            e.close()
    wall = time.monotonic() - start
    summary = _summary([e for o in out for e in o])
    return {"desktops": n, "wall_s": wall, "steps_per_s": summary["steps"] / wall, "errors": errors[:5],
            "rss_mb_per_desktop": statistics.fmean(rss) if any(rss) else None,
            **{k: summary[k] for k in ("success_rate", "failed", "step_p50_s", "step_p99_s", "reset_p50_s")}}


def run_benchmark(backend: str = "local", levels: tuple[int, ...] = (1, 2, 4, 8, 16, 32),
                  p99_budget_s: float = 1.0, office_levels: tuple[int, ...] = (1, 2, 4),
                  real_levels: tuple[int, ...] = (1, 2, 4, 8), task_ids: list[str] | None = None) -> dict:
    """Measure everything in one run; `p99_budget_s` decides how many desktops "fit" on this machine.

    Concurrency plays the first five tasks of the repo's light Tk apps (32 LibreOffice
    instances do not fit in this machine's memory; the file manager's oracles WAIT a second);
    `office_levels` desktops at once play the first three LibreOffice tasks, `real_levels`
    the first three tasks of each of REAL_APPS. `task_ids`: play only these (default: every
    shipped task), and draw the concurrency levels' tasks from them.
    """
    all_tasks = load_tasks()
    tasks = [t.id for t in all_tasks if task_ids is None or t.id in task_ids]
    app_of = {t.id: t.related_apps[0] for t in all_tasks}
    light = [t for t in tasks if app_of[t] in TK_APPS]
    office = [t for t in tasks if app_of[t].startswith("libreoffice")]
    real = [t for app in REAL_APPS for t in [t for t in tasks if app_of[t] == app][:3]]
    errors: list[str] = []
    env = DesktopEnv(backend=backend, obs_mode="screenshot_a11y_tree")
    try:
        start = time.monotonic()
        env.reset(options={"task_id": tasks[0]})
        cold_start_s = time.monotonic() - start
        played = _episodes(env, tasks, errors)
        wrong = _episodes(env, tasks, errors, "wrong")
    finally:
        env.close()
    settle = _summary(played)
    sample = tasks[::4]  # a few tasks under OSWorld's fixed sleep: same actions, fixed pauses
    fixed_env = DesktopEnv(backend=backend, obs_mode="screenshot_a11y_tree", fixed_sleep_s=OSWORLD_SLEEP_S)
    try:
        fixed = _summary(_episodes(fixed_env, sample, errors))
    finally:
        fixed_env.close()
    concurrency = [_concurrent(n, light[:5], backend) for n in levels]
    office_concurrency = [_concurrent(n, office[:3], backend) for n in office_levels]
    real_concurrency = [_concurrent(n, real, backend) for n in real_levels]

    def fits(levels: list[dict]) -> int:
        return max((c["desktops"] for c in levels if c["step_p99_s"] <= p99_budget_s
                    and c["success_rate"] == 1.0), default=0)
    return {
        "backend": backend, "cpus": os.cpu_count(), "screen": "1024x768", "obs_mode": "screenshot_a11y_tree",
        "cold_start_s": cold_start_s, "settle": settle, "by_app": _by_app(played, app_of),
        "wrong": {"episodes": len(wrong), "scored_above_zero": sorted(t for t, reward, _ in wrong if reward > 0.0)},
        "fixed_sleep": {"sleep_s": OSWORLD_SLEEP_S, "tasks": sample, **fixed,
                        "step_p50_ratio_vs_settle": fixed["step_p50_s"] / settle["step_p50_s"]},
        "concurrency": concurrency, "office_concurrency": office_concurrency,
        "real_concurrency": {"tasks": real, "levels": real_concurrency}, "p99_budget_s": p99_budget_s,
        "max_concurrent_desktops_within_budget": fits(concurrency),
        "max_concurrent_office_desktops_within_budget": fits(office_concurrency),
        "max_concurrent_real_desktops_within_budget": fits(real_concurrency), "errors": errors[:5],
        "seed_osworld_training_step_s": list(SEED_TRAINING_STEP_S),
    }
