"""OSWorld's metrics on applications' settings and the system's: the browser (its URL,
bookmarks), VS Code's extensions, GNOME (favourite apps, text scaling, time zone), the
clipboard, Thunderbird (prefs.js, message filters) and GIMP (its config file).

A metric is `func(result, expected_or_rules, **options) -> float`; a missing or unreadable
file scores 0. Nothing a task names is executed: `check_gnome_favorite_apps` reads a Python
list literal with `ast.literal_eval`.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from itertools import product
from typing import Any

from .metrics import _match_value, _read, _text
from .metrics_general import _matches


def is_expected_url_pattern_match(result: Any, rules: dict) -> float:
    """Every regex in rules["expected"] is found in the URL (or a dict's "url")."""
    url = result.get("url") if isinstance(result, dict) else result
    return float(isinstance(url, str) and bool(url) and all(re.search(p, url) for p in rules["expected"]))


def is_extension_installed(actual: Any, rules: dict) -> float:
    """rules["expected"] is (type "contain") or is not ("not_contain") in the result, e.g. the
    output of `code --list-extensions`."""
    if rules["type"] not in ("contain", "not_contain") or actual is None:
        return 0.0
    return float((rules["expected"] in actual) == (rules["type"] == "contain"))


def is_in_vm_clickboard(config: Any, clipboard: Any) -> float:
    """The clipboard text holds config["expected"] (one string, or each of a list)."""
    want = config["expected"]
    return float(isinstance(clipboard, str) and all(w in clipboard for w in (want if isinstance(want, list) else [want])))


def is_utc_0(timedatectl_output: Any) -> float:
    """`timedatectl`'s "Time zone" line says +0000."""
    lines = [line for line in str(timedatectl_output).splitlines() if "Time zone" in line]
    return float(bool(lines) and lines[0].strip().endswith("+0000)"))


def check_text_enlarged(scaling_factor: Any) -> float:
    """The text scaling factor (e.g. from gsettings) is above 1."""
    try:
        return float(float(str(scaling_factor).strip()) > 1.0)
    except ValueError:
        return 0.0


def check_gnome_favorite_apps(apps: Any, rule: dict) -> float:
    """The favourite apps (gsettings' list literal) are exactly rule["expected"], in any order."""
    try:
        listed = ast.literal_eval(str(apps).strip())
    except (ValueError, SyntaxError):
        return 0.0
    return float(isinstance(listed, list) and len(listed) == len(rule["expected"])
                 and set(listed) == set(rule["expected"]))


def is_expected_bookmarks(bookmarks: Any, rule: dict) -> float:
    """Chrome's bookmark roots (`bookmarks` getter) against rule type
    bookmark_bar_folders_names (the bar's folders are `names`), bookmark_bar_websites_urls
    (the bar's links are `urls`) or liked_authors_websites_urls (the bar's folder "Liked
    Authors" holds one of each entry of `urls`, an entry being a URL or a list of choices)."""
    if not isinstance(bookmarks, dict) or "bookmark_bar" not in bookmarks:
        return 0.0
    bar = bookmarks["bookmark_bar"].get("children", [])
    if rule["type"] == "bookmark_bar_folders_names":
        return float({b["name"] for b in bar if b.get("type") == "folder"} == set(rule["names"]))
    if rule["type"] == "bookmark_bar_websites_urls":
        return float({b["url"] for b in bar if b.get("type") == "url"} == set(rule["urls"]))
    if rule["type"] == "liked_authors_websites_urls":
        folder = next((b for b in bar if b.get("type") == "folder" and b.get("name") == "Liked Authors"), None)
        if folder is None:
            return 0.0
        urls = {b["url"] for b in folder.get("children", []) if b.get("type") == "url"}
        choices = [[u] if isinstance(u, str) else u for u in rule["urls"]]
        return float(any(set(combo) == urls for combo in product(*choices)))
    raise ValueError(f"is_expected_bookmarks: unknown rule type {rule['type']!r}")


# --- application settings files -------------------------------------------------------------

_PREF = re.compile(r'^user_pref\("(?P<key>(?:[^"\\]|\\.)+)",\s*(?P<val>.+)\);$')


def check_thunderbird_prefs(result: Any, rule: dict) -> float:
    """Thunderbird's prefs.js: every rules["expect"] pref is set and its value passes its
    value rule; no rules["unexpect"] pref's value passes its rule."""
    lines = _read(lambda p: _text(p).splitlines(), result)
    if lines is None:
        return 0.0
    prefs = {}
    for line in lines:
        m = _PREF.match(line.strip())
        if m:
            try:
                prefs[m["key"]] = json.loads(m["val"])
            except json.JSONDecodeError:
                continue
    expect, unexpect = rule.get("expect", {}), rule.get("unexpect", {})
    return float(all(k in prefs and _match_value(prefs[k], r) for k, r in expect.items())
                 and not any(k in prefs and _match_value(prefs[k], r) for k, r in unexpect.items()))


_CONDITION = re.compile(r"\b(?:AND|OR) \([\w ]+,[\w ']+,(?:\"(?:[^\"]|\\\")+\"|[^)]+)\)|\bALL\b")


def _filters(text: str) -> list[dict[str, Any]]:
    """Thunderbird's msgFilterRules.dat as a list of filters: name, enabled, type, action,
    actionValue (the last action's) and condition (a list of "AND (field,op,value)" terms)."""
    filters: list[dict[str, Any]] = []
    for line in text.splitlines():
        key, _, raw = line.partition("=")
        if not raw.startswith('"') or not raw.endswith('"'):
            continue
        value = raw[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        if key == "name":
            filters.append({"name": value})
        elif filters and key in ("enabled", "type", "action", "actionValue"):
            filters[-1][key] = value
        elif filters and key == "condition":
            filters[-1]["condition"] = _CONDITION.findall(value)
    return filters


def check_thunderbird_filter(result: Any, rules: dict) -> float:
    """Every rules["expect"] record equals (on its keys) some filter; no rules["unexpect"]
    record equals any."""
    filters = _read(lambda p: _filters(_text(p)), result)
    if filters is None:
        return 0.0
    return float(all(any(_matches(r, f) for f in filters) for r in rules.get("expect", []))
                 and not any(_matches(r, f) for r in rules.get("unexpect", []) for f in filters))


def check_config_status(config_file: Any, rule: dict) -> float:
    """A line of GIMP's config file, `(key ... value)`, has rule["key"] first (or, for a
    two-item key, those two first) and rule["value"] last."""
    lines = _read(lambda p: _text(p).splitlines(), config_file)
    if lines is None:
        return 0.0
    key = rule["key"] if isinstance(rule["key"], list) else [rule["key"]]
    for line in lines:
        if line.startswith("#") or not line.strip():
            continue
        items = line.strip().lstrip("(").rstrip(")").split()
        if len(items) > len(key) and items[:len(key)] == key and items[-1] == rule["value"]:
            return 1.0
    return 0.0


METRICS: dict[str, Callable[..., float]] = {
    f.__name__: f for f in (is_expected_url_pattern_match, is_extension_installed, is_in_vm_clickboard,
                            is_utc_0, check_text_enlarged, check_gnome_favorite_apps, is_expected_bookmarks,
                            check_thunderbird_prefs, check_thunderbird_filter, check_config_status)
}
