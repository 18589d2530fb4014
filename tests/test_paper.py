"""`make paper RECIPE=...` (pipelines/paper.py) and `make sweep RECIPE=...` (sweeps --recipe).

The plan of every paper recipe on 1, 32 and 256 GPUs prints without a traceback (bad input: the
table in tests/test_sweep.py); a recipe's sweep is the recipe's own grid. `make paper
RECIPE=<cpu-mini cut to 2 cells>` end to end (corpus, sweep with two evaluation points per cell,
report, then a second run that does no work) is tests/test_slurm.py's, through the SLURM
launcher.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sweeps.recipe import load, merge_overrides

ROOT = Path(__file__).resolve().parents[1]


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "FTBENCH_RESULTS": str(tmp_path / "results"),
            "FTBENCH_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1",
            "FTBENCH_ALLOW_DIRTY": "1"}  # tests may run from a tree under edit (cells marked)


def _paper(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipelines.paper", *args], cwd=ROOT,
                          capture_output=True, text=True, env=_env(tmp_path), check=False)


def test_merge_overrides_lets_the_later_key_win() -> None:
    base = ("optim.lr=1e-3", "train.plan_world_size=32", "data.paths=[a,b]")
    got = merge_overrides(base, ["train.plan_world_size=256", "+x=1"])
    assert got == ("optim.lr=1e-3", "data.paths=[a,b]", "train.plan_world_size=256", "+x=1")


def test_recipe_sweep_is_the_recipes_grid() -> None:
    from sweeps.api import SweepRequest, recipe_spec  # the front door's own builder

    rec = load("cpu-mini")
    spec = recipe_spec(rec, SweepRequest(overrides="optim.lr=5e-4"))
    ref = rec.sweep_spec()
    assert spec.kappa_bits == ref.kappa_bits == (0.5, 2.0)
    assert spec.latent_bits == ref.latent_bits and spec.seeds == ref.seeds
    assert spec.controls == ref.controls and spec.preset == rec.preset
    assert spec.tokens == float(rec.train.tokens)
    lr = [o for o in spec.overrides if o.startswith("optim.lr=")]
    assert lr == ["optim.lr=5e-4"]  # the user's value replaces the recipe's, once


@pytest.mark.slow  # each measures its recipe's memory on fake tensors (minutes at 1.5B on CPU)
@pytest.mark.parametrize("name, gpus", [  # one world each, 1, 32 and 256 GPUs among them
    ("paper-1.5B", "32"), ("paper-8B", "1"), ("paper-8B-1T", "256")])
def test_paper_recipes_plan_on_any_world(tmp_path: Path, name: str, gpus: str) -> None:
    r = _paper(tmp_path, "--recipe", name, "--gpus", gpus, "--dry")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Traceback" not in r.stdout + r.stderr
    out = r.stdout
    assert "filled in by the recipe" in out and "[reference]" in out
    assert "GPU time to run:" in out and f"on {gpus} GPU(s)" in out
    assert "GPU-hours per point and cell" in out and "disk under the results root" in out
    assert "DRY=1: nothing submitted" in out
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").rglob("*.json"))
