"""Multi-node training as `make train NNODES=2 NODE_RANK=r MASTER_ADDR=... MASTER_PORT=...`
runs it: two torchrun agents (one per "node", both on localhost) meet through the c10d
rendezvous at 127.0.0.1 on a free port, train a 1M run with gloo, and equal one process (loss
curve and final weights within 1e-4)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import experiments.train.trainer as T
from experiments.train.config import compose

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["data=synthetic", "model=1M", "model.dim=64", "model.ffn_dim=128", "model.n_layers=2",
        "model.latent_bits=4", "train.batch_size=8", "train.micro_batch_size=2",
        f"train.tokens={3 * 8 * 65}", "data.val_tokens=260", "logging.progress=false",
        "logging.log_every=1", "optim.warmup_steps=1"]

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _agent(node_rank: int, port: int, results: Path) -> list[str]:
    """What mk/train.mk runs for NNODES=2 NODE_RANK=<r> MASTER_ADDR=127.0.0.1 NPROC=1."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
            "--node_rank", str(node_rank), "--rdzv_backend", "c10d",
            "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", f"ftbench-{port}",
            "--nproc_per_node", "1", "-m", "experiments.train", *ARGS,
            f"paths.results={results}"]


def _losses(run: Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if r["kind"] == "train"]


def test_two_torchrun_agents_with_nnodes_2_equal_one_process(tmp_path):
    one = T.train(compose([*ARGS, f"paths.results={tmp_path / 'one'}"]))
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen(_agent(r, port, tmp_path / "two"), cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in (0, 1)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outs)
    two = tmp_path / "two" / "runs" / one.name  # same config, same run-id
    conf = (two / "config.yaml").read_text()
    assert "world_size: 2" in conf
    a = torch.load(one / "checkpoints" / "final.pt", weights_only=True)["model"]
    b = torch.load(two / "checkpoints" / "final.pt", weights_only=True)["model"]
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-4
    l1, l2 = _losses(one), _losses(two)
    assert len(l1) == 3 and l1 == pytest.approx(l2, abs=1e-4)
