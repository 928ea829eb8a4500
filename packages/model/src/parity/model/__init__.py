"""parity.model: the decoder, its aligned and standard kernels, HF safetensors I/O."""

from parity.model.config import ModelConfig, ModelConfigError
from parity.model.decoder import Decoder, DenseKV, KVStore
from parity.model.io import WeightsError, load_model, save_model
from parity.model.kernels import KV_TILE, ROW_MULTIPLE, KernelMode, SeqLayout, get_kernels
from parity.model.logprobs import token_logprobs

__all__ = [
    "KV_TILE",
    "ROW_MULTIPLE",
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
    "save_model",
    "token_logprobs",
]
