"""Checking and applying a versioned weight update: all of it, or none of it."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from parity.model import Decoder


class WeightUpdateError(ValueError):
    """The update does not fit the model; the engine kept its previous weights."""


def check_update(model: Decoder, state: Mapping[str, torch.Tensor], version: object) -> None:
    """Refuse unknown or missing tensors, wrong shapes or dtypes, non-finite values."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise WeightUpdateError(f"version must be a non-negative int, got {version!r}")
    expected = model.state_dict()
    given = set(state)
    if model.config.tie_word_embeddings:
        given.discard("lm_head.weight")  # tied: lm_head is embed_tokens
    missing = sorted(set(expected) - given)
    extra = sorted(given - set(expected))
    if missing:
        raise WeightUpdateError(f"weight update is missing tensors: {', '.join(missing[:8])}")
    if extra:
        raise WeightUpdateError(f"weight update has unknown tensors: {', '.join(extra[:8])}")
    for key, ref in expected.items():
        t = state[key]
        if not isinstance(t, torch.Tensor):
            raise WeightUpdateError(f"weight update: {key} is a {type(t).__name__}, not a tensor")
        if tuple(t.shape) != tuple(ref.shape):
            raise WeightUpdateError(
                f"weight update: {key} has shape {tuple(t.shape)}, the model has {tuple(ref.shape)}"
            )
        if t.dtype != ref.dtype:
            raise WeightUpdateError(f"weight update: {key} has dtype {t.dtype}, the model has {ref.dtype}")
        if not bool(torch.isfinite(t).all()):
            raise WeightUpdateError(f"weight update: {key} has non-finite values")


def apply_update(model: Decoder, state: Mapping[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for key, param in model.state_dict().items():
            param.copy_(state[key])
