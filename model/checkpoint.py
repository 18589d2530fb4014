"""Checkpoints: weights + config + tokenizer reference (+ whatever training adds), atomically.

A write goes to a temporary file in the same directory, is fsynced, then renamed over the target,
so a reader (or a restart after kill -9) sees either the old file or the new one, never half.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch
from torch import nn

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


def _umask() -> int:
    """The process umask, read without changing it where Linux allows (os.umask can only be
    read by setting it, which races with other threads creating files)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> Path:
    """Write a file atomically: `write(f)` fills a temporary file in the same directory, which
    is fsynced and renamed over `path`. Readers see the old file or the new one, never half;
    a failure leaves no temporary behind.

    The file gets the mode `open()` would give it: an existing file's mode is kept, a new file
    gets 0666 minus the umask (mkstemp alone makes 0600, unreadable to a shared group)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> Path:
    return atomic_write(path, lambda f: torch.save(obj, f))


def save_checkpoint(path: str | os.PathLike, model: nn.Module, *, tokenizer: Any = None,
                    extra: dict[str, Any] | None = None) -> Path:
    """Write model weights, its config and a tokenizer reference (a path or a dict)."""
    m = getattr(model, "module", model)  # unwrap DDP
    payload = {"format": FORMAT, "config": m.cfg.to_dict(), "model": m.state_dict(),
               "tokenizer": tokenizer, "extra": extra or {}}
    return atomic_torch_save(payload, path)


def read_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # torch raises several types for truncated or foreign files
        raise CheckpointError(f"checkpoint {path} is corrupt or unreadable: "
                              f"{type(e).__name__}: {str(e).splitlines()[0][:200]}") from e
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} is not a {FORMAT} file")
    return payload


def load_checkpoint(path: str | os.PathLike, *, model: nn.Module | None = None,
                    map_location: str | torch.device = "cpu") -> LoadedCheckpoint:
    """Load a checkpoint; build the model from its config unless `model` is given.

    With `model`, its config must equal the stored one (else CheckpointError naming the fields).
    """
    from . import build_model

    payload = read_checkpoint(path, map_location)
    try:
        cfg = ModelConfig.from_dict(payload["config"])
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"checkpoint {path} has an invalid config: {e}") from e
    if model is None:
        model = build_model(cfg).to(map_location)
    else:
        m = getattr(model, "module", model)
        if m.cfg != cfg:
            diff = {k: (v, getattr(m.cfg, k)) for k, v in cfg.to_dict().items()
                    if getattr(m.cfg, k) != v}
            raise CheckpointError(f"checkpoint {path} does not match the model: "
                                  + ", ".join(f"{k}: file={a!r} model={b!r}"
                                              for k, (a, b) in diff.items()))
    m = getattr(model, "module", model)
    try:
        m.load_state_dict(payload["model"])
    except RuntimeError as e:
        raise CheckpointError(f"checkpoint {path}: weights do not fit the model: "
                              f"{str(e).splitlines()[0][:300]}") from e
    return LoadedCheckpoint(model=model, config=cfg, tokenizer=payload.get("tokenizer"),
                            extra=payload.get("extra") or {})
