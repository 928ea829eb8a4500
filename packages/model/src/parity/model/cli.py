"""`parity bench learner` and `parity model convert`."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def bench_learner(
    json_: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    shape: list[str] = typer.Option(
        [], "--shape", help="Only these shapes (tiny, qwen2-0.5b); default all. Each runs in "
        "float32 and bfloat16, interleaved."
    ),
) -> None:
    """Forward+backward and forward-only tokens/s, aligned vs standard, side by side."""
    from rich.console import Console
    from rich.table import Table

    from parity.model import bench

    console = Console(stderr=True)
    with console.status("benchmarking") as status:
        result = bench.run(shape or None, progress=lambda msg: status.update(msg))
    if json_:
        typer.echo(json.dumps(result, indent=2))
        return
    m = result["machine"]
    table = Table(title=f"learner tokens/s ({result['threads']} threads; {m['cpu']}, "
                        f"{m['torch_capability']}, MKL {m['mkl_mode']})")
    for col in ("shape", "dtype", "tokens", "pass", "aligned", "standard", "aligned ÷ standard",
                "bf16 ÷ fp32 (aligned, standard)"):
        table.add_column(col)
    for c in result["cases"]:
        for dtype, rows in (("float32", c), ("bfloat16", c["bf16"])):
            for kind in ("fwd_bwd", "fwd"):
                r = rows[kind]
                over = f"{r['aligned_over_fp32']:.3f}, {r['standard_over_fp32']:.3f}" if dtype != "float32" else ""
                table.add_row(c["shape"], dtype, f"{c['batch']}×{c['seq_len']}", kind,
                              f"{r['aligned_tokens_per_s']:.0f}", f"{r['standard_tokens_per_s']:.0f}",
                              f"{r['ratio']:.3f}", over)
    Console().print(table)
    b = result["bf16_support"]
    Console().print(f"CPU bf16: AVX512-BF16 {b['avx512_bf16']}, AMX {b['amx_bf16']}, "
                    f"oneDNN bf16 {b['onednn_bf16']}")
    for c in result["mkl_strict_cnr_cost"]:
        Console().print(
            f"MKL strict CNR (parity's default), standard fwd+bwd on {c['shape']}: "
            f"{c['strict_tokens_per_s']:.0f} tokens/s on vs {c['off_tokens_per_s']:.0f} off = {c['ratio']:.3f}"
        )


def convert_model(
    src: Path = typer.Argument(..., help="An HF model directory (config.json + safetensors)."),
    out: Path = typer.Argument(..., help="Where to write the copy (replaced atomically)."),
    dtype: str = typer.Option("bfloat16", "--dtype", help="float32 or bfloat16."),
) -> None:
    """Copy a model directory with its weights stored in DTYPE (rounded to nearest even) and
    config.json's torch_dtype set to it; tokenizer and other files are copied as they are."""
    import shutil

    from parity.model import ModelConfigError, WeightsError, load_model, save_model
    from parity.model.dtypes import DTYPES

    if dtype not in DTYPES:
        typer.echo(f"parity model convert: --dtype must be float32 or bfloat16, not {dtype!r}", err=True)
        raise typer.Exit(2)
    if out.resolve() == src.resolve():
        typer.echo("parity model convert: OUT must differ from SRC", err=True)
        raise typer.Exit(2)
    try:
        model = load_model(src, kernels="standard", dtype=DTYPES[dtype])
    except (ModelConfigError, WeightsError, FileNotFoundError) as e:
        typer.echo(f"parity model convert: {e}", err=True)
        raise typer.Exit(2) from None
    save_model(model, out)
    for f in src.iterdir():
        if f.is_file() and f.name != "config.json" and not f.name.startswith("model.safetensors") \
                and f.suffix != ".safetensors":
            shutil.copy2(f, out / f.name)
    typer.echo(f"{out}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters in {dtype}")
