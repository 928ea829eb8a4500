"""`parity bench sandbox`: latency of `python3 -c "print(1)"` cold and warm, and executions/s.

cold: start a sandbox, run once (closing it is not timed).  warm: lease from a warmed pool
(health check and reset included) and run.  exec/s: `c` workers sharing a pool of size `c`.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from parity.sandboxes.backends import open_sandbox
from parity.sandboxes.limits import Limits
from parity.sandboxes.pool import SandboxPool
from parity.sandboxes.result import SandboxError

PRINT_1 = ["python3", "-c", "print(1)"]
# Calls per measurement (cold, warm, throughput) per backend; containers start slower.
COUNTS = {"local": (20, 100, 200), "docker": (10, 50, 100)}


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _ms(values: list[float]) -> dict[str, float]:
    return {"p50_ms": 1000 * statistics.median(values), "p99_ms": 1000 * _percentile(values, 0.99)}


def _check(stdout: str) -> None:
    if stdout != "1\n":
        raise SandboxError(f"benchmark command printed {stdout!r}, expected '1\\n'")


def cold_latencies(backend: str, n: int, limits: Limits) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        sb = open_sandbox(backend, limits)
        r = sb.run(PRINT_1)
        out.append(time.perf_counter() - t0)
        sb.close()
        _check(r.stdout)
    return out


def warm_latencies(backend: str, n: int, limits: Limits) -> list[float]:
    out = []
    with SandboxPool(backend, size=1, limits=limits, max_uses=10**9) as pool:
        pool.warm()
        for _ in range(n):
            t0 = time.perf_counter()
            with pool.acquire() as sb:
                r = sb.run(PRINT_1)
            out.append(time.perf_counter() - t0)
            _check(r.stdout)
    return out


async def _throughput(backend: str, concurrency: int, total: int, limits: Limits) -> float:
    async with SandboxPool(backend, size=concurrency, limits=limits, max_uses=10**9) as pool:
        await asyncio.to_thread(pool.warm)
        left = total

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                async with pool.lease() as sb:
                    _check((await sb.arun(PRINT_1)).stdout)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return total / (time.perf_counter() - t0)


def bench_backend(backend: str) -> dict[str, Any]:
    """All figures for one backend, or {"unavailable": why}."""
    limits = Limits(timeout_s=30)
    n_cold, n_warm, n_tput = COUNTS[backend]
    try:
        cold = _ms(cold_latencies(backend, n_cold, limits))
    except SandboxError as exc:
        return {"unavailable": str(exc)}
    warm = _ms(warm_latencies(backend, n_warm, limits))
    tput = {c: asyncio.run(_throughput(backend, c, n_tput, limits)) for c in (1, 8)}
    return {
        "cold_p50_ms": cold["p50_ms"],
        "cold_p99_ms": cold["p99_ms"],
        "warm_p50_ms": warm["p50_ms"],
        "warm_p99_ms": warm["p99_ms"],
        "cold_over_warm_p50": cold["p50_ms"] / warm["p50_ms"],
        "exec_per_s_c1": tput[1],
        "exec_per_s_c8": tput[8],
        "c8_over_c1": tput[8] / tput[1],
    }


GOALS = {"local": ("warm_p50_ms", 25.0), "docker": ("warm_p50_ms", 100.0)}


def run_benchmark(backends: tuple[str, ...] = ("local", "docker")) -> dict[str, Any]:
    report: dict[str, Any] = {name: bench_backend(name) for name in backends}
    goals = {}
    for name, (key, bound) in GOALS.items():
        if name in report and key in report[name]:
            goals[f"{name}_{key}<={bound:g}"] = report[name][key] <= bound
    if "exec_per_s_c1" in report.get("local", {}):
        best = max(report["local"]["exec_per_s_c1"], report["local"]["exec_per_s_c8"])
        goals["local_exec_per_s>=40"] = best >= 40
    report["goals_met"] = goals
    return report
