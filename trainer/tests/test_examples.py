"""Every shipped example config validates (typos in examples are errors, not surprises)."""

from __future__ import annotations

from pathlib import Path

import pytest

from parity.trainer.config import load_train_config

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"
EXAMPLES = sorted(EXAMPLES_DIR.glob("*.toml"))


def test_examples_exist():
    names = {p.stem for p in EXAMPLES}
    assert {"smoke", "math", "long", "standard_kernels", "tis", "sequence_gate", "vcpo", "sync",
            "lag2", "lag8", "lag64", "hf_checkpoint", "bf16", "waiting_env"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_config_validates(path):
    cfg = load_train_config(path)
    if path.stem.startswith("lag"):
        assert cfg.max_lag == int(path.stem[3:])
    if path.stem == "sync":
        assert cfg.max_lag == 0


def test_waiting_env_keeps_the_embedded_task():
    """The example adds sandbox latency to the embedded env's kwargs rather than replacing
    them: replaced, the job would train on tasks its model cannot solve."""
    cfg = load_train_config(EXAMPLES_DIR / "waiting_env.toml")
    assert cfg.env.id == "parity/PythonTool-v0"
    assert cfg.env.kwargs == {"difficulty": 0, "kinds": ["mul"], "backend": "local",
                              "sandbox_latency_s": 2.0}
    assert (cfg.rollout.in_flight_updates, cfg.rollout.max_groups_in_flight, cfg.max_lag) == \
        (True, 8, 2)
