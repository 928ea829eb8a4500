"""The embedded default: where its model lives and the environment it is trained on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

EMBEDDED_DIR = Path(__file__).parent / "assets" / "embedded"
EMBEDDED_ENV: dict[str, Any] = {
    "id": "parity/PythonTool-v0",
    "kwargs": {"difficulty": 0, "kinds": ["mul"], "backend": "local"},
}


def make_embedded_env(**overrides: Any) -> Any:
    """The embedded default's environment: 3-digit × 1-digit products via the Python tool."""
    from parity.envs.python_tool import PythonToolEnv

    kwargs = {**EMBEDDED_ENV["kwargs"], **overrides}
    kwargs["kinds"] = tuple(kwargs["kinds"])
    return PythonToolEnv(**kwargs)
