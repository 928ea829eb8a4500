"""Size measures of the source tree: non-test lines per package, the largest modules and
classes, functions over 60 lines, the driver's fields, and import cycles.

    uv run python scripts/tree_measures.py [--root DIR] [--json]

Packages are the workspace members' `src/parity/*` directories; tests, scripts and examples
are not counted. A "field" of a class is a distinct `self.NAME = ...` target in its methods.
The driver is every class in the trainer's driver modules (`orchestrator`, `admission`,
`fleet`, `stepmetrics`, `driver`, `driver_state`, whichever exist).
"""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path

DRIVER_MODULES = ("orchestrator", "admission", "fleet", "stepmetrics", "driver", "driver_state")


def source_files(root: Path) -> dict[str, Path]:
    """Module name (parity.x.y) -> file, over every workspace member's src/ directory."""
    out: dict[str, Path] = {}
    for src in sorted(root.glob("**/src/parity")):
        if ".venv" in src.parts or "node_modules" in src.parts:
            continue
        for f in sorted(src.rglob("*.py")):
            parts = f.relative_to(src.parent).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = f
    return out


def lines(f: Path) -> int:
    return len(f.read_text().splitlines())


def package_of(module: str) -> str:
    return ".".join(module.split(".")[:2])


def imports(module: str, tree: ast.AST, modules: set[str]) -> set[str]:
    """The project modules `module` imports (at any depth of its body)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:
                base = ".".join([*module.split(".")[:-node.level], node.module])
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        for n in names:
            while n and n not in modules:
                n = n.rpartition(".")[0]
            if n and n != module:
                found.add(n)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def measure(root: Path) -> dict:
    files = source_files(root)
    per_package: dict[str, int] = {}
    modules, classes, long_functions, driver = [], [], [], {}
    graph: dict[str, set[str]] = {}
    for name, f in files.items():
        n = lines(f)
        rel = str(f.relative_to(root))
        per_package[package_of(name)] = per_package.get(package_of(name), 0) + n
        modules.append((n, rel))
        tree = ast.parse(f.read_text())
        graph[name] = imports(name, tree, set(files))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                size = node.end_lineno - node.lineno + 1
                classes.append((size, f"{rel}:{node.name}"))
                fields = {t.attr for m in ast.walk(node) if isinstance(m, ast.Assign | ast.AnnAssign)
                          for t in (m.targets if isinstance(m, ast.Assign) else [m.target])
                          for t in ast.walk(t)
                          if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                          and t.value.id == "self"}
                if name.startswith("parity.trainer.") and name.rsplit(".", 1)[1] in DRIVER_MODULES:
                    driver[f"{name.rsplit('.', 1)[1]}.{node.name}"] = len(fields)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                size = node.end_lineno - node.lineno + 1
                if size > 60:
                    long_functions.append((size, f"{rel}:{node.name}"))
    return {
        "lines_per_package": dict(sorted(per_package.items())),
        "total_lines": sum(per_package.values()),
        "largest_modules": sorted(modules, reverse=True)[:5],
        "modules_over_400": [m for m in sorted(modules, reverse=True) if m[0] > 400],
        "largest_classes": sorted(classes, reverse=True)[:5],
        "functions_over_60": sorted(long_functions, reverse=True),
        "driver_fields": driver,
        "import_cycles": cycles(graph),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    a = p.parse_args()
    m = measure(a.root)
    if a.json:
        print(json.dumps(m, indent=1))
        return
    print("non-test lines per package:")
    for k, v in m["lines_per_package"].items():
        print(f"  {k:28s} {v:6d}")
    print(f"  {'total':28s} {m['total_lines']:6d}")
    for key in ("largest_modules", "modules_over_400", "largest_classes", "functions_over_60"):
        print(f"{key.replace('_', ' ')} ({len(m[key])}):")
        for n, where in m[key]:
            print(f"  {n:5d}  {where}")
    print("driver fields:", ", ".join(f"{k} {v}" for k, v in m["driver_fields"].items()),
          f"(total {sum(m['driver_fields'].values())})")
    print(f"import cycles ({len(m['import_cycles'])}):")
    for c in m["import_cycles"]:
        print("  " + " <-> ".join(c))


if __name__ == "__main__":
    main()
