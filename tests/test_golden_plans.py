"""Golden plans: what `make sweep DRY=1` (`python -m sweeps run --dry 1 ...`) and `python -m
experiments.train <overrides> train.dry_run=true` plan for fixed configs: the run-ids, spec ids,
cells and the numbers (parameters, FLOPs, tokens, steps, batch, GPU-hours, memory, checkpoint and
disk sizes). A change that moves a run-id, a cell or a figure fails here; rewording a printed line
does not (only the numbers after a line's label are pinned, up to its first ';').

Not pinned, because they truly vary: the results root, the free space of this machine's disk,
and the epochs of an unbuilt stdlib corpus (this Python's library). The train plans are asked
with a stated CPU rate (train.cpu_tokens_per_s, not part of the run-id), so their CPU time is
analytic and pinned rather than timed on this CPU.

The GPU lines read the MFU `make gpu-check RECIPE=..` measured (measured/gpu_check/) for H100
at each preset, else assume one: committing a measurement changes them, on purpose.

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

RUN_ID = re.compile(r"\b[0-9a-f]{12}\b")
NUM = re.compile(r"(?<![\w.])\d+(?:,\d{3})*(?:\.\d+)?(?:e[+-]?\d+)?[kMGTPB%]?(?!\w)")
"""A figure as printed (1,280,640 / 9.51e+06 / 1.03T / 35%); digits inside a word (fp32, H100)
are not figures."""
LABELS = ("run-id", "data", "params", "FLOPs/token", "FT overhead", "budget", "tokens", "FLOPs",
          "batch", "GPU time to run:", "GPU time", "checkpoint", "disk",
          "CPU time", "total:", "eval (checked):")
"""The lines whose figures are pinned, by the label they start with (longest first where one
label begins another); world, epochs and provenance lines are not figures of the plan."""


RATE = ["train.cpu_tokens_per_s=1000"]


def figures(text: str) -> dict[str, Any]:
    """The ids and numbers of a dry run's text: run-ids and spec ids in order, the sweep's name,
    its cell table as records, its skipped controls, and for each labelled line the figures
    after the label up to the first ';' (what follows is provenance or a restatement)."""
    out: dict[str, Any] = {"ids": RUN_ID.findall(text), "figures": {}}
    lines = text.splitlines()
    if lines[0].startswith("sweep "):
        out["sweep"] = lines[0].split()[1].rstrip(":")
        head = lines[1].split()
        rows = [ln.split(None, len(head) - 1) for ln in lines[2:]]
        # "time here" is measured on this machine (two header words): not part of the plan
        out["cells"] = [{k: v for k, v in zip(head, r, strict=True) if k not in ("time", "here")}
                        for r in rows
                        if len(r) == len(head) and RUN_ID.fullmatch(r[head.index("run-id")])]
        out["skipped"] = [ln.split(":")[1].strip() for ln in lines
                          if ln.startswith("skipped control:")]
    for ln in lines:
        label = next((lb for lb in LABELS if ln.strip().startswith(lb)), None)
        if label is None or (label == "CPU time" and "stated" not in ln):
            continue  # a CPU time measured on this machine is not part of the plan
        value = RUN_ID.sub(" ", ln.strip()[len(label):].split(";")[0])
        out["figures"].setdefault(label, []).append(NUM.findall(value))
    return out


def _captured(fn: Any, argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = fn(argv)
    return rc, out.getvalue()


def _sweep(argv: list[str]) -> dict[str, Any]:
    from sweeps.__main__ import main

    rc, text = _captured(main, ["run", "--dry", "1", *argv])
    assert rc == 0, text
    return {"argv": argv, **figures(text)}


def _train(overrides: list[str]) -> dict[str, Any]:
    from experiments.train.__main__ import main

    # a stated CPU rate (not part of the run-id): timing steps on this CPU takes most of a
    # dry run's time here, and the measured path is tests/test_plan_estimate.py's
    rate = [] if any("cpu_tokens_per_s" in o for o in overrides) else RATE
    rc, text = _captured(main, [*overrides, *rate, "train.dry_run=true"])
    assert rc == 0, text
    return {"overrides": overrides, **figures(text)}


def capture() -> dict[str, Any]:
    return {"sweeps": {k: _sweep(v) for k, v in SWEEPS.items()},
            "trains": {k: _train(v) for k, v in TRAINS.items()}}


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
    arms = {c["arm"] for s in g["sweeps"].values() for c in s["cells"]}
    assert {"baseline", "free", "baseline_flops", "baseline_plus1",
            "baseline_plus1_flops"} <= arms
    assert g["sweeps"]["flops-budget"]["skipped"] == ["baseline_flops", "baseline_plus1_flops"]
    assert all(s["cells"] and s["figures"]["total:"] for s in g["sweeps"].values())
    assert all(len(t["ids"]) == 1 and t["figures"]["tokens"] for t in g["trains"].values())


@pytest.mark.parametrize("key", list(SWEEPS))
def test_sweep_dry_run_is_golden(key: str, golden_env: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    want = _golden()["sweeps"][key]
    if key != "default":
        # "time here" is not pinned, and timing a step of each sweep's costliest model on this
        # CPU was most of this test's time (16M: ~18 s); "default" still times its 1M model
        from sweeps import backend

        monkeypatch.setattr(backend, "local_rate", lambda cfg, threads: (1000.0, "stated"))
    got = _sweep(SWEEPS[key])
    assert got["ids"] == want["ids"]  # run-ids, then the eval spec id
    assert got == want
    assert not (golden_env / "sweeps").exists(), "a dry run wrote files"


@pytest.mark.parametrize("key", list(TRAINS))
def test_train_dry_run_is_golden(key: str, golden_env: Path) -> None:
    want = _golden()["trains"][key]
    got = _train(TRAINS[key])
    assert got["ids"] == want["ids"]
    assert got == want


def test_sweep_cell_is_the_train_run_of_its_overrides(golden_env: Path) -> None:
    """Independent of the fixture: the cell the sweep plans for (free, kappa 2, H 4, seed 0) has
    the run-id that `python -m experiments.train` prints for that cell's overrides."""
    from sweeps.grid import SweepSpec, expand

    cells = expand(SweepSpec.from_text(kappa="0.5 2", h="4", seeds="0", preset="1M",
                                       data="stdlib", tokens="131072", flops="",
                                       controls="flops plus1 plus1_flops", overrides=""))
    golden = {c["cell"]: c["run-id"] for c in _golden()["sweeps"]["controls"]["cells"]}
    assert [c.name for c in cells] == list(golden)
    cell = next(c for c in cells if c.name == "free-k2-H4-s0")
    assert _train(list(cell.overrides))["ids"] == [golden[cell.name]]


if __name__ == "__main__" and "--write" in sys.argv:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        os.environ["FTBENCH_RESULTS"] = str(Path(d) / "results")
        os.environ["FTBENCH_CACHE"] = str(Path(d) / "cache")
        os.environ.pop("FTBENCH_DATA", None)
        os.chdir(ROOT)
        FIXTURE.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(capture(), indent=1)  # a list of figures on one line
        FIXTURE.write_text(re.sub(r"\[\s+([^][{}]*?)\s+\]", lambda m: "[" + " ".join(
            m.group(1).split()) + "]", text) + "\n")
    print(f"wrote {FIXTURE}")
