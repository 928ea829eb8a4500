"""The proof at start-up: on this machine, aligned kernels give a row the same bits in any call.

Aligned kernels hand every GEMM a row count that is a multiple of ROW_TILE
(`parity.model.gemm`), so no caller reaches a BLAS's few-row special paths. That the BLAS
then keeps one reduction order per row whatever the multiple, the row's offset and the thread
count is not something every vendor documents, so it is proved here, on a model's own
shapes, before aligned kernels serve (`Decoder` asks for it, through
`parity.model.devices.require_alignment`), and aligned mode is refused with an
`AlignmentError` naming the shape that failed.

What is probed (`Shapes.of(config)`), each at 1 and 2 threads and the process's count:
  linear      every distinct (in, out, bias) GEMM of the model (q/k/v stacked, o, gate/up
              stacked, down, lm_head): a
              row computed among m rows, for every m in 1..64 and learner-sized counts, at
              shifting row offsets, equals the same row among the reference call's rows; in
              fp32, and in bf16 where bf16 GEMMs stream bf16 (`parity.model.gemm`).
  attention   the model's (heads, KV heads, head dim) on a 135-token sequence: its causal
              output row by row against every position decoded alone, decoded among others
              (batches of 2..17), chunked prefill continuing a cache (7, 64, 65 rows), and
              the sequence hidden among others in one call.
  row-wise    RMSNorm (hidden size; head dim with q/k norm), SiLU*mul (MLP width) and
              log-softmax (vocabulary): a row alone and among m rows; and the bf16 C
              row-wise ops round as torch's conversions do (subnormals, ties, overflow, NaN).

The verdict is cached per CPU model and flags, torch build, BLAS mode, the kernels' source,
shape set and thread counts: in memory, and on disk under `$PARITY_CACHE_DIR` (default
`~/.cache/parity`), so the probes run once per machine and model shape.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import os
import platform
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from parity.model import blas, fused, gemm, native, rowwise
from parity.model.config import ModelConfig
from parity.model.dtypes import dtype_name
from parity.model.gemm import ROW_TILE, streams_bf16
from parity.model.kernels import ALIGNED_CPU, Kernels, in_fp32
from parity.model.layout import KV_TILE, SeqLayout

PROBE_VERSION = 3
SMALL_ROWS = tuple(range(1, 65))  # every decode batch and prefill piece up to 64 rows
# Above FULL_SWEEP (weight elements or row width x rows) each call streams a large operand,
# so only the row counts at both ends of each ROW_TILE class are probed, and all of 1..8:
# within a class the BLAS gets the same call, and only which rows are zero padding differs.
FULL_SWEEP = 2**24
CLASS_EDGES = tuple(m for m in SMALL_ROWS if m <= ROW_TILE or m % ROW_TILE in (0, 1))
LARGE_ROWS = (100, 300, 1000, 3000)  # learner-sized calls, as far as LARGE_BUDGET allows
LARGE_BUDGET = 2**26  # multiply-adds (or elements) per probe call for the learner-sized counts
ATTENTION_LEN = 2 * KV_TILE + 7  # crosses two tile boundaries and a 64-row query piece


@dataclass(frozen=True)
class Shapes:
    """The reducing ops' shapes of one model: what the proof runs."""

    linears: tuple[tuple[int, int, bool], ...]  # (in, out, bias), distinct, sorted
    attention: tuple[int, int, int]  # (heads, KV heads, head dim)
    norms: tuple[int, ...]  # RMSNorm widths (hidden; head dim with q/k norm)
    mlp: int  # SiLU*mul width
    vocab: int  # log-softmax width

    @classmethod
    def of(cls, cfg: ModelConfig) -> Shapes:
        h, d, hq, hkv = cfg.hidden_size, cfg.dim_per_head, cfg.num_attention_heads, cfg.kv_heads
        # the GEMMs aligned kernels run: q/k/v stacked into one, gate/up into one
        lin = {(h, (hq + 2 * hkv) * d, cfg.qkv_bias), (hq * d, h, False),
               (h, 2 * cfg.intermediate_size, False), (cfg.intermediate_size, h, False),
               (h, cfg.vocab_size, False)}
        norms = (h, d) if cfg.qk_norm else (h,)
        return cls(tuple(sorted(lin)), (hq, hkv, d), norms, cfg.intermediate_size, cfg.vocab_size)


@dataclass
class Verdict:
    """The proof's outcome. `failure` says which probe differed, where, and by how much."""

    ok: bool
    failure: str | None
    checks: int
    seconds: float
    threads: list[int]
    shapes: dict
    machine: dict
    cached: bool = field(default=False, compare=False)


# ----------------------------------------------------------------------------- machine


@functools.cache
def machine() -> dict:
    """The numerics platform: CPU model and ISA, torch build and dispatch level, BLAS mode."""
    info = {"cpu": platform.machine(), "vendor": "", "isa": []}
    with contextlib.suppress(OSError):
        text = Path("/proc/cpuinfo").read_text()
        fields = dict(line.split(":", 1) for line in text.splitlines()[:40] if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        flags = set(fields.get("flags", "").split())
        wanted = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
        info = {"cpu": fields.get("model name", platform.machine()),
                "vendor": fields.get("vendor_id", ""), "isa": [f for f in wanted if f in flags]}
    return {**info, "torch": torch.__version__, "torch_git": (torch.version.git_version or "")[:12],
            "torch_capability": torch.backends.cpu.get_cpu_capability(), **blas.describe(),
            "attention": fused.describe(), "rowwise": rowwise.describe()}


def _kernel_source() -> str:
    """A hash of the code whose arithmetic is proved: a change to it voids cached verdicts."""
    from parity.model import attention, gemm, kernels, layout, rope

    h = hashlib.sha256()
    for module in (attention, blas, fused, gemm, kernels, layout, native, rope, rowwise):
        h.update(Path(module.__file__).read_bytes())
    h.update(Path(__file__).with_name("panels.py").read_bytes())  # it imports this module
    for source in (*sorted(native.CSRC.glob("*.c")), *sorted(native.CSRC.glob("*.h"))):
        h.update(source.read_bytes())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()[:16]


# ----------------------------------------------------------------------------- probes


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class _Probe:
    """Counts comparisons; the first difference found is the failure."""

    kernels: Kernels
    threads: list[int]
    checks: int = 0
    failure: str | None = None

    def same(self, got: torch.Tensor, want: torch.Tensor, what: Callable[[], str]) -> bool:
        self.checks += 1
        if torch.equal(got, want):
            return True
        diff = (got.double() - want.double()).abs()
        self.failure = (f"{what()}: {int((diff > 0).sum())} of {diff.numel()} values differ "
                        f"(max {float(diff.max()):.3g})")
        return False


def _gen(*key: int) -> torch.Generator:
    return torch.Generator().manual_seed(hash(key) % 2**62)


def _offset(m: int) -> int:
    return (7 * m) % 17  # where the probed rows start inside the reference rows


def _rows_probe(p: _Probe, name: str, op: Callable[[torch.Tensor], torch.Tensor],
                make: Callable[[int], torch.Tensor], cost_per_row: int) -> bool:
    """op's rows among m rows (m = 1..64 and larger) equal the same rows among the most."""
    small = SMALL_ROWS if cost_per_row <= FULL_SWEEP else CLASS_EDGES
    large = [m for m in LARGE_ROWS if m * cost_per_row <= LARGE_BUDGET] or [LARGE_ROWS[0]]
    counts = [*small, *large]
    x = make(counts[-1] + 17)
    with _threads(1):
        ref = op(x)
    for t in p.threads:
        with _threads(t):
            for m in counts:
                o = _offset(m)
                if not p.same(op(x[o:o + m]), ref[o:o + m],
                              lambda m=m, o=o, t=t: f"{name}: rows {o}..{o + m - 1} computed as a "
                              f"call of {m} rows at {t} thread(s) vs among {x.shape[0]} rows at "
                              f"1 thread"):
                    return False
    return True


def _linear(p: _Probe, k: int, n: int, bias: bool, dtype: torch.dtype = torch.float32) -> bool:
    g = _gen(k, n, bias)
    w = torch.randn(n, k, generator=g).to(dtype)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    return _rows_probe(p, f"linear {k}->{n}{' with bias' if bias else ''} in {dtype_name(dtype)}",
                       lambda x: p.kernels.linear(x, w, b),
                       lambda rows: torch.randn(rows, k, generator=g).to(dtype), k * n)


def linear_dtypes() -> tuple[torch.dtype, ...]:
    """The dtypes whose linears run their own GEMMs here: fp32, and bf16 where it streams bf16
    (elsewhere a bf16 linear is the fp32 GEMM on bf16 values)."""
    return (torch.float32, torch.bfloat16) if streams_bf16() else (torch.float32,)


# A GEMM route against torch's: ROW_TILE multiples (decode, BF16_ROWS, prefill); for large
# weights (the vocabulary's head) two, to keep it to about a second at 0.5B. The proof then
# shows the taken route row-invariant at every count 1..64 and learner-sized ones, which with
# equal bits at one count gives equal bits at all
ROUTE_ROWS, ROUTE_LARGE_ROWS, ROUTE_LARGE = (8, 16, 24, 32, 64, 136), (8, 32), 2**24


def route_difference(route: gemm.OneDnnGemm, cfg: ModelConfig | Shapes,
                     dtypes: tuple[torch.dtype, ...]) -> str | None:
    """Where `route` and torch's oneDNN route give different bits on cfg's GEMMs (each shape
    at ROUTE_ROWS or ROUTE_LARGE_ROWS rows, 1 and the process's threads, random weights,
    inputs and biases), or None. What a process checks before it swaps routes
    (`gemm.use_onednn`)."""
    shapes = cfg if isinstance(cfg, Shapes) else Shapes.of(cfg)
    threads = torch.get_num_threads()
    try:
        for (k, n, bias), dtype in itertools.product(shapes.linears, dtypes):
            g = torch.Generator().manual_seed(k * 31 + n)
            w = torch.randn(n, k, generator=g).to(dtype).contiguous()
            b = torch.randn(n, generator=g).to(dtype) if bias else None
            mine, torch_s = route.prepare(w), gemm.TORCH_ONEDNN.prepare(w)
            counts = ROUTE_ROWS if k * n <= ROUTE_LARGE else ROUTE_LARGE_ROWS
            for rows, t in itertools.product(counts, sorted({1, threads})):
                if dtype == torch.bfloat16 and rows > gemm.BF16_ROWS:
                    continue  # bf16 GEMMs are called with at most BF16_ROWS rows
                torch.set_num_threads(t)
                x = torch.randn(rows, k, generator=g).to(dtype)
                if not torch.equal(route.run(x, mine, b), gemm.TORCH_ONEDNN.run(x, torch_s, b)):
                    return (f"{route.name} and torch's oneDNN route differ on the GEMM {k} -> "
                            f"{n} in {dtype} at {rows} rows, {t} thread(s)")
    finally:
        torch.set_num_threads(threads)
    return None


def _rowwise(p: _Probe, s: Shapes) -> bool:
    for h in s.norms:
        w = torch.rand(h, generator=_gen(h)) + 0.5
        if not _rows_probe(p, f"rms_norm width {h}", lambda x, w=w: p.kernels.rms_norm(x, w, 1e-6),
                           lambda rows, h=h: 3 * torch.randn(rows, h, generator=_gen(h, rows)), h):
            return False
    if not _rows_probe(p, f"silu_mul width {s.mlp}", lambda x: p.kernels.silu_mul(x, x.flip(-1)),
                       lambda rows: 4 * torch.randn(rows, s.mlp, generator=_gen(s.mlp, rows)), s.mlp):
        return False
    return _rows_probe(p, f"log_softmax width {s.vocab}", p.kernels.log_softmax,
                       lambda rows: 3 * torch.randn(rows, s.vocab, generator=_gen(s.vocab, rows)),
                       s.vocab) and _bf16_rounding(p, s)


def _bf16_rounding(p: _Probe, s: Shapes) -> bool:
    """The bf16 C row-wise ops (the engine's, without gradients) round as torch's
    `.to(bfloat16)` does (the learner's, with them), on values whose outputs are subnormal,
    ties, overflowing or NaN: both sides of a bf16 job then agree on every value."""
    if rowwise.c_library() is None:
        return True
    g = _gen(*s.norms, 16)
    width = max(s.mlp, *s.norms)
    x = torch.randn(64, width, generator=g) * 10.0 ** torch.randint(-40, 39, (64, 1), generator=g)
    x[0, :4] = torch.tensor([float("nan"), float("inf"), 1e-40, 3.3e38])
    x = x.bfloat16()
    m = x[:, :s.mlp]
    cases = [(f"rms_norm width {h}", rowwise.rms_norm_bf16, rowwise.rms_norm_aligned,
              (x[:, :h], (torch.rand(h, generator=g) + 0.5).bfloat16(), 1e-6)) for h in s.norms]
    cases.append((f"silu_mul width {s.mlp}", rowwise.silu_mul_bf16, rowwise.silu_mul_aligned,
                  (m, m.flip(-1))))
    for name, c_op, fp32_op, args in cases:
        got = c_op(*args)
        if got is not None and not p.same(got.view(torch.int16),
                                          in_fp32(fp32_op)(*args).view(torch.int16),
                                          lambda name=name: f"bf16 {name} (C vs torch's rounding)"):
            return False
    return True


def _dense(x: torch.Tensor, length: int) -> torch.Tensor:
    """Keys/values [T, Hkv, D] of one sequence as [1, Hkv, L, D], zero beyond T."""
    out = x.new_zeros(length, *x.shape[1:])
    out[: x.shape[0]] = x
    return out.transpose(0, 1).unsqueeze(0)


def _keys_len(n: int) -> int:
    return -(-n // KV_TILE) * KV_TILE


def _attention(p: _Probe, hq: int, hkv: int, d: int) -> bool:
    g = _gen(hq, hkv, d)
    t_len = ATTENTION_LEN
    q, k, v = (torch.randn(t_len, h, d, generator=g) for h in (hq, hkv, hkv))
    others = [(torch.randn(n, hq, d, generator=g), torch.randn(n, hkv, d, generator=g),
               torch.randn(n, hkv, d, generator=g)) for n in (5, 70, 129, 1, 64, 33, 100, 17)]
    scale = d**-0.5
    attend = p.kernels.attention
    with _threads(1):
        ref = attend(q, _dense(k, _keys_len(t_len)), _dense(v, _keys_len(t_len)),
                     SeqLayout.from_lengths([t_len]), scale)

    def batch(pieces: list[tuple[int, int, int]]) -> torch.Tensor:
        """One call over pieces (sequence, first row, rows): sequence -1 is the probed one."""
        qs, ks, vs, lens, offs = [], [], [], [], []
        for seq, a, n in pieces:
            sq, sk, sv = (q, k, v) if seq < 0 else others[seq]
            qs.append(sq[a:a + n])
            ks.append(sk[: a + n])
            vs.append(sv[: a + n])
            lens.append(n)
            offs.append(a)
        length = _keys_len(max(a + n for _, a, n in pieces))
        return attend(torch.cat(qs), torch.cat([_dense(x, length) for x in ks]),
                      torch.cat([_dense(x, length) for x in vs]), SeqLayout.from_lengths(lens, offs),
                      scale)

    for t in p.threads:
        with _threads(t):
            for i in range(t_len):  # every position decoded alone
                if not p.same(batch([(-1, i, 1)])[0], ref[i], lambda i=i, t=t:
                              f"attention {hq}/{hkv} heads x {d}: position {i} decoded alone at "
                              f"{t} thread(s) vs row {i} of the {t_len}-row prefill at 1 thread"):
                    return False
            for size in (2, 3, 5, 9, 17):  # decoded among others, at a shifting place
                for i in (0, 63, 64, t_len - 1):
                    at = (i + size) % size
                    rows = [(j % len(others), others[j % len(others)][0].shape[0] - 1, 1)
                            for j in range(size - 1)]
                    rows.insert(at, (-1, i, 1))
                    if not p.same(batch(rows)[at], ref[i], lambda i=i, size=size, t=t:
                                  f"attention {hq}/{hkv} heads x {d}: position {i} decoded in a "
                                  f"batch of {size} at {t} thread(s) vs the prefill"):
                        return False
            for c in (7, 64, 65):  # chunked prefill continuing a cache
                for a in range(0, t_len, c):
                    n = min(c, t_len - a)
                    if not p.same(batch([(-1, a, n)]), ref[a:a + n], lambda a=a, c=c, t=t:
                                  f"attention {hq}/{hkv} heads x {d}: chunk of {c} rows at "
                                  f"position {a} at {t} thread(s) vs the prefill"):
                        return False
            mixed = batch([(0, 0, 5), (2, 0, 129), (-1, 0, t_len), (3, 0, 1)])
            if not p.same(mixed[134:134 + t_len], ref, lambda t=t:
                          f"attention {hq}/{hkv} heads x {d}: the sequence among three others "
                          f"in one prefill at {t} thread(s) vs alone"):
                return False
    return True


def fingerprint(cfg: ModelConfig | Shapes, kernels: Kernels = ALIGNED_CPU) -> str:
    """A digest of one fixed, seeded computation per op at cfg's shapes (no model weights).

    Each machine proves its own kernels invariant; two machines can each be invariant and
    still round differently (another ISA, BLAS branch or torch dispatch level). Equal
    fingerprints are what nodes of one training job must show."""
    s = cfg if isinstance(cfg, Shapes) else Shapes.of(cfg)
    h = hashlib.sha256()

    def add(t: torch.Tensor) -> None:
        h.update(t.contiguous().numpy().tobytes())

    with torch.no_grad():
        for (k, n, bias), dtype in itertools.product(s.linears, linear_dtypes()):
            g = _gen(k, n, bias, 1)
            w, b = torch.randn(n, k, generator=g), (torch.randn(n, generator=g) if bias else None)
            add(kernels.linear(torch.randn(13, k, generator=g).to(dtype), w.to(dtype),
                               None if b is None else b.to(dtype)).float())
        hq, hkv, d = s.attention
        g = _gen(hq, hkv, d, 1)
        q, k, v = (torch.randn(ATTENTION_LEN, heads, d, generator=g) for heads in (hq, hkv, hkv))
        keys = _keys_len(ATTENTION_LEN)
        layout = SeqLayout.from_lengths([ATTENTION_LEN - 1, 1], [0, ATTENTION_LEN - 1])
        add(kernels.attention(torch.cat([q[:-1], q[-1:]]),
                              torch.cat([_dense(k[:-1], keys), _dense(k, keys)]),
                              torch.cat([_dense(v[:-1], keys), _dense(v, keys)]), layout, d**-0.5))
        # 64 rows: a reduction order that rounds differently shows in some row, not in all
        g = _gen(*s.norms, s.mlp, s.vocab)
        for width in s.norms:
            w = torch.rand(width, generator=g)
            add(kernels.rms_norm(3 * torch.randn(64, width, generator=g), w, 1e-6))
        x = torch.randn(64, s.mlp, generator=g)
        add(kernels.silu_mul(x, x.flip(-1)))
        add(kernels.log_softmax(3 * torch.randn(64, s.vocab, generator=g)))
    return h.hexdigest()[:16]


def _run(s: Shapes, kernels: Kernels, threads: list[int]) -> tuple[str | None, int]:
    p = _Probe(kernels, threads)
    with torch.no_grad():
        ok = all(_linear(p, k, n, b, dt) for (k, n, b), dt in itertools.product(
            s.linears, linear_dtypes())) and _attention(p, *s.attention) and _rowwise(p, s)
    return (None if ok else p.failure), p.checks


# ----------------------------------------------------------------------------- verdicts


def cache_dir() -> Path:
    return native.cache_root() / "selfcheck"


_VERDICTS: dict[str, Verdict] = {}


def verify(cfg: ModelConfig | Shapes, kernels: Kernels = ALIGNED_CPU, cache: bool = True) -> Verdict:
    """Run (or recall) the proof for a model's shapes on this machine."""
    shapes = cfg if isinstance(cfg, Shapes) else Shapes.of(cfg)
    threads = sorted({1, 2, torch.get_num_threads()})
    mach = machine()
    key_src = json.dumps({"v": PROBE_VERSION, "src": _kernel_source(), "kernels": kernels.mode,
                          "onednn": gemm.onednn().name,
                          "machine": mach, "shapes": asdict(shapes), "threads": threads,
                          "env": {k: os.environ.get(k) for k in ("MKL_CBWR", "ATEN_CPU_CAPABILITY",
                                                                 "MKL_ENABLE_INSTRUCTIONS",
                                                                 "ONEDNN_MAX_CPU_ISA",
                                                                 "DNNL_MAX_CPU_ISA")}},
                         sort_keys=True)
    key = hashlib.sha256(key_src.encode()).hexdigest()[:24]
    path = cache_dir() / f"{key}.json"
    if cache:
        if key in _VERDICTS:
            return _VERDICTS[key]
        with contextlib.suppress(OSError, ValueError, TypeError):
            verdict = Verdict(**{**json.loads(path.read_text()), "cached": True})
            _VERDICTS[key] = verdict
            return verdict
    t0 = time.perf_counter()
    failure, checks = _run(shapes, kernels, threads)
    verdict = Verdict(failure is None, failure, checks, round(time.perf_counter() - t0, 3),
                      threads, asdict(shapes), mach)
    if cache:
        _VERDICTS[key] = verdict
        with contextlib.suppress(OSError):  # a read-only home only costs a re-run next time
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(asdict(verdict) | {"cached": False}, indent=1))
            tmp.replace(path)
    return verdict


def refusal(verdict: Verdict) -> str:
    """The error a failed proof raises: what differed, on what machine, and what to do."""
    m = verdict.machine
    where = f"{m['cpu']}, torch {m['torch']} ({m['torch_capability']}), {m['blas']}"
    if m.get("mkl_mode"):
        where += f", MKL mode {m['mkl_mode']}"
    hint = ""
    if m.get("mkl_mode") and m["mkl_mode"] != blas.DEFAULT_MODE:
        hint = f"set MKL_CBWR={blas.DEFAULT_MODE} in the environment and retry, or "
    return (f"aligned kernels are not bit-identical across batch shapes on this machine "
            f"({where}): {verdict.failure}. Aligned mode is refused: {hint}use kernels='standard' "
            f"(model.kernels in a run config), whose logprob mismatch the trainer then measures "
            f"in is/d3_mismatch; `parity audit --json` prints this machine's report.")


def probe(cfg: ModelConfig | Shapes) -> dict:
    """This process's proof of aligned kernels at `cfg`'s shapes and their fingerprint, with
    the numerics platform it ran on: what two processes of one job (the learner, a rollout
    worker, a vLLM worker on its own torch build) compare, bits rather than version strings."""
    proof = verify(cfg)
    m = machine()
    return {"cpu": m["cpu"], "isa": m["isa"], "torch": str(m["torch"]),
            "torch_capability": m["torch_capability"], "blas": m["mkl_mode"] or m["blas"],
            "onednn": gemm.onednn().name, "proof_ok": proof.ok, "proof_failure": proof.failure,
            "fingerprint": fingerprint(cfg)}
