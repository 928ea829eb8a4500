"""OSWorld-shaped computer-use tasks on a real Xvfb desktop in a sandbox.

Importing this package registers `parity/Desktop-v0` (gymnasium dict observations:
screenshot and/or accessibility tree) and `parity/DesktopText-v0` (the same tasks as a
token-in-token-out chat over the accessibility tree); nothing starts until `reset()`.
"""

from __future__ import annotations

from parity.envs.registry import register_env

register_env("parity/Desktop-v0", "parity.envs.desktop.env:DesktopEnv",
             "Computer use on a real X desktop in a sandbox: OSWorld-style tasks, screenshot and/or a11y tree.")
register_env("parity/DesktopText-v0", "parity.envs.desktop.chat:DesktopTextEnv",
             "The desktop tasks as a token-in-token-out chat over the accessibility tree.")
