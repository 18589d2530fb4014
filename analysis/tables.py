"""The paper-style benchmark tables, one per comparison, as long frames (CSV), Markdown, LaTeX.

Rows are the paper's 16 benchmarks in its four groups (analysis/paper_groups.py), each with the
paper's metric and ours (a stand-in is marked); a row the suite cannot run says why. Smooth
metrics (gold-answer bits per byte, validation CE in nats, bpb) are their own group.

Comparisons (`comparisons`) are named from the data, never from a flag: each Free Transformer
run is paired with the reference run that matches it (same seed; a FLOPs-matched control also
the same H), and a reference is "equal tokens" only when every pair's actual tokens agree
within `EQUAL_TOL` (1%; one optimizer step for a run under 100 steps), "equal FLOPs" likewise.
View `tokens` (the paper's protocol): the baseline, the +1-layer control, the Z-cut control and
the controls against the baseline (their own Holm family); view `flops`: the FLOPs-matched
baseline (or the baseline of a FLOPs-budget sweep) and the +1-layer control at those FLOPs.

A cell holds the column's mean over seeds with its 95% interval and n; a compared column also
holds Δ against its reference (stats.paired_delta / seed_delta: bits-per-byte rows on the
cells' own per-seed estimand, other item metrics paired by item), p, the Holm-adjusted p over
the comparison's columns on that row (`holm_family` names it), the MDE, the TOST equivalence
test against TOST_MARGIN, and "identical" when every seed's difference is float32 rounding.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from common import arms, benchmarks
from common.arms import BASELINE, BASELINE_PLUS1, FREE, FREE_ZCUT
from common.kappa import kappa_label
from common.paths import RUN_RECORD
from common.records import FLOPS_MATCHED_ARMS, EvalSpec

from .frame import SweepData, other_spec_files, other_spec_status
from .paper_groups import PAPER_GROUPS
from .render import ci, fmt, md
from .stats import (
    ALPHA,
    F32_ULPS,
    NO_VARIATION,
    _scale,  # the largest |value| among the values subtracted: their rounding's scale
    cell_interval,
    holm,
    identical,
    paired_delta,
    paired_matrix,
    paired_tost,
    seed_delta,
    seed_diffs,
    seed_tost,
)

SMOOTH_GROUP = ("Smooth metrics (lower is better)", [*benchmarks.gold_tasks(), "val"])
GROUPS: list[tuple[str, list[str]]] = [
    *[(g, [r["task"] for r in rows if r["task"]]) for g, rows in PAPER_GROUPS.items()],
    SMOOTH_GROUP]
"""The paper's four row groups (analysis/paper_groups.py), then the smooth metrics."""
VAL_METRICS = ["val_bpb", "val_ce"]
NOT_IN_SUITE = "not in this suite"
VIEWS = ("tokens", "flops")
EQUAL_TOL = 0.01
MAX_STEP_TOL = 0.05
"""A whole-step run cannot match closer than one step: below 100 steps the tolerance is one
step of the reference run, never more than 5%."""
TABLE_COLS = ["view", "comparison", "reference", "reference_arm", "group", "benchmark",
              "paper_metric", "matches_paper", "task", "metric", "higher_is_better",
              "column", "arm", "kappa_bits", "latent_bits", "match_h", "n_seeds_expected",
              "n_seeds", "n_items", "mean", "lo", "hi", "ci_method", "delta", "delta_lo",
              "delta_hi", "p", "p_holm", "holm_m", "significant", "significant_holm", "better",
              "delta_unit", "delta_method", "delta_n_seeds", "delta_n_items", "mde",
              "degenerate", "status", "n_missing", "n_truncated", "n_requests", "spec_ids",
              "files", "run_ids", "identical", "tost_margin", "tost_lo", "tost_hi", "tost_p",
              "equivalence", "holm_family", "delta_estimand"]
"""Columns of the long table (the CSV). `reference` is the exact column a row's Δ is taken
against (a reference column names itself; in a multi-H equal-FLOPs table that is e.g.
"baseline_flops (H=16)"), `reference_arm` the arm it belongs to; a row without a column names
the comparison's reference column when it has one, else "" (several per-H columns)."""
TOST_MARGIN = {"val_ce": 0.03, "bpb": 0.015, "rate": 0.05}
"""Equivalence margins, stated before looking (the study's MDE target is 0.03 nats/token):
validation CE 0.03 nats/token; every bits-per-byte metric 0.015 bits/byte (the same 0.03
nats/token at the corpus's ~3 bytes per token: 0.03 / ln 2 / 3); a 0/1 rate (accuracy, pass@1)
0.05 (five points). The TOST (analysis/stats.py) says "equivalent" only when the 90% interval
of Δ lies inside ±margin: an interval that merely includes 0 is never "no difference"."""


def tost_margin(metric: str) -> float:
    """The equivalence margin of a metric (TOST_MARGIN)."""
    if metric in ("val_ce", "val_ce_prior", "val_ce_posterior"):
        return TOST_MARGIN["val_ce"]
    if metric.endswith("bpb"):
        return TOST_MARGIN["bpb"]
    return TOST_MARGIN["rate"]


SEED_ESTIMAND = ("per-seed value as its file reports it (bits-per-byte: total bits / total "
                 "bytes of the seed's items, byte-weighted), differenced by seed; Δ = the "
                 "difference of the two cells' means over the same seeds")
ITEM_ESTIMAND = "per-item paired differences, averaged per seed (the seed is the unit)"
"""What a Δ is a difference of (column `delta_estimand`). Bits-per-byte rows use the seed
estimand, so the Δ is the difference of the printed cells; other item metrics pair items."""



@dataclass(frozen=True)
class Column:
    label: str
    arm: str
    kappa_bits: float
    latent_bits: float
    match_h: float = math.nan
    """Reference columns of a FLOPs-matched control: the H of the FT it matches."""
    ref: Column | None = None
    """Free Transformer columns: the reference column their Δ is taken against."""


@dataclass(frozen=True)
class Basis:
    """What the data says about a reference arm against the Free Transformers it pairs with."""

    arm: str
    n_pairs: int
    tokens_diff: float
    """max |tokens_ref / tokens_FT - 1| over the pairs (NaN: no numbers)."""
    flops_diff: float
    tol: float
    planned: bool
    """True when some run has not finished: the planned numbers in config.yaml were used."""

    @property
    def equal(self) -> str | None:
        """'tokens', 'flops' or None (neither, or not known)."""
        t = math.isfinite(self.tokens_diff) and self.tokens_diff <= self.tol
        f = math.isfinite(self.flops_diff) and self.flops_diff <= self.tol
        if t and f:
            return "tokens" if self.tokens_diff <= self.flops_diff else "flops"
        return "tokens" if t else "flops" if f else None

    def text(self) -> str:
        if not self.n_pairs:
            return f"{self.arm}: no run with tokens/FLOPs to compare yet"
        src = f"planned ({RUN_RECORD}; some runs unfinished)" if self.planned else "actual"
        return (f"{self.arm} vs the Free Transformers it pairs with ({self.n_pairs} pairs, "
                f"{src}): tokens differ by up to {100 * self.tokens_diff:.2f}%, FLOPs by up to "
                f"{100 * self.flops_diff:.2f}% (equal means within {100 * self.tol:.2f}%)")


@dataclass
class Comparison:
    view: str
    reference: str
    """The reference arm."""
    role: str
    title: str
    basis: Basis | None
    columns: list[Column] = field(default_factory=list)
    tag: str = ""
    """Set when a second comparison shares the view and reference (the controls against the
    baseline): its key gets `:<tag>`."""

    @property
    def key(self) -> str:
        return f"{self.view}:{self.reference}" + (f":{self.tag}" if self.tag else "")


def _compute(row: pd.Series) -> tuple[float, float, bool]:
    """(tokens, FLOPs, planned) of a run: the metrics.jsonl final line, else config.yaml."""
    t, f = row.get("final_tokens", math.nan), row.get("final_flops", math.nan)
    if isinstance(t, float) and math.isfinite(t) and isinstance(f, float) and math.isfinite(f):
        return t, f, False
    return row.get("planned_tokens", math.nan), row.get("planned_flops", math.nan), True


def _free_hs(data: SweepData) -> list[float]:
    c = data.cells
    if c.empty:
        return []
    return sorted(set(c[c["arm"] == FREE.name]["latent_bits"].dropna().astype(float)))


def _ref_mask(df: pd.DataFrame, arm: str, h: float) -> pd.Series:
    """Rows of the reference arm that match a Free Transformer of latent width h (a
    FLOPs-matched control: the H its manifest cell records)."""
    m = df["arm"] == arm
    if arm in FLOPS_MATCHED_ARMS:
        m &= np.isclose(df["match_h"].astype(float), h)
    return m


def basis(data: SweepData, arm: str) -> Basis | None:
    """Compare the arm's runs with the Free Transformers they pair with (same seed, same H)."""
    c = data.cells
    if c.empty or not (c["arm"] == arm).any():
        return None
    free = c[c["arm"] == FREE.name]
    dt, df_, tols, planned, n = [], [], [], False, 0
    for _, ft in free.iterrows():
        refs = c[_ref_mask(c, arm, float(ft["latent_bits"])) & (c["seed"] == ft["seed"])]
        for _, r in refs.iterrows():
            tf, ff, pf = _compute(ft)
            tr, fr, pr = _compute(r)
            vals = [tf, ff, tr, fr]
            if not all(isinstance(v, float) and math.isfinite(v) and v > 0 for v in vals):
                continue
            n += 1
            planned |= pf or pr
            dt.append(abs(tr / tf - 1))
            df_.append(abs(fr / ff - 1))
            tps = r.get("tokens_per_step", math.nan)
            steps = tr / tps if isinstance(tps, float) and math.isfinite(tps) and tps else math.inf
            tols.append(min(MAX_STEP_TOL, max(EQUAL_TOL, 1.0 / steps)))
    if not n:
        return Basis(arm, 0, math.nan, math.nan, EQUAL_TOL, True)
    return Basis(arm, n, max(dt), max(df_), min(tols), planned)


def _role_of(data: SweepData, arm: str) -> tuple[str | None, Basis | None]:
    b = basis(data, arm)
    if b is None or b.n_pairs:
        return (b.equal if b else None), b
    # no run has numbers yet: what the grid meant the arm to be
    flops = arm in FLOPS_MATCHED_ARMS or (data.manifest.get("grid") or {}).get("flops")
    return ("flops" if flops else "tokens"), b


def _own_h(data: SweepData, arm: str) -> float:
    """A reference arm's own H: 0 for the baselines; a latent one (the Z-cut) has its cells' H
    when they share one, else none (NaN: missing is not 0)."""
    a = arms.find(arm)
    if a is None or not a.latent:
        return 0.0
    c = data.cells
    hs = sorted(set(c[c["arm"] == arm]["latent_bits"].dropna().astype(float))) if len(c) else []
    return hs[0] if len(hs) == 1 else math.nan


def _columns(data: SweepData, ref_arm: str) -> list[Column]:
    """Reference column(s) first (one per H for a FLOPs-matched control in a multi-H sweep),
    then one column per Free Transformer (H, kappa), each pointing at its reference column."""
    cells = data.cells
    free = cells[cells["arm"] == FREE.name][["latent_bits", "kappa_bits"]].drop_duplicates() \
        if len(cells) else pd.DataFrame(columns=["latent_bits", "kappa_bits"])
    hs = _free_hs(data)
    per_h = ref_arm in FLOPS_MATCHED_ARMS and len(hs) > 1
    own = _own_h(data, ref_arm)
    refs: dict[float, Column] = {}
    if per_h:
        for h in hs:
            refs[h] = Column(f"{ref_arm} (H={int(h)})", ref_arm, math.nan, own, match_h=h)
    else:
        col = Column(ref_arm, ref_arm, math.nan, own, match_h=hs[0] if len(hs) == 1 else math.nan)
        refs = {h: col for h in hs} or {math.nan: col}
    cols = list(dict.fromkeys(refs.values()))
    for h, k in sorted(map(tuple, free.to_numpy(dtype=float))):
        label = f"FT k={kappa_label(k)}" + (f" H={int(h)}" if len(hs) > 1 else "")
        cols.append(Column(label, FREE.name, float(k), float(h), ref=refs[h]))
    return cols


def comparisons(data: SweepData) -> tuple[list[Comparison], dict[str, str]]:
    """The sweep's comparisons, named by what its runs' tokens and FLOPs say, and a note per
    view explaining what is there and what is not (and why)."""
    out: list[Comparison] = []
    notes: dict[str, str] = {}
    roles = {a: _role_of(data, a) for a in ("baseline", "baseline_plus1", "baseline_flops",
                                            "baseline_plus1_flops", FREE_ZCUT.name)}
    n_layers = ""
    c = data.cells
    if len(c) and "n_layers" in c:
        p1 = c[c["arm"].isin(["baseline_plus1", "baseline_plus1_flops"])]["n_layers"].dropna()
        ft = c[c["arm"] == FREE.name]["n_layers"].dropna()
        if len(p1):
            n_layers = f" ({int(p1.iloc[0])} layers" + (
                f" vs the arms' {int(ft.iloc[0])})" if len(ft) else ")")

    def add(view: str, arm: str, role: str, title: str) -> None:
        b = roles[arm][1]
        out.append(Comparison(view, arm, role, title, b, _columns(data, arm)))

    def why(arm: str) -> str:
        b = roles[arm][1]
        return b.text() if b is not None else f"{arm}: not in this sweep"

    # equal tokens
    if roles["baseline"][0] == "tokens":
        add("tokens", "baseline", "reference",
            "Equal tokens (the paper's protocol): reference = baseline")
        notes["tokens"] = why("baseline")
    else:
        grid_flops = (data.manifest.get("grid") or {}).get("flops")
        if roles["baseline"][0] == "flops" or grid_flops:
            notes["tokens"] = (
                "No equal-tokens table: this sweep trained every arm to a FLOPs budget"
                + (f" (FLOPS={grid_flops:g})" if isinstance(grid_flops, (int, float)) else "")
                + ", so the baseline has the Free Transformers' FLOPs, not their tokens; the "
                "paper's equal-tokens protocol was not run and its claims are not judged here. "
                "The equal-FLOPs table is this sweep's comparison. " + why("baseline"))
        else:
            notes["tokens"] = "No equal-tokens table: no arm matches the Free Transformers' " \
                              "tokens. " + why("baseline")
    if roles["baseline_plus1"][0] == "tokens":
        add("tokens", "baseline_plus1", "parameter control",
            f"Equal tokens, parameter control: reference = baseline_plus1{n_layers}")
    if roles[FREE_ZCUT.name][0] == "tokens":
        add("tokens", FREE_ZCUT.name, "Z-cut control",
            "Equal tokens, Z-cut control: reference = free_zcut (the Free Transformer with its "
            "encoder, KL and extra block, Z multiplied by 0 before it reaches the decoder)")
    ctl = [a for a in (BASELINE_PLUS1.name, FREE_ZCUT.name) if roles[a][0] == "tokens"]
    if roles["baseline"][0] == "tokens" and ctl:  # the controls' own cost, paired by seed
        ref = Column(BASELINE.name, BASELINE.name, math.nan, 0.0)
        cols = [ref, *(Column(a, a, math.nan, _own_h(data, a), ref=ref) for a in ctl)]
        out.append(Comparison("tokens", BASELINE.name, "controls against the baseline",
                              "Equal tokens, the controls against the baseline: Δ = control "
                              "minus baseline, paired by seed", roles["baseline"][1], cols,
                              tag="controls"))
    # equal FLOPs
    ref = next((a for a in ("baseline_flops", "baseline") if roles[a][0] == "flops"), None)
    if ref is not None:
        add("flops", ref, "reference",
            f"Equal FLOPs: reference = {ref}" + (
                " (the baseline trained on more tokens to match the Free Transformer's FLOPs)"
                if ref == "baseline_flops" else " (the sweep's FLOPs budget)"))
        notes["flops"] = why(ref)
    else:
        notes["flops"] = ("No arm was trained to the Free Transformers' FLOPs (CONTROLS=flops "
                          "adds one). " + why("baseline_flops"))
    p1 = next((a for a in ("baseline_plus1_flops", "baseline_plus1") if roles[a][0] == "flops"),
              None)
    if p1 is not None:
        add("flops", p1, "parameter control",
            f"Equal FLOPs, parameter control: reference = {p1}{n_layers}")
    return out, notes


def _select(df: pd.DataFrame, col: Column) -> pd.DataFrame:
    if df.empty:
        return df
    if col.arm == FREE.name:
        m = (df["arm"] == FREE.name) & np.isclose(df["kappa_bits"].astype(float), col.kappa_bits)
        m &= np.isclose(df["latent_bits"].astype(float), col.latent_bits)
        return df[m]
    if col.arm in FLOPS_MATCHED_ARMS and math.isfinite(col.match_h):
        return df[_ref_mask(df, col.arm, col.match_h)]
    return df[df["arm"] == col.arm]


def _row_keys(data: SweepData) -> list[dict]:
    """One dict per table row, in the paper's order: group, benchmark (the paper's row name),
    paper_metric, matches_paper, task, metric (the paper row's stock metric when the eval files
    hold it, else the task's primary metric, then marked as a stand-in), higher_is_better."""
    sc = data.scores
    sc = sc[~sc["leaks"].astype(bool)] if len(sc) else sc
    prim = sc[sc["primary"].astype(bool)] if len(sc) else sc
    keys: list[dict] = []
    known = set()
    for group, rows in PAPER_GROUPS.items():
        for r in rows:
            base = {"group": group, "benchmark": r["benchmark"], "paper_metric":
                    r["paper_metric"], "matches_paper": bool(r["matches_paper"]),
                    "task": r["task"] or "", "metric": "", "higher_is_better": True,
                    "note": r["note"]}
            if not r["task"]:
                keys.append(base)
                continue
            known.add(r["task"])
            have = sc[sc["task"] == r["task"]] if len(sc) else sc
            if len(have) and (have["metric"] == r["metric"]).any():
                hib = bool(have.loc[have["metric"] == r["metric"], "higher_is_better"].iloc[0])
                keys.append({**base, "metric": r["metric"], "higher_is_better": hib})
                continue
            p = prim[prim["task"] == r["task"]] if len(prim) else prim
            if len(p):  # the row's metric is absent from the files: the primary stands in
                keys.append({**base, "metric": p["metric"].iloc[0], "matches_paper": False,
                             "higher_is_better": bool(p["higher_is_better"].iloc[0]),
                             "note": f"the eval files lack {r['metric']}; their primary "
                                     f"metric stands in"})
            else:
                keys.append(base)
    group, tasks = SMOOTH_GROUP
    for task in tasks:
        known.add(task)
        base = {"group": group, "benchmark": task, "paper_metric": "", "matches_paper": False,
                "note": "not in the paper"}
        if task == "val":
            for m in VAL_METRICS:
                if len(sc) and ((sc["task"] == "val") & (sc["metric"] == m)).any():
                    keys.append({**base, "benchmark": "validation", "task": "val",
                                 "metric": m, "higher_is_better": False})
            continue
        p = prim[prim["task"] == task] if len(prim) else prim
        keys.append({**base, "task": task, "metric": p["metric"].iloc[0] if len(p) else "",
                     "higher_is_better": bool(p["higher_is_better"].iloc[0]) if len(p)
                     else True})
    for task in sorted(set(prim["task"]) - known) if len(prim) else []:
        p = prim[prim["task"] == task]
        keys.append({"group": "Other", "benchmark": task, "paper_metric": "",
                     "matches_paper": False, "task": task, "metric": p["metric"].iloc[0],
                     "higher_is_better": bool(p["higher_is_better"].iloc[0]),
                     "note": "not in the paper"})
    return keys


def _honest(df: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    """Drop leaking (posterior) scores; where a run has both `prior` and `prior-k`, keep `prior`
    (the paper's protocol: one draw of Z)."""
    if df.empty:
        return df
    df = df[~df["leaks"].astype(bool)]
    rank = df["z_mode"].map({"prior": 0, "prior-k": 1}).fillna(2)
    return df.assign(_r=rank).sort_values("_r", kind="stable").drop_duplicates(key).drop(
        columns="_r")


def _missing(cells: pd.DataFrame, have_seeds: set, scored: pd.DataFrame | None = None,
             other: dict[str, str] | None = None) -> str:
    """Why some seeds of a column have no number: run states, 'not evaluated', or the eval
    file's own reason when it holds the task with a null value (the task's run died: its
    error; every item unscored: how many)."""
    if cells.empty:
        return "missing: arm not in sweep"
    miss = cells[~cells["seed"].isin(have_seeds)]
    if miss.empty:
        return ""
    why = miss["state"].fillna("unknown").replace({"done": "trained, not evaluated"})
    if scored is not None and len(scored):
        for idx, rid in miss["run_id"].items():
            got = scored[scored["run_id"] == rid]
            if got.empty:
                continue
            err = next((e for e in got.get("error", pd.Series(dtype=object))
                        if isinstance(e, str) and e), None)
            nm = got.get("n_missing", pd.Series(dtype=float)).astype(float).max()
            why[idx] = (f"eval error ({err})" if err else
                        f"null: all {int(nm)} items unscored" if math.isfinite(nm) and nm > 0
                        else "null value in the eval file")
    for idx, rid in miss["run_id"].items():  # a file under another spec: name it
        if other and str(rid) in other and why[idx] == "trained, not evaluated":
            why[idx] = f"evaluated under another spec: {other[str(rid)]}"
    return "missing: " + ", ".join(f"{n} {s}" for s, n in why.value_counts().items())


def _sum(df: pd.DataFrame, col: str) -> float:
    """Sum of a count column over a cell's seeds; NaN when no seed recorded it."""
    if df.empty or col not in df:
        return math.nan
    v = df.drop_duplicates("run_id")[col].astype(float)
    return float(v.sum()) if v.notna().any() else math.nan


def _ids(df: pd.DataFrame, col: str) -> str:
    if df.empty or col not in df:
        return ""
    return " ".join(sorted({str(x) for x in df[col].dropna() if str(x)}))


def comparison_table(data: SweepData, comp: Comparison, n_boot: int = 2000) -> pd.DataFrame:
    """The long (tidy) table of one comparison: one row per (benchmark row, column)."""
    cols = comp.columns
    sc = _honest(data.scores, ["run_id", "task", "metric"])
    it = _honest(data.items, ["run_id", "task", "metric", "doc_id"])
    rows = []
    ref_cols = list(dict.fromkeys(c.ref.label for c in cols if c.ref is not None)) or [
        c.label for c in cols if c.arm != FREE.name]
    row_ref = ref_cols[0] if len(ref_cols) == 1 else ""
    for key in _row_keys(data):
        task, metric, hib = key["task"], key["metric"], key["higher_is_better"]
        base = {"view": comp.view, "comparison": comp.key, "reference": row_ref,
                "reference_arm": comp.reference,
                **{k: v for k, v in key.items() if k != "note"}}
        if not task:
            rows.append({**base, "column": "", "status": f"{NOT_IN_SUITE}: {key['note']}"})
            continue
        if not metric:
            rows.append({**base, "column": "", "status": other_spec_status(data, task)
                         or "not evaluated in this sweep"})
            continue
        s_row = sc[(sc["task"] == task) & (sc["metric"] == metric)]
        i_row = it[(it["task"] == task) & (it["metric"] == metric)] if len(it) else it
        keys = {x for x in s_row.get("spec_key", pd.Series(dtype=str)).dropna() if x}
        if len(keys) > 1:  # the frame never lets this happen; refuse rather than mix
            ids = sorted({x for x in s_row["spec_id"].dropna() if x})
            rows.append({**base, "column": "", "status": "refused: cells come from different "
                         f"eval specs ({', '.join(ids)})"})
            continue
        fam: list[int] = []
        for col in cols:
            c_cells = _select(data.cells, col)
            c_s, c_i = _select(s_row, col), _select(i_row, col)
            per_seed = c_s.groupby("seed")["value"].mean() if len(c_s) else pd.Series(
                dtype=float)
            iv = c_i["value"].to_numpy(dtype=float) if len(c_i) else None
            se = float(c_s["stderr"].iloc[0]) if len(c_s) else math.nan
            ci = cell_interval(per_seed.to_numpy(dtype=float), iv, metric, se)
            have = set(per_seed[np.isfinite(per_seed)].index)
            status = _missing(c_cells, have, c_s, other_spec_files(data, task))
            if ci.n_seeds == 0 and c_cells.empty and col.arm != FREE.name:
                status = f"missing: no {col.arm} control arm in this sweep"
            r = {**base, "reference": col.ref.label if col.ref is not None else col.label,
                 "column": col.label, "arm": col.arm, "kappa_bits": col.kappa_bits,
                 "latent_bits": col.latent_bits, "match_h": col.match_h,
                 "n_seeds_expected": int(len(c_cells)), "n_seeds": ci.n_seeds,
                 "n_items": ci.n_items, "mean": ci.mean, "lo": ci.lo, "hi": ci.hi,
                 "ci_method": ci.method, "delta": math.nan, "delta_lo": math.nan,
                 "delta_hi": math.nan, "p": math.nan, "p_holm": math.nan, "holm_m": 0,
                 "significant": False, "significant_holm": False, "better": None,
                 "delta_unit": "", "delta_method": "", "delta_n_seeds": 0, "delta_n_items": 0,
                 "mde": math.nan, "degenerate": ci.degenerate, "status": status,
                 "n_missing": _sum(c_s, "n_missing"), "n_truncated": _sum(c_s, "n_truncated"),
                 "n_requests": _sum(c_s, "n_requests"),
                 "spec_ids": _ids(c_s, "spec_id"), "files": _ids(c_s, "file"),
                 "run_ids": " ".join(sorted(map(str, c_s["run_id"].unique())))}
            if col.ref is not None and ci.n_seeds:
                ref_s, ref_i = _select(s_row, col.ref), _select(i_row, col.ref)
                if len(ref_s):
                    margin = tost_margin(metric)
                    ts, rs = c_s[["seed", "value"]], ref_s[["seed", "value"]]
                    # bits per byte: Δ on the cells' own estimand (byte-weighted per seed), so
                    # Δ is the difference of the printed means; other items pair by item
                    by_item = bool(len(c_i) and len(ref_i)) and not metric.endswith("bpb")
                    if by_item:
                        ti, ri = (c_i[["seed", "doc_id", "value"]],
                                  ref_i[["seed", "doc_id", "value"]])
                        pairs = paired_matrix(ti, ri)  # paired once for Δ, TOST, identical
                        d = paired_delta(ti, ri, metric, n_boot=n_boot, pairs=pairs)
                        eq = paired_tost(ti, ri, margin, pairs=pairs)
                        dm = pairs[0]
                        diffs = dm.mean(axis=1) if dm.size else dm
                        mag = _scale(ti["value"], ri["value"])
                    else:
                        d = seed_delta(ts, rs, metric)
                        eq = seed_tost(ts, rs, margin)
                        diffs = seed_diffs(ts, rs)[1]
                        mag = _scale(ts["value"], rs["value"])
                    same = identical(diffs, mag)
                    if same:  # float32 rounding: no test on it (its p would mean nothing)
                        d = replace(d, lo=math.nan, hi=math.nan, p=math.nan, mde=math.nan,
                                    degenerate=True,
                                    method=f"{d.method}: identical to float32 rounding in "
                                           f"every seed (|Δ| <= {F32_ULPS} ulps)")
                    r.update(delta=d.delta, delta_lo=d.lo, delta_hi=d.hi, p=d.p,
                             significant=d.significant, delta_unit=d.unit,
                             delta_method=d.method, delta_n_seeds=d.n_seeds,
                             delta_n_items=d.n_items, mde=d.mde,
                             degenerate=bool(ci.degenerate or d.degenerate),
                             identical=same, tost_margin=margin, tost_lo=eq.lo,
                             tost_hi=eq.hi, tost_p=eq.p,
                             equivalence="identical" if same else eq.verdict,
                             delta_estimand=ITEM_ESTIMAND if by_item else SEED_ESTIMAND)
                    fam.append(len(rows))
            rows.append(r)
        # Holm across this comparison's Free Transformers (every kappa and H) on this row
        adj = holm([rows[i]["p"] for i in fam])
        m = int(np.isfinite([rows[i]["p"] for i in fam]).sum()) if fam else 0
        family = (f"{comp.key} / {task} ({metric}): "
                  + ", ".join(str(rows[i]["column"]) for i in fam
                              if math.isfinite(rows[i]["p"])) + f" (m = {m})") if m else ""
        for i, pa in zip(fam, adj, strict=True):
            r = rows[i]
            r["p_holm"], r["holm_m"] = pa, m
            r["holm_family"] = family if math.isfinite(r["p"]) else (
                "none: identical in every seed" if r.get("identical") else "none: no p")
            r["significant_holm"] = bool(r["significant"] and math.isfinite(pa) and pa < ALPHA)
            if r["significant_holm"]:
                r["better"] = bool((r["delta"] > 0) == hib)
    return pd.DataFrame(rows, columns=TABLE_COLS)


def paper_table(data: SweepData, view: str = "tokens", n_boot: int = 2000) -> pd.DataFrame:
    """The long table of one view: every comparison of that view, stacked (column
    `comparison`). A view the sweep does not have (see `view_notes`) gives an empty table,
    except `flops` without any FLOPs-matched arm, whose reference column says it is missing."""
    if view not in VIEWS:
        raise ValueError(f"view must be one of {list(VIEWS)}, got {view!r}")
    comps = [c for c in comparisons(data)[0] if c.view == view]
    if not comps and view == "flops":  # no FLOPs-matched arm: a reference column saying so
        comps = [Comparison("flops", "baseline_flops", "reference",
                            "Equal FLOPs: no reference arm", None,
                            _columns(data, "baseline_flops"))]
    parts = [comparison_table(data, c, n_boot=n_boot) for c in comps]
    if not parts:
        return pd.DataFrame(columns=TABLE_COLS)
    return pd.concat(parts, ignore_index=True)


def view_notes(data: SweepData) -> dict[str, str]:
    return comparisons(data)[1]


def specs_used(data: SweepData, table: pd.DataFrame) -> list[str]:
    """'spec_id: what it is' for every eval spec a table's cells come from."""
    ids = {x for v in table["spec_ids"] if isinstance(v, str) for x in v.split()} \
        if len(table) else set()
    out = {}
    for e in data.evals:
        if e.get("spec_id") in ids and e.get("used", True):
            out[e["spec_id"]] = f"{e['spec_id']}: {EvalSpec.from_json(e.get('spec') or {}).text()}"
    return [out[k] for k in sorted(out)]


def truncation_table(data: SweepData) -> pd.DataFrame:
    """Per (suite, task) of the eval files the tables use: how many generation prompts were cut
    to fit the model's window and by how much, and the generation budget (requested; smallest
    given; how many requests had it shrunk), from each task's `truncation` record. A generation
    task whose files recorded nothing says so; a task that generates nothing has no row."""
    t = data.tasks
    if t.empty:
        return pd.DataFrame(columns=TRUNCATION_COLS)
    rows = []
    for (suite, task), g in t.groupby(["suite", "task"], sort=True):
        rec = g[g["has_truncation"].astype(bool)]
        if rec.empty:
            continue
        n_cut = rec["n_truncated"].astype(float)
        rows.append({
            "suite": suite, "task": task,
            "cells_recorded": f"{len(rec)}/{len(g)}",
            "prompts": rec["n_requests"].sum(min_count=1),
            "prompts_truncated": n_cut.sum(min_count=1),
            "cells_with_cuts": int((n_cut > 0).sum()),
            "max_tokens_cut": rec["max_tokens_cut"].max(),
            "min_prompt_tokens_kept": rec["min_prompt_tokens_kept"].min(),
            "gen_budget_requested": rec["gen_budget_requested"].max(),
            "gen_budget_min": rec["gen_budget_min"].min(),
            "budgets_shrunk": rec["n_budget_shrunk"].sum(min_count=1)})
    return pd.DataFrame(rows, columns=TRUNCATION_COLS)


PER_SEED_COLS = ["task", "metric", "arm", "column", "kappa_bits", "latent_bits", "seed", "value",
                 "unit", "step", "run_id", "file", "spec_id", "git_commit", "git_dirty"]


def per_seed_table(data: SweepData) -> pd.DataFrame:
    """Every compared metric's per-seed value (PER_SEED_COLS), as the tables use it: honest
    scores only (prior Z), one value per run and metric (the eval file's task value: for bits
    per byte total bits / total bytes; the validation rows the run's last validation line). Any
    Δ of a seed-estimand row recomputes from this file: the mean over the seeds both columns
    have of (test value - reference value). `git_dirty` says whether the run trained from a
    working tree with uncommitted changes."""
    sc = _honest(data.scores, ["run_id", "task", "metric"])
    keys = {(k["task"], k["metric"]) for k in _row_keys(data) if k["task"] and k["metric"]}
    if sc.empty or not keys:
        return pd.DataFrame(columns=PER_SEED_COLS)
    sel = sc[[(t, m) in keys for t, m in zip(sc["task"], sc["metric"], strict=True)]].copy()
    prov = data.cells.drop_duplicates("run_id").set_index("run_id") if len(data.cells) else None
    for col in ("git_commit", "git_dirty"):
        sel[col] = [prov[col].get(r) if prov is not None and col in prov else None
                    for r in sel["run_id"]]
    sel["column"] = [f"FT k={kappa_label(k)}" if a == FREE.name else a
                     for a, k in zip(sel["arm"], sel["kappa_bits"], strict=True)]
    sel["unit"] = ["nats/token" if m.startswith("val_ce") else "bits/byte" if m.endswith("bpb")
                   else "share of items" for m in sel["metric"].astype(str)]
    out = sel.reindex(columns=PER_SEED_COLS)
    return out.sort_values(["task", "metric", "arm", "kappa_bits", "seed"], kind="stable",
                           ignore_index=True)


TRUNCATION_COLS = ["suite", "task", "cells_recorded", "prompts", "prompts_truncated",
                   "cells_with_cuts", "max_tokens_cut", "min_prompt_tokens_kept",
                   "gen_budget_requested", "gen_budget_min", "budgets_shrunk"]
MISSING_COLS = ["cell", "arm", "seed", "run_id", "task", "file", "missing", "reason"]


def missing_table(data: SweepData) -> pd.DataFrame:
    """Every task of a used eval file that lost scores: the whole task (its run died: the
    error) or some items (a code check that crashed or timed out: how many and why). These are
    missing, never 0: the tables average over scored items and seeds only."""
    t = data.tasks
    if t.empty:
        return pd.DataFrame(columns=MISSING_COLS)
    rows = []
    for _, r in t.iterrows():
        nm = float(r["n_missing"]) if pd.notna(r["n_missing"]) else math.nan
        if isinstance(r["error"], str) and r["error"]:
            what, why = "task (all scores null)", r["error"]
        elif math.isfinite(nm) and nm > 0:
            n = r["n"]
            what = f"{int(nm)}" + (f"/{int(n)}" if pd.notna(n) else "") + " items"
            why = r["missing_reasons"] or "no reason recorded"
        else:
            continue
        rows.append({"cell": r["cell"], "arm": r["arm"], "seed": r["seed"],
                     "run_id": r["run_id"], "task": r["task"], "file": r["file"],
                     "missing": what, "reason": why})
    return pd.DataFrame(rows, columns=MISSING_COLS)


# ---- rendering -------------------------------------------------------------------------------

def _p(x: float) -> str:
    if x is None or not math.isfinite(x):
        return "?"
    return f"{x:.3f}" if x >= 0.001 else "<0.001"


def n_text(r: pd.Series) -> str:
    """n of a cell: items x seeds (items pooled over the seeds), or seeds alone."""
    s, i = int(r.get("n_seeds") or 0), int(r.get("n_items") or 0)
    if i:
        return f"n={i // s if s and i % s == 0 else i}{'' if i % max(s, 1) == 0 else ' total'}" \
               f"x{s}"
    return f"n={s} seed{'s' if s != 1 else ''}"


def delta_text(r: pd.Series) -> str:
    """'Δ +0.050 [-0.010, +0.110] p=0.080 Holm=0.160 MDE 0.090' with its markers."""
    if not math.isfinite(r.get("delta", math.nan)):
        return ""
    s = f"Δ {fmt(r['delta'], '+.3f')}"
    if r.get("identical") is True:
        return s + " (identical to float32 rounding in every seed: no interval, no p)"
    if r.get("degenerate") and not math.isfinite(r.get("delta_lo", math.nan)):
        return s + f" ({NO_VARIATION})"
    s = f"Δ {ci(r['delta'], r['delta_lo'], r['delta_hi'], '+.3f')}"
    s += "*" if r.get("significant_holm") else ""
    s += "†" if r.get("delta_unit") == "item" else ""
    if math.isfinite(r.get("p", math.nan)):
        s += f" p={_p(r['p'])}"
        if int(r.get("holm_m") or 0) > 1:
            s += f" Holm={_p(r['p_holm'])}"
    if math.isfinite(r.get("mde", math.nan)):
        s += f" MDE {fmt(r['mde'])}"
    return s


def cell_text(r: pd.Series) -> str:
    """One table cell: 'mean [lo, hi] n=IxS' and, on a Free Transformer, its Δ."""
    if not r.get("n_seeds"):
        return r.get("status") or "missing"
    s = ci(r["mean"], r["lo"], r["hi"], none="?")
    if not math.isfinite(r["lo"]) and r.get("ci_method") == NO_VARIATION:
        s += f" ({NO_VARIATION})"
    s += f" {n_text(r)}"
    nm = r.get("n_missing", math.nan)
    if isinstance(nm, (int, float)) and math.isfinite(nm) and nm > 0:
        s += f" ({int(nm)} items unscored: missing, not 0)"
    d = delta_text(r)
    if d:
        s += f"; {d}"
    if r["n_seeds"] < r["n_seeds_expected"]:
        s += f" ({int(r['n_seeds'])}/{int(r['n_seeds_expected'])} seeds; {r['status']})"
    return s


def row_label(r: pd.Series) -> str:
    """'HellaSwag: hellaswag (acc_norm) [paper: acc_char]'; a stand-in metric says so."""
    bench = r.get("benchmark") if isinstance(r.get("benchmark"), str) else ""
    paper = r.get("paper_metric") if isinstance(r.get("paper_metric"), str) else ""
    head = f"{bench}: " if bench and bench != r["task"] else ""
    tail = (f" [paper: {paper}{'' if r.get('matches_paper') else '; ours is a stand-in'}]"
            if paper else "")
    if not r["task"]:
        return f"{bench or '—'}{tail}"
    if not r["metric"]:
        return f"{head}{r['task']}{tail}"
    unit = ", nats" if r["metric"] in ("val_ce", "val_ce_prior", "val_ce_posterior") else ""
    return (f"{head}{r['task']} ({r['metric']}{unit}"
            f"{'' if r['higher_is_better'] else ', lower better'}){tail}")


def _by_comparison(table: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    if table.empty:
        return []
    key = table["comparison"].fillna("") if "comparison" in table else pd.Series(
        [""] * len(table), index=table.index)
    return [(k, table[key == k]) for k in dict.fromkeys(key)]


def wide(table: pd.DataFrame, cell: Callable[[pd.Series], str] = cell_text) -> pd.DataFrame:
    """Formatted wide table of ONE comparison: group, benchmark, then one column per arm, each
    cell `cell(row)`. (Given a stacked view, the first comparison; see `to_markdown` for all of
    them.)"""
    parts = _by_comparison(table)
    if parts:
        table = parts[0][1]
    cols = [c for c in dict.fromkeys(table["column"]) if c] if len(table) else []
    rows: dict[tuple[str, str], dict[str, str]] = {}
    for _, r in table.iterrows():
        key = (r["group"], row_label(r))
        row = rows.setdefault(key, {"group": key[0], "benchmark": key[1]})
        if r["column"]:
            row[r["column"]] = cell(r)
        else:
            row.update({c: r["status"] for c in cols})
    return pd.DataFrame(list(rows.values()), columns=["group", "benchmark", *cols]).fillna(
        "missing")


LEGEND = ("Cells: mean over seeds [95% CI] n=items x seeds. Δ = the column (a Free Transformer, "
          "or a control against the baseline) minus the "
          "reference [95% CI]: with >= 2 seeds a paired t over per-seed differences (the seed "
          "is the unit); † = one seed, item bootstrap, seed-to-seed variance NOT included (never "
          "used for a verdict). * = significant after Holm; the Holm family is this "
          "comparison's compared columns on that row (all kappas and H; for the controls, the "
          "controls), named per row in the CSV's holm_family; p = uncorrected, Holm = "
          "adjusted. Bits-per-byte Δs are on the cells' own estimand (byte-weighted per seed), "
          "so they are the difference of the cells' means. 'identical' = every seed's paired "
          "difference is 0 up to float32 rounding: no interval, no p. TOST (the CSV's tost_*, "
          "equivalence): 'equivalent' when the 90% interval lies inside the stated margin. "
          "MDE = the "
          "smallest true |Δ| this comparison detects with 80% power (two-sided, 5%). "
          f"'{NO_VARIATION}' = every value identical (as counts, or up to float rounding): "
          "no interval, never significant.")


def to_markdown(table: pd.DataFrame, notes: str = "", specs: list[str] | None = None) -> str:
    """Every comparison of a (stacked) table as its own Markdown table, with the legend."""
    out = [notes + "\n"] if notes else []
    parts = _by_comparison(table)
    for key, t in parts:
        out += ([f"**{key}**\n"] if len(parts) > 1 else []) + [md(wide(t)) + "\n"]
    if specs:
        out.append("Eval specs: " + "; ".join(specs) + "\n")
    if len(table):
        out.append(LEGEND + "\n")
    return "\n".join(out)


TEX = str.maketrans({
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
    "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\^{}", "Δ": r"$\Delta$",
    "—": "---", "†": r"\dag{}"})
"""LaTeX's special characters, and the Unicode a plain LaTeX font lacks, as LaTeX."""


def to_latex(table: pd.DataFrame, caption: str = "") -> str:
    """Each comparison's wide table as a booktabs LaTeX table (pandas' Styler), the group named
    on its first row only."""
    out = []
    for key, t in _by_comparison(table) or [("", table)]:
        w = wide(t)
        w.loc[w["group"].duplicated(), "group"] = ""
        tex = (lambda x: str(x).translate(TEX))
        out.append(w.style.hide(axis="index").format(tex).format_index(tex, axis=1).to_latex(
            hrules=True, position="t", position_float="centering",
            column_format="l" * w.shape[1],
            caption=tex(f"{caption} ({key})" if key else caption) or None))
    return "".join(out)


def write_tables(data: SweepData, out_dir: Path, n_boot: int = 2000) -> dict[str, pd.DataFrame]:
    """Write table_<view>.{csv,md,tex} for both views; return the long tables. A view the sweep
    does not have still gets its files, saying why."""
    out_dir.mkdir(parents=True, exist_ok=True)
    notes = view_notes(data)
    tables = {}
    for view in VIEWS:
        t = paper_table(data, view, n_boot=n_boot)
        tables[view] = t
        note = notes.get(view, "")
        # a view the sweep lacks: one row whose status is the note saying why, not a bare header
        (t if len(t) else pd.DataFrame([{"view": view, "status": note}], columns=TABLE_COLS)
         ).to_csv(out_dir / f"table_{view}.csv", index=False)
        (out_dir / f"table_{view}.md").write_text(
            to_markdown(t, note, specs_used(data, t)), encoding="utf-8")
        cap = (f"{data.name}: equal {'tokens' if view == 'tokens' else 'FLOPs'}; mean over "
               "seeds [95% CI] n=items x seeds; Δ vs reference [95% CI; paired t over seeds, "
               "† one-seed item bootstrap]; * significant after Holm across kappas.")
        tex = to_latex(t, cap) if len(t) else f"% {note}\n"
        (out_dir / f"table_{view}.tex").write_text(tex, encoding="utf-8")
    per_seed_table(data).to_csv(out_dir / "per_seed.csv", index=False)
    truncation_table(data).to_csv(out_dir / "truncation.csv", index=False)
    missing_table(data).to_csv(out_dir / "missing.csv", index=False)
    return tables
