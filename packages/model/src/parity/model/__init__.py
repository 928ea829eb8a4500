"""parity.model: the decoder, its aligned and standard kernels, HF safetensors I/O.

Importing it configures nothing and loads no torch: the names below load their module on
first use. MKL's mode is set by its owners (`parity.model.blas.configure`).
"""

import importlib
from typing import Any

_LAZY = {
    "ModelConfig": "config", "ModelConfigError": "config",
    "Decoder": "decoder", "DenseKV": "decoder", "KVStore": "decoder",
    "ROW_TILE": "gemm",
    "WeightsError": "io", "load_model": "io", "save_model": "io",
    "KernelMode": "kernels", "get_kernels": "devices",
    "ATTENTION_ROW_MULTIPLE": "layout", "KV_TILE": "layout", "SeqLayout": "layout",
    "packed_logprobs": "logprobs", "token_logprobs": "logprobs",
    "AlignmentError": "kernels", "require_alignment": "devices",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"parity.model.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'parity.model' has no attribute {name!r}")


__all__ = [
    "ATTENTION_ROW_MULTIPLE",
    "KV_TILE",
    "ROW_TILE",
    "AlignmentError",
    "Decoder",
    "DenseKV",
    "KVStore",
    "KernelMode",
    "ModelConfig",
    "ModelConfigError",
    "SeqLayout",
    "WeightsError",
    "get_kernels",
    "load_model",
    "packed_logprobs",
    "require_alignment",
    "save_model",
    "token_logprobs",
]
