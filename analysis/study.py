"""docs/STUDY.md from the study's committed tables (docs/study/), by a command:

    python -m analysis.study render [--tables docs/study] [--out docs/STUDY.md]

Every number in the Markdown comes from a file in the tables directory, or is computed here
from them (the perplexity ratio, the planned MDE, the collapse counts); nothing is typed. The
files read (all written by `python -m pipelines.study`, except the two hand-measured inputs,
which say where each number came from):

- study.json: the study's settings and how many cells are done;
- cells.json: the sweep's cells (arm, kappa, seed, run-id, state);
- table_tokens.csv, table_flops.csv, likelihood.csv, table3.csv, probe.csv: the report's tables;
- sizing.csv: the measurements the `full` size rests on (quantity, value, unit, how measured);
- bryanvine.csv: bryanvine/free-transformer's published figures, stated as theirs.

A table that is absent makes its section say "not yet run"; it never becomes a 0.
Bad input (a directory without study.json, an unreadable table) gets one line, exit 2, and
nothing is written.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pandas as pd

from common import benchmarks
from common.arms import FREE
from common.io import atomic_write_text
from common.text import one_line

from .stats import ALPHA, LEVEL, POWER
from .stats import mde as mde_of

NOT_RUN = "not yet run"
FT_TASKS = tuple(b.task for b in benchmarks.by_group()[benchmarks.CODE_MATH] if b.task)
"""The paper's headline benchmarks (generative code and math), in its order."""
GOLD = benchmarks.gold_tasks(FT_TASKS)
VAL_ROWS = (("val", "val_ce"), ("val", "val_bpb"))
PRIMARY = "tokens:baseline"
"""The paper's comparison: each Free Transformer against the plain baseline, equal tokens."""


class StudyRenderError(ValueError):
    """Bad input to the renderer: one line."""


def f4(x: object) -> str:
    """A measured value: 4 decimals; '?' when missing (never 0)."""
    try:
        v = float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "?"
    return f"{v:.4f}" if math.isfinite(v) else "?"


def s4(x: object) -> str:
    """A signed difference: 4 decimals with its sign."""
    t = f4(x)
    return t if t == "?" else f"{float(x):+.4f}"  # type: ignore[arg-type]


def kappa_text(k: object) -> str:
    """kappa in bits as the grid writes it (0.5, 1, 2)."""
    try:
        v = float(k)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "?"
    return f"{v:g}"


def _num(x: object) -> float:
    try:
        v = float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan
    return v


def _read_csv(d: Path, name: str) -> pd.DataFrame | None:
    p = d / name
    if not p.is_file():
        return None
    try:
        return pd.read_csv(p)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise StudyRenderError(f"{p}: unreadable ({one_line(e)})") from e


def _truthy(x: object) -> bool:
    return str(x).strip().lower() in ("true", "1", "1.0")


def verdict(r: pd.Series) -> str:
    """A row's verdict from the table's own Holm-corrected test."""
    if not math.isfinite(_num(r.get("delta"))):
        return "reference" if str(r.get("arm")) != FREE.name else "no Δ"
    if _truthy(r.get("significant_holm")):
        return "better" if _truthy(r.get("better")) else "worse"
    return "inconclusive"


def at_floor(rows: pd.DataFrame) -> bool:
    """Every arm's mean is 0 (pass@1 / accuracy of a small model): nothing to compare."""
    m = pd.to_numeric(rows["mean"], errors="coerce")
    return bool(len(m) and m.notna().all() and (m == 0).all())


def _metric_rows(t: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(task, metric, label) of the rows the study reports, in order, when the table has them."""
    out: list[tuple[str, str, str]] = []
    have = t.dropna(subset=["task", "metric"])
    for task, metric in VAL_ROWS:
        if ((have["task"] == task) & (have["metric"] == metric)).any():
            unit = "nats/token" if metric == "val_ce" else "bits/byte"
            out.append((task, metric, f"validation {metric} ({unit}, honest: prior Z)"))
    for task in (*GOLD, *FT_TASKS):
        rows = have[have["task"] == task]
        for metric in dict.fromkeys(rows["metric"]):
            out.append((task, str(metric), f"{task} ({metric})"))
    return out


def results_section(t: pd.DataFrame | None, view: str) -> list[str]:
    """The results table of one view: mean [interval], Δ [interval], Holm p, MDE, verdict."""
    head = {"tokens": "Equal tokens (the paper's protocol)", "flops": "Equal FLOPs"}[view]
    out = [f"### {head}", ""]
    if t is None or t.empty or "comparison" not in t.columns or "mean" not in t.columns:
        return out + [f"{NOT_RUN} (docs/study/table_{view}.csv has no rows).", ""]
    for comp, ct in t.groupby("comparison", sort=False):
        rows = _metric_rows(ct)
        if not rows:
            continue
        out += [f"Comparison `{comp}`:", "",
                f"| metric | column | mean [{LEVEL:.0%} interval] | n seeds | Δ vs reference "
                f"[{LEVEL:.0%} interval] | Holm p | MDE | verdict |",
                "|---|---|---|---|---|---|---|---|"]
        for task, metric, label in rows:
            sel = ct[(ct["task"] == task) & (ct["metric"] == metric) & ct["column"].notna()
                     & (ct["column"].astype(str) != "")]
            if at_floor(sel):
                out.append(f"| {label} | every column | at the floor (every mean is 0) | | | | "
                           "| not compared |")
                continue
            for _, r in sel.iterrows():
                n = int(_num(r.get("n_seeds")) or 0) if math.isfinite(_num(r.get("n_seeds"))) \
                    else 0
                if not n:
                    out.append(f"| {label} | {r['column']} | {r.get('status') or 'missing'} | "
                               "| | | | missing |")
                    continue
                mean = f"{f4(r['mean'])} [{f4(r['lo'])}, {f4(r['hi'])}]"
                d = _num(r.get("delta"))
                dtext = (f"{s4(d)} [{s4(r['delta_lo'])}, {s4(r['delta_hi'])}]"
                         if math.isfinite(d) else "")
                p = f4(r.get("p_holm")) if math.isfinite(d) else ""
                m = f4(r.get("mde")) if math.isfinite(d) else ""
                st = str(r.get("status") or "")
                nt = f"{n} ({st})" if st.startswith("missing") else str(n)
                out.append(f"| {label} | {r['column']} | {mean} | {nt} | {dtext} | {p} | {m} | "
                           f"{verdict(r)} |")
        out.append("")
    return out


def primary(t: pd.DataFrame | None) -> pd.DataFrame | None:
    """The rows of the comparison against the plain baseline at equal tokens (the paper's);
    the controls' comparisons hold the same FT columns with other deltas."""
    if t is None or t.empty or "comparison" not in t.columns:
        return None
    return t[t["comparison"] == PRIMARY]


def val_mde(t: pd.DataFrame | None) -> float:
    """The largest MDE on honest validation nats/token over the Free Transformer rows of the
    primary comparison."""
    t = primary(t)
    if t is None or t.empty or "metric" not in t.columns:
        return math.nan
    sel = t[(t["task"] == "val") & (t["metric"] == "val_ce") & (t["arm"] == FREE.name)]
    v = pd.to_numeric(sel["mde"], errors="coerce").dropna()
    return float(v.max()) if len(v) else math.nan


def mde_section(t: pd.DataFrame | None, meta: dict) -> list[str]:
    target = _num(meta.get("mde_target_nats"))
    out = ["## What the data can and cannot say", ""]
    m = val_mde(t)
    if not math.isfinite(m):
        return out + [f"Minimum detectable effect on honest validation nats/token: {NOT_RUN} "
                      f"(target at most {f4(target)}).", ""]
    met = "met" if m <= target else "NOT met"
    out.append(f"Against the baseline (`{PRIMARY}`), the largest minimum detectable effect "
               f"(two-sided {ALPHA:.0%}, {POWER:.0%} power, paired t over "
               f"seeds) on honest validation nats/token is {f4(m)} against the target "
               f"{f4(target)}: {met}. A true difference smaller than the MDE would usually be "
               "missed, so an 'inconclusive' verdict does not show the arms are equal.")
    t = primary(t)
    gold = t[t["task"].isin(GOLD) & (t["arm"] == FREE.name)] if t is not None else pd.DataFrame(
        columns=["task", "mde"])
    for task, g in gold.groupby("task", sort=False):
        v = pd.to_numeric(g["mde"], errors="coerce").dropna()
        if len(v):
            out.append(f"- {task}: MDE at most {f4(v.max())} bits/byte.")
    return out + [""]


def likelihood_section(lik: pd.DataFrame | None) -> list[str]:
    """Each Free Transformer's likelihood bound against its own seed's baseline (the report's
    likelihood.csv): the IWAE bound at the largest k and the tightest bound (prior or IWAE)."""
    out = ["## Honest likelihood: IWAE and prior bounds per run", ""]
    if lik is None or lik.empty:
        return out + [f"{NOT_RUN} (docs/study/likelihood.csv absent or empty).", ""]
    out += ["Gap = Free Transformer minus its seed's baseline, nats/token, on the same "
            "validation rows: an upper bound on the true gap (the FT's NLL is bounded from "
            "above). The posterior-Z CE leaks and is not shown.", "",
            "| column | seed | tokens | baseline bits/byte | FT bits/byte (IWAE, largest k) | "
            "k | gap (IWAE) | tightest bound | gap (tightest) | KL nats/token |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for _, r in lik.iterrows():
        if not math.isfinite(_num(r.get("gap_nats_per_token"))):
            out.append(f"| {r['column']} | {_int_text(r.get('seed'))} | | | | | | "
                       f"{r.get('tightest') or 'missing'} | | |")
            continue
        out.append(f"| {r['column']} | {_int_text(r.get('seed'))} | {_int_text(r['n_tokens'])} "
                   f"| {f4(r['baseline_bpb'])} | {f4(r['free_bpb_kmax'])} | "
                   f"{_int_text(r['gap_k'])} | {s4(r['gap_nats_per_token'])} | {r['tightest']} | "
                   f"{s4(r['tightest_gap_nats_per_token'])} | {f4(r['kl_nats_per_token'])} |")
    return out + [""]


def probe_section(probe: pd.DataFrame | None, cells: list[dict]) -> list[str]:
    out = ["## The latent: collapse per seed and active bits", ""]
    if probe is None or probe.empty:
        return out + [f"{NOT_RUN} (docs/study/probe.csv absent).", ""]
    seeds = {str(c.get("run_id")): c.get("seed") for c in cells}
    out += ["| kappa (bits) | seed | KL (bits/token) | active bits | collapse | latent unused |",
            "|---|---|---|---|---|---|"]
    p = probe.copy()
    p["seed"] = [seeds.get(str(r), None) for r in p["run_id"]]
    p = p.sort_values(["kappa_bits", "seed"], na_position="last")
    for _, r in p.iterrows():
        seed = r["seed"]
        out.append(f"| {kappa_text(r['kappa_bits'])} | "
                   f"{'?' if seed is None or seed != seed else int(seed)} | {f4(r['kl_bits'])} | "
                   f"{_int_text(r['n_active'])} | {_flag(r['collapse'])} | "
                   f"{_flag(r['latent_unused'])} |")
    out.append("")
    for k, g in p.groupby("kappa_bits", sort=True):
        known = g["collapse"].map(_flag) != "?"
        out.append(f"- kappa {kappa_text(k)}: {collapse_count(g)} of {int(known.sum())} seeds "
                   "collapse.")
    return out + [""]


def _int_text(x: object) -> str:
    v = _num(x)
    return str(int(v)) if math.isfinite(v) else "?"


def _flag(x: object) -> str:
    s = str(x).strip().lower()
    return "yes" if s in ("true", "1", "1.0") else "no" if s in ("false", "0", "0.0") else "?"


def collapse_count(g: pd.DataFrame) -> int:
    return int((g["collapse"].map(_flag) == "yes").sum())


def planned_mde(sizing: pd.DataFrame | None, meta: dict) -> tuple[float, float, int]:
    """(pilot SD of validation nats/token, planned MDE, seeds): the MDE of a paired t over the
    study's seeds if the per-seed difference had SD sqrt(2) x the pilot's (no credit for
    pairing)."""
    if sizing is None or "quantity" not in sizing.columns:
        return math.nan, math.nan, 0
    sd = sizing.loc[sizing["quantity"] == "pilot_sd_val_ce", "value"]
    n = len(str(meta.get("seeds", "")).split())
    if sd.empty or n < 2:
        return math.nan, math.nan, n
    s = _num(sd.iloc[0])
    return s, mde_of(math.sqrt(2) * s / math.sqrt(n), n - 1), n


def _q(sizing: pd.DataFrame, name: str) -> float:
    v = sizing.loc[sizing["quantity"] == name, "value"]
    return _num(v.iloc[0]) if len(v) else math.nan


def training_wall_min(sizing: pd.DataFrame | None, meta: dict) -> float:
    """Planned training wall minutes: the sweep's total FLOPs (its dry run) at the measured
    quiet baseline rate (FLOPs/token x tokens/s per core), one job per core."""
    if sizing is None or "quantity" not in sizing.columns:
        return math.nan
    rate = _q(sizing, "flops_per_token_baseline") * _q(sizing, "quiet_tokens_per_s_baseline")
    return _q(sizing, "sweep_total_flops") / rate / _num(meta.get("cores")) / 60


def sizing_section(sizing: pd.DataFrame | None, meta: dict) -> list[str]:
    out = ["## Why this size", ""]
    if sizing is None or sizing.empty:
        return out + ["docs/study/sizing.csv absent: the size is not justified by measurements.",
                      ""]
    out += ["| quantity | value | unit | how it was measured |", "|---|---|---|---|"]
    for _, r in sizing.iterrows():
        v = _num(r["value"])
        vt = "not measured" if not math.isfinite(v) else f4(v) if abs(v) < 1e5 else f"{v:.4g}"
        out.append(f"| {r['quantity']} | {vt} | "
                   f"{r['unit']} | {r['note']} |")
    sd, m, n = planned_mde(sizing, meta)
    out.append("")
    if math.isfinite(m):
        out.append(f"Planned MDE on validation nats/token with {n} seeds, taking the per-seed "
                   f"difference's SD as the pilot SD {f4(sd)} times the square root of two (no "
                   f"credit for pairing): "
                   f"{f4(m)} (target at most {f4(meta.get('mde_target_nats'))}).")
    tw = training_wall_min(sizing, meta)
    if math.isfinite(tw):
        out.append(f"Training alone: the sweep's FLOPs at the quiet baseline rate, one job per "
                   f"core, is {f4(tw)} wall minutes; the rest of the budget is evaluation, "
                   "likelihood, probes and the report.")
    cells = int(_num(meta.get("n_cells_planned")) or 0) \
        if math.isfinite(_num(meta.get("n_cells_planned"))) else 0
    if cells:
        cores = _num(meta.get("cores"))
        per = _num(meta.get("budget_min")) * cores / cells
        out.append(f"Budget: {_num(meta.get('budget_min')):g} wall minutes on {_int_text(cores)} "
                   f"cores over "
                   f"{cells} runs is {f4(per)} core-minutes per run (training, evaluation, "
                   "likelihood and probe together).")
    return out + [""]


def _row(t: pd.DataFrame | None, task: str, metric: str, arm: str,
         kappa: float | None = None, comparison: str = PRIMARY) -> pd.DataFrame:
    if t is None or t.empty or "task" not in t.columns:
        return pd.DataFrame()
    sel = t[(t["task"] == task) & (t["metric"] == metric) & (t["arm"] == arm)
            & (t["comparison"] == comparison)]
    if kappa is not None:
        sel = sel[pd.to_numeric(sel["kappa_bits"], errors="coerce") == kappa]
    return sel[pd.to_numeric(sel["n_seeds"], errors="coerce").fillna(0) > 0]


def ours(key: str, t: pd.DataFrame | None, probe: pd.DataFrame | None) -> str:
    """Our side of one bryanvine row, from our tables; NOT_RUN when they do not have it."""
    if key == "latent_cost":
        sel = _row(t, "val", "val_ce", FREE.name)
        if sel.empty:
            return NOT_RUN
        return "; ".join(f"kappa {kappa_text(r['kappa_bits'])}: {s4(r['delta'])} "
                         f"[{s4(r['delta_lo'])}, {s4(r['delta_hi'])}] nats/token"
                         for _, r in sel.iterrows())
    if key == "ppl_ratio":
        sel = _row(t, "val", "val_ce", FREE.name)
        sel = sel[pd.to_numeric(sel["delta"], errors="coerce").notna()] if len(sel) else sel
        if sel.empty:
            return NOT_RUN
        return "; ".join(f"kappa {kappa_text(r['kappa_bits'])}: "
                         f"{pct(math.expm1(_num(r['delta'])))}" for _, r in sel.iterrows())
    if key == "plus1":  # the report compares FTs to the control, not the control to the
        # baseline: set the two arms' seed intervals side by side
        p1 = _row(t, "val", "val_ce", "baseline_plus1", comparison="tokens:baseline_plus1")
        b = _row(t, "val", "val_ce", "baseline")
        if p1.empty or b.empty:
            return NOT_RUN
        p, r = p1.iloc[0], b.iloc[0]
        lo, hi = _num(r["lo"]), _num(r["hi"])
        where = ("inside" if lo <= _num(p["mean"]) <= hi else "outside") \
            if math.isfinite(lo) and math.isfinite(hi) else "? (no baseline interval)"
        return (f"control {f4(p['mean'])} [{f4(p['lo'])}, {f4(p['hi'])}] vs baseline "
                f"{f4(r['mean'])} [{f4(lo)}, {f4(hi)}] nats/token: {where} the baseline's "
                "seed interval")
    if key == "collapse_k05":
        if probe is None or probe.empty:
            return NOT_RUN
        g = probe[pd.to_numeric(probe["kappa_bits"], errors="coerce") == 0.5]
        known = g["collapse"].map(_flag) != "?"
        return f"{collapse_count(g)} of {int(known.sum())}" if int(known.sum()) else NOT_RUN
    if key == "best_kappa":
        sel = _row(t, "val", "val_ce", FREE.name)
        if sel.empty:
            return NOT_RUN
        b = sel.loc[pd.to_numeric(sel["mean"], errors="coerce").idxmin()]
        return f"kappa {kappa_text(b['kappa_bits'])} (lowest mean {f4(b['mean'])} nats/token)"
    return NOT_RUN


def pct(x: float) -> str:
    return f"{100 * x:+.1f}%" if math.isfinite(x) else "?"


def bryanvine_section(bv: pd.DataFrame | None, t: pd.DataFrame | None,
                      probe: pd.DataFrame | None, meta: dict) -> list[str]:
    out = ["## Beside bryanvine/free-transformer", ""]
    if bv is None or bv.empty:
        return out + ["docs/study/bryanvine.csv absent.", ""]
    out += ["Their figures are theirs (their scale, their data, their n); ours are this "
            f"study's ({meta.get('preset', '?')} preset). The two columns are never combined.",
            "", "| finding | theirs | their scale, n | source | ours |", "|---|---|---|---|---|"]
    for _, r in bv.iterrows():
        out.append(f"| {r['finding']} | {r['theirs']} | {r['scale_n']} | {r['source']} | "
                   f"{ours(str(r['key']), t, probe)} |")
    return out + [""]


def setup_section(meta: dict) -> list[str]:
    g = meta.get
    return ["## Setup", "",
            f"- Size `{g('size')}`, sweep `{g('name')}`: preset {g('preset')}, H = {g('h')} "
            f"latent bits, kappa in {{{g('kappa')}}} bits, seeds {{{g('seeds')}}}, "
            f"{g('tokens')} training tokens per equal-tokens run, controls {{{g('controls')}}}.",
            f"- Trainer overrides: `{g('overrides')}`.",
            f"- Evaluation (each run, Z from the prior): {g('tasks')}, first {g('limit')} "
            f"documents each, generation budget {g('gen_toks')} tokens, offline data "
            f"`{g('bench_data')}`; {g('eval_points')} evaluation points for the curves; the "
            f"likelihood bound (IWAE and prior) on {g('likelihood_rows')} validation rows.",
            f"- Probe of every Free Transformer: `{g('probe_args')}`.",
            f"- Cells: {g('n_done')} of {g('n_cells') or g('n_cells_planned')} trained, "
            f"{g('n_eval_done')} evaluated.",
            ""]


def render(tables: Path) -> str:
    """The Markdown of docs/STUDY.md from the files in `tables`."""
    mp = tables / "study.json"
    if not mp.is_file():
        raise StudyRenderError(f"{mp}: missing; run `python -m pipelines.study` (or "
                               "`... docs`) first")
    try:
        meta = json.loads(mp.read_text(encoding="utf-8"))
        cp = tables / "cells.json"
        cells = json.loads(cp.read_text(encoding="utf-8")) if cp.is_file() else []
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise StudyRenderError(f"{tables}: unreadable JSON ({one_line(e)})") from e
    tt, tf = _read_csv(tables, "table_tokens.csv"), _read_csv(tables, "table_flops.csv")
    probe, sizing = _read_csv(tables, "probe.csv"), _read_csv(tables, "sizing.csv")
    bv = _read_csv(tables, "bryanvine.csv")
    ran = bool(meta.get("n_done"))
    lines = ["# The study: does the Free Transformer beat the baseline at CPU scale?", "",
             "<!-- generated by `python -m analysis.study render` from docs/study/; "
             "do not edit by hand -->", "",
             "One command, offline, on 2 CPU cores: `make study` (`STUDY_SIZE=full|tiny`, "
             "`STUDY_NAME=`), resumable. The report: [docs/study/report.html](study/report.html)"
             "; its tables: docs/study/*.csv (curves over training: table3.csv and the report's "
             "figures).", ""]
    if not ran:
        lines += [f"**Status: {NOT_RUN}.** The sections below fill in when `make study` has "
                  "run and its tables are committed.", ""]
    lines += setup_section(meta) + sizing_section(sizing, meta)
    lines += ["## Results", "", "Verdicts are Holm-corrected across the kappas of a "
              "comparison; 'inconclusive' means the interval includes 0.", ""]
    lines += results_section(tt, "tokens") + results_section(tf, "flops")
    lines += mde_section(tt, meta) + likelihood_section(_read_csv(tables, "likelihood.csv"))
    lines += probe_section(probe, cells)
    lines += bryanvine_section(bv, tt, probe, meta)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.study", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=("render",))
    ap.add_argument("--tables", default="docs/study", help="the study's tables directory")
    ap.add_argument("--out", default="docs/STUDY.md", help="the Markdown to write")
    a = ap.parse_args(argv)
    try:
        text = render(Path(a.tables))
        atomic_write_text(Path(a.out), text)
    except (StudyRenderError, OSError) as e:
        print(f"study: error: {one_line(e)}", file=sys.stderr)
        return 2
    print(f"study: {Path(a.out).resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
