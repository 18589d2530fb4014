"""Calibration harness (test support): synthetic sweeps with planted truth, through the report's
own statistics. tests/test_calibration.py runs a fast version; the full run writes the doc:

    python tests/calibration.py [--sweeps 1000] [--full-path 50] [--out docs/CALIBRATION.md]
    make calibrate            (the full run)

What it simulates, which analysis code each part runs (the full path writes result files and
reads them through frame/tables/claims; the bulk Monte-Carlo calls the same statistic functions
on simulated matrices, since thousands of sweeps on disk are too slow) and the targets are in
the doc's text, tests/calibration.md.j2 (docs/CALIBRATION.md holds the last full run).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: this repo's
from analysis import stats as S  # noqa: E402
from analysis import synthetic as SY  # noqa: E402
from analysis.claims import SUPPORTED, _benchmark_claim, benchmark_verdict  # noqa: E402
from analysis.frame import load_sweep  # noqa: E402
from analysis.render import md  # noqa: E402
from analysis.stats import ALPHA  # noqa: E402
from analysis.tables import comparisons, paper_table  # noqa: E402
from common import arms, benchmarks  # noqa: E402
from common.errors import UsageError, cli  # noqa: E402
from common.io import atomic_write_text  # noqa: E402
from common.paths import METRICS, RUN_RECORD, RunDir, SweepDir  # noqa: E402
from common.records import EvalFile, EvalSpec, Manifest, ManifestCell, RunRecord  # noqa: E402

TASK = benchmarks.tasks(suite="lm-eval", scoring="generate", default=True)[0]
"""The planted lm-eval benchmark (GSM8K: a generation task of the default set)."""
TASK_NAME = benchmarks.benchmark(TASK).name
CODE_TASK = benchmarks.tasks(suite="evalplus")[0]
"""The planted evalplus benchmark (HumanEval+), with sandbox-crashed items."""

SEED_SDS = (0.01, 0.03, 0.05, 0.08)
"""Seed-to-seed SD of an arm's score, in probability (1, 3, 5, 8 points)."""
EFFECT = 0.02
"""The planted effect for the power figures: +2 points."""
COVERAGE_EFFECTS = (0.02, 0.05, -0.02, 0.0)
"""Effects planted (per kappa, cycling) for the coverage figures."""
TARGETS = {"fpr_max": 0.05, "coverage": (0.93, 0.98)}


@dataclass(frozen=True)
class Design:
    name: str
    n_items: int
    n_seeds: int
    kappas: tuple[float, ...]
    what: str


DESIGNS = {
    "demo": Design("demo", 30, 3, (0.5, 2.0, 4.0),
                   "the demo's shape (LIMIT 30 items, kappa 0.5/2/4) with 3 seeds"),
    "demo-1seed": Design("demo-1seed", 30, 1, (0.5, 2.0, 4.0),
                         "the demo as run (1 seed): item-level Δs only"),
    "paper": Design("paper", 1319, 3, (0.25, 0.5, 1.0, 2.0),
                    "paper scale: GSM8K-sized benchmark (1319 items), kappa 1/4..2, 3 seeds"),
}

_GH_X, _GH_W = np.polynomial.hermite_e.hermegauss(40)
_GH_W = _GH_W / _GH_W.sum()


def expected_score(q: np.ndarray, effect: float, sd: float) -> float:
    """E over seeds of the mean over items of clip(q + effect + u, 0, 1), u ~ N(0, sd)."""
    p = np.clip(q[:, None] + effect + sd * _GH_X[None, :], 0.0, 1.0)
    return float((p @ _GH_W).mean())


def draw(rng: np.random.Generator, q: np.ndarray, effect: float, sd: float,
         n_seeds: int) -> np.ndarray:
    """Outcomes (seeds x items) of one arm."""
    u = rng.normal(0.0, sd, n_seeds)
    p = np.clip(q[None, :] + effect + u[:, None], 0.0, 1.0)
    return (rng.random(p.shape) < p).astype(float)


@dataclass
class Tally:
    """k events out of n trials, with the Monte-Carlo interval."""

    k: int = 0
    n: int = 0

    def add(self, hit: bool | np.bool_) -> None:
        self.k += int(bool(hit))
        self.n += 1

    @property
    def rate(self) -> float:
        return self.k / self.n if self.n else math.nan

    @property
    def ci(self) -> tuple[float, float]:
        """The Monte-Carlo 95% interval of the rate (Clopper-Pearson; NaN for no trials)."""
        return S.clopper_pearson(self.k, self.n)

    def text(self) -> str:
        lo, hi = self.ci
        return f"{100 * self.rate:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}] ({self.k}/{self.n})"


@dataclass
class Cell:
    """Figures of one (design, seed SD) setting."""

    fpr: Tally = field(default_factory=Tally)
    fpr_holm: Tally = field(default_factory=Tally)
    supported_null: Tally = field(default_factory=Tally)
    decided_null: Tally = field(default_factory=Tally)
    coverage: Tally = field(default_factory=Tally)
    power: Tally = field(default_factory=Tally)
    power_t: Tally = field(default_factory=Tally)
    power_lt_t: int = 0
    out_of_range: int = 0
    intervals: int = 0
    mde: list[float] = field(default_factory=list)


def _in_range(lo: float, hi: float, rng: tuple[float, float]) -> bool:
    return not (math.isfinite(lo) and (lo < rng[0] - 1e-12 or hi > rng[1] + 1e-12))


def _delta(d: np.ndarray, n_boot: int) -> S.Delta:
    """stats.paired_delta on 0/1 items once paired: a difference lies in [-1, 1], scale 1."""
    return S.matrix_delta(d, (-1.0, 1.0), 1.0, n_boot)


def bulk(design: Design, sd: float, n_sweeps: int, seed: int = 0, n_boot: int = 500) -> Cell:
    """Null, coverage and power runs of one setting through the report's statistics."""
    rng = np.random.default_rng([seed, design.n_items, design.n_seeds, int(sd * 1000)])
    c = Cell()
    paper = [k <= 2.0 for k in design.kappas]
    for _ in range(n_sweeps):
        q = rng.uniform(0.25, 0.75, design.n_items)
        for mode in ("null", "coverage", "power"):
            base = draw(rng, q, 0.0, sd, design.n_seeds)
            ci = S.cell_interval(base.mean(axis=1), base.ravel(), "acc")
            c.intervals += 1
            c.out_of_range += not _in_range(ci.lo, ci.hi, S.UNIT)
            ds, ps, units = [], [], []
            for j, _k in enumerate(design.kappas):
                eff = {"null": 0.0, "power": EFFECT,
                       "coverage": COVERAGE_EFFECTS[j % len(COVERAGE_EFFECTS)]}[mode]
                y = draw(rng, q, eff, sd, design.n_seeds)
                ci = S.cell_interval(y.mean(axis=1), y.ravel(), "acc")
                d = _delta(y - base, n_boot)
                c.intervals += 2
                c.out_of_range += (not _in_range(ci.lo, ci.hi, S.UNIT)) + (
                    not _in_range(d.lo, d.hi, (-1.0, 1.0)))
                ds.append(d.delta)
                ps.append(d.p)
                units.append(d.unit)
                if mode == "null":
                    c.fpr.add(d.significant)
                    if math.isfinite(d.mde):
                        c.mde.append(d.mde)
                elif mode == "coverage":
                    truth = expected_score(q, eff, sd) - expected_score(q, 0.0, sd)
                    c.coverage.add(math.isfinite(d.lo) and d.lo <= truth <= d.hi)
                else:
                    c.power.add(d.significant and d.delta > 0)
                    if design.n_seeds >= 2:
                        per_seed = (y - base).mean(axis=1)
                        # scipy's paired t over seed means; seed differences equal in count
                        # (a spread of float rounding only, or none) have no test: no
                        # interval exists there, as in the report (scipy would say p ~ 1e-30)
                        with warnings.catch_warnings(), np.errstate(all="ignore"):
                            warnings.simplefilter("ignore", RuntimeWarning)
                            tt = stats.ttest_1samp(per_seed, 0.0)
                        t_sig = bool(np.isfinite(tt.statistic) and tt.pvalue < ALPHA
                                     and per_seed.mean() > 0
                                     and not S.no_variation(S.per_seed_diffs(y - base), 1.0))
                        c.power_t.add(t_sig)
                        c.power_lt_t += t_sig and not (d.significant and d.delta > 0)
            if mode == "null":
                for a in S.holm(ps):
                    c.fpr_holm.add(math.isfinite(a) and a < ALPHA)
                sel = np.array(paper)
                verdict, _, _ = benchmark_verdict(
                    np.array(ds)[sel], np.array(ps)[sel], [u for u, s in zip(units, paper,
                                                                            strict=True) if s],
                    np.full(sel.sum(), design.n_seeds))
                c.supported_null.add(verdict == SUPPORTED)
                c.decided_null.add(verdict != "inconclusive")
    return c


# ---- full path: result files -> load_sweep -> tables -> claims ----------------------------------

@dataclass
class Scenario:
    name: str
    design: Design
    sd: float
    hs: tuple[int, ...] = (8,)
    flops_budget: float | None = None
    effects: dict[float, float] = field(default_factory=dict)
    """Planted FT effect per kappa (default 0: the null)."""
    control_effect: dict[int, float] = field(default_factory=dict)
    """Planted effect of each H's equal-FLOPs control (a bigger FT buys its control more)."""
    missing: bool = False
    crash: float = 0.0
    stray_limit: bool = False
    equal_gain: int | None = None
    """The rounding case: gsm8k's items as `_equal_counts` plants them (each seed's references
    pass the same items, every Free Transformer those plus `equal_gain` more)."""


def _write_json(path: Path, obj: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj), encoding="utf-8")


def write_scenario(root: Path, sc: Scenario, rng: np.random.Generator) -> dict:
    """Write one synthetic sweep as result files (built as common.records, as the suite's
    writers build them); return the simulated outcomes per cell."""
    d = sc.design
    q = rng.uniform(0.25, 0.75, d.n_items)
    equal = None if sc.equal_gain is None else _equal_counts(rng, d.n_items, d.n_seeds,
                                                             sc.equal_gain)
    tokens, fpt0 = 200_000, 1.0e6
    base, free, flops = arms.BASELINE.name, arms.FREE.name, arms.BASELINE_FLOPS.name
    plan: list[tuple[str, str, float | None, int, float]] = [
        (f"{base}-s{s}", base, None, 0, 0.0) for s in range(d.n_seeds)]
    for h in sc.hs:
        for k in d.kappas:
            plan += [(f"{free}-k{k:g}-H{h}-s{s}", free, k, h, sc.effects.get(k, 0.0))
                     for s in range(d.n_seeds)]
    if sc.flops_budget is None:
        for h in sc.hs:
            plan += [(f"{flops}-H{h}-s{s}", flops, None, h,
                      sc.control_effect.get(h, 0.0)) for s in range(d.n_seeds)]
    spec = EvalSpec.from_args("lm-eval", [TASK, CODE_TASK], d.n_items, "prior", 1,
                              None, 256, {benchmarks.benchmark(TASK).offline[0]: "0" * 64})
    cells, outcomes = [], {}
    for cell, arm, kappa, h, eff in plan:
        rec = arms.arm(arm)
        seed = int(cell.rsplit("-s", 1)[1])
        rid = f"{sc.name}-{cell}"
        state = "done"
        if sc.missing and cell in (f"{free}-k{d.kappas[0]:g}-H{sc.hs[0]}-s0", f"{base}-s1"):
            state = "pending" if rec.latent else "failed"
        matched = rec.flops_matched
        rd = RunDir.of(rid, root)
        cells.append(ManifestCell(cell=cell, arm=arm, kappa_bits=kappa,
                                  latent_bits=h if rec.latent else 0,
                                  match_latent_bits=h if matched else None, seed=seed,
                                  run_id=rid, state=state,
                                  eval={"state": state, "file": str(
                                      rd.eval_file(spec.file_name(1)).relative_to(rd.path))}))
        if state != "done":
            continue
        ovh = 0.3 * h / 16 if rec.latent else 0.0
        fpt = fpt0 * (1 + ovh)
        if sc.flops_budget is not None:
            tok = sc.flops_budget / fpt
        elif matched:
            tok = tokens * (1 + 0.3 * h / 16)
        else:
            tok = tokens
        cfg = RunRecord(
            run_id=rid, arm=rec.model_kind,
            model={"n_layers": 4, "latent_bits": h if rec.latent else 0},
            optim={"lr": 1e-3},
            train={"seed": seed, "tokens": tok, "flops": sc.flops_budget,
                   "compute_match": "flops" if matched else "none",
                   "match_latent_bits": h or 16, "batch_size": 16, "seq_len": 256},
            accounting={"flops_per_token": fpt, "flops_per_token_baseline_part": fpt0,
                        "flops_overhead": ovh, "tokens": tok, "flops": tok * fpt,
                        "tokens_per_step": 4096},
            provenance={"host": "sim", "threads": 1, "launcher": "direct"})
        _write_json(rd.record_path, cfg.to_json())  # JSON is YAML
        u = rng.normal(0.0, sc.sd, 2)
        y = (rng.random(d.n_items) < np.clip(q + eff + u[0], 0, 1)).astype(float)
        if equal is not None:
            y = equal[0 if rec.is_treatment else 1][seed]
        yc = (rng.random(d.n_items) < np.clip(q + eff + u[1], 0, 1)).astype(float)
        crashed = rng.random(d.n_items) < sc.crash
        yc[crashed] = np.nan
        outcomes[cell] = {TASK: y, CODE_TASK: yc}
        val = 3.0 - eff + rng.normal(0, 0.01)
        lines = [{"kind": "train", "step": 1, "tokens": tok, "flops": tok * fpt, "ce": val,
                  "tokens_per_s": 1000.0},
                 {"kind": "val", "step": 1, "tokens": tok, "flops": tok * fpt, "val_ce": val},
                 {"kind": "final", "step": 1, "tokens": tok, "flops": tok * fpt, "wall_s": 1.0}]
        rd.metrics_path.write_text("".join(json.dumps(x) + "\n" for x in lines),
                                          encoding="utf-8")
        he_items = [{"doc_id": i, "plus": None if np.isnan(v) else float(v),
                     "base": None if np.isnan(v) else float(v)}
                    | ({"reason": "sandbox timeout"} if np.isnan(v) else {})
                    for i, v in enumerate(yc)]
        scored = yc[np.isfinite(yc)]
        tasks = {
            TASK: {"primary": "exact_match", "higher_is_better": True, "n": d.n_items,
                      "metrics": {"exact_match": {"value": float(y.mean()), "n": d.n_items}},
                      "items": [{"doc_id": i, "exact_match": float(v)} for i, v in
                                enumerate(y)]},
            CODE_TASK: {
                "primary": "pass@1_plus", "higher_is_better": True, "n": int(scored.size),
                "metrics": {"pass@1_plus": {
                    "value": float(scored.mean()) if scored.size else None,
                    "n": int(scored.size), "n_missing": int(d.n_items - scored.size)}},
                "items": he_items}}
        ev = EvalFile(suite="lm-eval", spec=spec, spec_id=spec.id, run_id=rid,
                      checkpoint_step=1, z_mode="prior", k=1, leaks=False, limit=d.n_items,
                      tasks=tasks)
        _write_json(rd.eval_file(spec.file_name(1)), ev.to_json())
        if sc.stray_limit and cell == f"{base}-s0":  # a LIMIT-10 re-run: must be excluded
            s2 = replace(spec, limit=10)
            stray = replace(ev, limit=10, spec=s2, spec_id=s2.id, tasks={
                TASK: dict(tasks[TASK], metrics={"exact_match": {"value": 1.0, "n": 10}},
                           items=[{"doc_id": i, "exact_match": 1.0} for i in range(10)])})
            _write_json(rd.eval_file(s2.file_name(1)), stray.to_json())
    man = Manifest(name=sc.name, cells=tuple(cells),
                   grid={"kappa_bits": list(d.kappas), "latent_bits": list(sc.hs),
                         "seeds": list(range(d.n_seeds)),
                         "tokens": None if sc.flops_budget else tokens,
                         "flops": sc.flops_budget},
                   eval_spec=spec, eval_spec_id=spec.id)
    _write_json(SweepDir.of(sc.name, root).manifest_path, man.to_json())
    return {"q": q, "outcomes": outcomes}


def _expected(sim: dict, sc: Scenario, h: int, k: float, task: str, ref: str) -> S.Delta:
    """The Δ computed straight from the simulated outcomes, with the reference of the same H
    and seed: what the table must show."""
    d = sc.design
    rows_t, rows_r = [], []
    for s in range(d.n_seeds):
        t = sim["outcomes"].get(f"free-k{k:g}-H{h}-s{s}")
        rname = f"baseline_flops-H{h}-s{s}" if ref == "baseline_flops" else f"baseline-s{s}"
        r = sim["outcomes"].get(rname)
        if t is not None and r is not None:
            rows_t.append(t[task])
            rows_r.append(r[task])
    if not rows_t:
        return S._empty_delta()
    t, r = np.stack(rows_t), np.stack(rows_r)
    keep = np.isfinite(t).all(axis=0) & np.isfinite(r).all(axis=0)
    return _delta((t - r)[:, keep], 2000)


@dataclass
class FullPath:
    sweeps: int = 0
    comparisons: int = 0
    mismatches: list[str] = field(default_factory=list)
    fpr: Tally = field(default_factory=Tally)
    coverage: Tally = field(default_factory=Tally)
    supported_null: Tally = field(default_factory=Tally)
    out_of_range: int = 0
    intervals: int = 0
    seconds: float = 0.0


def full_path(scenarios: list[Scenario], seed: int = 0, n_boot: int = 2000) -> FullPath:
    """Write each scenario as result files and run the real analysis on it."""
    rng = np.random.default_rng(seed)
    fp = FullPath()
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="ftbench-calib-") as td:
        tmp = Path(td)
        for sc in scenarios:
            sim = write_scenario(tmp, sc, rng)
            data = load_sweep(sc.name, tmp)
            comps, notes = comparisons(data)
            views = {c.view: c.reference for c in comps}
            fp.sweeps += 1
            if sc.flops_budget is not None:
                if "tokens" in views or views.get("flops") != "baseline":
                    fp.mismatches.append(f"{sc.name}: FLOPs-budget views {views}")
                if "FLOPs budget" not in notes.get("tokens", ""):
                    fp.mismatches.append(f"{sc.name}: no FLOPs-budget note")
            elif views != {"tokens": "baseline", "flops": "baseline_flops"}:
                fp.mismatches.append(f"{sc.name}: views {views}")
            if sc.stray_limit and not any(not e["used"] for e in data.evals):
                fp.mismatches.append(f"{sc.name}: the stray LIMIT-10 file was used")
            for view, ref in views.items():
                t = paper_table(data, view, n_boot=n_boot)
                t = t[t["comparison"] == f"{view}:{ref}"]
                for task in (TASK, CODE_TASK):
                    rows = t[(t["task"] == task) & (t["column"] != "")]
                    for r in rows.itertuples():
                        fp.intervals += 2
                        fp.out_of_range += (not _in_range(r.lo, r.hi, S.UNIT)) + (
                            not _in_range(r.delta_lo, r.delta_hi, (-1.0, 1.0)))
                        if not arms.arm(r.arm).is_treatment:
                            continue
                        exp = _expected(sim, sc, int(r.latent_bits), float(r.kappa_bits), task,
                                        ref)
                        fp.comparisons += 1
                        same = (np.isclose(r.delta, exp.delta, equal_nan=True, atol=1e-12)
                                and np.isclose(r.p, exp.p, equal_nan=True, atol=1e-9))
                        if not same:
                            fp.mismatches.append(
                                f"{sc.name} {view} {task} {r.column}: table Δ {r.delta} p {r.p}"
                                f" vs direct Δ {exp.delta} p {exp.p}")
                        eff = sc.effects.get(float(r.kappa_bits), 0.0)
                        ref_eff = sc.control_effect.get(int(r.latent_bits), 0.0) \
                            if ref == "baseline_flops" else 0.0
                        truth = (expected_score(sim["q"], eff, sc.sd)
                                 - expected_score(sim["q"], ref_eff, sc.sd))
                        if r.delta_unit == "seed":
                            if eff == ref_eff:
                                fp.fpr.add(bool(r.significant))
                            fp.coverage.add(math.isfinite(r.delta_lo)
                                            and r.delta_lo <= truth <= r.delta_hi)
                if view == "tokens" and not sc.effects:
                    cl = _benchmark_claim(t, TASK, TASK_NAME, "tokens")
                    fp.supported_null.add(cl["verdict"] == SUPPORTED)
    fp.seconds = time.time() - t0
    return fp


def scenarios(n: int, design: Design, sds: tuple[float, ...] = SEED_SDS) -> list[Scenario]:
    """n full-path sweeps per seed SD, cycling through the special shapes."""
    out = []
    for sd in sds:
        for i in range(n):
            kind = i % 5
            effects = {} if i % 2 == 0 else {k: COVERAGE_EFFECTS[j % 4]
                                              for j, k in enumerate(design.kappas)}
            sc = Scenario(f"sim-{int(sd * 100)}-{i}", design, sd, effects=effects)
            if kind == 1:  # multi-H, each H's control of a different strength
                sc.hs, sc.control_effect = (4, 16), {4: 0.0, 16: 0.04}
            elif kind == 2:
                sc.flops_budget = 5e11
            elif kind == 3:
                sc.missing, sc.crash = True, 0.05
            elif kind == 4:
                sc.stray_limit, sc.crash = True, 0.02
            out.append(sc)
    return out


# ---- the rounding case: equal counts that float arithmetic makes unequal ------------------------

ROUNDING_ITEMS = (30, 82, 1319)
"""Benchmark sizes of the rounding case (the demo's LIMIT, the issue's 82 items, GSM8K)."""


@dataclass
class Rounding:
    """Seeds whose FT beats (or trails) its baseline by the same number of items on every seed:
    the per-seed differences are equal, and a statistic that sees their float-rounding spread
    as variation calls them significant with p ~ 1e-30 (issue 24). None may be significant."""

    trials: int = 0
    spread: int = 0
    """Trials whose per-seed mean differences have a nonzero float SD (the adversary at work)."""
    paired: Tally = field(default_factory=Tally)
    """Significant via the paired_delta path (per-item rows, paired by seed and item)."""
    means: Tally = field(default_factory=Tally)
    """Significant via the per-seed means path (seed_delta: per-seed scores only)."""
    holm: Tally = field(default_factory=Tally)
    """A family of two such FTs: any Holm-adjusted p < 5%."""
    full_rows: Tally = field(default_factory=Tally)
    """Full path: table rows (both views) significant or Holm-significant."""
    full_supported: Tally = field(default_factory=Tally)


def _equal_counts(rng: np.random.Generator, n_items: int, n_seeds: int, gain: int,
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(ft, ref) 0/1 outcomes, seeds x items: on every seed the FT passes the reference's
    items plus `gain` more (or, gain < 0, fewer), on items in a random order."""
    ref = np.zeros((n_seeds, n_items))
    ft = np.zeros_like(ref)
    for s in range(n_seeds):
        k = int(rng.integers(max(0, -gain), n_items - max(0, gain) + 1))
        order = rng.permutation(n_items)
        ref[s, order[:k]] = 1
        ft[s, order[:k + gain]] = 1
    return ft, ref


def rounding(n_trials: int, n_full: int = 0, seed: int = 0, n_boot: int = 500) -> Rounding:
    """The rounding case through the report's statistics (bulk) and, `n_full` times, through
    result files -> load_sweep -> paper_table -> claims (`Scenario.equal_gain`)."""
    rng = np.random.default_rng([seed, 24])
    r = Rounding()
    for _ in range(n_trials):
        n = int(rng.choice(ROUNDING_ITEMS))
        gain = int(rng.choice([-2, -1, 1, 2, 3]))
        ps = []
        for _k in range(2):  # two FTs (kappas) of the same sweep, one Holm family
            ft, ref = _equal_counts(rng, n, 3, gain)
            means = ft.mean(axis=1) - ref.mean(axis=1)
            r.trials += 1
            r.spread += bool(np.std(means, ddof=1) > 0 or np.std((ft - ref).mean(axis=1),
                                                                 ddof=1) > 0)
            d = _delta(ft - ref, n_boot)
            r.paired.add(d.significant)
            r.means.add(S.seed_t(means, (-1.0, 1.0), scale=1.0).significant)
            ps.append(d.p)
        r.holm.add(bool(np.any(S.holm(ps) < ALPHA)))
    if n_full:
        with tempfile.TemporaryDirectory(prefix="ftbench-calib-round-") as td:
            tmp = Path(td)
            design = Design("rounding", 82, 3, (0.5, 2.0), "3 seeds x 82 items, equal counts")
            for i in range(n_full):
                sc = Scenario(f"round-{i}", design, 0.03,
                              equal_gain=int(rng.choice([-1, 1, 2])))
                write_scenario(tmp, sc, rng)
                data = load_sweep(sc.name, tmp)
                for view in ("tokens", "flops"):
                    t = paper_table(data, view, n_boot=n_boot)
                    g = t[(t["task"] == TASK) & t["arm"].isin(arms.names(treatment=True))]
                    for row in g.itertuples():
                        r.full_rows.add(bool(row.significant or row.significant_holm))
                    if view == "tokens":
                        cl = _benchmark_claim(t, TASK, TASK_NAME, "tokens")
                        r.full_supported.add(cl["verdict"] == SUPPORTED)
    return r


# ---- equivalence (TOST) on planted truth -----------------------------------------------------

TOST_ITEM_MARGIN = 0.05
"""Margin of the 0/1-item designs: 5 points."""
TOST_CE_MARGIN = 0.02
"""Margin of the per-seed continuous metric (validation CE, nats): the study's MDE scale."""
TOST_CE_SDS = (0.01, 0.03)
"""SD of a per-seed paired CE difference (nats): about the study's pilot and realised seed SDs."""
TOST_CE_SEEDS = (3, 5, 10)
POWER_SHOWN = 0.80
"""The doc lists the TOST settings whose power at Δ = 0 reaches this."""


@dataclass
class TostCell:
    """TOST on one setting: 'equivalent' when the true |Δ| equals the margin (must be <= 5%:
    the test's level) and when the true Δ is 0 (power)."""

    at_margin: Tally = field(default_factory=Tally)
    at_zero: Tally = field(default_factory=Tally)


def tost_items(design: Design, sd: float, n_sweeps: int, seed: int = 0) -> TostCell:
    """0/1 items (the bulk model above): per sweep, an FT whose true difference to its baseline
    is exactly +-margin (the planted effect's expected difference over the sweep's items, by
    quadrature, is used as the margin, so clipping cannot blur it), and one with effect 0;
    `stats.tost` over the per-seed mean differences (what `stats.paired_tost` runs)."""
    rng = np.random.default_rng([seed, design.n_items, design.n_seeds, int(sd * 1000), 38])
    c = TostCell()
    for i in range(n_sweeps):
        q = rng.uniform(0.25, 0.75, design.n_items)
        sign = 1.0 if i % 2 == 0 else -1.0  # both boundaries, in turn
        truth = expected_score(q, sign * TOST_ITEM_MARGIN, sd) - expected_score(q, 0.0, sd)
        base = draw(rng, q, 0.0, sd, design.n_seeds)
        y = draw(rng, q, sign * TOST_ITEM_MARGIN, sd, design.n_seeds)
        c.at_margin.add(S.tost(S.per_seed_diffs(y - base), abs(truth), scale=1.0).equivalent)
        base = draw(rng, q, 0.0, sd, design.n_seeds)
        y = draw(rng, q, 0.0, sd, design.n_seeds)
        c.at_zero.add(S.tost(S.per_seed_diffs(y - base), abs(truth), scale=1.0).equivalent)
    return c


def tost_ce(n_seeds: int, sd: float, n_sweeps: int, seed: int = 0) -> TostCell:
    """A per-seed continuous metric (validation CE): paired differences ~ N(Δ, sd), Δ = +-margin
    or 0, through `stats.tost` (what `stats.seed_tost` runs)."""
    rng = np.random.default_rng([seed, n_seeds, int(sd * 1e4), 38])
    c = TostCell()
    for i in range(n_sweeps):
        sign = 1.0 if i % 2 == 0 else -1.0
        c.at_margin.add(S.tost(rng.normal(sign * TOST_CE_MARGIN, sd, n_seeds),
                               TOST_CE_MARGIN).equivalent)
        c.at_zero.add(S.tost(rng.normal(0.0, sd, n_seeds), TOST_CE_MARGIN).equivalent)
    return c


def tost_calibration(n_sweeps: int, seed: int = 0,
                     settings: list[tuple[str, float]] | None = None) -> dict:
    """{("items", design, sd): TostCell, ("ce", n_seeds, sd): TostCell}."""
    out: dict = {}
    for name, sd in settings or [(n, sd) for n in ("demo", "paper") for sd in SEED_SDS]:
        if DESIGNS[name].n_seeds >= 2:
            out[("items", name, sd)] = tost_items(DESIGNS[name], sd, n_sweeps, seed)
    for n in TOST_CE_SEEDS:
        for sd in TOST_CE_SDS:
            out[("ce", n, sd)] = tost_ce(n, sd, n_sweeps, seed)
    return out


# ---- the synthetic task's gaps (analysis.synthetic.gap_tests) on planted samples -------------

GAP_SCENARIOS: dict[str, tuple[float, float]] = {
    "null (Z carries nothing)": (0.0, 0.0),
    "weak, every Z (pi ~ Beta(20, 113), mean 0.15)": (20.0, 113.0),
    "mixed (pi ~ Beta(1, 4), mean 0.2)": (1.0, 4.0),
    "strong (pi ~ Beta(5, 2), mean 0.71)": (5.0, 2.0),
    "rare (pi ~ Beta(0.3, 3): a few Z carry much)": (0.3, 3.0),
}
"""Planted encoders: each shared Z group g gets a strength pi_g; each of its rows puts the run
at the group's start with probability pi_g (else a uniform start) and takes the group's '!' set
with probability pi_g (else its own, each character '!' with probability 1/16); 10% of rows
carry no run (invalid)."""


def _planted_body(start: int | None, noise: np.ndarray) -> str:
    b = ["_"] * 64
    if start is not None:
        b[start:start + 8] = ["T"] * 8
    for i in noise:
        b[int(i)] = "!"
    return "".join(b)


def planted_samples(rng: np.random.Generator, a: float, b: float, n_prompts: int = 4,
                    n_shared: int = 4, rows: int = 8, p_valid: float = 0.9) -> list[dict]:
    """One model's samples in samples.jsonl's layout (the experiment's default shape)."""
    out = []
    for p in range(n_prompts):
        for g in range(n_shared + 1):
            pi = 0.0 if g == 0 or a == 0 else float(rng.beta(a, b))
            start = int(rng.integers(57))
            noise = np.flatnonzero(rng.random(64) < 1 / 16)
            for r in range(rows):
                st = start if rng.random() < pi else int(rng.integers(57))
                nz = noise if rng.random() < pi else np.flatnonzero(rng.random(64) < 1 / 16)
                out.append({"prompt_idx": p, "group": g, "row": r, "letter": "T",
                            "group_kind": "shared" if g else "per_sequence",
                            "text": _planted_body(st if rng.random() < p_valid else None, nz)})
    return out


NULL_SIMS_FACTOR = 4
"""The null scenario runs this many times the others' planted models."""


@dataclass
class GapCell:
    """One planted scenario: the population gaps (pooled pair sums of `n_truth` independent
    models), coverage of the 95% intervals, share with permutation p < 0.05, mean width."""

    truth: dict[str, float] = field(default_factory=dict)
    coverage: dict[str, Tally] = field(default_factory=dict)
    detected: dict[str, Tally] = field(default_factory=dict)
    width: dict[str, list[float]] = field(default_factory=dict)


def gap_calibration(n_sims: int, seed: int = 0) -> dict[str, GapCell]:
    kinds = ("pos", "noise")
    keys = ("pos", "pos_n", "noise", "noise_n")
    out = {}
    for j, (name, (a, b)) in enumerate(GAP_SCENARIOS.items()):
        rng = np.random.default_rng([seed, j, 3838])
        w = dict.fromkeys(keys, 0.0)
        t = dict.fromkeys(keys, 0.0)
        n = n_sims * (NULL_SIMS_FACTOR if a == 0 else 1)  # the level needs the most precision
        for _ in range(n_sims):  # the truth: pair sums pooled over independent models
            for pp in SY._prompts(SY._frame(planted_samples(rng, a, b))):
                blk = pp.blocks
                for k in keys:
                    w[k] += float(np.trace(blk[k])) / 2
                    t[k] += float(blk[k].sum()) / 2
        c = GapCell(truth={k: SY._gap_of(w, t, k) or 0.0 for k in kinds},
                    coverage={k: Tally() for k in kinds}, detected={k: Tally() for k in kinds},
                    width={k: [] for k in kinds})
        for _ in range(n):
            g = SY.gap_tests(planted_samples(rng, a, b), n_perm=999,
                             seed=int(rng.integers(2**31)))
            for k in kinds:
                lo, hi = g[f"{k}_lo"], g[f"{k}_hi"]
                c.coverage[k].add(lo is not None and lo <= c.truth[k] <= hi)
                c.detected[k].add(g[f"{k}_p"] is not None and g[f"{k}_p"] < ALPHA)
                if lo is not None:
                    c.width[k].append(hi - lo)
        out[name] = c
    return out


# ---- the report -------------------------------------------------------------------------------

def run(n_sweeps: int, n_full: int, seed: int = 0,
        settings: list[tuple[str, float]] | None = None, n_boot: int = 500,
        gap_sims: int = 0) -> dict:
    """All figures: {"bulk": {(design, sd): Cell}, "full": FullPath, "tost": {...}, "gaps":
    {...}, "seconds": ...}. settings: (design, seed SD) pairs; default every design at every SD
    in SEED_SDS. gap_sims: planted models per synthetic-gap scenario (0: not run)."""
    t0 = time.time()
    res: dict = {"bulk": {}, "n_sweeps": n_sweeps, "n_full": n_full, "seed": seed}
    settings = settings or [(n, sd) for n in DESIGNS for sd in SEED_SDS]
    for name, sd in settings:
        d = DESIGNS[name]
        n = n_sweeps if d.n_seeds >= 2 else max(1, n_sweeps // 4)
        res["bulk"][(name, sd)] = bulk(d, sd, n, seed=seed, n_boot=n_boot)
    res["full"] = full_path(scenarios(n_full, DESIGNS["demo"], SEED_SDS), seed=seed)
    res["rounding"] = rounding(n_sweeps, n_full=max(1, n_full // 10), seed=seed, n_boot=n_boot)
    res["tost"] = tost_calibration(n_sweeps, seed, settings=settings)
    if gap_sims:
        res["gaps"] = gap_calibration(gap_sims, seed)
    res["seconds"] = time.time() - t0
    return res


def _rates_missed(tag: str, fpr: Tally, coverage: Tally, supported: Tally | None = None,
                  ) -> list[str]:
    """The false-positive, false 'supported' and coverage targets of one setting, judged on
    their Monte-Carlo intervals."""
    out = [f"{tag}: {what} {t.text()} > 5%" for what, t in (
        ("false-positive rate", fpr), ("false 'supported'", supported))
        if t is not None and t.ci[0] > TARGETS["fpr_max"]]
    lo, hi = coverage.ci
    if hi < TARGETS["coverage"][0] or lo > TARGETS["coverage"][1]:
        out.append(f"{tag}: coverage {coverage.text()} outside 93-98%")
    return out


def failures(res: dict) -> list[str]:
    """One line per target the figures miss (docs/CALIBRATION.md lists the targets)."""
    out = []
    for (name, sd), c in res["bulk"].items():
        tag = f"{name}, seed SD {100 * sd:g} pts"
        if DESIGNS[name].n_seeds >= 2:
            out += _rates_missed(tag, c.fpr, c.coverage, c.supported_null)
            if c.power.k < c.power_t.k or c.power_lt_t:
                out.append(f"{tag}: power {c.power.text()} below the paired t's "
                           f"{c.power_t.text()}")
        elif c.decided_null.k:
            out.append(f"{tag}: {c.decided_null.k} verdicts drawn from a single seed")
        if c.out_of_range:
            out.append(f"{tag}: {c.out_of_range} intervals outside the metric's range")
    rd = res.get("rounding")
    if rd is not None:
        for what, t in (("paired", rd.paired), ("per-seed means", rd.means), ("Holm", rd.holm),
                        ("full path", rd.full_rows), ("full path 'supported'",
                                                      rd.full_supported)):
            if t.k:
                out.append(f"rounding case ({what}): {t.text()} significant; must be none")
    tost_cells = res.get("tost", {})
    for key, tc in tost_cells.items():
        # at the boundary the rate is alpha exactly (one side rejects with probability alpha,
        # the other almost surely when the test has power), so a per-cell 95% MC interval
        # would flag a correct test in about 1 cell in 40: Bonferroni over the cells
        lv = 1 - 0.05 / max(1, len(tost_cells))
        if tc.at_margin.n and S.clopper_pearson(tc.at_margin.k, tc.at_margin.n,
                                                lv)[0] > TARGETS["fpr_max"]:
            out.append(f"TOST {_tost_tag(key)}: false 'equivalent' at |Δ| = margin "
                       f"{tc.at_margin.text()} > 5%")
    for name, gc in res.get("gaps", {}).items():
        for k, t in gc.detected.items():
            # an exact permutation test sits at its level (p = (1 + hits) / (1 + n) makes it
            # a hair below), so a plain 95% MC interval would flag a correct test in one cell
            # in forty: Bonferroni over the null's two cells (position, noise)
            if name.startswith("null") and t.n and S.clopper_pearson(
                    t.k, t.n, 1 - 0.05 / len(gc.detected))[0] > TARGETS["fpr_max"]:
                out.append(f"synthetic gaps, {name}: permutation p < 0.05 in "
                           f"{t.text()} of {k} gaps with no encoding > 5%")
    fp = res["full"]
    out += [f"full path: {m}" for m in fp.mismatches[:10]]
    if fp.out_of_range:
        out.append(f"full path: {fp.out_of_range} intervals outside the metric's range")
    return out + _rates_missed("full path", fp.fpr, fp.coverage)


def _tost_tag(key: tuple) -> str:
    if key[0] == "items":
        return f"0/1 items, {key[1]}, seed SD {100 * key[2]:g} pts"
    return f"per-seed CE, {key[1]} seeds, SD of a difference {key[2]:g} nats"


TEMPLATE = Path(__file__).with_name("calibration.md.j2")
"""The doc's text; `markdown` fills in the figures and tables."""


def markdown(res: dict, command: str) -> str:
    import jinja2

    ctx: dict = {"res": res, "command": command, "fp": res["full"], "rd": res.get("rounding"),
                 "designs": DESIGNS.values(), "run_record": RUN_RECORD, "metrics": METRICS,
                 "rounding_items": ", ".join(map(str, ROUNDING_ITEMS)), "missed": failures(res),
                 "tost_table": "", "gap_table": ""}  # sections a quick run leaves out
    ctx["bulk_table"] = md(pd.DataFrame([{
        "design": name, "seed SD": f"{100 * sd:g}", "FPR": c.fpr.text(),
        "FPR (Holm)": c.fpr_holm.text(), "false 'supported'": c.supported_null.text(),
        "coverage": c.coverage.text(), "power +2 pts": c.power.text(),
        "paired t power": c.power_t.text() if c.power_t.n else "n/a (1 seed)",
        "MDE (pts)": f"{100 * float(np.median(c.mde)):.1f}" if c.mde else "n/a",
        "out of range": f"{c.out_of_range}/{c.intervals}"}
        for (name, sd), c in res["bulk"].items()]))
    if tc := res.get("tost"):
        ctx |= {"item_margin": f"{100 * TOST_ITEM_MARGIN:g}", "ce_margin": f"{TOST_CE_MARGIN:g}",
                "ce_sds": " or ".join(f"{x:g}" for x in TOST_CE_SDS),
                "tost_powered": "; ".join(_tost_tag(k) for k, c in tc.items() if c.at_zero.n
                                          and c.at_zero.rate >= POWER_SHOWN) or "no row"}
        ctx["tost_table"] = md(pd.DataFrame([{
            "data": (f"0/1 items, {k[1]} ({DESIGNS[k[1]].n_items} items, "
                     f"{DESIGNS[k[1]].n_seeds} seeds), seed SD {100 * k[2]:g} pts")
            if k[0] == "items" else f"per-seed CE, {k[1]} seeds, SD {k[2]:g} nats",
            "margin": f"{100 * TOST_ITEM_MARGIN:g} pts" if k[0] == "items"
            else f"{TOST_CE_MARGIN:g} nats",
            "false 'equivalent' at |Δ| = margin": c.at_margin.text(),
            "'equivalent' at Δ = 0 (power)": c.at_zero.text()} for k, c in tc.items()]))
    if gp := res.get("gaps"):
        ctx |= {"n_sims": min(gc.coverage["pos"].n for gc in gp.values()),
                "null_factor": NULL_SIMS_FACTOR,
                "gaps_below": "; ".join(
                    f"{name} ({k})" for name, gc in gp.items() for k in ("pos", "noise")
                    if gc.coverage[k].ci[1] < 0.95)
                or "no scenario"}
        ctx["gap_table"] = md(pd.DataFrame([{
            "scenario": name,
            "true gap pos / noise": f"{gc.truth['pos']:.4f} / {gc.truth['noise']:.4f}",
            "coverage pos": gc.coverage["pos"].text(),
            "coverage noise": gc.coverage["noise"].text(),
            "p < 0.05 pos": gc.detected["pos"].text(),
            "p < 0.05 noise": gc.detected["noise"].text(),
            "mean width pos / noise": (
                f"{np.mean(gc.width['pos']):.3f} / {np.mean(gc.width['noise']):.3f}"
                if gc.width["pos"] and gc.width["noise"] else "n/a")} for name, gc in gp.items()]))
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined, autoescape=False)
    return env.from_string(TEMPLATE.read_text(encoding="utf-8")).render(ctx)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python tests/calibration.py",
                                 description="Calibrate the report's statistics (see "
                                             "docs/CALIBRATION.md)")
    ap.add_argument("--sweeps", type=int, default=1000, help="bulk sweeps per setting")
    ap.add_argument("--full-path", type=int, default=50,
                    help="result-file sweeps per seed SD through load_sweep/tables/claims")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gap-sims", type=int, default=400,
                    help="planted models per synthetic-gap scenario (0: skip that section)")
    ap.add_argument("--out", default=None, help="write the Markdown here (docs/CALIBRATION.md)")
    a = ap.parse_args(argv)

    def body() -> int:
        if a.sweeps < 1 or a.full_path < 0 or a.gap_sims < 0:
            raise UsageError("--sweeps must be >= 1, --full-path and --gap-sims >= 0")
        cmd = "python tests/calibration.py " + " ".join(
            argv if argv is not None else sys.argv[1:])
        res = run(a.sweeps, a.full_path, seed=a.seed, gap_sims=a.gap_sims)
        text = markdown(res, cmd.strip())
        print(f"wrote {atomic_write_text(a.out, text)}" if a.out else text)
        for b in failures(res):
            print(f"calibrate: target missed: {b}", file=sys.stderr)
        return 1 if failures(res) else 0

    return cli("calibrate", body)


if __name__ == "__main__":
    sys.exit(main())
