"""parity.model: the decoder, its aligned and standard kernels, HF safetensors I/O."""

import os

from parity.model.blas import DEFAULT_MODE

# MKL's strict CNR mode keeps GEMMs thread-count invariant on Intel (parity.model.blas). MKL
# reads it once, at its first call: set before that, and inherited by Ray workers started
# afterwards. What aligned kernels rest on is proved per machine (parity.model.selfcheck).
os.environ.setdefault("MKL_CBWR", DEFAULT_MODE)

from parity.model.config import ModelConfig, ModelConfigError
from parity.model.decoder import Decoder, DenseKV, KVStore
from parity.model.gemm import ROW_TILE
from parity.model.io import WeightsError, load_model, save_model
from parity.model.kernels import KernelMode, get_kernels
from parity.model.layout import ATTENTION_ROW_MULTIPLE, KV_TILE, SeqLayout
from parity.model.logprobs import token_logprobs
from parity.model.selfcheck import AlignmentError, require_alignment

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
    "require_alignment",
    "save_model",
    "token_logprobs",
]
