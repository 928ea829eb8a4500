"""The accessibility tree of real applications through AT-SPI (GTK apps such as PCManFM).

Each desktop runs its own D-Bus session bus, the AT-SPI bus launcher and registry
(`Accessibility.start`); apps started with `env()` export their widgets on it (GTK 2 through
the gail and atk-bridge modules). `Accessibility.rows(title)` walks the showing widgets of the
application window with that title into the same rows as the Tk apps' trees. Every AT-SPI call
is bounded (`Atspi.set_timeout`), so a hung app costs at most that, never a stalled desktop.
Needs Debian's dbus-daemon, at-spi2-core, libatk-adaptor and python3-pyatspi; without them
the desktop runs without AT-SPI trees (`available()` is False).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

LAUNCHER = "/usr/libexec/at-spi-bus-launcher"
REGISTRY = "/usr/libexec/at-spi2-registryd"
MAX_NODES = 600
CALL_TIMEOUT_MS = 500
SLOW_APP_S = 3.0
_STATES = ("focused", "selected", "checked")
_MENUS = frozenset({"menu", "combo-box"})
"""Roles whose items are not walked while closed (they are not showing, and listing them makes
LibreOffice build an accessible object for every item: most of its tree's time)."""
_EDITABLE = frozenset({"entry", "text"})
"""A closed combo box's children that are still walked: its editable part (Firefox ESR 140's
address bar keeps the URL in such a child, not in the combo box itself)."""
_CONTAINERS = frozenset({"frame", "filler", "panel", "scroll-pane", "viewport", "split-pane", "layered-pane"})
"""Roles left out of the rows (their children are kept): the window row already says "frame"."""


def available() -> bool:
    """Whether this system can run AT-SPI (the daemons and the Python bindings are installed)."""
    if shutil.which("dbus-daemon") is None or not os.path.exists(LAUNCHER) or not os.path.exists(REGISTRY):
        return False
    try:
        import pyatspi  # noqa: F401 - Debian's python3-pyatspi
    except ImportError:
        return False
    return True


class Accessibility:
    """One desktop's session bus, AT-SPI bus and registry, and reading trees from them."""

    def __init__(self, run_dir: str, base_env: dict[str, str], log: object) -> None:
        self.bus = os.path.join(run_dir, "session-bus")
        self.runtime_dir = os.path.join(run_dir, "xdg")  # the AT-SPI bus socket goes here, not in the home
        self.base_env, self.log = base_env, log
        self.procs: list[subprocess.Popen] = []

    def env(self) -> dict[str, str]:
        """What apps need in their environment to export their widgets."""
        return {"DBUS_SESSION_BUS_ADDRESS": f"unix:path={self.bus}", "XDG_RUNTIME_DIR": self.runtime_dir,
                "GTK_MODULES": "gail:atk-bridge", "GNOME_ACCESSIBILITY": "1"}

    def start(self) -> list[subprocess.Popen]:
        """Start the session bus, the AT-SPI bus launcher and the registry; returns their
        processes. Raises RuntimeError (having stopped what it started) if the bus does not come up."""
        os.makedirs(self.runtime_dir, mode=0o700, exist_ok=True)
        env = {**self.base_env, **self.env()}
        out = {"stdout": self.log, "stderr": self.log, "env": env, "stdin": subprocess.DEVNULL}
        self.procs.append(subprocess.Popen(["dbus-daemon", "--session", "--nofork", "--nopidfile",
                                            f"--address=unix:path={self.bus}"], **out))
        try:
            _wait(lambda: os.path.exists(self.bus), 30, "the session bus")
        except RuntimeError:
            self.procs.pop().kill()
            raise
        self.procs.append(subprocess.Popen([LAUNCHER, "--launch-immediately"], **out))
        try:  # before the registry asks for the bus (see _owns_bus)
            _wait(self._owns_bus, 30, "the AT-SPI bus launcher")
        except RuntimeError:
            for proc in self.procs:
                proc.kill()
            raise
        self.procs.append(subprocess.Popen([REGISTRY, "--use-gnome-session=false"], **out))
        os.environ.update(self.env())  # this process reads the trees over the same buses
        import pyatspi

        pyatspi.Atspi.set_timeout(CALL_TIMEOUT_MS, 5000)
        return self.procs

    def _owns_bus(self) -> bool:
        """Whether the bus launcher owns org.a11y.Bus on the session bus yet. A registry that
        asks for the AT-SPI bus before that has D-Bus start a second launcher, and whichever
        loses the name exits (code 0): under load, 4 of 30 starts here lost ours, which the
        desktop then took for a dead accessibility daemon; waiting first, 0 of 30."""
        from gi.repository import Gio, GLib

        conn = Gio.DBusConnection.new_for_address_sync(
            f"unix:path={self.bus}", Gio.DBusConnectionFlags.AUTHENTICATION_CLIENT
            | Gio.DBusConnectionFlags.MESSAGE_BUS_CONNECTION, None, None)
        try:
            reply = conn.call_sync("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus",
                                   "NameHasOwner", GLib.Variant("(s)", ("org.a11y.Bus",)),
                                   GLib.VariantType("(b)"), Gio.DBusCallFlags.NONE, 1000, None)
            return bool(reply.unpack()[0])
        finally:
            conn.close_sync(None)

    def rows(self, title: str) -> list[dict] | None:
        """The showing widgets of the app window titled `title` (None if no app exports one).

        An app that exports the window but does not answer in time, or answers with nothing
        showing, is asked again for up to SLOW_APP_S seconds: a browser builds its tree on the
        first question and a dialog fills in after it is mapped, so the screen can be settled
        while the tree is not yet (a busy machine widens that gap past one call's timeout)."""
        deadline = time.monotonic() + SLOW_APP_S
        while True:
            rows, slow = self._read(title)
            if not slow or time.monotonic() > deadline:
                return rows
            time.sleep(0.1)

    def _read(self, title: str) -> tuple[list[dict] | None, bool]:
        """One walk: (rows or None, whether an app was too slow to tell)."""
        import pyatspi

        try:
            desktop = pyatspi.Registry.getDesktop(0)
            # this process keeps the desktop's app list from the registry's add/remove signals;
            # one lost while an app was killed mid-call left it empty for good (seen on docker):
            # ask the registry afresh instead
            desktop.clear_cache()
            apps = list(desktop)
        except Exception:  # the registry itself does not answer
            return None, False
        slow = False
        for app in apps:
            try:  # one app at a time: the last episode's killed app may still be listed, and not answer
                frames = [f for f in app or () if f is not None and f.name == title]
            except Exception as e:  # a dying, hung or busy app: GLib errors of every kind, bounded by the timeout
                slow = slow or _timed_out(e)
                continue
            if frames:
                rows: list[dict] = []
                _walk(frames[0], rows, pyatspi)
                return rows, not rows
        return None, slow


def _timed_out(error: Exception) -> bool:
    """Whether an AT-SPI call failed for want of time (a busy app), not because the app is gone."""
    from gi.repository import Gio, GLib

    return isinstance(error, GLib.Error) and error.matches(Gio.io_error_quark(), Gio.IOErrorEnum.TIMED_OUT)


def _walk(node: object, rows: list[dict], pyatspi: object) -> None:
    """Depth first over showing nodes, at most MAX_NODES rows."""
    stack = [node]
    while stack and len(rows) < MAX_NODES:
        acc = stack.pop()
        try:
            states = acc.getState()
            if not states.contains(pyatspi.STATE_SHOWING):
                continue
            box = acc.queryComponent().getExtents(pyatspi.DESKTOP_COORDS)
            role = acc.getRoleName().replace(" ", "-")
            try:
                t = acc.queryText()
                text = t.getText(0, min(t.characterCount, 200))
            except NotImplementedError:  # no Text interface: one D-Bus call fewer than asking first
                text = ""
            flags = [s for s in _STATES if states.contains(getattr(pyatspi, f"STATE_{s.upper()}"))]
            closed = role in _MENUS and not states.contains(pyatspi.STATE_EXPANDED) \
                and not states.contains(pyatspi.STATE_SELECTED)
            # LibreOffice's own menu bar, hidden under the GTK one, has no size but says it is
            # showing, and so do its menus (in boxes over the toolbars)
            hidden_bar = role == "menu-bar" and (box.width <= 0 or box.height <= 0)
            if states.contains(pyatspi.STATE_MANAGES_DESCENDANTS) or (closed and role == "menu") or hidden_bar:
                children = []
            elif closed:
                children = [c for c in acc if c is not None and c.getRoleName() in _EDITABLE]
            else:
                children = list(acc)
        except Exception:
            continue  # the node went away meanwhile
        if box.width > 0 and box.height > 0 and role not in _CONTAINERS:
            rows.append({"tag": role, "name": acc.name or "", "text": text, "class": "atspi",
                         "description": ",".join(flags), "x": box.x, "y": box.y, "w": box.width, "h": box.height})
        stack.extend(reversed([c for c in children if c is not None]))


def _wait(ready, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)
