"""The decoder's shape, read from a Hugging Face `config.json` (Qwen2, Qwen3, Llama families)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from parity.core.config import format_validation_error

Family = Literal["qwen2", "qwen3", "llama"]
ARCHITECTURES: dict[str, Family] = {
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "LlamaForCausalLM": "llama",
}


class ModelConfigError(ValueError):
    """config.json is missing, malformed, or describes a model parity cannot build."""


class ModelConfig(BaseModel):
    """The fields of `config.json` the decoder uses; other fields are kept but ignored."""

    model_config = ConfigDict(extra="allow", frozen=True)

    model_type: Family
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    rope_parameters: dict[str, Any] | None = None  # newer transformers: theta + scaling together
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    attention_bias: bool | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    @model_validator(mode="after")
    def _check_shape(self) -> ModelConfig:
        if self.hidden_size % self.num_attention_heads and self.head_dim is None:
            raise ValueError("hidden_size must be divisible by num_attention_heads")
        if self.num_attention_heads % self.kv_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def rope_base(self) -> float:
        return float((self.rope_parameters or {}).get("rope_theta", self.rope_theta))

    @property
    def rope_kind(self) -> tuple[str, dict[str, Any]]:
        """(type, parameters) of the RoPE scaling: "default", "linear" or "llama3"."""
        params = self.rope_parameters or self.rope_scaling or {}
        return params.get("rope_type", params.get("type", "default")), params

    @property
    def qkv_bias(self) -> bool:
        """Qwen2 always has q/k/v biases; Llama and Qwen3 only when `attention_bias` says so."""
        if self.model_type == "qwen2":
            return True
        return bool(self.attention_bias)

    @property
    def qk_norm(self) -> bool:
        return self.model_type == "qwen3"

    def to_hf_dict(self) -> dict[str, Any]:
        arch = {v: k for k, v in ARCHITECTURES.items()}[self.model_type]
        d = self.model_dump(exclude_none=True)
        d["architectures"] = [arch]
        d.setdefault("torch_dtype", "float32")
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> ModelConfig:
        data = dict(data)
        archs = data.get("architectures") or []
        if "model_type" not in data and archs:
            data["model_type"] = ARCHITECTURES.get(archs[0], archs[0])
        if archs and archs[0] not in ARCHITECTURES:
            raise ModelConfigError(
                f"{source}: architectures[0] = {archs[0]!r} is not supported "
                f"(supported: {', '.join(ARCHITECTURES)})"
            )
        if data.get("model_type") not in (None, *ARCHITECTURES.values()):
            raise ModelConfigError(
                f"{source}: model_type = {data['model_type']!r} is not supported "
                f"(supported: {', '.join(ARCHITECTURES.values())})"
            )
        for key in ("rope_scaling", "rope_parameters"):
            scaling = data.get(key) or {}
            kind = scaling.get("rope_type", scaling.get("type", "default"))
            if kind not in ("default", "linear", "llama3"):
                raise ModelConfigError(
                    f"{source}: {key} type {kind!r} is not supported (default, linear, llama3)"
                )
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise ModelConfigError(format_validation_error(e, source)) from None

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> ModelConfig:
        path = Path(directory) / "config.json"
        if not path.is_file():
            raise ModelConfigError(f"{path}: not found (a model directory needs config.json)")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ModelConfigError(f"{path}: not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise ModelConfigError(f"{path}: expected a JSON object")
        return cls.from_dict(data, source=str(path))

    @property
    def declared_dtype(self) -> Any:
        """The checkpoint's own dtype: `torch_dtype` (or transformers' newer `dtype`), if any."""
        extra = self.model_extra or {}
        return extra.get("torch_dtype", extra.get("dtype"))

    def save(self, directory: str | Path, torch_dtype: str | None = None) -> None:
        d = self.to_hf_dict()
        if torch_dtype is not None:
            d.pop("dtype", None)
            d["torch_dtype"] = torch_dtype
        path = Path(directory) / "config.json"
        path.write_text(json.dumps(d, indent=2, sort_keys=True) + "\n")
