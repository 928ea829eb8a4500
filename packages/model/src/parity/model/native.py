"""parity's C kernels (`csrc/*.c`): built with the machine's C compiler at first use, loaded
with ctypes.

Each source is built once per machine into the cache (`$PARITY_CACHE_DIR`, default
`~/.cache/parity`), keyed by the source, the headers in `csrc/`, the compiler's version, the
flags and the CPU's flags;
the compiler is `$CC`, else `cc` or `gcc`. No fast-math: no reassociation, and FMA contraction
is fixed at compile time in the one binary every caller on the machine loads. Each library is
linked against `libgomp.so.1`, which the dynamic loader resolves to the copy torch has already
loaded: one thread pool for torch's ops and these kernels (threads of a second pool would spin
against torch's between ops). Where no compiler works, `build` says why and the caller keeps
its torch path.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-fno-fast-math", "-fopenmp", "-fPIC",
         "-shared")
CSRC = Path(__file__).parent / "csrc"  # the sources and the header they share (vec16.h)


def cache_root() -> Path:
    """Where parity keeps what it builds or proves per machine: `$PARITY_CACHE_DIR`, else
    `$XDG_CACHE_HOME/parity`, else `~/.cache/parity`."""
    root = os.environ.get("PARITY_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "parity")
    return Path(root)


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return name
    return None


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""


@functools.cache
def build(source: Path) -> tuple[ctypes.CDLL | None, str]:
    """The library built from `source`, loaded, and its identity (file and compiler); or
    (None, why not)."""
    cc = _compiler()
    if cc is None:
        return None, "no C compiler (set CC, or install gcc)"
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError) as err:
        return None, f"{cc} --version failed: {err}"
    headers = [h.read_text() for h in sorted(CSRC.glob("*.h"))]
    key = hashlib.sha256("\n".join([source.read_text(), *headers, version, " ".join(FLAGS),
                                    _cpu_flags()]).encode()).hexdigest()[:16]
    lib = cache_root() / "kernels" / f"{source.stem}-{key}.so"
    if not lib.exists():
        lib.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=lib.parent) as tmp:
            out = Path(tmp) / lib.name
            try:
                run = subprocess.run([cc, *FLAGS, "-I", str(CSRC), "-o", str(out), str(source),
                                      "-lm"],
                                     capture_output=True, text=True, timeout=300)
            except (OSError, subprocess.SubprocessError) as err:
                return None, f"{cc} failed: {err}"
            if run.returncode != 0:
                return None, f"{cc} could not build {source.name}: {run.stderr.strip()[-300:]}"
            out.replace(lib)  # atomic: concurrent builders each install a whole file
    try:
        return ctypes.CDLL(str(lib)), f"{lib.name} ({version})"
    except OSError as err:
        return None, f"cannot load {lib}: {err}"
