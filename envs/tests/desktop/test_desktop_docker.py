"""The docker backend: the image from scripts/build_desktop_image.sh, network none, hardened."""

from __future__ import annotations

import os

import pytest

from parity.envs.desktop.env import DesktopEnv
from parity.envs.desktop.sandbox import IMAGE, pick_backend
from parity.envs.desktop.solutions import play
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


def test_docker_desktop_runs_tasks_and_is_hardened(docker_client) -> None:
    assert pick_backend("auto") == "docker"  # the default where an engine and the image exist
    env = DesktopEnv(backend="docker")
    try:
        # Firefox first: its AT-SPI tree was lost on Docker from a later episode on in 2 of
        # 7 scripted runs (docs/desktop.md, "Not done")
        assert play(env, "browser-order-form", "oracle")[0] == 1.0  # Firefox, clicked by its AT-SPI tree
        # the address bar, read from the tree: the image's Firefox ESR 140 keeps the URL in
        # a child of a closed combo box (a newer host Firefox, in the combo box itself)
        assert play(env, "browser-follow-link", "oracle")[0] == 1.0
        assert play(env, "browser-bookmark-page", "wrong")[0] == 0.0
        assert play(env, "sheet-add-row", "oracle")[0] == 1.0
        assert play(env, "calc-total-row", "oracle")[0] == 1.0  # LibreOffice is in the image
        assert play(env, "writer-page-break", "wrong")[0] == 0.0
        assert play(env, "pcmanfm-move", "oracle")[0] == 1.0  # and the file manager,
        assert any(r["class"] == "atspi" and r["name"] == "File" for r in env.rows())  # with its AT-SPI tree
        assert play(env, "terminal-write-answer", "wrong")[0] == 0.0
        assert play(env, "mousepad-save-new-file", "oracle")[0] == 1.0  # the text editor, its dialog by AT-SPI
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
    assert docker_client.containers.list(all=True, filters={"label": LABEL}) == []
