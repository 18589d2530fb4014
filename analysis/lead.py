"""The report's first screen: what the sweep says, as a forest plot and a few words.

`forest_frame` takes, per comparison (equal tokens, equal FLOPs, the +1-layer controls, the
Z-cut control), per Free Transformer column and per measured metric, the Δ with its seed
interval, the MDE and the verdict, copied from the paper-format tables' rows
(`tables.write_tables`), so the lead figure and the tables never disagree; the Z-cut control
against the baseline is the controls' comparison (`zcut:check`). A Δ that is 0 in every seed
is "identical": no interval, no p. "Measured" means evaluated and off the floor: a metric whose
every cell is 0, or holds the benchmark's chance level, separates nothing and is named in one
line instead of drawn. `signal_noise` puts each metric's seed SD beside the spread of its means
across arms (Heineman et al. 2025, "Signal and Noise") and the MDE.
"""

from __future__ import annotations

import math

import matplotlib
import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np
import pandas as pd
from scipy.sparse.csgraph import connected_components

from common import arms, benchmarks
from common.arms import FREE
from common.kappa import kappa_label
from common.paths import METRICS

from .frame import SweepData
from .render import fmt

matplotlib.use("Agg")  # PNGs only, never a display

CHANCE = {b.task: b.chance for b in benchmarks.BENCHMARKS if b.task and b.chance is not None}
"""Accuracy of a random guesser per task (common.benchmarks)."""
IDENTICAL = "identical"
ROUNDING = "identical up to float32 rounding"
FLOAT32_RTOL = 1e-6
"""A Δ whose point and interval are all within this fraction of the values compared is float32
rounding (eps 1.2e-7, a few ulps after a mean): the same model computed in another order."""
BETTER, WORSE = "FT better", "FT worse"
NONE_SEEN = "no difference detected"
HOLM_ONLY = "not after Holm (raw interval excludes 0)"
NO_DATA = "no data"
ONE_SEED = "one seed: no verdict"
COLORS = {BETTER: "#1a9641", WORSE: "#d7191c", NONE_SEEN: "#555555", HOLM_ONLY: "#b8860b",
          IDENTICAL: "#000000",
          ROUNDING: "#000000", NO_DATA: "#bbbbbb", ONE_SEED: "#8c8cd9"}
FOREST_COLS = ["key", "comparison", "reference", "column", "kappa_bits", "latent_bits", "task",
               "metric", "label", "unit", "higher_is_better", "delta", "lo", "hi", "p_holm",
               "mde", "n_seeds", "delta_unit", "degenerate", "verdict", "scale", "source"]
COMPARISON_ORDER = ["equal tokens", "equal FLOPs", "+1 layer, equal tokens",
                    "+1 layer, equal FLOPs", "vs Z-cut", "Z-cut vs baseline"]
"""The forest's row order: the paper's protocol, equal compute, then the controls."""
ZCUT = "zcut"
"""The forest's key prefix of the Z-cut comparisons (`zcut:<ft column>`, `zcut:check`)."""


def _fin(x: object) -> bool:
    return isinstance(x, (int, float, np.floating)) and math.isfinite(float(x))


def metric_label(task: str, metric: str) -> tuple[str, str]:
    """(a reader's name, the unit of a Δ) of a table row."""
    if task == "val":
        unit = "nats/token" if metric.startswith("val_ce") else "bits/byte"
        what = {"ce": "CE", "bpb": "bpb"}.get(metric.removeprefix("val_"), metric)
        return f"validation {what} (prior Z)", unit
    b = benchmarks.find(task)
    name = getattr(b, "name", None) or task
    if metric == "bpb":
        return f"{name.replace(' gold bpb', '')} gold answers", "bits/byte"
    return f"{name} {metric}", metric


def verdict(delta: float, lo: float, hi: float, degenerate: bool, significant_holm: bool,
            better: object, scale: float = math.nan, unit: str = "seed") -> str:
    """A row's verdict in words, from its own test (Holm-corrected); `scale` is the magnitude
    of the values compared (for the float32-rounding rule); `unit` "item" (one seed: the
    interval leaves the seed variance out) never gives a verdict."""
    if not _fin(delta):
        return NO_DATA
    if degenerate and delta == 0:  # every seed's difference exactly 0: the same numbers
        return IDENTICAL
    ends = [abs(x) for x in (delta, lo, hi) if _fin(x)]
    if _fin(scale) and scale > 0 and max(ends) <= FLOAT32_RTOL * abs(scale):
        return ROUNDING
    if unit == "item":
        return ONE_SEED
    if significant_holm:
        return BETTER if better is True or better == "True" else WORSE
    if _fin(lo) and _fin(hi) and (lo > 0 or hi < 0):
        return HOLM_ONLY
    return NONE_SEEN


def at_floor(cells: pd.DataFrame) -> bool:
    """Every evaluated cell of a benchmark row is 0, or holds the task's chance level in its
    interval (or equals it): the metric separates nothing at this scale."""
    c = cells[cells["n_seeds"].fillna(0) > 0]
    if c.empty:
        return False
    m = c["mean"].astype(float)
    if (m == 0).all():
        return True
    ch = CHANCE.get(str(c["task"].iloc[0]))
    if ch is None or ch == 0:
        return False
    lo, hi = c["lo"].astype(float), c["hi"].astype(float)
    holds = (lo <= ch) & (ch <= hi)
    exact = lo.isna() & np.isclose(m, ch)
    return bool((holds | exact).all())


def row_status(table: pd.DataFrame) -> pd.DataFrame:
    """One line per benchmark row of a (stacked) table's columns (a row without one, a benchmark
    the suite cannot run, is left out): task, metric, whether it was evaluated (some cell has a
    number), whether it is at the floor, and why not evaluated."""
    if len(table) and "column" in table:
        table = table[table["column"] != ""]
    if table.empty:
        return pd.DataFrame(columns=["group", "benchmark", "task", "metric", "evaluated",
                                     "floor", "why"])
    rows = []
    for (group, bench, task, metric), g in table.groupby(
            ["group", "benchmark", "task", "metric"], sort=False, dropna=False):
        ev = bool(g["n_seeds"].fillna(0).gt(0).any())
        why = ""
        if not ev:
            st = g["status"].dropna()
            why = str(st.iloc[0]) if len(st) else "no score"
        rows.append({"group": group, "benchmark": bench, "task": task, "metric": metric,
                     "evaluated": ev, "floor": ev and at_floor(g), "why": why})
    return pd.DataFrame(rows)


def measured_metrics(tables: dict[str, pd.DataFrame]) -> tuple[list[tuple[str, str]],
                                                                 list[tuple[str, str]]]:
    """((task, metric) measured and off the floor, (task, metric) at the floor), in the
    tables' row order, over both views."""
    measured: dict[tuple[str, str], None] = {}
    floor: dict[tuple[str, str], None] = {}
    for t in tables.values():
        if t.empty:
            continue
        st = row_status(t)
        for r in st.itertuples():
            if not isinstance(r.task, str) or not r.task or not isinstance(r.metric, str):
                continue
            if r.evaluated:
                (floor if r.floor else measured)[(r.task, r.metric)] = None
    return [k for k in measured if k not in floor], list(floor)


def _comparison_name(comp: str, reference: str) -> str:
    view, _, ref = comp.partition(":")
    a = arms.find(ref)
    if a is not None and a.z_cut:
        return "vs Z-cut"
    if a is not None and a.extra_layer:
        return f"+1 layer, equal {'FLOPs' if view == 'flops' else 'tokens'}"
    return "equal FLOPs" if view == "flops" else "equal tokens"


def _table_rows(tables: dict[str, pd.DataFrame], keys: list[tuple[str, str]]) -> list[dict]:
    out = []
    for t in tables.values():
        if t.empty:
            continue
        ft = t[(t["arm"] == FREE.name) & (t["column"] != "")]
        # a Z-cut control against the baseline (the controls' comparison, paired by seed): the
        # forest's `zcut:check`, the tables' own rows (one computation of it)
        chk = t[t["arm"].isin([a.name for a in arms.ARMS if a.z_cut]) & (t["column"] != "")
                & (t["reference"] == arms.BASELINE.name)].assign(comparison=f"{ZCUT}:check")
        for comp, g in pd.concat([ft, chk]).groupby("comparison", sort=False):
            for task, metric in keys:
                for r in g[(g["task"] == task) & (g["metric"] == metric)].itertuples():
                    label, unit = metric_label(task, metric)
                    hib = bool(r.higher_is_better)
                    out.append({
                        "key": comp, "comparison": "Z-cut vs baseline"
                        if comp == f"{ZCUT}:check" else _comparison_name(comp, r.reference),
                        "reference": r.reference, "column": r.column,
                        "kappa_bits": float(r.kappa_bits), "latent_bits": float(r.latent_bits),
                        "task": task, "metric": metric, "label": label, "unit": unit,
                        "higher_is_better": hib, "delta": float(r.delta),
                        "lo": float(r.delta_lo), "hi": float(r.delta_hi),
                        "p_holm": float(r.p_holm), "mde": float(r.mde),
                        "n_seeds": int(r.delta_n_seeds or 0), "delta_unit": r.delta_unit or "",
                        "degenerate": bool(r.degenerate),
                        "verdict": verdict(float(r.delta), float(r.delta_lo),
                                           float(r.delta_hi), bool(r.degenerate),
                                           bool(r.significant_holm), r.better,
                                           abs(float(r.mean)), r.delta_unit or "seed"),
                        "scale": abs(float(r.mean)),
                        "source": f"table_{r.view}.csv ({comp})"})
    return out


def forest_frame(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Every Δ of the lead figure (FOREST_COLS), in drawing order: the tables' own rows (one
    computation of each number)."""
    keys, _ = measured_metrics(tables)
    df = pd.DataFrame(_table_rows(tables, keys), columns=FOREST_COLS)
    # a comparison whose reference has no run has no Δ: its table says why; nothing to draw
    df = df[np.isfinite(df["delta"].astype(float))]
    # validation CE first (the study's primary metric), then the other rows in table order
    keys = sorted(keys, key=lambda k: (k[0] != "val", k[1] != "val_ce"))
    order = {k: i for i, k in enumerate(keys)}
    df["_m"] = [order.get((t, m), 99) for t, m in zip(df["task"], df["metric"], strict=True)]
    df["_c"] = [COMPARISON_ORDER.index(c) if c in COMPARISON_ORDER else 9
                for c in df["comparison"]]
    return df.sort_values(["_m", "_c"], kind="stable").drop(columns=["_m", "_c"]).reset_index(
        drop=True)


def lead_metrics(forest: pd.DataFrame) -> list[tuple[str, str]]:
    """The metrics the lead figure draws, one panel each (of the forest, or of the per-run
    values), validation CE first: validation bpb is validation CE rescaled by the same bytes
    per token for every arm (the same test), so it is left out when CE is there."""
    keys = sorted(dict.fromkeys(zip(forest["task"], forest["metric"], strict=True)),
                  key=lambda k: (k[0] != "val", k[1] != "val_ce"))
    if ("val", "val_ce") in keys:
        keys = [k for k in keys if k != ("val", "val_bpb")]
    return keys


def _row_label(r: pd.Series) -> str:
    if r["key"] == f"{ZCUT}:check":
        return "Z-cut − baseline"
    k = f"κ={kappa_label(r['kappa_bits'])}" if _fin(r["kappa_bits"]) else r["column"]
    return f"{r['comparison']} · {k}"


def forest_height(n_rows: int) -> float:
    """The forest figure's height in inches for n_rows rows (card.py lays out beside it)."""
    return 1.0 + 0.24 * n_rows


def forest_figure(forest: pd.DataFrame) -> tuple[plt.Figure | None, list[dict]]:
    """The lead figure: one panel per metric, one row per (comparison, kappa): Δ (FT minus the
    reference) with its 95% seed interval, the MDE as a grey band around 0, coloured by the
    verdict. Returns (figure, what it drew: one dict per point with its numbers)."""
    if forest.empty:
        return None, []
    metrics = lead_metrics(forest)
    n = len(_rows(forest, metrics))
    fig, axes = plt.subplots(1, len(metrics), figsize=(2.0 + 2.2 * len(metrics), forest_height(n)),
                             squeeze=False, sharey=True)
    drawn = draw_forest(list(axes[0]), forest, metrics)
    handles = [plt.Line2D([], [], color=COLORS[k], marker="D" if k == IDENTICAL else "o",
                          ls="-" if k != IDENTICAL else "", label=k)
               for k in (BETTER, WORSE, NONE_SEEN, HOLM_ONLY, IDENTICAL)
               if k in set(forest["verdict"]) | {BETTER, WORSE, NONE_SEEN}
               or (k == IDENTICAL and ROUNDING in set(forest["verdict"]))]
    if ONE_SEED in set(forest["verdict"]):
        handles.append(plt.Line2D([], [], color=COLORS[ONE_SEED], marker="o", label=ONE_SEED))
    handles.append(plt.Rectangle((0, 0), 1, 1, color="#e6e6e6", label="±MDE (80% power)"))
    fig.legend(handles=handles, loc="lower center", ncol=6, fontsize=7, frameon=False,
               bbox_to_anchor=(0.5, -0.01))
    fig.suptitle("Δ = Free Transformer − reference, 95% interval over seeds "
                 "(Holm across kappas)", fontsize=9)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig, drawn


def _rows(forest: pd.DataFrame, metrics: list[tuple[str, str]]) -> list[str]:
    keep = [(t, m) in metrics for t, m in zip(forest["task"], forest["metric"], strict=True)]
    f = forest[keep]
    return list(dict.fromkeys(f["key"] + "|" + f["column"]))


def draw_forest(axes: list, forest: pd.DataFrame, metrics: list[tuple[str, str]],
                values: bool = False) -> list[dict]:
    """Draw the forest's panels (one per metric) onto `axes`; `values` writes each Δ beside
    its point. Returns what was drawn (one dict per point with its numbers)."""
    rows = _rows(forest, metrics)
    n = len(rows)
    ypos = {r: n - 1 - i for i, r in enumerate(rows)}
    drawn: list[dict] = []
    labels: dict[int, str] = {}
    for j, (ax, (task, metric)) in enumerate(zip(axes, metrics, strict=True)):
        sub = forest[(forest["task"] == task) & (forest["metric"] == metric)]
        for _, r in sub.iterrows():
            y = ypos[r["key"] + "|" + r["column"]]
            labels[y] = _row_label(r)
            if _fin(r["mde"]):
                ax.add_patch(plt.Rectangle((-r["mde"], y - 0.32), 2 * r["mde"], 0.64,
                                           color="#e6e6e6", lw=0, zorder=0))
            v = r["verdict"]
            col = COLORS.get(v, "#555555")
            if not _fin(r["delta"]):
                continue
            if v in (IDENTICAL, ROUNDING):  # drawn at 0: no interval to show at this scale
                ax.plot([0.0], [y], marker="D", color=col, ms=5, zorder=3)
                ax.annotate("identical" if v == IDENTICAL else "identical (float32)",
                            (0.0, y), xytext=(6, -3), textcoords="offset points", fontsize=6)
            else:
                if _fin(r["lo"]):
                    ax.plot([r["lo"], r["hi"]], [y, y], color=col, lw=1.6, zorder=2)
                ax.plot([r["delta"]], [y], marker="o", color=col, ms=4.5, zorder=3)
                if values:
                    ax.annotate(f"{r['delta']:+.3f}", (r["delta"], y), xytext=(0, 4),
                                textcoords="offset points", fontsize=5.5, ha="center")
            drawn.append({"key": r["key"], "column": r["column"], "task": task,
                          "metric": metric, "delta": float(r["delta"]), "lo": float(r["lo"]),
                          "hi": float(r["hi"]), "mde": float(r["mde"]), "verdict": v})
        ax.axvline(0, color="k", lw=0.8)
        label, unit = metric_label(task, metric)
        hib = bool(sub["higher_is_better"].iloc[0]) if len(sub) else True
        ax.set_title(f"{label}\nΔ in {unit}; FT better: {'→' if hib else '←'}", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(5))
        ax.grid(axis="x", color="#eeeeee", lw=0.6)
        ax.set_ylim(-0.7, n - 0.3)
        if j == 0:
            ax.set_yticks(sorted(labels), [labels[y] for y in sorted(labels)], fontsize=7)
        else:  # a shared y axis keeps the first panel's labels; this one hides its own
            ax.tick_params(labelleft=False)
    return drawn


def per_run_frame(tables: dict[str, pd.DataFrame], metrics: list[tuple[str, str]]
                  ) -> pd.DataFrame:
    """Each run's own value of each measured metric (one seed: a column's mean is its one
    run's value), every column of every view once, in the tables' order."""
    cols = ["column", "task", "metric", "mean", "reference", "higher_is_better"]
    rows = [t[(t["column"] != "") & t["n_seeds"].fillna(0).gt(0)] for t in tables.values()
            if len(t) and "n_seeds" in t]
    t = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=cols)
    keep = [(a, b) in metrics for a, b in zip(t["task"], t["metric"], strict=True)]
    return t[keep].drop_duplicates(["column", "task", "metric"]).reindex(columns=cols)


ONE_SEED_WHY = ("One seed: each run's own value, no interval and no verdict (the seed-to-seed "
                "variation is unknown from one seed; SEEDS=\"0 1 2\" gives intervals)")


def per_run_figure(tables: dict[str, pd.DataFrame]) -> tuple[plt.Figure | None, list[dict]]:
    """The lead figure of a one-seed sweep: one panel per measured metric (lead_metrics), one
    row per column (arm, kappa, control) at its run's value, written beside it; the
    reference's value dotted. Returns (figure, what it drew: one dict per point)."""
    values = per_run_frame(tables, measured_metrics(tables)[0])
    if values.empty:
        return None, []
    metrics = lead_metrics(values)
    cols = list(dict.fromkeys(values["column"]))
    fig, axes = plt.subplots(1, len(metrics), figsize=(2.0 + 2.2 * len(metrics),
                                                      1.2 + 0.24 * len(cols)),
                             squeeze=False, sharey=True)
    drawn = []
    for ax, (task, metric) in zip(axes[0], metrics, strict=True):
        sub = values[(values["task"] == task) & (values["metric"] == metric)]
        for r in sub.itertuples():
            y = len(cols) - 1 - cols.index(r.column)
            ax.plot([r.mean], [y], "o", color="#555555", ms=4.5)
            ax.annotate(f"{r.mean:.4g}", (r.mean, y), xytext=(0, 4), textcoords="offset points",
                        fontsize=5.5, ha="center")
            drawn.append({"column": r.column, "task": task, "metric": metric,
                          "value": float(r.mean)})
        ref = sub[sub["column"] == sub["reference"]]
        if len(ref):
            ax.axvline(float(ref["mean"].iloc[0]), color="k", lw=0.8, ls=":")
        label, unit = metric_label(task, metric)
        hib = bool(sub["higher_is_better"].iloc[0]) if len(sub) else True
        ax.set_title(f"{label}\n{unit}; better: {'→' if hib else '←'}", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(4))
        ax.set_ylim(-0.7, len(cols) - 0.3)
        ax.margins(x=0.15)  # room for the values written beside the edge points
    axes[0][0].set_yticks(range(len(cols)), cols[::-1], fontsize=7)
    fig.suptitle(ONE_SEED_WHY + "; dotted: the reference", fontsize=8)
    fig.tight_layout()
    return fig, drawn


IDENTICAL_KEYS = ("step", "tokens", "ce", "loss", "kl_bits", "grad_norm", "val_ce",
                  "val_ce_posterior", "val_kl_bits")
"""What two runs must agree on, line by line of metrics.jsonl, to have trained identically."""
HOWS = ("bit-identical metrics", "identical up to float32 rounding",
        "chained: each run within float32 rounding of another")


def identical_runs(data: SweepData) -> list[str]:
    """Runs that trained identically, named with the reason, for the first screen: every train
    and validation line of their metrics.jsonl agrees (exactly: "bit-identical metrics"; within
    FLOAT32_RTOL: "identical up to float32 rounding"); one line for the cells that match in
    every seed. A Z-cut control equal to its baseline is left to the Z-cut check (can_cannot
    says it with its reason once the runs are evaluated): said once.

    Grouping: "within float32 rounding" is not transitive (a~b and b~c with a and c further
    apart), so the groups are the connected components of that relation (scipy.sparse.csgraph):
    they do not depend on the manifest's order; a chain is one group, and its line says
    "chained" when two of its runs differ by more than rounding."""
    c, cells = data.curves, data.cells
    if c.empty or cells.empty:
        return []
    done = cells[cells["state"] == "done"].set_index("run_id")
    sig = {rid: g.sort_values(["step", "kind"], kind="stable")
           .reindex(columns=["kind", *IDENTICAL_KEYS]).to_numpy(object)
           for rid, g in c[c["run_id"].isin(done.index) & c["kind"].isin(["train", "val"])]
           .groupby("run_id")}

    def same(a: str, b: str, rtol: float) -> bool:
        x, y = sig[a], sig[b]
        return x.shape == y.shape and (x[:, 0] == y[:, 0]).all() and np.allclose(
            x[:, 1:].astype(float), y[:, 1:].astype(float), rtol=rtol, atol=0, equal_nan=True)

    runs = [r for r in dict.fromkeys(done.index) if r in sig]
    if not runs:
        return []
    close = np.array([[same(a, b, FLOAT32_RTOL) for b in runs] for a in runs])
    _, label = connected_components(close, directed=False)
    merged: dict[tuple[str, ...], list[tuple[list[str], str]]] = {}
    for i in dict.fromkeys(label):  # components in the order of their first run
        idx = np.flatnonzero(label == i)
        g = [runs[j] for j in idx]
        if len(g) < 2:
            continue
        how = HOWS[0] if all(same(g[0], r, 0.0) for r in g) else HOWS[1] if close[
            np.ix_(idx, idx)].all() else HOWS[2]
        rows = done.loc[g]
        found = {arms.find(str(x)) for x in rows["arm"]}
        if arms.BASELINE in found and all(a is not None and (a.z_cut or a == arms.BASELINE)
                                          for a in found):
            continue  # the Z-cut check says it, with its reason
        seeds = set(rows["seed"])
        names = tuple(str(x).removesuffix(f"-s{s:.0f}") if len(seeds) == 1 else str(x)
                      for x, s in zip(rows["cell"], rows["seed"], strict=True))
        merged.setdefault(names, []).append((g, how))
    out = []
    for names, gs in merged.items():
        rows = done.loc[[r for g, _ in gs for r in g]]
        seeds = sorted({int(s) for s in rows["seed"].dropna()})
        where = f" in seed{'s' * (len(seeds) > 1)} {', '.join(map(str, seeds))}" \
            if all(done.loc[g, "seed"].nunique() == 1 for g, _ in gs) else ""
        how = max((h for _, h in gs), key=HOWS.index)  # the weakest agreement of the seeds
        out.append(f"{', '.join(names)} trained identically{where} ({how}: every train and "
                   f"validation line of {METRICS} agrees)"
                   + _why_identical(rows, c[c["run_id"].isin(rows.index)]))
    return out


def _why_identical(rows: pd.DataFrame, curves: pd.DataFrame) -> str:
    """Why runs that differ trained alike, from what they logged: two Free Transformers that
    differ in kappa only train alike only while the free-bits penalty is 0 in both (any token's
    KL above the smaller kappa would make the losses differ); the logged KL says whether it
    ever came near."""
    kappas = sorted(set(rows["kappa_bits"].dropna().astype(float)))
    a = arms.find(str(rows["arm"].iloc[0]))
    if not (a is not None and a.latent and rows["arm"].nunique() == 1 and len(kappas) > 1
            and rows["latent_bits"].nunique() == 1):
        return f"; the report knows no reason (arms {', '.join(dict.fromkeys(rows['arm']))})"
    kl = pd.concat([curves.get(k, pd.Series(dtype=float)) for k in ("kl_bits", "val_kl_bits")])
    peak = float(kl.max()) if kl.notna().any() else math.nan
    ks = " and ".join(kappa_label(k) for k in kappas)
    below = f", below kappa {ks}" if _fin(peak) and peak < kappas[0] else ""
    return (f": the free-bits penalty was never active (the runs differ only in kappa, {ks}, "
            f"and equal losses need the penalty 0 in every run; the logged mean KL peaked at "
            f"{peak:.3g} bits/token{below})")


# ---- words -------------------------------------------------------------------------------------

def verdict_table(forest: pd.DataFrame) -> pd.DataFrame:
    """One line per (comparison, metric): the verdict of each kappa in words with its Δ."""
    rows = []
    if forest.empty:
        return pd.DataFrame(columns=["comparison", "metric", "verdict", "Δ by kappa", "MDE"])
    for (comp, label), g in forest.groupby(["comparison", "label"], sort=False):
        vs = list(dict.fromkeys(g["verdict"]))
        words = vs[0] if len(vs) == 1 else "mixed: " + ", ".join(
            f"{_row_label(r).split(' · ')[-1]} {r['verdict']}" for _, r in g.iterrows())
        deltas = ", ".join(
            (f"{_row_label(r).split(' · ')[-1]} " if len(g) > 1 else "")
            + ("0 (identical)" if r["verdict"] == IDENTICAL else
               f"{r['delta']:+.1e} (rounding)" if r["verdict"] == ROUNDING
               else fmt(r["delta"], "+.3f", "—"))
            for _, r in g.iterrows())
        mdes = g["mde"].dropna()
        rows.append({"comparison": comp, "metric": f"{label} ({g['unit'].iloc[0]})",
                     "verdict": words, "Δ by kappa": deltas,
                     "MDE": f"{mdes.median():.3f}" if len(mdes) else "—"})
    return pd.DataFrame(rows)


def _span(g: pd.DataFrame) -> str:
    """'<metric> Δ lo to hi <unit>' over the rows of g's first metric."""
    first = g.iloc[0]
    d = g.loc[(g["task"] == first["task"]) & (g["metric"] == first["metric"]), "delta"]
    return f"{first['label']} Δ {d.min():+.3f} to {d.max():+.3f} {first['unit']}"


def verdict_words(forest: pd.DataFrame) -> list[tuple[str, str]]:
    """One line per comparison: its verdict over every kappa and measured metric, in words."""
    out = []
    if forest.empty:
        return out
    for comp, g in forest.groupby("comparison", sort=False):
        vs = g["verdict"].value_counts()
        n = len(g)
        if len(vs) == 1:
            v = vs.index[0]
            what = f"{v} on all {n} (kappa, metric) pairs"
            if v in (BETTER, WORSE):
                what += f"; {_span(g)}"
        else:
            what = "; ".join(f"{v}: {c} of {n}" for v, c in vs.items())
            odd = g[g["verdict"] != vs.index[0]]
            what += " (" + ", ".join(f"{_row_label(r).split(' · ')[-1]} {r['label']}"
                                     for _, r in odd.head(3).iterrows()) + (
                ", ..." if len(odd) > 3 else "") + ")"
        out.append((comp, what))
    return out


def can_cannot(data: SweepData, forest: pd.DataFrame, tables: dict[str, pd.DataFrame],
               not_evaluated: list[str]) -> str:
    """'What this sweep can and cannot say', from n, the MDE and the floor."""
    c = data.cells
    seeds = sorted(set(c["seed"].dropna().astype(int))) if len(c) else []
    _, floor = measured_metrics(tables)
    parts = []
    if len(seeds) < 2:
        parts.append(f"With {len(seeds)} seed the sweep cannot judge any comparison (Δs are "
                     "item-level; seed-to-seed variance unknown)")
    elif not forest.empty:
        mdes = []
        real = forest[forest["key"] != f"{ZCUT}:check"]  # the check's MDE is float rounding
        for (label, unit), g in real.groupby(["label", "unit"], sort=False):
            m = g["mde"].dropna()
            if len(m):
                mdes.append(f"{label} {m.min():.3f}–{m.max():.3f} {unit}"
                            if m.min() < m.max() else f"{label} {m.min():.3f} {unit}")
        parts.append(f"With n = {len(seeds)} seeds it can detect (80% power) differences of "
                     f"about: {'; '.join(mdes[:4])}" if mdes else
                     f"With n = {len(seeds)} seeds no Δ has an interval")
        found = []
        for comp, g in forest.groupby("comparison", sort=False):
            for v in (BETTER, WORSE):
                gv = g[g["verdict"] == v]
                if len(gv):
                    found.append(f"{comp}: {v} on {len(gv)} of {len(g)} (kappa, metric) pairs "
                                 f"({_span(gv)})")
        if found:
            parts.append("It finds " + "; ".join(found))
        else:
            parts.append("It finds no difference after Holm in any comparison")
        chk = forest[forest["key"] == f"{ZCUT}:check"]
        if len(chk) and chk["verdict"].isin([IDENTICAL, ROUNDING]).all():
            exact = (chk["verdict"] == IDENTICAL).all()
            parts.append("the Z-cut control equals the baseline on every measured metric in "
                         "every seed" + ("" if exact else " up to float32 rounding") + " (with "
                         "Z cut the encoder's only gradient is the free-bits penalty, 0 while "
                         "the KL stays under kappa, so it trains the baseline), so FT − Z-cut "
                         "is FT − baseline")
    floor_txt = ", ".join(f"{t} {m}" for t, m in floor)
    cannot = []
    if floor_txt:
        cannot.append(f"anything about {floor_txt} (every arm at the floor: 0 or chance)")
    if not_evaluated:
        cannot.append(f"anything about {len(not_evaluated)} benchmarks not evaluated")
    cannot.append("effects smaller than the MDE")
    parts = [p[:1].upper() + p[1:] for p in parts]  # each is a sentence
    return ". ".join(parts) + ". It cannot say " + "; nor ".join(cannot) + "."


# ---- signal and noise ------------------------------------------------------------------------

SN_COLS = ["metric", "n_seeds", "seed_sd", "spread_across_arms", "signal_to_noise", "mde",
           "reading"]


def signal_noise(data: SweepData, tables: dict[str, pd.DataFrame],
                 forest: pd.DataFrame) -> pd.DataFrame:
    """Per evaluated metric: the seed SD (pooled over the arms' columns: root mean of each
    column's variance over seeds), the spread of the columns' means across arms and kappas (their
    SD), their ratio, and the median MDE of the lead figure's comparisons."""
    keys, floor = measured_metrics(tables)
    c = data.cells
    sc = data.scores
    if sc.empty or c.empty:
        return pd.DataFrame(columns=SN_COLS)
    sc = sc[~sc["leaks"].astype(bool)]
    out = []
    for task, metric in keys + floor:
        s = sc[(sc["task"] == task) & (sc["metric"] == metric)]
        if s.empty:
            continue
        col = [f"{a}|{k}|{h}|{m}" for a, k, h, m in zip(
            s["arm"], s["kappa_bits"], s["latent_bits"], s["match_h"], strict=True)]
        per = s.assign(col=col).groupby(["col", "seed"])["value"].mean().dropna()
        by = per.groupby(level=0)
        var = by.var(ddof=1).dropna()
        means = by.mean()
        n = int(by.size().median()) if len(by) else 0
        sd = float(math.sqrt(var.mean())) if len(var) else math.nan
        spread = float(means.std(ddof=1)) if len(means) > 1 else math.nan
        snr = spread / sd if _fin(sd) and sd > 0 and _fin(spread) else math.nan
        f = forest[(forest["task"] == task) & (forest["metric"] == metric)]["mde"].dropna() \
            if len(forest) else pd.Series(dtype=float)
        label, unit = metric_label(task, metric)
        if (task, metric) in floor:
            reading = "at the floor: separates nothing"
        elif not _fin(snr):
            reading = "no seed variation to compare with"
        elif snr < 1:
            reading = "arms differ less than seeds do"
        else:
            reading = "arms differ more than seeds do"
        out.append({"metric": f"{label} ({unit})", "n_seeds": n, "seed_sd": sd,
                    "spread_across_arms": spread, "signal_to_noise": snr,
                    "mde": float(f.median()) if len(f) else math.nan, "reading": reading})
    return pd.DataFrame(out, columns=SN_COLS)
