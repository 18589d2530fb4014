"""Where runs write: the results root, run directories and checkpoint names (docs/RESULTS.md).

Checkpoint file names are spelled here only: step_<N>.pt (rotated), eval_step_<N>.pt (kept for
evaluation) and final.pt (the run is finished), all under <run>/checkpoints/. An eval file of
checkpoint step N under spec_id S matches <run>/eval/*.S.stepN.json (`point_evaluated`)."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

CHECKPOINTS = "checkpoints"
"""A run directory's checkpoint folder."""
FINAL_CHECKPOINT = "final.pt"
"""The last step's checkpoint; its presence marks a run finished."""
_STEP = re.compile(r"step_(\d+)\.pt")
_EVAL_STEP = re.compile(r"eval_step_(\d+)\.pt")


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


def checkpoint_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / CHECKPOINTS


def final_checkpoint(run_dir: str | os.PathLike) -> Path:
    """<run_dir>/checkpoints/final.pt (it may not exist)."""
    return checkpoint_dir(run_dir) / FINAL_CHECKPOINT


def checkpoint_name(step: int) -> str:
    """A rotated checkpoint's file name."""
    return f"step_{step}.pt"


def eval_checkpoint_name(step: int) -> str:
    """A checkpoint kept for evaluation outside the rotation (logging.keep_eval_checkpoints)."""
    return f"eval_{checkpoint_name(step)}"


def _numbered(ckdir: str | os.PathLike, pattern: re.Pattern[str]) -> list[tuple[int, Path]]:
    ckdir = Path(ckdir)
    if not ckdir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckdir.iterdir() if (m := pattern.fullmatch(p.name))]
    return sorted(found)


def step_checkpoints(ckdir: str | os.PathLike) -> list[tuple[int, Path]]:
    """`step_<N>.pt` files in `ckdir`, oldest first (other names, temporaries included, ignored)."""
    return _numbered(ckdir, _STEP)


def eval_checkpoints(ckdir: str | os.PathLike) -> list[tuple[int, Path]]:
    """`eval_step_<N>.pt` files in `ckdir`, oldest first."""
    return _numbered(ckdir, _EVAL_STEP)


def latest_step(ckdir: str | os.PathLike) -> int | None:
    found = step_checkpoints(ckdir)
    return found[-1][0] if found else None


def point_evaluated(run_dir: str | os.PathLike, step: int, spec_ids: Sequence[str]) -> bool:
    """Step `step` of the run has an eval file (`eval/*.<spec_id>.step<N>.json`) for every
    spec_id."""
    ev = Path(run_dir) / "eval"
    return all(any(ev.glob(f"*.{sid}.step{step}.json")) for sid in spec_ids)


def points_ready(run_dir: str | os.PathLike, spec_ids: Sequence[str]) -> list[tuple[int, Path]]:
    """Kept checkpoints (`eval_step_<N>.pt`, written atomically: present means complete) without
    their eval files while the run trains (no final.pt), oldest first: what a point job may
    evaluate now. Once final.pt exists the rest are the chained evaluation's (the last kept
    checkpoint is final.pt's step, whose file the final evaluation writes)."""
    if final_checkpoint(run_dir).exists():
        return []
    return [(step, ck) for step, ck in eval_checkpoints(checkpoint_dir(run_dir))
            if not point_evaluated(run_dir, step, spec_ids)]
