"""One desktop: Xvfb + openbox (+ D-Bus and AT-SPI) + the apps and commands that tasks start,
and their reset.

Runs inside the sandbox. Resetting kills every descendant of the server except the X server,
the window manager and the AT-SPI buses (the server is a child subreaper, so daemons that double-fork are
still its descendants) and empties the home.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

from . import atspi, browser, office, programs
from .processes import become_subreaper, descendants, descendants_of, remove_path, zombie_children
from .screen import Framebuffer

APPS: dict[str, list[str]] = {
    "textedit": [sys.executable, "-m", "guest.apps.textedit"],
    "files": [sys.executable, "-m", "guest.apps.files"],
    "sheet": [sys.executable, "-m", "guest.apps.sheet"],
    "settings": [sys.executable, "-m", "guest.apps.settings"],
    "terminal": ["xterm", "-fa", "DejaVu Sans Mono", "-fs", "11", "-bg", "white", "-fg", "black"],
}
"""Launchable app names → command lines (a task's `launch` may also give a full command);
LibreOffice's names (`office.APP_MODULES`: calc, writer, impress) and `browser` (Firefox ESR
with its own profile, `guest.browser`) are added per session."""

WM_STARTS = 5
"""Starts of a window manager that aborted before the desktop counts as dead; the first waits
0.5 s, each next one twice as long (15.5 s in all: a fork storm that took every pid of the
sandbox is over by then, or the desktop is replaced)."""

OFFICE_DRAWN_S = 5.0
"""How long a LibreOffice launch waits at most for its window to be drawn (see `launch`)."""

_OPENERS = {".csv": "calc", ".xlsx": "calc", ".xls": "calc", ".ods": "calc", ".docx": "writer", ".doc": "writer",
            ".odt": "writer", ".rtf": "writer", ".pptx": "impress", ".odp": "impress", ".html": "browser",
            ".htm": "browser", ".png": "gimp", ".jpg": "gimp", ".jpeg": "gimp", ".xcf": "gimp", ".mp3": "vlc",
            ".mp4": "vlc", ".ogg": "vlc", ".wav": "vlc", ".webm": "vlc"}


class SessionError(RuntimeError):
    """A setup step or query that failed; the message says which and why."""


class Session:
    """The X server, the window manager and everything started on them."""

    def __init__(self, run_dir: str, home: str, width: int, height: int) -> None:
        self.run_dir, self.home, self.width, self.height = run_dir, home, width, height
        self.a11y_dir = os.path.join(run_dir, "a11y")
        self.office_profile = os.path.join(run_dir, "office-profile")
        self.browser_profile = os.path.join(run_dir, "browser-profile")
        self.apps = {**APPS, **{app: office.command(app, self.office_profile) for app in office.APP_MODULES},
                     "browser": browser.command(self.browser_profile)}
        self.fb = Framebuffer(os.path.join(run_dir, "fb", "Xvfb_screen0"))
        self.env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "DISPLAY": ":0", "LANG": "C.UTF-8",
            "PARITY_A11Y_DIR": self.a11y_dir, "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
            "USER": "user", "SHELL": "/bin/sh", "TERM": "xterm", browser.PROFILE_ENV: self.browser_profile,
            **office.env(),
        }
        self.xvfb: subprocess.Popen | None = None
        self.wm: subprocess.Popen | None = None
        self.wm_failure: str | None = None  # why the window manager could not be started again
        self.log = sys.stderr  # the sandbox's log: the host keeps it (server.log or the container log)
        self.atspi = atspi.Accessibility(run_dir, self.env, self.log) if atspi.available() else None
        if self.atspi is not None:
            self.env.update(self.atspi.env())
        self.support: list[subprocess.Popen] = []  # the buses and registry behind AT-SPI
        os.makedirs(run_dir, exist_ok=True)

    def start(self) -> None:
        """Start Xvfb and openbox and wait until both are ready."""
        try:
            become_subreaper()
        except OSError as e:
            raise SessionError(str(e)) from e
        os.makedirs(os.path.join(self.run_dir, "fb"), exist_ok=True)
        os.makedirs(self.a11y_dir, exist_ok=True)
        read_fd, write_fd = os.pipe()
        self.xvfb = subprocess.Popen(
            ["Xvfb", ":0", "-screen", "0", f"{self.width}x{self.height}x24", "-fbdir",
             os.path.join(self.run_dir, "fb"), "-nolisten", "tcp", "-br", "-noreset", "-displayfd", str(write_fd)],
            pass_fds=(write_fd,), stdout=self.log, stderr=self.log, env=self.env)
        os.close(write_fd)
        with os.fdopen(read_fd) as ready:  # Xvfb writes the display number once it accepts clients
            if not ready.readline().strip():
                raise SessionError(f"Xvfb exited during start (code {self.xvfb.wait()})")
        self._start_wm(30)
        if self.atspi is not None:
            try:
                self.support = self.atspi.start()
            except (RuntimeError, OSError) as e:  # a desktop without AT-SPI trees still works
                print(f"AT-SPI not started: {e}", file=self.log, flush=True)
                self.atspi = None
        self.reset()

    def _start_wm(self, timeout: float) -> None:
        """Start openbox and wait until it has taken the screen."""
        wm = self.wm = subprocess.Popen(["openbox", "--config-file", self._openbox_config()],
                                        stdout=self.log, stderr=self.log, env=self.env)
        try:  # its pid on the root, not its check window: that property outlives an openbox that died
            self._wait(lambda: wm.poll() is not None or self._wm_pid() == wm.pid, timeout, "openbox")
        except (OSError, SessionError):  # not two window managers after the next try
            wm.kill()
            wm.wait()
            raise
        if wm.poll() is not None:
            raise SessionError(f"openbox exited during start (code {wm.returncode})")

    def _wm_pid(self) -> int | None:
        """The pid openbox gave on the root window (_OPENBOX_PID) when it took the screen."""
        m = re.search(r"= (\d+)", self._x(["xprop", "-root", "_OPENBOX_PID"]))
        return int(m.group(1)) if m else None

    def _restart_wm(self) -> str | None:
        """Start the window manager again after it aborted (WM_STARTS tries, waiting longer before
        each); None once it runs, else why the desktop is dead. At the pids limit openbox aborts
        when Pango cannot create a thread ("[pango] FcFontSetSort"); the X server and the other
        session processes live on, and a new openbox manages the windows left."""
        assert self.wm is not None
        exited = f"window manager exited with code {self.wm.returncode}"
        print(f"{exited}: starting it again", file=self.log, flush=True)
        error: Exception | None = None
        for attempt in range(WM_STARTS):
            time.sleep(0.5 * 2**attempt)
            try:
                self._start_wm(10)
                return None
            except (OSError, SessionError) as e:  # no pid free yet, or it died again
                print(f"window manager start {attempt + 1} of {WM_STARTS} failed: {e}", file=self.log, flush=True)
                error = e
        self.wm_failure = f"{exited} and did not start again ({error})"
        return self.wm_failure

    def _openbox_config(self) -> str:
        """The Debian default rc.xml with one rule: every window opens maximised and focused."""
        with open("/etc/xdg/openbox/rc.xml", encoding="utf-8") as f:
            text = f.read()
        rule = ('<applications><application class="*"><decor>yes</decor><focus>yes</focus>'
                "<maximized>true</maximized></application></applications>")
        text = re.sub(r"<applications>.*</applications>", rule, text, flags=re.DOTALL)
        path = os.path.join(self.run_dir, "rc.xml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path

    def dead(self) -> str | None:
        """Why the desktop is unusable (the X server, the window manager or an AT-SPI daemon
        exited), or None if it is fine. A window manager that aborted is started again: openbox
        does at the pids limit (see `_restart_wm`), a fork storm the agent made and the desktop
        survives; one that exits otherwise (killed, crashed) has failed, and so has the desktop."""
        if self.xvfb is None or self.wm is None:
            return "desktop not started"
        self._reap_orphans()
        if self.wm.poll() is not None:
            # a window manager dies *because* its X server did: give X's exit time to register
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.xvfb.wait(timeout=0.5)
        if self.xvfb.poll() is not None:
            return f"X server exited with code {self.xvfb.returncode}"
        if self.wm_failure is not None:
            return self.wm_failure
        for proc in self.support:  # without them the apps' trees are gone for good
            if proc.poll() is not None:
                return f"accessibility daemon {os.path.basename(proc.args[0])} exited with code {proc.returncode}"
        if self.wm.poll() is None:
            return None
        if self.wm.returncode != -signal.SIGABRT:
            return f"window manager exited with code {self.wm.returncode}"
        return self._restart_wm()

    def _reap_orphans(self) -> None:
        """Reap the exited processes this server adopted as subreaper (a fork storm's children
        whose parent exited): each holds its pid until then, and the pids limit counts them. Runs
        in `dead()`, under the server's lock: never while an `execute` waits for its own child."""
        try:  # before and after every request: when no child has exited, one syscall, no /proc scan
            if os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                return
        except ChildProcessError:  # no children at all
            return
        keep = {p.pid for p in (self.xvfb, self.wm, *self.support) if p is not None}
        for pid in zombie_children(os.getpid()) - keep:  # ours keep their exit codes for Popen
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)

    def reset(self) -> None:
        """Kill everything tasks started, empty the home, park the pointer; the screen is then blank."""
        keep = {p.pid for p in (self.xvfb, self.wm, *self.support) if p is not None}
        doomed = descendants(os.getpid()) - keep - descendants_of(keep)
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in doomed:  # reap: killed orphans were re-parented to us
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        self._wait(lambda: not self.windows(), 5, "windows to close")
        for entry in os.listdir(self.home):
            remove_path(os.path.join(self.home, entry))
        for entry in os.listdir(self.a11y_dir):
            os.remove(os.path.join(self.a11y_dir, entry))
        office.write_profile(self.office_profile)
        browser.write_profile(self.browser_profile, self.home)
        self._x(["xdotool", "mousemove", str(self.width - 1), str(self.height - 1)])

    # --- setup steps (OSWorld `config` entries) -------------------------------------------

    def launch(self, command: list[str], attempts: int = 3, window_timeout: float = 10.0) -> int:
        """Start an app (a name from `self.apps`, with arguments) or a command; wait for its window.

        An app whose window does not appear within `window_timeout` is killed and started
        again: under load (many desktops starting at once, docker CPU quotas) about one Tk
        start in four hangs in Tcl's notifier before its first window, and a fresh start works.
        """
        if not command or not all(isinstance(c, str) for c in command):
            raise SessionError(f"launch: command must be a non-empty list of strings, got {command!r}")
        argv = [*self.apps[command[0]], *command[1:]] if command[0] in self.apps else programs.command(
            browser.with_profile(office.with_profile(command, self.office_profile), self.browser_profile), self.home)
        if os.path.basename(command[0]) in programs.SLOW_STARTS:
            window_timeout = max(window_timeout, programs.SLOW_START_S)
        for _ in range(attempts):
            before = set(self.windows())
            try:
                proc = subprocess.Popen(argv, cwd=self.home, env=self.env, stdout=self.log, stderr=self.log,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
            except OSError as e:
                raise SessionError(f"launch {command[0]!r}: {e}") from e
            try:
                self._wait(lambda before=before, proc=proc: bool(set(self.windows()) - before)
                           or proc.poll() is not None, window_timeout, f"a window from {command[0]!r}")
            except SessionError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                continue
            if proc.poll() is not None:
                raise SessionError(f"launch {command[0]!r}: exited with code {proc.returncode}")
            if (doc := office.document(argv)) is not None:
                # GTK 3 LibreOffice shows a window titled after itself first and renames it after
                # the document once loaded; wait for that (not fatal: a dialog may come first)
                name = os.path.basename(doc)
                with contextlib.suppress(SessionError):
                    self._wait(lambda name=name, proc=proc: proc.poll() is not None or any(
                        t.startswith(name) for t in self.windows().values()), window_timeout, f"{name!r}")
            if argv[0] == "soffice":
                # until the pointer moves over its drawn window, GTK 3 LibreOffice gives its own
                # (non-GTK) widgets' accessible boxes as if its menu bar were not there: 25 px too high
                self.settle(OFFICE_DRAWN_S, 0.5)
                self._x(["xdotool", "mousemove_relative", "--", "-1", "-1", "mousemove_relative", "1", "1"])
            return proc.pid
        raise SessionError(f"launch {command[0]!r}: no window after {attempts} starts of {window_timeout:g} s")

    def open(self, path: str) -> int:
        """Open a file or folder in its app: folders in files, spreadsheets in calc, documents in
        writer, presentations in impress, web pages in the browser, images in GIMP, audio and
        video in VLC, the rest in textedit."""
        full = self.path(path)
        app = "files" if os.path.isdir(full) else _OPENERS.get(os.path.splitext(full)[1], "textedit")
        return self.launch([app, full])

    def execute(self, command: list[str] | str, shell: bool = False, timeout: float = 20) -> dict:
        """Run a command to completion in the home; returns returncode, stdout, stderr."""
        try:
            done = subprocess.run(command, shell=shell, cwd=self.home, env=self.env, capture_output=True,
                                  text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SessionError(f"execute {command!r}: {e}") from e
        return {"returncode": done.returncode, "stdout": done.stdout[-10000:], "stderr": done.stderr[-10000:]}

    def write_file(self, path: str, content: bytes) -> None:
        """Create a file (and its folders) in the desktop's file system."""
        full = self.path(path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(content)

    def activate(self, window_name: str, strict: bool = False) -> None:
        """Raise and focus the first window whose title contains (or, strict, equals) the name."""
        for wid, title in self.windows().items():
            if (title == window_name) if strict else (window_name in title):
                self._x(["xdotool", "windowactivate", "--sync", wid])
                return
        raise SessionError(f"activate_window: no window titled {window_name!r}")

    def close(self, window_name: str) -> None:
        """Ask the first window whose title contains the name to close."""
        for wid, title in self.windows().items():
            if window_name in title:
                self._x(["xdotool", "windowclose", wid])
                return
        raise SessionError(f"close_window: no window titled {window_name!r}")

    def settle(self, timeout: float, still_s: float = 0.1) -> tuple[bool, float]:
        """Wait until the screen has been still and the apps idle for `still_s` (see
        Framebuffer.settle)."""
        return self.fb.settle(timeout, stable_polls=max(1, round(still_s / 0.05)), cpu_s=self.cpu_seconds)

    def cpu_seconds(self) -> float:
        """CPU time used so far by every process below the server (from /proc/PID/schedstat,
        in nanoseconds: /proc/PID/stat's 10 ms ticks miss short bursts)."""
        total = 0
        for pid in descendants(os.getpid()):
            try:
                with open(f"/proc/{pid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except (OSError, IndexError, ValueError):
                continue  # it exited meanwhile
        return total / 1e9

    # --- queries (evaluation getters and the accessibility tree) ---------------------------

    def path(self, path: str) -> str:
        """A task path ('~/x' or absolute) as a path in this file system."""
        if path == "~" or path.startswith("~/"):
            return os.path.join(self.home, path[2:])
        return path

    def windows(self) -> dict[str, str]:
        """Managed windows in stacking order (bottom first): window id → title."""
        out = self._x(["xprop", "-root", "_NET_CLIENT_LIST_STACKING"])
        ids = re.findall(r"0x[0-9a-f]+", out.split("#", 1)[1]) if "#" in out else []
        return {wid: self._title(wid) for wid in ids}

    def active(self) -> str | None:
        """The id of the focused window, or None."""
        m = re.search(r"window id # (0x[0-9a-f]+)", self._x(["xprop", "-root", "_NET_ACTIVE_WINDOW"]))
        return None if m is None or int(m.group(1), 16) == 0 else m.group(1)

    def geometry(self, wid: str) -> tuple[int, int, int, int]:
        """(x, y, width, height) of a window on screen."""
        out = self._x(["xwininfo", "-id", wid])
        get = [int(re.search(rf"{k}:\s+(-?\d+)", out).group(1))  # type: ignore[union-attr]
               for k in ("Absolute upper-left X", "Absolute upper-left Y", "Width", "Height")]
        return get[0], get[1], get[2], get[3]

    def app_trees(self, timeout: float = 1.0) -> dict[str, dict]:
        """Each Tk app's widget tree keyed by its window title; a hung app maps to {"hung": True}."""
        trees: dict[str, dict] = {}
        for entry in sorted(os.listdir(self.a11y_dir)):
            path = os.path.join(self.a11y_dir, entry)
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.settimeout(timeout)
            try:
                conn.connect(path)
                data = b""
                while chunk := conn.recv(65536):
                    data += chunk
                doc = json.loads(data)
                trees[doc["title"]] = doc
            except (ConnectionRefusedError, FileNotFoundError):
                os.remove(path)  # the app is gone
            except (OSError, ValueError):
                trees[f"pid:{entry.split('.')[0]}"] = {"hung": True, "pid": int(entry.split(".")[0])}
            finally:
                conn.close()
        return trees

    # --- helpers ---------------------------------------------------------------------------

    def _title(self, wid: str) -> str:
        out = self._x(["xprop", "-id", wid, "_NET_WM_NAME", "WM_NAME"])
        m = re.search(r'= "(.*)"', out)
        if m is None:
            return ""
        try:  # UTF-8 bytes that came through as Latin-1 characters
            return m.group(1).encode("latin-1").decode("utf-8")
        except UnicodeError:  # already text (Firefox's "Page — Mozilla Firefox")
            return m.group(1)

    def _x(self, cmd: list[str]) -> str:
        done = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=10)
        return done.stdout

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise SessionError(f"timed out after {timeout:g} s waiting for {what}")
            time.sleep(0.05)
