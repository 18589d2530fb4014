"""What sweeps/ needs from experiments/train.py, in one place (sweeps -> experiments only).

The contract used: `compose(overrides) -> TrainConfig` (raises ConfigError(ValueError)),
`run_id(cfg)`, `run_dir(cfg)`, and the CLI `python -m experiments.train <overrides>` (SIGTERM or
SIGUSR1: write a checkpoint and exit; re-running resumes from the newest complete checkpoint,
or returns at once when the run is finished). The results root is `paths.results` or
FTBENCH_RESULTS (default results/).
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from .grid import Cell, SweepError

TRAIN_MODULE = "experiments.train"
EVAL_MODULE = "experiments.eval"
DONE_FILE = "checkpoints/final.pt"
"""A run is finished when its final checkpoint exists (docs/RESULTS.md)."""
IGNORED_PREFIXES = ("paths.",)
"""Bookkeeping the shared-settings guard does not compare (where files go, not what trains)."""


def _train() -> Any:
    import importlib

    try:
        return importlib.import_module(TRAIN_MODULE)
    except ImportError as e:
        raise SweepError(f"cannot import {TRAIN_MODULE} ({e})") from e


def compose(cell: Cell) -> Any:
    try:
        return _train().compose(list(cell.overrides))
    except ValueError as e:  # ConfigError is a ValueError
        msg = " ".join(str(e).split())
        raise SweepError(f"{cell.name}: {msg}") from e


def to_dict(cfg: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return dataclasses.asdict(cfg)
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def run_id(cfg: Any) -> str:
    return str(_train().run_id(cfg))


def run_dir(cfg: Any) -> Path:
    return Path(_train().run_dir(cfg))


def flops_per_token(cfg: Any) -> float:
    from experiments.config import model_config
    from model import train_flops_per_token

    return train_flops_per_token(model_config(cfg.model), cfg.train.seq_len).total


def planned(cfg: Any) -> tuple[float, float]:
    """(training tokens, training FLOPs) of a run, with FLOPs budgets and compute matching
    resolved by train.py's own `plan()` (the numbers the run will log)."""
    t = _train()
    if hasattr(t, "plan"):
        try:
            p = t.plan(cfg)
        except ValueError as e:  # the trainer would fail the same way: refuse before submitting
            raise SweepError(f"{TRAIN_MODULE}.plan() rejects this config: "
                             f"{' '.join(str(e).split())}") from e
        return float(_get(p, "tokens")), float(_get(p, "flops"))
    tokens = float(cfg.train.tokens)  # a trainer without plan(): a plain token budget
    return tokens, tokens * flops_per_token(cfg)


def _get(obj: Any, key: str, *default: Any) -> Any:
    if isinstance(obj, dict):
        return obj.get(key, *default) if default else obj[key]
    return getattr(obj, key, *default)


JOB_ONLY_OVERRIDES = ("logging.progress=false",)
"""Added to a job's command line only: no progress bar in log files (not part of the run-id)."""


def train_argv(cell: Cell) -> list[str]:
    return [sys.executable, "-m", TRAIN_MODULE, *cell.overrides, *JOB_ONLY_OVERRIDES]


def eval_argv(run: Path, extra: Sequence[str] = ()) -> list[str]:
    return [sys.executable, "-m", EVAL_MODULE, str(run), *extra]


def is_done(run: Path) -> bool:
    return (run / DONE_FILE).exists()


def latest_step(run: Path) -> int | None:
    steps = [int(m.group(1)) for p in (run / "checkpoints").glob("step_*.pt")
             if (m := re.fullmatch(r"step_(\d+)\.pt", p.name))]
    return max(steps) if steps else None


def provenance(run: Path) -> dict[str, Any]:
    """The finished run's recorded provenance (data checksums, tokenizer, commit), if any."""
    p = run / "config.yaml"
    if not p.exists():
        return {}
    try:
        d = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError:
        return {}
    return d.get("provenance") or {}
