"""The audit over models: every scenario of `parity.engine.audit` on each model, on the parity
engine or a vLLM server, and the JSON report with its verdict (`parity audit`)."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from parity.engine.audit import (
    BACKEND_SCENARIOS,
    MIN_UNCERTAIN_FRACTION,
    MIN_UNCERTAIN_TOKENS,
    SCENARIOS,
    SERVER_SCENARIOS,
    SERVER_SETTINGS,
    Auditor,
)
from parity.model import AlignmentError, Decoder
from parity.model.dtypes import dtype_name
from parity.model.selfcheck import machine, verify

if TYPE_CHECKING:
    from parity.engine.vllm import VllmSettings

# starts a server on the audited weights with these settings changed; closes it on exit
Serve = Callable[[dict[str, Any]], contextlib.AbstractContextManager[Any]]


def run_audit(model: Decoder, seed: int = 0, backend: Any = None, serve: Serve | None = None
              ) -> dict:
    """Every scenario on `model` (in its current kernel mode), on the parity engine or on
    `backend` (those of BACKEND_SCENARIOS, and those of SERVER_SCENARIOS on one server of
    their own that `serve` starts with SERVER_SETTINGS); the JSON-ready report."""
    auditor = Auditor(model, seed, backend=backend)
    if backend is None:
        run: tuple[str, ...] = SCENARIOS
        results = [auditor.run_scenario(sid) for sid in run]
    else:
        run = (*BACKEND_SCENARIOS, *SERVER_SCENARIOS) if serve else BACKEND_SCENARIOS
        results = [auditor.run_scenario(sid) for sid in BACKEND_SCENARIOS]
        if serve is not None:
            with serve(SERVER_SETTINGS) as own:
                on_own = Auditor(model, auditor.rng.randrange(2**31), backend=own)
                results += [on_own.run_scenario(sid) for sid in SERVER_SCENARIOS]
    rows = [asdict(r) for r in results]
    compared = sum(r["tokens_compared"] for r in rows)
    uncertain = sum(r["uncertain_tokens"] for r in rows)
    return {
        "kernels": model.kernels.mode,
        "dtype": dtype_name(model.compute_dtype),
        "scenarios": rows,
        "tokens_compared": compared,
        "uncertain_tokens": uncertain,
        "conclusive": uncertain >= max(MIN_UNCERTAIN_TOKENS, MIN_UNCERTAIN_FRACTION * compared),
        "all_bitwise_equal": all(r["bitwise_equal"] for r in rows),
        "not_run": [sid for sid in SCENARIOS if sid not in run],
    }


def vllm_servers(model_dir: str, settings: VllmSettings) -> Serve:
    """A Serve starting a VllmBackend on `model_dir` with `settings` (updated), stopped on
    exit."""
    from parity.engine.vllm import VllmBackend

    @contextlib.contextmanager
    def serve(update: dict[str, Any]) -> Iterator[VllmBackend]:
        backend = VllmBackend(model_dir, settings.model_copy(update=update))
        try:
            yield backend
        finally:
            backend.close()

    return serve


def _on_vllm(model: Decoder, seed: int, settings: VllmSettings) -> dict:
    """run_audit with vLLM serving `model`'s weights (saved to a temporary directory): the
    audit's server, and one more for the server scenarios."""
    from parity.model import save_model

    with tempfile.TemporaryDirectory(prefix="parity-audit-") as d:
        save_model(model, d)
        dtype = dtype_name(model.compute_dtype)
        serve = vllm_servers(d, settings.model_copy(update={"dtype": dtype}))
        with serve({}) as backend:
            return {**run_audit(model, seed, backend, serve), "vllm": backend.env["version"]}


def audit_models(models: list[tuple[str, Callable[[], Decoder]]], kernels: str, seed: int = 0,
                 progress: Callable[[str], None] = lambda _: None,
                 vllm: VllmSettings | None = None) -> dict:
    """`run_audit` on each (name, build) model, on the parity engine or, given `vllm`, on a
    vLLM server; the JSON-ready report of them all.

    `passed` is the outcome each mode must show: aligned, every model bit-identical on a
    conclusive audit (and its start-up proof passed); standard, every model showing
    differences on a conclusive audit — an audit that finds none cannot fail. On vLLM's own
    model the audit measures (its kernels are not the learner's): it passes when conclusive;
    on vLLM running parity's decoder (`vllm.aligned`) it must be bit-identical, as on parity's
    engine."""
    entries = []
    for name, build in models:
        progress(name)
        entry: dict = {"model": name}
        try:
            model = build()
        except AlignmentError as e:  # the start-up proof refused aligned kernels here
            entry.update(error=str(e), all_bitwise_equal=False, conclusive=False, passed=False)
            entries.append(entry)
            continue
        cfg = model.config
        entry.update(family=cfg.model_type, params=sum(p.numel() for p in model.parameters()),
                     hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                     heads=cfg.num_attention_heads, kv_heads=cfg.kv_heads)
        if kernels == "aligned":
            v = verify(cfg)
            entry["selfcheck"] = {"ok": v.ok, "checks": v.checks, "seconds": v.seconds,
                                  "threads": v.threads, "cached": v.cached}
        entry.update(run_audit(model, seed) if vllm is None else _on_vllm(model, seed, vllm))
        same = entry["all_bitwise_equal"]
        expected = same if kernels == "aligned" else not same
        measured_only = vllm is not None and not vllm.aligned
        entry["passed"] = entry["conclusive"] and (expected or measured_only)
        entries.append(entry)
    dtypes = sorted({e["dtype"] for e in entries if "dtype" in e})
    return {
        "kernels": kernels,
        "dtype": "/".join(dtypes) or "-",
        "engine": "parity" if vllm is None else "vllm-aligned" if vllm.aligned else "vllm",
        "machine": machine(),
        "models": entries,
        "all_bitwise_equal": all(e["all_bitwise_equal"] for e in entries),
        "conclusive": all(e["conclusive"] for e in entries),
        "passed": all(e["passed"] for e in entries),
    }
