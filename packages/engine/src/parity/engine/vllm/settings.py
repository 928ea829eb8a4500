"""How a vLLM server is started: the options a run sets (`VllmOptions`, the trainer's `[vllm]`
section) and every setting the backend starts it with (`VllmSettings`). Loads neither torch
nor vLLM, so a run's config can be read without them."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from parity.core.config import StrictModel


class VllmOptions(StrictModel):
    """The server's options a run chooses."""

    python: str = Field("", description="interpreter of vLLM's environment; empty: "
                        "$PARITY_VLLM_PYTHON, else the one scripts/build_vllm_env.sh builds")
    start_timeout_s: float = Field(600.0, gt=0, description="the server must answer within "
                                   "this after it starts")
    request_timeout_s: float = Field(600.0, gt=0, description="every generation request and "
                                     "weight update must be answered within this")
    kv_cache_gib: int = Field(1, ge=1, description="KV cache per worker (VLLM_CPU_KVCACHE_SPACE)")
    max_num_seqs: int = Field(256, ge=1, description="sequences vLLM runs at once")
    enforce_eager: bool = Field(True, description="no torch.compile (starts in seconds)")
    batch_invariant: bool = Field(False, description="VLLM_BATCH_INVARIANT=1: vLLM's "
                                  "batch-invariant kernels (GPU only: refused on vLLM's CPU "
                                  "build; see docs/vllm.md)")


class VllmSettings(VllmOptions):
    """Every setting `VllmBackend` starts its server with: the options, and what the caller
    derives from its model and machine."""

    model_config = ConfigDict(frozen=True)

    max_model_len: int | None = Field(None, description="longest sequence; empty: the model's "
                                      "max_position_embeddings")
    num_threads: int = Field(0, description="OpenMP threads, bound to cores; 0: all this "
                             "process may use")
    seed: int = 0
    dtype: str = Field("float32", description="what the model computes in (the run's "
                       "model.dtype): float32 or bfloat16")
    aligned: bool = Field(False, description="parity's decoder inside vLLM "
                          "(parity.vllm_plugin): the learner's bits")
    max_num_batched_tokens: int | None = Field(None, description="tokens per engine step; a "
                                               "small one forces chunked prefill")
    num_kv_blocks: int | None = Field(None, description="KV cache blocks (vLLM's "
                                      "num_gpu_blocks_override); empty: what kv_cache_gib "
                                      "holds. A pool too small for the batch forces preemption")
