"""LibreOffice in the desktop: its command lines and a user profile without first-run dialogs.

The profile lives outside the home (in the run folder) and is written afresh at every reset,
so every episode starts LibreOffice the same way. Its settings: no first-run wizard or tip of
the day, no "keep current format?" question when saving .xlsx/.docx, no auto-recovery dialog
after a killed instance, no Calc auto-completion (it would change typed cell text), and no
Writer autocorrect while typing (capitals, quotes, URL and bullet recognition), so what an
agent types is what the file holds.
"""

from __future__ import annotations

import os
import shutil

_SETTINGS = (
    ("/org.openoffice.Office.Common/Misc", "FirstRun", "false"),
    ("/org.openoffice.Office.Common/Misc", "ShowTipOfTheDay", "false"),
    ("/org.openoffice.Office.Common/Save/Document", "WarnAlienFormat", "false"),
    ("/org.openoffice.Office.Recovery/AutoSave", "Enabled", "false"),
    ("/org.openoffice.Office.Recovery/RecoveryInfo", "Enabled", "false"),
    ("/org.openoffice.Office.Calc/Input", "AutoInput", "false"),
    ("/org.openoffice.Office.Writer/AutoFunction/Format/Option", "TypingFormatting", "false"),
    ("/org.openoffice.Office.Common/AutoCorrect", "CapitalAtStartSentence", "false"),
    ("/org.openoffice.Office.Common/AutoCorrect", "ChangeUnderlineWeight", "false"),
    ("/org.openoffice.Office.Common/AutoCorrect", "SetInetAttribute", "false"),
    ("/org.openoffice.Office.Common/AutoCorrect", "CorrectCapsLock", "false"),
    ("/org.openoffice.Office.Common/AutoCorrect", "TwoCapitalsAtStart", "false"),
    ("/org.openoffice.Office.Common/AutoCorrect", "ReplaceDashes", "false"),
    ("/org.openoffice.Office.Common/AutoCorrect", "UseReplacementTable", "false"),
    ("/org.openoffice.Office.Common/AutoCorrect/DoubleQuoteAtStart", "ReplaceDoubleQuote", "false"),
    ("/org.openoffice.Office.Common/AutoCorrect/SingleQuoteAtStart", "ReplaceSingleQuote", "false"),
)

VCL_PLUGIN = "gtk3"
"""LibreOffice's toolkit plugin, chosen rather than guessed from the desktop it detects: GTK 3
(Debian's libreoffice-gtk3) exports its widgets over AT-SPI; "gen" (plain X11) has no tree."""

APP_MODULES = {"calc": "--calc", "writer": "--writer", "impress": "--impress"}
"""App names for `launch` → soffice's module switch."""


def command(app: str, profile: str) -> list[str]:
    """soffice's command line for `app` ("calc", "writer", "impress") with this profile."""
    return with_profile(["soffice", APP_MODULES[app]], profile)


def with_profile(argv: list[str], profile: str) -> list[str]:
    """A `libreoffice`/`soffice` command line (as OSWorld's tasks launch it) with this profile
    and no restore or splash; other command lines as they are."""
    if not argv or argv[0] not in ("libreoffice", "soffice"):
        return argv
    return ["soffice", *argv[1:], "--norestore", "--nologo", "--nolockcheck", f"-env:UserInstallation=file://{profile}"]


def document(argv: list[str]) -> str | None:
    """The file an soffice command line (as `with_profile` writes it) opens, or None."""
    if not argv or argv[0] != "soffice":
        return None
    files = [a for a in argv[1:] if not a.startswith("-")]
    return files[-1] if files else None


def env() -> dict[str, str]:
    """What LibreOffice needs in its environment: its toolkit plugin (if libreoffice-gtk3 is
    missing, LibreOffice falls back to "gen" by itself and the desktop has no tree of it)."""
    return {"SAL_USE_VCLPLUGIN": VCL_PLUGIN}


def write_profile(profile: str) -> None:
    """(Re)create the user profile folder holding only the settings above."""
    shutil.rmtree(profile, ignore_errors=True)
    os.makedirs(os.path.join(profile, "user"))
    items = "".join(f'<item oor:path="{path}"><prop oor:name="{name}" oor:op="fuse"><value>{value}</value>'
                    "</prop></item>\n" for path, name, value in _SETTINGS)
    with open(os.path.join(profile, "user", "registrymodifications.xcu"), "w", encoding="utf-8") as f:
        f.write('<?xml version="1.0" encoding="UTF-8"?>\n<oor:items xmlns:oor="http://openoffice.org/2001/registry" '
                'xmlns:xs="http://www.w3.org/2001/XMLSchema" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">\n'
                f"{items}</oor:items>\n")
