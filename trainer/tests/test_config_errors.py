"""Unknown config keys: the error names the key and, when a known key of the same section is
close, the key that was probably meant."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from parity.core.config import ConfigError
from parity.trainer.cli import app
from parity.trainer.config import load_train_config


def _message(path: Path | None, overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as e:
        load_train_config(path, overrides)
    return str(e.value)


def test_a_misspelt_key_in_a_file_names_the_key_meant(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text("[optim]\nlr = 1e-3\nweight_decy = 0.1\n")
    assert _message(p, []) == (f"{p}: invalid config\n"
                               "  optim.weight_decy: unknown key; did you mean optim.weight_decay?")


def test_a_misspelt_override_names_the_key_meant() -> None:
    assert _message(None, ["optim.lrr=1e-3"]) == (
        "<defaults>: invalid config\n  optim.lrr: unknown key; did you mean optim.lr?")
    # a key of a section that inherits its fields (ActorPlacement)
    assert _message(None, ["learner.num_thread=2"]) == (
        "<defaults>: invalid config\n"
        "  learner.num_thread: unknown key; did you mean learner.num_threads?")


def test_a_misspelt_section_names_the_section_meant() -> None:
    assert _message(None, ["optm.lr=1e-3"]) == (
        "<defaults>: invalid config\n  optm: unknown key; did you mean optim?")


def test_no_suggestion_when_no_key_is_close() -> None:
    assert _message(None, ["train.zzz=1"]) == "<defaults>: invalid config\n  train.zzz: unknown key"


def test_the_cli_prints_the_suggestion_on_one_line(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["train", "--set", "optim.lrr=1e-3", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2
    assert r.output == ("parity train: <defaults>: invalid config; "
                        "optim.lrr: unknown key; did you mean optim.lr?\n")
