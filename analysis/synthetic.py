"""What Z encodes on the synthetic task (paper §4.1, Figure 4): result files -> frames ->
per-seed statistics -> tables (CSV) -> docs/SYNTHETIC.md's generated blocks.

Reads `<results>/synthetic/<name>/samples.jsonl` (experiments/synthetic.py): a `meta` line, a
`model` record per trained model (KL, CE with prior and encoder Z), its generated `sample`s
(per prompt: a group where every row draws its own Z, `per_sequence`, and groups of rows sharing
one pinned Z, `shared`), and `point` / `point_sample` records: the same for every checkpoint kept
along training (`read_run` turns them into frames: one row per measured model and step, one per
sample, parsed).

Measures (`group_metrics`, `gap_tests`): validity (a 64-character body with one run of 8 of the
prompted letter, noise allowed); position agreement (pairs of valid rows with the same run start)
within a shared group, across two shared groups of one prompt, and within the per-sequence group;
noise agreement (Jaccard of the '!' sets); every gap shared - across with a jackknife interval
over the shared groups and a one-sided permutation p. The regime rules: v1 (issue 6, point
estimates: REGIMES) and v2 (issue 38, intervals and p: REGIMES_V2, PREDICATES). The commands
(one run, one run per seed, render-doc): docs/SYNTHETIC.md and mk/synthetic.mk.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import os
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.patches import Rectangle

from common.arms import BASELINE
from common.errors import UsageError, cli
from common.kappa import kappa_label as common_kappa_label
from common.paths import RunDir, results_root

from .render import DASH, blocks, ci, fmt, md, template, write_doc
from .stats import t_half

matplotlib.use("Agg")  # PNGs only, never a display

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "SYNTHETIC.md"
BODY_LEN, RUN_LEN, NOISE_CHAR, BLANK_CHAR = 64, 8, "!", "_"
N_STARTS = BODY_LEN - RUN_LEN + 1
BLUE, GREEN, GREY = "#2b5fb8", "#2e9b3a", "#888888"  # the paper's Figure 4: per-sequence, shared
FINAL = -1
"""The step key of a model's final samples (its kept checkpoints have their own steps)."""

# v1 (issue 6), thresholds fixed before looking at any run; v2 (issue 38) kept the same two
NO_BETTER_MARGIN = 0.05  # 1/64 bit: shared - across <= this; v2: a gap too small to call encoding
CLEARLY_HIGHER_MARGIN = 0.10  # 1/8 or 1 bit (the noise gap too): shared - across >= this
VALIDITY_DROP = 0.20  # 8 bits: validity <= the baseline's - this; v2: broken generation


def kappa_label(kappa_bits: float | None) -> str:
    """common.kappa's label; None (no latent) is the baseline."""
    return BASELINE.name if kappa_bits is None else common_kappa_label(kappa_bits)


def _num(v: Any) -> float | None:
    """A measured number, or None (missing: None or NaN, never 0)."""
    if v is None:
        return None
    f = float(v)
    return None if math.isnan(f) else f


def _diff(a: Any, b: Any) -> float | None:
    a, b = _num(a), _num(b)
    return None if a is None or b is None else a - b


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _jk_var(jk: np.ndarray) -> float:
    """The delete-one jackknife variance of an estimate from its leave-one-out values."""
    n = jk.size
    return (n - 1) / n * float(((jk - jk.mean()) ** 2).sum())



# --------------------------------------------------------------------------- result files
@dataclass(frozen=True)
class Parsed:
    valid: bool
    start: int | None  # run start in the body when valid
    noise: frozenset[int]  # positions of '!' in the body (any sample)
    full_length: bool


def parse_body(body: str, letter: str) -> Parsed:
    """One generated body (the 64 characters after the prompt "<letter>>"): valid when it holds
    only '_', '!' and the letter, and the letters fit in one window of 8 made of the letter and
    '!' (noise may replace letters of the run); the first window that fits is the start."""
    noise = frozenset(i for i, c in enumerate(body[:BODY_LEN]) if c == NOISE_CHAR)
    full = len(body) == BODY_LEN
    invalid = Parsed(False, None, noise, full)
    if not full or any(c not in (BLANK_CHAR, NOISE_CHAR, letter) for c in body):
        return invalid
    pos = [i for i, c in enumerate(body) if c == letter]
    if not pos or pos[-1] - pos[0] + 1 > RUN_LEN:
        return invalid
    for s in range(max(0, pos[-1] - RUN_LEN + 1), min(pos[0], BODY_LEN - RUN_LEN) + 1):
        if all(c in (letter, NOISE_CHAR) for c in body[s:s + RUN_LEN]):
            return Parsed(True, s, noise, full)
    return invalid


UNIT_COLS = ["model", "arm", "kappa_bits", "latent_bits", "step", "final", "kl_bits",
             "ce_prior", "ce_encoder", "ce_prior_sd", "n_eval", "steps", "train_wall_s",
             "run_id", "run_dir", "marginal_bias_bits"]
"""marginal_bias_bits: the prior hole, KL(q_bar || uniform) of the encoder's mean code
distribution on the held-out sequences (experiments/synthetic.py records it since issue 44;
absent, never 0, for older runs)."""


@dataclass
class Run:
    """One samples.jsonl as frames."""

    meta: dict[str, Any]
    units: pd.DataFrame
    """One row per measured model checkpoint (UNIT_COLS): each model record (final, at its
    `steps`), then each kept checkpoint (`point`); kappa_bits None for the baseline."""
    samples: pd.DataFrame
    """One row per generated sample: model, step (FINAL for the final model's), prompt_idx,
    group, group_kind, row, letter, text and the parsed body (`p`)."""

    @property
    def models(self) -> pd.DataFrame:
        return self.units[self.units["final"]]

    @property
    def seed(self) -> Any:
        return (self.meta.get("settings") or {}).get("seed")

    def of(self, model: str, step: int = FINAL) -> pd.DataFrame:
        """The samples of one model at one step (FINAL: the final model)."""
        return self._by.get((model, step), self.samples.iloc[:0])

    def __post_init__(self) -> None:
        self._by = {k: g for k, g in self.samples.groupby(["model", "step"], sort=False)}


def read_run(lines: Iterable[str]) -> Run:
    """A samples.jsonl's lines (a file, or a committed .gz decompressed) as a Run."""
    meta: dict[str, Any] = {}
    units, samples = [], []
    for line in lines:
        if not line.strip():
            continue
        r = json.loads(line)
        kind = r.get("kind")
        if kind == "meta":
            meta = r
        elif kind in ("model", "point"):
            base = r.get("arm") == BASELINE.name
            units.append({**{k: r.get(k) for k in UNIT_COLS}, "final": kind == "model",
                          "kappa_bits": None if base else _num(r.get("kappa_bits")),
                          "step": r.get("steps") if kind == "model" else int(r["step"])})
        elif kind in ("sample", "point_sample"):
            samples.append({**r, "step": FINAL if kind == "sample" else int(r["step"])})
    u = pd.DataFrame(units, columns=UNIT_COLS).astype({"final": bool})
    u = pd.concat([u[u["final"]], u[~u["final"]]], ignore_index=True)
    u = u.astype(object).where(u.notna(), None).astype({"final": bool})
    s = pd.DataFrame(samples, columns=["model", "step", "prompt_idx", "group", "group_kind",
                                       "row", "letter", "text"])
    return Run(meta, u, _frame(s))


def load_run(path: Path) -> Run:
    with open(path, encoding="utf-8") as f:
        return read_run(f)


def _frame(samples: Iterable[dict[str, Any]] | pd.DataFrame) -> pd.DataFrame:
    """Samples as a frame with the parsed body (`p`)."""
    s = samples if isinstance(samples, pd.DataFrame) else pd.DataFrame(list(samples))
    if "p" not in s:
        s = s.assign(p=[parse_body(t, c) for t, c in zip(s["text"], s["letter"], strict=True)])
    return s


# --------------------------------------------------------------------------- measures
KEYS = ("pos", "pos_n", "noise", "noise_n")


def _mats(ps: list[Parsed]) -> dict[str, np.ndarray]:
    """The pair matrices of a list of rows (zero diagonal): pos = both valid and the same
    start, pos_n = both valid, noise = Jaccard of the '!' sets when both are full length,
    noise_n = both full length."""
    valid = np.array([p.valid for p in ps], dtype=float)
    full = np.array([p.full_length for p in ps], dtype=float)
    start = np.array([p.start if p.valid else -1 for p in ps])
    bits = np.zeros((len(ps), BODY_LEN))
    for i, p in enumerate(ps):
        bits[i, list(p.noise)] = 1.0
    inter = bits @ bits.T
    union = bits.sum(1)[:, None] + bits.sum(1)[None, :] - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        jac = np.where(union > 0, inter / union, 1.0)
    m = {"pos_n": np.outer(valid, valid), "noise_n": np.outer(full, full)}
    m["pos"] = m["pos_n"] * (start[:, None] == start[None, :])
    m["noise"] = m["noise_n"] * jac
    for v in m.values():
        np.fill_diagonal(v, 0.0)
    return m


@dataclass
class _Prompt:
    """One prompt's shared-Z rows: group index per row, and the pair matrices."""

    labels: np.ndarray
    mats: dict[str, np.ndarray]

    @property
    def blocks(self) -> dict[str, np.ndarray]:
        """Per matrix, the group-by-group sums L^T M L (G x G; the diagonal counts each within
        pair twice, an off-diagonal cell the pairs between two groups)."""
        L = np.eye(int(self.labels.max()) + 1)[self.labels]
        return {k: L.T @ m @ L for k, m in self.mats.items()}


def _prompts(s: pd.DataFrame) -> list[_Prompt]:
    out = []
    sh = s[s["group_kind"] == "shared"]
    for _, g in sh.groupby("prompt_idx", sort=True):
        groups = sorted(set(g["group"].astype(int)))
        out.append(_Prompt(np.array([groups.index(int(x)) for x in g["group"]]),
                           _mats(list(g["p"]))))
    return out


def _sums(prompts: list[_Prompt]) -> tuple[dict[str, float], dict[str, float], list]:
    """(within sums, all-pair sums of the shared rows, each prompt's blocks)."""
    bl = [pp.blocks for pp in prompts]
    within = {k: sum(float(np.trace(b[k])) / 2 for b in bl) for k in KEYS}
    total = {k: sum(float(b[k].sum()) / 2 for b in bl) for k in KEYS}
    return within, total, bl


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def _gap_of(within: dict[str, float], total: dict[str, float], kind: str) -> float | None:
    """shared - across from summed pair values (across = all pairs - within pairs)."""
    w = _ratio(within[kind], within[kind + "_n"])
    a = _ratio(total[kind] - within[kind], total[kind + "_n"] - within[kind + "_n"])
    return None if w is None or a is None else w - a


def group_metrics(samples: Iterable[dict[str, Any]] | pd.DataFrame) -> dict[str, Any]:
    """Validity and agreement of one model's samples at one step (the module docstring)."""
    s = _frame(samples)
    within, total, _ = _sums(_prompts(s))
    per = {k: 0.0 for k in KEYS}
    for _, g in s[s["group_kind"] != "shared"].groupby(["prompt_idx", "group"], sort=False):
        for k, m in _mats(list(g["p"])).items():
            per[k] += float(m.sum()) / 2
    across = {k: total[k] - within[k] for k in KEYS}
    full = [len(p.noise) / BODY_LEN for p in s["p"] if p.full_length]
    return {"n_samples": len(s), "validity": _mean([float(p.valid) for p in s["p"]]),
            **{f"pos_agree_{w}": _ratio(d["pos"], d["pos_n"])
               for w, d in (("within", within), ("across", across), ("per_seq", per))},
            **{f"noise_jaccard_{w}": _ratio(d["noise"], d["noise_n"])
               for w, d in (("within", within), ("across", across), ("per_seq", per))},
            "noise_rate": _mean(full), "n_pairs_within": int(within["pos_n"]),
            "n_pairs_across": int(across["pos_n"])}


# Every gap (shared Z - across Z) carries a 95% interval and a permutation p (issue 38).
# - p: one-sided permutation test of "Z does not matter": within each prompt the shared rows'
#   group labels are shuffled (group sizes kept), N_PERM times; p = (1 + #{shuffled gap >=
#   observed}) / (1 + N_PERM). Exact under the null whatever the dependence between pairs.
#   scipy's permutation_test permutes samples, not the group labels of pairs: hence the code.
# - interval: delete-one-group jackknife over the shared Z groups (the unit Z is drawn for;
#   pairs share rows, so a binomial interval over pairs would be far too narrow).
# - validity minus the same seed's baseline: the same jackknife over all groups of each arm,
#   se added in quadrature, t with min(n_groups) - 1 df; CE with prior Z: mean +- t sd/sqrt(n)
#   where the run recorded the per-sequence SD (`ce_prior_sd`, since issue 38), else none.
GAP_ALPHA, GAP_LEVEL = 0.05, 0.95
N_PERM = 9999
PERM_SEED = 38  # one fixed stream: the same shuffles for every model, rerunnable
GAP_KINDS = ("pos", "noise")


def _interval(x: float, se: float, df: float, bounds: tuple[float | None, float | None] = (
        -1.0, 1.0), level: float = GAP_LEVEL) -> tuple[float | None, float | None]:
    """x +- t(df) se, clipped to `bounds` (None: unbounded); (None, None) without an se."""
    if not math.isfinite(se) or df < 1:
        return None, None
    half, (lo, hi) = t_half(df, se, level), bounds
    return (x - half if lo is None else max(lo, x - half),
            x + half if hi is None else min(hi, x + half))


def gap_tests(samples: Iterable[dict[str, Any]] | pd.DataFrame, n_perm: int = N_PERM,
              seed: int = PERM_SEED, level: float = GAP_LEVEL) -> dict[str, Any]:
    """Position and noise gaps of one model's samples (one checkpoint) with their jackknife
    interval over the shared Z groups and one-sided permutation p; n stated (groups, rows,
    pairs). A gap with no pair on one side is None, and so are its interval and p."""
    prompts = [pp for pp in _prompts(_frame(samples)) if pp.labels.size]
    within, total, bl = _sums(prompts)
    out: dict[str, Any] = {"n_groups": sum(int(pp.labels.max()) + 1 for pp in prompts),
                           "n_rows": sum(int(pp.labels.size) for pp in prompts),
                           "n_perm": n_perm}
    for kind in GAP_KINDS:
        out[f"n_{kind}_within"] = int(within[kind + "_n"])
        out[f"n_{kind}_across"] = int(total[kind + "_n"] - within[kind + "_n"])
    loo: dict[str, list[float]] = {kind: [] for kind in GAP_KINDS}  # drop one (prompt, group)
    for b in bl:
        for g in range(b["pos"].shape[0]):
            w = {k: within[k] - float(b[k][g, g]) / 2 for k in KEYS}
            t = {k: total[k] - float(b[k][g].sum()) + float(b[k][g, g]) / 2 for k in KEYS}
            for kind in GAP_KINDS:
                v = _gap_of(w, t, kind)
                if v is not None:
                    loo[kind].append(v)
    rng = np.random.default_rng(seed)  # the same shuffles for both gaps
    perm_w = {k: np.zeros(n_perm) for k in KEYS}
    for pp in prompts:
        lab = rng.permuted(np.tile(pp.labels, (n_perm, 1)), axis=1)
        L = np.eye(int(pp.labels.max()) + 1)[lab]  # (n_perm, rows, G)
        for k in KEYS:
            perm_w[k] += (L * (pp.mats[k] @ L)).sum(axis=(1, 2)) / 2
    for kind in GAP_KINDS:
        g = _gap_of(within, total, kind)
        lo = hi = p = None
        if g is not None:
            if (n := len(loo[kind])) >= 2:
                lo, hi = _interval(g, math.sqrt(_jk_var(np.asarray(loo[kind]))), n - 1,
                                   level=level)
            with np.errstate(invalid="ignore", divide="ignore"):
                pg = perm_w[kind] / perm_w[kind + "_n"] - (
                    (total[kind] - perm_w[kind]) / (total[kind + "_n"] - perm_w[kind + "_n"]))
            # a shuffle with no pair on one side counts against the finding (conservative)
            p = (1 + int(np.sum(~np.isfinite(pg) | (pg >= g - 1e-12)))) / (1 + n_perm)
        out.update({f"{kind}_gap": g, f"{kind}_lo": lo, f"{kind}_hi": hi, f"{kind}_p": p})
    return out


def _validity_jackknife(samples: Iterable[dict[str, Any]] | pd.DataFrame
                        ) -> tuple[float | None, float, int, int]:
    """Validity over all rows, its delete-one-group jackknife variance, groups, rows."""
    s = _frame(samples)
    g = s.assign(v=[p.valid for p in s["p"]]).groupby(["prompt_idx", "group"], sort=False)["v"]
    k, n = g.sum().to_numpy(float), g.size().to_numpy(float)
    if n.sum() == 0:
        return None, math.nan, 0, 0
    var = _jk_var((k.sum() - k) / (n.sum() - n)) if k.size >= 2 else math.nan
    return float(k.sum() / n.sum()), var, k.size, int(n.sum())


def validity_diff(ft: Iterable[dict[str, Any]] | pd.DataFrame,
                  base: Iterable[dict[str, Any]] | pd.DataFrame,
                  level: float = GAP_LEVEL) -> dict[str, Any]:
    """Validity of `ft` minus the baseline's (same seed, same step), with its interval."""
    (v, var, m, _), (vb, varb, mb, _) = _validity_jackknife(ft), _validity_jackknife(base)
    out = {"validity_diff": None, "validity_diff_lo": None, "validity_diff_hi": None}
    if v is None or vb is None:
        return out
    out["validity_diff"] = d = v - vb
    out["validity_diff_lo"], out["validity_diff_hi"] = _interval(
        d, math.sqrt(var + varb), min(m, mb) - 1, level=level)
    return out


def ce_interval(rec: dict[str, Any], level: float = GAP_LEVEL
                ) -> tuple[float | None, float | None]:
    """CE with prior Z +- t * sd / sqrt(n_eval) from the recorded per-sequence SD; (None,
    None) for runs that did not record it."""
    ce, sd, n = _num(rec.get("ce_prior")), _num(rec.get("ce_prior_sd")), _num(rec.get("n_eval"))
    if ce is None or sd is None or n is None or n < 2:
        return None, None
    return _interval(ce, sd / math.sqrt(n), int(n) - 1, (None, None), level)


# --------------------------------------------------------------------------- rules
@dataclass(frozen=True)
class Regime:
    kappa_bits: float
    expected: str  # what the paper shows at this kappa
    rule: str  # the rule, in words, as the tables print it


REGIMES = (  # v1 (issue 6): point estimates
    Regime(1 / 64, "Z unused",
           f"position gap <= {NO_BETTER_MARGIN} and noise gap <= {NO_BETTER_MARGIN}"),
    Regime(1 / 8, "position", f"position gap >= {CLEARLY_HIGHER_MARGIN}"),
    Regime(1.0, "position and noise",
           f"position gap >= {CLEARLY_HIGHER_MARGIN} and noise gap >= {CLEARLY_HIGHER_MARGIN}"),
    Regime(8.0, "collapse (leaking)", f"validity <= the same seed's baseline's - {VALIDITY_DROP}"),
)


def _at(rules: Sequence[Any], kappa_bits: float | None) -> Any:
    if kappa_bits is None:
        return None
    return next((r for r in rules if abs(r.kappa_bits - kappa_bits) < 1e-12), None)


def regime_for(kappa_bits: float | None) -> Regime | None:
    return _at(REGIMES, kappa_bits)


def regime_result(kappa_bits: float | None, row: dict,
                  baseline_validity: float | None) -> str | None:
    """v1: 'pass', 'fail' or 'n/a' (not measurable); None: no regime at this kappa."""
    r = regime_for(kappa_bits)
    if r is None:
        return None
    pos, noise, v = _num(row.get("pos_gap")), _num(row.get("noise_gap")), _num(row.get("validity"))
    need, ok = {
        "Z unused": ((pos, noise), lambda: pos <= NO_BETTER_MARGIN and noise <= NO_BETTER_MARGIN),
        "position": ((pos,), lambda: pos >= CLEARLY_HIGHER_MARGIN),
        "position and noise": ((pos, noise), lambda: pos >= CLEARLY_HIGHER_MARGIN
                               and noise >= CLEARLY_HIGHER_MARGIN),
    }.get(r.expected, ((v, baseline_validity), lambda: v <= baseline_validity - VALIDITY_DROP))
    return "n/a" if any(x is None for x in need) else ("pass" if ok() else "fail")


# v2 (issue 38), written and committed before any interval of the committed runs was computed.
# Each predicate is "yes", "no" or "unclear"; a rule holds when every predicate it needs has the
# wanted value, fails when one has the other value, and is unclear otherwise. A rule is an
# intersection of tests, so it needs no multiplicity correction.
_P_LETTER = RUN_LEN / BODY_LEN * (1 - 1 / 16)
_P_BLANK = (BODY_LEN - RUN_LEN) / BODY_LEN * (1 - 1 / 16)
UNIGRAM_CE = -sum(p * math.log(p) for p in (_P_LETTER, 1 / 16, _P_BLANK))
"""0.587 nats/char: CE of a predictor that knows the prompt's letter and how often each
character occurs, but nothing of where the run is (a task constant). A CE with prior Z above it
means the Z drawn from the prior misleads the decoder: generation from the prior breaks."""

PREDICATES: dict[str, str] = {
    "pos_encoded": (f"Z encodes the position: yes if the position gap's permutation p < "
                    f"{GAP_ALPHA}; no if p >= {GAP_ALPHA} and its 95% interval lies below "
                    f"{NO_BETTER_MARGIN}; unclear otherwise"),
    "noise_encoded": "Z encodes the noise: the same on the noise gap",
    "pos_negligible": (f"the position gap is negligible: yes if its 95% interval lies below "
                       f"{NO_BETTER_MARGIN}; no if it lies above {NO_BETTER_MARGIN}; "
                       "unclear otherwise"),
    "noise_negligible": "the noise gap is negligible: the same on the noise gap",
    "validity_drop": (f"validity is broken: yes if the 95% interval of validity minus the same "
                      f"seed's baseline's lies below -{VALIDITY_DROP}; no if it lies above "
                      f"-{VALIDITY_DROP} (with no baseline arm: no if the validity's own "
                      f"interval lies above 1 - {VALIDITY_DROP}); unclear otherwise"),
    "ce_broken": (f"CE with prior Z is broken: yes if it is above {UNIGRAM_CE:.3f} nats/char "
                  "(the task's unigram CE: the prompt's letter and the character frequencies, "
                  "nothing of the position) by its 95% interval; no if below it; unclear "
                  "otherwise; runs that recorded no per-sequence SD are judged on the point "
                  "estimate"),
    "leaking": ("leaking (the encoder passes the tokens through Z; generation with Z from the "
                "prior breaks): validity is broken or CE with prior Z is broken (yes if either "
                "is yes, no if both are no, unclear otherwise)"),
    "samples_break": ("prior generation breaks, judged from the samples only (issue 44): the "
                      "validity predicate above; the CE rule is not evidence of it (an exact "
                      "latent model's CE with prior Z exceeds its likelihood by KL(u||q))"),
}
CE_VS_SAMPLES = {("yes", "no"): "CE says broken, samples valid",
                 ("no", "yes"): "CE says sound, samples broken"}
"""Where v2's CE predicate and the samples disagree (ce_broken, samples_break): marked."""


@dataclass(frozen=True)
class RuleV2:
    kappa_bits: float
    regime: str  # what the paper shows at this kappa, in this file's words
    needs: tuple[tuple[str, bool], ...]  # (predicate, wanted: True = yes, False = no)
    text: str  # the rule in words, as the doc and tables print it


REGIMES_V2 = (
    RuleV2(1 / 64, "Z unused", (("pos_negligible", True), ("noise_negligible", True)),
           "position gap negligible and noise gap negligible"),
    RuleV2(1 / 8, "position",
           (("pos_encoded", True), ("noise_negligible", True), ("leaking", False)),
           "Z encodes the position, the noise gap is negligible, and not leaking"),
    RuleV2(1.0, "position and noise",
           (("pos_encoded", True), ("noise_encoded", True), ("leaking", False)),
           "Z encodes the position and the noise, and not leaking"),
    RuleV2(8.0, "leaking (the paper's collapse)", (("leaking", True),), "leaking"),
)
VERDICT_COLUMNS = ("name", "seed", "model", "kappa_bits", "latent_bits", "kl_penalty",
                   "regime", "result_v1", "result_v2", *PREDICATES, "why_v2",
                   "result_samples", "ce_vs_samples")
"""result_samples: the v2 rule with `leaking` judged from the samples only (`samples_break`);
ce_vs_samples: where v2's CE predicate disagrees with the samples (CE_VS_SAMPLES), else ''."""


def rule_v2_for(kappa_bits: float | None) -> RuleV2 | None:
    return _at(REGIMES_V2, kappa_bits)


def _yes_no(yes: bool | None, no: bool | None) -> str:
    return "yes" if yes else "no" if no else "unclear"


def predicates(row: dict[str, Any]) -> dict[str, str]:
    """The v2 predicates of one final-model row of gaps.csv (PREDICATES says each rule)."""
    out: dict[str, str] = {}
    for kind in GAP_KINDS:
        p, lo, hi = (_num(row.get(f"{kind}_{k}")) for k in ("p", "lo", "hi"))
        below = None if hi is None else hi < NO_BETTER_MARGIN
        detected = None if p is None else p < GAP_ALPHA
        out[f"{kind}_encoded"] = _yes_no(detected, (detected is False) and below)
        out[f"{kind}_negligible"] = _yes_no(below, None if lo is None
                                            else lo > NO_BETTER_MARGIN)
    d_lo, d_hi = _num(row.get("validity_diff_lo")), _num(row.get("validity_diff_hi"))
    if d_lo is not None and d_hi is not None:
        out["validity_drop"] = _yes_no(d_hi < -VALIDITY_DROP, d_lo > -VALIDITY_DROP)
    else:  # no baseline at this step: no baseline can sit 0.2 above a validity above 0.8
        v_lo = _num(row.get("validity_lo"))
        out["validity_drop"] = _yes_no(None, None if v_lo is None
                                       else v_lo > 1 - VALIDITY_DROP)
    ce = _num(row.get("ce_prior"))
    c_lo, c_hi = _num(row.get("ce_prior_lo")), _num(row.get("ce_prior_hi"))
    lo_, hi_ = (c_lo, c_hi) if c_lo is not None and c_hi is not None else (ce, ce)
    out["ce_broken"] = "unclear" if ce is None else _yes_no(lo_ > UNIGRAM_CE, hi_ <= UNIGRAM_CE)
    pair = (out["validity_drop"], out["ce_broken"])
    out["leaking"] = "yes" if "yes" in pair else "no" if pair == ("no", "no") else "unclear"
    out["samples_break"] = out["validity_drop"]
    return out


def judge_v2(kappa_bits: float | None, preds: dict[str, str]) -> tuple[str | None, str]:
    """('holds' | 'fails' | 'unclear', why) for the kappa's v2 rule; (None, '') without one."""
    rule = rule_v2_for(kappa_bits)
    if rule is None:
        return None, ""
    got = [(pred, want, preds[pred]) for pred, want in rule.needs]
    bad = any(v == ("no" if want else "yes") for _, want, v in got)
    res = "fails" if bad else "unclear" if any(v == "unclear" for *_, v in got) else "holds"
    return res, "; ".join(f"{p.replace('_', ' ')}: {v}" for p, _, v in got)


def verdicts(gaps: pd.DataFrame) -> pd.DataFrame:
    """Per run and model (final models only): the v1 and v2 results side by side, with every
    v2 predicate and why (VERDICT_COLUMNS)."""
    rows = []
    for _, r in gaps[gaps["final"].astype(bool)].iterrows():
        k, h = _num(r["kappa_bits"]), _num(r.get("latent_bits"))
        if k is None:
            continue
        row = r.to_dict()
        preds = predicates(row)
        res, why = judge_v2(k, preds)
        res_s, _ = judge_v2(k, {**preds, "leaking": preds["samples_break"]})
        rule = rule_v2_for(k)
        rows.append({"name": r["name"], "seed": r["seed"], "model": r["model"], "kappa_bits": k,
                     "latent_bits": None if h is None else int(h),
                     # KL <= H bits, so max(0, KL - kappa) is identically 0 when kappa >= H
                     "kl_penalty": "none (kappa >= H)" if h is not None and k >= h
                     else "free bits", "regime": rule.regime if rule else None,
                     "result_v1": regime_result(k, row, _num(row.get("validity_base"))),
                     "result_v2": res, **preds, "why_v2": why, "result_samples": res_s,
                     "ce_vs_samples": CE_VS_SAMPLES.get((preds["ce_broken"],
                                                         preds["samples_break"]), "")})
    return pd.DataFrame(rows, columns=list(VERDICT_COLUMNS))


def acceptance(df: pd.DataFrame) -> list[dict[str, Any]]:
    """One run's check of the paper's pattern (issue 6: pass, fail or n/a); '1/8 or 1 bit' is
    passed by one measured arm, failed only when every arm is measured."""
    def gap(kappa: float) -> float | None:
        hit = df[(df["kappa_bits"] - kappa).abs() < 1e-9] if len(df) else df
        return None if hit.empty else _diff(hit.iloc[0]["pos_agree_within"],
                                            hit.iloc[0]["pos_agree_across"])

    out = []
    g = gap(1 / 64)
    out.append({"check": "1/64 bit: position agreement within shared-Z groups no better than "
                         f"across (within - across <= {NO_BETTER_MARGIN})", "measured": g,
                "result": "n/a" if g is None else "pass" if g <= NO_BETTER_MARGIN else "fail"})
    gaps = {"1/8": gap(1 / 8), "1": gap(1.0)}
    have = [v for v in gaps.values() if v is not None]
    out.append({"check": "1/8 or 1 bit: position agreement within shared-Z groups clearly "
                         f"higher than across (within - across >= {CLEARLY_HIGHER_MARGIN})",
                "measured": gaps, "result": "pass" if any(g >= CLEARLY_HIGHER_MARGIN
                                                          for g in have)
                else "fail" if len(have) == len(gaps) else "n/a"})
    r8, base = df[(df["kappa_bits"] - 8.0).abs() < 1e-9], df[df["kappa_bits"].isna()]
    if r8.empty or base.empty:
        out.append({"check": "8 bits: validity well below the baseline's", "measured": None,
                    "result": "n/a"})
    else:
        v8, vb = float(r8.iloc[0]["validity"]), float(base.iloc[0]["validity"])
        out.append({"check": f"8 bits: validity well below the baseline's (<= baseline - "
                             f"{VALIDITY_DROP})", "measured": {"kappa_8": v8, "baseline": vb},
                    "result": "pass" if v8 <= vb - VALIDITY_DROP else "fail"})
    return out


# --------------------------------------------------------------------------- tables
SEED_METRICS = ("kl_bits", "pos_agree_within", "pos_agree_across", "pos_gap",
                "noise_jaccard_within", "noise_jaccard_across", "noise_gap", "validity",
                "noise_rate", "ce_prior", "ce_encoder", "train_wall_s")
CURVE_POINTS = 16  # KL over training: the logged training batches binned into this many points
TABLE_CSV = ["model", "arm", "kappa_bits", "latent_bits", "n_samples", "validity",
             "pos_agree_within", "pos_agree_across", "pos_agree_per_seq", "noise_jaccard_within",
             "noise_jaccard_across", "noise_jaccard_per_seq", "noise_rate", "n_pairs_within",
             "n_pairs_across", "kl_bits", "ce_prior", "ce_encoder", "steps", "train_wall_s",
             "run_id"]
AGREEMENT_COLUMNS = ("name", "seed", "model", "kappa_bits", "step", "final", "kl_bits",
                     "ce_prior", "ce_encoder", "validity", "pos_agree_within",
                     "pos_agree_across", "pos_gap", "noise_jaccard_within",
                     "noise_jaccard_across", "noise_gap", "n_samples")
GAP_COLUMNS = ("name", "seed", "model", "kappa_bits", "latent_bits", "step", "final",
               "n_groups", "n_rows", "pos_gap", "pos_lo", "pos_hi", "pos_p", "n_pos_within",
               "n_pos_across", "noise_gap", "noise_lo", "noise_hi", "noise_p",
               "n_noise_within", "n_noise_across", "validity", "validity_lo", "validity_hi",
               "n_groups_all", "n_rows_all", "validity_base", "validity_diff",
               "validity_diff_lo", "validity_diff_hi", "ce_prior",
               "ce_prior_lo", "ce_prior_hi", "n_perm", "marginal_bias_bits")


def _order(kappa: Any) -> float:
    k = _num(kappa)
    return -1.0 if k is None else k


def _by_kappa(df: pd.DataFrame) -> pd.DataFrame:
    """Baseline first, then by kappa (stable)."""
    return df.iloc[np.argsort([_order(k) for k in df["kappa_bits"]], kind="stable")]


def measure_run(name: str, run: Run, n_perm: int = N_PERM) -> pd.DataFrame:
    """One row per measured model checkpoint, in Run.units' order: the record's numbers and
    its samples' measures (group_metrics); with n_perm > 0 also the gaps' intervals and p,
    validity against the same seed's baseline at the same step and CE's interval."""
    base = next((u.model for u in run.models.itertuples() if u.arm == BASELINE.name), None)
    rows = []
    for u in run.units.itertuples(index=False):
        key = FINAL if u.final else int(u.step)
        smp = run.of(u.model, key)
        r = {**u._asdict(), "name": name, "seed": run.seed, **group_metrics(smp)}
        r["pos_gap"] = _diff(r["pos_agree_within"], r["pos_agree_across"])
        r["noise_gap"] = _diff(r["noise_jaccard_within"], r["noise_jaccard_across"])
        if n_perm and len(smp):
            bs = run.of(base, key) if base is not None and u.model != base else smp.iloc[:0]
            v, var, m_all, n_all = _validity_jackknife(smp)
            lo, hi = ce_interval(r)
            v_lo, v_hi = _interval(v, math.sqrt(var), m_all - 1, (0.0, 1.0))
            r.update(gap_tests(smp, n_perm=n_perm), n_groups_all=m_all, n_rows_all=n_all,
                     validity_lo=v_lo, validity_hi=v_hi,
                     validity_base=_validity_jackknife(bs)[0] if len(bs) else None,
                     ce_prior_lo=lo, ce_prior_hi=hi, **validity_diff(smp, bs))
        rows.append(r)
    return pd.DataFrame(rows)


def agreement_rows(f: pd.DataFrame) -> pd.DataFrame:
    """Per model that kept checkpoints: one row per checkpoint, then the final model (its
    last point); a model that kept none has no rows (AGREEMENT_COLUMNS)."""
    kept = set(f.loc[~f["final"], "model"])
    parts = [g[g["step"].notna()].assign(step=lambda x: x["step"].astype(int)).sort_values(
        ["final", "step"], kind="stable") for m, g in f.groupby("model", sort=False) if m in kept]
    if not parts:
        return pd.DataFrame(columns=list(AGREEMENT_COLUMNS))
    return pd.concat(parts).reindex(columns=list(AGREEMENT_COLUMNS))


def kl_curve(metrics_path: Path, points: int = CURVE_POINTS,
             has_kl: bool = True) -> list[dict[str, Any]]:
    """The trainer's per-batch KL (bits/token) and CE (nats/token, Z from the encoder),
    averaged in `points` equal bins of steps, each labelled by its bin's last step.
    has_kl=False (the baseline, whose log says 0.0): KL is None, not zero."""
    recs = [r for r in RunDir(metrics_path.parent).metrics_json()
            if r.get("kind") == "train" and r.get("ce") is not None]
    if not recs:
        return []
    last = max(int(r["step"]) for r in recs)
    width = max(1, math.ceil(last / points))
    bins: dict[int, list[dict]] = defaultdict(list)
    for r in recs:
        bins[min(last, math.ceil(int(r["step"]) / width) * width)].append(r)
    return [{"step": s, "kl_bits": _mean([float(r["kl_bits"]) for r in rs
                                          if has_kl and r.get("kl_bits") is not None]),
             "ce": _mean([float(r["ce"]) for r in rs]), "n_batches": len(rs)}
            for s, rs in sorted(bins.items())]


def _curve(u: Any, has_kl: bool, root: Path) -> list[dict[str, Any]] | None:
    """The KL curve of an arm from its metrics.jsonl (at its recorded run_dir, else under
    <results>/runs/<run_id>); None when neither is there."""
    for run in (u.run_dir and RunDir(Path(u.run_dir)), u.run_id and RunDir.of(u.run_id, root)):
        if run and run.has_metrics:
            return kl_curve(run.metrics_path, has_kl=has_kl)
    return None


@dataclass
class SeedAggregate:
    per_seed: pd.DataFrame  # one row per (name, model); missing names: rows of None
    summary: pd.DataFrame  # one row per model: mean and n of every metric, regime counts
    curves: pd.DataFrame  # KL over training per (name, model, step)
    meta: dict[str, Any]  # provenance: sources, settings, wall times
    agreement: pd.DataFrame  # held-out measures per (name, model, kept checkpoint)
    measured: pd.DataFrame  # measure_run's rows of every run: gaps.csv's source


PER_SEED_COLUMNS = ["name", "seed", "status", "model", "kappa_bits", "steps", "run_id",
                    *(c for c in SEED_METRICS if not c.endswith("_gap")), "pos_gap", "noise_gap"]


def aggregate(names: Sequence[str], root: Path | None = None) -> SeedAggregate:
    """Several `make synthetic` runs (one per seed) -> per-seed and mean tables. A name
    without samples.jsonl is missing (rows of None); UsageError when none has one."""
    root = results_root() if root is None else Path(root)
    if len(set(names)) != len(names):
        raise UsageError(f"--names {' '.join(names)}: a name is given twice")
    frames, curves, sources = [], [], []
    for name in names:
        f = root / "synthetic" / name / "samples.jsonl"
        if not f.is_file():
            sources.append({"name": name, "status": "missing", "path": str(f)})
            continue
        run = load_run(f)
        if run.models.empty:
            raise UsageError(f"{f} holds no model records")
        frames.append(measure_run(name, run).assign(status="measured"))
        fin = frames[-1][frames[-1]["final"]]
        ks = [_num(k) for k in fin["kappa_bits"]]
        pts = {u.model: _curve(u, k is not None, root)
               for u, k in zip(fin.itertuples(), ks, strict=True)}
        curves += [{"name": name, "seed": run.seed, "model": m, "kappa_bits": k, **p}
                   for (m, ps), k in zip(pts.items(), ks, strict=True) for p in ps or []]
        st, walls = run.meta.get("settings", {}), [_num(x) for x in run.models["train_wall_s"]]
        sources.append({"name": name, "status": "measured", "path": str(f),
                        "sha256": hashlib.sha256(f.read_bytes()).hexdigest(),
                        "created": run.meta.get("created"), "seed": run.seed,
                        **{k: st.get(k) for k in ("setting", "latent_bits", "high_latent_bits",
                                                  "kappas", "baseline", "train_overrides")},
                        "extra_overrides": st.get("overrides"),
                        "wall_s": run.meta.get("wall_s"),
                        "train_wall_s": None if not walls or None in walls else float(sum(walls)),
                        "n_arms": len(run.models),
                        **{k: run.meta.get(k) for k in ("threads", "cpu_count", "loadavg_start",
                                                        "loadavg_end")},
                        "curves_missing": [m for m, ps in pts.items() if ps is None]})
    missing = [s["name"] for s in sources if s["status"] == "missing"]
    if not frames:
        raise UsageError(f"none of {', '.join(names)} has samples.jsonl under "
                         f"{root / 'synthetic'}; run make synthetic first")
    f = pd.concat(frames, ignore_index=True)
    fin = f[f["final"]]
    labels = dict(zip(fin["model"], map(_num, fin["kappa_bits"]), strict=True))
    order = sorted(labels, key=lambda lb: _order(labels[lb]))
    base_v = fin[fin["arm"] == BASELINE.name].set_index("name")["validity"]
    measured = fin.reindex(columns=PER_SEED_COLUMNS).assign(regime_result=[
        regime_result(k, r, _num(base_v.get(r["name"]))) for k, (_, r) in
        zip(map(_num, fin["kappa_bits"]), fin.iterrows(), strict=True)])
    # missing is never zero: rows of None, so counts show n
    per_seed = pd.concat([measured, pd.DataFrame(
        [{"name": n, "status": "missing", "model": lb, "kappa_bits": labels[lb]}
         for n in missing for lb in order], columns=PER_SEED_COLUMNS)], ignore_index=True
    ).astype(dict.fromkeys(["kappa_bits", "steps", *SEED_METRICS], float))
    per_seed.insert(len(PER_SEED_COLUMNS), "regime", [getattr(regime_for(_num(k)), "expected",
                                                             None) for k in per_seed["kappa_bits"]])
    per_seed = per_seed.iloc[np.lexsort(([list(names).index(n) for n in per_seed["name"]],
                                         [order.index(m) for m in per_seed["model"]]))]
    meta = {"kind": "synthetic-seeds", "created": datetime.now(timezone.utc).isoformat(),
            "written_by": "python -m analysis.synthetic --names " + " ".join(names),
            "names": list(names), "missing": missing, "sources": sources,
            "regimes": [asdict(r) for r in REGIMES],
            "margins": {"no_better": NO_BETTER_MARGIN, "clearly_higher": CLEARLY_HIGHER_MARGIN,
                        "noise": CLEARLY_HIGHER_MARGIN, "validity_drop": VALIDITY_DROP},
            "curve_points": CURVE_POINTS}
    return SeedAggregate(
        per_seed.reset_index(drop=True), summarize(per_seed, order, len(names)),
        pd.DataFrame(curves, columns=["name", "seed", "model", "kappa_bits", "step", "kl_bits",
                                      "ce", "n_batches"]), meta,
        pd.concat(agreement_rows(x) for x in frames).reset_index(drop=True), f)


def summarize(per_seed: pd.DataFrame, order: list[str], n_names: int) -> pd.DataFrame:
    """Per model: the mean over the measured runs and n of every metric, regime counts."""
    meas = per_seed[per_seed["status"] == "measured"]
    g = meas.groupby("model", sort=False)
    metrics = g[list(SEED_METRICS)].mean()
    n = g[list(SEED_METRICS)].count().add_suffix("_n")
    out = pd.concat([g["kappa_bits"].first(), g.size().rename("n_measured"), metrics, n],
                    axis=1).reindex(order)
    out = out[["kappa_bits", "n_measured", *(c for m in SEED_METRICS for c in (m, m + "_n"))]]
    counts = pd.crosstab(meas["model"], meas["regime_result"]).reindex(order)
    judged = out.index.map(lambda m: regime_for(_num(out.loc[m, "kappa_bits"])) is not None)
    out.insert(1, "n_names", n_names)
    out["regime"] = g["regime"].first().reindex(order)
    for key, word in (("regime_pass", "pass"), ("regime_fail", "fail"), ("regime_na", "n/a")):
        out[key] = (counts[word] if word in counts else pd.Series(0, index=order)).where(judged)
    return out.rename_axis("model").reset_index()


def _model_order(df: pd.DataFrame) -> pd.DataFrame:
    """Baseline first, then by kappa; within a model by run name and step (final last)."""
    if df.empty:
        return df
    names = list(dict.fromkeys(df["name"]))
    keys = (df.assign(_k=[_order(x) for x in df["kappa_bits"]],
                      _n=[names.index(n) for n in df["name"]],
                      _s=[math.inf if f else float(s) for f, s in zip(df["final"], df["step"],
                                                                      strict=True)]))
    return keys.sort_values(["_k", "_n", "_s"], kind="stable").drop(
        columns=["_k", "_n", "_s"]).reset_index(drop=True)


def write_gaps(measured: pd.DataFrame, out_dir: Path) -> dict[str, Path]:
    """gaps.csv (GAP_COLUMNS: every measured step of every model in measure_run's frames) and
    verdicts.csv (judged from the file as written, so anyone re-judging gaps.csv gets the same
    verdicts)."""
    gaps = measured[measured["n_samples"] > 0].reindex(columns=list(GAP_COLUMNS))
    out = {"gaps.csv": out_dir / "gaps.csv", "verdicts.csv": out_dir / "verdicts.csv"}
    _model_order(gaps).to_csv(out["gaps.csv"], index=False, float_format="%.6g")
    verdicts(pd.read_csv(out["gaps.csv"])).to_csv(out["verdicts.csv"], index=False,
                                                  float_format="%.6g")
    return out


def write_aggregate(agg: SeedAggregate, out_dir: str | os.PathLike) -> dict[str, Path]:
    """Every table, aggregate.json, the samples (gzipped), summary.md and the figures."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    out = {}
    for key, df in (("per_seed", agg.per_seed), ("summary", agg.summary),
                    ("curves", agg.curves), ("agreement", agg.agreement)):
        out[f"{key}.csv"] = d / f"{key}.csv"
        df.to_csv(out[f"{key}.csv"], index=False, float_format="%.6g")
    out.update(write_gaps(agg.measured, d))
    for src in agg.meta["sources"]:  # what the tables came from, rerunnable (mtime 0)
        if src["status"] != "measured":
            continue
        raw = Path(src["path"]).read_bytes()
        if hashlib.sha256(raw).hexdigest() != src["sha256"]:
            raise UsageError(f"{src['path']} changed while its tables were written; rerun")
        gz = d / "samples" / f"{src['name']}.samples.jsonl.gz"
        gz.parent.mkdir(exist_ok=True)
        gz.write_bytes(gzip.compress(raw, mtime=0))
        out[f"samples/{gz.name}"] = gz
    out["aggregate.json"] = d / "aggregate.json"
    out["aggregate.json"].write_text(json.dumps(agg.meta, indent=1) + "\n", encoding="utf-8")
    out["summary.md"] = d / "summary.md"
    out["summary.md"].write_text(render_block(d), encoding="utf-8")
    out["kl_curves.png"] = render_kl_curves(agg.curves, d / "kl_curves.png")
    (d / "agreement.png").unlink(missing_ok=True)  # never a stale figure beside new tables
    if not agg.agreement.empty:
        out["agreement.png"] = render_agreement(agg.agreement, d / "agreement.png")
    return out


# --------------------------------------------------------------------------- figures
def _save(fig: plt.Figure, path: Path) -> Path:
    fig.savefig(path)
    plt.close(fig)
    return Path(path)


def render_figure(run: Run, path: Path, rows_per_group: int = 8, prompt_idx: int = 0,
                  fontsize: float = 6.5) -> Path:
    """The Figure-4 analogue: per model, for one prompt, one group with Z drawn per sequence
    (blue box) and two groups each sharing one Z (green boxes), as monospaced text."""
    models = _by_kappa(run.models)
    cw, lh = 0.602 * fontsize / 72.0, 1.22 * fontsize / 72.0  # monospace advance, line height
    n_chars, gap_lines, title_lines = 2 + BODY_LEN + 4, 1.2, 2.2
    panel_lines = title_lines + 3 * (rows_per_group + gap_lines) + 2.2
    ncols = 2 if len(models) > 2 else 1
    nrows = math.ceil(len(models) / ncols)
    pw, ph, margin = n_chars * cw, panel_lines * lh, 0.25
    fw, fh = ncols * pw + (ncols + 1) * margin, nrows * ph + (nrows + 1) * margin
    fig = plt.figure(figsize=(fw, fh), dpi=170)
    for i, m in enumerate(models.itertuples()):
        r, c = divmod(i, ncols)
        ax = fig.add_axes(((margin + c * (pw + margin)) / fw,
                           1 - (margin + (r + 1) * ph + r * margin) / fh, pw / fw, ph / fh))
        ax.set_xlim(0, n_chars)
        ax.set_ylim(panel_lines, 0)  # y in lines, top to bottom
        ax.axis("off")
        base = m.arm == BASELINE.name
        title = "baseline (no Z)" if base else f"kappa = {kappa_label(m.kappa_bits)} bit" + (
            "" if m.kl_bits is None else f", KL {m.kl_bits:.3f} bit/token")
        ax.text(0.3, 1.0, title, fontsize=fontsize + 1.5, fontweight="bold", va="center")
        smp = run.of(m.model)
        smp = smp[smp["prompt_idx"] == prompt_idx]
        kinds = smp.groupby("group", sort=True)["group_kind"].first()
        groups = list(kinds[kinds == "per_sequence"].index[:1]) + list(
            kinds[kinds == "shared"].index[:2])
        y = title_lines
        for j, g in enumerate(groups):
            rows = smp[smp["group"] == g].sort_values("row").head(rows_per_group)
            kind = kinds[g]
            colour = GREY if base else BLUE if kind == "per_sequence" else GREEN
            label = ("independent samples" if base else "Z drawn per sequence"
                     if kind == "per_sequence" else f"shared Z #{j}")
            ax.add_patch(Rectangle((1.0, y - 0.55), 2 + BODY_LEN + 1.0, len(rows) + 0.1,
                                   fill=False, edgecolor=colour, linewidth=1.3))
            ax.text(n_chars - 0.2, y - 0.9, label, fontsize=fontsize - 1, color=colour,
                    ha="right", va="center")
            for k, s in enumerate(rows.itertuples()):
                ax.text(1.5, y + k, f"{s.letter}>{s.text}", family="monospace",
                        fontsize=fontsize, va="center", ha="left")
            y += len(rows) + gap_lines
    return _save(fig, path)


def _per_kappa(df: pd.DataFrame, path: Path, ylabels: Sequence[str], height: float,
               draw: Any, **kw: Any) -> Path:
    """One column of panels per kappa, one row per y label, over training: draw(the column's
    axes, kappa, its rows) plots; titles, labels and legends are the same for every figure."""
    ks = sorted({float(k) for k in df["kappa_bits"].dropna()})
    fig, axes = plt.subplots(len(ylabels), max(1, len(ks)), figsize=(3.2 * max(1, len(ks)),
                             height), dpi=110, squeeze=False, **kw)
    for j, k in enumerate(ks):
        col = [row[j] for row in axes]
        draw(col, k, df[(df["kappa_bits"] - k).abs() < 1e-12])
        col[0].set_title(f"kappa = {kappa_label(k)} bit", fontsize=9)
        col[-1].set_xlabel("step", fontsize=8)
        for ax in col:
            ax.tick_params(labelsize=7)
            ax.legend(fontsize=6)
    for row, label in zip(axes, ylabels, strict=True):
        row[0].set_ylabel(label, fontsize=8)
    fig.tight_layout()
    return _save(fig, path)


def render_agreement(agreement: pd.DataFrame, path: Path) -> Path:
    """Over training, per kappa: the position and noise gaps (grey line: the rules' 0.1) and
    below them the validity, the same seed's baseline in grey."""
    base = agreement[agreement["kappa_bits"].isna()]

    def draw(axes: list, k: float, g: pd.DataFrame) -> None:
        top, bot = axes
        for i, (name, gs) in enumerate(g.groupby("name", sort=False)):
            first = i == 0
            top.plot(gs["step"], gs["pos_gap"], color=BLUE, marker=".", lw=1,
                     label="position gap" if first else None)
            top.plot(gs["step"], gs["noise_gap"], color=GREEN, marker=".", lw=1, ls="--",
                     label="noise gap" if first else None)
            bot.plot(gs["step"], gs["validity"], color=BLUE, marker=".", lw=1,
                     label="this kappa" if first else None)
            b = base[base["name"] == name]
            if not b.empty:
                bot.plot(b["step"], b["validity"], color=GREY, lw=1,
                         label="baseline" if first else None)
        top.axhline(CLEARLY_HIGHER_MARGIN, ls=":", color=GREY, lw=1)

    return _per_kappa(agreement, path, ["shared - across Z", "validity"], 5.2, draw,
                      sharex="col")


def render_kl_curves(curves: pd.DataFrame, path: Path) -> Path:
    """KL per token over training, one panel per kappa, one line per seed; the dashed line is
    the free-bits threshold (below it the KL costs nothing)."""
    def draw(axes: list, k: float, g: pd.DataFrame) -> None:
        for name, gs in g.groupby("name", sort=False):
            axes[0].plot(gs["step"], gs["kl_bits"], marker=".", lw=1, label=str(name))
        axes[0].axhline(k, ls="--", color=GREY, lw=1)
        axes[0].set_yscale("log")

    return _per_kappa(curves, path, ["KL, bits/token (training batches)"], 2.8, draw)


# --------------------------------------------------------------------------- one run
TABLE_COLUMNS = {
    "model": "model", "kappa_bits": "kappa (bits)", "n_samples": "N", "validity": "validity",
    "pos_agree_within": "pos. agree, shared Z", "pos_agree_across": "pos. agree, across Z",
    "pos_agree_per_seq": "pos. agree, Z per seq.",
    "noise_jaccard_within": "noise Jaccard, shared Z",
    "noise_jaccard_across": "noise Jaccard, across Z", "noise_rate": "'!' rate",
    "kl_bits": "KL bits/token", "ce_prior": "CE prior Z", "ce_encoder": "CE encoder Z (leaks)",
}


def _cell(v: Any, n: int | None = None, total: int | None = None) -> str:
    """A table cell: 3 decimals, a dash when missing, '(n=k)' when fewer than all runs."""
    s = v if isinstance(v, str) else fmt(v)
    return s if n is None or n == total or n == 0 else f"{s} (n={n})"


def _measured(m: Any) -> str:
    if isinstance(m, dict):
        return ", ".join(f"{k}: {_measured(v)}" for k, v in m.items())
    return "n/a" if m is None else f"{m:.3f}" if isinstance(m, float) else str(m)


def render(run_dir: str | os.PathLike) -> dict[str, Path]:
    """samples.jsonl in run_dir -> table.csv, table.md, acceptance.json, figure.png, and the
    agreement over training when the run kept checkpoints."""
    d = Path(run_dir)
    run = load_run(d / "samples.jsonl")
    if run.models.empty:
        raise UsageError(f"{d / 'samples.jsonl'} holds no model records")
    f, s = measure_run(d.name, run, n_perm=0), run.meta.get("settings", {})
    df = _by_kappa(f[f["final"]]).reindex(columns=TABLE_CSV).reset_index(drop=True)
    checks = acceptance(df)
    out = {k: d / k for k in ("table.csv", "table.md", "acceptance.json", "figure.png")}
    df.to_csv(out["table.csv"], index=False)
    shown = df[list(TABLE_COLUMNS)].astype(object).map(_cell).assign(
        kappa_bits=[DASH if _num(k) is None else kappa_label(k) for k in df["kappa_bits"]],
        n_samples=df["n_samples"].astype(str)).rename(columns=TABLE_COLUMNS)
    wall = sum(float(w) for w in df["train_wall_s"] if w is not None and w == w)
    out["table.md"].write_text(template("synthetic_run.md.j2").render(
        table=md(shown), s=s, n_starts=N_STARTS, body_len=BODY_LEN, checks=checks,
        measured=_measured, wall=wall, wall_s=run.meta.get("wall_s", math.nan)), encoding="utf-8")
    out["acceptance.json"].write_text(json.dumps(checks, indent=2) + "\n", encoding="utf-8")
    render_figure(run, out["figure.png"], rows_per_group=int(s.get("figure_rows", 8)))
    for k in ("agreement.csv", "agreement.png"):  # never a stale file beside new tables
        (d / k).unlink(missing_ok=True)
    ag = agreement_rows(f)
    if len(ag):  # the run kept checkpoints along training
        out["agreement.csv"], out["agreement.png"] = d / "agreement.csv", d / "agreement.png"
        ag.to_csv(out["agreement.csv"], index=False, float_format="%.6g")
        render_agreement(ag, out["agreement.png"])
    return out


# --------------------------------------------------------------------------- the doc
def _read_verdicts(path: Path) -> pd.DataFrame | None:
    # "n/a" is a result here, not a missing value
    return pd.read_csv(path, keep_default_na=False, na_values=[""]) if path.is_file() else None


def _mean_cell(col: str, n_runs: int) -> Any:
    """A cell of a by-step table: the mean over the runs there, '(n=k)' when fewer than all."""
    def cell(g: pd.DataFrame) -> str:
        v = [x for x in map(_num, g[col]) if x is not None]
        return _cell(_mean(v), len(v), n_runs)
    return cell


def _by_step(df: pd.DataFrame, keys: list[str], steps: list[int], cell: Any) -> str:
    """A Markdown table: one row per `keys` group (first-appearance order), one column per
    step holding cell(the group's rows at that step)."""
    return md(pd.DataFrame([{**dict(zip(keys, k, strict=True)),
                             **{f"step {s}": cell(g[g["step"] == s]) for s in steps}}
                            for k, g in df.groupby(keys, sort=False)]))


def render_block(agg_dir: str | os.PathLike) -> str:
    """The generated Markdown of one aggregate folder, from its committed files only."""
    d = Path(agg_dir)
    if not (d / "aggregate.json").is_file():  # a block reserved for runs not made yet
        return template("synthetic_block.md.j2").render(ran=False, folder=f"{d.parent.name}/"
                                                        f"{d.name}")
    per_seed, summary = pd.read_csv(d / "per_seed.csv"), pd.read_csv(d / "summary.csv")
    curves = pd.read_csv(d / "curves.csv")
    meta = json.loads((d / "aggregate.json").read_text(encoding="utf-8"))
    srcs = [s for s in meta["sources"] if s["status"] == "measured"]
    n_all, n_runs = len(meta["names"]), len(srcs)
    settings = sorted({(s.get("setting"), s.get("latent_bits"), s.get("high_latent_bits") or 0,
                        " ".join(s.get("train_overrides") or []),
                        " ".join(s.get("extra_overrides") or [])) for s in srcs})
    cols = {"kl_bits": "KL bits/token", "pos_agree_within": "pos. shared",
            "pos_agree_across": "pos. across", "pos_gap": "pos. gap",
            "noise_jaccard_within": "noise shared", "noise_jaccard_across": "noise across",
            "noise_gap": "noise gap", "validity": "validity", "ce_prior": "CE prior Z",
            "ce_encoder": "CE encoder Z"}
    mean = pd.DataFrame([{"model": r["model"], "n": f"{int(r['n_measured'])}/{n_all}",
                          **{h: _cell(r[c], int(r[f"{c}_n"]), int(r["n_measured"]))
                             for c, h in cols.items()}} for _, r in summary.iterrows()])
    seeds = pd.DataFrame([{"model": r["model"], "run": r["name"] if r["status"] == "measured"
                           else f"{r['name']} (missing)", "steps": fmt(r["steps"], ".0f"),
                           **{h: _cell(r[c]) for c, h in cols.items()},
                           "regime (v1)": r["regime_result"]
                           if isinstance(r["regime_result"], str) else DASH}
                          for _, r in per_seed.iterrows()])
    kl = gain = None
    if not curves.empty:
        steps = sorted({int(s) for s in curves["step"]})
        shown = sorted({steps[min(len(steps) - 1, round(i * (len(steps) - 1) / 5))]
                        for i in range(6)})
        free, base = curves[curves["kappa_bits"].notna()], curves[curves["kappa_bits"].isna()]
        kl = _by_step(free, ["model"], shown, _mean_cell("kl_bits", n_runs))
        if not base.empty:
            g = free.merge(base[["name", "step", "ce"]].rename(columns={"ce": "ce_base"}),
                           on=["name", "step"], how="left")
            gain = _by_step(g.assign(gain=g["ce"] - g["ce_base"]), ["model"], shown,
                            _mean_cell("gain", n_runs))
    wall = pd.DataFrame([{
        "run": s["name"], "arms": s["n_arms"],
        "training s (sum)": fmt(s.get("train_wall_s"), ".0f"),
        "whole run s": fmt(s.get("wall_s"), ".0f"), "threads": s.get("threads") or DASH,
        "CPUs": s.get("cpu_count") or DASH,
        "load": f"{s['loadavg_start'][0]:.1f} -> {s['loadavg_end'][0]:.1f}"
        if s.get("loadavg_start") and s.get("loadavg_end") else "not recorded"} for s in srcs])
    return template("synthetic_block.md.j2").render(
        ran=True, srcs=srcs, missing=meta["missing"], n_all=n_all, settings=settings,
        **_regimes_block(summary, _read_verdicts(d / "verdicts.csv"), n_all), mean=md(mean),
        seeds=md(seeds), kl=kl, gain=gain, agreement=_agreement_block(d / "agreement.csv", n_runs),
        gaps=_gaps_block(d / "gaps.csv"), alpha=GAP_ALPHA, wall=md(wall))


def _regimes_block(summary: pd.DataFrame, ver: pd.DataFrame | None, n_all: int) -> dict:
    """The v1 rules and their counts beside the v2 rules and theirs (`regimes`), then one row
    per run (`per_run`, None without verdicts)."""
    rows = []
    for _, r in summary[summary["regime"].map(lambda x: isinstance(x, str))].iterrows():
        k = float(r["kappa_bits"])
        reg, rule, na = regime_for(k), rule_v2_for(k), int(r["regime_na"])
        held = (f"{int(r['regime_pass'])}/{int(r['regime_pass']) + int(r['regime_fail'])} seeds"
                + (f", {na} not measurable" if na else "")
                + (f" ({n_all - int(r['n_measured'])} missing)" if int(r["n_measured"]) < n_all
                   else ""))
        v2 = by_s = "not judged (no gaps.csv)"
        if ver is not None:
            g = ver[(ver["kappa_bits"] - k).abs() < 1e-12]
            count = (lambda res: f"{res.count('holds')} / {res.count('fails')} / "
                     f"{res.count('unclear')} of {len(res)} seeds")
            v2 = count(list(g["result_v2"])) + (" (no KL penalty: kappa >= H)" if any(
                str(x).startswith("none") for x in g["kl_penalty"]) else "")
            by_s = count(list(g["result_samples"]))
        rows.append([kappa_label(k), rule.regime if rule else r["regime"],
                     reg.rule if reg else DASH, held, rule.text if rule else DASH, v2, by_s])
    out = {"regimes": md(pd.DataFrame(rows, columns=[
        "kappa (bits)", "paper's regime", "v1 rule", "v1 holds in", "v2 rule",
        "v2 holds / fails / unclear", "by samples holds / fails / unclear"])), "per_run": None}
    if ver is None or ver.empty:
        return out
    txt = (lambda x: x if isinstance(x, str) else DASH)
    out["per_run"] = md(pd.DataFrame([[
        r["model"], r["name"], DASH if _num(r["latent_bits"]) is None else int(r["latent_bits"]),
        "none (kappa >= H)" if str(r["kl_penalty"]).startswith("none") else "free bits",
        txt(r["result_v1"]), f"**{txt(r['result_v2'])}**",
        r["why_v2"] if isinstance(r["why_v2"], str) else "",
        f"**{txt(r['result_samples'])}**", txt(r["ce_vs_samples"]) or DASH]
        for _, r in ver.iterrows()],
        columns=["model", "run", "H", "KL penalty", "v1", "v2", "why (v2)", "by samples",
                 "v2's CE rule vs the samples"]))
    return out


def _agreement_block(path: Path, n_runs: int) -> str | None:
    """The agreement over training, from agreement.csv (None: absent or empty, never zeros)."""
    agree = pd.read_csv(path) if path.is_file() else pd.DataFrame()
    if agree.empty:
        return None
    measures = [("pos_gap", "position gap"), ("noise_gap", "noise gap"),
                ("validity", "validity"), ("kl_bits", "KL bits/token")]
    long = pd.concat([g.assign(measure=label, value=g[col])
                      for _, g in agree.groupby("model", sort=False)
                      for col, label in (measures if g["kappa_bits"].notna().any()
                                         else measures[2:3])])
    return _by_step(long, ["model", "measure"], sorted({int(s) for s in agree["step"]}),
                    _mean_cell("value", n_runs))


def _gaps_block(path: Path) -> dict | str | None:
    """Every gap with its interval and p, from gaps.csv; absent: 'no samples' (folders made
    before issue 38 committed none), never zeros; None when it holds no row."""
    if not path.is_file():
        return "no samples"
    g = pd.read_csv(path)
    if g.empty:
        return None
    fin = g[g["final"].astype(bool)]
    finals = pd.DataFrame([[
        r["model"], r["name"], ci(r["pos_gap"], r["pos_lo"], r["pos_hi"]),
        fmt(r["pos_p"], ".4f"), ci(r["noise_gap"], r["noise_lo"], r["noise_hi"]),
        fmt(r["noise_p"], ".4f"), ci(r["validity_diff"], r["validity_diff_lo"],
                                        r["validity_diff_hi"]),
        ci(r["ce_prior"], r["ce_prior_lo"], r["ce_prior_hi"])] for _, r in fin.iterrows()],
        columns=["model", "run", "position gap [95% CI]", "p", "noise gap [95% CI]", "p",
                 "validity - baseline [95% CI]", "CE prior Z [95% CI]"])
    out = {"finals": md(finals), "n_perm": sorted({int(x) for x in g["n_perm"]}), "steps": [],
           "ns": sorted({(int(a), int(b)) for a, b in zip(fin["n_groups"], fin["n_rows"],
                                                          strict=True)})}
    if g["final"].astype(bool).all():
        return out
    steps = sorted({int(x) for x in g["step"].dropna()})
    for kind, label in (("pos", "Position"), ("noise", "Noise")):
        def cell(h: pd.DataFrame, kind: str = kind) -> str:
            if h.empty:
                return DASH
            r = h.iloc[-1]
            return ci(r[f"{kind}_gap"], r[f"{kind}_lo"], r[f"{kind}_hi"], ".2f") + (
                "*" if (_num(r[f"{kind}_p"]) or 1.0) < GAP_ALPHA else "")
        out["steps"].append((label, _by_step(g.rename(columns={"name": "run"}),
                                             ["model", "run"], steps, cell)))
    return out


DOC_BEGIN = "<!-- BEGIN GENERATED by `python -m analysis.synthetic render-doc` from "
DOC_END = "<!-- END GENERATED -->"
RULES_BLOCK = "rules"
"""A block `from rules` holds the regime rules, rendered from the code that judges."""
FINDINGS_SUFFIX = "#findings"
"""A block `from DIR#findings` holds the verdict counts and ranges per kappa, from DIR's
verdicts.csv and gaps.csv: the sentences that count seeds are generated, never typed."""


def render_rules() -> str:
    """The v1 and v2 regime rules in words, from REGIMES, REGIMES_V2 and PREDICATES."""
    return template("synthetic_rules.md.j2").render(
        v1=REGIMES, v2=REGIMES_V2, predicates=PREDICATES, label=kappa_label, alpha=GAP_ALPHA,
        negligible=NO_BETTER_MARGIN, drop=VALIDITY_DROP, unigram=UNIGRAM_CE,
        p_letter=_P_LETTER, p_blank=_P_BLANK, n_perm=N_PERM)


def _span(xs: Sequence[float | None], digits: int = 3,
          none: str | None = "not measurable") -> str | None:
    """'lo to hi' over the measured values, '(n=k)' when some were not measurable; `none`
    when none was."""
    v = sorted(x for x in xs if x is not None)
    if not v:
        return none
    s = f"{v[0]:.{digits}f}" + ("" if v[0] == v[-1] else f" to {v[-1]:.{digits}f}")
    return s if len(v) == len(xs) else f"{s} (n={len(v)})"


def render_findings(agg_dir: str | os.PathLike) -> str:
    """Per kappa: how many seeds each rule set holds in, and the ranges over seeds of the
    measures its v2 rule reads (gap, its interval's ends, p; validity minus baseline; CE)."""
    d = Path(agg_dir)
    if not (d / "verdicts.csv").is_file() or not (d / "gaps.csv").is_file():
        return template("synthetic_findings.md.j2").render(found=False, kappas=[], base=None)
    ver, gaps = _read_verdicts(d / "verdicts.csv"), pd.read_csv(d / "gaps.csv")
    fin = gaps[gaps["final"].astype(bool)]
    kappas = []
    for k in sorted({float(x) for x in ver["kappa_bits"]}):
        v = ver[(ver["kappa_bits"] - k).abs() < 1e-12]
        g = fin[(fin["kappa_bits"] - k).abs() < 1e-12]
        rule = rule_v2_for(k)
        col = {c: [_num(x) for x in g[c]] for c in (
            *(f"{kind}_{x}" for kind in GAP_KINDS for x in ("gap", "lo", "hi", "p")),
            "validity_diff", "ce_prior", "marginal_bias_bits") if c in g}
        kappas.append({
            "label": kappa_label(k), "regime": rule.regime if rule else "?", "n": len(v),
            "v2": Counter(v["result_v2"]),
            "v1": Counter(x for x in v["result_v1"] if isinstance(x, str)),
            "gaps": [(word, _span(col[f"{kind}_gap"], none=None) and {
                "gap": _span(col[f"{kind}_gap"]), "lo": _span(col[f"{kind}_lo"]),
                "hi": _span(col[f"{kind}_hi"]), "p": _span(col[f"{kind}_p"], 4)})
                for kind, word in (("pos", "Position"), ("noise", "noise"))],
            "vd": _span(col["validity_diff"], none=None), "ce": _span(col["ce_prior"]),
            "leak": Counter(v["leaking"]), "sb": Counter(v["samples_break"]),
            "rs": Counter(v["result_samples"]),
            "dis": [x for x in v["ce_vs_samples"] if isinstance(x, str) and x],
            "mb": _span(col.get("marginal_bias_bits", []), none=None),
            "no_penalty": any(str(x).startswith("none") for x in v["kl_penalty"])})
    base, nulls = gaps[gaps["kappa_bits"].isna()], None
    if not base.empty:  # no Z: its "shared" groups are independent samples, a built-in null

        def null(rows: pd.DataFrame) -> dict[str, int]:
            p, lo, hi = (rows[[f"{c}_{x}" for c in GAP_KINDS]].to_numpy(float)
                         for x in ("p", "lo", "hi"))
            return {"hits": int((p < GAP_ALPHA).sum()), "n_p": int(np.isfinite(p).sum()),
                    "zero": int(((lo <= 0) & (hi >= 0)).sum()), "n_lo": int(np.isfinite(lo).sum())}

        fb = base[base["final"].astype(bool)]
        nulls = {"final": null(fb), "every": null(base) if len(base) > len(fb) else None}
    return template("synthetic_findings.md.j2").render(
        found=True, kappas=kappas, base=nulls,
        alpha=GAP_ALPHA, unigram=UNIGRAM_CE)


def render_doc(doc: str | os.PathLike, root: Path | None = None) -> tuple[str, list[str]]:
    """The doc with every generated block re-rendered (`from DIR`, DIR relative to `root`,
    default the repository's, or `rules`). Returns (text, sources)."""
    root = root or ROOT

    def body(src: str) -> str:
        if src == RULES_BLOCK:
            return "\n" + render_rules()
        if src.endswith(FINDINGS_SUFFIX):
            return "\n" + render_findings(root / src[:-len(FINDINGS_SUFFIX)])
        return "\n" + render_block(root / src)

    return blocks(Path(doc).read_text(encoding="utf-8"), DOC_BEGIN, body)


# --------------------------------------------------------------------------- entry point
def _plain_name(name: str) -> bool:
    return bool(name.strip()) and name not in (".", "..") and not any(c in name for c in "/\\\0")


def _body(argv: list[str]) -> int:
    if argv[:1] == ["render-doc"]:
        p = argparse.ArgumentParser(prog="python -m analysis.synthetic render-doc")
        p.add_argument("--doc", default=str(DOC))
        p.add_argument("--check", action="store_true",
                       help="exit 1 if the doc differs from its re-rendering; write nothing")
        a = p.parse_args(argv[1:])
        if not Path(a.doc).is_file():
            raise UsageError(f"--doc {a.doc}: no such file")
        new, srcs = render_doc(a.doc)
        if not srcs:
            raise UsageError(f"{a.doc}: no generated block ({DOC_BEGIN}DIR -->)")
        return write_doc(Path(a.doc), new, a.check, "python -m analysis.synthetic render-doc")
    p = argparse.ArgumentParser(prog="python -m analysis.synthetic",
                                description=__doc__.splitlines()[0])
    p.add_argument("--name", default="default", help="results/synthetic/<name>")
    p.add_argument("--names", nargs="+", default=None, metavar="NAME",
                   help="several runs (one per seed) -> per-seed and mean tables, KL curves")
    p.add_argument("--out", default=None, help="with --names: the output folder (default "
                   "results/synthetic/seeds-<names>)")
    a = p.parse_args(argv)
    if a.names is not None:
        bad = [n for n in a.names if not _plain_name(n)]
        if bad:
            raise UsageError(f"--names {bad[0]!r}: a plain folder name under results/synthetic/")
        d = Path(a.out) if a.out else results_root() / "synthetic" / ("seeds-" + "-".join(a.names))
        files = write_aggregate(aggregate(a.names), d)
        print(files["summary.md"].read_text(encoding="utf-8"))
    else:
        if a.out is not None:
            raise UsageError("--out goes with --names")
        if not _plain_name(a.name):
            raise UsageError(f"--name {a.name!r}: a plain folder name under results/synthetic/")
        d = results_root() / "synthetic" / a.name
        if not (d / "samples.jsonl").is_file():
            raise UsageError(f"no synthetic run at {d / 'samples.jsonl'}; run `make synthetic "
                             f"SYN_NAME={a.name}` first")
        try:
            files = render(d)
        except json.JSONDecodeError as e:
            raise UsageError(f"{d / 'samples.jsonl'}: {e}") from None
        print((d / "table.md").read_text(encoding="utf-8"))
    for k, v in files.items():
        print(f"wrote {k}: {v}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli("synthetic", lambda: _body(sys.argv[1:] if argv is None else list(argv)))


if __name__ == "__main__":
    sys.exit(main())
