"""Imports go one way: core <- model <- engine <- trainer, core <- sandboxes <- envs <- trainer,
model and engine <- vllm_plugin; and no modules import each other in a cycle, lazy imports
inside functions included (docs/architecture.md). Read from the sources' syntax trees, so it
costs no imports."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LAYERS = {
    "core": set(),
    "model": {"core"},
    "engine": {"core", "model"},
    "vllm_plugin": {"core", "model", "engine"},
    "sandboxes": {"core"},
    "envs": {"core", "sandboxes"},
    "trainer": {"core", "model", "engine", "sandboxes", "envs"},
}
"""Each package -> the packages it may import."""


def _modules() -> dict[str, Path]:
    """Every module of the `parity` namespace -> its file. Programs started in a sandbox or in
    vLLM's interpreter (`guest/`) are run, never imported: they are not modules here."""
    out: dict[str, Path] = {}
    for src in [*ROOT.glob("*/src"), *ROOT.glob("packages/*/src")]:
        for f in (src / "parity").rglob("*.py"):
            if "guest" in f.relative_to(src).parts:
                continue
            parts = f.relative_to(src).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the parity modules it imports anywhere in its body."""
    graph: dict[str, set[str]] = {}
    for name, f in modules.items():
        package = name if f.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                names = [base, *(f"{base}.{a.name}" for a in node.names)]
            else:
                continue
            for n in names:
                while n and n not in modules:  # `from m import name`: the module is m
                    n = n.rpartition(".")[0]
                if n and n != name:
                    found.add(n)
        graph[name] = found
    return graph


def test_every_package_imports_only_the_layers_below_it() -> None:
    graph = _imports(_modules())
    wrong = sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps
                   if (a := m.split(".")[1]) != (b := d.split(".")[1]) and b not in LAYERS[a])
    assert wrong == []
    assert {m.split(".")[1] for m in graph} == set(LAYERS)


def test_no_modules_import_each_other() -> None:
    graph = _imports(_modules())
    cycles: list[list[str]] = []
    done: set[str] = set()

    def visit(m: str, path: list[str]) -> None:
        if m in path:
            cycles.append([*path[path.index(m):], m])
            return
        if m in done:
            return
        for d in sorted(graph[m]):
            visit(d, [*path, m])
        done.add(m)

    for m in sorted(graph):
        visit(m, [])
    assert cycles == []
