"""Matplotlib figures (Agg, PNG). Each function returns a Figure, or None when the sweep has no
data for it yet (the report then says so instead of showing an empty plot).
"""

from __future__ import annotations

import math

import matplotlib
import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np
import pandas as pd

from common.arms import FREE
from common.kappa import kappa_label

from .derived import leak_table, overhead_table
from .frame import SweepData
from .tables import GROUPS

matplotlib.use("Agg")  # PNGs only, never a display

LN2 = math.log(2)


def arm_label(arm: str, kappa: float, h: float) -> str:
    if arm == FREE.name:
        return f"FT k={kappa_label(kappa)} H={int(h)}"
    return arm


def arm_labels(df: pd.DataFrame) -> pd.Series:
    return pd.Series([arm_label(a, k, h) for a, k, h in
                      zip(df["arm"], df["kappa_bits"], df["latent_bits"], strict=True)],
                     index=df.index)


def kappa_x(k: np.ndarray | pd.Series) -> np.ndarray:
    """x position of kappa on a log2 axis; kappa = 0 sits one octave left of the smallest."""
    k = np.asarray(k, dtype=float)
    pos = k[k > 0]
    floor = np.log2(pos.min()) - 1 if pos.size else 0.0
    with np.errstate(divide="ignore"):
        return np.where(k > 0, np.log2(np.where(k > 0, k, 1.0)), floor)


def training_curves(data: SweepData) -> plt.Figure | None:
    """Train CE (nats/token, the unit of every CE in the report) and KL (bits/token, the unit of
    kappa) against training FLOPs, per arm and seed."""
    c = data.curves
    if c.empty or "kind" not in c or not (c["kind"] == "train").any():
        return None
    c = c[c["kind"] == "train"].copy()
    c["label"] = arm_labels(c)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    colors = {lab: f"C{i}" for i, lab in enumerate(sorted(c["label"].unique()))}
    for (lab, seed), g in c.groupby(["label", "seed"], sort=True):
        g = g.sort_values("flops")
        first = seed == c[c["label"] == lab]["seed"].min()
        kw = {"color": colors[lab], "lw": 1.2, "alpha": 0.85, "label": lab if first else None,
              "marker": "." if len(g) < 20 else None}
        axes[0].plot(g["flops"], g["ce"], **kw)
        kl = g["kl_bits"] if "kl_bits" in g else g.get("kl_nats", 0) / LN2
        axes[1].plot(g["flops"], kl, **kw)
    for k in sorted(c[c["arm"] == FREE.name]["kappa_bits"].dropna().unique()):
        axes[1].axhline(k, color="grey", ls=":", lw=0.8)
    axes[0].set(xlabel="training FLOPs", ylabel="train CE (nats/token)", xscale="log",
                title="Training cross-entropy (FT: Z from the encoder)")
    axes[1].set(xlabel="training FLOPs", ylabel="KL (bits/token)", xscale="log",
                title="KL to the uniform prior (dotted: kappa)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def learning_curves(data: SweepData) -> plt.Figure | None:
    """Validation CE (Z from the prior: the honest number) against training tokens and against
    training FLOPs, one line per arm and kappa (the mean over seeds), the seeds' range as a
    band: the lead figure's companion."""
    c = data.curves
    if c.empty or "val_ce" not in c or not (c["kind"] == "val").any():
        return None
    v = c[(c["kind"] == "val") & c["val_ce"].notna()].copy()
    v["label"] = arm_labels(v)
    fig, axes = plt.subplots(1, 2, figsize=(6.4, 2.6), sharey=True)
    for i, (lab, g) in enumerate(v.groupby("label", sort=True)):
        by = g.groupby("step").agg(tokens=("tokens", "mean"), flops=("flops", "mean"),
                                   mean=("val_ce", "mean"), lo=("val_ce", "min"),
                                   hi=("val_ce", "max"), n=("seed", "nunique"))
        for ax, x in zip(axes, ("tokens", "flops"), strict=True):
            ax.plot(by[x], by["mean"], color=f"C{i}", lw=1.2, label=lab,
                    marker="." if len(by) < 20 else None)
            if (by["n"] > 1).any():
                ax.fill_between(by[x], by["lo"], by["hi"], color=f"C{i}", alpha=0.15, lw=0)
    seeds = v.groupby("label")["seed"].nunique()
    axes[0].set(xlabel="training tokens", ylabel="val CE (nats/token, prior Z)")
    axes[1].set(xlabel="training FLOPs")
    for ax in axes:
        ax.xaxis.set_major_formatter(matplotlib.ticker.EngFormatter(sep=""))
    axes[0].legend(fontsize=6)
    span = f"{seeds.min()}" + (f"-{seeds.max()}" if seeds.max() > seeds.min() else "")
    fig.suptitle("Learning curves: mean over seeds, " + (
        f"band = the range over {span} seeds" if seeds.max() > 1 else "one seed: no band"),
        fontsize=8)
    fig.tight_layout()
    return fig


def val_ce_vs_kappa(data: SweepData) -> plt.Figure | None:
    """Validation CE with Z from the prior (the honest number) against kappa, posterior CE
    (leaks) beside it, the baseline as a band; leaking kappas (the paper's
    "collapse") circled in red."""
    ct = leak_table(data)
    if ct.empty:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    ks = ct["kappa_bits"].to_numpy()
    x = kappa_x(ks)
    ax.errorbar(x - 0.05, ct["ce_prior"], yerr=ct["ce_prior_sd"].fillna(0), fmt="o-",
                label="val CE, Z from prior (honest)", color="C0", capsize=3)
    if ct["ce_posterior"].notna().any():
        ax.errorbar(x + 0.05, ct["ce_posterior"], yerr=ct["ce_posterior_sd"].fillna(0),
                    fmt="s--", label="val CE, Z from encoder (leaks)", color="C1", capsize=3)
    base = ct["baseline_ce"].iloc[0]
    if math.isfinite(base):
        ax.axhline(base, color="k", lw=1, label="baseline val CE")
        sd = ct["baseline_ce_sd"].iloc[0]
        if math.isfinite(sd):
            ax.axhspan(base - sd, base + sd, color="k", alpha=0.1)
    col = ct[ct["leaking"]]
    if len(col):
        ax.scatter(x[ct["leaking"].to_numpy()], col["ce_prior"], s=250, facecolors="none",
                   edgecolors="red", lw=2, label="leaking (the paper's collapse)", zorder=5)
    ax.set_xticks(x, [kappa_label(k) for k in ks])
    ax.set(xlabel="kappa (bits, log scale)", ylabel="validation CE (nats/token)",
           title="Validation CE against the free-bits threshold")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def benchmarks_vs_kappa(t: pd.DataFrame) -> plt.Figure | None:
    """Each benchmark's primary score against kappa with its 95% CI (from the report's main
    paper table `t`); baseline as a band. Rows at the floor (every arm 0, or at chance:
    lead.at_floor) are not drawn: a flat line at 0 says nothing the report's one line about
    them does not."""
    from .lead import row_status

    if len(t) and "comparison" in t:  # the view's first comparison (its reference arm)
        t = t[t["comparison"] == t["comparison"].dropna().iloc[0]]
    t = t[(t["column"] != "") & t["n_seeds"].fillna(0).gt(0)] if len(t) else t
    if len(t):
        st = row_status(t)
        floor = {(r.task, r.metric) for r in st.itertuples() if r.floor}
        t = t[[(a, b) not in floor for a, b in zip(t["task"], t["metric"], strict=True)]]
    if t.empty:
        return None
    order = [task for _, tasks in GROUPS for task in tasks]
    keys = sorted({(r.task, r.metric) for r in t.itertuples()},
                  key=lambda k: (order.index(k[0]) if k[0] in order else 99, k[1]))
    n = len(keys)
    ncol = min(4, n)
    nrow = math.ceil(n / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.4 * ncol, 2.8 * nrow), squeeze=False)
    for ax, (task, metric) in zip(axes.flat, keys, strict=False):
        g = t[(t["task"] == task) & (t["metric"] == metric)]
        ft = g[g["arm"] == FREE.name].sort_values("kappa_bits")
        for h, gh in ft.groupby("latent_bits"):
            x = kappa_x(gh["kappa_bits"])
            lo = (gh["mean"] - gh["lo"]).fillna(0).clip(lower=0)
            hi = (gh["hi"] - gh["mean"]).fillna(0).clip(lower=0)
            ax.errorbar(x, gh["mean"], yerr=[lo, hi], fmt="o-", capsize=3,
                        label=f"FT H={int(h)}")
            ax.set_xticks(x, [kappa_label(k) for k in gh["kappa_bits"]])
        b = g[g["column"] == g["reference"]]  # reference columns name themselves
        if len(b) and math.isfinite(b["mean"].iloc[0]):
            ax.axhline(b["mean"].iloc[0], color="k", lw=1, label=str(b["reference"].iloc[0]))
            if math.isfinite(b["lo"].iloc[0]):
                ax.axhspan(b["lo"].iloc[0], b["hi"].iloc[0], color="k", alpha=0.1)
        ax.set_title(f"{task}\n{metric}", fontsize=8)
        ax.set_xlabel("kappa (bits)", fontsize=7)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    view = "equal tokens" if len(t) and t["view"].iloc[0] == "tokens" else "equal FLOPs"
    fig.suptitle(f"Benchmarks against kappa ({view}; 95% CIs; band = reference CI)",
                 fontsize=9)
    fig.tight_layout()
    return fig


def overhead(data: SweepData) -> plt.Figure | None:
    ot = overhead_table(data)
    if ot.empty or not (ot["flops_overhead"].notna().any()
                        or ot["wallclock_overhead"].notna().any()):
        return None
    fig, ax = plt.subplots(figsize=(7, 3.6))
    x = np.arange(len(ot))
    ax.bar(x - 0.2, 100 * ot["flops_overhead"], 0.4, label="FLOPs (analytic accounting)")
    ax.bar(x + 0.2, 100 * ot["wallclock_overhead"], 0.4,
           label="wall-clock (tokens/s; comparable runs only)")
    ax.scatter(x, 100 * ot["paper_1_over_L"], marker="_", s=900, color="red", zorder=5,
               label="paper: 1/L")
    ax.set_xticks(x, [f"k={kappa_label(k)} H={int(h)}\nwall-clock n={int(n or 0)}"
                      for h, k, n in zip(ot["latent_bits"], ot["kappa_bits"],
                                         ot["wallclock_pairs"], strict=True)], fontsize=8)
    ax.set(ylabel="extra cost of the FT (%)", title="Free Transformer overhead against 1/L "
           "(wall-clock: n seed pairs; the machine's load not recorded)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
