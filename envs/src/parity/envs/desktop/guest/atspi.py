"""The accessibility tree of real applications through AT-SPI (GTK apps such as PCManFM).

Each desktop runs its own D-Bus session bus, the AT-SPI bus launcher and registry
(`Accessibility.start`); apps started with `env()` export their widgets on it (GTK 2 through
the gail and atk-bridge modules). `Accessibility.rows(title)` walks the showing widgets of the
application window with that title into the same rows as the Tk apps' trees. Every AT-SPI call
is bounded (`Atspi.set_timeout`), so a hung app costs at most that, never a stalled desktop.

Nodes that manage their descendants (LibreOffice's sheet and documents) are not listed child
by child: a sheet says it has 2^31-1 children. A sheet (a `table`) gives the cells on screen
instead (`_cells`: the rectangle between its top-left and bottom-right visible cells, at most
MAX_CELLS of them looked at): the active (focused) cell first, then each cell with text, as
`table-cell` rows named by address. Other such nodes whose role is a document (Writer's text,
whose children are the paragraphs on screen) have their children walked if there are at most
MAX_CHILDREN, keeping those inside the document's box. Both come after the rest of the window.
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
MAX_CELLS = 400
"""Cells of a sheet looked at per read (a 1024x768 Calc shows 12 x 27 = 324); an empty one
costs two AT-SPI calls (the cell, its text), one with text four (its states and box too)."""
MAX_CELL_ROWS = 200
"""Rows for a sheet's cells (the focused one and those with text) at most."""
MAX_CHILDREN = 200
"""A document that manages its descendants has its children walked only if it has at most this
many (Writer lists just the paragraphs on screen)."""
CELLS_S = 1.0
"""Time a sheet's cells may take at most; past it the cells read so far are kept."""


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
    stack: list[tuple[object, bool, object]] = [(node, False, None)]  # (node, in a document, clip box)
    # what the nodes that manage their descendants hold comes after the rest of the window: a
    # full sheet then loses cells, not the menus, to the token budget of the text, and the
    # widgets' marks keep their numbers while the cells change; (table, box, focused) or [children]
    later: list[tuple[object, object, bool] | list[tuple[object, bool, object]]] = []
    while (stack or later) and len(rows) < MAX_NODES:
        if not stack:
            held = later.pop(0)
            if isinstance(held, tuple):
                rows.extend(_cells(*held, min(MAX_CELL_ROWS, MAX_NODES - len(rows)), pyatspi))
            else:
                stack = held
            continue
        acc, in_document, clip = stack.pop()
        try:
            states = acc.getState()
            if not states.contains(pyatspi.STATE_SHOWING):
                continue
            box = acc.queryComponent().getExtents(pyatspi.DESKTOP_COORDS)
            if clip is not None and not _meets(box, clip):
                continue  # a document's child scrolled out of view
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
            document = role.startswith("document")
            if states.contains(pyatspi.STATE_MANAGES_DESCENDANTS):
                children = []
                if role == "table":
                    later.append((acc, box, states.contains(pyatspi.STATE_FOCUSED)))
                elif document and acc.childCount <= MAX_CHILDREN:
                    later.append([(c, True, box) for c in reversed(list(acc)) if c is not None])
            elif (closed and role == "menu") or hidden_bar:
                children = []
            elif closed:
                children = [c for c in acc if c is not None and c.getRoleName() in _EDITABLE]
            else:
                children = list(acc)
        except Exception:
            continue  # the node went away meanwhile
        # a container is left out, but not a named one in a document: Impress's shapes ("Title 1")
        # and its slide sorter's slides
        if box.width > 0 and box.height > 0 and (role not in _CONTAINERS or (in_document and acc.name)):
            rows.append({"tag": role, "name": acc.name or "", "text": text, "class": "atspi",
                         "description": ",".join(flags), "x": box.x, "y": box.y, "w": box.width, "h": box.height})
        stack.extend(reversed([(c, document, clip) for c in children if c is not None]))


def _meets(a: object, b: object) -> bool:
    """Whether two boxes (x, y, width, height) overlap."""
    return a.x < b.x + b.width and b.x < a.x + a.width and a.y < b.y + b.height and b.y < a.y + a.height


def _address(name: str) -> tuple[int, int] | None:
    """A cell name such as "AB12" → (row, column) from 0, or None if it is not one."""
    letters = name.rstrip("0123456789")
    digits = name[len(letters):]
    if not letters or not digits or not letters.isascii() or not letters.isalpha() or not letters.isupper():
        return None
    col = 0
    for ch in letters:
        col = col * 26 + ord(ch) - ord("A") + 1
    return int(digits) - 1, col - 1


def _column_name(col: int) -> str:
    name = ""
    col += 1
    while col:
        col, rest = divmod(col - 1, 26)
        name = chr(ord("A") + rest) + name
    return name


def _cells(table: object, box: object, focus: bool, limit: int, pyatspi: object) -> list[dict]:
    """The rows of a table that manages its cells (Calc's sheet): its showing cells between the
    top-left and bottom-right ones on screen, row by row, at most MAX_CELLS looked at; the
    focused one first (even if empty), then those with text; at most `limit` rows. Cells are
    named by their address (Calc's own names), computed where the corner cells' names are
    addresses. An empty cell costs two AT-SPI calls (the cell, its text); its states are asked
    only while the table has the focus (`focus`) and its focused cell is not found yet. A call
    that fails ends the cells (a busy app costs one timeout, not one a cell)."""
    from gi.repository import Atspi

    rows: list[dict] = []
    if limit <= 0 or box.width <= 0 or box.height <= 0:
        return rows
    deadline = time.monotonic() + CELLS_S
    try:
        corners = [Atspi.Component.get_accessible_at_point(table, x, y, Atspi.CoordType.SCREEN)
                   for x, y in ((box.x + 1, box.y + 1), (box.x + box.width - 2, box.y + box.height - 2))]
        if None in corners:
            return rows
        names = [c.get_name() for c in corners]
        spans = [_address(n) for n in names]
        if None in spans:
            spans = [(Atspi.Table.get_row_at_index(table, i), Atspi.Table.get_column_at_index(table, i))
                     for i in (c.get_index_in_parent() for c in corners)]
            by_address = False
        else:
            by_address = True
        (r0, c0), (r1, c1) = spans
        looked, found = 0, False
        for r in range(r0, r1 + 1):
            for c in range(c0, c1 + 1):
                if looked >= MAX_CELLS or len(rows) >= limit or time.monotonic() > deadline:
                    return rows
                looked += 1
                cell = Atspi.Table.get_accessible_at(table, r, c)
                if cell is None:
                    continue
                text = Atspi.Text.get_text(cell, 0, -1)
                if not text and (found or not focus):  # an empty cell that cannot be the focused one
                    continue
                states = cell.get_state_set()
                if not states.contains(pyatspi.STATE_SHOWING):
                    continue
                focused = not found and states.contains(pyatspi.STATE_FOCUSED)
                if not text and not focused:
                    continue
                found = found or focused
                ext = Atspi.Component.get_extents(cell, Atspi.CoordType.SCREEN)
                if ext.width <= 0 or ext.height <= 0:
                    continue
                flags = [s for s in _STATES if states.contains(getattr(pyatspi, f"STATE_{s.upper()}"))]
                row = {"tag": "table-cell", "name": f"{_column_name(c)}{r + 1}" if by_address else cell.get_name(),
                       "text": text[:200], "class": "atspi", "description": ",".join(flags),
                       "x": ext.x, "y": ext.y, "w": ext.width, "h": ext.height}
                if focused:
                    rows.insert(0, row)
                else:
                    rows.append(row)
    except Exception:  # a busy or dying app, or a table without these interfaces: what was read so far
        return rows
    return rows


def _wait(ready, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)
