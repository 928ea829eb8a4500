"""OSWorld's metrics on VLC's settings file (`vlcrc`, from the `vlc_config` getter).

vlcrc holds `key=value` lines; a setting left at its default is written commented out
(`#key=value`) or not at all, so a key without an active line has VLC's default value, given
per metric below as OSWorld gives it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .metrics import _read, _text


def _vlcrc(path: Any) -> dict[str, str] | None:
    """The active settings of a vlcrc (None if it cannot be read)."""
    lines = _read(lambda p: _text(p).splitlines(), path)
    if lines is None:
        return None
    pairs = (line.split("=", 1) for line in lines if "=" in line and not line.lstrip().startswith(("#", "[")))
    return {k.strip(): v.strip() for k, v in pairs}


def _setting_is(key: str, default: str, rule_key: str) -> Callable[[Any, dict], float]:
    """A metric: vlcrc's `key` (default `default`) equals rule[`rule_key`] (a number is compared
    as its text)."""
    def metric(config: Any, rule: dict) -> float:
        settings = _vlcrc(config)
        return float(settings is not None and settings.get(key, default) == str(rule[rule_key]))

    metric.__doc__ = f"vlcrc's {key} (default {default}) is rule[{rule_key!r}]."
    return metric


def check_global_key_play_pause(config: Any, rule: dict) -> float:
    """A global play/pause hotkey is set ("1") or not ("0"), as rule["expected_global_key_play_pause"]."""
    settings = _vlcrc(config)
    if settings is None:
        return 0.0
    return float(("1" if settings.get("global-key-play-pause") else "0") == str(rule["expected_global_key_play_pause"]))


def check_qt_slider_colours(config: Any, rule: dict) -> float:
    """The volume slider's colours (`qt-slider-colours`, 12 numbers: four RGB colours) equal
    rule["expected_qt_slider_colours"] (type "match") or are all blackish, each channel under
    100 (type "blackish")."""
    settings = _vlcrc(config)
    if settings is None:
        return 0.0
    colours = settings.get("qt-slider-colours", "153;210;153;20;210;20;255;199;15;245;39;29")
    if rule["type"] == "match":
        return float(colours == rule["expected_qt_slider_colours"])
    try:
        values = [int(v) for v in colours.split(";")]
    except ValueError:
        return 0.0
    return float(rule["type"] == "blackish" and all(v < 100 for v in values))


METRICS: dict[str, Callable[..., float]] = {
    "check_qt_bgcone": _setting_is("qt-bgcone", "1", "expected_qt_bgcone"),
    "check_qt_max_volume": _setting_is("qt-max-volume", "125", "expected_qt_max_volume"),
    "check_qt_minimal_view": _setting_is("qt-minimal-view", "0", "expected_qt_minimal_view"),
    "check_one_instance_when_started_from_file": _setting_is(
        "one-instance-when-started-from-file", "1", "expected_one_instance_when_started_from_file"),
    "is_vlc_recordings_folder": _setting_is("input-record-path", "", "recording_file_path"),
    "check_global_key_play_pause": check_global_key_play_pause,
    "check_qt_slider_colours": check_qt_slider_colours,
}
