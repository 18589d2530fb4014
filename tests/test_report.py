"""The HTML report (issue 39's first screen included), built once on one fabricated partial
sweep (tests/fake.py: 3 seeds, a pending FT and control, a Z-cut arm, a synthetic result):
self-contained, every section there, rendered in headless Chromium (Debian's `chromium`) with
no broken image, the lead figure and report card inside the first 1000 px at 1400 px wide; the
lead forest, the verdicts in words, the report card and summary.png drawing the tables' own
numbers; the Z-cut control's "identical"; floors and unevaluated rows as one line; the latent
across seeds; signal and noise. The screenshot of the first screen is kept as a test artifact
at $FTBENCH_ARTIFACTS/report.png (default results/test-artifacts/)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fake import write_fake_sweep

from analysis import card, lead, report
from analysis.browser import REQUIRED_SECTIONS, check_report, find_chromium
from analysis.frame import load_sweep
from analysis.render import png
from analysis.report import build_report
from analysis.tables import VIEWS, paper_table
from common.benchmarks import PAPER_METRICS_CHECKED

ARTIFACTS = Path(os.environ.get("FTBENCH_ARTIFACTS", "results/test-artifacts"))
BEFORE_PX = 56_000
"""docs/study/report.html before issue 39, rendered at 1400 px wide: about 56,000 px tall
(57,464 measured in headless Chromium); the report must be at most a third of that."""


def _fake_synthetic(root: Path) -> Path:
    import matplotlib.pyplot as plt

    d = root / "synthetic" / "default"
    d.mkdir(parents=True)
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1], [0, 1])
    (d / "figure.png").write_bytes(png(fig))
    (d / "table.csv").write_text("model,kappa_bits,validity\nbaseline,,0.9\nFT,0.125,0.8\n")
    (d / "acceptance.json").write_text(json.dumps([
        {"check": "1/8 or 1 bit: position agreement higher within groups", "measured": 0.4,
         "result": "pass"},
        {"check": "8 bits: validity well below the baseline's", "measured": None,
         "result": "n/a"}]))
    return d


def _add_zcut(root: Path, name: str) -> None:
    """Give a fabricated sweep a Z-cut arm whose every number is its seed's baseline's (what the
    study measured: with Z cut the model trains the baseline)."""
    man_path = root / "sweeps" / name / "manifest.json"
    man = json.loads(man_path.read_text())
    for c in [c for c in man["cells"] if c["arm"] == "baseline"]:
        rid = ("z" + c["run_id"])[:12]
        shutil.copytree(root / "runs" / c["run_id"], root / "runs" / rid)
        man["cells"].append({**c, "cell": f"free_zcut-H16-s{c['seed']}", "arm": "free_zcut",
                             "kappa_bits": 0.5, "latent_bits": 16, "run_id": rid})
    man_path.write_text(json.dumps(man))


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("lead")
    write_fake_sweep(root, "lead", kappas=(0.5, 2.0), seeds=(0, 1, 2),
                     controls=("baseline_flops",),
                     pending=("free-k0.5-H16-s1", "baseline_flops-H16-s1"),
                     provenance={"*": {"host": "h", "threads": 2, "launcher": "local"}})
    _add_zcut(root, "lead")
    _fake_synthetic(root)
    return root, "lead"


def _analyse(root: Path, name: str) -> tuple:
    data = load_sweep(name, root)
    tables = {v: paper_table(data, v, n_boot=50) for v in VIEWS}
    return data, tables, lead.forest_frame(tables)


@pytest.fixture(scope="module")
def built(sweep):
    return _analyse(*sweep)


@pytest.fixture(scope="module")
def html_path(sweep) -> Path:
    """The one full report of this module (the other sweeps render only the section they test)."""
    return build_report(sweep[1], sweep[0], n_boot=50)


def _first_screen(root: Path, name: str) -> tuple:
    """The lead section alone (what build_report puts first), without the rest of the report."""
    data, tables, forest = _analyse(root, name)
    return data, tables, forest, report._lead_html(data, forest, tables, root)


def test_zcut_identical_to_baseline_reads_identical_with_no_p(built):
    _, _, forest = built
    chk = forest[forest["key"] == "zcut:check"]
    assert len(chk) and (chk["verdict"] == lead.IDENTICAL).all()
    assert (chk["delta"] == 0).all() and chk["p_holm"].isna().all() and chk["lo"].isna().all()
    # FT vs Z-cut is then FT vs baseline, number for number
    # FT vs Z-cut: the tables' comparison (tokens:free_zcut) when they carry it, else lead's own
    zrows = forest["key"].str.startswith("zcut:FT") | (forest["key"] == "tokens:free_zcut")
    z = forest[zrows].set_index(["column", "task", "metric"])
    b = forest[forest["key"] == "tokens:baseline"].set_index(["column", "task", "metric"])
    common = z.index.intersection(b.index)
    assert len(common) >= 4
    assert np.allclose(z.loc[common, "delta"], b.loc[common, "delta"])


def test_verdict_words_and_rounding_rule():
    assert lead.verdict(0.0, math.nan, math.nan, True, False, None) == lead.IDENTICAL
    assert lead.verdict(2e-8, -1e-7, 1.4e-7, False, False, None, 5.3) == lead.ROUNDING
    assert lead.verdict(0.15, 0.14, 0.16, False, True, False) == lead.WORSE
    assert lead.verdict(-0.02, -0.04, -0.001, False, False, None) == lead.HOLM_ONLY
    assert lead.verdict(-0.01, -0.02, 0.01, False, False, None) == lead.NONE_SEEN
    assert lead.verdict(math.nan, math.nan, math.nan, False, False, None) == lead.NO_DATA
    # one seed: an item-level interval leaves the seed variance out: never a verdict
    assert lead.verdict(0.2, 0.1, 0.3, False, True, True, unit="item") == lead.ONE_SEED


def test_forest_numbers_are_the_tables_numbers(built):
    """Every Δ the lead figure draws from a table comparison is that table row's Δ."""
    _, tables, forest = built
    fig, drawn = lead.forest_figure(forest)
    assert fig is not None and drawn
    _check_against_tables(drawn, tables)


def _check_against_tables(drawn: list[dict], tables: dict[str, pd.DataFrame]) -> int:
    both = pd.concat([t for t in tables.values() if len(t)])
    n = 0
    for d in drawn:
        if d["key"].startswith("zcut:"):
            continue
        r = both[(both["comparison"] == d["key"]) & (both["column"] == d["column"])
                 & (both["task"] == d["task"]) & (both["metric"] == d["metric"])]
        assert len(r) == 1, d
        r = r.iloc[0]
        for k, col in (("delta", "delta"), ("lo", "delta_lo"), ("hi", "delta_hi"),
                       ("mde", "mde")):
            assert (math.isnan(d[k]) and math.isnan(r[col])) or d[k] == r[col], (d, k)
        n += 1
    return n


def test_summary_png_draws_the_tables_deltas(built, html_path):
    """summary.png exists beside the report and the Δs it draws equal the tables' (read back
    from the CSVs the report wrote, as a reviewer would)."""
    data, tables, forest = built
    lines = card.facts(data, forest)
    labels = [k for k, _ in lines]
    for want in ("question", "arms", "cells", "data, tokenizer", "tokens, FLOPs per run (mean)",
                 "commit", "hardware", "wall-clock, cost", "headline Δ"):
        assert want in labels
    assert "clean tree" in dict(lines)["commit"]
    fig, drawn = card.summary_figure(lines, forest, "lead")
    assert drawn and _check_against_tables(drawn, tables) >= 4
    out = html_path.parent / "report"
    png = (out / "summary.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    csv = {v: pd.read_csv(out / f"table_{v}.csv", keep_default_na=True) for v in
           ("tokens", "flops")}
    for d in drawn:
        if d["key"].startswith("zcut:"):
            continue
        t = csv[d["key"].split(":")[0]]
        r = t[(t["comparison"] == d["key"]) & (t["column"] == d["column"])
              & (t["task"] == d["task"]) & (t["metric"] == d["metric"])].iloc[0]
        assert math.isclose(d["delta"], r["delta"], rel_tol=1e-12, abs_tol=1e-15)


def test_first_screen_order_and_folds(html_path):
    html = html_path.read_text(encoding="utf-8")
    body = html[html.index("<body>"):]
    ids = re.findall(r'<section id="([^"]+)"', body)
    assert ids[:2] == ["lead", "card"]
    # unevaluated benchmarks: one line per table, never a row per cell
    n_tables = len(re.findall(r"<h3>Equal (tokens|FLOPs)", body)) + 1  # + the claims table
    assert 0 < body.count("not evaluated in this sweep") <= n_tables
    # run-ids live in the appendix; cells link there
    anchors = set(re.findall(r'href="#(ids-[0-9a-f]+)"', body))
    assert anchors and all(f'id="{a}"' in body for a in anchors)
    assert body.index('id="appendix"') > body.index('id="table-flops"')
    assert "What this sweep can and cannot say" in body
    assert "identical" in body[:body.index('id="summary"')]


def test_identically_trained_cells_are_named_with_why(tmp_path, sweep):
    """kappa 2 and 4 trained bit-identical runs when the KL never reached 2 bits (the penalty
    is 0 in both): they are named once for every seed with why, from the runs' own files (the
    first screen prints each note as it is)."""
    write_fake_sweep(tmp_path, "same", kappas=(2.0, 4.0), seeds=(0, 1), controls=())
    man = json.loads((tmp_path / "sweeps" / "same" / "manifest.json").read_text())
    rid = {c["cell"]: c["run_id"] for c in man["cells"]}
    for seed in (0, 1):
        src = tmp_path / "runs" / rid[f"free-k2-H16-s{seed}"] / "metrics.jsonl"
        lines = [json.loads(x) for x in src.read_text().splitlines()]
        for x in lines:  # a latent that stayed under 0.3 bits
            for k in ("kl_bits", "val_kl_bits"):
                if k in x:
                    x[k] = min(x[k], 0.3)
        text = "".join(json.dumps(x) + "\n" for x in lines)
        src.write_text(text)
        (tmp_path / "runs" / rid[f"free-k4-H16-s{seed}"] / "metrics.jsonl").write_text(text)
    notes = lead.identical_runs(load_sweep("same", tmp_path))
    assert len(notes) == 1 and notes[0].startswith(
        "free-k2-H16, free-k4-H16 trained identically in seeds 0, 1 (bit-identical metrics")
    assert "the free-bits penalty was never active" in notes[0]
    assert "peaked at 0.3 bits/token, below kappa 2 and 4" in notes[0]
    first = _first_screen(tmp_path, "same")[3]  # and the lead section shows the note
    assert "Trained identically." in first and "free-k2-H16, free-k4-H16" in first
    root, name = sweep  # Z-cut = baseline: said once, by the Z-cut check (can_cannot)
    assert lead.identical_runs(load_sweep(name, root)) == []


@pytest.mark.parametrize("order", [("k1", "k4", "k2"), ("k2", "k1", "k4"), ("k4", "k2", "k1")])
def test_identical_runs_group_by_connected_components_not_manifest_order(tmp_path, order):
    """k1 ~ k2 and k2 ~ k4 within float32 rounding, k1 and k4 further apart (not transitive):
    a greedy pass in the order k1, k4, k2 split them into {k1, k2} and {k4}; the connected
    components are one chained group in every order."""
    write_fake_sweep(tmp_path, "chain", kappas=(1.0, 2.0, 4.0), seeds=(0,), controls=())
    man_path = tmp_path / "sweeps" / "chain" / "manifest.json"
    man = json.loads(man_path.read_text())
    rid = {c["cell"].split("-")[1]: c["run_id"] for c in man["cells"] if c["arm"] == "free"}
    base = [json.loads(x) for x in
            (tmp_path / "runs" / rid["k1"] / "metrics.jsonl").read_text().splitlines()]
    for k, scale in (("k1", 1.0), ("k2", 1 + 0.8e-6), ("k4", 1 + 1.6e-6)):
        lines = [{**x, **({"ce": x["ce"] * scale} if "ce" in x else {})} for x in base]
        (tmp_path / "runs" / rid[k] / "metrics.jsonl").write_text(
            "".join(json.dumps(x) + "\n" for x in lines))
    cells = {c["cell"].split("-")[1]: c for c in man["cells"] if c["arm"] == "free"}
    man["cells"] = [c for c in man["cells"] if c["arm"] != "free"] + [cells[k] for k in order]
    man_path.write_text(json.dumps(man))
    notes = lead.identical_runs(load_sweep("chain", tmp_path))
    assert len(notes) == 1 and "chained: each run within float32 rounding" in notes[0]
    assert all(f"free-{k}-H16" in notes[0] for k in order)


def test_one_seed_lead_figure_draws_each_run_and_says_why_no_interval(tmp_path):
    write_fake_sweep(tmp_path, "one", kappas=(0.5, 2.0), seeds=(0,), controls=())
    _, tables, _, first = _first_screen(tmp_path, "one")
    fig, drawn = lead.per_run_figure(tables)
    keys = list(dict.fromkeys((d["task"], d["metric"]) for d in drawn))
    assert keys[0] == ("val", "val_ce") and ("val", "val_bpb") not in keys
    t = tables["tokens"]
    for d in drawn:  # each point is its run's value, as the table has it
        r = t[(t["column"] == d["column"]) & (t["task"] == d["task"])
              & (t["metric"] == d["metric"])].iloc[0]
        assert d["value"] == r["mean"] and r["n_seeds"] == 1
    assert {d["column"] for d in drawn} == {"baseline", "FT k=0.5", "FT k=2"}
    assert "each run&#x27;s own value, no interval and no verdict" in first
    assert 'alt="lead figure: each run' in first and "learning curves" in first


def test_floor_rows_are_one_line_and_not_drawn(tmp_path):
    """pass@1 at 0 for every arm: one 'At the floor' line, no table row, no curve panel."""
    write_fake_sweep(tmp_path, "floor", kappas=(0.5,), seeds=(0, 1), controls=(),
                     prob=lambda arm, kappa, h, seed: 0.0)
    data, tables, forest = _analyse(tmp_path, "floor")
    measured, floor = lead.measured_metrics(tables)
    assert ("humaneval_plus", "pass@1_plus") in floor and ("gsm8k", "exact_match") in floor
    assert all(m not in measured for m in floor)
    assert not forest["metric"].isin(["pass@1_plus", "exact_match"]).any()
    t = tables["tokens"]  # the equal-tokens section's tables, as build_report renders them
    sec = "".join(report.table_html(t[t["comparison"] == c], report.RunIndex())
                  for c in dict.fromkeys(t["comparison"]))
    assert "At the floor" in sec and "humaneval_plus (pass@1_plus" not in sec
    cc = lead.can_cannot(data, forest, tables, [])
    assert "humaneval_plus pass@1_plus" in cc and "floor" in cc


def test_signal_noise_per_metric(built):
    data, tables, forest = built
    sn = lead.signal_noise(data, tables, forest)
    assert len(sn) and set(lead.SN_COLS) <= set(sn.columns)
    v = sn[sn["metric"].str.startswith("validation CE")].iloc[0]
    assert v["n_seeds"] == 3 and v["seed_sd"] > 0
    assert math.isclose(v["signal_to_noise"], v["spread_across_arms"] / v["seed_sd"])


@pytest.mark.slow  # figures for 3 runs; test_probe renders latent_section in the fast tier
def test_latent_section_aggregates_seeds(tmp_path):
    from analysis.latent import aggregate, latent_section, per_run

    docs = []
    for seed in range(3):
        d = tmp_path / f"r{seed}" / "eval"
        d.mkdir(parents=True)
        doc = {"schema": "ftbench-probe-v1", "run_id": f"r{seed}", "checkpoint_step": 10,
               "latent_bits": 4, "kappa_bits": 1.0, "n_rows": 8,
               "kl": {"mean_bits_per_token": 1.0 + 0.1 * seed,
                      "per_bit_bits": [0.25, 0.25, 0.25, 0.25 + 0.1 * seed],
                      "per_position_bits": [1.0] * 4, "active_threshold_bits": 0.01},
               "collapse": {"flag": False, "rule": "r"},
               "ablations": {"prior_ce_nats_per_token": 5.0, "modes": {
                   "posterior": {"delta_vs_prior": {"mean": -0.01 * (seed + 1),
                                                    "lo": -0.01 * (seed + 2),
                                                    "hi": -0.01 * seed}},
                   "zeroed": {"delta_vs_prior": {"mean": 0.001, "lo": 0.0, "hi": 0.002}}}},
               "steering": {}, "latent_use": {"recovered_share": 0.01 * (seed + 1) / (
                   (1.0 + 0.1 * seed) * math.log(2))}}
        (d / "probe.aaaaaaaaaaaa.step10.json").write_text(json.dumps(doc))
        docs.append({**doc, "file": "x"})
    agg = aggregate(per_run(docs))
    assert len(agg) == 1 and agg["n_seeds"].iloc[0] == 3
    shares = [0.01 * (s + 1) / ((1.0 + 0.1 * s) * math.log(2)) for s in range(3)]
    assert math.isclose(agg["share"].iloc[0], float(np.mean(shares)))
    html = latent_section([tmp_path / f"r{s}" for s in range(3)], tmp_path / "out")
    assert html.count("<details>") == 4  # one fold holding the three runs' own blocks
    assert (tmp_path / "out" / "probe_by_kappa.csv").is_file()
    top = html[:html.index("<details>")]
    assert top.count("<img") == 1  # one aggregate figure for the one kappa


def test_report_is_self_contained_and_complete(html_path):
    html = html_path.read_text(encoding="utf-8")
    for sec in REQUIRED_SECTIONS:
        assert f'id="{sec}"' in html
    srcs = re.findall(r'<img[^>]*src="([^"]*)"', html)
    # lead forest, learning curves, summary.png, training curves, val CE vs kappa,
    # benchmarks vs kappa, overhead, synthetic figure
    assert len(srcs) == 8 and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert (html_path.parent / "report" / "summary.png").stat().st_size > 10_000
    assert (html_path.parent / "report" / "truncation.csv").is_file()
    assert "run the sweep with EVAL=1 EVAL_POINTS=n" in html  # no points: it says how to get them
    assert not re.search(r'(src|href)="(https?:)?//', html)  # nothing fetched from a network
    # the paper-metric mapping is marked unchecked; the wall-clock overhead says its n and load
    assert ("[paper (unchecked): " in html) != PAPER_METRICS_CHECKED
    # (k=0.5 has 2 seed pairs: its seed 1 is pending; k=2 has 3)
    assert "median over n = 2/3 seed pair(s)" in html and "load was not recorded" in html
    # partial sweep: missing cells say so; the provenance footer has run-ids and checksums
    assert "missing: 1 pending" in html
    foot = html[html.index('id="provenance"'):]
    assert "lm_eval=0.4.13" in foot and "c" * 16 in foot and "f" * 12 in foot
    run_ids = json.loads((html_path.parent / "manifest.json").read_text())["cells"]
    assert all(c["run_id"] in foot for c in run_ids)
    # the synthetic check was turned into claims rows
    claims = (html_path.parent / "report" / "claims.csv").read_text()
    assert "Synthetic task: 1/8 or 1 bit" in claims
    for view in ("tokens", "flops"):
        for ext in ("csv", "md", "tex"):
            assert (html_path.parent / "report" / f"table_{view}.{ext}").stat().st_size > 500


# Where Chromium cannot be installed (make setup installs it as root with apt), the two render
# checks skip with this one reason and everything else still runs; CI installs it.
needs_chromium = pytest.mark.skipif(
    find_chromium() is None,
    reason="no Chromium on this machine: apt-get install chromium (make setup does it as root)")


@needs_chromium
def test_report_renders_in_headless_chromium(html_path, tmp_path):
    shot = tmp_path / "report.png"
    res = check_report(html_path, shot)
    assert res["check"] == "ok", res
    assert res["ok"] and res["broken_images"] == 0 and res["missing_sections"] == []
    assert res["images"] == 8
    # the answer first: the lead figure and the report card on the first screen at 1400 px
    assert 0 <= res["top"]["lead"] < 1000 and 0 <= res["top"]["card"] < 1000, res["top"]
    assert 0 < res["page_height"] < BEFORE_PX / 3, res["page_height"]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, ARTIFACTS / "report.png")


@needs_chromium
def test_chromium_check_catches_a_broken_image(html_path, tmp_path):
    bad = tmp_path / "bad.html"
    html = html_path.read_text(encoding="utf-8")
    html = html.replace('src="data:image/png;base64,', 'src="data:image/png;base64,AAAA', 1)
    bad.write_text(html.replace('id="synthetic"', 'id="synthetic-gone"'), encoding="utf-8")
    res = check_report(bad)
    assert not res["ok"] and res["broken_images"] == 1
    assert res["missing_sections"] == ["synthetic"]


def test_report_on_a_sweep_with_nothing_done(tmp_path):
    write_fake_sweep(tmp_path, "empty", kappas=(0.5,), seeds=(0,), controls=(),
                     pending=("baseline-s0", "free-k0.5-H16-s0"))
    html = build_report("empty", tmp_path, n_boot=50).read_text(encoding="utf-8")
    for sec in REQUIRED_SECTIONS:
        assert f'id="{sec}"' in html
    assert "no training metrics yet" in html and "2 pending" in html
    # no empty plots, each missing figure is a sentence; the one picture is the report card
    # (summary.png: the sweep's question and its 2 pending cells, every report has one)
    assert re.findall(r'<img alt="([^"]*)"', html) == ["report card (summary.png)"]
