"""The pool: reuse, reset between leases, recycling, health checks, bounded concurrency."""

from __future__ import annotations

import asyncio

import pytest

from parity.sandboxes import Limits, SandboxError, SandboxPool

pytestmark = pytest.mark.timeout(180)
LIMITS = Limits(timeout_s=5)


def test_reuse_and_reset_between_leases(backend: str) -> None:
    with SandboxPool(backend, size=1, limits=LIMITS) as pool:
        with pool.acquire() as first:
            first.write_file("left.txt", "x")
            first.python_session().run("y = 1")
        with pool.acquire() as second:
            assert second is first
            assert second.run(["ls", "-A", "/work", "/tmp"]).stdout == "/tmp:\n\n/work:\n"
        assert pool.created == 1


def test_recycle_after_max_uses(backend: str) -> None:
    with SandboxPool(backend, size=1, limits=LIMITS, max_uses=2) as pool:
        seen = []
        for _ in range(3):
            with pool.acquire() as sb:
                seen.append(sb)
        assert seen[0] is seen[1] and seen[2] is not seen[0]
        assert not seen[0].alive and pool.created == 2 and pool.recycled == 1


def test_recycle_after_a_limit_breach(backend: str) -> None:
    with SandboxPool(backend, size=1, limits=LIMITS) as pool:
        with pool.acquire() as sb:
            assert sb.run(["sleep", "10"], timeout_s=0.5).timed_out
        with pool.acquire() as sb2:
            assert sb2 is not sb and not sb.alive


def test_health_check_replaces_a_dead_sandbox() -> None:
    with SandboxPool("local", size=1, limits=LIMITS) as pool:
        pool.warm()
        with pool.acquire() as sb:
            pass
        sb._destroy()  # the helper and bubblewrap die behind the pool's back
        with pool.acquire() as sb2:
            assert sb2 is not sb
            assert sb2.run(["echo", "ok"]).stdout == "ok\n"


def test_concurrency_is_bounded_async() -> None:
    active = peak = 0

    async def job(pool: SandboxPool) -> str:
        nonlocal active, peak
        async with pool.lease() as sb:
            active += 1
            peak = max(peak, active)
            r = await sb.arun(["sh", "-c", "sleep 0.2; echo done"])
            active -= 1
            return r.stdout

    async def main() -> list[str]:
        async with SandboxPool("local", size=2, limits=LIMITS) as pool:
            pool.warm()
            out = await asyncio.gather(*(job(pool) for _ in range(6)))
            assert pool.created == 2  # six jobs, two sandboxes, each reused
            return out

    assert asyncio.run(main()) == ["done\n"] * 6
    assert 1 <= peak <= 2


def test_acquire_times_out_when_exhausted() -> None:
    with (
        SandboxPool("local", size=1, limits=LIMITS, acquire_timeout_s=0.2) as pool,
        pool.acquire(),
        pytest.raises(SandboxError, match=r"no sandbox free within 0\.2s"),
        pool.acquire(),
    ):
        pass


def test_closed_pool_refuses_and_closes_returning_sandboxes() -> None:
    pool = SandboxPool("local", size=2, limits=LIMITS)
    pool.warm()
    with pool.acquire() as sb:
        pool.close()
    assert not sb.alive
    with pytest.raises(SandboxError, match="closed"), pool.acquire():
        pass


def test_bad_pool_arguments() -> None:
    with pytest.raises(SandboxError, match="size and max_uses must be >= 1"):
        SandboxPool("local", size=0)


def test_creation_rate_limit() -> None:
    import time

    with SandboxPool("local", size=3, limits=LIMITS, min_create_interval_s=0.3) as pool:
        t0 = time.monotonic()
        pool.warm()
        assert pool.created == 3
        assert time.monotonic() - t0 >= 0.6  # two waits between three creations (a lower bound)
