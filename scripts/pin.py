"""Pin every resolved version in the root pyproject.toml.

uv.lock records download addresses, so it stays out of git. Instead this script resolves
the workspace afresh (ignoring the current pins), reads the lock uv wrote, and writes
`name==version` for every registry package into `[tool.uv] constraint-dependencies`.
Two machines that run `uv sync` against those pins resolve to the same versions.

    python scripts/pin.py            # re-resolve to the newest allowed versions and pin them
    python scripts/pin.py --check    # exit 1 if the lock has versions the pins do not name
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
BLOCK = re.compile(r"^(constraint-dependencies = \[\n)(.*?)(^\])", re.S | re.M)


def locked_pins(lock_path: Path) -> list[str]:
    lock = tomllib.loads(lock_path.read_text())
    pins = {
        f'"{p["name"]}=={p["version"]}"'
        for p in lock["package"]
        if "registry" in p.get("source", {})
    }
    return sorted(pins, key=str.lower)


def write_pins(pins: list[str]) -> None:
    text = PYPROJECT.read_text()
    body = "".join(f"    {p},\n" for p in pins)
    new, n = BLOCK.subn(lambda m: m.group(1) + body + m.group(3), text, count=1)
    if n != 1:
        sys.exit(f"{PYPROJECT}: no `constraint-dependencies = [` block under [tool.uv]")
    PYPROJECT.write_text(new)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only compare the lock with the pins")
    args = ap.parse_args()
    lock = ROOT / "uv.lock"
    if args.check:
        pinned = set(re.findall(r'"[^"]+==[^"]+"', BLOCK.search(PYPROJECT.read_text()).group(2)))
        missing = [p for p in locked_pins(lock) if p not in pinned]
        print("\n".join(missing) or "pins match uv.lock")
        sys.exit(1 if missing else 0)
    write_pins([])  # a fresh resolution: the old pins must not hold versions back
    subprocess.run(["uv", "lock", "--upgrade"], cwd=ROOT, check=True)
    pins = locked_pins(lock)
    write_pins(pins)
    subprocess.run(["uv", "lock"], cwd=ROOT, check=True)
    print(f"pinned {len(pins)} packages in {PYPROJECT.name}")


if __name__ == "__main__":
    main()
