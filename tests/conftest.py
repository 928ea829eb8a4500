"""Ray in these tests stays on loopback: with this set (read when ray is first imported) Ray
resolves this node's address to 127.0.0.1 instead of the machine's interface address. Ray
workers share the test interpreter's environment, as under `parity train`."""

import os

from parity.model import blas

blas.configure()  # MKL's mode for this process and its Ray workers, as `parity` sets it
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
