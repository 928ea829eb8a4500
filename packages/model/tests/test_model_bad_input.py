"""Malformed model directories fail with errors naming the file and the field or tensor."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from parity.model import ModelConfigError, WeightsError, load_model
from parity.model.io import check_model_dir


@pytest.fixture(params=[load_model, check_model_dir], ids=["load_model", "check_model_dir"])
def read(request):
    """Both readers must refuse the same directories with the same errors."""
    return request.param


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_missing_config(tmp_path, read):
    with pytest.raises(ModelConfigError, match=r"config\.json: not found"):
        read(tmp_path)


def test_malformed_config(tmp_path, qwen2_dir, read):
    d = _copy(qwen2_dir, tmp_path / "m")
    (d / "config.json").write_text("{not json")
    with pytest.raises(ModelConfigError, match=r"config\.json: not valid JSON"):
        read(d)


def test_unknown_architecture(tmp_path, qwen2_dir, read):
    d = _copy(qwen2_dir, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelConfigError, match="GPT2LMHeadModel' is not supported"):
        read(d)


def test_wrong_field_type(tmp_path, qwen2_dir, read):
    d = _copy(qwen2_dir, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["hidden_size"] = "big"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelConfigError, match="hidden_size"):
        read(d)


def _edit_weights(d, fn):
    path = d / "model.safetensors"
    tensors = load_file(str(path))
    fn(tensors)
    save_file(tensors, str(path))


def test_missing_tensor(tmp_path, qwen2_dir, read):
    d = _copy(qwen2_dir, tmp_path / "m")
    _edit_weights(d, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(WeightsError, match=r"missing tensors: model\.layers\.1\.mlp\.up_proj\.weight"):
        read(d)


def test_extra_tensor(tmp_path, qwen2_dir, read):
    d = _copy(qwen2_dir, tmp_path / "m")
    _edit_weights(d, lambda t: t.__setitem__("model.layers.9.extra", t["model.norm.weight"].clone()))
    with pytest.raises(WeightsError, match=r"model\.safetensors: unexpected tensors: model\.layers\.9\.extra"):
        read(d)


def test_misshaped_tensor(tmp_path, qwen2_dir, read):
    d = _copy(qwen2_dir, tmp_path / "m")
    _edit_weights(d, lambda t: t.__setitem__("model.norm.weight", t["model.norm.weight"][:10].clone()))
    with pytest.raises(WeightsError, match=r"tensor model\.norm\.weight has shape \(10,\), config\.json implies \(64,\)"):
        read(d)


def test_no_weights(tmp_path, qwen2_dir, read):
    d = tmp_path / "m"
    d.mkdir()
    shutil.copy(qwen2_dir / "config.json", d)
    with pytest.raises(WeightsError, match=r"no model\.safetensors"):
        read(d)


def test_truncated_weights(tmp_path, qwen2_dir, read):
    d = _copy(qwen2_dir, tmp_path / "m")
    path = d / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(WeightsError, match=r"model\.safetensors: cannot read safetensors"):
        read(d)


def test_check_model_dir_passes_a_good_directory(qwen2_dir):
    assert check_model_dir(qwen2_dir).hidden_size == 64
