"""OSWorld's evaluator getters: read the desktop's state (or the task's own files) for a metric.

A getter is the `result` or `expected` entry of an evaluator, {"type": NAME, ...}. As in
OSWorld, file getters hand the metric a *local path*: `vm_file` copies the file out of the
desktop into the episode's cache folder (None if it does not exist), `cloud_file` is a file
shipped with the task (OSWorld downloads it from a URL; here it is the file in the task
folder's `files/` named by its `dest`, or else by the URL's last part, since the sandbox has
no network). `rule` returns its `rules`.

OSWorld's names here: vm_file, cloud_file, rule, vm_command_line, vm_command_error,
active_url_from_accessTree. parity's own: vm_path_kind, vm_dir_entries, active_window_title,
window_titles, accessibility_text, browser_bookmarks, browser_history.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from .client import DesktopClient, DesktopRequestError


@dataclass(frozen=True)
class EvalContext:
    """What getters read from: the desktop (and its screen size), the folder for files copied
    out of it, and the folder of files shipped with the task."""

    client: DesktopClient
    cache_dir: Path
    files_dir: Path
    width: int = 1024
    height: int = 768


def shipped_file(files_dir: Path, url: str, name: str | None = None) -> Path:
    """The shipped file for an OSWorld URL: `files_dir` / `name` (the file's name in the task:
    its `dest`, or the basename of the path it is downloaded to) if that exists, else
    `files_dir` / the URL's last path part (Google Drive URLs all end in "download")."""
    candidates = [os.path.basename(name)] if name else []
    candidates.append(os.path.basename(urlparse(url).path) or url)
    return next((files_dir / c for c in candidates if (files_dir / c).is_file()), files_dir / candidates[0])


def _one_or_many(g: dict, fetch: Callable[[str, str], Any]) -> Any:
    """OSWorld's `multi`: path and dest are lists and the getter returns a list."""
    if g.get("multi"):
        return [fetch(p, d) for p, d in zip(g["path"], g["dest"], strict=True)]
    return fetch(g["path"], g.get("dest", os.path.basename(g["path"])))


def vm_file(ctx: EvalContext, g: dict) -> Any:
    """Copy `path` out of the desktop to the cache as `dest`; its local path (None if missing)."""
    def fetch(path: str, dest: str) -> str | None:
        f = ctx.client.file(path, binary=True)
        if not f["exists"] or f["is_dir"]:
            return None
        local = ctx.cache_dir / os.path.basename(dest)
        local.write_bytes(base64.b64decode(f["content_base64"]))
        return str(local)

    return _one_or_many(g, fetch)


def cloud_file(ctx: EvalContext, g: dict) -> Any:
    """The shipped file named by `path` (a URL in OSWorld's tasks); its local path."""
    return _one_or_many(g, lambda path, dest: str(shipped_file(ctx.files_dir, path, dest)))


def rule(ctx: EvalContext, g: dict) -> Any:
    """The `rules` object itself (metrics read their own keys from it, e.g. "expected")."""
    return g["rules"]


def _command(ctx: EvalContext, g: dict) -> dict:
    command = g["command"]
    return ctx.client.setup({"type": "execute", "parameters": {"command": command,
                                                               "shell": bool(g.get("shell", isinstance(command, str)))}})


def vm_command_line(ctx: EvalContext, g: dict) -> str:
    """The stdout of `command` run in the desktop's home."""
    return _command(ctx, g)["stdout"]


def vm_command_error(ctx: EvalContext, g: dict) -> str:
    """The stderr of `command` run in the desktop's home."""
    return _command(ctx, g)["stderr"]


def vm_path_kind(ctx: EvalContext, g: dict) -> str | None:
    """ "file", "dir" or None (nothing there)."""
    f = ctx.client.file(g["path"])
    return None if not f["exists"] else "dir" if f["is_dir"] else "file"


def vm_dir_entries(ctx: EvalContext, g: dict) -> list[str] | None:
    """The names in a folder (None if it is not a folder)."""
    return ctx.client.file(g["path"])["entries"]


def active_window_title(ctx: EvalContext, g: dict) -> str | None:
    return ctx.client.windows()["active"]


def window_titles(ctx: EvalContext, g: dict) -> list[str]:
    return ctx.client.windows()["titles"]


def accessibility_text(ctx: EvalContext, g: dict) -> str | None:
    """App state: the text of the active app's first widget with this name (and tag, if given)."""
    for row in ctx.client.accessibility():
        if row["name"] == g["name"] and row["tag"] == g.get("tag", row["tag"]) != "window":
            return row["text"]
    return None


def active_url_from_accessTree(ctx: EvalContext, g: dict) -> str | None:  # OSWorld's name, camel case included
    """The URL in the active browser window's address bar, read from its accessibility tree
    (None if no address bar is showing, or if it has the focus: its text may then be an edit
    not yet submitted); `goto_prefix` (e.g. "https://") is put in front of a URL shown
    without a scheme."""
    for row in ctx.client.accessibility():
        if row["tag"] in ("combo-box", "entry") and "address" in row["name"].lower():
            if "focused" in row["description"].split(","):
                return None
            url = row["text"].strip()
            return url if "://" in url or not url else g.get("goto_prefix", "") + url
    return None


def _places(ctx: EvalContext, what: str) -> list[dict[str, str]]:
    """The browser's bookmarks or history, as `guest.browser` reads them from its profile."""
    out = ctx.client.setup({"type": "execute", "parameters": {"command": ["python3", "-m", "guest.browser", what]}})
    if out["returncode"] != 0:
        raise DesktopRequestError(f"reading the browser's {what} failed: {out['stderr'][-500:]}")
    return json.loads(out["stdout"])


def browser_bookmarks(ctx: EvalContext, g: dict) -> list[dict[str, str]]:
    """The browser's saved bookmarks, [{"url", "title"}] in the order they were made (its own
    default bookmarks included), from its places.sqlite."""
    return _places(ctx, "bookmarks")


def browser_history(ctx: EvalContext, g: dict) -> list[str]:
    """The URLs of the pages the browser has visited, from its places.sqlite."""
    return [page["url"] for page in _places(ctx, "history")]


GETTERS: dict[str, Callable[[EvalContext, dict], Any]] = {
    f.__name__: f for f in (vm_file, cloud_file, rule, vm_command_line, vm_command_error, vm_path_kind,
                            vm_dir_entries, active_window_title, window_titles, accessibility_text,
                            active_url_from_accessTree, browser_bookmarks, browser_history)
}
