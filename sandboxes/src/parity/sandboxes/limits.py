"""What a sandbox may use. Every backend enforces the same fields (docs/benchmarks-sandbox.md
says how each one is enforced per backend)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Limits(BaseModel):
    """Resource limits of one sandbox; invalid values raise pydantic's ValidationError naming the field."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    timeout_s: float = Field(10.0, gt=0, le=86_400, description="wall-clock seconds per call")
    cpu_s: int = Field(10, ge=1, le=86_400, description="CPU seconds per process (RLIMIT_CPU)")
    memory_mb: int = Field(
        512, ge=32, le=1 << 20, description="memory of the whole sandbox, tmpfs files included"
    )
    max_procs: int = Field(64, ge=1, le=1 << 16, description="processes and threads at once")
    output_bytes: int = Field(
        65536, ge=1, le=1 << 30, description="stdout + stderr kept per call; more ends the call"
    )
    disk_mb: int = Field(64, ge=1, le=1 << 20, description="size of the work dir and of /tmp")
    stdin_bytes: int = Field(16 << 20, ge=0, le=1 << 30, description="largest stdin accepted")
    open_files: int = Field(256, ge=16, le=1 << 16, description="file descriptors per process")
    cpus: float = Field(1.0, gt=0, le=1024, description="CPU share (Docker CPU quota)")
