"""The start-up proof on a CUDA device: the CPU proof's probes, run through the GPU kernel set.

The Triton kernels are invariant by construction (`parity.model.gpu`), but a compiler or a
driver can still surprise; so before they serve a model, the same probes that prove the CPU
kernels (`parity.model.selfcheck`: every linear at 1..64 and learner-sized row counts at
shifting offsets, attention decoded alone, in batches, in chunks and among other sequences,
the row-wise ops alone and among others) run on the device, in fp32 and in bf16 (the tensor
cores' path), with the probe's tensors moved there and the results compared bit for bit.
The verdict is kept per device, model shapes and kernel source for the process's life.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict
from pathlib import Path

import torch
from torch.utils.weak import WeakIdKeyDictionary

from parity.model import selfcheck
from parity.model.config import ModelConfig
from parity.model.gpu import KERNELS
from parity.model.gpu.device import kernels_for
from parity.model.kernels import AlignmentError, Kernels
from parity.model.selfcheck import Shapes, Verdict

DTYPES = (torch.float32, torch.bfloat16)


def _source() -> str:
    """A hash of the GPU set's code: a change to it voids kept verdicts."""
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def device_info(device: torch.device) -> dict:
    """The numerics platform: the device (a CUDA GPU's name and capability), torch, CUDA and
    Triton versions. A CPU device is Triton's interpreter (the tests')."""
    import triton

    info = {"device": str(device), "torch": torch.__version__, "triton": triton.__version__}
    if device.type == "cuda":
        info |= {"gpu": torch.cuda.get_device_name(device), "cuda": torch.version.cuda,
                 "capability": ".".join(map(str, torch.cuda.get_device_capability(device)))}
    return info


def on_device(kernels: Kernels, device: torch.device, dtype: torch.dtype) -> Kernels:
    """`kernels` as the CPU proof calls them: CPU fp32 arguments moved to `device` in `dtype`
    (weights once per tensor), results back to CPU in fp32 (bf16 values are exact there)."""
    weights: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def put(t: torch.Tensor) -> torch.Tensor:
        return t.to(device, dtype)

    def weight(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        if t not in weights:
            weights[t] = put(t)
        return weights[t]

    def back(t: torch.Tensor) -> torch.Tensor:
        return t.float().cpu()

    return Kernels(
        kernels.mode,
        lambda x, w, b: back(kernels.linear(put(x), weight(w), weight(b))),
        lambda x, parts: [back(y) for y in kernels.linears(
            put(x), [(weight(w), weight(b)) for w, b in parts])],
        lambda x, w, eps: back(kernels.rms_norm(put(x), weight(w), eps)),
        lambda g, u: back(kernels.silu_mul(put(g), put(u))),
        lambda q, k, v, layout, scale: back(kernels.attention(put(q), put(k), put(v), layout,
                                                              scale)),
        lambda x: back(kernels.log_softmax(put(x))))


_VERDICTS: dict[tuple, Verdict] = {}


def verify_device(cfg: ModelConfig | Shapes, device: torch.device,
                  kernels: Kernels = KERNELS) -> Verdict:
    """Run (or recall) the proof for a model's shapes on `device`, in fp32 then bf16."""
    shapes = cfg if isinstance(cfg, Shapes) else Shapes.of(cfg)
    info = device_info(device)
    key = (str(device), tuple(sorted(info.items())), shapes, _source(), id(kernels))
    if key in _VERDICTS:
        return _VERDICTS[key]
    t0, checks, failure = time.perf_counter(), 0, None
    for dtype in DTYPES:
        name = str(dtype).removeprefix("torch.")
        try:
            failure, n = selfcheck._run(shapes, on_device(kernels, device, dtype), [1])
        except Exception as e:  # a kernel that cannot compile or run at these shapes
            first = (str(e).strip().splitlines() or [""])[0]
            failure, n = f"a kernel failed at these shapes: {type(e).__name__}: {first}", 0
        checks += n
        if failure is not None:
            failure = f"{name}: {failure}"
            break
    verdict = Verdict(failure is None, failure, checks, round(time.perf_counter() - t0, 3), [1],
                      asdict(shapes), info)
    _VERDICTS[key] = verdict
    return verdict


def require_device_alignment(cfg: ModelConfig, device: torch.device) -> Verdict:
    """The device can serve the GPU set and its proof passes there, or AlignmentError."""
    verdict = verify_device(cfg, device, kernels_for(device))
    if not verdict.ok:
        m = verdict.machine
        raise AlignmentError(
            f"aligned kernels are not bit-identical across batch shapes on {m['gpu']} "
            f"(capability {m['capability']}, CUDA {m['cuda']}, torch {m['torch']}, Triton "
            f"{m['triton']}): "
            f"{verdict.failure}. Aligned mode is refused: use kernels='standard'.")
    return verdict
