"""What sweeps/ needs from experiments/, in one place (sweeps -> experiments.train config/plan).

The contract used: `experiments.train.config.compose(overrides) -> TrainConfig` (raises
ConfigError(ValueError)), `experiments.train.plan.run_id/run_dir/plan`, and the CLI
`python -m experiments.train <overrides>` (SIGTERM or SIGUSR1: write a checkpoint and exit;
re-running resumes from the newest complete checkpoint, or returns at once when the run is
finished). The results root is `paths.results` or FTBENCH_RESULTS (default results/).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from common import paths
from experiments.train import plan as P
from experiments.train.config import TrainConfig, model_config
from experiments.train.config import compose as compose_config

from .grid import Cell, SweepError

TRAIN_MODULE = "experiments.train"
EVAL_MODULE = "experiments.eval"
DONE_FILE = f"{paths.CHECKPOINTS}/{paths.FINAL_CHECKPOINT}"
"""A run is finished when its final checkpoint exists (docs/RESULTS.md)."""
IGNORED_PREFIXES = ("paths.",)
"""Bookkeeping the shared-settings guard does not compare (where files go, not what trains)."""


def compose(cell: Cell) -> TrainConfig:
    try:
        return compose_config(list(cell.overrides))
    except ValueError as e:  # ConfigError is a ValueError
        msg = " ".join(str(e).split())
        raise SweepError(f"{cell.name}: {msg}") from e


def to_dict(cfg: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return P.plain(dataclasses.asdict(cfg))
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def run_id(cfg: TrainConfig) -> str:
    return P.run_id(cfg)


def run_dir(cfg: TrainConfig) -> Path:
    return P.run_dir(cfg)


def flops_per_token(cfg: TrainConfig) -> float:
    from model import train_flops_per_token

    return train_flops_per_token(model_config(cfg.model), cfg.train.seq_len).total


def planned(cfg: TrainConfig) -> tuple[float, float]:
    """(training tokens, training FLOPs) of a run, with FLOPs budgets and compute matching
    resolved by the trainer's own plan (the numbers the run will log)."""
    try:
        p = P.plan(cfg)
    except ValueError as e:  # the trainer would fail the same way: refuse before submitting
        raise SweepError(f"experiments.train.plan.plan() rejects this config: "
                         f"{' '.join(str(e).split())}") from e
    return float(p.tokens), float(p.flops)


JOB_ONLY_OVERRIDES = ("logging.progress=false",)
"""Added to a job's command line only: no progress bar in log files (not part of the run-id)."""


def train_argv(cell: Cell) -> list[str]:
    return [sys.executable, "-m", TRAIN_MODULE, *cell.overrides, *JOB_ONLY_OVERRIDES]


def eval_argv(run: Path, extra: Sequence[str] = ()) -> list[str]:
    return [sys.executable, "-m", EVAL_MODULE, str(run), *extra]


def is_done(run: Path) -> bool:
    return (run / DONE_FILE).exists()


def latest_step(run: Path) -> int | None:
    return paths.latest_step(run / "checkpoints")


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
