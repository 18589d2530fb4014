"""`make study` (pipelines/study.py) and docs/STUDY.md's renderer (analysis/study.py).

The render tests plant tables with unusual values and check every number in the Markdown
against numbers computed here from the planted files (formatting, the perplexity ratio, the
planned MDE and the budget recomputed independently). The end-to-end test runs STUDY_SIZE=tiny
through make twice: the second run must do no work.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from scipy import optimize, stats

ROOT = Path(__file__).resolve().parents[1]
NUM = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?%?")
COLS = ["view", "comparison", "column", "arm", "kappa_bits", "latent_bits", "task", "metric",
        "n_seeds", "mean", "lo", "hi", "delta", "delta_lo", "delta_hi", "p_holm",
        "significant_holm", "better", "mde", "status"]


def _row(comp, col, arm, k, task, metric, n, mean, lo, hi, d=math.nan, dlo=math.nan,
         dhi=math.nan, p=math.nan, sig=False, better=None, mde=math.nan, status=""):
    return dict(zip(COLS, ["tokens", comp, col, arm, k, 8 if arm == "free" else 0, task, metric,
                           n, mean, lo, hi, d, dlo, dhi, p, sig, better, mde, status],
                    strict=True))


def plant(d: Path, probe: bool = True) -> dict:
    """A study's tables with distinctive values; returns what the test checks against."""
    d.mkdir(parents=True)
    meta = {"name": "planted", "size": "full", "preset": "1M", "h": 8, "kappa": "0.5 1 2",
            "seeds": "0 1 2 3 4", "tokens": "1M", "controls": "flops plus1",
            "overrides": "data.val_tokens=16384", "tasks": "gsm8k,humaneval_plus,mbpp_plus",
            "limit": 24, "gen_toks": 48, "eval_points": 3, "likelihood_rows": 8,
            "probe_args": "--rows 8", "mde_target_nats": 0.03, "budget_min": 90.0,
            "bench_data": "benchmarks", "n_cells": 30, "n_done": 30, "n_eval_done": 30,
            "cores": 2, "n_cells_planned": 30}
    (d / "study.json").write_text(json.dumps(meta))
    cells = [{"run_id": f"r{k}s{s}", "arm": "free", "kappa_bits": k, "seed": s}
             for k in (0.5, 1.0) for s in (0, 1)]
    (d / "cells.json").write_text(json.dumps(cells))
    c = "tokens:baseline"
    rows = [
        _row(c, "baseline", "baseline", math.nan, "val", "val_ce", 5, 4.31717, 4.30101, 4.33333),
        _row(c, "FT k=0.5", "free", 0.5, "val", "val_ce", 5, 4.52913, 4.50001, 4.55557,
             0.21196, 0.19871, 0.22519, 0.00021, True, False, 0.02231),
        _row(c, "FT k=1", "free", 1.0, "val", "val_ce", 5, 4.32581, 4.29999, 4.35163,
             0.00864, -0.01357, 0.03086, 0.41337, False, None, 0.02877),
        _row(c, "FT k=2", "free", 2.0, "val", "val_ce", 3, 4.39447, 4.37771, 4.41123,
             0.0773, 0.05123, 0.10337, 0.01119, True, False, 0.04412,
             status="missing: 2 of 5 seeds failed"),
        _row(c, "FT k=1", "free", 1.0, "gsm8k_gold_bpb", "gold_bpb", 5, 2.71113, 2.6, 2.8,
             -0.01011, -0.05555, 0.03533, 0.6, False, None, 0.06666),
        _row(c, "baseline", "baseline", math.nan, "humaneval_plus", "pass@1", 5, 0, 0, 0),
        _row(c, "FT k=1", "free", 1.0, "humaneval_plus", "pass@1", 5, 0, 0, 0),
        _row(c, "FT k=0.5", "free", 0.5, "mbpp_plus_gold_bpb", "gold_bpb", 0, math.nan,
             math.nan, math.nan, status="missing: every evaluation failed (null, not 0)"),
    ]
    c3 = "tokens:baseline:controls"  # the control against the baseline, paired by seed:
    # its interval excludes 0 while Holm does not reject (the verdict must say so)
    rows.append(_row(c3, "baseline", "baseline", math.nan, "val", "val_ce", 5, 4.31717, 4.30101,
                     4.33333))
    rows.append(_row(c3, "baseline_plus1", "baseline_plus1", math.nan, "val", "val_ce", 5,
                     4.30303, 4.29, 4.31, -0.01414, -0.02121, -0.00707, 0.06061, False, None,
                     0.01919))
    c2 = "tokens:baseline_plus1"  # the same FT columns against the control: other deltas
    rows.append(_row(c2, "baseline_plus1", "baseline_plus1", math.nan, "val", "val_ce", 5,
                     4.30303, 4.29, 4.31))
    rows.append(_row(c2, "FT k=0.5", "free", 0.5, "val", "val_ce", 5, 4.52913, 4.50001,
                     4.55557, 0.2261, 0.2122, 0.2399, 0.0001, True, False, 0.09999))
    pd.DataFrame(rows).to_csv(d / "table_tokens.csv", index=False)
    if probe:
        pd.DataFrame([{"run_id": f"r{k}s{s}", "kappa_bits": k, "kl_bits": kl, "n_active": na,
                       "collapse": col, "latent_unused": False}
                      for k, s, kl, na, col in [(0.5, 0, 1.73117, 7, True), (0.5, 1, 0.51234, 3,
                                                                               False),
                                                (1.0, 0, 0.98765, 3, False),
                                                (1.0, 1, 1.0202, 4, None)]]
                     ).to_csv(d / "probe.csv", index=False)
    pd.DataFrame([{"column": "FT k=1 H=8", "seed": 0, "n_tokens": 2048, "baseline_bpb": 2.53331,
                   "free_bpb_kmax": 2.61117, "gap_k": 64, "gap_nats_per_token": 0.18773,
                   "tightest": "iwae_k64", "tightest_gap_nats_per_token": 0.17171,
                   "kl_nats_per_token": 0.69993, "posterior_ce_leaking": 4.01},
                  {"column": "FT k=1 H=8", "seed": 1, "n_tokens": 2048,
                   "tightest": "not comparable: rows differ"}]).to_csv(d / "likelihood.csv",
                                                                       index=False)
    pd.DataFrame([{"quantity": "step_s_1M_baseline", "value": 0.41321, "unit": "s",
                   "note": "measured"},
                  {"quantity": "pilot_sd_val_ce", "value": 0.00717, "unit": "nats/token",
                   "note": "3 seeds"},
                  {"quantity": "flops_per_token_baseline", "value": 7.86e6, "unit": "FLOP",
                   "note": "dry run"},
                  {"quantity": "quiet_tokens_per_s_baseline", "value": 10271, "unit": "1/s",
                   "note": "measured"},
                  {"quantity": "sweep_total_flops", "value": 2.78e14, "unit": "FLOP",
                   "note": "dry run"}]).to_csv(d / "sizing.csv", index=False)
    shutil.copyfile(ROOT / "docs" / "study" / "bryanvine.csv", d / "bryanvine.csv")
    return meta


def _render(tables: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "analysis.study", "render", "--tables",
                           str(tables), "--out", str(out)], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)


def _allowed(d: Path, meta: dict) -> set[str]:
    """Every string a number in the Markdown may be, computed from the planted files."""
    ok: set[str] = set()
    for p in d.iterdir():
        text = p.read_text()
        ok |= set(NUM.findall(text))  # numbers inside text cells (their figures, settings)
        for tok in NUM.findall(text):
            v = float(tok.rstrip("%"))
            ok |= {f"{v:.4f}", f"{v:+.4f}", f"{v:g}", str(int(v)) if v == int(v) else "",
                   *NUM.findall(f"{v:.4g}")}
    tt = pd.read_csv(d / "table_tokens.csv") if (d / "table_tokens.csv").is_file() else \
        pd.DataFrame({"delta": []})
    for dlt in tt["delta"].dropna():  # perplexity ratio, recomputed
        ok.add(f"{100 * (math.exp(dlt) - 1):+.1f}%")
    n = len(meta["seeds"].split())  # planned MDE: noncentral t, solved here
    c = stats.t.ppf(0.975, n - 1)
    lam = optimize.brentq(lambda x: stats.nct.sf(c, n - 1, x) - 0.8, 0.1, 50)
    ok |= {str(n), f"{lam * math.sqrt(2) * 0.00717 / math.sqrt(n):.4f}"}
    ok.add(f"{meta['budget_min'] * meta['cores'] / meta['n_cells_planned']:.4f}")
    ok.add(f"{2.78e14 / (7.86e6 * 10271) / meta['cores'] / 60:.4f}")
    ok |= {"95%", "5%", "80%"}  # the report's stated level and power (analysis/stats.py)
    ok |= {"90%", "0.05", "0.01"}  # the TOST interval, ALPHA, the active-bit threshold
    if "arm" in tt:  # the best-kappa row: the span of the planted FT means
        m = tt[(tt["arm"] == "free") & (tt["comparison"] == "tokens:baseline")
               & (tt["task"] == "val")]["mean"]
        ok.add(f"{m.max() - m.min():.4f}")
    return ok - {""}


def test_render_every_number_comes_from_the_tables(tmp_path):
    meta = plant(tmp_path / "t")
    out = tmp_path / "STUDY.md"
    res = _render(tmp_path / "t", out)
    assert res.returncode == 0, res.stderr
    md = out.read_text()
    nums = NUM.findall(md)
    assert len(nums) > 60, nums  # the check below is not vacuous
    stray = sorted(set(nums) - _allowed(tmp_path / "t", meta))
    assert not stray, stray
    # each row carries its own numbers (no mixing of columns or kappas)
    assert "| FT k=1 | 4.3258 [4.3000, 4.3516] | 5 | +0.0086 [-0.0136, +0.0309] | 0.4134 | " \
           "0.0288 |  | inconclusive (the interval includes 0) |" in md
    assert "| FT k=2 | 4.3945 [4.3777, 4.4112] | 3 (missing: 2 of 5 seeds failed) | " in md
    assert "| FT k=0.5 | 4.5291 [4.5000, 4.5556] | 5 | +0.2120 [+0.1987, +0.2252] | 0.0002 | " \
           "0.0223 |  | worse |" in md
    # an interval that excludes 0 without a Holm rejection says why it is inconclusive
    assert "| baseline_plus1 | 4.3030 [4.2900, 4.3100] | 5 | -0.0141 [-0.0212, -0.0071] | " \
           "0.0606 | 0.0192 |  | inconclusive: the interval excludes 0 but Holm p 0.0606 is not " \
           "under 0.05 |" in md
    # MDE: the largest of the FT rows, judged against the target
    assert "is 0.0441 against the target 0.0300: NOT met" in md
    assert "one job per core, is 28.6965 wall minutes" in md
    # pass@1 at the floor is not compared; a missing cell is named, never 0
    assert "humaneval_plus (pass@1) | every column | at the floor" in md
    assert "missing: every evaluation failed (null, not 0)" in md
    assert "mbpp_plus_gold_bpb (gold_bpb) | FT k=0.5 | 0.0000" not in md
    # the likelihood bound, per run; the leaking posterior CE never shown
    assert "| FT k=1 H=8 | 0 | 2048 | 2.5333 | 2.6112 | 64 | +0.1877 | iwae_k64 | +0.1717 | " \
           "0.6999 |" in md
    assert "| FT k=1 H=8 | 1 |  |  |  |  |  | not comparable: rows differ |  |  |" in md
    assert "4.0100" not in md
    # the probe: the leak (collapse in the paper's sense) counted per kappa over the seeds
    # with a known flag; no latent.csv: the decoder-side section says it has not run
    assert "- kappa 0.5: 1 of 2 seeds leak (collapse in the paper's sense)." in md
    assert "- kappa 1: 0 of 1 seeds leak (collapse in the paper's sense)." in md
    assert "not yet run (docs/study/latent.csv absent)." in md
    # beside bryanvine: theirs stated as theirs, ours computed from our table
    assert "about 0.19 nats/token worse" in md
    assert f"kappa 0.5: {100 * math.expm1(0.21196):+.1f}%" in md
    assert "paired Δ (control minus baseline, 5 seeds) -0.0141 [-0.0212, -0.0071] nats/token" \
           in md
    # the control's comparison never leaks into the FT-vs-baseline figures or the MDE
    assert "+0.2261" not in md.split("## What the data")[1]
    assert "0.1000" not in md.split("## What the data")[1].split("## The latent")[0]
    assert "lowest mean at kappa 1 (4.3258 nats/token; the means span 0.2033, the largest MDE " \
           "is 0.0441): a ranking of means, not a test" in md
    # no equal-FLOPs table planted: said, not invented
    assert "### Equal FLOPs\n\nnot yet run" in md


def test_render_without_results_says_not_yet_run(tmp_path):
    meta = plant(tmp_path / "t", probe=False)
    (tmp_path / "t" / "table_tokens.csv").unlink()
    meta["n_done"] = 0
    (tmp_path / "t" / "study.json").write_text(json.dumps(meta))
    out = tmp_path / "STUDY.md"
    assert _render(tmp_path / "t", out).returncode == 0
    md = out.read_text()
    assert "**Status: not yet run.**" in md
    for key in ("latent cost", "perplexity", "13-layer", "collapse", "best kappa"):
        line = next(ln for ln in md.splitlines() if key in ln and ln.startswith("|"))
        assert line.rstrip().endswith("| not yet run |"), line
    stray = sorted(set(NUM.findall(md)) - _allowed(tmp_path / "t", meta))
    assert not stray, stray


def test_render_bad_input_one_line_exit_2_nothing_written(tmp_path):
    out = tmp_path / "STUDY.md"
    res = _render(tmp_path / "nothing", out)
    assert res.returncode == 2 and not out.exists()
    assert len(res.stderr.strip().splitlines()) == 1 and "study.json" in res.stderr
    plant(tmp_path / "t")
    (tmp_path / "t" / "probe.csv").write_bytes(b"\xff\xfe\x00bad")
    res = _render(tmp_path / "t", out)
    assert res.returncode == 2 and not out.exists(), res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_committed_study_md_is_rendered_from_committed_tables(tmp_path):
    out = tmp_path / "STUDY.md"
    assert _render(ROOT / "docs" / "study", out).returncode == 0
    assert out.read_text() == (ROOT / "docs" / "STUDY.md").read_text(), \
        "docs/STUDY.md differs from its render: run make study-render"


def test_bad_size_and_name_refused_before_anything(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FTBENCH_RESULTS": str(tmp_path / "r")}
    for args, word in ((["--size", "huge"], "STUDY_SIZE"), (["--name", "a/b"], "STUDY_NAME"),
                       (["--bench-data", str(tmp_path / "no")], "BENCH_DATA"),
                       (["--jobs", "0"], "--jobs")):
        res = subprocess.run([sys.executable, "-m", "pipelines.study", "run", *args],
                             cwd=ROOT, capture_output=True, text=True, env=env, check=False)
        assert res.returncode == 2 and word in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1
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
    assert len(probe) == 6  # three kappas x two seeds, each probed
    tt = pd.read_csv(docs / "study" / "table_tokens.csv")
    val = tt[(tt["comparison"] == "tokens:baseline") & (tt["task"] == "val")
             & (tt["metric"] == "val_ce") & (tt["arm"] == "free")]
    assert len(val) == 3 and (val["n_seeds"] == 2).all()
    assert "not yet run" not in md.split("## Beside")[0]
    before = _snapshot(tmp_path / "results")
    second = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, check=False)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    # 3 kappas + flops + plus1 + zcut + baseline, x 2 seeds
    assert "14 cells, 14 done, 0 to run" in second.stdout, second.stdout[-3000:]
    # 6 Free Transformers and 2 Z-cut controls, each at its final and its mid-training
    # evaluation checkpoint
    assert "probes run 0, reused 16, failed 0" in second.stdout
    lat = pd.read_csv(docs / "study" / "latent.csv")
    assert len(lat) == 16 and set(lat["arm"]) == {"free", "free_zcut"}
    assert "report up to date" in second.stdout
    assert _snapshot(tmp_path / "results") == before  # no run file written or touched
    assert (docs / "STUDY.md").read_text() == md
