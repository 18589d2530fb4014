"""The GPU-only paths run on this CPU: bf16 autocast (`train.precision=bf16`) trains with a
finite loss close to fp32 (`train.compile=true`: tests/test_compile.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from trainrun import SYNTH, rows

import experiments.train.trainer as T
from experiments.train.config import compose

TINY = [*SYNTH, "train.batch_size=4", "logging.val_every=0"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # one thread: bitwise-equal runs



def losses(run: Path) -> list[float]:
    return [r["loss"] for r in rows(run, "train")]


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


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: make gpu-check runs")
def test_gpu_check_without_a_gpu_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    from pipelines import gpu_check

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpu_check.main(["--results", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "no CUDA device visible" in err
    assert not (tmp_path / "gpu_check").exists()  # nothing written
