"""What the training tests share: the overrides of a tiny run on the paper's synthetic task, how
a run is launched on several processes, and what it leaves (metrics lines, final weights)."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
SYNTH = ["data=synthetic", "model=1M", "model.dim=64", "model.ffn_dim=128", "model.n_layers=2",
         "data.val_tokens=260", "logging.progress=false", "logging.log_every=1",
         "optim.warmup_steps=1"]
"""The 1M preset cut to 2 blocks of width 64 (so the FT has an encoder block) on synthetic data
(no tokenizer or corpus to build): a step takes milliseconds."""
WALL = ("time", "tokens_per_s", "wall_s")
"""metrics.jsonl's wall-clock fields: what two runs of the same training may differ in."""


def env1(**extra: str) -> dict[str, str]:
    """A child process' environment: one OpenMP thread (bitwise-equal runs), this checkout."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **extra}


def torchrun(n: int, *args: str) -> list[str]:
    """`python -m experiments.train args` on n processes of this machine (1: no torchrun)."""
    if n == 1:
        return [sys.executable, "-m", "experiments.train", *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
            str(n), "-m", "experiments.train", *args]


def rows(run: Path, kind: str | None = None, wall: bool = True) -> list[dict]:
    """A run's metrics.jsonl lines (of one kind; wall=False: without WALL); a line cut by
    kill -9 is skipped, a missing file is no line."""
    path = run / "metrics.jsonl"
    out = []
    for x in path.read_text().splitlines() if path.exists() else []:
        try:
            r = json.loads(x)
        except json.JSONDecodeError:
            continue
        if kind is None or r["kind"] == kind:
            out.append(r if wall else {k: v for k, v in r.items() if k not in WALL})
    return out


def weights(path: Path) -> dict[str, torch.Tensor]:
    """A checkpoint file's weights; a run directory: its final.pt's."""
    if path.is_dir():
        path = path / "checkpoints" / "final.pt"
    return torch.load(path, weights_only=True)["model"]


def max_dw(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
