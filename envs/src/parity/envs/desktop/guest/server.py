"""The control server: HTTP on a unix socket inside the sandbox, one desktop behind it.

    GET  /health            {"ok": true, "atspi": whether AT-SPI runs} or 503 {"error": why the desktop is dead}
    GET  /screenshot        PNG (?format=raw: RGB bytes, size in X-Width / X-Height)
    GET  /accessibility     {"rows": [{tag, name, text, class, description, x, y, w, h}, ...]}
    GET  /windows           {"active": title or null, "titles": [top first]}
    POST /action            {"op": ..., ...} → perform, wait until the screen settles and the
                            apps stop using CPU
                            (or sleep `fixed_sleep_s` if given, as OSWorld does)
    POST /setup             {"type": launch|open|execute|sleep|activate_window|close_window|settle|write_file
                             (content, or content_base64 for bytes),
                             "parameters": {...}}
    POST /file              {"path": "~/x", "binary": false} → {"exists", "is_dir", "content"
                            (or "content_base64" if binary), "entries"}
    POST /reset             kill the apps, empty the home
Every JSON answer carries `elapsed_s` (time spent serving it); the binary ones carry the
header X-Elapsed-S. Errors are 400 (bad request) or 503 (dead desktop) with {"error": ...}.

Usage: python3 -m guest.server --socket PATH --run-dir DIR --home DIR [--width W --height H]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socketserver import TCPServer
from urllib.parse import parse_qs, urlparse

from . import screen, xinput
from .session import Session, SessionError

MAX_FILE_BYTES = 1 << 20
SETTLE_TIMEOUT_S = 3.0
SETUP_STILL_S = 0.5
"""How long the screen must stay still after a setup step that starts an app."""


class Desktop:
    """The operations behind the routes; one lock serialises everything touching the display."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.lock = threading.Lock()

    def action(self, op: dict) -> dict:
        """Perform `op`, then wait until the screen settles, or for `fixed_sleep_s` if the op has
        it (OSWorld's way, kept for comparison)."""
        fixed = op.pop("fixed_sleep_s", None)
        if fixed is not None and (isinstance(fixed, bool) or not isinstance(fixed, int | float) or not 0 <= fixed <= 10):
            raise xinput.ActionError(f"fixed_sleep_s must be a number in 0..10, got {fixed!r}")
        start = time.monotonic()
        xinput.execute(op, self.session.width, self.session.height, self.session.env)
        acted = time.monotonic()
        if fixed is None:
            settled, settle_s = self.session.settle(SETTLE_TIMEOUT_S)
        else:
            time.sleep(fixed)
            settled, settle_s = False, time.monotonic() - acted
        return {"ok": True, "action_s": acted - start, "settle_s": settle_s, "settled": settled}

    def setup(self, step: dict) -> dict:
        kind, params = step.get("type"), step.get("parameters", {})
        if not isinstance(params, dict):
            raise SessionError(f"setup {kind!r}: parameters must be an object")
        s = self.session
        result: dict = {}
        if kind == "launch":
            result["pid"] = s.launch(params.get("command"))  # type: ignore[arg-type]
        elif kind == "open":
            result["pid"] = s.open(str(params.get("path", "")))
        elif kind == "execute":
            result = s.execute(params.get("command"), bool(params.get("shell", False)))  # type: ignore[arg-type]
        elif kind == "sleep":
            time.sleep(min(float(params.get("seconds", 0)), 10.0))
        elif kind == "activate_window":
            s.activate(str(params.get("window_name", "")), bool(params.get("strict", False)))
        elif kind == "close_window":
            s.close(str(params.get("window_name", "")))
        elif kind == "settle":  # wait longer for a busy desktop to go idle (before evaluating)
            timeout = params.get("timeout", SETTLE_TIMEOUT_S)
            if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 60:
                raise SessionError(f"settle: timeout must be a number in (0, 60], got {timeout!r}")
            result["settled"], result["settle_s"] = s.settle(timeout)
            return result
        elif kind == "write_file":
            if "content_base64" in params:
                data = base64.b64decode(str(params["content_base64"]), validate=True)
            else:
                data = str(params.get("content", "")).encode()
            s.write_file(str(params.get("path", "")), data)
        else:
            raise SessionError(f"unknown setup step type {kind!r}")
        # a starting app (LibreOffice above all) paints its window in bursts with idle gaps
        still_s = SETUP_STILL_S if kind in ("launch", "open") else 0.1
        result["settled"], result["settle_s"] = s.settle(SETTLE_TIMEOUT_S, still_s)
        return result

    def accessibility(self) -> dict:
        s = self.session
        active, trees = s.active(), s.app_trees()
        rows: list[dict] = []
        for wid, title in reversed(list(s.windows().items())):
            x, y, w, h = s.geometry(wid)
            is_active = wid == active
            rows.append({"tag": "window", "name": title, "text": "", "class": "Window",
                         "description": "active" if is_active else "", "x": x, "y": y, "w": w, "h": h})
            if is_active and title in trees:
                rows.extend(r for r in trees[title]["rows"] if r["class"] not in ("Tk", "Toplevel"))
            elif is_active and s.atspi is not None:
                rows.extend(s.atspi.rows(title) or [])
        for tree in trees.values():
            if tree.get("hung"):
                rows.append({"tag": "application", "name": f"pid {tree['pid']}", "text": "", "class": "",
                             "description": "not responding", "x": 0, "y": 0, "w": 0, "h": 0})
        return {"rows": rows}

    def windows(self) -> dict:
        s = self.session
        wins, active = s.windows(), s.active()
        return {"active": wins.get(active) if active else None, "titles": list(reversed(wins.values()))}

    def file(self, path: str, binary: bool = False) -> dict:
        """A file's text (or, `binary`, its bytes in base64 as `content_base64`), or a folder's names."""
        full = self.session.path(path)
        if os.path.isdir(full):
            return {"exists": True, "is_dir": True, "content": None, "entries": sorted(os.listdir(full))}
        if not os.path.isfile(full):
            return {"exists": False, "is_dir": False, "content": None, "entries": None}
        with open(full, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise SessionError(f"file {path!r} is larger than {MAX_FILE_BYTES} bytes")
        if binary:
            return {"exists": True, "is_dir": False, "content_base64": base64.b64encode(data).decode(), "entries": None}
        return {"exists": True, "is_dir": False, "content": data.decode("utf-8", "replace"), "entries": None}


class Handler(BaseHTTPRequestHandler):
    desktop: Desktop
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # keep stderr quiet
        pass

    def do_GET(self) -> None:
        url = urlparse(self.path)
        routes = {"/health": lambda: {"ok": True, "atspi": self.desktop.session.atspi is not None},
                  "/accessibility": self.desktop.accessibility,
                  "/windows": self.desktop.windows}
        if url.path == "/screenshot":
            self._screenshot(parse_qs(url.query).get("format", ["png"])[0])
        elif url.path in routes:
            self._json(routes[url.path])
        else:
            self._send(404, {"error": f"no route {url.path}"})

    def do_POST(self) -> None:
        d = self.desktop
        routes = {"/action": d.action, "/setup": d.setup, "/reset": lambda _b: (d.session.reset(), {"ok": True})[1],
                  "/file": lambda b: d.file(str(b.get("path", "")), bool(b.get("binary", False)))}
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if not isinstance(body, dict):
                raise ValueError("body must be a JSON object")
        except ValueError as e:
            self._send(400, {"error": f"bad JSON body: {e}"})
            return
        if self.path not in routes:
            self._send(404, {"error": f"no route {self.path}"})
            return
        self._json(lambda: routes[self.path](body))

    def _json(self, fn) -> None:
        start = time.monotonic()
        with self.desktop.lock:
            dead = self.desktop.session.dead()
            if dead:
                self._send(503, {"error": dead})
                return
            try:
                result, code = fn(), 200
            except (xinput.ActionError, SessionError, ValueError, TypeError, OSError) as e:  # binascii.Error is a ValueError
                result, code = {"error": str(e)}, 400
            except Exception as e:  # a bug must not take the desktop down with it
                result, code = {"error": f"internal error: {type(e).__name__}: {e}"}, 500
            dead = self.desktop.session.dead()  # the request may have been what killed it
        if dead:
            result, code = {"error": dead}, 503
        result["elapsed_s"] = time.monotonic() - start
        self._send(code, result)

    def _screenshot(self, fmt: str) -> None:
        start = time.monotonic()
        with self.desktop.lock:
            dead = self.desktop.session.dead()
            frame = None if dead else self.desktop.session.fb.frame()
        if frame is None:
            self._send(503, {"error": dead})
            return
        body = screen.png(frame) if fmt == "png" else frame.rgb
        headers = {"Content-Type": "image/png" if fmt == "png" else "application/octet-stream",
                   "X-Width": str(frame.width), "X-Height": str(frame.height),
                   "X-Elapsed-S": f"{time.monotonic() - start:.6f}"}
        self._raw(200, body, headers)

    def _send(self, code: int, doc: dict) -> None:
        self._raw(code, json.dumps(doc).encode(), {"Content-Type": "application/json"})

    def _raw(self, code: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(code)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class UnixServer(ThreadingHTTPServer):
    address_family = socket.AF_UNIX
    daemon_threads = True

    def server_bind(self) -> None:
        TCPServer.server_bind(self)  # HTTPServer's version expects a (host, port) address
        self.server_name, self.server_port = "desktop", 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--socket", required=True)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--home", required=True)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--height", type=int, default=768)
    args = parser.parse_args()
    session = Session(args.run_dir, args.home, args.width, args.height)
    session.start()
    Handler.desktop = Desktop(session)
    tmp = args.socket + ".tmp"
    server = UnixServer(tmp, Handler)
    os.chmod(tmp, 0o666)
    os.rename(tmp, args.socket)  # the socket appears only once the desktop is up
    server.serve_forever()


if __name__ == "__main__":
    main()
