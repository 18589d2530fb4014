"""`make gpu-check GPU_CHECK_CPU=1`: the reduced CPU mode runs the same code paths as on a GPU
node (DDP and FSDP on 1 node and on 2 nodes simulated as two c10d torchrun agents, the resume
round trip) and passes; its JSON names every check."""

from __future__ import annotations

import json

import pytest

from pipelines import gpu_check as G

pytestmark = pytest.mark.slow


def test_gpu_check_cpu_mode_passes_every_topology(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert G.main(["--cpu", "--results", str(tmp_path), "--steps", "4"]) == 0, \
        capsys.readouterr().out
    doc = json.loads(next((tmp_path / "gpu_check").glob("cpu-*.json")).read_text())
    for key in ("one_process", "ddp_1node", "ddp_2node", "fsdp_1node", "fsdp_2node", "resume"):
        assert doc[key] == "ok", (key, doc[key])
    for key in ("ddp_1node", "ddp_2node", "fsdp_1node", "fsdp_2node"):
        assert doc[f"{key}_vs_1proc_max_rel"] <= doc["tolerance"]
    assert doc["resume_weights_max_abs"] <= 1e-4 and doc["resumed_from_step"] >= 1
    assert doc["passed"] is True


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_the_recipe_flow_on_two_gloo_processes_resumes_exactly(tmp_path, monkeypatch, capsys,
                                                               mode):
    """`gpu-check RECIPE=..` on 2 processes (gloo): the multi-GPU path of the recipe check
    (torchrun, DDP or FSDP2 as train.parallel says, the step checkpoint's shards from both
    ranks) at a tiny width, and the resume from its step checkpoint inside the run, equal to the
    uninterrupted run. Compile off: the compile matrix is tests/test_compile.py's."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("FTBENCH_RESULTS", str(tmp_path))
    rc = G.main(["--recipe", "paper-1.5B", "--cpu", "--nproc", "2", "--steps", "4",
                 "--results", str(tmp_path), "--set", "model=1M", "model.vocab_size=4096",
                 "train.seq_len=256", "model.max_seq_len=256", "train.compile=false",
                 f"train.parallel={mode}"])
    out = capsys.readouterr().out
    assert rc == 0, out
    doc = json.loads(next((tmp_path / "gpu_check").glob("*-cpu-paper-1.5B.json")).read_text())
    assert doc["n_gpus"] == 2 and doc["parallel"] == mode and doc["passed"] is True
    assert doc["val_steps"] == [0, 2, 4] and doc["resumed_from_step"] == 3
    assert doc["resume"] == "ok" and doc["resume_loss_max_rel"] <= 1e-6
    assert doc["resume_weights_max_abs"] <= 1e-6 and doc["stderr"] == []
    ckpts = sorted(p.name for p in next((tmp_path / "gpu_check").glob("recipe-*/runs/*"))
                   .joinpath("checkpoints").iterdir())
    # the one resumed from and the last step's (the trainer always writes the last)
    assert ckpts == ["final.pt", "step_3.dcp", "step_3.pt", "step_4.dcp", "step_4.pt"]
