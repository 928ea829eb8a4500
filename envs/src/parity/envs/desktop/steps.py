"""Running a task's setup step on the desktop, including OSWorld's pyautogui scripts.

OSWorld's tasks drive the GUI from `execute` steps such as
`["python", "-c", "import pyautogui; pyautogui.hotkey('ctrl', 's'); time.sleep(0.5)"]`
(mostly in an evaluator's `postconfig`, to save the file before it is read). The desktop has
no pyautogui and never runs model- or task-written Python: such a script is read statement
by statement with the action parser (`actions`, the same whitelist as agents' actions) and
performed as actions. Every other step goes to the guest as it is (`command` as `execute`).

OSWorld's tasks were written for an Ubuntu VM with Google Chrome and GNOME: `osworld_step`
names the Debian programs instead (`LAUNCH_ALIASES`: Chromium for Chrome, which takes the same
flags, PCManFM for Nautilus) and turns `chrome_open_tabs` into a launch of that browser with
the tabs' addresses (only local ones reach here: the loader refuses web addresses). A
`download` becomes one `write_file` per file shipped with the task (`setup_steps`).
"""

from __future__ import annotations

import ast
import base64
import os
import shlex
from pathlib import Path

from .actions import ActionParseError, parse
from .client import DesktopClient, DesktopRequestError
from .getters import shipped_file

LAUNCH_ALIASES = {"google-chrome": "chromium", "nautilus": "pcmanfm", "chrome": "chromium"}
"""OSWorld's program names (a path's basename) and the Debian program that stands in for each;
`chrome` appears as `pkill chrome`."""


def osworld_step(step: dict) -> dict:
    """One OSWorld setup step in the guest's vocabulary (unchanged if it already is)."""
    params = step.get("parameters", {})
    if step["type"] == "chrome_open_tabs":
        return {"type": "launch", "parameters": {"command": [LAUNCH_ALIASES["google-chrome"],
                                                             *params.get("urls_to_open", [])]}}
    if step["type"] == "launch" and isinstance(params.get("command"), list) and params["command"]:
        argv = list(params["command"])
        if os.path.basename(argv[0]) == "pkill":
            argv[1:] = [LAUNCH_ALIASES.get(a, a) for a in argv[1:]]
        argv[0] = LAUNCH_ALIASES.get(os.path.basename(argv[0]), argv[0])
        return {**step, "parameters": {**params, "command": argv}}
    return step


def setup_steps(steps: list[dict], files_dir: Path) -> list[dict]:
    """OSWorld setup steps as the guest runs them: each `download` as one `write_file` per
    shipped file (its bytes in base64), the others through `osworld_step`."""
    out = []
    for step in steps:
        if step["type"] == "download":
            for f in step["parameters"]["files"]:
                data = base64.b64encode(shipped_file(files_dir, f["url"], f["path"]).read_bytes()).decode()
                out.append({"type": "write_file", "parameters": {"path": f["path"], "content_base64": data}})
        else:
            out.append(osworld_step(step))
    return out


def pyautogui_script(step: dict) -> str | None:
    """The Python code of an `execute`/`command` step that runs a pyautogui script, else None."""
    if step.get("type") not in ("execute", "command"):
        return None
    command = step.get("parameters", {}).get("command")
    argv = shlex.split(command) if isinstance(command, str) else command
    if (isinstance(argv, list) and len(argv) == 3 and argv[0] in ("python", "python3") and argv[1] == "-c"
            and isinstance(argv[2], str) and "pyautogui" in argv[2]):
        return argv[2]
    return None


def run_step(client: DesktopClient, step: dict, width: int, height: int) -> None:
    """Run one guest setup step, or perform a pyautogui script's statements as actions;
    raises DesktopRequestError if the guest or the action parser refuses it."""
    code = pyautogui_script(step)
    if code is None:
        client.setup({**step, "type": "execute"} if step["type"] == "command" else step)
        return
    try:
        statements = [s for s in ast.parse(code).body if not isinstance(s, ast.Import)]
        actions = [parse(ast.unparse(s), width, height) for s in statements]
    except (SyntaxError, ActionParseError) as e:
        raise DesktopRequestError(f"pyautogui script {code[:80]!r}: {e}") from e
    for act in actions:
        ops = [{"op": "wait", "seconds": act.seconds}] if act.kind == "wait" else act.ops
        for op in ops:
            client.action(op)
