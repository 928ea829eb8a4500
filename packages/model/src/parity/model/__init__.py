"""parity.model: the decoder, its aligned and standard kernels, HF safetensors I/O."""

import os

# Aligned GEMMs run single-threaded MKL calls from a small thread pool. OpenMP's default
# active wait keeps idle OpenMP workers spinning after every parallel region, stealing the
# pool's cores (measured: forward 0.51x -> 0.76x of standard on the tiny shape). Read once,
# when OpenMP starts; set before that, and inherited by Ray workers started afterwards.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

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
