"""The paper's Table-3 protocol and Figures 5-7 from the evaluated checkpoints (EVAL_POINTS), and
the honest likelihood comparison (analysis/likelihood.py on experiments/eval/likelihood.py's
files). Table 3 (`table3`): per paper row and arm, per seed the FINAL value (highest evaluated
step) and the LAST-THIRD mean (checkpoints with at least 2/3 of the final's tokens), then the
mean over seeds with stats.cell_interval; `n_points` names the checkpoints averaged.
`curves_figure`: each benchmark against training tokens per arm (a band over seeds).
`likelihood_table`: each Free Transformer's IWAE bounds against its seed's baseline over the same
rows: the gap in nats per token (an upper bound), bits per byte, "KL spend recovered"; the
posterior-Z CE only with its "leaking" label.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from common.arms import FREE

from .figures import arm_label, arm_labels
from .frame import SweepData
from .likelihood import compare_arms
from .paper_groups import PAPER_GROUPS
from .stats import cell_interval

LAST_FRACTION = 2 / 3
"""A checkpoint is in the last third of training when its tokens >= this x the final's."""
T3_COLS = ["group", "benchmark", "paper_metric", "task", "metric", "column", "arm", "kappa_bits",
           "latent_bits", "n_seeds", "n_points", "final", "final_lo", "final_hi",
           "last_third", "last_third_lo", "last_third_hi", "ci_method", "steps", "run_ids"]


def _rows(points: pd.DataFrame) -> list[dict]:
    """The paper's rows with points, each with the metric it is shown in (the row's stock metric
    when present, else the first metric the task has)."""
    out = []
    for group, rows in PAPER_GROUPS.items():
        for r in rows:
            have = points[points["task"] == r["task"]] if r["task"] else points.iloc[:0]
            if have.empty:
                continue
            metric = r["metric"] if (have["metric"] == r["metric"]).any() else \
                have["metric"].iloc[0]
            out.append({"group": group, "benchmark": r["benchmark"],
                        "paper_metric": r["paper_metric"], "task": r["task"], "metric": metric})
    return out


def honest_points(data: SweepData) -> pd.DataFrame:
    """Evaluated checkpoints without leaking (posterior-Z) scores, with a column label."""
    p = data.points
    if p.empty:
        return p.assign(column=pd.Series(dtype=str))
    p = p[~p["leaks"].astype(bool) & p["step"].notna()]
    p = p[p["z_mode"] == "prior"] if (p["z_mode"] == "prior").any() else p
    return p.assign(column=arm_labels(p))


def per_seed_pair(g: pd.DataFrame) -> tuple[float, float, int, str]:
    """One run's points -> (final value, last-third mean, points averaged, steps used)."""
    g = g.dropna(subset=["value"]).sort_values("step")
    if g.empty:
        return math.nan, math.nan, 0, ""
    final = g.iloc[-1]
    tok = g["tokens"].to_numpy(dtype=float)
    ftok = float(final["tokens"])
    if math.isfinite(ftok) and np.isfinite(tok).all():
        last = g[tok >= LAST_FRACTION * ftok - 1e-9]
    else:  # tokens unknown: the last third of the evaluated checkpoints by count
        last = g.iloc[int(len(g) * LAST_FRACTION):] if len(g) >= 3 else g.iloc[-1:]
    steps = ",".join(str(int(s)) for s in last["step"])
    return float(final["value"]), float(last["value"].mean()), len(last), steps


def table3(data: SweepData) -> pd.DataFrame:
    """The Table-3 pair per paper row and arm (see the module docstring)."""
    p = honest_points(data)
    out = []
    if p.empty:
        return pd.DataFrame(columns=T3_COLS)
    for row in _rows(p):
        sub = p[(p["task"] == row["task"]) & (p["metric"] == row["metric"])]
        for col, g in sub.groupby("column", sort=True):
            finals, lasts, npts, steps = [], [], [], []
            for _, gr in g.groupby("run_id"):
                f, la, n, st = per_seed_pair(gr)
                finals.append(f)
                lasts.append(la)
                npts.append(n)
                steps.append(st)
            fi = cell_interval(finals, None, row["metric"])
            li = cell_interval(lasts, None, row["metric"])
            first = g.iloc[0]
            out.append({**row, "column": col, "arm": first["arm"],
                        "kappa_bits": first["kappa_bits"], "latent_bits": first["latent_bits"],
                        "n_seeds": fi.n_seeds, "n_points": min(npts) if npts else 0,
                        "final": fi.mean, "final_lo": fi.lo, "final_hi": fi.hi,
                        "last_third": li.mean, "last_third_lo": li.lo, "last_third_hi": li.hi,
                        "ci_method": fi.method or "one seed: no interval over seeds",
                        "steps": " | ".join(sorted(set(steps))),
                        "run_ids": " ".join(sorted(map(str, g["run_id"].unique())))})
    return pd.DataFrame(out, columns=T3_COLS)


def curves_figure(data: SweepData) -> plt.Figure | None:
    """Per benchmark row: value vs training tokens for each arm (Figures 5-7 of the paper)."""
    p = honest_points(data)
    if p.empty or p["step"].nunique() < 2:
        return None
    rows = _rows(p)
    if not rows:
        return None
    ncol = min(3, len(rows))
    nrow = math.ceil(len(rows) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.0 * nrow), squeeze=False)
    for ax, row in zip(axes.flat, rows, strict=False):
        sub = p[(p["task"] == row["task"]) & (p["metric"] == row["metric"])]
        for col, g in sub.groupby("column", sort=True):
            x = g.groupby("tokens")["value"]
            mean = x.mean()
            ax.plot(mean.index, mean.to_numpy(), marker="o", label=col)
            if g["run_id"].nunique() > 1:
                ax.fill_between(mean.index, x.min().to_numpy(), x.max().to_numpy(), alpha=0.15)
        ax.set_title(f"{row['benchmark']} ({row['metric']})", fontsize=9)
        ax.set_xlabel("training tokens", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(rows):]:
        ax.axis("off")
    fig.tight_layout()
    return fig


LIK_COLS = ["column", "seed", "n_tokens", "baseline_bpb", "free_bpb_kmax", "gap_k",
            "gap_nats_per_token", "tightest", "tightest_gap_nats_per_token", "spread_bpb",
            "kl_nats_per_token", "kl_spend_recovered", "kl_spend_recovered_iwae",
            "posterior_ce_leaking", "files"]


def likelihood_table(data: SweepData) -> pd.DataFrame:
    """Each Free Transformer's likelihood file against its own seed's baseline file (the same
    validation rows, checked by compare_arms)."""
    if not data.likelihood:
        return pd.DataFrame(columns=LIK_COLS)
    recs = pd.DataFrame(data.likelihood)
    # newest step per run (the final checkpoint)
    recs = recs.sort_values("checkpoint_step", na_position="first").drop_duplicates(
        "run_id", keep="last")
    base = recs[recs["arm"] == "baseline"]
    out = []
    for _, r in recs[recs["arm"] == FREE.name].iterrows():
        b = base[base["seed"] == r["seed"]]
        row = {"column": arm_label(r["arm"], r["kappa_bits"], r["latent_bits"]),
               "seed": r["seed"], "n_tokens": r.get("n_tokens"),
               "spread_bpb": r.get("spread_bpb"), "files": r["file"]}
        post = r.get("posterior") if isinstance(r.get("posterior"), dict) else {}
        row["posterior_ce_leaking"] = post.get("ce_nats_per_token")
        if b.empty:
            out.append({**row, "tightest": "no baseline likelihood file for this seed"})
            continue
        try:
            bd, fd = b.iloc[0].to_dict(), r.to_dict()
            c = compare_arms({**bd, "arm": bd["model_arm"]}, {**fd, "arm": fd["model_arm"]})
        except ValueError as e:
            out.append({**row, "tightest": f"not comparable: {e}"})
            continue
        k = str(c["gap_k"])
        out.append({**row, "baseline_bpb": c["baseline_bpb"], "free_bpb_kmax": c["free_bpb"][k],
                    "gap_k": c["gap_k"], "gap_nats_per_token": c["gap_nats_per_token"][k],
                    "tightest": c["tightest"]["estimate"],
                    "tightest_gap_nats_per_token": c["tightest"]["gap_nats_per_token"],
                    "kl_nats_per_token": c["kl_nats_per_token"],
                    "kl_spend_recovered": c["kl_spend_recovered"],
                    "kl_spend_recovered_iwae": c["kl_spend_recovered_iwae"],
                    "files": f"{r['file']} vs {b.iloc[0]['file']}"})
    return pd.DataFrame(out, columns=LIK_COLS)
