"""Checkpoint cost at a preset on this machine (issue 26): the time the training loop blocks
per step checkpoint, sync vs async (torch.distributed.checkpoint), against the old single-file
save (gather + torch.save on rank 0); the bytes on disk; with `--world 2`, the bytes each FSDP
rank writes. A measuring script, not a test: numbers depend on the machine's load.

    python -m dev.bench.checkpoint [--preset 16M] [--reps 3] [--world 2]

Prints one JSON object (the figures docs/BENCH.md's checkpoint section quotes).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


def _setup(preset: str, root: Path, mode: str, world: int, **kw: Any) -> Any:
    from experiments.train import parallel as par
    from experiments.train.checkpointer import Checkpointer, TrainState
    from experiments.train.config import compose
    from experiments.train.plan import plan, run_dir
    from experiments.train.trainer import lr_factor, param_groups
    from model import build_model

    cfg = compose([f"model={preset}", "data=synthetic", f"paths.results={root}",
                   "logging.ckpt_every=1", "logging.keep_checkpoints=1",
                   "logging.keep_eval_checkpoints=0", "train.batch_size=8"])
    p = plan(cfg, world)
    torch.manual_seed(0)
    model = build_model(p.model)
    if mode == "fsdp":
        par.shard(model, torch.device("cpu"), world)
    opt = torch.optim.AdamW(param_groups(model, 0.1), lr=1e-4, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, p.steps, p.warmup_steps, cfg.optim.min_lr_ratio))
    x = torch.randint(0, p.model.vocab_size, (1, 64))
    model(x, targets=x).loss.backward()
    opt.step()  # AdamW's moments exist: the checkpoint holds its full size
    opt.zero_grad(set_to_none=True)
    rank = dist.get_rank() if world > 1 else 0
    ck = Checkpointer(run_dir(cfg), cfg, p, main=rank == 0, world=world, **kw)
    ck.prepare()
    if world > 1:
        dist.barrier()
    return ck, TrainState(cfg, p, ck.rd.name, opt, sched, model, mode), p


def _bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _old_save(ck: Any, state: Any, step: int) -> Path:
    """The pre-issue-26 save: full weights and optimizer gathered on rank 0, one file."""
    from experiments.train import parallel as par
    from model import save_checkpoint

    weights, optim, fmt = par.gather_state(state.model, state.opt, state.mode)
    path = ck.ckdir / f"old_{step}.pt"
    if ck.main:
        state.step = step
        save_checkpoint(path, state.model, extra=state.state_dict(optim, fmt),
                        state_dict=weights)
    if ck.world > 1:
        dist.barrier()
    return path


def one_process(preset: str, reps: int) -> dict[str, Any]:
    out: dict[str, Any] = {"preset": preset, "reps": reps}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("old", "sync", "async"):
            ck, state, p = _setup(preset, Path(tmp) / kind, "none", 1,
                                  async_save=kind == "async")
            blocked, total = [], []
            for r in range(1, reps + 1):
                t0 = time.perf_counter()
                if kind == "old":
                    path = _old_save(ck, state, r)
                else:
                    path = ck.maybe_save(r, state, val_done=False)
                t1 = time.perf_counter()
                ck.wait()
                t2 = time.perf_counter()
                blocked.append(t1 - t0)
                total.append(t2 - t0)
            size = _bytes(path) + (_bytes(path.with_suffix(".dcp")) if kind != "old" else 0)
            out[kind] = {"blocked_s": statistics.median(blocked),
                         "blocked_s_all": [round(b, 4) for b in blocked],
                         "total_s": statistics.median(total), "bytes": size}
            if kind == "sync":
                f32 = ck.export(ck.ckdir / "final32.pt", state)
                ck.export_dtype = torch.bfloat16
                b16 = ck.export(ck.ckdir / "final16.pt", state)
                out["export_bytes"] = {"fp32": _bytes(f32), "bf16": _bytes(b16)}
                out["params"] = p.params["total"]
    return out


def worker(preset: str, root: str) -> None:
    """One rank of `--world 2` (under torchrun): FSDP, one sync sharded save and one old
    save; rank 0 prints the bytes per shard file."""
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    ck, state, _ = _setup(preset, Path(root), "fsdp", world, async_save=False)
    t0 = time.perf_counter()
    path = ck.maybe_save(1, state, val_done=False)
    t_new = time.perf_counter() - t0
    t0 = time.perf_counter()
    old = _old_save(ck, state, 1)
    t_old = time.perf_counter() - t0
    dist.barrier()
    if rank == 0:
        shards = {f.name: f.stat().st_size for f in sorted(path.with_suffix(".dcp").iterdir())}
        print(json.dumps({"world": world, "sharded_save_s": t_new, "old_save_s": t_old,
                          "shard_files": shards, "marker_bytes": _bytes(path),
                          "old_file_bytes_rank0": _bytes(old)}))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="16M")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    if a.worker:
        worker(a.preset, a.worker)
        return 0
    if a.world == 1:
        print(json.dumps(one_process(a.preset, a.reps), indent=1))
        return 0
    tmp = tempfile.mkdtemp()
    try:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        import subprocess

        res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                              "--nproc_per_node", str(a.world), "-m",
                              "dev.bench.checkpoint", "--preset", a.preset,
                              "--worker", tmp], env=env, capture_output=True, text=True)
        lines = [x for x in res.stdout.splitlines() if x.startswith("{")]
        if res.returncode != 0 or not lines:
            print(f"error: the {a.world} workers failed: {res.stderr[-1500:]}", file=sys.stderr)
            return 1
        print(lines[-1])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
