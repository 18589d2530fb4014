"""The equivalence test (issue 38): TOST over per-seed paired differences, checked against
scipy's one-sided t-tests (an independent computation), its interval reading, the rounding case
and the per-seed and per-item entry points."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from analysis import stats as S


@pytest.mark.parametrize("seed", range(20))
def test_tost_is_two_one_sided_t_tests(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 9))
    d = rng.normal(rng.normal(0, 0.02), 0.015, n)
    margin = float(abs(rng.normal(0.03, 0.02)) + 1e-3)
    e = S.tost(d, margin)
    lower = sps.ttest_1samp(d, -margin, alternative="greater").pvalue
    upper = sps.ttest_1samp(d, margin, alternative="less").pvalue
    assert e.p_lower == pytest.approx(lower, rel=1e-9, abs=1e-15)
    assert e.p_upper == pytest.approx(upper, rel=1e-9, abs=1e-15)
    assert e.p == pytest.approx(max(lower, upper), rel=1e-9, abs=1e-15)
    assert e.n_seeds == n and e.df == n - 1
    # equivalent <=> the 90% interval (t over seeds) lies inside (-margin, +margin)
    half = sps.t.ppf(0.95, n - 1) * d.std(ddof=1) / math.sqrt(n)
    assert (e.lo, e.hi) == pytest.approx((d.mean() - half, d.mean() + half))
    assert e.equivalent == (-margin < e.lo and e.hi < margin)
    assert e.verdict == ("equivalent" if e.equivalent else "not shown")


def test_tost_known_answers() -> None:
    tight = S.tost([0.001, -0.002, 0.0005], margin=0.02)
    assert tight.equivalent and tight.verdict == "equivalent"
    wide = S.tost([0.03, -0.03, 0.01], margin=0.02)  # mean inside the margin, interval not
    assert not wide.equivalent and wide.verdict == "not shown"
    outside = S.tost([0.05, 0.051, 0.049], margin=0.02)
    assert not outside.equivalent and outside.p_upper > 0.5


def test_tost_no_variation_and_too_few_seeds() -> None:
    # three seeds each +1 item of 82: equal differences that float arithmetic makes unequal
    ft = np.array([61, 47, 39]) / 82
    ref = np.array([60, 46, 38]) / 82
    e = S.tost(ft - ref, margin=0.05, scale=1.0)
    assert e.degenerate and not e.equivalent and math.isnan(e.lo) and math.isnan(e.p)
    one = S.tost([0.001], margin=0.05)
    assert not one.equivalent and one.verdict == "" and one.n_seeds == 1
    for bad in (0.0, -0.1, math.nan, math.inf):
        with pytest.raises(ValueError, match="margin"):
            S.tost([0.0, 0.1], margin=bad)


def test_seed_tost_pairs_by_seed() -> None:
    test = pd.DataFrame({"seed": [0, 1, 2, 3], "value": [2.50, 2.52, 2.49, 9.0]})
    ref = pd.DataFrame({"seed": [2, 1, 0], "value": [2.48, 2.51, 2.50]})
    seeds, d = S.seed_diffs(test, ref)
    assert seeds == [0, 1, 2] and d == pytest.approx([0.0, 0.01, 0.01])
    e = S.seed_tost(test, ref, margin=0.05)
    assert e == S.tost(d, 0.05, scale=2.52)
    assert S.seed_tost(test, ref.assign(seed=[7, 8, 9]), 0.05).verdict == ""


def test_paired_tost_runs_over_per_seed_mean_differences() -> None:
    rng = np.random.default_rng(3)
    rows_t, rows_r = [], []
    for s in range(3):
        for i in range(40):
            rows_t.append((s, i, float(rng.random() < 0.5)))
            rows_r.append((s, i, float(rng.random() < 0.5)))
    cols = ["seed", "doc_id", "value"]
    t, r = pd.DataFrame(rows_t, columns=cols), pd.DataFrame(rows_r, columns=cols)
    d, _, _ = S.paired_matrix(t, r)
    e = S.paired_tost(t, r, margin=0.3)
    assert e == S.tost(S.per_seed_diffs(d), 0.3, scale=1.0)
    assert S.paired_tost(t[t["seed"] == 0], r[r["seed"] == 0], 0.3).verdict == ""
    pairs = S.paired_matrix(t, r)  # a caller's copy gives the same; a malformed one refuses
    assert S.paired_tost(t, r, 0.3, pairs=pairs) == e
    assert S.paired_delta(t, r, pairs=pairs) == S.paired_delta(t, r)
    for bad in ((d,), (d[0], [0], [1]), (d, [0, 1], list(range(40))), [d, [0, 1, 2], []]):
        with pytest.raises(ValueError, match="pairs must be"):
            S.paired_delta(t, r, pairs=bad)
