"""`python -m experiments.synthetic`'s input checks: good input passes them (the refusals are
tests/test_refusals.py's table), and the report of a missing run is one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import experiments.synthetic as syn

ROOT = Path(__file__).resolve().parents[1]


def _files(*roots: Path) -> set[Path]:
    return {p for r in roots if r.exists() for p in r.rglob("*")}


def test_report_of_missing_run_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "FTBENCH_RESULTS": str(tmp_path / "results")}
    r = subprocess.run([sys.executable, "-m", "analysis.synthetic", "--name", "nope"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "nope" in r.stderr.strip().splitlines()[-1]
    assert _files(tmp_path) == set()


def test_good_input_passes_the_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: valid flags and overrides pass every check (hydra composes each arm) and
    run() writes samples.jsonl; an untrained tiny model stands in for training."""
    from model import build_model, get_preset

    monkeypatch.setenv("FTBENCH_RESULTS", str(tmp_path))
    st = syn.parse_args(["--setting", "smoke", "--kappa", "1/8, 8", "--name", "ok",
                         "--n-prompts", "1", "--n-shared-groups", "1", "--group-size", "2",
                         "--n-eval", "4", "optim.lr=1e-3", "train.seed=1"])
    assert syn.check(st) == [(0, None), (8, 1 / 8), (8, 8.0)]

    def fake(label: str, h: int, k: float, st: syn.SyntheticSettings) -> syn.Trained:
        cfg = get_preset("1M", vocab_size=29, dim=16, n_layers=2, n_heads=2, n_kv_heads=1,
                         ffn_dim=32, latent_bits=h, kappa_bits=k)
        return syn.Trained(build_model(cfg), {"run_id": label})

    d = syn.run(st, train_fn=fake)
    assert sorted(p.name for p in d.iterdir()) == ["samples.jsonl"]
