"""How much of a folder of OSWorld task files parity's loader accepts (`parity envs osworld-coverage`).

OSWorld's tasks download their files from the web; the desktop has none, and a task is loaded
with its files shipped beside it. To measure the vocabulary and not the files, each task is
loaded from a scratch folder where every file it downloads (`download` steps, `cloud_file`
getters) is an empty placeholder of the name the loader looks for. Counts are per app folder
(the first folder under DIR), with the refusals' reasons ranked; tasks refused because they
need the internet, a login or Google Drive are counted apart (`needs_network`), since no
offline desktop can run them.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from .getters import shipped_file
from .tasks import TaskError, load_task


def _downloads(doc: dict) -> list[tuple[str, str | None]]:
    """(url, name) of every file the task downloads, as the loader looks them up."""
    found: list[tuple[str, str | None]] = []
    ev = doc.get("evaluator") if isinstance(doc.get("evaluator"), dict) else {}
    for step in [*doc.get("config", []), *ev.get("postconfig", [])]:
        if isinstance(step, dict) and step.get("type") == "download":
            found += [(f.get("url"), f.get("path")) for f in step.get("parameters", {}).get("files", [])]
    for key in ("result", "expected"):
        for g in ev.get(key) if isinstance(ev.get(key), list) else [ev.get(key)]:
            if isinstance(g, dict) and g.get("type") == "cloud_file":
                pairs = zip(g["path"], g["dest"], strict=False) if g.get("multi") else [(g.get("path"), g.get("dest"))]
                found += list(pairs)
    return [(url, name) for url, name in found if isinstance(url, str)]


def check_with_placeholders(path: Path, scratch: Path) -> str | None:
    """None if the task loads with placeholders for its downloads, else the refusal's reason."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return f"not a JSON task file ({type(e).__name__})"
    if scratch.exists():
        shutil.rmtree(scratch)
    (scratch / "files").mkdir(parents=True)
    if isinstance(doc, dict):
        for url, name in _downloads(doc):
            shipped_file(scratch / "files", url, name if isinstance(name, str) else None).write_bytes(b"")
    copy = scratch / path.name
    copy.write_text(json.dumps(doc), encoding="utf-8")
    try:
        load_task(copy)
    except TaskError as e:
        return e.reason
    return None


def coverage(directory: str | Path, exclude: list[str] | None = None) -> dict[str, Any]:
    """Per app folder: tasks, accepted, needs_network, share (of all), offline_share (of those
    not needing a network) and the refusals' reasons, most common first; and the same for all."""
    root = Path(directory)
    by_app: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="parity-osworld-") as tmp:
        for path in sorted(root.rglob("*.json")):
            rel = path.relative_to(root)
            if rel.parts[0] in (exclude or []):
                continue
            app = rel.parts[0] if len(rel.parts) > 1 else root.name
            reason = check_with_placeholders(path, Path(tmp) / "task")
            entry = by_app.setdefault(app, {"tasks": 0, "accepted": 0, "needs_network": 0, "reasons": Counter()})
            entry["tasks"] += 1
            entry["accepted"] += reason is None
            entry["needs_network"] += reason is not None and reason.startswith("needs ")
            if reason is not None:
                entry["reasons"][reason] += 1
    total = {"tasks": 0, "accepted": 0, "needs_network": 0, "reasons": Counter()}
    for entry in by_app.values():
        for key in total:
            total[key] += entry[key]
    return {"directory": str(root), "apps": {app: _summary(e) for app, e in by_app.items()}, "all": _summary(total)}


def _summary(entry: dict[str, Any]) -> dict[str, Any]:
    offline = entry["tasks"] - entry["needs_network"]
    return {"tasks": entry["tasks"], "accepted": entry["accepted"], "needs_network": entry["needs_network"],
            "share": entry["accepted"] / entry["tasks"] if entry["tasks"] else 0.0,
            "offline_share": entry["accepted"] / offline if offline else 0.0,
            "refusals": entry["reasons"].most_common()}


def report(result: dict[str, Any], top: int = 3) -> str:
    """The text `parity envs osworld-coverage` prints: one line per app, then the total."""
    lines = [f"OSWorld task files in {result['directory']} that parity's desktop loader accepts "
             "(downloaded files as placeholders):"]
    width = max([len(a) for a in result["apps"]] + [3])
    for app, s in [*result["apps"].items(), ("all", result["all"])]:
        reasons = "; ".join(f"{r} ×{n}" for r, n in s["refusals"][:top])
        lines.append(f"  {app:<{width}}  {s['accepted']:>3}/{s['tasks']:<3} ({s['share']:.0%}; "
                     f"{s['offline_share']:.0%} of the {s['tasks'] - s['needs_network']} that need no network)"
                     + (f"  refused: {reasons}" if reasons else ""))
    return "\n".join(lines)
