# tests/test_fsdp.py
"""FSDP2 (train.parallel=fsdp) on CPU with gloo, 2 processes under torchrun: it trains the same
model as one process, and a kill -9 then a resume gives the same weights as an uninterrupted
FSDP run (bitwise); a resume at another world size: tests/test_checkpoint_sharded.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
import yaml

import experiments.train.trainer as T
from experiments.train.config import compose, model_config
from experiments.train.plan import run_dir

ROOT = Path(__file__).resolve().parent.parent
# synthetic data: no tokenizer or corpus to build; 2 blocks so the FT has an encoder block
BASE = ["data=synthetic", "model=1M", "model.dim=64", "model.ffn_dim=128", "model.n_layers=2",
        "train.batch_size=8", "train.micro_batch_size=2", "data.val_tokens=260",
        "logging.progress=false", "logging.log_every=1", "optim.warmup_steps=1"]

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]



def env1() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def torchrun(n: int, args: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
            str(n), "-m", "experiments.train", *args]


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["model"]


def rows(run: Path, kind: str) -> list[dict]:
    out = []
    for x in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(x)
        if r["kind"] == kind:
            out.append({k: v for k, v in r.items() if k not in ("time", "tokens_per_s", "wall_s")})
    return out


@pytest.mark.parametrize("latent_bits,ac", [(0, False), (4, True)],
                         ids=["baseline", "free-activation-checkpointing"])
def test_fsdp_two_gloo_processes_equal_one_process(tmp_path, latent_bits, ac):
    """Global batch 8 = 1 process x 4 micro-batches = 2 FSDP ranks x 2 micro-batches (gradient
    sync on the last only), to this test's tighter tolerance than tests/test_train_loop.py's
    (one process == FSDP == DDP, both arms): the baseline, and the Free Transformer with
    activation checkpointing."""
    args = [*BASE, f"model.latent_bits={latent_bits}", f"train.tokens={3 * 8 * 65}"]
    one = compose([*args, f"paths.results={tmp_path / 'one'}"])
    r1 = T.train(one)
    res = subprocess.run(torchrun(2, [*args, "train.parallel=fsdp",
                                      f"train.activation_checkpointing={str(ac).lower()}",
                                      f"paths.results={tmp_path / 'two'}"]),
                         cwd=ROOT, env=env1(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    r2 = tmp_path / "two" / "runs" / r1.name  # parallel is not part of the run-id
    a, b = weights(r1 / "checkpoints" / "final.pt"), weights(r2 / "checkpoints" / "final.pt")
    assert a.keys() == b.keys()  # gathered on rank 0: the same file as one process writes
    assert all(not isinstance(v, torch.distributed.tensor.DTensor) for v in b.values())
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    l1 = [r["loss"] for r in rows(r1, "train")]
    l2 = [r["loss"] for r in rows(r2, "train")]
    assert len(l1) == 3 and l1 == pytest.approx(l2, abs=1e-5)
    v1, v2 = rows(r1, "val"), rows(r2, "val")
    assert [r["step"] for r in v1] == [r["step"] for r in v2] == [0, 3]
    assert [r["val_ce"] for r in v1] == pytest.approx([r["val_ce"] for r in v2], abs=1e-5)
    conf = yaml.safe_load((r2 / "config.yaml").read_text())
    assert conf["accounting"]["world_size"] == 2 and conf["accounting"]["parallel"] == "fsdp"
    assert ("activation checkpointing" in (r2 / "train.log").read_text()) == ac
    ck = torch.load(r2 / "checkpoints" / "final.pt", weights_only=True)
    assert ck["extra"]["weights_only"] is True and "optimizer" not in ck["extra"]
    if latent_bits:  # the FT's own modules went through FSDP and were trained
        torch.manual_seed(one.train.seed)
        init = T.build_model(model_config(one.model)).state_dict()
        for k in ("post_sampler.weight", "encoder.attn.wq.weight", "enc_readout.weight", "zeta"):
            assert not torch.equal(b[k], init[k]), k


def _kill9_tree(p: subprocess.Popen) -> None:
    """SIGKILL torchrun's workers and torchrun itself, by PID."""
    procs = psutil.Process(p.pid).children(recursive=True)
    for c in procs:
        c.send_signal(signal.SIGKILL)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=60)
    psutil.wait_procs(procs, timeout=30)


def test_fsdp_kill9_then_resume_equals_an_uninterrupted_run(tmp_path):
    args = [*BASE, "model.latent_bits=4", f"train.tokens={12 * 8 * 65}", "logging.ckpt_every=3",
            "logging.val_every=6", "logging.keep_checkpoints=50", "train.parallel=fsdp"]
    ref = subprocess.run(torchrun(2, [*args, f"paths.results={tmp_path / 'ref'}"]), cwd=ROOT,
                         env=env1(), capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr[-3000:]
    run_id = run_dir(compose([*args, f"paths.results={tmp_path}"])).name
    ref_run = tmp_path / "ref" / "runs" / run_id

    cut = [*args, f"paths.results={tmp_path / 'cut'}"]
    run = tmp_path / "cut" / "runs" / run_id
    ck = run / "checkpoints"
    p = subprocess.Popen(torchrun(2, cut), cwd=ROOT, env=env1(), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    t0 = time.time()
    while not (ck / "step_3.pt").exists():
        assert p.poll() is None and time.time() - t0 < 240, "no checkpoint at step 3"
        time.sleep(0.05)
    _kill9_tree(p)
    assert not (ck / "final.pt").exists()

    res = subprocess.run(torchrun(2, cut), cwd=ROOT, env=env1(), capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resumed from step_" in (run / "train.log").read_text()
    a, b = weights(ref_run / "checkpoints" / "final.pt"), weights(ck / "final.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert rows(run, "train") == rows(ref_run, "train")
    assert rows(run, "val") == rows(ref_run, "val")
