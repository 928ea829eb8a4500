"""Ray workers share the test interpreter's environment, as under `parity train` (set
before anything imports ray, which reads it at import)."""

import os

from parity.model import blas

blas.configure()  # MKL's mode for this process and its Ray workers, as `parity` sets it
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
