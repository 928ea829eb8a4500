"""Every shipped example config validates (typos in examples are errors, not surprises)."""

from __future__ import annotations

from pathlib import Path

import pytest

from parity.trainer.config import load_train_config

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.toml"))


def test_examples_exist():
    names = {p.stem for p in EXAMPLES}
    assert {"smoke", "math", "long", "standard_kernels", "tis", "sequence_gate", "vcpo", "sync",
            "lag2", "lag8", "lag64", "hf_checkpoint", "bf16"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_config_validates(path):
    cfg = load_train_config(path)
    if path.stem.startswith("lag"):
        assert cfg.max_lag == int(path.stem[3:])
    if path.stem == "sync":
        assert cfg.max_lag == 0
