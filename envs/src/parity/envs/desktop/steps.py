"""Running a task's setup step on the desktop, including OSWorld's pyautogui scripts.

OSWorld's tasks drive the GUI from `execute` steps such as
`["python", "-c", "import pyautogui; pyautogui.hotkey('ctrl', 's'); time.sleep(0.5)"]`
(mostly in an evaluator's `postconfig`, to save the file before it is read). The desktop has
no pyautogui and never runs model- or task-written Python: such a script is read statement
by statement with the action parser (`actions`, the same whitelist as agents' actions) and
performed as actions. Every other step goes to the guest as it is (`command` as `execute`).
"""

from __future__ import annotations

import ast
import shlex

from .actions import ActionParseError, parse
from .client import DesktopClient, DesktopRequestError


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
