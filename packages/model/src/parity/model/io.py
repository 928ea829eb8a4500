"""Hugging Face safetensors directories in and out (sharded too).

A directory holds `config.json` and either `model.safetensors` or shards listed by
`model.safetensors.index.json`. Checkpoints move freely between parity, transformers and
vLLM. Every mismatch is an error naming the file and the tensor. `resolve_dtype` reads from a
directory the dtype a run computes in.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from parity.model.config import ModelConfig
from parity.model.decoder import Decoder
from parity.model.dtypes import DTYPES, DtypeError, checkpoint_dtype, dtype_name, require_dtype
from parity.model.kernels import KernelMode

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


class WeightsError(ValueError):
    """The safetensors files do not match config.json."""


def _weight_files(directory: Path) -> list[Path]:
    index = directory / INDEX
    if index.is_file():
        try:
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, AttributeError) as e:
            raise WeightsError(f"{index}: malformed index ({e})") from None
        for name in files:
            if not (directory / name).is_file():
                raise WeightsError(f"{index}: lists {name}, which does not exist")
        return [directory / name for name in files]
    if (directory / SINGLE).is_file():
        return [directory / SINGLE]
    found = sorted(directory.glob("*.safetensors"))
    if not found:
        raise WeightsError(f"{directory}: no {SINGLE}, {INDEX} or *.safetensors files")
    return found


def _read_tensors(directory: Path, header_only: bool = False) -> dict[str, tuple[Any, Path]]:
    """Every tensor of the directory's safetensors files (or, `header_only`, its shape and
    dtype as the file header states them, without reading the data), with its file."""
    tensors: dict[str, tuple[Any, Path]] = {}
    for path in _weight_files(directory):
        try:
            if header_only:
                with safe_open(str(path), "pt") as f:
                    loaded = {k: _Header(tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype())
                              for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
            else:
                loaded = load_file(str(path))
        except (SafetensorError, OSError) as e:
            raise WeightsError(f"{path}: cannot read safetensors ({e})") from None
        for key, t in loaded.items():
            tensors[key] = (t, path)
    return tensors


@dataclass(frozen=True)
class _Header:
    shape: tuple[int, ...]
    dtype: str

    def is_floating_point(self) -> bool:
        return self.dtype.startswith(("F", "BF"))


def _check_tensors(directory: Path, model: Decoder, tensors: dict[str, tuple[Any, Path]]) -> None:
    """WeightsError naming the file and tensor unless `tensors` fit the model exactly."""
    if model.config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise WeightsError(f"{directory}: missing tensors: {', '.join(missing[:8])}"
                           + (f" (+{len(missing) - 8} more)" if len(missing) > 8 else ""))
    extra = sorted(k for k in set(tensors) - set(expected) if not k.endswith("rotary_emb.inv_freq"))
    if extra:
        raise WeightsError(f"{tensors[extra[0]][1]}: unexpected tensors: {', '.join(extra[:8])}")
    for key, ref in expected.items():
        t, path = tensors[key]
        if tuple(t.shape) != tuple(ref.shape):
            raise WeightsError(
                f"{path}: tensor {key} has shape {tuple(t.shape)}, config.json implies {tuple(ref.shape)}"
            )
        if not t.is_floating_point():
            raise WeightsError(f"{path}: tensor {key} has dtype {t.dtype}, expected floating point")


def check_model_dir(directory: str | Path) -> ModelConfig:
    """What load_model would refuse, found from config.json and the files' headers alone
    (seconds for any size, no weights in memory): the config, or the error load_model gives."""
    directory = Path(directory)
    cfg = ModelConfig.from_pretrained(directory)
    _check_tensors(directory, _shapes(cfg), _read_tensors(directory, header_only=True))
    return cfg


def param_count(cfg: ModelConfig) -> int:
    """The decoder's parameters at `cfg`'s shapes (a tied head counted once)."""
    return sum(p.numel() for p in _shapes(cfg).parameters())


def _shapes(cfg: ModelConfig) -> Decoder:
    """The decoder with no storage (meta tensors): its parameters' names and shapes."""
    with torch.device("meta"):
        return Decoder(cfg, "standard")  # standard: no start-up proof for a shape check


def stored_dtypes(directory: str | Path) -> set[str]:
    """The safetensors dtypes ("F32", "BF16", ...) the directory's weights are stored in
    (read from the file headers)."""
    return {t.dtype for t, _ in _read_tensors(Path(directory), header_only=True).values()}


def resolve_dtype(setting: str, model_dir: str | Path, setting_name: str = "model.dtype") -> torch.dtype:
    """The dtype a run uses: `setting` ("auto": the checkpoint's torch_dtype). A setting that
    disagrees with the checkpoint is refused when honouring it would round the checkpoint's
    stored weights (bfloat16 asked of a float32 checkpoint stored in float32); the reverse
    (float32 from bfloat16) is exact. Raises DtypeError naming the setting."""
    if setting != "auto" and setting not in DTYPES:
        raise DtypeError(f"{setting_name} = {setting!r}: expected auto, float32 or bfloat16")
    source = f"{Path(model_dir) / 'config.json'}"
    declared = ModelConfig.from_pretrained(model_dir).declared_dtype
    if setting == "auto":
        want = checkpoint_dtype(declared, source)
    else:
        want = DTYPES[setting]
        if want == torch.bfloat16 and declared != "bfloat16":
            wide = sorted({d for d in stored_dtypes(model_dir) if d != "BF16"})
            if wide:
                raise DtypeError(
                    f"{setting_name} = 'bfloat16', but {source} declares torch_dtype "
                    f"{declared or 'float32'!r} and its weights are stored as {', '.join(wide)}: "
                    f"bfloat16 would round them. Set {setting_name} = 'auto' (or 'float32'), or "
                    f"write a bfloat16 copy with `parity model convert {model_dir} OUT --dtype bfloat16`")
    require_dtype(want, setting_name)
    return want


def load_model(
    directory: str | Path, kernels: KernelMode | str = "aligned",
    dtype: torch.dtype = torch.float32, master_weights: bool = False,
) -> Decoder:
    """Build the decoder described by `directory/config.json` and load its weights.

    `dtype` is what the model computes in (activations, KV cache, published weights); its
    parameters are held in `dtype`, or in float32 with `master_weights` (the learner: the
    optimizer steps fp32 masters, the forward uses their rounding to `dtype`)."""
    directory = Path(directory)
    cfg = ModelConfig.from_pretrained(directory)
    model = Decoder(cfg, kernels, dtype=dtype).to(torch.float32 if master_weights else dtype)
    tensors = _read_tensors(directory)
    _check_tensors(directory, model, tensors)
    # copied into the parameters' dtype (rounded to nearest even where it is narrower)
    model.load_state_dict({key: tensors[key][0] for key in model.state_dict()})
    return model


def save_model(model: Decoder, directory: str | Path, max_shard_bytes: int = 2**31) -> None:
    """Write config.json and safetensors (sharded above `max_shard_bytes`) atomically. The
    tensors are saved as the model holds them (a learner's fp32 masters stay fp32, so a
    resume is exact); config.json's torch_dtype is the dtype the model computes in."""
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
    model.config.save(tmp, torch_dtype=dtype_name(model.compute_dtype))
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
