"""The host's side of the control server: an httpx client over the sandbox's unix socket."""

from __future__ import annotations

import time

import httpx
import numpy as np


class DesktopRequestError(ValueError):
    """The server refused a request (bad action or setup step); the message is the server's."""


class DesktopDeadError(RuntimeError):
    """The desktop is gone or not answering (X server died, sandbox exited, timeout)."""


class DesktopClient:
    """Calls the control server; every call records its wall time in `last_s`."""

    def __init__(self, socket_path: str, timeout: float = 90.0) -> None:
        self._http = httpx.Client(transport=httpx.HTTPTransport(uds=socket_path),
                                  base_url="http://desktop", timeout=timeout)
        self.last_s = 0.0

    def _request(self, method: str, path: str, body: dict | None = None) -> httpx.Response:
        start = time.monotonic()
        try:
            response = self._http.request(method, path, json=body)
        except httpx.HTTPError as e:
            raise DesktopDeadError(f"{method} {path}: {type(e).__name__}: {e}") from e
        finally:
            self.last_s = time.monotonic() - start
        if response.status_code == 503:
            raise DesktopDeadError(f"desktop is dead: {response.json().get('error')}")
        if response.status_code != 200:
            raise DesktopRequestError(response.json().get("error", response.text))
        return response

    def health(self) -> dict:
        return self._request("GET", "/health").json()

    def screenshot_png(self) -> bytes:
        """The screen as PNG bytes."""
        return self._request("GET", "/screenshot").content

    def screenshot(self) -> np.ndarray:
        """The screen as an (height, width, 3) uint8 array."""
        r = self._request("GET", "/screenshot?format=raw")
        shape = (int(r.headers["X-Height"]), int(r.headers["X-Width"]), 3)
        return np.frombuffer(r.content, dtype=np.uint8).reshape(shape)

    def accessibility(self) -> list[dict]:
        """Rows {tag, name, text, class, description, x, y, w, h}: windows, then the active app's widgets."""
        return self._request("GET", "/accessibility").json()["rows"]

    def windows(self) -> dict:
        """{"active": title or None, "titles": [top first]}."""
        return self._request("GET", "/windows").json()

    def action(self, op: dict) -> dict:
        """Perform one whitelisted operation; returns action_s, settle_s, settled."""
        return self._request("POST", "/action", op).json()

    def setup(self, step: dict) -> dict:
        """Run one task `config` step ({"type": ..., "parameters": {...}})."""
        return self._request("POST", "/setup", step).json()

    def file(self, path: str, binary: bool = False) -> dict:
        """{"exists", "is_dir", "content" (text or None; with `binary`, "content_base64"),
        "entries" (names or None)} of a guest path."""
        return self._request("POST", "/file", {"path": path, "binary": binary}).json()

    def reset(self) -> None:
        """Kill the apps and empty the home."""
        self._request("POST", "/reset", {})

    def close(self) -> None:
        self._http.close()
