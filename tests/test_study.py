"""`make study` (pipelines/study.py) and docs/STUDY.md's renderer (analysis/study.py).

The render tests plant tables with unusual values and check every number in the Markdown
against numbers computed here from the planted files (formatting, the perplexity ratio, the
planned MDE and the budget recomputed independently). The end-to-end test runs STUDY_SIZE=tiny
through make twice: the second run must do no work.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
NOISE = [0.011, -0.007, 0.003, -0.012, 0.005]
"""Per-seed wiggles of the planted values (mean 0)."""


def plant(d: Path, probe: bool = True) -> dict:
    """A study's per-seed values with known effects: FT k=0.5 worse by 0.2 nats (tight), k=1
    equal to the baseline up to +-0.002 (equivalent at the 0.03 margin), k=2 +0.02 with a wide
    spread (inconclusive); the Z-cut identical to the baseline; the equal-FLOPs baseline 0.15
    better. Returns the study.json written."""
    d.mkdir(parents=True)
    meta = {"name": "planted", "size": "full", "preset": "1M", "h": 8, "kappa": "0.5 1 2",
            "seeds": "0 1 2 3 4", "tokens": "1M", "controls": "flops plus1 zcut",
            "overrides": "data.val_tokens=16384", "tasks": "gsm8k,humaneval_plus,mbpp_plus",
            "limit": 24, "gen_toks": 48, "eval_points": 3, "likelihood_rows": 8,
            "probe_args": "--rows 8", "mde_target_nats": 0.03, "budget_min": 90.0,
            "bench_data": "benchmarks", "n_cells": 35, "n_done": 35, "n_eval_done": 35,
            "cores": 2, "n_cells_planned": 35}
    (d / "study.json").write_text(json.dumps(meta))
    cells = [{"run_id": f"r{k}s{s}", "arm": "free", "kappa_bits": k, "seed": s}
             for k in (0.5, 1.0, 2.0) for s in range(5)]
    (d / "cells.json").write_text(json.dumps(cells))
    rows = []
    for s, e in enumerate(NOISE):
        base = 4.3 + e
        arms = {("baseline", None): base, ("baseline_flops", None): base - 0.15,
                ("baseline_plus1", None): base - 0.01 + e / 3, ("free_zcut", None): base,
                ("free", 0.5): base + 0.2 + e / 10, ("free", 1.0): base + 0.001 + e / 10,
                ("free", 2.0): base + 0.02 + 4 * e}
        for (arm, k), v in arms.items():
            for task, metric, val in (("val", "val_ce", v), ("val", "val_bpb", v / 2.1),
                                      ("gsm8k_gold_bpb", "bpb", v / 1.5)):
                rows.append({"task": task, "metric": metric, "arm": arm, "kappa_bits": k,
                             "seed": s, "value": val, "run_id": f"{arm}{k}s{s}",
                             "git_commit": "abc1234", "git_dirty": False})
    pd.DataFrame(rows).to_csv(d / "per_seed.csv", index=False)
    if probe:
        pd.DataFrame([{"run_id": f"r{k}s{s}", "kappa_bits": k, "kl_bits": 0.5, "n_active": 3,
                       "over_budget": False, "latent_unused": False}
                      for k in (0.5, 1.0, 2.0) for s in range(2)]).to_csv(d / "probe.csv",
                                                                          index=False)
    pd.DataFrame([{"column": "FT k=1 H=8", "seed": s, "n_tokens": 2048, "baseline_bpb": 2.53,
                   "gap_k": 64, "gap_nats_per_token": 0.18 + e, "tightest": "prior_k1",
                   "tightest_gap_nats_per_token": e, "kl_nats_per_token": 0.7,
                   "posterior_ce_leaking": 4.01} for s, e in enumerate(NOISE)]
                 ).to_csv(d / "likelihood.csv", index=False)
    pd.DataFrame([{"quantity": "pilot_sd_val_ce", "value": 0.00717, "unit": "nats/token",
                   "note": "3 seeds"},
                  {"quantity": "flops_per_token_baseline", "value": 8e6, "unit": "FLOP",
                   "note": "dry run"},
                  {"quantity": "flops_per_token_ft_h8", "value": 9.6e6, "unit": "FLOP",
                   "note": "dry run"}]).to_csv(d / "sizing.csv", index=False)
    shutil.copyfile(ROOT / "docs" / "study" / "bryanvine.csv", d / "bryanvine.csv")
    return meta


def _render(tables: Path) -> SimpleNamespace:
    """`python -m pipelines.study render --docs <tables>` (STUDY.md beside the tables), in this
    process: its exit code and stderr."""
    from pipelines.study import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["render", "--docs", str(tables)])
    return SimpleNamespace(returncode=rc, stderr=err.getvalue())


def _t(d: list[float]) -> tuple[float, float, float, float]:
    """Mean, 95% t interval and two-sided p of paired differences, by hand."""
    n, m, se = len(d), sum(d) / len(d), stats.tstd(d) / math.sqrt(len(d))
    h = stats.t.ppf(0.975, n - 1) * se
    return m, m - h, m + h, 2 * stats.t.sf(abs(m) / se, n - 1)


def test_render_one_primary_endpoint_holm_within_family_one_verdict_word(tmp_path):
    plant(tmp_path / "t")
    out = tmp_path / "STUDY.md"
    res = _render(tmp_path / "t")
    assert res.returncode == 0, res.stderr
    md = out.read_text()
    prim = md.split("### The primary endpoint")[1].split("### Secondary")[0]
    rows = [ln for ln in prim.splitlines() if ln.startswith("| validation CE")]
    assert len(rows) == 3  # one row per kappa, val_ce only: val_bpb is not a second test
    diffs = {0.5: [0.2 + e / 10 for e in NOISE], 1.0: [0.001 + e / 10 for e in NOISE],
             2.0: [0.02 + 4 * e for e in NOISE]}
    ps = [_t(d)[3] for d in diffs.values()]
    order = sorted(range(3), key=ps.__getitem__)  # Holm by hand over the family of 3
    holm, run = [0.0] * 3, 0.0
    for rank, i in enumerate(order):
        run = max(run, min(1.0, (3 - rank) * ps[i]))
        holm[i] = run
    for row, (k, d), ph, word in zip(rows, diffs.items(), holm,
                                     ("worse", "equivalent", "inconclusive"), strict=True):
        m, lo, hi, _ = _t(d)
        assert f"| {m:+.4f} [{lo:+.4f}, {hi:+.4f}] |" in row, (k, row)
        assert f"| {ph:.4f} (m = 3) |" in row and row.rstrip().endswith(f"| {word} |"), row
    assert "val_bpb" not in prim.split("|")[0] and "bits/byte" not in prim
    # the margin in training-token equivalents: the equal-FLOPs arm's 20% more tokens gain 0.15
    assert f"the gain of {100 * 0.03 / 0.15 * 0.2:.1f}% more training tokens" in md
    # the Z-cut is shown once, as the check; no latent is called leaking anywhere
    assert md.count("free_zcut (control)") == 1 and "identical: the check" in md
    assert "leaking" not in md.lower().replace("leaks and is not shown", "")
    # equal FLOPs is secondary, its own Holm family: 0.15 worse is "worse" in every kappa
    sec = md.split("### Secondary endpoints")[1].split("### Descriptive")[0]
    assert sec.count("(equal FLOPs) |") == 3 and sec.count("| worse |") >= 3


def test_render_without_results_says_not_yet_run(tmp_path):
    meta = plant(tmp_path / "t", probe=False)
    (tmp_path / "t" / "per_seed.csv").unlink()
    meta["n_done"] = 0
    (tmp_path / "t" / "study.json").write_text(json.dumps(meta))
    out = tmp_path / "STUDY.md"
    assert _render(tmp_path / "t").returncode == 0
    md = out.read_text()
    assert "**Status: not yet run.**" in md
    assert "not yet run (docs/study/per_seed.csv absent)." in md


def test_render_bad_input_one_line_exit_2_nothing_written(tmp_path):
    out = tmp_path / "STUDY.md"
    res = _render(tmp_path / "nothing")
    assert res.returncode == 2 and not out.exists()
    assert len(res.stderr.strip().splitlines()) == 1 and "study.json" in res.stderr
    plant(tmp_path / "t")
    (tmp_path / "t" / "probe.csv").write_bytes(b"\xff\xfe\x00bad")
    res = _render(tmp_path / "t")
    assert res.returncode == 2 and not out.exists(), res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_committed_study_md_is_rendered_from_committed_tables():
    from analysis.study import render

    assert render(ROOT / "docs" / "study") == (ROOT / "docs" / "STUDY.md").read_text(), \
        "docs/STUDY.md differs from its render: run make study-render"


def test_bad_size_and_name_refused_before_anything(tmp_path, monkeypatch, capsys):
    from pipelines.study import main

    monkeypatch.setenv("FTBENCH_RESULTS", str(tmp_path / "r"))
    for args, word in ((["--size", "huge"], "STUDY_SIZE"), (["--name", "a/b"], "STUDY_NAME"),
                       (["--bench-data", str(tmp_path / "no")], "BENCH_DATA"),
                       (["--jobs", "0"], "--jobs")):
        assert main(["run", *args]) == 2, args
        err = capsys.readouterr().err
        assert word in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "r").exists()


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted((root / "runs").rglob("*")) if p.is_file()}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_study_tiny_end_to_end_then_no_work(tmp_path):
    env = {**os.environ, "FTBENCH_RESULTS": str(tmp_path / "results"),
           "FTBENCH_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1",
           "FTBENCH_ALLOW_DIRTY": "1"}  # a test may run from a working tree under edit
    extra = [] if "mk/study.mk" in (ROOT / "Makefile").read_text() else ["-f", "Makefile",
                                                                          "-f", "mk/study.mk"]
    cmd = ["make", *extra, "-W", ".venv/.setup-stamp", "-o", "setup", "study",
           "STUDY_SIZE=tiny", "STUDY_NAME=t", f"STUDY_DOCS={tmp_path / 'docs' / 'study'}"]
    first = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, check=False)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "[study done" in first.stdout and "ETA of the sweep" in first.stdout
    docs = tmp_path / "docs"
    md = (docs / "STUDY.md").read_text()
    for f in ("table_tokens.csv", "likelihood.csv", "probe.csv", "study.json", "report.html"):
        assert (docs / "study" / f).is_file(), f
    probe = pd.read_csv(docs / "study" / "probe.csv")
    assert len(probe) == 2  # one kappa x two seeds, each probed
    tt = pd.read_csv(docs / "study" / "table_tokens.csv")
    val = tt[(tt["comparison"] == "tokens:baseline") & (tt["task"] == "val")
             & (tt["metric"] == "val_ce") & (tt["arm"] == "free")]
    assert len(val) == 1 and (val["n_seeds"] == 2).all()
    assert "not yet run" not in md.split("## Beside")[0]
    before = _snapshot(tmp_path / "results")
    second = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, check=False)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    # 1 kappa + flops + zcut + baseline, x 2 seeds
    assert "8 cells, 8 done, 0 to run" in second.stdout, second.stdout[-3000:]
    # 2 Free Transformers and 2 Z-cut controls, each at its final and its mid-training
    # evaluation checkpoint
    assert "probes run 0, reused 8, failed 0" in second.stdout
    lat = pd.read_csv(docs / "study" / "latent.csv")
    assert len(lat) == 8 and set(lat["arm"]) == {"free", "free_zcut"}
    assert "report up to date" in second.stdout
    assert _snapshot(tmp_path / "results") == before  # no run file written or touched
    assert (docs / "STUDY.md").read_text() == md


def test_zcut_section_pairs_seeds_and_a_missing_pair_is_missing_not_zero() -> None:
    """The Z-cut control against the baseline, per shared seed; with no shared seed the max is
    missing (NaN) and n is 0, never a 0 difference."""
    from analysis.study import zcut_section

    def rows(*xs):
        return pd.DataFrame([dict(task="val", metric="val_ce", arm=a, seed=s, value=v)
                             for a, s, v in xs])

    none = zcut_section(rows(("free_zcut", 1, 2.0), ("baseline", 0, 2.0)))
    assert math.isnan(none["max"]) and none["n"] == 0 and none["equal"] == 0
    two = zcut_section(rows(("free_zcut", 0, 2.0), ("baseline", 0, 2.0),
                            ("free_zcut", 1, 2.5), ("baseline", 1, 2.25), ("baseline", 2, 9.0)))
    assert two == {"max": 0.25, "equal": 1, "n": 2}
    assert zcut_section(rows(("baseline", 0, 2.0))) is None
