"""Fake-tensor memory measurements by hand (experiments/memory.py's phases), beside `make train
DRY=1` (which measures the planned run only), and `measure_real`: the same phases run for real
on this CPU, which tests/test_memory.py's slow agreement check compares with the fake figures.

    python -m dev.memory key=value ... [--phases train,validation,eval,save] [--eval-rows 16]
        [--device-type cuda|cpu] [--parallel none|ddp|fsdp] [--fsdp-sync every|last|both]
        [--all-micro-batches] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from common.errors import UsageError, cli
from experiments.memory import (
    GB,
    PHASES,
    PhasePeak,
    _eval_lm,
    _save,
    _setup,
    _train,
    _validation,
    format_table,
    measure,
)
from experiments.train.config import TrainConfig, compose, export_dtype, trains_bf16
from experiments.train.plan import plan

DEVICE_TYPES = ("cuda", "cpu")
FSDP_SYNC = ("every", "last", "both")


def _rss() -> tuple[int, int]:
    """(current, peak since the last reset) resident bytes of this process (Linux)."""
    vals = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                vals[k] = int(v.split()[0]) * 1024
    return vals["VmRSS"], vals["VmHWM"]


def measure_real(cfg: TrainConfig, phase: str, *, eval_rows: int = 16,
                 accum_measured: int | None = 3) -> int:
    """The bytes `phase` adds to this process' peak run for real on this CPU: the resident
    set's high-water mark (reset through /proc/self/clear_refs) less the resident set before,
    with `measure`'s setup and phase code on real tensors. Linux only; one fresh process per
    phase, MALLOC_MMAP_THRESHOLD_ fixed, so freed memory goes back to the system."""
    import gc
    import tempfile

    p = plan(cfg, 1)
    bf16 = trains_bf16(cfg.train, "cpu")
    accum = p.grad_accum if accum_measured is None else min(p.grad_accum, accum_measured)
    if phase == "eval":
        lm, pairs = _eval_lm(p, bf16, eval_rows)
        fn: Any = lambda: lm.loglikelihood_pairs(pairs, disable_tqdm=True)  # noqa: E731
    else:
        r, _ = _setup(cfg, p, "none", bf16, "cpu")
        if phase == "train":
            fn = lambda: _train(r, accum)  # noqa: E731
        elif phase == "validation":
            fn = lambda: _validation(r)  # noqa: E731
        elif phase == "save":
            def fn() -> None:
                import torch.distributed.checkpoint as dcp
                from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

                from model.checkpoint import save_weights

                sd, weights = _save(r)
                out = {"bf16": torch.bfloat16, "fp32": None}[export_dtype(cfg, "cpu")]
                with tempfile.TemporaryDirectory() as d:  # the Checkpointer's order
                    save_weights(Path(d) / "export.pt", r.model, state_dict=weights, dtype=out)
                    del weights
                    dcp.async_save(sd, checkpoint_id=d, async_checkpointer_type=(
                        AsyncCheckpointerType.THREAD)).result()
        else:
            raise UsageError(f"phase {phase!r}: allowed {list(PHASES)}")
    gc.collect()
    before, _ = _rss()
    with open("/proc/self/clear_refs", "w") as f:  # this process' peak RSS := its current RSS
        f.write("5")
    fn()
    _, peak = _rss()
    return peak - before


def main(args: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m dev.memory",
        description="Measured per-GPU peak memory per phase (fake tensors, fake process group); "
                    "positional key=value are the trainer's overrides (model=8B ...).")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--phases", default=",".join(PHASES))
    ap.add_argument("--eval-rows", type=int, default=16)
    ap.add_argument("--device-type", default="cuda", choices=DEVICE_TYPES)
    ap.add_argument("--parallel", default=None, choices=("none", "ddp", "fsdp"))
    ap.add_argument("--fsdp-sync", default=None, choices=FSDP_SYNC,
                    help="FSDP2 gradient reduce-scatter: every micro-batch, last only, or both")
    ap.add_argument("--all-micro-batches", action="store_true",
                    help="run every micro-batch of the step (default: 3 of them)")
    ap.add_argument("--json", default=None, help="also write the records to this file")
    a = ap.parse_args(args)
    cfg = compose(a.overrides)
    phases = [x for x in a.phases.split(",") if x]
    if bad := [x for x in phases if x not in PHASES]:
        raise UsageError(f"--phases {bad}: allowed {list(PHASES)}")
    if a.eval_rows < 1:
        raise UsageError(f"--eval-rows={a.eval_rows}: must be at least 1")
    syncs: list[bool | None] = [None]
    if a.fsdp_sync is not None:
        syncs = {"every": [True], "last": [False], "both": [False, True]}[a.fsdp_sync]
    recs: list[PhasePeak] = []
    for s in syncs:
        recs += measure(cfg, parallel=a.parallel, device_type=a.device_type, phases=phases,
                        eval_rows=a.eval_rows, fsdp_reduce_every=s,
                        accum_measured=None if a.all_micro_batches else 3)
    cap = cfg.train.gpu_memory_gb * GB
    r0 = recs[0]
    print(f"{cfg.model.preset} {r0.arm} ({r0.params:,} params), {r0.device_type} modelled"
          f"{', bf16' if r0.bf16 else ', fp32'}; GPU capacity {cfg.train.gpu_memory_gb:g} GB "
          f"(train.gpu_memory_gb); measured on fake tensors in "
          f"{sum(r.seconds for r in recs):.0f} s of CPU time")
    print(format_table(recs, cap))
    if a.json:
        Path(a.json).write_text(json.dumps([r.to_json() for r in recs], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(cli("python -m dev.memory", main))
