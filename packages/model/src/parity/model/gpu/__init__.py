"""parity's own Triton kernel set: the aligned kernels on CUDA devices.

Every op gives a row the same bits whatever the number of rows in the call, the row's place
among them and the path it comes from (decode, prefill, chunked prefill, prefix continuation),
by construction: fixed tiles per dtype and no split-K in the GEMM (`gpu.gemm`), one row per
program with a fixed block in RMSNorm, SiLU*mul and log-softmax (`gpu.rowwise`), and one
attention kernel whose key tiles are counted from position 0 and combined in order
(`gpu.attention`, which also reads a paged cache). `parity.model.kernels` hands CUDA tensors
in aligned mode to this set; `gpu.device` refuses aligned mode where it cannot run, and
`gpu.selfcheck` proves it on the device at a model's shapes. How and why: docs/gpu.md.

Importing this package imports triton; under `TRITON_INTERPRET=1` (set before the import)
the kernels run on CPU tensors, which is how the tests check them without a GPU.
"""

from parity.model.gpu import attention, gemm, rowwise
from parity.model.kernels import Kernels

KERNELS = Kernels("aligned", gemm.linear, gemm.linears, rowwise.rms_norm, rowwise.silu_mul,
                  attention.attention, rowwise.log_softmax)

__all__ = ["KERNELS"]
