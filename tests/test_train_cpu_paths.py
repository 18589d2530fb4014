"""The GPU-only paths run on this CPU: bf16 autocast (`train.precision=bf16`) trains with a
finite loss close to fp32 (`train.compile=true`: tests/test_compile.py);
`logging.keep_eval_checkpoints=n` leaves n evenly spaced checkpoints outside the rotation.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import experiments.train.trainer as T
from experiments.train.config import compose
from experiments.train.plan import plan

TINY = ["data=synthetic", "model=1M", "model.dim=64", "model.ffn_dim=128", "model.n_layers=2",
        "train.batch_size=4", "data.val_tokens=260", "logging.progress=false",
        "logging.log_every=1", "optim.warmup_steps=1", "logging.val_every=0"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # one thread: bitwise-equal runs



def losses(run: Path) -> list[float]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r["kind"] == "train"]


def test_bf16_autocast_on_cpu_trains_close_to_fp32(tmp_path):
    """Was refused with "train.precision=bf16 needs CUDA". The FT: its decoder is the
    baseline's, plus the encoder and the mapper."""
    args = [*TINY, "model.latent_bits=4", f"train.tokens={6 * 4 * 65}"]
    fp32 = T.train(compose([*args, "train.precision=fp32", f"paths.results={tmp_path}"]))
    bf16 = T.train(compose([*args, "train.precision=bf16", f"paths.results={tmp_path}"]))
    a, b = losses(fp32), losses(bf16)
    assert len(a) == len(b) == 6 and all(math.isfinite(x) for x in b)
    assert a != b  # bf16 really ran: the matmuls round differently
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 0.05 * max(a)


def test_keep_eval_checkpoints_leaves_n_evenly_spaced_checkpoints(tmp_path):
    args = [*TINY, f"train.tokens={12 * 4 * 65}", "logging.ckpt_every=5",
            "logging.keep_checkpoints=1", "logging.keep_eval_checkpoints=3",
            f"paths.results={tmp_path}"]
    cfg = compose(args)
    assert plan(cfg).steps == 12
    run = T.train(cfg)
    ck = run / "checkpoints"
    evals = sorted(p.name for p in ck.glob("eval_step_*.pt"))
    assert evals == ["eval_step_12.pt", "eval_step_4.pt", "eval_step_8.pt"]
    steps = {p.name: torch.load(p, weights_only=True)["extra"]["step"]
             for p in ck.glob("eval_step_*.pt")}
    assert steps == {"eval_step_4.pt": 4, "eval_step_8.pt": 8, "eval_step_12.pt": 12}
    # the rotation (keep_checkpoints=1) did not take them, and a resume does not read them
    assert sorted(p.name for p in ck.glob("step_*.pt")) == ["step_12.pt"]
    final = torch.load(ck / "final.pt", weights_only=True)["model"]
    last = torch.load(ck / "eval_step_12.pt", weights_only=True)["model"]
    assert all(torch.equal(final[k], last[k]) for k in final)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: make gpu-check runs")
def test_gpu_check_without_a_gpu_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    from pipelines import gpu_check

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpu_check.main(["--results", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "no CUDA device visible" in err
    assert not (tmp_path / "gpu_check").exists()  # nothing written
