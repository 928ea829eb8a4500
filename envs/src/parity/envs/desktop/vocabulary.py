"""Every getter and metric a task may name, by name: OSWorld's and parity's own, gathered from
the modules that implement them (the loader refuses a name that is not here)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import (
    getters,
    getters_apps,
    metrics,
    metrics_apps,
    metrics_docs,
    metrics_general,
    metrics_images,
    metrics_slides,
    metrics_vlc,
)
from .getters import EvalContext

GETTERS: dict[str, Callable[[EvalContext, dict], Any]] = {**getters.GETTERS, **getters_apps.GETTERS}
METRICS: dict[str, Callable[..., float]] = {
    **metrics.METRICS, **metrics_apps.METRICS, **metrics_docs.METRICS, **metrics_general.METRICS, **metrics_images.METRICS,
    **metrics_slides.METRICS, **metrics_vlc.METRICS}
