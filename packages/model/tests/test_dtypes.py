"""bfloat16 models: what a dtype setting resolves to, what is refused and why, what is saved,
and that fp32 masters computing in bf16 give the bf16 model's bits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from parity.model import load_model, save_model, token_logprobs
from parity.model.dtypes import DtypeError, bf16_support, require_dtype
from parity.model.io import resolve_dtype, stored_dtypes


def _set_torch_dtype(d, value):
    cfg = json.loads((d / "config.json").read_text())
    if value is None:
        cfg.pop("torch_dtype", None)
    else:
        cfg["torch_dtype"] = value
    (d / "config.json").write_text(json.dumps(cfg))


@pytest.fixture()
def fp32_dir(tmp_path, hf_factory):
    d = tmp_path / "fp32"
    hf_factory("qwen2").save_pretrained(d)
    _set_torch_dtype(d, "float32")
    return d


@pytest.fixture()
def bf16_dir(tmp_path, fp32_dir):
    out = tmp_path / "bf16"
    save_model(load_model(fp32_dir, dtype=torch.bfloat16), out)
    return out


def test_auto_follows_the_checkpoint(fp32_dir, bf16_dir):
    assert resolve_dtype("auto", fp32_dir) == torch.float32
    assert resolve_dtype("auto", bf16_dir) == torch.bfloat16
    _set_torch_dtype(fp32_dir, None)  # absent: float32
    assert resolve_dtype("auto", fp32_dir) == torch.float32


def test_bf16_of_a_float32_checkpoint_is_refused_naming_the_setting(fp32_dir):
    with pytest.raises(DtypeError) as e:
        resolve_dtype("bfloat16", fp32_dir)
    msg = str(e.value)
    assert msg.startswith("model.dtype = 'bfloat16', but ")
    assert "torch_dtype 'float32'" in msg and "stored as F32" in msg
    assert "parity model convert" in msg


def test_exact_conversions_are_allowed(fp32_dir, bf16_dir):
    assert resolve_dtype("float32", bf16_dir) == torch.float32  # bf16 -> fp32 is exact
    # weights stored in bf16 under a float32 declaration (the embedded model): nothing rounds
    _set_torch_dtype(bf16_dir, "float32")
    assert resolve_dtype("bfloat16", bf16_dir) == torch.bfloat16


def test_unsupported_torch_dtype_and_setting(fp32_dir):
    _set_torch_dtype(fp32_dir, "float16")
    with pytest.raises(DtypeError, match=r"torch_dtype 'float16' is not one parity runs .*set "
                                         r"model.dtype"):
        resolve_dtype("auto", fp32_dir)
    with pytest.raises(DtypeError, match=r"--dtype = 'half': expected auto, float32 or bfloat16"):
        resolve_dtype("half", fp32_dir, "--dtype")


def test_saved_model_keeps_fp32_masters_and_declares_its_dtype(fp32_dir, tmp_path):
    learner = load_model(fp32_dir, dtype=torch.bfloat16, master_weights=True)
    assert {p.dtype for p in learner.parameters()} == {torch.float32}
    save_model(learner, tmp_path / "ckpt")
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert stored_dtypes(tmp_path / "ckpt") == {"F32"}  # a resume is exact
    assert resolve_dtype("auto", tmp_path / "ckpt") == torch.bfloat16
    engine = load_model(tmp_path / "ckpt")  # the library default stays float32
    assert engine.compute_dtype == torch.float32


def test_master_weights_give_the_bf16_models_bits_and_fp32_gradients(fp32_dir, bf16_dir):
    learner = load_model(fp32_dir, dtype=torch.bfloat16, master_weights=True)
    engine = load_model(bf16_dir, dtype=torch.bfloat16)
    fp32 = load_model(fp32_dir)
    tokens = torch.randint(0, 97, (3, 50), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b, f = (token_logprobs(m, tokens) for m in (learner, engine, fp32))
    assert torch.equal(a, b)
    assert not torch.equal(a, f)  # bf16 is really computed in bf16
    lp = token_logprobs(learner, tokens)
    lp.sum().backward()
    grads = [p.grad for p in learner.parameters()]
    assert all(g is not None and g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)


def test_an_optimizer_step_on_the_masters_reaches_the_forward(fp32_dir):
    # the aligned GEMMs keep a prepared bf16 rounding per weight version: a step must renew it
    learner = load_model(fp32_dir, dtype=torch.bfloat16, master_weights=True)
    tokens = torch.randint(0, 97, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = token_logprobs(learner, tokens)
    opt = torch.optim.AdamW(learner.parameters(), lr=1e-2)
    token_logprobs(learner, tokens).sum().backward()
    opt.step()
    published = {k: v.to(torch.bfloat16) for k, v in learner.state_dict().items()}
    engine = load_model(fp32_dir, dtype=torch.bfloat16)
    engine.load_state_dict(published)
    with torch.no_grad():
        after, on_engine = token_logprobs(learner, tokens), token_logprobs(engine, tokens)
    assert not torch.equal(before, after)
    assert torch.equal(after, on_engine)


def test_bf16_support_and_build_check():
    s = bf16_support()
    assert set(s) == {"avx512_bf16", "amx_bf16", "onednn_bf16", "torch_capability"}
    require_dtype(torch.bfloat16)  # this build runs bf16 (torch emulates it without the ISA)
    require_dtype(torch.float32)


PARITY = str(Path(sys.executable).with_name("parity"))  # the installed command


def _convert(*args):
    return subprocess.run([PARITY, "model", "convert", *args], capture_output=True, text=True)


def test_model_convert_writes_a_bf16_copy(fp32_dir, tmp_path):
    (fp32_dir / "tokenizer.json").write_text("{}")
    out = tmp_path / "out"
    r = _convert(str(fp32_dir), str(out), "--dtype", "bfloat16")
    assert r.returncode == 0, r.stderr
    assert "in bfloat16" in r.stdout
    assert stored_dtypes(out) == {"BF16"}
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert (out / "tokenizer.json").read_text() == "{}"
    src = load_file(str(fp32_dir / "model.safetensors"))
    dst = load_file(str(out / "model.safetensors"))
    key = "model.embed_tokens.weight"
    assert torch.equal(dst[key], src[key].to(torch.bfloat16))
    assert resolve_dtype("bfloat16", out) == torch.bfloat16


def test_model_convert_bad_input(fp32_dir, tmp_path):
    r = _convert(str(fp32_dir), str(tmp_path / "o"), "--dtype", "half")
    assert r.returncode == 2
    assert "--dtype must be float32 or bfloat16, not 'half'" in r.stderr
    r = _convert(str(tmp_path / "nowhere"), str(tmp_path / "o"))
    assert r.returncode == 2 and "config.json: not found" in r.stderr


def test_a_build_that_cannot_run_bf16_is_refused_naming_the_setting(monkeypatch, bf16_dir):
    # a fault this machine cannot cause: a torch build or CPU without bf16 kernels
    from parity.model import dtypes

    monkeypatch.setattr(dtypes, "_bf16_runs", lambda: "no bf16 kernel for this CPU")
    with pytest.raises(DtypeError, match=r"^model.dtype = 'bfloat16': this torch build cannot run "
                                         r"bfloat16 on this CPU \(no bf16 kernel for this CPU\)$"):
        resolve_dtype("auto", bf16_dir)
    assert resolve_dtype("float32", bf16_dir) == torch.float32
