"""The docker backend: the image from scripts/build_desktop_image.sh, network none, hardened; CI's
sample of tasks (and, marked desktop_full, every task) played in it."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from desktop_support import check_solutions

from parity.envs.desktop.env import DesktopEnv
from parity.envs.desktop.sample import CI_SAMPLE
from parity.envs.desktop.sandbox import IMAGE, pick_backend
from parity.envs.desktop.solutions import play
from parity.envs.desktop.tasks import load_tasks
from parity.sandboxes.docker_backend import LABEL

pytestmark = pytest.mark.docker


def _unusable(why: str) -> None:
    """Skip, or fail where docker is required (PARITY_REQUIRE_DOCKER=1, as in CI)."""
    if os.environ.get("PARITY_REQUIRE_DOCKER") == "1":
        pytest.fail(f"PARITY_REQUIRE_DOCKER=1 but the desktop cannot run on docker: {why}")
    pytest.skip(why)


@pytest.fixture(scope="module")
def docker_client():
    import docker

    try:
        client = docker.from_env()
        client.ping()
    except Exception as e:  # no engine
        _unusable(f"no Docker engine ({e}); start one with scripts/docker_up.sh")
    try:
        client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        _unusable(f"image {IMAGE} missing; build it with scripts/build_desktop_image.sh")
    return client


@pytest.fixture(scope="module")
def docker_env(docker_client) -> Iterator[DesktopEnv]:
    """One docker desktop for the module's tasks, screenshots only (as the local tests play them)."""
    env = DesktopEnv(backend="docker", obs_mode="screenshot")
    yield env
    env.close()


# Firefox first (CI_SAMPLE's order): its AT-SPI tree was lost on Docker from a later episode on
# in 2 of 7 scripted runs (docs/desktop.md, "Not done")
@pytest.mark.parametrize("task_id", CI_SAMPLE)
def test_sample_oracle_on_docker(docker_env: DesktopEnv, task_id: str) -> None:
    """CI's sample (every app, getter and metric) in the image, oracles only (the wrong solutions
    are played locally): its Firefox ESR 140 keeps the address bar's URL in a child of a closed
    combo box (a newer host Firefox, in the combo box itself)."""
    assert play(docker_env, task_id, "oracle")[0] == 1.0


@pytest.mark.desktop_full
@pytest.mark.parametrize("task_id", [t.id for t in load_tasks()])
def test_every_task_on_docker(docker_env: DesktopEnv, task_id: str) -> None:
    check_solutions(docker_env, task_id)


def test_docker_desktop_is_the_default_and_hardened(docker_client) -> None:
    assert pick_backend("auto") == "docker"  # the default where an engine and the image exist
    env = DesktopEnv(backend="docker")
    try:
        assert play(env, "terminal-write-answer", "oracle")[0] == 1.0
        container = env.sandbox.guest.container  # type: ignore[union-attr]
        host = container.attrs["HostConfig"]
        assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] is True
        assert host["CapDrop"] == ["ALL"] and host["SecurityOpt"] == ["no-new-privileges"]
        assert host["PidsLimit"] == 256 and host["Memory"] == host["MemorySwap"] == 1024 << 20
        out = env.client.setup({"type": "execute", "parameters": {  # type: ignore[union-attr]
            "command": "id -u; cat /proc/net/dev | wc -l", "shell": True}})
        assert out["stdout"].split() == ["1000", "3"]
    finally:
        env.close()
    # its container is gone with it (the module's shared desktop may still be running)
    left = docker_client.containers.list(all=True, filters={"label": LABEL})
    assert container.id not in {c.id for c in left}
