"""Interval estimates used by the tables and the claims checklist.

- `mean_ci`: mean over seeds with a Student-t 95% interval (undefined with one seed).
- `wilson`, `clopper_pearson`: binomial intervals that stay inside [0, 1] and stay honest when a
  tiny model's pass@1 sits at 0 (a normal interval would collapse to [0, 0]).
- `paired_bootstrap`: the delta of a Free Transformer against its reference arm, paired by
  (seed, doc_id), with a two-level bootstrap that resamples seeds and items independently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

LEVEL = 0.95


def mean_ci(values: np.ndarray | list[float], level: float = LEVEL) -> tuple[float, float, float]:
    """Mean and Student-t interval over independent replicates (seeds). NaNs are dropped."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return math.nan, math.nan, math.nan
    m = float(x.mean())
    if x.size < 2:
        return m, math.nan, math.nan
    half = stats.t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return m, m - half, m + half


def wilson(k: float, n: float, level: float = LEVEL) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials."""
    if n <= 0:
        return math.nan, math.nan
    z = stats.norm.ppf(0.5 + level / 2)
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, centre - half), min(1.0, centre + half)


def clopper_pearson(k: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Exact (Clopper-Pearson) binomial interval; conservative, right for pass@1 near 0."""
    if n <= 0:
        return math.nan, math.nan
    ci = stats.binomtest(int(k), int(n)).proportion_ci(confidence_level=level, method="exact")
    return float(ci.low), float(ci.high)


@dataclass(frozen=True)
class PairedDelta:
    """Delta (test - reference) over paired (seed, item) scores with its bootstrap interval."""

    delta: float
    lo: float
    hi: float
    p: float
    n_seeds: int
    n_items: int

    @property
    def significant(self) -> bool:
        return bool(np.isfinite(self.lo) and (self.lo > 0 or self.hi < 0))


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


def bootstrap_stats(d: np.ndarray, n_boot: int = 2000, seed: int = 0,
                    chunk: int = 256) -> np.ndarray:
    """Bootstrap replicates of mean(D) resampling rows (seeds) and columns (items) independently.

    Replicate b draws seed indices `si = rng.integers(0, S, S)` then item indices
    `ii = rng.integers(0, I, I)` and returns `D[si][:, ii].mean()`; the computation uses item
    counts (D @ counts / I) so memory stays at chunk x I.
    """
    rng = np.random.default_rng(seed)
    s_n, i_n = d.shape
    out = np.empty(n_boot)
    for start in range(0, n_boot, chunk):
        stop = min(n_boot, start + chunk)
        counts = np.empty((stop - start, i_n))
        sis = []
        for j in range(stop - start):
            si = rng.integers(0, s_n, s_n)
            ii = rng.integers(0, i_n, i_n)
            sis.append(si)
            counts[j] = np.bincount(ii, minlength=i_n)
        row_means = counts @ d.T / i_n  # (chunk, S): each seed's mean over the resampled items
        for j, si in enumerate(sis):
            out[start + j] = row_means[j, si].mean()
    return out


def paired_bootstrap(test: pd.DataFrame, ref: pd.DataFrame, n_boot: int = 2000, seed: int = 0,
                     level: float = LEVEL) -> PairedDelta:
    """Paired bootstrap of mean(test - ref) over items and seeds (pairs by seed and doc_id).

    The point estimate is the plain mean of the paired differences; the interval is the
    percentile interval of `bootstrap_stats`; p is the two-sided bootstrap p-value for delta = 0.
    """
    d, seeds, docs = paired_matrix(test, ref)
    if d.size == 0:
        return PairedDelta(math.nan, math.nan, math.nan, math.nan, len(seeds), len(docs))
    delta = float(d.mean())
    if np.all(d == d.flat[0]):
        return PairedDelta(delta, delta, delta, 1.0 if delta == 0 else 0.0, *d.shape)
    reps = bootstrap_stats(d, n_boot=n_boot, seed=seed)
    lo, hi = np.quantile(reps, [0.5 - level / 2, 0.5 + level / 2])
    p = min(1.0, 2 * min(float(np.mean(reps <= 0)), float(np.mean(reps >= 0))))
    return PairedDelta(delta, float(lo), float(hi), p, *d.shape)
