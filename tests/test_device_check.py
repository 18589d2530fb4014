"""No silent CPU (issue 45, common.gpus): where GPUs are visible (nvidia-smi lists some, or
CUDA_VISIBLE_DEVICES / SLURM's GPU variables name some) and torch cannot use them, training,
evaluation, the synthetic experiment and gpu-check refuse in one line naming the driver and
torch's CUDA build, instead of running on the CPU. Here torch sees no GPU, so a fake nvidia-smi
on PATH (or a variable) makes the host look like a GPU node whose driver torch cannot use."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

from common.errors import UsageError

GPU_VARS = ("CUDA_VISIBLE_DEVICES", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS",
            "SLURM_GPUS", "SLURM_GPUS_PER_NODE", "SLURM_GPUS_PER_TASK")
LINE = (r"GPUs are visible \({why}; driver 535\.104\.05, CUDA <= 12\.2\) but torch \S+ "
        r"\((built for CUDA \S+|a CPU-only build)\) sees none; {fix}")

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="torch sees a GPU here")


@pytest.fixture
def gpu_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A fake nvidia-smi listing one H100 with driver 535 first on PATH; no GPU variables."""
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text('#!/bin/sh\nif [ "$1" = -L ]; then echo "GPU 0: NVIDIA H100 80GB HBM3 '
                   '(UUID: GPU-0)"; exit 0; fi\necho "| Driver Version: 535.104.05   CUDA '
                   'Version: 12.2 |"\n')
    smi.chmod(0o755)
    for k in GPU_VARS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    return {k: v for k, v in os.environ.items() if k not in GPU_VARS}


def _train_device(*overrides: str) -> torch.device:
    from experiments.train.config import compose
    from experiments.train.trainer import _device

    return _device(compose(list(overrides)))


def _eval_device() -> str:
    from experiments.eval.run import resolve_device

    return resolve_device(None)


def _synthetic_device() -> str:
    from experiments.synthetic import measure_device

    return measure_device()


def _gpu_check() -> int:
    from pipelines.gpu_check import _main

    return _main(["--recipe", "paper-1.5B"])


@pytest.mark.parametrize("entry, fix", [
    (_train_device, r"train\.device=cpu trains on the CPU anyway"),
    (_eval_device, r"--device cpu evaluates on the CPU anyway"),
    (_synthetic_device, r"CUDA_VISIBLE_DEVICES= runs it on the CPU anyway"),
    (_gpu_check, r"GPU_CHECK_CPU=1 rehearses it on the CPU"),
])
def test_each_entry_refuses_where_torch_cannot_use_the_visible_gpus(
        gpu_host: dict[str, str], entry, fix: str) -> None:
    with pytest.raises(UsageError) as e:
        entry()
    assert re.fullmatch(LINE.format(why="nvidia-smi lists 1 GPU", fix=fix), str(e.value)), e.value


@pytest.mark.parametrize("env, refused", [
    ({"CUDA_VISIBLE_DEVICES": "0"}, True),
    ({"SLURM_GPUS_ON_NODE": "4"}, True),
    ({"CUDA_VISIBLE_DEVICES": ""}, False),  # hidden on purpose: the CPU is what was asked for
    ({"SLURM_GPUS_ON_NODE": "0"}, False),
    ({}, False),
])
def test_variables_alone_decide_without_a_driver_tool(
        env: dict[str, str], refused: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi: only the variables count
    for k in GPU_VARS:
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    if refused:
        with pytest.raises(UsageError, match="GPUs are visible .* no NVIDIA driver found"):
            _train_device()
    else:
        assert _train_device() == torch.device("cpu")
    assert _train_device("train.device=cpu") == torch.device("cpu")  # asked for: no refusal


def test_make_train_refuses_in_one_line_and_writes_nothing(
        gpu_host: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from experiments.train.trainer import main  # make train's entry, in process

    res = tmp_path / "results"
    assert main(["model=1M", "data=random", "train.tokens=2k", f"paths.results={res}"]) == 2
    line, = capsys.readouterr().err.strip().splitlines()
    assert re.fullmatch("train: error: " + LINE.format(
        why="nvidia-smi lists 1 GPU", fix=r"train\.device=cpu trains on the CPU anyway"), line)
    assert not (res / "runs").exists()
