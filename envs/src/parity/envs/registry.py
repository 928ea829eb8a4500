"""Registering environments with gymnasium under `parity/...` ids, with a one-line description.

    register_env("parity/MyTask-v0", "my_pkg.my_env:MyEnv", "What the task is, in one line.")
    env = make_env("parity/MyTask-v0", difficulty=2)   # gymnasium.make; kwargs go to MyEnv
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

_DESCRIPTIONS: dict[str, str] = {}


class UnknownEnvError(ValueError):
    """No environment is registered under this id."""


class EnvImportError(ValueError):
    """The module of a "module:parity/Name-vN" id does not import (bad input: the message is
    one line naming the module, where it was looked for and the original error)."""


def register_env(env_id: str, entry_point: str, description: str, **kwargs: Any) -> None:
    """Register `entry_point` ("module:Class") as `env_id` ("parity/Name-vN"); `kwargs` are
    default constructor arguments. Registering the same id again replaces it."""
    if not env_id.startswith("parity/"):
        raise ValueError(f"env id {env_id!r} must start with 'parity/'")
    if "\n" in description or not description.strip():
        raise ValueError(f"{env_id}: description must be one non-empty line")
    if env_id in gym.registry:
        del gym.registry[env_id]
    gym.register(id=env_id, entry_point=entry_point, kwargs=kwargs)
    _DESCRIPTIONS[env_id] = description


def list_envs() -> list[dict[str, str]]:
    """Every registered `parity/...` env: [{"id", "description", "entry_point"}], by id.

    Envs registered with plain `gymnasium.register` are described by the first line of
    their class docstring."""
    return [
        {"id": env_id, "description": _DESCRIPTIONS.get(env_id) or _docstring(env_id),
         "entry_point": str(gym.registry[env_id].entry_point)}
        for env_id in sorted(gym.registry) if env_id.startswith("parity/")
    ]


def _docstring(env_id: str) -> str:
    entry = gym.registry[env_id].entry_point
    try:
        cls = load_env_creator(entry) if isinstance(entry, str) else entry
    except Exception as e:  # an env whose module does not import is still listed
        return f"(cannot import {entry}: {type(e).__name__})"
    return ((cls.__doc__ or "").strip().splitlines() or [""])[0]


def make_env(env_id: str, **kwargs: Any) -> gym.Env:
    """`gymnasium.make(env_id, **kwargs)`, wrappers and all (the runner steps through
    them; the env itself, with `areset`/`astep`, is `.unwrapped`), with a clear error for an
    unknown id. "my_pkg.envs:parity/X-v0" imports `my_pkg.envs` first (where it registers
    itself), as gymnasium.make does, and from the working directory too."""
    return gym.make(_registered(env_id), **kwargs)


def env_class(env_id: str) -> Any:
    """What `make_env(env_id)` constructs, unwrapped (its entry point), without making one."""
    entry = gym.registry[_registered(env_id)].entry_point
    return load_env_creator(entry) if isinstance(entry, str) else entry


def registered_kwargs(env_id: str) -> dict[str, Any]:
    """The constructor arguments `env_id` was registered with (`make_env`'s own override
    them)."""
    return dict(gym.registry[_registered(env_id)].kwargs)


def _registered(env_id: str) -> str:
    """The registry id of `env_id`, its module imported first; a clear error if unknown."""
    if ":" in env_id:
        module, env_id = env_id.split(":", 1)
        _import_env_module(module, f"{module}:{env_id}")
    if env_id not in gym.registry:
        known = ", ".join(e["id"] for e in list_envs())
        raise UnknownEnvError(f"unknown environment {env_id!r}; registered: {known}")
    return env_id


def _import_env_module(module: str, env_id: str) -> None:
    """Import `module` from the working directory too, as `python -m` would find it (the
    `parity` console script has its own bin directory on sys.path, not the working one);
    EnvImportError, one line, if it does not import."""
    cwd = os.getcwd()
    # Appended for good, not just for this import: a namespace package's __path__ (a
    # `my_envs/` without `__init__.py`) and the env's own later imports are resolved against
    # sys.path again; at the end, the working directory never shadows an installed package.
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    try:
        importlib.import_module(module)
    except Exception as e:  # not found, a syntax error, whatever the module raised
        said = " ".join(f"{type(e).__name__}: {e}".split())
        raise EnvImportError(f"cannot import module {module!r} for env {env_id!r} (searched the "
                             f"working directory {cwd} and sys.path): {said}") from e
