"""analysis/: frame builder, intervals, paired bootstrap and tables on fabricated result files
whose answers are known (computed here directly from the files)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from fake import spec_id, write_fake_sweep
from scipy import stats

from analysis.claims import checklist, leak_table
from analysis.frame import load_sweep
from analysis.stats import clopper_pearson, mean_ci, paired_matrix
from analysis.tables import cell_text, paper_table, to_latex, to_markdown, wide

N_BOOT = 300


def _items_from_files(root, run_id: str, task: str, key: str) -> list[float]:
    ev = json.loads((root / "runs" / run_id / "eval" / "lm-eval.json").read_text())
    return [float(it[key]) for it in ev["tasks"][task]["items"]]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    write_fake_sweep(root, "fake", pending=("free-k2-H16-s1",), controls=())
    return root, load_sweep("fake", root)


@pytest.fixture(scope="module")
def tables(sweep):
    _, data = sweep
    return {v: paper_table(data, v, n_boot=N_BOOT) for v in ("tokens", "flops")}


# ---- intervals -------------------------------------------------------------------------------

def test_clopper_pearson_and_mean_ci_known_values():
    lo, hi = clopper_pearson(0, 20)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** (1 / 20), rel=1e-9)  # 0.1684
    m, lo, hi = mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0 and hi - m == pytest.approx(4.302652729911275 * 1 / math.sqrt(3))
    assert math.isnan(mean_ci([1.0])[1]) and math.isnan(mean_ci([])[0])


# ---- pairing ---------------------------------------------------------------------------------

def test_pairing_is_by_seed_and_doc_id_not_by_order():
    t = pd.DataFrame({"seed": [1, 0, 0, 0, 1, 1, 2], "doc_id": [5, 5, 3, 9, 3, 9, 3],
                      "value": [1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0]})
    r = pd.DataFrame({"seed": [0, 0, 1, 1, 0], "doc_id": [3, 5, 3, 5, 7],
                      "value": [1.0, 0.0, 0.0, 0.0, 1.0]})
    d, seeds, docs = paired_matrix(t.sample(frac=1, random_state=0), r)
    assert seeds == [0, 1] and docs == [3, 5]  # seed 2 and docs 7, 9 are unpaired
    np.testing.assert_array_equal(d, [[-1.0, 1.0], [1.0, 1.0]])


# ---- frame builder ---------------------------------------------------------------------------

def test_frame_builder_reads_known_values(sweep):
    root, data = sweep
    c = data.cells.set_index("cell")
    assert len(c) == 8 and c.loc["free-k2-H16-s1", "state"] == "pending"
    assert not c.loc["free-k2-H16-s1", "has_config"]
    assert c.loc["free-k0.5-H16-s0", "flops_overhead"] == pytest.approx(0.3)
    assert c.loc["baseline-s0", "final_tokens"] == 100000
    s = data.scores
    rid = c.loc["free-k0.5-H16-s1", "run_id"]
    row = s[(s["run_id"] == rid) & (s["task"] == "humaneval_plus")
            & (s["metric"] == "pass@1_plus")]
    assert len(row) == 1 and bool(row["primary"].iloc[0])
    assert row["value"].iloc[0] == pytest.approx(
        np.mean(_items_from_files(root, rid, "humaneval_plus", "plus")))
    # the pending cell has no scores and no items; no zeros were made up for it
    pending = c.loc["free-k2-H16-s1", "run_id"]
    assert not (s["run_id"] == pending).any() and not (data.items["run_id"] == pending).any()
    # the last val line is in the tidy frame
    v = s[(s["source"] == "val") & (s["metric"] == "val_ce_posterior")]
    assert set(v["arm"]) == {"free"} and len(v) == 5
    it = data.items[(data.items["run_id"] == rid) & (data.items["metric"] == "pass@1_plus")]
    assert len(it) == 40


def test_null_is_nan_never_zero(tmp_path):
    write_fake_sweep(tmp_path, "n", kappas=(0.5,), seeds=(0,), controls=())
    data = load_sweep("n", tmp_path)
    rid = data.cells.set_index("cell").loc["free-k0.5-H16-s0", "run_id"]
    p = tmp_path / "runs" / rid / "eval" / "lm-eval.json"
    ev = json.loads(p.read_text())
    ev["tasks"]["gsm8k"]["metrics"]["exact_match"]["value"] = None
    ev["tasks"]["gsm8k"]["items"] = []
    p.write_text(json.dumps(ev))
    s = load_sweep("n", tmp_path).scores
    v = s[(s["run_id"] == rid) & (s["metric"] == "exact_match")]["value"]
    assert len(v) == 1 and math.isnan(v.iloc[0])
    t = paper_table(load_sweep("n", tmp_path), "tokens", n_boot=50)
    cell = t[(t["task"] == "gsm8k") & (t["arm"] == "free")].iloc[0]
    # the file holds the task with a null value: the cell says so (was "not evaluated", which
    # hid that the file exists and recorded nothing)
    assert cell["n_seeds"] == 0 and "null value in the eval file" in cell["status"]


# ---- tables ----------------------------------------------------------------------------------

def test_table_cells_match_direct_computation(sweep, tables):
    """Updated for issue 11: with >= 2 seeds every cell and every Δ uses the seed as the unit
    (t over seed means; paired t over per-seed differences), pass@1 included; Clopper-Pearson
    only for a single seed, labelled so. (The old test pinned pooled Wilson / Clopper-Pearson
    over 2 seeds and the two-level bootstrap, which ignore or mis-weigh seed variance.)"""
    root, data = sweep
    t = tables["tokens"]
    c = data.cells.set_index("cell")

    def items(cell, task, key):
        return np.array(_items_from_files(root, c.loc[cell, "run_id"], task, key))

    # FT k=0.5 gsm8k: mean over seeds of the per-seed accuracy, t interval over the 2 seeds
    f = [items(f"free-k0.5-H16-s{s}", "gsm8k", "exact_match") for s in (0, 1)]
    row = t[(t["task"] == "gsm8k") & (t["column"] == "FT k=0.5")].iloc[0]
    means = [x.mean() for x in f]
    assert row["mean"] == pytest.approx(np.mean(means))
    m, lo, hi = mean_ci(means)
    assert (row["lo"], row["hi"]) == pytest.approx((max(lo, 0.0), min(hi, 1.0)))
    assert row["ci_method"] == "t over 2 seeds" and row["n_seeds"] == 2
    assert row["n_items"] == 100
    # its Δ: the paired t over the per-seed mean differences, exactly scipy's one-sample t-test
    b = [items(f"baseline-s{s}", "gsm8k", "exact_match") for s in (0, 1)]
    d = (np.stack(f) - np.stack(b)).mean(axis=1)
    assert row["delta"] == pytest.approx(d.mean())
    assert row["p"] == pytest.approx(stats.ttest_1samp(d, 0.0).pvalue)
    half = stats.t.ppf(0.975, 1) * d.std(ddof=1) / math.sqrt(2)
    assert row["delta_lo"] == pytest.approx(max(d.mean() - half, -1.0))
    assert row["delta_hi"] == pytest.approx(min(d.mean() + half, 1.0))
    assert row["delta_unit"] == "seed" and row["significant"] == (
        row["delta_lo"] > 0 or row["delta_hi"] < 0)
    # pass@1 with 2 seeds: the seed is the unit too (no pooled Clopper-Pearson)
    for col in ("baseline", "FT k=0.5", "FT k=4"):
        row = t[(t["task"] == "humaneval_plus") & (t["column"] == col)].iloc[0]
        assert row["ci_method"] in ("t over 2 seeds", "no variation: n too small")
    # a column with one seed (FT k=2: seed 1 pending): Clopper-Pearson over its items, labelled
    h = items("free-k2-H16-s0", "humaneval_plus", "plus")
    row = t[(t["task"] == "humaneval_plus") & (t["column"] == "FT k=2")].iloc[0]
    assert row["ci_method"] == "clopper-pearson (one seed: items only)"
    assert (row["lo"], row["hi"]) == pytest.approx(clopper_pearson(int(h.sum()), h.size))
    # every interval lies inside the metric's range
    rates = t[t["metric"].isin(["exact_match", "acc", "pass@1_plus"]) & t["lo"].notna()]
    assert ((rates["lo"] >= 0) & (rates["hi"] <= 1)).all()
    dl = t[t["delta_lo"].notna() & t["metric"].isin(["exact_match", "acc", "pass@1_plus"])]
    assert ((dl["delta_lo"] >= -1) & (dl["delta_hi"] <= 1)).all()
    # the lower-is-better gold bpb row keeps its direction
    row = t[(t["task"] == "gsm8k_gold_bpb") & (t["column"] == "FT k=4")].iloc[0]
    assert not row["higher_is_better"]


def test_partial_sweep_cells_say_missing(sweep, tables):
    _, data = sweep
    t = tables["tokens"]
    row = t[(t["task"] == "gsm8k") & (t["column"] == "FT k=2")].iloc[0]
    # one seed done, one pending: the number uses the seed it has and says the other is missing
    assert row["n_seeds"] == 1 and row["n_seeds_expected"] == 2
    assert row["status"] == "missing: 1 pending"
    w = wide(t)
    # the fake writes gsm8k's unfiltered exact_match, not the row's stock strict-match: the
    # primary metric stands in, and the label says so next to the paper's metric
    txt = w.loc[w["benchmark"] == "GSM8K: gsm8k (exact_match) [paper: em; ours is a stand-in]",
                "FT k=2"].iloc[0]
    assert "(1/2 seeds; missing: 1 pending)" in txt
    # benchmarks nobody evaluated, and the paper's row this suite cannot run
    assert (w.loc[w["benchmark"] == "MMLU: mmlu [paper: macro_avg/acc_char; ours is a "
                                    "stand-in]", "baseline"] == "not evaluated in this sweep"
            ).all()
    assert (w.loc[w["group"] == "Culture", "baseline"] == "not evaluated in this sweep").all()
    race_m = w.loc[w["benchmark"].str.startswith("RACE-middle"), "baseline"]
    assert len(race_m) == 1 and race_m.iloc[0].startswith("not in this suite: lm-eval has no")
    # the equal-FLOPs view without its control arm says so instead of comparing with anything
    tf = tables["flops"]
    ref = tf[(tf["task"] == "gsm8k") & (tf["column"] == "baseline_flops")].iloc[0]
    assert ref["status"] == "missing: no baseline_flops control arm in this sweep"
    assert tf["delta"].isna().all()
    md = to_markdown(tf)
    assert "no baseline_flops control arm" in md and "| 0.000 |" not in md
    tex = to_latex(tf)
    assert r"\begin{tabular}" in tex and "baseline\\_flops" in tex


def test_equal_flops_view_uses_the_control_arm(tmp_path):
    write_fake_sweep(tmp_path, "f", kappas=(0.5,), seeds=(0, 1), controls=("baseline_flops",))
    data = load_sweep("f", tmp_path)
    tf = paper_table(data, "flops", n_boot=N_BOOT)
    g = tf[tf["task"] == "gsm8k"].set_index("column")
    assert list(g.index) == ["baseline_flops", "FT k=0.5"]
    c = data.cells.set_index("cell")
    f = np.stack([_items_from_files(tmp_path, c.loc[f"free-k0.5-H16-s{s}", "run_id"], "gsm8k",
                                    "exact_match") for s in (0, 1)])
    r = np.stack([_items_from_files(tmp_path, c.loc[f"baseline_flops-H16-s{s}", "run_id"], "gsm8k",
                                    "exact_match") for s in (0, 1)])
    assert g.loc["FT k=0.5", "delta"] == pytest.approx((f - r).mean())


# ---- claims ----------------------------------------------------------------------------------

def test_claims_verdicts_on_known_data(sweep, tables):
    _, data = sweep
    ct = leak_table(data).set_index("kappa_bits")
    assert bool(ct.loc[4.0, "leaking"]) and not bool(ct.loc[0.5, "leaking"])
    cl = checklist(data, tables).set_index("claim")
    got = {k[:60]: v for k, v in cl["verdict"].items()}
    assert set(cl["verdict"]) <= {"supported", "contradicted", "inconclusive"}
    collapse = [v for k, v in got.items() if k.startswith("At kappa = 4 bits")]
    assert collapse == ["supported"]
    # fabricated overhead 30% vs 1/L = 25%: within a factor 1.5 -> supported
    flops = [v for k, v in got.items() if "FLOPs (analytic" in k or "about 1/L: FLOPs" in k]
    assert flops == ["supported"]
    mbpp = cl[cl.index.str.contains("on MBPP")]
    assert (mbpp["verdict"] == "inconclusive").all()  # not evaluated
    # no synthetic results in this sweep: said as such, never "not run" (it may have run
    # elsewhere: docs/SYNTHETIC.md judges the committed one)
    syn = cl.loc[cl.index.str.startswith("Synthetic"), "evidence"].iloc[0]
    assert syn.startswith("no synthetic experiment among this report's results")
    assert "not run" not in syn


def test_eval_file_choice_posterior_and_subtasks(tmp_path):
    """A LIMIT run never shadows the full one; posterior scores stay out of the tables; MMLU
    items are paired by (subtask, doc_id)."""
    write_fake_sweep(tmp_path, "e", kappas=(0.5,), seeds=(0,), controls=())
    rid = load_sweep("e", tmp_path).cells.set_index("cell").loc["free-k0.5-H16-s0", "run_id"]
    ed = tmp_path / "runs" / rid / "eval"
    full = json.loads((ed / "lm-eval.json").read_text())
    mmlu = {"primary": "acc", "higher_is_better": True, "n": 4, "fewshot": 0,
            "metrics": {"acc": {"value": 0.5, "stderr": 0.3, "n": 4}},
            "items": [{"doc_id": 0, "subtask": "mmlu_a", "acc": 1.0},
                      {"doc_id": 1, "subtask": "mmlu_a", "acc": 0.0},
                      {"doc_id": 0, "subtask": "mmlu_b", "acc": 1.0},
                      {"doc_id": 1, "subtask": "mmlu_b", "acc": 0.0}]}
    full["tasks"]["mmlu"] = mmlu
    (ed / "lm-eval.json").write_text(json.dumps(full))
    lim = json.loads(json.dumps(full)) | {"limit": 5}
    lim["tasks"]["gsm8k"]["metrics"]["exact_match"]["value"] = 0.99
    (ed / "lm-eval.limit5.json").write_text(json.dumps(lim))
    post = json.loads(json.dumps(full)) | {"z_mode": "posterior", "leaks": True}
    post["tasks"]["gsm8k"]["metrics"]["exact_match"]["value"] = 0.98
    (ed / "lm-eval.posterior.json").write_text(json.dumps(post))
    data = load_sweep("e", tmp_path)
    s = data.scores[(data.scores["run_id"] == rid) & (data.scores["metric"] == "exact_match")]
    assert sorted(s["value"].round(2)) == sorted([round(full["tasks"]["gsm8k"]["metrics"][
        "exact_match"]["value"], 2), 0.98])  # the limit5 file is shadowed
    assert s.set_index("z_mode").loc["posterior", "leaks"]
    t = paper_table(data, "tokens", n_boot=50)
    g = t[(t["task"] == "gsm8k") & (t["arm"] == "free")].iloc[0]
    assert g["mean"] == pytest.approx(full["tasks"]["gsm8k"]["metrics"]["exact_match"]["value"])
    it = data.items[(data.items["task"] == "mmlu") & (data.items["z_mode"] == "prior")]
    assert sorted(it["doc_id"]) == ["mmlu_a/0", "mmlu_a/1", "mmlu_b/0", "mmlu_b/1"]
    m = t[(t["task"] == "mmlu") & (t["arm"] == "free")].iloc[0]
    assert m["mean"] == 0.5 and m["n_items"] == 4
    assert m["ci_method"] == "clopper-pearson (one seed: items only)"  # was a pooled Wilson


# ---- issue 11: statistics that hold under the null ------------------------------------------

def _claim_table(p: list[float], deltas: list[float], n_seeds: int = 3) -> pd.DataFrame:
    """A long table as tables.paper_table writes it: baseline + one FT per kappa on gsm8k."""
    rows = [{"view": "tokens", "comparison": "tokens:baseline", "reference": "baseline",
             "group": "g", "task": "gsm8k", "metric": "exact_match", "higher_is_better": True,
             "column": "baseline", "arm": "baseline", "kappa_bits": math.nan, "n_seeds": n_seeds,
             "n_items": 100, "mean": 0.3, "status": "", "run_ids": "r0", "delta": math.nan,
             "significant": False, "better": None}]
    for k, (pv, d) in enumerate(zip(p, deltas, strict=True)):
        half = 0.5 * abs(d)  # a CI that excludes 0 exactly when p < 0.05
        lo, hi = (d - half, d + half) if pv < 0.05 else (d - 2 * abs(d), d + 2 * abs(d))
        rows.append({**rows[0], "column": f"FT k={2.0 ** (k - 3):g}", "arm": "free",
                     "kappa_bits": 2.0 ** (k - 3), "mean": 0.3 + d, "delta": d,
                     "delta_lo": lo, "delta_hi": hi, "p": pv, "significant": pv < 0.05,
                     "better": (d > 0) if pv < 0.05 else None, "delta_unit": "seed",
                     "delta_n_seeds": n_seeds, "degenerate": False, "mde": 0.1,
                     "run_ids": f"r{k + 1}"})
    return pd.DataFrame(rows)


def test_verdict_is_holm_corrected_across_kappas():
    """Four kappas <= 2, one with p = 0.03: the old rule called it 'supported' (any kappa
    significant, no correction); Holm makes it 0.12 -> inconclusive. p = 0.004 survives."""
    from analysis.claims import _benchmark_claim

    weak = _benchmark_claim(_claim_table([0.03, 0.2, 0.5, 0.7], [0.05, 0.01, 0.0, -0.01]),
                            "gsm8k", "GSM8K", "tokens")
    assert weak["verdict"] == "inconclusive"
    from analysis.stats import holm

    np.testing.assert_allclose(holm([0.03, 0.2, 0.5, 0.7]), [0.12, 0.6, 1.0, 1.0])
    np.testing.assert_allclose(holm([0.01, 0.04, math.nan, 0.03]), [0.03, 0.06, math.nan, 0.06])
    assert "p=0.030 Holm=0.120" in weak["evidence"] and "MDE 0.100" in weak["evidence"]
    strong = _benchmark_claim(_claim_table([0.004, 0.2, 0.5, 0.7], [0.05, 0.01, 0.0, -0.01]),
                              "gsm8k", "GSM8K", "tokens")
    assert strong["verdict"] == "supported" and "Holm" in strong["evidence"]
    one = _benchmark_claim(_claim_table([0.001] * 4, [0.05] * 4, n_seeds=1), "gsm8k", "GSM8K",
                           "tokens")
    assert one["verdict"] == "inconclusive"


def test_seed_level_intervals_stay_in_range_and_use_the_seed():
    """Old: 3 seeds of a 0/1 metric gave a t interval outside [0, 1] (0.333 [-0.384, 1.050]);
    2 seeds pooled the items (Wilson) and ignored seed-to-seed variance."""
    from analysis.stats import cell_interval

    ci = cell_interval([0.0, 0.333, 0.667], np.r_[np.zeros(10), np.ones(20)], "exact_match")
    assert ci.lo == 0.0 and ci.hi <= 1.0 and ci.method == "t over 3 seeds"
    # 2 seeds far apart: the seed-level interval is wide, an interval over pooled items narrow
    items = np.r_[np.ones(90), np.zeros(110)]
    ci2 = cell_interval([0.2, 0.7], items, "acc")
    lo_w, hi_w = clopper_pearson(90, 200)
    assert ci2.hi - ci2.lo > 3 * (hi_w - lo_w) and ci2.method == "t over 2 seeds"
    tie = cell_interval([0.0, 0.0, 0.0], np.zeros(30), "pass@1_plus")
    assert tie.degenerate and math.isnan(tie.lo) and "no variation" in tie.method
    assert cell_interval([0.0], np.zeros(30), "pass@1_plus").method.startswith("clopper-pearson")


def test_seed_is_the_unit_for_the_delta(tmp_path):
    """A seed effect common to every item of a run: pooling items makes it look certain; the
    seed-level Δ does not (old: two-level bootstrap with 3 seeds, far too narrow here)."""
    rng = np.random.default_rng(0)
    rows_t, rows_r = [], []
    for s in range(3):
        shift = [0.3, -0.25, 0.0][s]  # seed-to-seed swing of the FT, mean ~0
        for i in range(400):
            rows_t.append({"seed": s, "doc_id": i, "value": float(rng.random() < 0.4 + shift)})
            rows_r.append({"seed": s, "doc_id": i, "value": float(rng.random() < 0.38)})
    from analysis.stats import paired_delta

    d = paired_delta(pd.DataFrame(rows_t), pd.DataFrame(rows_r), "acc")
    per_seed = (pd.DataFrame(rows_t).groupby("seed")["value"].mean()
                - pd.DataFrame(rows_r).groupby("seed")["value"].mean()).to_numpy()
    assert d.unit == "seed" and d.p == pytest.approx(stats.ttest_1samp(per_seed, 0).pvalue)
    assert not d.significant and d.hi - d.lo > 0.5
    assert d.lo >= -1 and d.hi <= 1


def test_mde_matches_a_noncentral_t_power_calculation():
    from analysis.stats import mde

    se, df = 0.02, 4
    m = mde(se, df)
    c = stats.t.ppf(0.975, df)
    power = stats.nct.sf(c, df, m / se) + stats.nct.cdf(-c, df, m / se)
    assert power == pytest.approx(0.8, abs=1e-4)
    assert mde(0.02, math.inf) == pytest.approx(0.02 * (1.959964 + 0.841621), rel=1e-5)
    assert math.isnan(mde(0.0, 4))


# ---- eval specs -------------------------------------------------------------------------------

def test_sweep_eval_spec_filters_and_never_mixes(tmp_path):
    from fake import fake_spec

    sid = spec_id(fake_spec())
    write_fake_sweep(tmp_path, "s", kappas=(0.5,), seeds=(0, 1), controls=(), eval_spec_id=sid,
                     checkpoint_step=10)
    data = load_sweep("s", tmp_path)
    c = data.cells.set_index("cell")
    # an evaluation outside the sweep's spec (a LIMIT re-run of one cell, replacing its file)
    rid = c.loc["free-k0.5-H16-s1", "run_id"]
    p = tmp_path / "runs" / rid / "eval" / "lm-eval.json"
    ev = json.loads(p.read_text())
    ev["spec"] = fake_spec(limit=5)
    ev["spec_id"] = spec_id(ev["spec"])
    ev["tasks"]["gsm8k"]["metrics"]["exact_match"]["value"] = 0.99
    p.rename(p.with_name("lm-eval.limit5.json"))
    p.with_name("lm-eval.limit5.json").write_text(json.dumps(ev))
    data = load_sweep("s", tmp_path)
    s = data.scores[(data.scores["run_id"] == rid) & (data.scores["source"] == "eval")]
    assert s.empty  # not the sweep's spec: no number from it
    used = {e["spec_id"]: e["used"] for e in data.evals}
    assert used == {sid: True, ev["spec_id"]: False}
    assert any("not the sweep's eval spec" in w for w in data.warnings)
    t = paper_table(data, "tokens", n_boot=50)
    row = t[(t["task"] == "gsm8k") & (t["column"] == "FT k=0.5")].iloc[0]
    # issue 24 item 3: the cell names the file it has under another spec
    assert row["n_seeds"] == 1 and row["spec_ids"] == sid and "evaluated under another spec: " \
        f"lm-eval.limit5.json (spec {ev['spec_id']})" in row["status"]
    assert 0.99 not in set(t["mean"])
    # without the manifest's spec id the majority spec wins, and still nothing is mixed
    man = tmp_path / "sweeps" / "s" / "manifest.json"
    m = json.loads(man.read_text())
    del m["eval_spec_id"]
    man.write_text(json.dumps(m))
    t2 = paper_table(load_sweep("s", tmp_path), "tokens", n_boot=50)
    assert set(" ".join(t2["spec_ids"].dropna()).split()) == {sid}


def test_a_task_every_cell_has_under_another_spec_names_the_file(tmp_path):
    """Issue 24 item 3: not "not evaluated in this sweep" but "another spec", with the file."""
    write_fake_sweep(tmp_path, "sp", kappas=(0.5,), seeds=(0,), controls=())
    for ed in tmp_path.glob("runs/*/eval"):
        ev = json.loads((ed / "lm-eval.json").read_text())
        (ed / "lm-eval.json").write_text(json.dumps(dict(ev, tasks={"gsm8k": ev["tasks"][
            "gsm8k"]})))
        spec = dict(ev["spec"], limit=2)
        (ed / "lm-eval.limit2.json").write_text(json.dumps(dict(
            ev, limit=2, spec=spec, spec_id=spec_id(spec),
            tasks={"arc_easy": ev["tasks"]["arc_easy"]})))
    t = paper_table(load_sweep("sp", tmp_path), "tokens", n_boot=100)
    arc = t[t["task"] == "arc_easy"]
    assert len(arc) and arc["mean"].isna().all()  # never mixed
    assert not arc["status"].str.contains("not evaluated in this sweep").any()
    assert all("another spec" in s and "lm-eval.limit2.json" in s for s in arc["status"])
    assert t[(t["task"] == "gsm8k") & (t["column"] != "")]["mean"].notna().all()


def test_train_ce_is_plotted_in_nats(sweep):
    from analysis.figures import training_curves

    _, data = sweep
    fig = training_curves(data)
    ax = fig.axes[0]
    assert "nats" in ax.get_ylabel()
    ys = np.concatenate([ln.get_ydata() for ln in ax.get_lines()])
    ce = data.curves[data.curves["kind"] == "train"]["ce"]
    assert ys.max() == pytest.approx(ce.max())  # not divided by ln 2


def test_multi_suite_manifest_spec_admits_each_suites_files():
    """The launcher records one spec for a sweep evaluated on two suites (their union,
    suite 'lm-eval+evalplus'); each suite's own file must still count as the sweep's."""
    from analysis.frame import _matches_manifest, spec_id

    lm = {"suite": "lm-eval", "tasks": ["arc_easy"], "limit": 30, "z_mode": "prior", "k": 1,
          "fewshot": None, "gen_tokens": None, "data_checksums": {"arc/x": "a"}}
    ep = {"suite": "evalplus", "tasks": ["humaneval_plus"], "limit": 30, "z_mode": "prior",
          "k": 1, "fewshot": None, "gen_tokens": 96, "data_checksums": {"he/x": "b"}}
    union = {"suite": "lm-eval+evalplus", "tasks": ["arc_easy", "humaneval_plus"], "limit": 30,
             "z_mode": "prior", "k": 1, "fewshot": None, "gen_tokens": 96,
             "data_checksums": {"arc/x": "a", "he/x": "b"}}
    uid = spec_id(union)
    assert _matches_manifest(lm, spec_id(lm), union, uid)
    assert _matches_manifest(ep, spec_id(ep), union, uid)
    for bad in (lm | {"limit": 10}, ep | {"gen_tokens": 256}, lm | {"suite": "other"},
                lm | {"data_checksums": {"arc/x": "z"}}, lm | {"tasks": ["mmlu"]}):
        assert not _matches_manifest(bad, spec_id(bad), union, uid), bad


# ---- missing scores and generation truncation (eval files of issue 12) -------------------------

def _edit_eval(root, rid: str, fn) -> None:
    p = root / "runs" / rid / "eval" / "lm-eval.json"
    ev = json.loads(p.read_text())
    fn(ev)
    p.write_text(json.dumps(ev))


def test_error_tasks_and_unscored_items_are_missing_with_their_reason(tmp_path):
    from analysis.tables import missing_table

    write_fake_sweep(tmp_path, "e", kappas=(0.5,), seeds=(0, 1), controls=())
    c = load_sweep("e", tmp_path).cells.set_index("cell")
    dead, code = c.loc["free-k0.5-H16-s1", "run_id"], c.loc["free-k0.5-H16-s0", "run_id"]

    def died(ev):  # what experiments/eval/run.py writes for a task whose run died
        ev["tasks"]["gsm8k"] = {"primary": "exact_match", "higher_is_better": True, "n": None,
                                "fewshot": None, "items": [], "error": "RuntimeError: OOM",
                                "metrics": {"exact_match": {"value": None, "stderr": None,
                                                            "n": None}}}

    def crashed(ev):  # evalplus: 3 items whose check timed out; pass@1 over the rest
        t = ev["tasks"]["humaneval_plus"]
        for it in t["items"][:3]:
            it.update(base=None, plus=None, reason="sandbox timed out")
        for name, key in (("pass@1_base", "base"), ("pass@1_plus", "plus")):
            xs = [it[key] for it in t["items"] if it[key] is not None]
            t["metrics"][name] = {"value": float(np.mean(xs)), "stderr": 0.05, "n": len(xs),
                                  "n_missing": 3}

    _edit_eval(tmp_path, dead, died)
    _edit_eval(tmp_path, code, crashed)
    data = load_sweep("e", tmp_path)
    s = data.scores
    row = s[(s["run_id"] == dead) & (s["metric"] == "exact_match")].iloc[0]
    assert math.isnan(row["value"]) and math.isnan(row["n"]) and row["error"] == \
        "RuntimeError: OOM"
    it = data.items[(data.items["run_id"] == code) & (data.items["metric"] == "pass@1_plus")]
    assert it["value"].isna().sum() == 3  # null items stay NaN, never 0
    t = paper_table(data, "tokens", n_boot=50)
    gsm = t[(t["task"] == "gsm8k") & (t["column"] == "FT k=0.5")].iloc[0]
    assert gsm["n_seeds"] == 1 and "eval error (RuntimeError: OOM)" in gsm["status"]
    ref = _items_from_files(tmp_path, code, "gsm8k", "exact_match")
    assert gsm["mean"] == pytest.approx(np.mean(ref))  # the dead seed is not averaged as 0
    he = t[(t["task"] == "humaneval_plus") & (t["column"] == "FT k=0.5")].iloc[0]
    assert he["n_missing"] == 3 and "3 items unscored" in cell_text(he)
    assert he["n_items"] == 2 * 40 - 3
    mt = missing_table(data).set_index("task")
    assert mt.loc["gsm8k", "reason"] == "RuntimeError: OOM"
    assert mt.loc["humaneval_plus", "missing"] == "3/40 items"
    assert mt.loc["humaneval_plus", "reason"] == "3x sandbox timed out"
    # every evalplus item missing: value null, n 0 -> missing, the count says why
    _edit_eval(tmp_path, code, lambda ev: ev["tasks"]["humaneval_plus"]["metrics"].update(
        {"pass@1_plus": {"value": None, "stderr": None, "n": 0, "n_missing": 40}}))
    t = paper_table(load_sweep("e", tmp_path), "tokens", n_boot=50)
    he = t[(t["task"] == "humaneval_plus") & (t["column"] == "FT k=0.5")].iloc[0]
    assert he["n_seeds"] == 1 and "null: all 40 items unscored" in he["status"]


def test_truncation_is_shown_per_task_with_the_generation_budget(tmp_path):
    from analysis.report import completeness_html
    from analysis.tables import truncation_table

    write_fake_sweep(tmp_path, "t", kappas=(0.5,), seeds=(0, 1), controls=())
    data = load_sweep("t", tmp_path)
    recs = []
    for rid in data.cells["run_id"]:
        ev = json.loads((tmp_path / "runs" / rid / "eval" / "lm-eval.json").read_text())
        recs.append(ev["tasks"]["gsm8k"]["truncation"])
    tr = truncation_table(data).set_index("task")
    assert set(tr.index) == {"gsm8k", "humaneval_plus"}  # log-likelihood tasks generate nothing
    g = tr.loc["gsm8k"]
    assert g["prompts"] == sum(r["n_requests"] for r in recs)
    assert g["prompts_truncated"] == sum(r["n_truncated"] for r in recs)
    assert g["max_tokens_cut"] == max(r["max_tokens_cut"] for r in recs)
    assert g["min_prompt_tokens_kept"] == min(r["min_prompt_tokens_kept"] for r in recs)
    assert g["gen_budget_min"] == 128 and g["gen_budget_requested"] == 256
    assert g["budgets_shrunk"] == sum(r["n_budget_shrunk"] for r in recs)
    assert g["cells_recorded"] == "4/4"
    # per cell in the long table: prompts cut over the cell's seeds
    t = paper_table(data, "tokens", n_boot=50)
    cell = t[(t["task"] == "gsm8k") & (t["column"] == "FT k=0.5")].iloc[0]
    assert cell["n_truncated"] == 1 + 2 and cell["n_requests"] == 2 * 50
    arc = t[(t["task"] == "arc_easy") & (t["column"] == "FT k=0.5")].iloc[0]
    assert math.isnan(arc["n_truncated"])  # nothing generated: no record, not 0 cuts
    sec = completeness_html(data)  # the report's "Evaluation completeness" section
    assert "max tokens cut" in sec and "gen budget requested" in sec and ">gsm8k<" in sec


def test_a_view_the_sweep_lacks_writes_its_note(tmp_path):
    from analysis.tables import write_tables

    write_fake_sweep(tmp_path, "f", kappas=(0.5,), seeds=(0,), controls=(), flops_budget=1e11)
    out = tmp_path / "out"
    write_tables(load_sweep("f", tmp_path), out, n_boot=50)
    csv = pd.read_csv(out / "table_tokens.csv")
    assert len(csv) == 1 and "No equal-tokens table" in csv["status"].iloc[0]
    assert "No equal-tokens table" in (out / "table_tokens.md").read_text()
