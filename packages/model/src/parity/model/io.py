"""Hugging Face safetensors directories in and out (sharded too).

A directory holds `config.json` and either `model.safetensors` or shards listed by
`model.safetensors.index.json`. Checkpoints move freely between parity, transformers and
vLLM. Every mismatch is an error naming the file and the tensor.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from parity.model.config import ModelConfig
from parity.model.decoder import Decoder
from parity.model.kernels import KernelMode

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


class WeightsError(ValueError):
    """The safetensors files do not match config.json."""


def _read_tensors(directory: Path) -> dict[str, tuple[torch.Tensor, Path]]:
    index = directory / INDEX
    if index.is_file():
        try:
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, AttributeError) as e:
            raise WeightsError(f"{index}: malformed index ({e})") from None
    elif (directory / SINGLE).is_file():
        files = [SINGLE]
    else:
        found = sorted(p.name for p in directory.glob("*.safetensors"))
        if not found:
            raise WeightsError(f"{directory}: no {SINGLE}, {INDEX} or *.safetensors files")
        files = found
    tensors: dict[str, tuple[torch.Tensor, Path]] = {}
    for name in files:
        path = directory / name
        if not path.is_file():
            raise WeightsError(f"{index}: lists {name}, which does not exist")
        try:
            loaded = load_file(str(path))
        except (SafetensorError, OSError) as e:
            raise WeightsError(f"{path}: cannot read safetensors ({e})") from None
        for key, t in loaded.items():
            tensors[key] = (t, path)
    return tensors


def load_model(
    directory: str | Path, kernels: KernelMode | str = "aligned", dtype: torch.dtype = torch.float32
) -> Decoder:
    """Build the decoder described by `directory/config.json` and load its weights."""
    directory = Path(directory)
    cfg = ModelConfig.from_pretrained(directory)
    model = Decoder(cfg, kernels)
    tensors = _read_tensors(directory)
    if cfg.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise WeightsError(f"{directory}: missing tensors: {', '.join(missing[:8])}"
                           + (f" (+{len(missing) - 8} more)" if len(missing) > 8 else ""))
    extra = sorted(k for k in set(tensors) - set(expected) if not k.endswith("rotary_emb.inv_freq"))
    if extra:
        raise WeightsError(f"{tensors[extra[0]][1]}: unexpected tensors: {', '.join(extra[:8])}")
    state = {}
    for key, ref in expected.items():
        t, path = tensors[key]
        if tuple(t.shape) != tuple(ref.shape):
            raise WeightsError(
                f"{path}: tensor {key} has shape {tuple(t.shape)}, config.json implies {tuple(ref.shape)}"
            )
        if not t.is_floating_point():
            raise WeightsError(f"{path}: tensor {key} has dtype {t.dtype}, expected floating point")
        state[key] = t.to(dtype)
    model.load_state_dict(state)
    return model.to(dtype)


def save_model(model: Decoder, directory: str | Path, max_shard_bytes: int = 2**31) -> None:
    """Write config.json and safetensors (sharded above `max_shard_bytes`) atomically."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key in sorted(state):
        nbytes = state[key].numel() * state[key].element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = state[key]
        size += nbytes
    meta = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], str(tmp / SINGLE), metadata=meta)
    else:
        weight_map = {}
        for i, shard in enumerate(shards):
            name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(tmp / name), metadata=meta)
            weight_map.update(dict.fromkeys(shard, name))
        total = sum(t.numel() * t.element_size() for t in state.values())
        (tmp / INDEX).write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
        )
    model.config.save(tmp)
    _replace_dir(tmp, directory)


def _replace_dir(tmp: Path, directory: Path) -> None:
    """Swap a finished temp dir into place; a crash leaves the old one or the new one whole."""
    if directory.exists():
        old = directory.with_name(f".{directory.name}.old")
        if old.exists():
            _rmtree(old)
        os.replace(directory, old)
        os.replace(tmp, directory)
        _rmtree(old)
    else:
        os.replace(tmp, directory)


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
