"""The local backend started by a normal user: bubblewrap adds a user namespace and, without
writable cgroups, memory and processes are bounded by per-process rlimits instead.

Runs the check as uid 65534 with the system Python (the venv's interpreter lives under /root);
skipped where that cannot be arranged."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import parity.sandboxes

pytestmark = pytest.mark.timeout(120)

SCRIPT = r"""
import json
from parity.sandboxes import Limits, open_sandbox
with open_sandbox("local", Limits(timeout_s=5, memory_mb=128, max_procs=16)) as sb:
    out = {"cgroup": sb.has_cgroup, "uid": sb.run(["id", "-u"]).stdout}
    r = sb.run_python("x = b'x' * (1 << 30)")
    out["memory"] = [r.oom, r.exit_code, r.stderr.splitlines()[-1]]
    r = sb.run_python(
        "import os\nn = 0\ntry:\n    for _ in range(100):\n        if os.fork() == 0:\n"
        "            os.pause()\n        n += 1\nexcept OSError as e:\n    print(n < 16, e.errno)",
        timeout_s=2,
    )
    out["fork"] = r.stdout
    s = sb.python_session()
    s.run("a = 3")
    out["session"] = s.run("a * 2").stdout
print(json.dumps(out))
"""


def _system_python_matches() -> bool:
    py = Path("/usr/bin/python3")
    if not py.exists():
        return False
    ver = subprocess.run(
        [py, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True
    )
    return ver.stdout.strip() == str(tuple(sys.version_info[:2]))


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"
)
def test_local_backend_as_unprivileged_user() -> None:
    if not _system_python_matches():
        pytest.skip("/usr/bin/python3 differs from the test interpreter's version")
    src = Path(parity.sandboxes.__file__).resolve().parents[2]
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": "/tmp",
        "PYTHONPATH": f"{src}:{sysconfig.get_paths()['purelib']}",
    }
    cmd = [
        "setpriv",
        "--reuid",
        "65534",
        "--regid",
        "65534",
        "--clear-groups",
        "/usr/bin/python3",
        "-c",
        SCRIPT,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, cwd="/tmp")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out == {
        "cgroup": False,
        "uid": "65534\n",
        "memory": [True, 1, "MemoryError"],
        "fork": "True 11\n",
        "session": "6\n",
    }


def test_stale_cgroups_of_dead_owners_are_removed() -> None:
    from parity.sandboxes.cgroups import cgroup_support, create_cgroup, remove_stale_cgroups

    if cgroup_support() is not None:
        pytest.skip(f"no cgroups here: {cgroup_support()}")
    stale = create_cgroup("sb-0-stale-test", 64 << 20, 8)
    assert stale is not None
    for d in stale.dirs:
        os.utime(d, (0, 0))  # as if made long ago by an owner that never came back
    fresh = create_cgroup("sb-0-fresh-test", 64 << 20, 8)
    assert fresh is not None
    remove_stale_cgroups()
    assert not any(d.exists() for d in stale.dirs)
    assert all(d.exists() for d in fresh.dirs)
    fresh.remove()
    assert not any(d.exists() for d in fresh.dirs)
