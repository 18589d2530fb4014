"""The report's statistics, in one place (docs/CALIBRATION.md measures them).

- `cell_interval`: a table cell. With >= 2 seeds the seed is the unit: the mean of the per-seed
  scores with a Student-t interval, intersected with the metric's range. With one seed:
  Clopper-Pearson over the items for a 0/1 metric, else the item standard error, labelled "one
  seed: items only" (seed-to-seed variance is not in it). No variation: no interval.
- `paired_delta` / `seed_delta`: Δ of a Free Transformer against the arm that matches it, paired
  by (seed, doc_id) or by seed. With >= 2 seeds a paired t over the per-seed differences
  (`seed_t`); with one seed an item bootstrap, marked item-level. "Equal" is decided on the
  data's own resolution, never by `sd > 0`: count metrics compare exact integer sums, other
  spreads within `RTOL` of the values' magnitude are float rounding (three seeds each +1 item of
  82 give sd ~1e-17, which a plain t turns into p ~ 1e-30). Each Δ carries its minimum
  detectable effect at 80% power (`mde`).
- `identical`: paired differences 0 up to float32 rounding in every seed (the Z-cut control
  against the baseline): no interval, no p.
- `holm`: Holm's step-down adjustment across one family.
- `tost` (`seed_tost`, `paired_tost`): the equivalence test behind every "differs little" claim:
  two one-sided paired t-tests against a margin stated in advance; "equivalent" iff the
  1 - 2·ALPHA (90%) interval lies inside (-margin, +margin). An interval that merely includes 0
  is NOT evidence of "no difference"; only this is.
- `mean_ci`, `clopper_pearson`, `t_half`: the building blocks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pandas as pd
from scipy import optimize, stats

LEVEL = 0.95
ALPHA = 0.05  # 1 - LEVEL, written once: every test, Holm step and verdict uses it
POWER = 0.80
NO_VARIATION = "no variation: n too small"
UNIT = (0.0, 1.0)
"""Range of a 0/1 metric (accuracy, exact match, pass@1)."""
POSITIVE = (0.0, math.inf)
"""Range of a cross-entropy or bits-per-byte metric."""
RTOL = 1e-9
"""Relative spread below which values that differ only by float rounding count as equal: a
mean over n items carries a rounding error of about n * 1.1e-16 of its magnitude, so 1e-9 leaves
room for 10^6 items and is far below any real seed-to-seed or item-to-item difference."""


def no_variation(x: np.ndarray | Sequence[float], scale: float | None = None) -> bool:
    """True when the finite values of `x` are equal up to float rounding: their spread is at most
    `RTOL` times `scale` (the magnitude of the quantities they were computed from, e.g. the
    scores subtracted to get a difference; default: the largest |x|). Empty: True."""
    v = np.asarray(x, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return True
    mag = float(np.max(np.abs(v)))
    if scale is not None and math.isfinite(scale):
        mag = max(mag, abs(float(scale)))
    return float(v.max() - v.min()) <= RTOL * mag


F32_ULPS = 4
"""Paired differences of at most this many float32 units of the values' magnitude are float32
rounding: a model trained in float32 along the same path, or scored through a different but
equivalent op sequence (x + 0·r), lands a few ulps away (the Z-cut control against its seed's
baseline: weights within ~1e-6, validation CE within 2.4e-7 nats of 5.3)."""


def identical(diffs: np.ndarray | Sequence[float], scale: float) -> bool:
    """True when every paired difference (at least 2 seeds, all finite) is 0 up to float32
    rounding: |d| <= F32_ULPS x float32 eps x `scale` (the magnitude of the values subtracted).
    Such arms are identical: a t-test on rounding noise would give a meaningless p (it is
    not run); their Δ reads "identical", never "equivalent" by a test or "different"."""
    x = np.asarray(diffs, dtype=float)
    if x.size < 2 or not np.all(np.isfinite(x)) or not math.isfinite(scale):
        return False
    tol = F32_ULPS * float(np.finfo(np.float32).eps) * abs(float(scale))
    return bool(np.all(np.abs(x) <= tol))


def _integer_valued(v: np.ndarray) -> bool:
    """Every value a whole number small enough to sum exactly (a count metric: 0/1 items)."""
    return bool(v.size and np.all(np.abs(v) < 2.0**40) and np.all(v == np.round(v)))


def _scale(*frames: np.ndarray) -> float:
    v = np.concatenate([np.asarray(f, dtype=float).ravel() for f in frames])
    v = v[np.isfinite(v)]
    return float(np.max(np.abs(v))) if v.size else math.nan


def metric_range(metric: str, values: np.ndarray | None = None) -> tuple[float, float]:
    """The range a metric's values live in: [0, 1] for rates, [0, inf) for CE / bpb / KL."""
    m = metric.lower()
    if any(s in m for s in ("bpb", "ce", "kl", "elbo", "ppl", "perplexity", "bits")):
        return POSITIVE
    if m.startswith("pass@") or m in ("acc", "acc_norm", "exact_match", "f1", "mc1", "mc2") \
            or m.startswith(("acc", "exact_match")):
        return UNIT
    if values is not None:
        v = np.asarray(values, dtype=float)
        v = v[np.isfinite(v)]
        if v.size and v.min() >= 0 and v.max() <= 1:
            return UNIT
    return (-math.inf, math.inf)


def delta_range(rng: tuple[float, float]) -> tuple[float, float]:
    """Range of a difference of two values of a metric with range `rng`."""
    lo, hi = rng
    return lo - hi, hi - lo


def _clip(lo: float, hi: float, rng: tuple[float, float]) -> tuple[float, float]:
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return lo, hi
    return max(lo, rng[0]), min(hi, rng[1])


def t_half(df: float, se: float, level: float = LEVEL) -> float:
    """Half-width of a two-sided Student-t interval with `df` degrees of freedom."""
    return float(stats.t.ppf(0.5 + level / 2, df)) * se


def mean_ci(values: np.ndarray | list[float], level: float = LEVEL) -> tuple[float, float, float]:
    """Mean and Student-t interval over independent replicates (seeds). NaNs are dropped."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return math.nan, math.nan, math.nan
    m = float(x.mean())
    if x.size < 2 or no_variation(x):  # no zero-width interval from rounding
        return m, math.nan, math.nan
    half = stats.t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return m, m - half, m + half


def clopper_pearson(k: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Exact (Clopper-Pearson) binomial interval; conservative, right for pass@1 near 0."""
    if n <= 0:
        return math.nan, math.nan
    ci = stats.binomtest(int(k), int(n)).proportion_ci(confidence_level=level, method="exact")
    return float(ci.low), float(ci.high)


def paired_matrix(test: pd.DataFrame, ref: pd.DataFrame) -> tuple[np.ndarray, list, list]:
    """Differences D[s, i] = test - ref over the seeds both arms have and the doc_ids every one
    of those seeds has, in both arms, with a finite value. Inputs: columns seed, doc_id, value.
    """
    def wide(df: pd.DataFrame) -> pd.DataFrame:
        df = df.dropna(subset=["value"]).drop_duplicates(["seed", "doc_id"])
        return df.pivot(index="seed", columns="doc_id", values="value")

    t, r = wide(test), wide(ref)
    seeds = sorted(set(t.index) & set(r.index))
    t, r = t.loc[seeds], r.loc[seeds]
    common = t.columns.intersection(r.columns)
    t, r = t[common], r[common]
    keep = t.notna().all(axis=0).to_numpy() & r.notna().all(axis=0).to_numpy()
    docs_l = sorted(common[keep])
    if not seeds or not docs_l:
        return np.zeros((0, 0)), seeds, docs_l
    d = t[docs_l].to_numpy(dtype=float) - r[docs_l].to_numpy(dtype=float)
    return d, seeds, docs_l


def _pairs(test: pd.DataFrame, ref: pd.DataFrame, pairs: tuple | None) -> tuple:
    """`paired_matrix(test, ref)`, or the caller's copy of it, refused unless it has its shape."""
    if pairs is None:
        return paired_matrix(test, ref)
    if not (isinstance(pairs, tuple) and len(pairs) == 3 and np.ndim(pairs[0]) == 2 and (
            np.size(pairs[0]) == 0 or np.shape(pairs[0]) == (len(pairs[1]), len(pairs[2])))):
        raise ValueError(f"pairs must be paired_matrix's (matrix, seeds, doc_ids), got {pairs!r}")
    return pairs


# ---- the report's statistics -----------------------------------------------------------------

@lru_cache(maxsize=256)
def _mde_factor(df: float, level: float, power: float) -> float:
    """lambda such that a two-sided level-`level` t test (df) rejects with probability `power`
    when the true effect is lambda standard errors (noncentral t; df = inf: normal)."""
    if not math.isfinite(df):
        return float(stats.norm.ppf(0.5 + level / 2) + stats.norm.ppf(power))
    c = float(stats.t.ppf(0.5 + level / 2, df))

    def gap(lam: float) -> float:
        lower = float(stats.nct.cdf(-c, df, lam))  # negligible for lam > 0; scipy may say NaN
        return float(stats.nct.sf(c, df, lam)) + (lower if math.isfinite(lower) else 0.0) - power

    hi = c + 5.0
    while gap(hi) < 0:
        hi *= 2
    return float(optimize.brentq(gap, 0.0, hi, xtol=1e-6))


def mde(se: float, df: float, level: float = LEVEL, power: float = POWER) -> float:
    """Minimum detectable effect: the true |Δ| a test with this standard error and df detects
    with probability `power` (two-sided, uncorrected level). NaN when se is unknown or 0."""
    if not (math.isfinite(se) and se > 0) or not df or df <= 0:
        return math.nan
    return _mde_factor(float(df), level, power) * se


@dataclass(frozen=True)
class CellInterval:
    """Mean of one arm on one benchmark row with its 95% interval."""

    mean: float
    lo: float
    hi: float
    method: str
    n_seeds: int
    n_items: int
    degenerate: bool = False


def cell_interval(per_seed: np.ndarray | Sequence[float], items: np.ndarray | None = None,
                  metric: str = "", stderr: float = math.nan,
                  level: float = LEVEL) -> CellInterval:
    """A table cell: `per_seed` holds the arm's score on each seed, `items` the per-item scores
    of every seed pooled (for the one-seed interval and for n). See the module docstring."""
    x = np.asarray(per_seed, dtype=float)
    x = x[np.isfinite(x)]
    iv = np.asarray(items if items is not None else [], dtype=float)
    iv = iv[np.isfinite(iv)]
    n_s, n_i = int(x.size), int(iv.size)
    rng = metric_range(metric, iv if iv.size else x)
    if n_s == 0:
        return CellInterval(math.nan, math.nan, math.nan, "", 0, n_i)
    m = float(x.mean())
    if n_s >= 2:
        _, lo, hi = mean_ci(x, level)
        if not math.isfinite(lo):  # equal up to rounding: no zero-width interval
            return CellInterval(m, math.nan, math.nan, NO_VARIATION, n_s, n_i, True)
        return CellInterval(m, *_clip(lo, hi, rng), f"t over {n_s} seeds", n_s, n_i)
    # one seed: the items are all there is; the label says seed variance is not in it
    if iv.size and np.all((iv == 0) | (iv == 1)):
        lo, hi = clopper_pearson(int(iv.sum()), n_i, level)
        return CellInterval(m, lo, hi, "clopper-pearson (one seed: items only)", 1, n_i)
    se = float(iv.std(ddof=1) / math.sqrt(n_i)) if n_i > 1 else float(stderr)
    if n_i > 1 and no_variation(iv):
        se = 0.0
    if not (math.isfinite(se) and se > 0):
        why = NO_VARIATION if n_i > 1 or math.isfinite(stderr) else ""
        return CellInterval(m, math.nan, math.nan, why, 1, n_i, bool(why))
    z = float(stats.norm.ppf(0.5 + level / 2))
    lo, hi = _clip(m - z * se, m + z * se, rng)
    return CellInterval(m, lo, hi, "item stderr (one seed: items only)", 1, n_i)


@dataclass(frozen=True)
class Delta:
    """Δ = test - reference (paired), with its interval, p-value and minimum detectable effect.

    unit: "seed" (>= 2 seeds: the interval includes seed-to-seed variance) or "item" (one seed:
    an item bootstrap, seed variance is NOT in it; never the basis of a verdict)."""

    delta: float
    lo: float
    hi: float
    p: float
    n_seeds: int
    n_items: int
    method: str
    unit: str
    se: float = math.nan
    df: float = math.nan
    mde: float = math.nan
    degenerate: bool = False

    @property
    def significant(self) -> bool:
        return bool(not self.degenerate and math.isfinite(self.lo) and math.isfinite(self.hi)
                    and self.hi > self.lo and (self.lo > 0 or self.hi < 0))


def _empty_delta(n_seeds: int = 0, n_items: int = 0) -> Delta:
    return Delta(math.nan, math.nan, math.nan, math.nan, n_seeds, n_items, "", "")


def seed_t(diffs: np.ndarray | Sequence[float], rng: tuple[float, float] = (-math.inf, math.inf),
           n_items: int = 0, level: float = LEVEL, scale: float | None = None) -> Delta:
    """Paired t over per-seed differences (>= 2 seeds): the seed is the unit.

    `diffs[s]` = test - reference on seed s (a per-seed mean over the paired items, or a
    per-seed value such as validation CE); `rng` is the range of a difference (the interval is
    intersected with it); `scale` is the magnitude of the values subtracted (e.g. 1 for 0/1
    items): differences whose spread is within `RTOL` of it are equal (float rounding), so no
    interval and never significant. Otherwise exactly the paired t-test over seed means
    (scipy.stats.ttest_1samp)."""
    x = np.asarray(diffs, dtype=float)
    x = x[np.isfinite(x)]
    n = int(x.size)
    if n < 2:
        return _empty_delta(n, n_items)
    m, sd = float(x.mean()), float(x.std(ddof=1))
    what = f"paired t over {n} seeds" + (f" x {n_items} items" if n_items else "")
    if no_variation(x, scale) or not sd > 0:
        return Delta(m, math.nan, math.nan, math.nan, n, n_items, f"{what}: {NO_VARIATION}",
                     "seed", 0.0, n - 1, math.nan, True)
    se = sd / math.sqrt(n)
    df = n - 1
    half = float(stats.t.ppf(0.5 + level / 2, df)) * se
    p = float(2 * stats.t.sf(abs(m) / se, df))
    lo, hi = _clip(m - half, m + half, rng)
    return Delta(m, lo, hi, p, n, n_items, what, "seed", se, df, mde(se, df, level))


def item_bootstrap(d: np.ndarray, rng: tuple[float, float] = (-math.inf, math.inf),
                   n_boot: int = 2000, seed: int = 0, level: float = LEVEL,
                   scale: float | None = None) -> Delta:
    """One seed: percentile bootstrap over paired item differences `d` (1-D). Item-level only.
    Differences equal up to float rounding (`no_variation` with `scale`, the magnitude of the
    values subtracted) have no interval."""
    d = np.asarray(d, dtype=float)
    d = d[np.isfinite(d)]
    n = int(d.size)
    if n == 0:
        return _empty_delta(1, 0)
    m = float(d.mean())
    what = f"item bootstrap, 1 seed x {n} items (seed variance not included)"
    if n < 2 or no_variation(d, scale):
        return Delta(m, math.nan, math.nan, math.nan, 1, n, f"{what}: {NO_VARIATION}", "item",
                     0.0, math.inf, math.nan, True)
    rng_ = np.random.default_rng(seed)
    reps = np.concatenate([d[rng_.integers(0, n, (min(256, n_boot - i), n))].mean(axis=1)
                           for i in range(0, n_boot, 256)])
    lo, hi = (float(v) for v in np.quantile(reps, [0.5 - level / 2, 0.5 + level / 2]))
    p = min(1.0, 2 * min(float(np.mean(reps <= 0)), float(np.mean(reps >= 0))))
    se = float(d.std(ddof=1) / math.sqrt(n))
    lo, hi = _clip(lo, hi, rng)
    return Delta(m, lo, hi, p, 1, n, what, "item", se, math.inf, mde(se, math.inf, level))


def paired_delta(test: pd.DataFrame, ref: pd.DataFrame, metric: str = "", n_boot: int = 2000,
                 seed: int = 0, level: float = LEVEL, pairs: tuple | None = None) -> Delta:
    """Δ of `test` against `ref` from per-item rows (columns seed, doc_id, value), paired by
    (seed, doc_id): a paired t over seeds with >= 2 seeds, an item bootstrap with one.
    `pairs`: their `paired_matrix` when the caller has it already."""
    d, seeds, docs = _pairs(test, ref, pairs)
    if d.size == 0:
        return _empty_delta(len(seeds), len(docs))
    rng = delta_range(metric_range(metric, np.concatenate([test["value"].to_numpy(float),
                                                           ref["value"].to_numpy(float)])))
    return matrix_delta(d, rng, _scale(test["value"], ref["value"]), n_boot, seed, level)


def matrix_delta(d: np.ndarray, rng: tuple[float, float] = (-math.inf, math.inf),
                 scale: float | None = None, n_boot: int = 2000, seed: int = 0,
                 level: float = LEVEL) -> Delta:
    """`paired_delta` on a complete paired-difference matrix `d` (seeds x items; `rng`, `scale`
    as in `seed_t`): a paired t over seeds with >= 2 rows, an item bootstrap with one. The
    calibration harness calls it on simulated matrices, so it measures this very code."""
    if d.shape[0] >= 2:
        return seed_t(per_seed_diffs(d), rng, n_items=d.shape[1], level=level, scale=scale)
    return item_bootstrap(d[0], rng, n_boot=n_boot, seed=seed, level=level, scale=scale)


def per_seed_diffs(d: np.ndarray) -> np.ndarray:
    """Each seed's mean paired difference (rows of `d`, seeds x items). For a count metric
    (integer item scores) from the exact integer sum over the same number of items, so seeds that
    differ by the same count give bit-identical values (not values that differ by rounding)."""
    d = np.asarray(d, dtype=float)
    if _integer_valued(d):
        return np.round(d).sum(axis=1) / d.shape[1]  # integer sums are exact in float64
    return d.mean(axis=1)


def seed_delta(test: pd.DataFrame, ref: pd.DataFrame, metric: str = "",
               level: float = LEVEL) -> Delta:
    """Δ from per-seed values only (columns seed, value; e.g. validation CE), paired by seed."""
    t, r, common, diffs = _per_seed(test, ref)
    if not common:
        return _empty_delta()
    rng = delta_range(metric_range(metric, np.concatenate([t.to_numpy(float),
                                                           r.to_numpy(float)])))
    if len(common) == 1:
        return Delta(float(diffs[0]), math.nan, math.nan, math.nan, 1, 0,
                     "one seed, no items: no interval (seed variance not included)", "item")
    return seed_t(diffs, rng, level=level, scale=_scale(t[common], r[common]))


def holm(p: Sequence[float] | np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error control under any dependence).
    NaNs (no test) stay NaN and do not count in the family size."""
    p = np.asarray(p, dtype=float)
    out = np.full(p.shape, math.nan)
    ok = np.flatnonzero(np.isfinite(p))
    m = ok.size
    if m == 0:
        return out
    order = ok[np.argsort(p[ok], kind="stable")]
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


# ---- equivalence (TOST) ----------------------------------------------------------------------

@dataclass(frozen=True)
class Equivalence:
    """TOST of Δ = test - reference against `margin` (H0: |Δ| >= margin; H1: |Δ| < margin).

    lo, hi: the 1 - 2·alpha interval (90% at alpha 0.05) of Δ: equivalent iff it lies inside
    (-margin, +margin), the same as p = max(p_lower, p_upper) < alpha. Degenerate (every seed's
    difference equal on the data's resolution): no interval and never equivalent."""

    delta: float
    lo: float
    hi: float
    margin: float
    p: float
    p_lower: float
    """One-sided p of H0: Δ <= -margin."""
    p_upper: float
    """One-sided p of H0: Δ >= +margin."""
    n_seeds: int
    method: str
    alpha: float = ALPHA
    se: float = math.nan
    df: float = math.nan
    degenerate: bool = False

    @property
    def equivalent(self) -> bool:
        return bool(not self.degenerate and math.isfinite(self.p) and self.p < self.alpha)

    @property
    def verdict(self) -> str:
        """'equivalent' (|Δ| < margin shown), 'not shown' (the test could not show it), or
        '' (no test: fewer than 2 seeds)."""
        if self.n_seeds < 2 or not math.isfinite(self.margin):
            return ""
        return "equivalent" if self.equivalent else "not shown"


def _empty_equivalence(margin: float, n_seeds: int = 0, why: str = "",
                       alpha: float = ALPHA) -> Equivalence:
    return Equivalence(math.nan, math.nan, math.nan, margin, math.nan, math.nan, math.nan,
                       n_seeds, why, alpha)


def tost(diffs: np.ndarray | Sequence[float], margin: float, alpha: float = ALPHA,
         scale: float | None = None) -> Equivalence:
    """Two one-sided paired t-tests over per-seed differences (the seed is the unit, df = n - 1).

    `diffs[s]` = test - reference on seed s; `margin` > 0, in the metric's units, stated before
    looking; `scale`: the magnitude of the values subtracted (differences whose spread is within
    `RTOL` of it are equal: no interval, never equivalent). p_lower is the one-sided p of
    H0: Δ <= -margin (t = (mean + margin) / se), p_upper of H0: Δ >= margin; p = max of the
    two. Exactly scipy.stats.ttest_1samp(diffs, ±margin, alternative=...) for each side."""
    if not (math.isfinite(margin) and margin > 0):
        raise ValueError(f"tost margin {margin!r}: must be a finite number > 0, stated in the "
                         "metric's units before looking at the data")
    x = np.asarray(diffs, dtype=float)
    x = x[np.isfinite(x)]
    n = int(x.size)
    if n < 2:
        return _empty_equivalence(margin, n, "fewer than 2 seeds: no equivalence test", alpha)
    m, sd = float(x.mean()), float(x.std(ddof=1))
    what = f"TOST, paired t over {n} seeds, margin ±{margin:g}"
    if no_variation(x, scale) or not sd > 0:
        return Equivalence(m, math.nan, math.nan, margin, math.nan, math.nan, math.nan, n,
                           f"{what}: {NO_VARIATION}", alpha, 0.0, n - 1, True)
    se = sd / math.sqrt(n)
    df = n - 1
    p_lower = float(stats.t.sf((m + margin) / se, df))
    p_upper = float(stats.t.cdf((m - margin) / se, df))
    half = float(stats.t.ppf(1 - alpha, df)) * se
    return Equivalence(m, m - half, m + half, margin, max(p_lower, p_upper), p_lower, p_upper,
                       n, what, alpha, se, df)


def _per_seed(test: pd.DataFrame, ref: pd.DataFrame) -> tuple[pd.Series, pd.Series, list,
                                                                np.ndarray]:
    """Each arm's per-seed value (columns seed, value; several rows of a seed are averaged),
    the seeds both have and their differences test - ref in that order."""
    t = test.groupby("seed")["value"].mean()
    r = ref.groupby("seed")["value"].mean()
    common = sorted(set(t.dropna().index) & set(r.dropna().index))
    return t, r, common, (t[common] - r[common]).to_numpy(dtype=float)


def seed_diffs(test: pd.DataFrame, ref: pd.DataFrame) -> tuple[list, np.ndarray]:
    """Per-seed paired differences test - ref: (seeds both have, differences in that order)."""
    return _per_seed(test, ref)[2:]


def seed_tost(test: pd.DataFrame, ref: pd.DataFrame, margin: float,
              alpha: float = ALPHA) -> Equivalence:
    """TOST from per-seed values only (columns seed, value; e.g. validation CE), paired by
    seed: the equivalence counterpart of `seed_delta`."""
    t, r, seeds, diffs = _per_seed(test, ref)
    if not seeds:
        return _empty_equivalence(margin, 0, "no seed in both arms", alpha)
    return tost(diffs, margin, alpha, scale=_scale(t[seeds], r[seeds]))


def paired_tost(test: pd.DataFrame, ref: pd.DataFrame, margin: float,
                alpha: float = ALPHA, pairs: tuple | None = None) -> Equivalence:
    """TOST from per-item rows (columns seed, doc_id, value), paired by (seed, doc_id) as
    `paired_delta` pairs them (`pairs` likewise); the test runs over the per-seed mean
    differences (>= 2 seeds; one seed: no test, item-level equivalence would leave the seed
    variance out)."""
    d, seeds, _ = _pairs(test, ref, pairs)
    if d.size == 0 or d.shape[0] < 2:
        return _empty_equivalence(margin, len(seeds), "fewer than 2 seeds: no equivalence "
                                  "test", alpha)
    return tost(per_seed_diffs(d), margin, alpha, scale=_scale(test["value"], ref["value"]))

