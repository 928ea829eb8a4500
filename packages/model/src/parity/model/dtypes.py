"""The floating-point types a model runs in: float32 and bfloat16.

A model's *dtype* is the type of its activations, KV cache and published weights. In bfloat16
the aligned kernels keep their fp32 reduction orders and round to bf16 at fixed points (each
op's output; `parity.model.kernels`), so learner and engine agree bit for bit exactly as in
fp32; the standard kernels run torch's native bf16 ops. The learner keeps fp32 master weights
and computes with their bf16 rounding; the engine holds bf16 weights.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

import torch

DtypeName = Literal["float32", "bfloat16"]
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class DtypeError(ValueError):
    """A dtype setting this checkpoint, build or CPU cannot honour; names the setting."""


def dtype_name(dtype: torch.dtype) -> DtypeName:
    for name, t in DTYPES.items():
        if t == dtype:
            return name  # type: ignore[return-value]
    raise DtypeError(f"dtype {dtype} is not supported (float32, bfloat16)")


def checkpoint_dtype(torch_dtype: object, source: str) -> torch.dtype:
    """The dtype a checkpoint declares (`torch_dtype` in its config.json; float32 if absent)."""
    if torch_dtype is None:
        return torch.float32
    if torch_dtype not in DTYPES:
        raise DtypeError(f"{source}: torch_dtype {torch_dtype!r} is not one parity runs "
                         f"(float32, bfloat16); set model.dtype to one of them")
    return DTYPES[str(torch_dtype)]


@functools.cache
def _bf16_runs() -> str | None:
    """None if this torch build runs the bf16 ops the model needs on this CPU, else why not."""
    try:
        a = torch.ones(8, 8, dtype=torch.bfloat16)
        torch.nn.functional.linear(a, a).float().exp()
        torch.nn.functional.scaled_dot_product_attention(a[None, None], a[None, None], a[None, None])
    except (RuntimeError, NotImplementedError) as e:
        return str(e).splitlines()[0]
    return None


def require_dtype(dtype: torch.dtype, setting_name: str = "model.dtype") -> None:
    """Raise DtypeError naming `setting_name` when this build or CPU cannot run `dtype`."""
    if dtype == torch.bfloat16 and (why := _bf16_runs()) is not None:
        raise DtypeError(f"{setting_name} = 'bfloat16': this torch build cannot run bfloat16 "
                         f"on this CPU ({why})")


def bf16_support() -> dict[str, bool | str]:
    """What the CPU offers bf16 (AVX512-BF16 dot products, AMX tiles) and what torch uses."""
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    return {"avx512_bf16": "avx512_bf16" in flags, "amx_bf16": "amx_bf16" in flags,
            "onednn_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
            "torch_capability": torch.backends.cpu.get_cpu_capability()}
