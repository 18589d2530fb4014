"""Checkpoints: weights + config + tokenizer reference (+ whatever training adds), written
atomically (docs/RESULTS.md, "checkpoints/"). `load_checkpoint` reads, without
torch.distributed, a weights-only export (`save_weights`) and a training step's marker (its
weights read from the sibling torch.distributed.checkpoint shards).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from common.io import atomic_write

from .build import build_model
from .config import ModelConfig

FORMAT = "ftbench-checkpoint-v1"


class CheckpointError(ValueError):
    """A checkpoint that is missing, corrupt, or does not match what the caller expects."""


@dataclass
class LoadedCheckpoint:
    model: nn.Module
    config: ModelConfig
    tokenizer: Any
    extra: dict[str, Any]


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> Path:
    return atomic_write(path, lambda f: torch.save(obj, f))


def save_checkpoint(path: str | os.PathLike, model: nn.Module, *, tokenizer: Any = None,
                    extra: dict[str, Any] | None = None,
                    state_dict: dict[str, Any] | None = None) -> Path:
    """Write model weights, its config and a tokenizer reference (a path or a dict).
    `state_dict`: weights gathered elsewhere (FSDP's full state) instead of model.state_dict()."""
    m = getattr(model, "module", model)  # unwrap DDP
    payload = {"format": FORMAT, "config": m.cfg.to_dict(),
               "model": m.state_dict() if state_dict is None else state_dict,
               "tokenizer": tokenizer, "extra": extra or {}}
    return atomic_torch_save(payload, path)


def save_weights(path: str | os.PathLike, model: nn.Module, *, tokenizer: Any = None,
                 extra: dict[str, Any] | None = None,
                 state_dict: dict[str, Any] | None = None,
                 dtype: torch.dtype | None = None) -> Path:
    """A weights-only checkpoint (no optimizer state): what evaluation and HF export read.
    `dtype`: cast floating-point weights (e.g. torch.bfloat16) to halve the file; loading
    casts them back to the model's dtype."""
    m = getattr(model, "module", model)
    sd = m.state_dict() if state_dict is None else state_dict
    if dtype is not None:  # one cast per storage: tied weights stay one tensor in the file
        cast: dict[tuple[int, int, tuple[int, ...]], torch.Tensor] = {}
        out = {}
        for k, v in sd.items():
            if v.is_floating_point():
                key = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape))
                out[k] = cast.setdefault(key, v.detach().to(dtype))
            else:
                out[k] = v
        sd = out
    return save_checkpoint(path, model, tokenizer=tokenizer,
                           extra={**(extra or {}), "weights_only": True,
                                  "weights_dtype": weights_dtype(sd)},
                           state_dict=sd)


DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
               torch.float64: "fp64"}


def weights_dtype(sd: dict[str, Any]) -> str | None:
    """The dtype the floating-point weights of `sd` are stored in ("bf16", "fp32", ...; several
    joined by "+"; None where there are none): what an export records as `weights_dtype`."""
    names = sorted({DTYPE_NAMES.get(v.dtype, str(v.dtype).removeprefix("torch."))
                    for v in sd.values() if torch.is_tensor(v) and v.is_floating_point()})
    return "+".join(names) if names else None


def sharded_weights(path: str | os.PathLike, payload: dict[str, Any],
                    template: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The weights of a step marker's DCP directory, read into `template` (a model's state
    dict): DCP reads only these keys, never the optimizer state. No process group needed."""
    import torch.distributed.checkpoint as dcp

    d = Path(path).parent / payload["dcp"]
    if not (d / ".metadata").is_file():
        raise CheckpointError(f"checkpoint {path}: its shard directory {d} is missing or "
                              "incomplete")
    sd = {"model": {k: v.detach().clone() for k, v in template.items()}}
    try:
        dcp.load(sd, checkpoint_id=str(d), process_group=None, no_dist=True)
    except Exception as e:  # DCP wraps missing keys and corrupt shards in several types
        raise CheckpointError(f"checkpoint {path}: shards in {d} unreadable: "
                              f"{type(e).__name__}: {str(e).splitlines()[0][:200]}") from e
    return sd["model"]


def read_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu",
                    mmap: bool = False) -> dict:
    """A checkpoint's payload (`mmap`: memory-mapped, tensors read from disk only when used)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as e:  # torch raises several types for truncated or foreign files
        raise CheckpointError(f"checkpoint {path} is corrupt or unreadable: "
                              f"{type(e).__name__}: {str(e).splitlines()[0][:200]}") from e
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} is not a {FORMAT} file")
    return payload


def _config(path: str | os.PathLike, payload: dict) -> ModelConfig:
    try:
        return ModelConfig.from_dict(payload["config"])
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"checkpoint {path} has an invalid config: {e}") from e


def load_checkpoint(path: str | os.PathLike, *,
                    map_location: str | torch.device = "cpu") -> LoadedCheckpoint:
    """Load a checkpoint into the model its config builds (its init drawn, as before: callers'
    later draws from the global generator stay where they were; evaluation: `load_weights`)."""
    payload = read_checkpoint(path, map_location)
    cfg = _config(path, payload)
    model = build_model(cfg).to(map_location)
    weights = payload.get("model")
    if weights is None and "dcp" in payload:  # a training step's marker: weights from shards
        weights = sharded_weights(path, payload, model.state_dict())
    if weights is None:
        raise CheckpointError(f"checkpoint {path} holds no weights")
    try:
        model.load_state_dict(weights)
    except RuntimeError as e:
        raise CheckpointError(f"checkpoint {path}: weights do not fit the model: "
                              f"{str(e).splitlines()[0][:300]}") from e
    return LoadedCheckpoint(model=model, config=cfg, tokenizer=payload.get("tokenizer"),
                            extra=payload.get("extra") or {})


def load_weights(path: str | os.PathLike, device: str | torch.device = "cpu") -> LoadedCheckpoint:
    """The model of a checkpoint, for evaluation and export: its weights only. The file is
    memory-mapped (optimizer moments and RNG state are never read) and the model is built on
    the meta device taking the file's tensors as parameters (no init, no second copy); `extra`
    keeps only plain values. The one door evaluation loads through."""
    payload = read_checkpoint(path, "cpu", mmap=True)
    cfg = _config(path, payload)
    sd = payload.get("model")
    if sd is None and "dcp" in payload:  # a training step's marker: its weights are in the shards
        sd = sharded_weights(path, payload, build_model(cfg).state_dict())  # DCP fills a template
    if not isinstance(sd, dict):
        raise CheckpointError(f"checkpoint {path} has no model weights")
    # a bf16 export (save_weights(dtype=bf16)) is loaded into the float32 model evaluation builds
    sd = {k: v.float() if torch.is_tensor(v) and v.dtype in (torch.bfloat16, torch.float16) else v
          for k, v in sd.items()}
    with torch.device("meta"):
        model = build_model(cfg)
    try:
        model.load_state_dict(sd, assign=True)
    except RuntimeError as e:
        raise CheckpointError(f"checkpoint {path}: weights do not fit the model: "
                              f"{str(e).splitlines()[0][:300]}") from e
    if cfg.tie_embeddings:  # assign replaces each name's parameter: tie them again
        model.output.weight = model.tok_emb.weight
    _rebuild_buffers(model, cfg)
    model = model.to(device)
    extra = payload.get("extra") or {}
    plain = {k: v for k, v in extra.items()
             if isinstance(v, (int, float, str, bool)) or v is None}
    return LoadedCheckpoint(model=model, config=cfg, tokenizer=payload.get("tokenizer"),
                            extra=plain)


def _rebuild_buffers(model: nn.Module, cfg: ModelConfig) -> None:
    """Non-persistent buffers (not in the file) are still on the meta device after a meta
    build: compute them as the constructor does."""
    from .layers import rope_table

    left = [n for n, b in model.named_buffers() if b.is_meta]
    if not left:
        return
    if set(left) != {"rope_cos", "rope_sin"}:
        raise CheckpointError(f"cannot rebuild buffers {left} of a meta-built model")
    cos, sin = rope_table(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
    model.register_buffer("rope_cos", cos, persistent=False)
    model.register_buffer("rope_sin", sin, persistent=False)
