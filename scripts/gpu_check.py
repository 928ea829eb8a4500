"""The GPU check: parity's Triton kernel set proved on a CUDA device, as one JSON document.

On a GPU machine (offline; torch, triton, numpy, safetensors and pydantic are all it needs:
`scripts/gpu_wheels.sh` fetches pydantic's wheels to carry where the image lacks it, and
docs/gpu.md has the command):

    PYTHONPATH=packages/core/src:packages/model/src python scripts/gpu_check.py > gpu.json

Without a GPU, the same checks at tiny shapes under Triton's interpreter (a few seconds on CPU;
`packages/model/tests/test_gpu_kernels.py` runs it):

    python scripts/gpu_check.py --smoke

What it prints (docs/gpu.md): the device and versions; each kernel's row invariance in fp32 and
bf16 (rows 1..255 and more at random offsets and permutations, `torch.equal`) and its distance
from the standard ops; the negative control (a split-K GEMM, which must differ); attention's
paths (decode, prefill, chunked prefill 1/7/64/65, prefix continuation, among other sequences,
paged cache); the start-up proof at each model's shapes on the device; learner vs engine
log-probabilities on the embedded model and on a random model of Qwen2.5-0.5B's shape in fp32
and bf16, aligned (must be bit-identical) and standard (the control, must differ), with the
count of uncertain tokens; and tokens/s of aligned vs standard in the learner's
forward+backward and the engine's decode (reported, not asserted). `ok` is whether every
assertion held; the exit status is 0 only then.

It imports only parity's model package.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EMBEDDED = REPO / "trainer/src/parity/trainer/assets/embedded"
ROWS = (1, 2, 3, 7, 8, 9, 15, 16, 17, 63, 64, 65, 255)
CHUNKS = (1, 7, 64, 65)
UNCERTAIN = -0.1  # a token whose logprob is below this carries real uncertainty


@dataclass(frozen=True)
class Sizes:
    """How big each check is: the GPU run's, or the smoke run's tiny ones."""

    rows: tuple[int, ...]  # row counts probed
    linear: tuple[int, int]  # (in, out) of the probed GEMM
    width: int  # RMSNorm / SiLU*mul width
    vocab: int  # log-softmax width
    heads: tuple[int, int, int]  # attention (heads, KV heads, head dim)
    seq: int  # attention's probed sequence length
    batch: int  # learner/engine sequences
    tokens: int  # their longest length
    decode_batch: int  # throughput: sequences decoded together
    decode_steps: int
    reps: int  # throughput: timed repetitions (the first also compiles)
    kernel_dtypes: tuple[str, ...]  # the kernel and attention checks' dtypes


BOTH = ("float32", "bfloat16")
GPU = Sizes((*ROWS, 1000, 4096), (896, 4864), 896, 151936, (14, 2, 64), 300, 6, 320, 32, 64, 2,
            BOTH)
# bf16 kernels under the interpreter: packages/model/tests/test_gpu_kernels.py
SMOKE = Sizes((1, 3, 8, 17, 65), (64, 96), 80, 300, (2, 1, 16), 70, 2, 12, 2, 2, 1, ("float32",))
QWEN2_05B = dict(model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                 num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=32768,
                 tie_word_embeddings=True)
TINY = dict(QWEN2_05B, vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2)


# ----------------------------------------------------------------------------- imports


# ----------------------------------------------------------------------------- helpers


def _section(fn: Callable[[], dict]) -> dict:
    """fn's report, or the error that stopped it (as a failed check), so that one broken
    section never costs the rest of a GPU run."""
    try:
        return fn()
    except Exception as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}",
                "trace": traceback.format_exc().splitlines()[-6:]}


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _gen(seed: int):
    import torch

    return torch.Generator().manual_seed(seed)


def _rows_report(op: Callable, x, counts: tuple[int, ...], seed: int) -> dict:
    """op on m of x's rows (m in counts), at a random offset and in a random order, against
    those rows of op on all of x: the counts that differed."""
    import torch

    g = _gen(seed)
    ref = op(x)
    bad = []
    for m in counts:
        o = int(torch.randint(0, x.shape[0] - m + 1, (1,), generator=g))
        perm = o + torch.randperm(m, generator=g)
        if not torch.equal(op(x[perm.to(x.device)]), ref[perm.to(x.device)]):
            bad.append(m)
    return {"ok": not bad, "rows": list(counts), "differing_rows": bad}


def _dense(x, n: int, length: int | None = None):
    """A sequence's first n keys [T, Hkv, D] as [1, Hkv, L, D], zero past n."""
    from parity.model.layout import KV_TILE

    out = x.new_zeros(length or -(-n // KV_TILE) * KV_TILE, *x.shape[1:])
    out[:n] = x[:n]
    return out.transpose(0, 1).unsqueeze(0)


# ----------------------------------------------------------------------------- kernels


def kernel_checks(kernels, standard, device, sizes: Sizes) -> dict:
    """Row invariance and distance from the standard ops of each kernel, in fp32 and bf16; the
    split-K control."""
    import torch

    from parity.model.gpu.controls import split_k_linear

    counts = sizes.rows
    n_rows = max(counts) + 17
    k_in, k_out = sizes.linear
    g = _gen(1)
    w, b = torch.randn(k_out, k_in, generator=g) / k_in**0.5, torch.randn(k_out, generator=g)
    x = torch.randn(n_rows, k_in, generator=g)
    h = 3 * torch.randn(n_rows, sizes.width, generator=g)
    nw = torch.rand(sizes.width, generator=g) + 0.5
    logits = 4 * torch.randn(min(n_rows, 1100), sizes.vocab, generator=g)
    out: dict[str, Any] = {}
    for dtype in (getattr(torch, name) for name in sizes.kernel_dtypes):
        def put(t, dtype=dtype):
            return t.to(device, dtype)

        ops = {
            "linear": (lambda t, dtype=dtype: kernels.linear(t, put(w), put(b)), put(x),
                       lambda t, dtype=dtype: standard.linear(t, put(w), put(b))),
            "rms_norm": (lambda t, dtype=dtype: kernels.rms_norm(t, put(nw), 1e-6), put(h),
                         lambda t, dtype=dtype: standard.rms_norm(t, put(nw), 1e-6)),
            "silu_mul": (lambda t: kernels.silu_mul(t, t.flip(-1)), put(h),
                         lambda t: standard.silu_mul(t, t.flip(-1))),
            "log_softmax": (kernels.log_softmax, logits.to(device),
                            standard.log_softmax),
        }
        report = {}
        for name, (op, data, ref_op) in ops.items():
            fit = tuple(m for m in counts if m <= data.shape[0])
            report[name] = _rows_report(op, data, fit, 2)
            sample = data[:64]
            got, want = op(sample).float(), ref_op(sample).float()
            report[name]["max_abs_diff_vs_standard"] = float((got - want).abs().max())
            if dtype == torch.float32:
                close = torch.allclose(got, want, rtol=1e-4, atol=1e-4)
                report[name]["close_to_standard"] = close
                report[name]["ok"] = report[name]["ok"] and close
        out[str(dtype).removeprefix("torch.")] = report
    control = _rows_report(lambda t: split_k_linear(t, w.to(device)), x.to(device), counts, 3)
    out["split_k_control"] = {"differs": not control["ok"], "differing_rows": control["differing_rows"],
                              "ok": not control["ok"]}
    return out


def attention_checks(kernels, device, sizes: Sizes) -> dict:
    """One sequence's causal attention by every path against its prefill, bit for bit."""
    import torch

    from parity.model.gpu.attention import paged_attention
    from parity.model.layout import SeqLayout

    hq, hkv, d = sizes.heads
    t = sizes.seq
    scale = d**-0.5
    out: dict[str, Any] = {}
    for dtype in (getattr(torch, name) for name in sizes.kernel_dtypes):
        g = _gen(4)

        def qkv(n: int, g=g, dtype=dtype):
            return tuple(torch.randn(n, heads, d, generator=g).to(device, dtype)
                         for heads in (hq, hkv, hkv))

        q, k, v = qkv(t)

        def call(start: int, n: int, q=q, k=k, v=v):
            return kernels.attention(q[start:start + n], _dense(k, start + n), _dense(v, start + n),
                                     SeqLayout.from_lengths([n], [start]), scale)

        ref = call(0, t)
        paths: dict[str, bool] = {}
        layout = SeqLayout.from_lengths([1] * t, list(range(t)))
        paths["decode_batch_of_every_position"] = torch.equal(kernels.attention(
            q, _dense(k, t).expand(t, -1, -1, -1), _dense(v, t).expand(t, -1, -1, -1), layout,
            scale), ref)
        for c in CHUNKS:
            parts = [call(a, min(c, t - a)) for a in range(0, t, c)]
            paths[f"chunked_prefill_{c}"] = torch.equal(torch.cat(parts), ref)
        for cached in (37, 64, t // 2, t - 1):
            paths[f"prefix_continuation_after_{cached}"] = torch.equal(call(cached, t - cached),
                                                                      ref[cached:])
        g2 = _gen(5)
        for m in sizes.rows:
            if m < t:
                a = int(torch.randint(0, t - m + 1, (1,), generator=g2))
                paths.setdefault("rows_in_calls_of_m", True)
                paths["rows_in_calls_of_m"] &= torch.equal(call(a, m), ref[a:a + m])
        others = [(qkv(n + off), n, off) for n, off in ((5, 0), (70, 30), (1, 99), (33, 64))]
        pieces = [((q, k, v), t, 0), *others]
        length = max(_dense(x[1], n + off).shape[2] for x, n, off in pieces)
        for order in ([0, 1, 2, 3, 4], [3, 1, 4, 0, 2]):
            chosen = [pieces[i] for i in order]
            lay = SeqLayout.from_lengths([n for _, n, _ in chosen], [off for _, _, off in chosen])
            res = kernels.attention(
                torch.cat([x[0][off:off + n] for x, n, off in chosen]),
                torch.cat([_dense(x[1], n + off, length) for x, n, off in chosen]),
                torch.cat([_dense(x[2], n + off, length) for x, n, off in chosen]), lay, scale)
            at = lay.starts[order.index(0)]
            paths[f"among_others_order_{''.join(map(str, order))}"] = torch.equal(res[at:at + t], ref)
        bs = 16
        blocks = -(-t // bs)
        table = torch.randperm(blocks + 3, generator=_gen(6))[:blocks]
        caches = []
        for x in (k, v):
            c = torch.zeros(blocks + 3, hkv, bs, d, dtype=dtype, device=device)
            padded = torch.cat([x, x.new_zeros(blocks * bs - t, hkv, d)])
            c[table.to(device)] = padded.view(blocks, bs, hkv, d).transpose(1, 2)
            caches.append(c)
        paths["paged_prefill"] = torch.equal(paged_attention(
            q, *caches, table[None], SeqLayout.from_lengths([t]), scale), ref)
        out[str(dtype).removeprefix("torch.")] = {"ok": all(paths.values()), "paths": paths}
    return out


def selfcheck_report(cfg, device) -> dict:
    """The start-up proof at the model's shapes on the device, through the selfcheck hook.
    Under the interpreter its ~1,500 probes per dtype take minutes even at tiny shapes, so
    --smoke skips it (the tests check its device wrapper)."""
    from parity.model.devices import require_alignment

    if device.type != "cuda":
        return {"skipped": "the start-up proof runs on a CUDA device only in this check"}
    verdict = require_alignment(cfg, device)
    return {"ok": verdict.ok, "failure": verdict.failure, "checks": verdict.checks,
            "seconds": verdict.seconds}


def padded_sdpa(q, k, v, layout, scale):
    """Standard attention on CUDA, as anyone would write it: each sequence's rows padded to
    the longest, one SDPA call with a boolean causal mask (the CPU set's standard attention
    gathers with CPU index tensors)."""
    import torch
    import torch.nn.functional as F

    lengths = torch.tensor(layout.lengths)
    r = torch.arange(int(lengths.max()))
    valid = r[None, :] < lengths[:, None]
    idx = torch.where(valid, torch.tensor(layout.starts)[:, None] + r[None, :], 0)
    pos = torch.where(valid, layout.positions[idx], 0)  # padding rows see key 0 only
    mask = torch.arange(k.shape[2])[None, None, :] <= pos[:, :, None]
    o = F.scaled_dot_product_attention(
        q[idx.to(q.device)].transpose(1, 2), k, v, attn_mask=mask[:, None].to(q.device),
        scale=scale, enable_gqa=True)
    return o.transpose(1, 2)[valid.to(q.device)]


# ----------------------------------------------------------------------------- models


class SlotKV:
    """The engine's side of the comparison: a preallocated cache [layers, slots, Hkv, capacity,
    D] in the model's dtype, one slot per sequence, written as the sequences advance in calls
    of any mix, read back from position 0 for the call's sequences (zeros past their keys)."""

    def __init__(self, cfg, slots: int, capacity: int, dtype, device) -> None:
        import torch

        shape = (cfg.num_hidden_layers, slots, cfg.kv_heads, capacity, cfg.dim_per_head)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.ids = torch.zeros(0, dtype=torch.long)

    def update(self, layer, k, v, layout):
        seq, pos = self.ids[layout.seq_of_row], layout.positions
        out = []
        for store, new in ((self.k[layer], k), (self.v[layer], v)):
            store[seq.to(store.device), :, pos.to(store.device)] = new.to(store.dtype)
            out.append(store[self.ids.to(store.device), :, : layout.max_kv_len])
        return out[0], out[1]


def _tokens(cfg, sizes: Sizes, seed: int):
    import torch

    g = _gen(seed)
    lengths = torch.randint(sizes.tokens // 2, sizes.tokens + 1, (sizes.batch,), generator=g)
    lengths[0] = sizes.tokens
    return torch.randint(0, cfg.vocab_size, (sizes.batch, sizes.tokens), generator=g), lengths


def engine_logprobs(model, tokens, lengths, device, seed: int):
    """Every token's logprob as an engine computes it: prompts prefilled together, then the
    sequences advanced in calls mixing decode steps and chunks (1, 7, 64, 65 rows and others),
    in a shuffled order each call, through SlotKV."""
    import torch

    from parity.model.layout import KV_TILE, SeqLayout

    b, t = tokens.shape
    kv = SlotKV(model.config, b, -(-t // KV_TILE) * KV_TILE, model.compute_dtype, device)
    out = torch.zeros(b, t - 1)
    done = [max(1, int(n) // 3) for n in lengths]  # prompts
    g = _gen(seed)
    steps = (1, 1, 7, 1, 64, 1, 65, 3)
    todo = [(s, 0, done[s]) for s in range(b)]
    step = 0
    with torch.no_grad():
        while todo:
            order = torch.randperm(len(todo), generator=g).tolist()
            todo = [todo[i] for i in order]
            kv.ids = torch.tensor([s for s, _, _ in todo])
            layout = SeqLayout.from_lengths([n for _, _, n in todo], [a for _, a, _ in todo])
            rows = torch.cat([tokens[s, a:a + n] for s, a, n in todo]).to(device)
            hidden = model(rows, layout, kv)
            lp = model.logprobs(hidden)
            for (s, a, n), start in zip(todo, layout.starts, strict=True):
                keep = min(n, int(lengths[s]) - 1 - a)
                if keep > 0:
                    nxt = tokens[s, a + 1:a + 1 + keep].to(device)
                    out[s, a:a + keep] = lp[start:start + keep].gather(-1, nxt[:, None])[:, 0].cpu()
            step += 1
            todo = [(s, a + n, min(steps[(s + step) % len(steps)], int(lengths[s]) - a - n))
                    for s, a, n in todo if a + n < int(lengths[s])]
    return out


def _models(cfg_cls, device, smoke: bool):
    """(name, config, fp32 state dict) of each model the check runs."""
    import torch

    from parity.model.decoder import Decoder

    def random_model(shape: dict):
        cfg = cfg_cls(**shape)
        torch.manual_seed(0)
        m = Decoder(cfg, "standard")
        with torch.no_grad():  # as Hugging Face initialises: small weights, uncertain outputs
            for name, p in m.named_parameters():
                if "norm" in name:
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, 0.02)
        return cfg, m.state_dict()

    from parity.model.io import load_model

    embedded = load_model(EMBEDDED, "standard")  # loaded in --smoke too: the loader is checked
    if smoke:
        return [("tiny-qwen2-random", *random_model(TINY))]
    return [("embedded", embedded.config, embedded.state_dict()),
            ("qwen2-0.5b-shape-random", *random_model(QWEN2_05B))]


def _build(cfg, state, kernels, dtype, device, master: bool, max_len: int):
    """A decoder on `device` computing in `dtype`, with `kernels`: fp32 master parameters
    (the learner's) or parameters in `dtype` (the engine's)."""
    import torch

    from parity.model.decoder import Decoder

    m = Decoder(cfg, "standard", dtype=dtype)
    m.load_state_dict(state)
    m = m.to(device, torch.float32 if master else dtype)
    m.kernels = kernels
    # the RoPE table is built on CPU in fixed chunks and read by index: on the device, a copy
    m.rope.lookup(torch.arange(max_len))
    m.rope.to(device)
    return m


def model_checks(name, cfg, state, aligned, standard, device, sizes: Sizes) -> dict:
    """Learner vs engine logprobs, aligned and standard, in fp32 and bf16. The standard control
    must differ on the GPU; at --smoke's tiny shapes a CPU's standard kernels may agree, so
    there it is reported only."""
    import torch

    from parity.model.logprobs import token_logprobs

    tokens, lengths = _tokens(cfg, sizes, 7)
    mask = torch.arange(tokens.shape[1] - 1)[None, :] < (lengths - 1)[:, None]
    out: dict[str, Any] = {}
    for dtype in (torch.float32, torch.bfloat16):
        report = {}
        for mode, kernels in (("aligned", aligned), ("standard", standard)):
            learner = _build(cfg, state, kernels, dtype, device, True, tokens.shape[1])
            engine = _build(cfg, state, kernels, dtype, device, False, tokens.shape[1])
            with torch.no_grad():
                lp_learner = token_logprobs(learner, tokens.to(device), lengths=lengths).cpu()
            lp_engine = engine_logprobs(engine, tokens, lengths, device, 8)
            a, e = lp_learner[mask], lp_engine[mask]
            diff = (a.double() - e.double()).abs()
            report[mode] = {"identical": torch.equal(a, e), "tokens": int(mask.sum()),
                            "uncertain_tokens": int((a < UNCERTAIN).sum()),
                            "differing_tokens": int((diff > 0).sum()),
                            "max_abs_diff": float(diff.max())}
        report["ok"] = report["aligned"]["identical"] and report["aligned"]["uncertain_tokens"] > 0 \
            and (device.type == "cpu" or not report["standard"]["identical"])
        out[str(dtype).removeprefix("torch.")] = report
    out["ok"] = all(r["ok"] for r in out.values())
    return out


def throughput(name, cfg, state, aligned, standard, device, sizes: Sizes) -> dict:
    """Tokens/s of the learner's forward+backward and the engine's decode, aligned and
    standard, in fp32 and bf16 (reported, not asserted)."""
    import torch

    from parity.model.layout import SeqLayout
    from parity.model.logprobs import token_logprobs

    tokens, lengths = _tokens(cfg, sizes, 9)
    out: dict[str, Any] = {}
    for dtype in (torch.float32, torch.bfloat16):
        report: dict[str, Any] = {}
        for mode, kernels in (("aligned", aligned), ("standard", standard)):
            n_pos = sizes.tokens + sizes.decode_steps + 1
            learner = _build(cfg, state, kernels, dtype, device, True, n_pos)
            engine = _build(cfg, state, kernels, dtype, device, False, n_pos)
            timings = {}
            for _ in range(sizes.reps):  # on the GPU the last is kept: the first compiles
                _sync(device)
                t0 = time.perf_counter()
                token_logprobs(learner, tokens.to(device), lengths=lengths).sum().backward()
                _sync(device)
                timings["learner_fwd_bwd_tokens_per_s"] = float(lengths.sum()) / (time.perf_counter() - t0)
                b = sizes.decode_batch
                kv = SlotKV(cfg, b, -(-n_pos // 64) * 64, dtype, device)
                kv.ids = torch.arange(b)
                prompt = tokens[torch.arange(b) % tokens.shape[0], : sizes.tokens // 2]
                with torch.no_grad():
                    engine(prompt.reshape(-1).to(device), SeqLayout.from_lengths([prompt.shape[1]] * b), kv)
                    step = prompt[:, -1].to(device)
                    _sync(device)
                    t0 = time.perf_counter()
                    for i in range(sizes.decode_steps):
                        layout = SeqLayout.from_lengths([1] * b, [prompt.shape[1] + i] * b)
                        step = engine.logprobs(engine(step, layout, kv)).argmax(-1)
                    _sync(device)
                timings["decode_tokens_per_s"] = b * sizes.decode_steps / (time.perf_counter() - t0)
            report[mode] = {k: round(v, 1) for k, v in timings.items()}
        report["aligned_over_standard"] = {
            k: round(report["aligned"][k] / report["standard"][k], 3) for k in report["aligned"]}
        out[str(dtype).removeprefix("torch.")] = report
    return out


# ----------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes on CPU under Triton's interpreter (no GPU)")
    args = parser.parse_args()
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel is decorated
    started = time.perf_counter()
    import torch
    import triton

    from parity.model.config import ModelConfig
    from parity.model.devices import get_kernels
    from parity.model.kernels import STANDARD

    sizes = SMOKE if args.smoke else GPU
    cuda = torch.cuda.is_available() and not args.smoke
    device = torch.device("cuda" if cuda else "cpu")
    report: dict[str, Any] = {
        "device": {"kind": torch.cuda.get_device_name(device) if cuda else "cpu (Triton interpreter)",
                   "capability": ".".join(map(str, torch.cuda.get_device_capability(device))) if cuda else None,
                   "torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
                   "python": platform.python_version()},
        "smoke": args.smoke,
    }
    if not cuda and not args.smoke:
        report |= {"ok": False, "refused": "no CUDA device: run with --smoke to check on CPU"}
        print(json.dumps(report, indent=1))
        return 1
    if cuda:
        try:
            aligned = get_kernels("aligned", device)
        except Exception as e:  # the refusal, in one line
            report |= {"ok": False, "refused": str(e)}
            print(json.dumps(report, indent=1))
            return 1
        standard = replace(STANDARD, attention=padded_sdpa)
    else:
        from parity.model.gpu import KERNELS

        aligned, standard = KERNELS, STANDARD
    report["kernels"] = _section(lambda: kernel_checks(aligned, standard, device, sizes))
    report["attention"] = _section(lambda: attention_checks(aligned, device, sizes))
    models = _models(ModelConfig, device, args.smoke)
    report["selfcheck"] = {name: _section(lambda cfg=cfg: selfcheck_report(cfg, device))
                           for name, cfg, _ in models}
    report["models"] = {name: _section(lambda n=name, c=cfg, s=state: model_checks(
        n, c, s, aligned, standard, device, sizes)) for name, cfg, state in models}
    report["throughput"] = {name: _section(lambda n=name, c=cfg, s=state: throughput(
        n, c, s, aligned, standard, device, sizes)) for name, cfg, state in models}
    checks = [report["kernels"], report["attention"], *report["selfcheck"].values(),
              *report["models"].values()]
    report["ok"] = all(_all_ok(c) for c in checks)
    report["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(report, indent=1))
    return 0 if report["ok"] else 1


def _all_ok(section: Any) -> bool:
    """Every "ok" in a section's nested report holds."""
    if isinstance(section, dict):
        return section.get("ok", True) is not False and all(_all_ok(v) for v in section.values())
    return True


if __name__ == "__main__":
    sys.exit(main())
