"""analysis/: frame builder, intervals, paired bootstrap and tables on fabricated result files
whose answers are known (computed here directly from the files)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from analysis.claims import checklist, collapse_table
from analysis.fake import write_fake_sweep
from analysis.frame import load_sweep
from analysis.stats import clopper_pearson, mean_ci, paired_bootstrap, paired_matrix, wilson
from analysis.tables import paper_table, to_latex, to_markdown, wide

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

def test_wilson_and_clopper_pearson_known_values():
    z2 = 1.959963984540054 ** 2
    lo, hi = wilson(0, 20)
    assert lo == 0.0 and hi == pytest.approx(z2 / (20 + z2), rel=1e-9)  # 0.1611
    lo, hi = clopper_pearson(0, 20)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** (1 / 20), rel=1e-9)  # 0.1684
    lo, hi = wilson(10, 20)
    assert (lo + hi) / 2 == pytest.approx(0.5) and 0.29 < lo < 0.30
    m, lo, hi = mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0 and hi - m == pytest.approx(4.302652729911275 * 1 / math.sqrt(3))
    assert math.isnan(mean_ci([1.0])[1]) and math.isnan(mean_ci([])[0])


# ---- paired bootstrap ------------------------------------------------------------------------

def _direct_bootstrap(d: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """The definition, literally: resample seeds, then items, take the mean."""
    rng = np.random.default_rng(seed)
    s_n, i_n = d.shape
    out = []
    for _ in range(n_boot):
        si = rng.integers(0, s_n, s_n)
        ii = rng.integers(0, i_n, i_n)
        out.append(d[si][:, ii].mean())
    return np.array(out)


def _long(mat: np.ndarray, seeds, docs) -> pd.DataFrame:
    return pd.DataFrame([{"seed": s, "doc_id": i, "value": mat[a, b]}
                         for a, s in enumerate(seeds) for b, i in enumerate(docs)])


def test_paired_bootstrap_equals_direct_computation():
    rng = np.random.default_rng(1)
    test = (rng.random((3, 57)) < 0.4).astype(float)
    ref = (rng.random((3, 57)) < 0.3).astype(float)
    res = paired_bootstrap(_long(test, [0, 1, 2], range(57)), _long(ref, [0, 1, 2], range(57)),
                           n_boot=N_BOOT, seed=7)
    d = test - ref
    reps = _direct_bootstrap(d, N_BOOT, 7)
    assert res.delta == pytest.approx(d.mean(), abs=1e-12)
    assert res.lo == pytest.approx(np.quantile(reps, 0.025), abs=1e-12)
    assert res.hi == pytest.approx(np.quantile(reps, 0.975), abs=1e-12)
    p = min(1.0, 2 * min(np.mean(reps <= 0), np.mean(reps >= 0)))
    assert res.p == pytest.approx(p)
    assert (res.n_seeds, res.n_items) == (3, 57)


def test_paired_bootstrap_one_seed_width_matches_standard_error():
    rng = np.random.default_rng(2)
    d = rng.normal(0.3, 1.0, size=(1, 400))
    res = paired_bootstrap(_long(d, [0], range(400)), _long(np.zeros_like(d), [0], range(400)),
                           n_boot=2000, seed=0)
    se = d.std(ddof=1) / math.sqrt(400)
    assert (res.hi - res.lo) / (2 * 1.96) == pytest.approx(se, rel=0.1)
    assert res.significant  # mean 0.3, se 0.05


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
    assert cell["n_seeds"] == 0 and "not evaluated" in cell["status"]


# ---- tables ----------------------------------------------------------------------------------

def test_table_cells_match_direct_computation(sweep, tables):
    root, data = sweep
    t = tables["tokens"]
    c = data.cells.set_index("cell")

    def items(cell, task, key):
        return np.array(_items_from_files(root, c.loc[cell, "run_id"], task, key))

    # baseline gsm8k: mean over seeds of the per-seed accuracy; 2 seeds of 0/1 -> pooled Wilson
    b = [items(f"baseline-s{s}", "gsm8k", "exact_match") for s in (0, 1)]
    row = t[(t["task"] == "gsm8k") & (t["column"] == "baseline")].iloc[0]
    assert row["mean"] == pytest.approx(np.mean([x.mean() for x in b]))
    pooled = np.concatenate(b)
    assert (row["lo"], row["hi"]) == pytest.approx(wilson(pooled.sum(), pooled.size))
    assert row["ci_method"] == "wilson" and row["n_seeds"] == 2
    # FT k=0.5 delta: paired over both seeds and all items, bootstrap equal to the direct one
    f = [items(f"free-k0.5-H16-s{s}", "gsm8k", "exact_match") for s in (0, 1)]
    d = np.stack(f) - np.stack(b)
    row = t[(t["task"] == "gsm8k") & (t["column"] == "FT k=0.5")].iloc[0]
    assert row["delta"] == pytest.approx(d.mean())
    reps = _direct_bootstrap(d, N_BOOT, 0)
    assert row["delta_lo"] == pytest.approx(np.quantile(reps, 0.025))
    assert row["delta_hi"] == pytest.approx(np.quantile(reps, 0.975))
    assert row["significant"] == (row["delta_lo"] > 0 or row["delta_hi"] < 0)
    # pass@1 uses Clopper-Pearson on the pooled items
    h = np.concatenate([items(f"baseline-s{s}", "humaneval_plus", "plus") for s in (0, 1)])
    row = t[(t["task"] == "humaneval_plus") & (t["column"] == "baseline")].iloc[0]
    assert row["ci_method"] == "clopper-pearson"
    assert (row["lo"], row["hi"]) == pytest.approx(clopper_pearson(int(h.sum()), h.size))
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
    txt = w.loc[w["benchmark"] == "gsm8k (exact_match)", "FT k=2"].iloc[0]
    assert "(1/2 seeds; missing: 1 pending)" in txt
    # benchmarks nobody evaluated, and the paper's groups this suite lacks
    assert (w.loc[w["benchmark"] == "mmlu", "baseline"] == "not evaluated in this sweep").all()
    assert w.loc[w["group"] == "Culture", "baseline"].str.startswith("not in this suite").all()
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
    r = np.stack([_items_from_files(tmp_path, c.loc[f"baseline_flops-s{s}", "run_id"], "gsm8k",
                                    "exact_match") for s in (0, 1)])
    assert g.loc["FT k=0.5", "delta"] == pytest.approx((f - r).mean())


# ---- claims ----------------------------------------------------------------------------------

def test_claims_verdicts_on_known_data(sweep, tables):
    _, data = sweep
    ct = collapse_table(data).set_index("kappa_bits")
    assert bool(ct.loc[4.0, "collapsed"]) and not bool(ct.loc[0.5, "collapsed"])
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
    assert cl.loc[cl.index.str.startswith("Synthetic"), "evidence"].iloc[0] == \
        "synthetic experiment not run"


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
    assert m["mean"] == 0.5 and m["n_items"] == 4 and m["ci_method"] == "wilson"
