"""The fast calibration harness (issue 11): synthetic sweeps with planted truth, written as
result files and read by the real analysis (full path), plus a bulk Monte-Carlo through the
same statistic functions the report calls. Fails when calibration breaks. The full run is
`make calibrate` (docs/CALIBRATION.md)."""

from __future__ import annotations

import calibration as C
import numpy as np
import pytest

SETTINGS = [("demo", sd) for sd in C.SEED_SDS] + [("paper", 0.03), ("demo-1seed", 0.08)]


pytestmark = pytest.mark.slow  # the module fixture runs hundreds of simulated sweeps


@pytest.fixture(scope="module")
def res():
    return C.run(n_sweeps=200, n_full=3, seed=11, settings=SETTINGS, gap_sims=40)


def test_calibration_targets_hold(res):
    """Every target `failures` judges (FPR and false 'supported' at their level, coverage,
    power at least the paired t's, every interval in range, no verdict from one seed, TOST's
    and the gaps' levels, the full path), then what the doc reads beyond them."""
    assert C.failures(res) == []
    for sd in C.SEED_SDS:
        c = res["bulk"][("demo", sd)]
        assert c.fpr.n == 600 and c.supported_null.rate <= 0.05, (sd, c.fpr.text())
        assert c.fpr_holm.rate <= c.fpr.rate
    assert all(c.intervals > 0 for c in res["bulk"].values())
    # the MDE the report prints: at the demo's 30 items only effects of tens of points are
    # detectable; 1319 items shrink it, though 3 seeds with 3-point seed noise still limit it
    paper, demo = res["bulk"][("paper", 0.03)], res["bulk"][("demo", 0.03)]
    assert np.median(demo.mde) > 0.2 > np.median(paper.mde)


def test_full_path_matches_the_statistics_and_the_special_shapes(res):
    fp = res["full"]
    assert fp.sweeps == 12 and fp.mismatches == [], fp.mismatches[:3]
    assert fp.comparisons > 100 and fp.out_of_range == 0
    assert fp.coverage.n > 50 and fp.coverage.rate >= 0.85


def test_tost_level_at_the_margin_and_power_at_zero(res):
    """Issue 38: TOST's false 'equivalent' rate at |Δ| = margin stays at its level; its power
    at Δ = 0 grows with seeds and shrinks with seed noise; it never decides from one seed."""
    t = res["tost"]
    assert {k[1] for k in t if k[0] == "items"} == {"demo", "paper"}  # demo-1seed: no test
    for key, c in t.items():
        assert c.at_margin.n == 200 and c.at_margin.rate <= 0.10, (key, c.at_margin.text())
    assert t[("ce", 10, 0.01)].at_zero.rate > 0.9 > t[("ce", 3, 0.03)].at_zero.rate
    assert t[("items", "demo", 0.03)].at_zero.rate < 0.1  # 30 items: no equivalence shown
    md = C.markdown(res, "test")
    assert "## Equivalence (TOST)" in md and "## The synthetic task's gaps" in md


def test_synthetic_gap_permutation_level_and_power(res):
    g = res["gaps"]
    null = next(c for name, c in g.items() if name.startswith("null"))
    strong = next(c for name, c in g.items() if name.startswith("strong"))
    for k in ("pos", "noise"):
        assert null.detected[k].n == 40 * C.NULL_SIMS_FACTOR and null.detected[k].rate <= 0.12
        assert strong.detected[k].rate == 1.0 and strong.coverage[k].rate >= 0.8
        assert abs(null.truth[k]) < 0.01


def test_rounding_case_is_never_significant(res):
    """Issue 24: FTs that beat their baseline by the same count on every seed (equal per-seed
    differences that float arithmetic makes unequal) are never significant, in bulk or through
    result files, and a harness that let one through would report a missed target."""
    r = res["rounding"]
    assert r.trials == 400 and r.spread > 100  # the adversary: most have a float spread
    assert r.paired.k == r.means.k == r.holm.k == 0 and r.holm.n == 200
    assert r.full_rows.n == 4 and r.full_rows.k == 0 and r.full_supported.k == 0
    bad = {"bulk": {}, "full": C.FullPath(), "rounding": C.Rounding(paired=C.Tally(1, 10))}
    assert any("rounding case (paired)" in f for f in C.failures(bad))
    md = C.markdown({**bad, "n_sweeps": 1, "n_full": 0, "seed": 0, "seconds": 0.0}, "cmd")
    assert "Rounding case (issue 24)" in md
