"""OSWorld's getters for applications' own files: the browser's profile (Chrome's
`Preferences` and `Bookmarks` JSON), GIMP's and VLC's settings, VS Code's, media inside a
presentation, the default video player, and files left in the episode's cache.

OSWorld's tasks run Google Chrome; the desktop's stand-in is Chromium (`steps.LAUNCH_ALIASES`),
whose profile has the same files: they are read from `~/.config/chromium/Default/`, else from
`~/.config/google-chrome/Default/`. Values a setting has when it was never written are
OSWorld's ("false", "Google", None).
"""

from __future__ import annotations

import json
import os
import posixpath
import zipfile
from collections import Counter
from collections.abc import Callable
from typing import Any
from xml.etree import ElementTree as ET

from .getters import EvalContext, vm_command_line, vm_file
from .steps import run_step

CHROME_PROFILES = ("~/.config/chromium/Default", "~/.config/google-chrome/Default")
_R = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}"
_REL = "{http://schemas.openxmlformats.org/package/2006/relationships}"


def _chrome_json(ctx: EvalContext, name: str) -> dict:
    """A JSON file of the browser's profile ({} if there is none or it is not JSON)."""
    for profile in CHROME_PROFILES:
        f = ctx.client.file(f"{profile}/{name}")
        if f["exists"] and not f["is_dir"]:
            try:
                data = json.loads(f["content"] or "")
            except json.JSONDecodeError:
                return {}
            return data if isinstance(data, dict) else {}
    return {}


def enable_do_not_track(ctx: EvalContext, g: dict) -> str:
    """"true" if the browser sends Do Not Track, else "false"."""
    return "true" if _chrome_json(ctx, "Preferences").get("enable_do_not_track") else "false"


def enable_enhanced_safety_browsing(ctx: EvalContext, g: dict) -> str:
    """"true" if Safe Browsing's enhanced protection is on, else "false"."""
    return "true" if _chrome_json(ctx, "Preferences").get("safebrowsing", {}).get("enhanced") else "false"


def data_delete_automacally(ctx: EvalContext, g: dict) -> str:  # OSWorld's spelling
    """"true" if the profile has default content settings (where "delete site data on exit" is
    kept), else "false"."""
    return "true" if "default_content_setting_values" in _chrome_json(ctx, "Preferences").get("profile", {}) \
        else "false"


def default_search_engine(ctx: EvalContext, g: dict) -> str:
    """The default search engine's short name ("Google" if none was chosen)."""
    prefs = _chrome_json(ctx, "Preferences")
    return prefs.get("default_search_provider_data", {}).get("template_url_data", {}).get("short_name", "Google")


def profile_name(ctx: EvalContext, g: dict) -> str | None:
    """The browser profile's name."""
    return _chrome_json(ctx, "Preferences").get("profile", {}).get("name")


def find_unpacked_extension_path(ctx: EvalContext, g: dict) -> list[str]:
    """The folders of every installed extension."""
    settings = _chrome_json(ctx, "Preferences").get("extensions", {}).get("settings", {})
    return [e["path"] for e in settings.values() if isinstance(e, dict) and "path" in e]


def bookmarks(ctx: EvalContext, g: dict) -> dict:
    """The bookmark roots ({"bookmark_bar": {"children": [...]}, "other": ..., ...})."""
    return _chrome_json(ctx, "Bookmarks").get("roots", {})


def cache_file(ctx: EvalContext, g: dict) -> str | None:
    """A file an earlier getter of this evaluation left in the cache, by its `path` there."""
    local = ctx.cache_dir / g["path"]
    return str(local) if local.resolve().is_relative_to(ctx.cache_dir.resolve()) and local.is_file() else None


def gimp_config_file(ctx: EvalContext, g: dict) -> str | None:
    """GIMP 2.10's settings file `file_name` (gimprc, sessionrc...), copied as `dest`."""
    return vm_file(ctx, {"path": f"~/.config/GIMP/2.10/{g['file_name']}", "dest": g["dest"]})


def vlc_config(ctx: EvalContext, g: dict) -> str | None:
    """VLC's settings file (vlcrc), copied as `dest`."""
    return vm_file(ctx, {"path": "~/.config/vlc/vlcrc", "dest": g["dest"]})


def vscode_config(ctx: EvalContext, g: dict) -> str | None:
    """Runs `vscode_extension_command` from VS Code's command palette (Ctrl+Shift+P, typed,
    Enter), then copies `path` as `dest` (the command writes that file)."""
    script = (f"import pyautogui, time; pyautogui.hotkey('ctrl', 'shift', 'p'); "
              f"pyautogui.typewrite({g['vscode_extension_command']!r}); pyautogui.press('enter'); "
              f"time.sleep(1)")
    run_step(ctx.client, {"type": "execute", "parameters": {"command": ["python3", "-c", script]}},
             ctx.width, ctx.height)
    return vm_file(ctx, {"path": g["path"], "dest": g["dest"]})


def default_video_player(ctx: EvalContext, g: dict) -> str:
    """The desktop file most video types open with (`xdg-mime query default`), or "unknown"."""
    kinds = ("mp4", "x-matroska", "webm", "x-msvideo", "quicktime", "mpeg", "ogg", "x-flv", "3gpp", "x-ms-wmv")
    found = Counter()
    for kind in kinds:
        app = vm_command_line(ctx, {"command": ["xdg-mime", "query", "default", f"video/{kind}"]}).strip()
        if app:
            found[app] += 1
    return found.most_common(1)[0][0] if found else "unknown"


def _slide_media(ctx: EvalContext, g: dict, pick: Callable[[ET.Element, ET.Element], str | None]) -> str | None:
    """Copies the presentation `ppt_file_path` out, finds the media of slide `slide_index`
    (from 0) that `pick` names by relationship id, and returns it as a local file `dest`:
    extracted from the .pptx if embedded, else copied from the desktop (a `file://` link)."""
    local = vm_file(ctx, {"path": g["ppt_file_path"], "dest": posixpath.basename(g["ppt_file_path"])})
    if local is None:
        return None
    n = int(g["slide_index"]) + 1
    try:
        with zipfile.ZipFile(local) as z:
            slide = ET.fromstring(z.read(f"ppt/slides/slide{n}.xml"))
            rels = ET.fromstring(z.read(f"ppt/slides/_rels/slide{n}.xml.rels"))
            target = pick(slide, rels)
            if target is None:
                return None
            if target.startswith("file://"):
                return vm_file(ctx, {"path": target[7:], "dest": g["dest"]})
            data = z.read(posixpath.normpath(posixpath.join("ppt/slides", target)))
    except (KeyError, zipfile.BadZipFile, ET.ParseError, OSError):
        return None
    out = ctx.cache_dir / os.path.basename(g["dest"])
    out.write_bytes(data)
    return str(out)


def audio_in_slide(ctx: EvalContext, g: dict) -> str | None:
    """The first audio file linked from or embedded in slide `slide_index` of `ppt_file_path`."""
    def pick(slide: ET.Element, rels: ET.Element) -> str | None:
        return next((r.get("Target") for r in rels.iter(f"{_REL}Relationship") if "audio" in r.get("Type", "")), None)

    return _slide_media(ctx, g, pick)


def background_image_in_slide(ctx: EvalContext, g: dict) -> str | None:
    """The picture that fills the background of slide `slide_index` of `ppt_file_path`."""
    def pick(slide: ET.Element, rels: ET.Element) -> str | None:
        blips = [b.get(f"{_R}embed") for bg in slide.iter("{http://schemas.openxmlformats.org/presentationml/2006/main}bgPr")
                 for b in bg.iter("{http://schemas.openxmlformats.org/drawingml/2006/main}blip")]
        return next((r.get("Target") for r in rels.iter(f"{_REL}Relationship")
                     if blips and r.get("Id") == blips[0] and "image" in r.get("Type", "")), None)

    return _slide_media(ctx, g, pick)


GETTERS: dict[str, Callable[[EvalContext, dict], Any]] = {
    f.__name__: f for f in (enable_do_not_track, enable_enhanced_safety_browsing, data_delete_automacally,
                            default_search_engine, profile_name, find_unpacked_extension_path, bookmarks,
                            cache_file, gimp_config_file, vlc_config, vscode_config, default_video_player,
                            audio_in_slide, background_image_in_slide)
}
