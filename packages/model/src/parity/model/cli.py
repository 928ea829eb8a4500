"""`parity bench learner`."""

from __future__ import annotations

import json

import typer


def bench_learner(
    json_: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    shape: list[str] = typer.Option(
        [], "--shape", help="Only these shapes (tiny, qwen2-0.5b); default all."
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
    for col in ("shape", "tokens", "pass", "aligned", "standard", "aligned ÷ standard"):
        table.add_column(col)
    for c in result["cases"]:
        for kind in ("fwd_bwd", "fwd"):
            r = c[kind]
            table.add_row(c["shape"], f"{c['batch']}×{c['seq_len']}", kind,
                          f"{r['aligned_tokens_per_s']:.0f}", f"{r['standard_tokens_per_s']:.0f}",
                          f"{r['ratio']:.3f}")
    Console().print(table)
    for c in result["mkl_strict_cnr_cost"]:
        Console().print(
            f"MKL strict CNR (parity's default), standard fwd+bwd on {c['shape']}: "
            f"{c['strict_tokens_per_s']:.0f} tokens/s on vs {c['off_tokens_per_s']:.0f} off = {c['ratio']:.3f}"
        )
