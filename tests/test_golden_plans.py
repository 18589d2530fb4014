"""Golden plans: the dry-run text and run-ids of `make sweep DRY=1` (`python -m sweeps run --dry
1 ...`) and of `python -m experiments.train <overrides> train.dry_run=true`, for fixed configs,
as the code printed them before sweeps/ was split by responsibility (issue 23). A refactor that
changes a run-id, a cell, a FLOPs figure or a line of the plan fails here.

Stripped, because they truly vary: the results root (a tmp dir; `<RESULTS>` in the fixture) and
the dry run's `CPU time` line when it is *measured* on this CPU (tokens/s of 3 timed steps), and
its free-space line (this machine's disk). A stated rate (train.cpu_tokens_per_s) and the GPU
estimates are analytic and kept.

The GPU lines read the MFU `make gpu-check RECIPE=..` measured (measured/gpu_check/) for H100
at each preset, else say it is assumed: committing a measurement changes them, on purpose.

Regenerate (only when a change of plan is intended, and say so in the commit):
    PYTHONPATH=$PWD .venv/bin/python tests/test_golden_plans.py --write
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "golden_plans.json"
SMOKE_DATA = "experiments/eval/smoke_data"  # relative: the fixture must not hold this checkout

SWEEPS: dict[str, list[str]] = {
    "default": [],
    "controls": ["--kappa", "0.5 2", "--h", "4",
                 "--controls", "flops plus1 plus1_flops"],
    "kappas-H-seeds": ["--kappa", "1/4 1/2 1 2", "--h", "4 8", "--seeds", "0 1"],
    "flops-budget": ["--kappa", "1", "--h", "4", "--flops", "2e12",
                     "--controls", "flops plus1 plus1_flops"],
    "16M-H16": ["--preset", "16M", "--kappa", "0.25 1", "--h", "16", "--tokens", "1M",
                "--controls", "flops"],
    "overrides-named": ["--kappa", "2", "--h", "4", "--name", "smoke-like",
                        "--overrides", "data.max_bytes=2000000 data.val_tokens=4096 "
                        "logging.val_every=0 optim.lr=1e-3"],
    "eval-points": ["--kappa", "2", "--h", "4", "--eval", "1", "--eval-points", "4",
                    "--eval-args", f"--tasks arc_easy,gsm8k --limit 5 --max-gen-toks 16 "
                    f"--data {SMOKE_DATA}"],
    "1.5B-paper": ["--preset", "1.5B", "--kappa", "0.25 0.5 1 2", "--h", "16",
                   "--tokens", "47B", "--controls", "flops plus1"],
}
"""Arguments of `python -m sweeps run --dry 1` (what `make sweep VAR=... DRY=1` passes)."""

_SYN_CPU = ["data=synthetic", "model=1M", "model.dim=64", "model.n_layers=4", "model.n_heads=4",
            "model.n_kv_heads=2", "model.ffn_dim=192", "train.batch_size=32",
            "train.tokens=1664000", "optim.lr=3e-3", "logging.val_every=250",
            "logging.ckpt_every=500", "logging.progress=false"]
_SYN_GPU = ["data=synthetic", "model=1M", "model.dim=256", "model.n_layers=8", "model.n_heads=8",
            "model.n_kv_heads=4", "model.ffn_dim=768", "train.batch_size=128",
            "train.tokens=166400000", "optim.lr=1e-3", "logging.val_every=2000",
            "logging.ckpt_every=2000", "logging.progress=false"]
TRAINS: dict[str, list[str]] = {
    "baseline-1M": ["model=1M", "model.latent_bits=0"],
    "free-1M-H4-k2": ["model=1M", "model.latent_bits=4", "model.kappa_bits=2"],
    "free-1M-H8-k0.5-flops": ["model=1M", "model.latent_bits=8", "model.kappa_bits=0.5",
                              "train.flops=3e12"],
    "control-flops": ["model=1M", "model.latent_bits=0", "train.compute_match=flops",
                      "train.match_latent_bits=8", "train.tokens=200k"],
    "control-plus1_flops": ["model=1M", "model.latent_bits=0", "model.n_layers=5",
                            "train.compute_match=flops", "train.match_latent_bits=8",
                            "train.match_n_layers=4", "train.tokens=200k"],
    "free-16M-H16-stated-rate": ["model=16M", "model.latent_bits=16", "model.kappa_bits=1",
                                 "train.tokens=2M", "train.cpu_tokens_per_s=5000"],
    "free-1.5B-H16": ["model=1.5B", "model.latent_bits=16", "model.kappa_bits=0.5",
                      "train.tokens=47B", "data.max_epochs=2000"],
    "synthetic-cpu-free": [*_SYN_CPU, "model.latent_bits=8", "model.kappa_bits=0.125",
                           "train.seed=0"],
    "synthetic-cpu-baseline": [*_SYN_CPU, "model.latent_bits=0", "model.kappa_bits=0.0",
                               "train.seed=0"],
    "synthetic-gpu-free": [*_SYN_GPU, "model.latent_bits=8", "model.kappa_bits=8.0",
                           "train.seed=0"],
}
"""Overrides of `python -m experiments.train ... train.dry_run=true` (make train ... DRY=1); the
synthetic ones are experiments.synthetic's arm overrides for --setting cpu / gpu, written out."""

MEASURED = re.compile(r"^CPU time .*\(measured: .*$", re.M)
RUN_ID = re.compile(r"\b[0-9a-f]{12}\b")
FREE = re.compile(r"^( +)(SHORT: )?<RESULTS>:? .*(free|enough free space).*$", re.M)
"""The dry run's free-space line under the disk line: this machine's disk, not the plan."""
STDLIB_SIZE = re.compile(r"^(epochs +at least )[0-9.,]+( passes over the corpus \(not built yet; "
                         r"at most )[0-9,]+ training tokens: .*$", re.M)
"""The epochs line of an unbuilt stdlib corpus: measured on this Python's standard library."""


def _normalise(text: str, results: Path) -> str:
    text = MEASURED.sub("CPU time    <measured on this CPU>", text.replace(str(results),
                                                                          "<RESULTS>"))
    text = STDLIB_SIZE.sub(r"\1<N>\2<this Python's standard library>", text)
    return FREE.sub(r"\1<free space of RESULTS>", text)


def _captured(fn: Any, argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = fn(argv)
    return rc, out.getvalue()


def _sweep(argv: list[str], results: Path) -> dict[str, Any]:
    from sweeps.__main__ import main

    rc, text = _captured(main, ["run", "--dry", "1", *argv])
    assert rc == 0, text
    text = _normalise(text, results)
    ids = [ln.split()[5] for ln in text.splitlines()[2:] if len(ln.split()) > 5
           and RUN_ID.fullmatch(ln.split()[5])]
    return {"argv": argv, "run_ids": ids, "text": text}


def _train(overrides: list[str], results: Path) -> dict[str, Any]:
    from experiments.train.__main__ import main

    rc, text = _captured(main, [*overrides, "train.dry_run=true"])
    assert rc == 0, text
    text = _normalise(text, results)
    return {"overrides": overrides, "run_id": text.split()[1], "text": text}


def capture(results: Path) -> dict[str, Any]:
    return {"sweeps": {k: _sweep(v, results) for k, v in SWEEPS.items()},
            "trains": {k: _train(v, results) for k, v in TRAINS.items()}}


@pytest.fixture
def golden_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    results = tmp_path / "results"
    monkeypatch.setenv("FTBENCH_RESULTS", str(results))
    monkeypatch.setenv("FTBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FTBENCH_DATA", raising=False)
    monkeypatch.chdir(ROOT)  # SMOKE_DATA is relative to the repository
    return results


def _golden() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())


def test_fixture_covers_what_the_issue_asks() -> None:
    g = _golden()
    assert set(g["sweeps"]) == set(SWEEPS) and set(g["trains"]) == set(TRAINS)
    assert len(g["sweeps"]) + len(g["trains"]) >= 8
    arms = {ln.split()[1] for s in g["sweeps"].values() for ln in s["text"].splitlines()[2:]
            if len(ln.split()) > 5 and RUN_ID.fullmatch(ln.split()[5])}
    assert {"baseline", "free", "baseline_flops", "baseline_plus1",
            "baseline_plus1_flops"} <= arms
    assert "skipped control" in g["sweeps"]["flops-budget"]["text"]
    assert all(len(s["run_ids"]) >= 1 for s in g["sweeps"].values())


@pytest.mark.parametrize("key", list(SWEEPS))
def test_sweep_dry_run_is_golden(key: str, golden_env: Path) -> None:
    want = _golden()["sweeps"][key]
    got = _sweep(SWEEPS[key], golden_env)
    assert got["run_ids"] == want["run_ids"]
    assert got["text"] == want["text"]
    assert not (golden_env / "sweeps").exists(), "a dry run wrote files"


@pytest.mark.parametrize("key", [pytest.param(k, marks=pytest.mark.slow) if k.startswith(
    "synthetic-gpu") else k for k in TRAINS])  # the gpu preset builds a large model: ~10 s
def test_train_dry_run_is_golden(key: str, golden_env: Path) -> None:
    want = _golden()["trains"][key]
    got = _train(TRAINS[key], golden_env)
    assert got["run_id"] == want["run_id"]
    assert got["text"] == want["text"]


def test_sweep_cell_is_the_train_run_of_its_overrides(golden_env: Path) -> None:
    """Independent of the fixture's text: the cell the sweep plans for (free, kappa 2, H 4,
    seed 0) has the run-id that `python -m experiments.train` prints for that cell's overrides."""
    from sweeps.grid import SweepSpec, expand

    cells = expand(SweepSpec.from_text(kappa="0.5 2", h="4", seeds="0", preset="1M",
                                       data="stdlib", tokens="131072", flops="",
                                       controls="flops plus1 plus1_flops", overrides=""))
    golden = _golden()["sweeps"]["controls"]
    assert [c.name for c in cells] == [ln.split()[0] for ln in golden["text"].splitlines()[2:]
                                       if len(ln.split()) > 5 and RUN_ID.fullmatch(
                                           ln.split()[5])]
    for cell, rid in zip(cells, golden["run_ids"], strict=True):
        if cell.name == "free-k2-H4-s0":
            assert _train(list(cell.overrides), golden_env)["run_id"] == rid


if __name__ == "__main__" and "--write" in sys.argv:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        os.environ["FTBENCH_RESULTS"] = str(Path(d) / "results")
        os.environ["FTBENCH_CACHE"] = str(Path(d) / "cache")
        os.environ.pop("FTBENCH_DATA", None)
        os.chdir(ROOT)
        FIXTURE.parent.mkdir(parents=True, exist_ok=True)
        FIXTURE.write_text(json.dumps(capture(Path(d) / "results"), indent=1) + "\n")
    print(f"wrote {FIXTURE}")
