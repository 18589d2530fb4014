"""Where runs write: the results root, run directories and checkpoint names (docs/RESULTS.md)."""

from __future__ import annotations

import os
import re
from pathlib import Path

_STEP = re.compile(r"step_(\d+)\.pt")


def results_root(root: str | os.PathLike | None = None) -> Path:
    """The argument, else $FTBENCH_RESULTS, else ./results."""
    if root is not None and str(root) != "":
        return Path(root)
    return Path(os.environ.get("FTBENCH_RESULTS") or "results")


def runs_dir(root: str | os.PathLike | None = None) -> Path:
    return results_root(root) / "runs"


def sweeps_dir(root: str | os.PathLike | None = None) -> Path:
    return results_root(root) / "sweeps"


def cache_dir(root: str | os.PathLike | None = None) -> Path:
    """$FTBENCH_CACHE, else <results root>/cache (tokenizers, tokenized corpora)."""
    env = os.environ.get("FTBENCH_CACHE")
    return Path(env) if env else results_root(root) / "cache"


def checkpoint_name(step: int) -> str:
    return f"step_{step}.pt"


def step_checkpoints(ckdir: str | os.PathLike) -> list[tuple[int, Path]]:
    """`step_<N>.pt` files in `ckdir`, oldest first (other names, temporaries included, ignored)."""
    ckdir = Path(ckdir)
    if not ckdir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckdir.iterdir() if (m := _STEP.fullmatch(p.name))]
    return sorted(found)


def latest_step(ckdir: str | os.PathLike) -> int | None:
    found = step_checkpoints(ckdir)
    return found[-1][0] if found else None
