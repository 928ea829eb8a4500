"""`parity --help` and the commands' help answer without loading torch, ray or transformers:
the heavy imports wait for a command that needs them. Each check runs in a fresh interpreter,
since this one has them loaded already."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = "('torch', 'ray', 'transformers')"


def _heavy_loaded(script: str) -> str:
    """The heavy modules a fresh interpreter holds after `script`: the last line it prints."""
    probe = f"{script}\nimport sys\nprint(sorted(m for m in {HEAVY} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()[-1]


def test_importing_the_cli_loads_no_heavy_module() -> None:
    assert _heavy_loaded("import parity.trainer.cli") == "[]"


@pytest.mark.parametrize("argv", [[], ["train", "--help"], ["envs", "--help"], ["sandbox", "--help"],
                                  ["model", "--help"], ["bench", "--help"],
                                  ["bench", "engine", "--help"], ["eval", "--help"]])
def test_help_loads_no_heavy_module(argv: list[str]) -> None:
    script = ("from parity.trainer.cli import main\nimport sys\n"
              f"sys.argv = ['parity', *{argv!r}]\n"
              "try:\n    main()\nexcept SystemExit:\n    pass")
    assert _heavy_loaded(script) == "[]"
