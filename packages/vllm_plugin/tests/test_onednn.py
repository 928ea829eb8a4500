"""The route of parity's oneDNN GEMMs in a vLLM worker: vLLM's per-weight handle is taken
only where it gives torch's bits, and every linear then goes through it."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch

from parity.engine.vllm.environment import vllm_env_problem, vllm_python
from parity.model import gemm
from parity.model.kernels import ALIGNED_CPU
from parity.model.selfcheck import route_difference
from parity.model.shapes import TINY

pytestmark = pytest.mark.skipif(not gemm.ONEDNN, reason="torch without oneDNN")


class _Counting(gemm.OneDnnGemm):
    """torch's route, counting its calls; `off` adds one ulp-sized change to a result."""

    name = "counting"

    def __init__(self, off: bool = False) -> None:
        self.off, self.prepared, self.runs = off, 0, 0

    def prepare(self, w: torch.Tensor) -> object:
        self.prepared += 1
        return super().prepare(w)

    def run(self, x: torch.Tensor, prepared: object, b: torch.Tensor | None) -> torch.Tensor:
        self.runs += 1
        y = super().run(x, prepared, b)
        if self.off:
            y[-1, -1] = torch.nextafter(y[-1, -1], torch.tensor(float("inf")))
        return y


def test_a_route_is_compared_with_torchs_on_every_gemm_shape_and_a_difference_named():
    assert route_difference(_Counting(), TINY, (torch.float32,)) is None
    # a route one ulp off in the last output: named with the shape, rows and threads
    assert route_difference(_Counting(off=True), TINY, (torch.float32,)) == (
        "counting and torch's oneDNN route differ on the GEMM 256 -> 128 in torch.float32 at "
        "8 rows, 1 thread(s)")


def test_linears_go_through_the_route_taken_with_its_weights_prepared_again():
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(384, 256, generator=g), torch.randn(384, generator=g)
    x = torch.randn(24, 256, generator=g)
    before = ALIGNED_CPU.linear(x, w, b)
    route = _Counting()
    gemm.use_onednn(route)
    try:
        assert gemm.onednn() is route
        after = ALIGNED_CPU.linear(x, w, b)
        ALIGNED_CPU.linear(x[:8], w, b)
        assert (route.prepared, route.runs) == (1, 2)  # prepared once, for both calls
    finally:
        gemm.use_onednn(gemm.TORCH_ONEDNN)
    assert torch.equal(after, before)


PROBLEM = vllm_env_problem()
if PROBLEM and os.environ.get("PARITY_REQUIRE_VLLM") == "1":
    raise RuntimeError(f"PARITY_REQUIRE_VLLM=1 but {PROBLEM}")

# In vLLM's interpreter: the route `install` takes, and the linears' bits before and after.
_IN_VLLM = """
import json, torch
import vllm._custom_ops  # noqa: F401  (vLLM's C ops, onednn_mm among them)
from parity.model import gemm
from parity.model.kernels import ALIGNED_CPU
from parity.model.shapes import TINY
from parity.vllm_plugin import onednn

g = torch.Generator().manual_seed(0)
w, b = torch.randn(384, 256, generator=g), torch.randn(384, generator=g)
xs = [torch.randn(rows, 256, generator=g) for rows in (1, 8, 13, 64, 200)]
before = [ALIGNED_CPU.linear(x, w, b) for x in xs]
route = onednn.install(TINY)
after = [ALIGNED_CPU.linear(x, w, b) for x in xs]
print(json.dumps({"route": route, "taken": gemm.onednn().name,
                  "equal": all(torch.equal(a, c) for a, c in zip(after, before))}))
"""


@pytest.mark.skipif(PROBLEM is not None, reason=PROBLEM or "")
@pytest.mark.parametrize("env", ["1", "0"])
def test_in_a_vllm_worker_the_handle_is_taken_where_it_gives_torchs_bits(env: str):
    r = subprocess.run([str(vllm_python()), "-c", _IN_VLLM], capture_output=True, text=True,
                       env=os.environ | {"PARITY_VLLM_ONEDNN": env}, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["equal"]
    if env == "0":
        assert out == {"route": "torch mkldnn (PARITY_VLLM_ONEDNN=0)", "taken": "torch mkldnn",
                       "equal": True}
    else:
        assert out["taken"] == "vLLM onednn_mm"
        assert out["route"] == "vLLM onednn_mm (torch's bits on every GEMM shape of the model)"
