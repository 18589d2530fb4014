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
