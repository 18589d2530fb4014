"""The paper-style benchmark table, at equal tokens and at equal FLOPs, as CSV, Markdown, LaTeX.

Rows follow the paper's grouping of benchmarks (generative code/math; multi-choice general
knowledge / common sense; multi-choice text understanding; culture); the suite only carries the
first two groups' benchmarks, so the other two rows say so. Smooth metrics (bits per byte of the
gold answers, validation CE/bpb) get their own group, because a tiny model's accuracies sit at
chance and separate nothing.

Columns are the reference arm and each Free Transformer (H, kappa). A cell holds the mean over
seeds with its 95% interval and, for the non-reference columns, the delta against the reference
with a paired bootstrap 95% interval over (seed, item) pairs, marked `*` when it excludes 0.

Interval methods (column `ci_method`):
- `clopper-pearson`: pass@1 metrics, pooled over the seeds' items (exact; honest at 0);
- `wilson`: other 0/1 metrics with fewer than 3 seeds, pooled over the seeds' items;
- `t`: Student-t over seed means otherwise (>= 2 seeds; >= 3 for 0/1 metrics);
- `stderr`: one seed of a continuous metric, value +- 1.96 x the reported stderr.

Bits-per-byte rows: a cell shows the task's value (total bits / total bytes, as the eval file
reports it), while the Δ and its interval are over per-item bpb (the mean of paired per-item
differences), so a Δ need not equal the difference of the two cells exactly.

Views: `tokens` compares with `baseline` (same tokens, the paper's protocol); `flops` compares
with the `baseline_flops` control (the baseline trained on more tokens to match the Free
Transformer's FLOPs) and also shows `baseline_plus1` (one more layer) when the sweep has it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .frame import SweepData
from .stats import clopper_pearson, mean_ci, paired_bootstrap, wilson

GROUPS: list[tuple[str, list[str]]] = [
    ("Generative code/math", ["humaneval_plus", "mbpp_plus", "gsm8k"]),
    ("Multi-choice general knowledge / common sense",
     ["mmlu", "arc_easy", "arc_challenge", "commonsense_qa"]),
    ("Multi-choice text understanding", []),
    ("Culture", []),
    ("Smooth metrics (lower is better)",
     ["humaneval_plus_gold_bpb", "mbpp_plus_gold_bpb", "gsm8k_gold_bpb", "val"]),
]
"""The paper's row groups; the two empty ones hold benchmarks this suite does not run."""
VAL_METRICS = ["val_bpb", "val_ce"]
NOT_IN_SUITE = "not in this suite (none of the six benchmarks belongs to this group)"
VIEWS = {"tokens": "baseline", "flops": "baseline_flops"}
TABLE_COLS = ["view", "reference", "group", "task", "metric", "higher_is_better", "column", "arm",
              "kappa_bits", "latent_bits", "n_seeds_expected", "n_seeds", "n_items", "mean", "lo",
              "hi", "ci_method", "delta", "delta_lo", "delta_hi", "p", "significant", "better",
              "delta_method", "status", "run_ids"]
"""Columns of the long table (the CSV)."""


@dataclass(frozen=True)
class Column:
    label: str
    arm: str
    kappa_bits: float
    latent_bits: float


def _fmt_kappa(k: float) -> str:
    return f"{k:g}"


def columns(data: SweepData, view: str) -> list[Column]:
    """The table's columns for a view: the reference first, then the Free Transformers."""
    cells = data.cells
    ref = VIEWS[view]
    cols = [Column(ref, ref, math.nan, 0.0)]
    if view == "flops" and (cells["arm"] == "baseline_plus1").any():
        cols.append(Column("baseline_plus1", "baseline_plus1", math.nan, 0.0))
    free = cells[cells["arm"] == "free"][["latent_bits", "kappa_bits"]].drop_duplicates()
    hs = free["latent_bits"].nunique()
    for h, k in sorted(map(tuple, free.to_numpy())):
        label = f"FT k={_fmt_kappa(k)}" + (f" H={int(h)}" if hs > 1 else "")
        cols.append(Column(label, "free", float(k), float(h)))
    return cols


def _select(df: pd.DataFrame, col: Column) -> pd.DataFrame:
    m = df["arm"] == col.arm
    if col.arm == "free":
        m &= np.isclose(df["kappa_bits"].astype(float), col.kappa_bits)
        m &= np.isclose(df["latent_bits"].astype(float), col.latent_bits)
    return df[m]


def _row_keys(data: SweepData) -> list[tuple[str, str, str, bool]]:
    """(group, task, metric, higher_is_better) for every row, in the paper's order."""
    sc = data.scores
    sc = sc[~sc["leaks"].astype(bool)] if len(sc) else sc
    prim = sc[sc["primary"].astype(bool)] if len(sc) else sc
    keys = []
    known = set()
    for group, tasks in GROUPS:
        for task in tasks:
            known.add(task)
            if task == "val":
                for m in VAL_METRICS:
                    if ((sc["task"] == "val") & (sc["metric"] == m)).any():
                        keys.append((group, "val", m, False))
                continue
            rows = prim[prim["task"] == task]
            metric = rows["metric"].iloc[0] if len(rows) else None
            hib = bool(rows["higher_is_better"].iloc[0]) if len(rows) else True
            keys.append((group, task, metric or "", hib))
        if not tasks:
            keys.append((group, "", "", True))
    for task in sorted(set(prim["task"]) - known) if len(prim) else []:
        rows = prim[prim["task"] == task]
        keys.append(("Other", task, rows["metric"].iloc[0],
                     bool(rows["higher_is_better"].iloc[0])))
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


def _is_binary(v: np.ndarray) -> bool:
    v = v[np.isfinite(v)]
    return v.size > 0 and bool(np.all((v == 0) | (v == 1)))


def _cell_stats(scores: pd.DataFrame, items: pd.DataFrame, metric: str) -> dict:
    """Mean over seeds and its interval for one (task, metric, column)."""
    per_seed = scores.groupby("seed")["value"].mean()
    per_seed = per_seed[np.isfinite(per_seed)]
    n_seeds = int(per_seed.size)
    out = {"n_seeds": n_seeds, "mean": math.nan, "lo": math.nan, "hi": math.nan,
           "ci_method": "", "n_items": int(items["value"].notna().sum()) if len(items) else 0}
    if n_seeds == 0:
        return out
    mean, lo, hi = mean_ci(per_seed.to_numpy())
    method = "t"
    iv = items["value"].to_numpy(dtype=float) if len(items) else np.array([])
    iv = iv[np.isfinite(iv)]
    binary = _is_binary(iv) if iv.size else False
    if metric.startswith("pass@1") and (binary or not iv.size):
        if iv.size:
            k, n = float(iv.sum()), int(iv.size)
        else:  # no items: rebuild k from value * n
            n = int(np.nansum(scores["n"].to_numpy(dtype=float)))
            k = float(np.nansum(scores["value"] * scores["n"]))
        if n > 0:
            lo, hi = clopper_pearson(round(k), n)
            method = "clopper-pearson"
    elif n_seeds < 3 and binary:
        # with 2 seeds the t interval has 1 degree of freedom (t = 12.7) and says nothing;
        # pool the items instead (this ignores seed-to-seed variance; the table says so)
        lo, hi = wilson(float(iv.sum()), int(iv.size))
        method = "wilson"
    elif n_seeds < 2:
        se = float(scores["stderr"].iloc[0]) if len(scores) else math.nan
        if not math.isfinite(se) and iv.size > 1:
            se = float(iv.std(ddof=1) / math.sqrt(iv.size))
        lo, hi = (mean - 1.96 * se, mean + 1.96 * se) if math.isfinite(se) else (math.nan,) * 2
        method = "stderr" if math.isfinite(se) else ""
    out.update(mean=mean, lo=lo, hi=hi, ci_method=method)
    return out


def _seed_delta(test: pd.DataFrame, ref: pd.DataFrame) -> tuple[float, float, float, int]:
    """Delta paired by seed (no items, e.g. validation CE): mean and t-interval."""
    t = test.groupby("seed")["value"].mean()
    r = ref.groupby("seed")["value"].mean()
    common = sorted(set(t.dropna().index) & set(r.dropna().index))
    if not common:
        return math.nan, math.nan, math.nan, 0
    m, lo, hi = mean_ci((t[common] - r[common]).to_numpy())
    return m, lo, hi, len(common)


def _missing(cells: pd.DataFrame, have_seeds: set) -> str:
    """Why some seeds of a column have no number: run states, or 'not evaluated'."""
    if cells.empty:
        return "missing: arm not in sweep"
    miss = cells[~cells["seed"].isin(have_seeds)]
    if miss.empty:
        return ""
    states = miss["state"].fillna("unknown").replace({"done": "trained, not evaluated"})
    return "missing: " + ", ".join(f"{n} {s}" for s, n in states.value_counts().items())


def paper_table(data: SweepData, view: str = "tokens", n_boot: int = 2000) -> pd.DataFrame:
    """The long (tidy) table for one view: one row per (benchmark row, column)."""
    if view not in VIEWS:
        raise ValueError(f"view must be one of {list(VIEWS)}, got {view!r}")
    cols = columns(data, view)
    ref_col = cols[0]
    sc = _honest(data.scores, ["run_id", "task", "metric"])
    it = _honest(data.items, ["run_id", "task", "metric", "doc_id"])
    rows = []
    for group, task, metric, hib in _row_keys(data):
        base = {"view": view, "reference": ref_col.label, "group": group, "task": task,
                "metric": metric, "higher_is_better": hib}
        if not task:
            rows.append({**base, "column": "", "status": NOT_IN_SUITE})
            continue
        if not metric:
            rows.append({**base, "column": "", "status": "not evaluated in this sweep"})
            continue
        s_row = sc[(sc["task"] == task) & (sc["metric"] == metric)] if metric else sc.iloc[:0]
        i_row = it[(it["task"] == task) & (it["metric"] == metric)] if metric else it.iloc[:0]
        ref_s, ref_i = _select(s_row, ref_col), _select(i_row, ref_col)
        for col in cols:
            c_cells = _select(data.cells, col)
            c_s, c_i = _select(s_row, col), _select(i_row, col)
            st = _cell_stats(c_s, c_i, metric)
            have = set(c_s.dropna(subset=["value"])["seed"])
            status = _missing(c_cells, have)
            if st["n_seeds"] == 0 and c_cells.empty and col is ref_col and view == "flops":
                status = "missing: no baseline_flops control arm in this sweep"
            r = {**base, "column": col.label, "arm": col.arm, "kappa_bits": col.kappa_bits,
                 "latent_bits": col.latent_bits, "n_seeds_expected": int(len(c_cells)), **st,
                 "delta": math.nan, "delta_lo": math.nan, "delta_hi": math.nan, "p": math.nan,
                 "significant": False, "better": None, "delta_method": "", "status": status,
                 "run_ids": " ".join(sorted(map(str, c_s["run_id"].unique())))}
            if col is not ref_col and st["n_seeds"] and len(ref_s):
                if len(c_i) and len(ref_i):
                    pdlt = paired_bootstrap(c_i[["seed", "doc_id", "value"]],
                                            ref_i[["seed", "doc_id", "value"]], n_boot=n_boot)
                    r.update(delta=pdlt.delta, delta_lo=pdlt.lo, delta_hi=pdlt.hi, p=pdlt.p,
                             significant=pdlt.significant, delta_method=(
                                 f"paired bootstrap over {pdlt.n_seeds} seed(s) x "
                                 f"{pdlt.n_items} items"))
                else:
                    d, lo, hi, n = _seed_delta(c_s, ref_s)
                    sig = bool(math.isfinite(lo) and (lo > 0 or hi < 0))
                    r.update(delta=d, delta_lo=lo, delta_hi=hi, significant=sig,
                             delta_method=f"paired by seed (t, {n} seed(s))")
                if r["significant"]:
                    r["better"] = bool((r["delta"] > 0) == hib)
            rows.append(r)
    return pd.DataFrame(rows, columns=TABLE_COLS)


# ---- rendering -------------------------------------------------------------------------------

def _f(x: float, signed: bool = False) -> str:
    if x is None or not math.isfinite(x):
        return "?"
    return f"{x:+.3f}" if signed else f"{x:.3f}"


def cell_text(r: pd.Series) -> str:
    """One table cell: 'mean [lo, hi]' and, off the reference, 'Δ delta [lo, hi]*'."""
    if not r.get("n_seeds"):
        return r.get("status") or "missing"
    s = _f(r["mean"])
    if math.isfinite(r["lo"]):
        s += f" [{_f(r['lo'])}, {_f(r['hi'])}]"
    if r["column"] != r["reference"] and math.isfinite(r["delta"]):
        s += f"; Δ {_f(r['delta'], True)}"
        if math.isfinite(r["delta_lo"]):
            s += f" [{_f(r['delta_lo'], True)}, {_f(r['delta_hi'], True)}]"
        s += "*" if r["significant"] else ""
    if r["n_seeds"] < r["n_seeds_expected"]:
        s += f" ({int(r['n_seeds'])}/{int(r['n_seeds_expected'])} seeds; {r['status']})"
    return s


def row_label(r: pd.Series) -> str:
    if not r["task"]:
        return "—"
    if not r["metric"]:
        return r["task"]
    return f"{r['task']} ({r['metric']}{'' if r['higher_is_better'] else ', lower better'})"


def wide(table: pd.DataFrame) -> pd.DataFrame:
    """Formatted wide table: group, benchmark, then one column per arm, in the table's order."""
    cols = [c for c in dict.fromkeys(table["column"]) if c]
    rows: dict[tuple[str, str], dict[str, str]] = {}
    for _, r in table.iterrows():
        key = (r["group"], row_label(r))
        row = rows.setdefault(key, {"group": key[0], "benchmark": key[1]})
        if r["column"]:
            row[r["column"]] = cell_text(r)
        else:
            row.update({c: r["status"] for c in cols})
    return pd.DataFrame(list(rows.values()), columns=["group", "benchmark", *cols]).fillna(
        "missing")


def to_markdown(table: pd.DataFrame) -> str:
    w = wide(table)
    head = list(w.columns)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for _, r in w.iterrows():
        lines.append("| " + " | ".join(str(v).replace("|", "\\|") for v in r) + " |")
    return "\n".join(lines) + "\n"


def _tex(s: str) -> str:
    rep = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
           "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\^{}",
           "Δ": r"$\Delta$", "—": "---"}
    return "".join(rep.get(c, c) for c in str(s))


def to_latex(table: pd.DataFrame, caption: str = "") -> str:
    w = wide(table)
    cols = list(w.columns)
    out = [r"\begin{table}[t]", r"\centering", r"\scriptsize",
           r"\begin{tabular}{ll" + "l" * (len(cols) - 2) + "}", r"\toprule",
           " & ".join(_tex(c) for c in cols) + r" \\", r"\midrule"]
    prev = None
    for _, r in w.iterrows():
        vals = [_tex(v) for v in r]
        if r["group"] == prev:
            vals[0] = ""
        elif prev is not None:
            out.append(r"\midrule")
        prev = r["group"]
        out.append(" & ".join(vals) + r" \\")
    out += [r"\bottomrule", r"\end{tabular}"]
    if caption:
        out.append(r"\caption{" + _tex(caption) + "}")
    out.append(r"\end{table}")
    return "\n".join(out) + "\n"


def write_tables(data: SweepData, out_dir: Path, n_boot: int = 2000) -> dict[str, pd.DataFrame]:
    """Write table_<view>.{csv,md,tex} for both views; return the long tables."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tables = {}
    for view in VIEWS:
        t = paper_table(data, view, n_boot=n_boot)
        tables[view] = t
        t.to_csv(out_dir / f"table_{view}.csv", index=False)
        (out_dir / f"table_{view}.md").write_text(to_markdown(t), encoding="utf-8")
        cap = (f"{data.name}: equal {'tokens' if view == 'tokens' else 'FLOPs'}; mean over "
               "seeds [95% CI]; Δ vs reference [paired bootstrap 95% CI]; * CI excludes 0.")
        (out_dir / f"table_{view}.tex").write_text(to_latex(t, cap), encoding="utf-8")
    return tables
