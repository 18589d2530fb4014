"""What sweeps/ needs from experiments/, in one place: no other module of sweeps/ imports
experiments (tests/test_sweep.py checks it).

The contract used: `experiments.train.config.compose(overrides) -> TrainConfig` (raises
UsageError, a ValueError), `experiments.train.plan.run_id/run_dir/plan` and its dry-run estimate,
`experiments.eval.run.validate_args/spec_id` (the chained evaluation's arguments and file
names), `experiments.eval.chain` (the chained evaluation itself), and the CLIs
`python -m experiments.train <overrides>` (SIGTERM or SIGUSR1: write a checkpoint and exit;
re-running resumes from the newest complete checkpoint, or returns at once when the run is
finished) and `python -m experiments.eval RUN <args>`. The results root is `paths.results` or
FTBENCH_RESULTS (default results/).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from common.arms import Cell
from common.errors import UsageError
from common.text import one_line
from experiments.corpus import budget as _corpus_budget
from experiments.eval import chain as _chain
from experiments.train import config as _config
from experiments.train import plan as P
from experiments.train.config import (  # noqa: F401 - gpu_peak_tflops: for sweeps.recipe
    GENERATED_SOURCES,
    TrainConfig,
    gpu_peak_tflops,
    model_config,
)
from experiments.train.config import compose as compose_config

# re-exported for the rest of sweeps/
parse_amount = _config.parse_amount
chain_argv = _chain.chain_argv
eval_chain = _chain.eval_chain
eval_point = _chain.eval_point
# what sweeps/recipe.py reads of the trainer: its vocabularies, compose from plain overrides,
# the plan
DataConfig = _config.DataConfig
HFSource = _config.HFSource
corpus_budget = _corpus_budget  # a corpus against its budget: per-source passes, known sizes
compose_overrides = compose_config
run_id = P.run_id
run_dir = P.run_dir
run_plan = P.plan
duration = P.duration
"""Seconds as a reader takes them in (s, min, h, days): the trainer's dry run's format."""


def memory_fit(cfg: TrainConfig) -> Any:
    """experiments.memory.fit of a cell's config at its planned world (fake tensors, cached
    under paths.cache/memory: minutes of CPU for 8B the first time, nothing after)."""
    from experiments.memory import fit

    return fit(cfg, cache=Path(cfg.paths.cache))


def check_eval_tasks(tasks: Sequence[str]) -> None:
    """Task names as experiments.eval checks them online (the suite's, or any stock lm-eval
    task): UsageError (one line) naming an unknown one."""
    from experiments.eval.run import check_tasks

    try:
        check_tasks(list(tasks), None)
    except ValueError as e:  # the eval parser's UsageError (a ValueError)
        raise UsageError(one_line(e)) from None


IGNORED_PREFIXES = ("paths.",)
"""Bookkeeping the shared-settings guard does not compare (where files go, not what trains)."""


def compose(cell: Cell) -> TrainConfig:
    """A cell's config (composed once per plan: sweeps.plan.PlannedCell.cfg keeps it)."""
    try:
        return compose_config(list(cell.overrides))
    except ValueError as e:  # UsageError is a ValueError
        raise UsageError(f"{cell.name}: {one_line(e)}") from e


def to_dict(cfg: TrainConfig) -> dict[str, Any]:
    return P.plain(dataclasses.asdict(cfg))


def flops_per_token(cfg: TrainConfig) -> float:
    from model import train_flops_per_token

    return train_flops_per_token(model_config(cfg.model), cfg.train.seq_len).total


def planned(cfg: TrainConfig) -> tuple[float, float]:
    """(training tokens, training FLOPs) of a run, with FLOPs budgets and compute matching
    resolved by the trainer's own plan (the numbers the run will log)."""
    try:
        p = P.plan(cfg)
    except ValueError as e:  # the trainer would fail the same way: refuse before submitting
        raise UsageError(f"experiments.train.plan.plan() rejects this config: "
                         f"{one_line(e)}") from e
    return float(p.tokens), float(p.flops)


JOB_ONLY_OVERRIDES = ("logging.progress=false",)
"""Added to a job's command line only: no progress bar in log files (not part of the run-id)."""


def train_argv(overrides: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "experiments.train", *overrides, *JOB_ONLY_OVERRIDES]


def eval_argv(run: Path, extra: Sequence[str] = ()) -> list[str]:
    return [sys.executable, "-m", "experiments.eval", str(run), *extra]


# ------------------------------------------------------------------------------- evaluation
def validate_eval_args(argv: Sequence[str]) -> argparse.Namespace:
    """EVAL_ARGS checked as experiments.eval will parse them (flags, values, task names,
    offline data): UsageError (one line) before anything trains."""
    from experiments.eval.run import validate_args

    try:
        return validate_args(list(argv))
    except UsageError as e:  # a bad flag or value, or offline data that fails its checksums
        raise UsageError(f"EVAL_ARGS: {one_line(e)}") from e


def limit_lines(tasks: Sequence[str], limit: int | None) -> list[str]:
    """What an evaluation's limit means for its grouped tasks (MMLU: per subject)."""
    from experiments.eval.run import limit_lines

    return limit_lines(tasks, limit)


def planned_eval_specs(args: argparse.Namespace, max_len: int | None) -> dict[str, dict[str, Any]]:
    """{suite: spec} experiments.eval will write for these (checked) arguments in a window of
    `max_len` tokens; UsageError (one line) when its offline data cannot be read."""
    from experiments.eval.run import planned_specs

    try:
        return planned_specs(args, max_len)
    except UsageError as e:
        raise UsageError(f"EVAL_ARGS: {one_line(e)}") from e


def fit_memory(cell: Callable[[str], TrainConfig], world: int, memory_gb: float) -> Any:
    """`experiments.memory.fit` of the config `cell(parallel)` (sweeps.recipe measure): FSDP when
    DDP's state alone (DDP_BYTES_PER_PARAM per parameter of the costliest arm) exceeds
    FIT_FRACTION of the GPU, else DDP; the micro-batch is then what the measured peaks fit.
    Not plan.auto_parallel, which also counts a hand estimate of the activations: here the
    activations are measured and shrink with the micro-batch, so only the state decides."""
    from experiments.memory import fit
    from experiments.train.parallel import DDP_BYTES_PER_PARAM, FIT_FRACTION

    params = P.plan(cell("ddp"), world).params["total"]
    par = "none" if world == 1 else (
        "fsdp" if DDP_BYTES_PER_PARAM * params > FIT_FRACTION * memory_gb * 1e9 else "ddp")
    cfg = cell(par)
    return fit(cfg, world=world, cache=Path(cfg.paths.cache))


def estimate_text(cfg: Any) -> str | None:
    """The trainer's dry-run memory / fit / GPU-time lines for `cfg`, None for a config that is
    not the trainer's (a stand-in trainer in tests)."""
    if not isinstance(cfg, TrainConfig):
        return None
    try:
        n, source = P.planning_world(cfg)  # the cluster's GPUs, not this process's
        rp = P.plan(cfg, n)
    except UsageError as e:
        raise UsageError(one_line(e)) from None
    return (f"world       {n} GPU(s), from {source}\n"
            + P.format_estimate(cfg, rp, P.dry_parallel(cfg, rp)))


def gpu_rate(cfg: Any) -> tuple[float, int, str, str] | None:
    """(sustained FLOP/s per GPU = MFU x train.gpu_peak_tflops, the planning world, where that
    world comes from, where the MFU comes from: given, measured by make gpu-check or assumed,
    `plan.planned_mfu`) for `cfg`; None for a config that is not the trainer's."""
    if not isinstance(cfg, TrainConfig):
        return None
    n, source = P.planning_world(cfg)
    mfu, mfu_source = P.planned_mfu(cfg)
    return mfu * cfg.train.gpu_peak_tflops * 1e12, n, source, mfu_source


def local_rate(cfg: Any, threads: int) -> tuple[float, str] | None:
    """Training tokens/s of one local job of `cfg` on this machine, and where the figure comes
    from: on a CPU host the trainer's own dry-run measurement (experiments.train.plan: a few
    steps of the model, or train.cpu_tokens_per_s), run with the job's `threads`; on a GPU
    host the planned MFU of the costliest-cell line. None for a config that is not the
    trainer's, or a model too large to time here."""
    if not isinstance(cfg, TrainConfig):
        return None
    import torch

    if torch.cuda.is_available():
        flops_s, n, _, src = gpu_rate(cfg)
        return flops_s * n / flops_per_token(cfg), f"planned: MFU {src}"
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return P.cpu_throughput(cfg, P.plan(cfg, 1), n=2)  # the trainer's measurement, not a copy
    finally:
        torch.set_num_threads(before)


def batch_refusal(cfg: TrainConfig, world: int) -> str | None:
    """Why `cfg`'s global batch does not split over `world` ranks (the trainer's one line, with
    the nearest valid batch and world sizes), None when it does."""
    try:
        P.plan(cfg, world)
    except UsageError as e:
        return one_line(e)
    return None


def run_disk(cfg: TrainConfig, gpus: bool) -> int:
    """Bytes one run of `cfg` writes under the results root at most on GPUs (`gpus`) or CPUs
    (plan.disk_bytes' run part: the trainer's own dry run says the same)."""
    return P.disk_bytes(cfg, P.plan(cfg, 1), "cuda" if gpus else "cpu")["run"]


def checkpoint_sizes(cfg: TrainConfig, gpus: bool) -> dict[str, int]:
    """Bytes of one resumable step checkpoint ('full') and of one weights-only export
    ('export': final.pt, eval_step_<N>.pt) at the dtype the trainer writes on GPUs (`gpus`) or
    CPUs."""
    ck = P.checkpoint_bytes(P.plan(cfg, 1))
    dt = str(cfg.logging.export_dtype)
    bf16 = dt == "bf16" or (dt != "fp32" and gpus)  # auto: bf16 on GPUs (trainer.export_dtype)
    return {"full": ck["full"], "export": ck["bf16_export"] if bf16 else ck["weights_fp32"]}


def corpus_of(cfg: Any) -> dict[str, Any] | None:
    """The corpus a run of `cfg` reads: its directory, whether it is built, its shard files
    (None: unknown before it is built) and bytes on disk, and where the figures come from; None
    for a config that is not the trainer's or synthetic data."""
    if not isinstance(cfg, TrainConfig) or cfg.data.source in GENERATED_SOURCES:
        return None
    import math

    from experiments.corpus.build import read_manifest
    from experiments.corpus.shards import MAX_OPEN_SHARDS
    from experiments.train.data import corpus_dir

    d = corpus_dir(cfg.data, cfg.model.vocab_size, cfg.paths.cache)
    man = read_manifest(d)
    if man is not None:
        shards = man.get("shards") or []
        size = sum(f.stat().st_size for f in d.glob("*.bin") if f.is_file())
        return {"dir": d, "built": True, "shards": len(shards), "bytes": size,
                "open_bound": MAX_OPEN_SHARDS, "source": f"its manifest ({d})"}
    text = cfg.data.hf_max_bytes if cfg.data.source == "hf" else cfg.data.max_bytes
    units = math.ceil(text / cfg.data.shard_bytes) if text else None
    return {"dir": d, "built": False, "shards": 2 * units if units else None,
            "open_bound": MAX_OPEN_SHARDS,
            "bytes": P.disk_bytes(cfg, P.plan(cfg, 1))["corpus"],
            "source": (f"{units:,} units of data.shard_bytes={cfg.data.shard_bytes:,} text bytes "
                       f"(a train and a val shard each) over {text:,} bytes, before the build"
                       if units else "unknown before the build (no byte cap)")}


def space_refusal(root: Any, need: int) -> str | None:
    """One line when `root`'s file system has less than `need` bytes free."""
    return P.space_refusal(root, need)
