"""Where runs write: the results root, run directories and checkpoint names (docs/RESULTS.md)."""

from __future__ import annotations

import os
import re
import tempfile
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


def unwritable(d: str | os.PathLike) -> str | None:
    """Why directory `d` cannot be written (or created), in a few words; None when it can. The
    probe is a real temporary file in its deepest existing ancestor (os.access says yes to root
    even on a read-only mount); nothing stays behind. For the entry points' early checks."""
    p = Path(d).absolute()
    probe = p
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is a file"
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as e:
        return f"{probe} is not writable ({e.strerror})"
    return None


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
