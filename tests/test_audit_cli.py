"""`parity audit` as a user runs it: several families by default, Hugging Face checkpoints made
with transformers, a saturated model that must not pass, standard kernels that must differ."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
PARITY = str(Path(sys.executable).parent / "parity")


def _audit(*args: str) -> tuple[int, dict]:
    out = subprocess.run([PARITY, "audit", "--json", *args], capture_output=True, text=True,
                         timeout=900)
    assert out.stdout, out.stderr[-2000:]
    return out.returncode, json.loads(out.stdout)


def test_default_audit_covers_three_families_and_passes():
    rc, report = _audit()
    assert rc == 0, report
    assert [m["family"] for m in report["models"]] == ["qwen2", "qwen3", "llama"]
    assert {(m["heads"] // m["kv_heads"]) for m in report["models"]} == {2, 4, 1}
    assert max(m["intermediate_size"] for m in report["models"]) >= 2048  # several K blocks
    for m in report["models"]:
        assert m["all_bitwise_equal"] and m["conclusive"] and m["selfcheck"]["ok"]
        assert len(m["scenarios"]) == 16
        assert m["uncertain_tokens"] >= 0.2 * m["tokens_compared"]
    assert report["machine"]["cpu"] and report["machine"]["torch_capability"]


def test_standard_kernels_must_show_differences():
    rc, report = _audit("--kernels", "standard")
    assert rc == 0 and report["passed"]
    for m in report["models"]:
        assert not m["all_bitwise_equal"]
        assert sum(not s["bitwise_equal"] for s in m["scenarios"]) >= 8
        assert max(s["max_abs_diff"] for s in m["scenarios"]) > 0


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """Random checkpoints of three families, written by transformers itself."""
    import transformers as tf

    specs = {
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM, dict(num_attention_heads=14,
                  num_key_value_heads=2, hidden_size=224, intermediate_size=1216)),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM, dict(num_attention_heads=8,
                  num_key_value_heads=2, hidden_size=256, intermediate_size=768, head_dim=64)),
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM, dict(num_attention_heads=4,
                  num_key_value_heads=1, hidden_size=128, intermediate_size=1100,
                  tie_word_embeddings=True)),
    }
    dirs = {}
    for name, (config, cls, kw) in specs.items():
        torch.manual_seed(0)
        model = cls(config(vocab_size=512, num_hidden_layers=2, max_position_embeddings=2048,
                           **{"tie_word_embeddings": False, **kw}))
        dirs[name] = tmp_path_factory.mktemp(name)
        model.save_pretrained(dirs[name])
    return dirs


def test_transformers_checkpoints_are_bit_identical(hf_dirs):
    rc, report = _audit(*(a for d in hf_dirs.values() for a in ("--model", str(d))))
    assert rc == 0, [(m["model"], m.get("error")) for m in report["models"]]
    assert [m["family"] for m in report["models"]] == ["qwen2", "qwen3", "llama"]
    assert all(m["all_bitwise_equal"] and m["conclusive"] for m in report["models"])


def test_a_saturated_model_is_not_a_pass(tmp_path, capsys):
    """N(0, 1) tied embeddings make the model repeat its input with p ~ 1: every compared
    logprob is about 0, and an audit of those tokens cannot see any difference."""
    from parity.engine.cli import render_audit
    from parity.engine.shapes import SHAPES
    from parity.model import Decoder, save_model

    torch.manual_seed(0)
    model = Decoder(SHAPES["tiny"])
    save_model(model, tmp_path)
    rc, report = _audit("--model", str(tmp_path))
    (m,) = report["models"]
    assert rc == 1 and not report["passed"]
    assert m["all_bitwise_equal"] and not m["conclusive"]
    assert m["uncertain_tokens"] < 0.1 * m["tokens_compared"]
    render_audit(report)  # what `parity audit` prints without --json
    text = capsys.readouterr().out
    assert "INCONCLUSIVE" in text and text.rstrip().endswith("not so")


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    for args, msg in ((["--shape", "bogus"], "--shape 'bogus' is not a known shape"),
                      (["--kernels", "fast"], "--kernels must be 'aligned' or 'standard'"),
                      (["--model", str(tmp_path)], "config.json")):
        out = subprocess.run([PARITY, "audit", *args], capture_output=True, text=True, timeout=300)
        assert out.returncode == 2, (args, out.stderr)
        assert msg in out.stderr and out.stderr.startswith("parity audit: ")
        assert len(out.stderr.strip().splitlines()) == 1
