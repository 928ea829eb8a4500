"""Typed configuration: TOML files validated by pydantic, with `a.b=c` overrides.

Unknown keys and wrong types are errors that name the key (`train.lr: Input should be a
valid number`), never silently ignored; an unknown key also names the known key it resembles
(`optim.lrr: unknown key; did you mean optim.lr?`).
"""

from __future__ import annotations

import difflib
import json
import tomllib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

T = TypeVar("T", bound=BaseModel)


class StrictModel(BaseModel):
    """Base for every config section: unknown keys are refused."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ConfigError(ValueError):
    """A config file or override is malformed; the message names the file and the key."""


def parse_override(item: str) -> tuple[list[str], Any]:
    """`"train.lr=3e-4"` -> (["train", "lr"], 3e-4). Values are parsed as TOML, else kept as strings."""
    if "=" not in item:
        raise ConfigError(f"override {item!r}: expected key=value, e.g. train.lr=3e-4")
    key, raw = item.split("=", 1)
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise ConfigError(f"override {item!r}: empty key")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return path, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        path, value = parse_override(item)
        node = data
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {part} is not a section")
            node = child
        node[path[-1]] = value
    return data


def _known_keys(model: type[BaseModel], section: tuple[int | str, ...]) -> list[str]:
    """The keys the section at `section` of `model` accepts; [] where that is not a model."""
    for part in section:
        field = model.model_fields.get(str(part))
        sub = field.annotation if field else None
        if not (isinstance(sub, type) and issubclass(sub, BaseModel)):
            return []
        model = sub
    return list(model.model_fields)


def _did_you_mean(model: type[BaseModel] | None, loc: tuple[int | str, ...]) -> str:
    """'; did you mean a.b?' naming the known key of the same section closest to loc's."""
    close = difflib.get_close_matches(str(loc[-1]), _known_keys(model, loc[:-1]), n=1) if model else []
    return f"; did you mean {'.'.join([*map(str, loc[:-1]), close[0]])}?" if close else ""


def format_validation_error(err: ValidationError, source: str,
                            model: type[BaseModel] | None = None) -> str:
    """One line per bad key; an unknown key of `model` names the known key it most resembles."""
    lines = [f"{source}: invalid config"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            msg = "unknown key" + _did_you_mean(model, e["loc"])
        elif e["type"] == "value_error":
            msg = str(e["ctx"]["error"])  # our own message, without pydantic's "Value error, "
        else:
            msg = e["msg"]
        # A check across sections has no location; its message names the fields itself.
        lines.append(f"  {key}: {msg}" if key else f"  {msg}")
    return "\n".join(lines)


def load_config(
    model: type[T], path: str | Path | None = None, overrides: list[str] | None = None,
    base: dict[str, Any] | None = None,
) -> T:
    """Load `path` (TOML) on top of `base`, apply `overrides`, validate into `model`."""
    data: dict[str, Any] = json.loads(json.dumps(base or {}))
    source = "<defaults>"
    if path is not None:
        p = Path(path)
        source = str(p)
        if not p.is_file():
            raise ConfigError(f"{p}: config file not found")
        try:
            file_data = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p}: not valid TOML: {e}") from None
        _deep_merge(data, file_data)
    apply_overrides(data, overrides or [])
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, source, model)) from None


def _deep_merge(dst: dict[str, Any], src: dict[str, Any]) -> None:
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _deep_merge(dst[k], v)
        else:
            dst[k] = v


def dump_toml(data: dict[str, Any]) -> str:
    """Write a nested dict of plain values as TOML (for the resolved config in a run dir)."""
    out: list[str] = []

    def scalar(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list | tuple):
            return "[" + ", ".join(scalar(x) for x in v) + "]"
        raise TypeError(f"cannot write {type(v).__name__} as TOML")

    def section(prefix: str, d: dict[str, Any]) -> None:
        plain = {k: v for k, v in d.items() if not isinstance(v, dict) and v is not None}
        subs = {k: v for k, v in d.items() if isinstance(v, dict)}
        if prefix and plain:
            out.append(f"[{prefix}]")
        for k, v in plain.items():
            out.append(f"{k} = {scalar(v)}")
        if plain:
            out.append("")
        for k, v in subs.items():
            section(f"{prefix}.{k}" if prefix else k, v)

    section("", data)
    return "\n".join(out)
