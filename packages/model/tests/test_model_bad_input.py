"""Malformed model directories fail with errors naming the file and the field or tensor."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from parity.model import ModelConfigError, WeightsError, load_model


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_missing_config(tmp_path):
    with pytest.raises(ModelConfigError, match=r"config\.json: not found"):
        load_model(tmp_path)


def test_malformed_config(tmp_path, qwen2_dir):
    d = _copy(qwen2_dir, tmp_path / "m")
    (d / "config.json").write_text("{not json")
    with pytest.raises(ModelConfigError, match=r"config\.json: not valid JSON"):
        load_model(d)


def test_unknown_architecture(tmp_path, qwen2_dir):
    d = _copy(qwen2_dir, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelConfigError, match="GPT2LMHeadModel' is not supported"):
        load_model(d)


def test_wrong_field_type(tmp_path, qwen2_dir):
    d = _copy(qwen2_dir, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["hidden_size"] = "big"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelConfigError, match="hidden_size"):
        load_model(d)


def _edit_weights(d, fn):
    path = d / "model.safetensors"
    tensors = load_file(str(path))
    fn(tensors)
    save_file(tensors, str(path))


def test_missing_tensor(tmp_path, qwen2_dir):
    d = _copy(qwen2_dir, tmp_path / "m")
    _edit_weights(d, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(WeightsError, match=r"missing tensors: model\.layers\.1\.mlp\.up_proj\.weight"):
        load_model(d)


def test_extra_tensor(tmp_path, qwen2_dir):
    d = _copy(qwen2_dir, tmp_path / "m")
    _edit_weights(d, lambda t: t.__setitem__("model.layers.9.extra", t["model.norm.weight"].clone()))
    with pytest.raises(WeightsError, match=r"model\.safetensors: unexpected tensors: model\.layers\.9\.extra"):
        load_model(d)


def test_misshaped_tensor(tmp_path, qwen2_dir):
    d = _copy(qwen2_dir, tmp_path / "m")
    _edit_weights(d, lambda t: t.__setitem__("model.norm.weight", t["model.norm.weight"][:10].clone()))
    with pytest.raises(WeightsError, match=r"tensor model\.norm\.weight has shape \(10,\), config\.json implies \(64,\)"):
        load_model(d)


def test_no_weights(tmp_path, qwen2_dir):
    d = tmp_path / "m"
    d.mkdir()
    shutil.copy(qwen2_dir / "config.json", d)
    with pytest.raises(WeightsError, match=r"no model\.safetensors"):
        load_model(d)
