"""Issue 24, item 1: seeds whose differences are equal on the data's own resolution are "no
variation", never significant. Three seeds each +1 item of 82 give per-seed differences that are
mathematically equal (1/82) but differ in the last bits after float arithmetic (sd ~1e-17); the
old `sd > 0` test turned that into a zero-width interval with p ~ 1e-30, flagged significant and
Holm-significant in the tables and "supported" in the claims checklist.
Item 4: the CSV's `reference` names the exact reference column.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from fake import write_fake_sweep

from analysis import stats as S
from analysis.claims import checklist
from analysis.frame import load_sweep
from analysis.tables import paper_table, write_tables

N_ITEMS = 82
BASE_PASSED = (60, 46, 38)  # chosen so that float rounding leaves a nonzero spread (checked)


def _planted(n_items: int = N_ITEMS, passed=BASE_PASSED, gain: int = 1):
    """(ft, ref) 0/1 arrays, seeds x items: on every seed the FT passes `gain` more items."""
    ref = np.zeros((len(passed), n_items))
    ft = np.zeros_like(ref)
    for s, k in enumerate(passed):
        ref[s, :k] = 1
        ft[s, : k + gain] = 1
    return ft, ref


def _long(y: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame([(s, i, float(y[s, i])) for s in range(y.shape[0])
                         for i in range(y.shape[1])], columns=["seed", "doc_id", "value"])


def test_the_planted_case_really_has_a_rounding_spread():
    # the adversary: without this the tests below would pass on the old code by accident
    ft, ref = _planted()
    counts = ft.sum(axis=1) - ref.sum(axis=1)
    assert (counts == 1).all()  # exactly equal per-seed differences (in items)
    x = ft.mean(axis=1) - ref.mean(axis=1)
    assert np.std(x, ddof=1) > 0  # ... yet float arithmetic gives a nonzero spread
    assert np.std((ft - ref).mean(axis=1), ddof=1) > 0


def test_seed_t_on_per_seed_means_is_no_variation():
    ft, ref = _planted()
    d = S.seed_t(ft.mean(axis=1) - ref.mean(axis=1))
    assert d.degenerate and not d.significant
    assert math.isnan(d.lo) and math.isnan(d.hi) and math.isnan(d.p)
    assert d.delta == pytest.approx(1 / N_ITEMS)
    # the Holm path: no p, so no Holm-adjusted significance either
    assert math.isnan(S.holm([d.p, 0.5])[0])


def test_paired_delta_uses_exact_counts():
    ft, ref = _planted()
    d = S.paired_delta(_long(ft), _long(ref), "acc")
    assert d.degenerate and not d.significant and math.isnan(d.lo)
    assert d.delta == pytest.approx(1 / N_ITEMS) and d.n_seeds == 3 and d.n_items == N_ITEMS
    # the per-seed differences are computed exactly: bit-identical, from integer counts
    x = S.per_seed_diffs(ft - ref)
    assert (x == x[0]).all() and x[0] == 1 / N_ITEMS
    # 2 seeds x 1 item (the old bootstrap gave [d, d] and p = 0), and 1 seed x 1 item
    t, r = _long(np.ones((2, 1))), _long(np.zeros((2, 1)))
    for n in (2, 1):
        d = S.paired_delta(t[t["seed"] < n], r[r["seed"] < n], "exact_match")
        assert d.degenerate and not d.significant and S.NO_VARIATION in d.method
    assert not S.Delta(0.5, 0.5, 0.5, 1e-30, 3, 82, "t", "seed").significant  # zero width


def test_seed_delta_and_continuous_metrics_use_a_relative_tolerance():
    ft, ref = _planted()
    t = pd.DataFrame({"seed": [0, 1, 2], "value": ft.mean(axis=1)})
    r = pd.DataFrame({"seed": [0, 1, 2], "value": ref.mean(axis=1)})
    d = S.seed_delta(t, r, "acc")
    assert d.degenerate and not d.significant
    # a continuous metric (bits per byte): the same shift on every seed, summed in another order
    base = np.array([1.7310000000000001, 1.5230000000000001, 1.911])
    shifted = base + 0.1 + np.array([1e-16, -2e-16, 3e-16])
    assert np.std(shifted - base, ddof=1) > 0
    d = S.seed_t(shifted - base, scale=float(np.abs(shifted).max()))
    assert d.degenerate and not d.significant
    # differences mathematically 0 that rounding makes all positive: not a finding either
    d = S.seed_t([1e-17, 2e-17, 1.5e-17], scale=1.0)
    assert d.degenerate and not d.significant


def test_real_variation_is_still_tested_exactly():
    # +1, +2, +3 items: a real spread; the paired t equals scipy's on the exact differences
    ft, ref = _planted()
    ft[1, BASE_PASSED[1] + 1] = 1
    ft[2, BASE_PASSED[2] + 1: BASE_PASSED[2] + 3] = 1
    d = S.paired_delta(_long(ft), _long(ref), "acc")
    exact = np.array([1, 2, 3]) / N_ITEMS
    from scipy import stats

    res = stats.ttest_1samp(exact, 0.0)
    assert not d.degenerate and d.p == pytest.approx(res.pvalue, rel=1e-9)
    assert d.delta == pytest.approx(exact.mean()) and d.hi > d.lo


def test_one_seed_and_cell_intervals_have_no_zero_width_interval():
    # one seed: item differences equal up to rounding (a continuous per-item metric)
    a = np.array([1.1, 2.2, 3.3, 4.4, 5.5])
    b = a + 0.3
    assert not np.all((b - a) == (b - a)[0])  # rounding makes them differ
    d = S.item_bootstrap(b - a, scale=float(np.abs(b).max()))
    assert d.degenerate and not d.significant and math.isnan(d.lo)
    # a table cell whose seeds score the same count: no interval, not a zero-width one
    x = np.array([0.1 + 0.2, 0.3, 0.15 + 0.15])
    assert np.std(x, ddof=1) > 0
    ci = S.cell_interval(x, None, "acc")
    assert ci.degenerate and math.isnan(ci.lo) and ci.method == S.NO_VARIATION
    m, lo, hi = S.mean_ci(x)
    assert math.isnan(lo) and math.isnan(hi)


# ---- the same case through the tables, Holm and the claims checklist ------------------------

def _plant_sweep(root, name: str = "eq") -> None:
    """A 3-seed sweep (FTs at kappa 0.5 and 2) whose gsm8k items are planted: each FT passes
    exactly one item more than its seed's baseline, on 82 items."""
    write_fake_sweep(root, name, kappas=(0.5, 2.0), seeds=(0, 1, 2), controls=())
    man = json.loads((root / "sweeps" / name / "manifest.json").read_text())
    for c in man["cells"]:
        k = BASE_PASSED[c["seed"]] + (1 if c["arm"] == "free" else 0)
        vals = [1.0] * k + [0.0] * (N_ITEMS - k)
        path = root / "runs" / c["run_id"] / "eval" / "lm-eval.json"
        ev = json.loads(path.read_text())
        task = ev["tasks"]["gsm8k"]
        task["items"] = [{"doc_id": i, "exact_match": v} for i, v in enumerate(vals)]
        task["n"] = N_ITEMS
        task["metrics"]["exact_match"] = {"value": float(np.mean(vals)), "n": N_ITEMS,
                                          "stderr": float(np.std(vals, ddof=1) / N_ITEMS**.5)}
        path.write_text(json.dumps(ev), encoding="utf-8")


def test_tables_holm_and_claims_never_call_equal_counts_significant(tmp_path):
    _plant_sweep(tmp_path)
    data = load_sweep("eq", tmp_path)
    t = paper_table(data, "tokens", n_boot=100)
    g = t[(t["task"] == "gsm8k") & (t["arm"] == "free")]
    assert len(g) == 2
    assert (g["delta"] - 1 / N_ITEMS).abs().max() < 1e-12
    assert not g["significant"].any() and not g["significant_holm"].any()
    assert g["degenerate"].all() and g["delta_lo"].isna().all() and g["p"].isna().all()
    cl = checklist(data, {"tokens": t, "flops": paper_table(data, "flops", n_boot=100)})
    row = cl[cl["claim"].str.contains("equal tokens on GSM8K")]
    assert len(row) == 1 and row["verdict"].iloc[0] == "inconclusive"


# ---- item 4: the CSV's reference names a column --------------------------------------------

def test_csv_reference_names_the_exact_reference_column(tmp_path):
    write_fake_sweep(tmp_path, "mh", kappas=(0.5,), seeds=(0, 1), latent_bits=(4, 16),
                     controls=("baseline_flops",))
    data = load_sweep("mh", tmp_path)
    write_tables(data, tmp_path / "out", n_boot=50)
    for view in ("tokens", "flops"):
        csv = pd.read_csv(tmp_path / "out" / f"table_{view}.csv", keep_default_na=False)
        named = csv[csv["column"] != ""]
        assert len(named)
        cols = set(named["column"])
        # every row that has a column names a reference that is a column of this CSV
        assert set(named["reference"]) <= cols, set(named["reference"]) - cols
        ft = named[named["arm"] == "free"]
        if view == "flops":
            for h in (4, 16):
                assert set(ft[ft["latent_bits"].astype(float) == h]["reference"]) == {
                    f"baseline_flops (H={h})"}
            assert "reference_arm" in csv and set(named["reference_arm"]) == {"baseline_flops"}
        else:
            assert set(ft["reference"]) == {"baseline"}
