"""The latent across seeds in the report: one figure per kappa from every Free Transformer's probe
file (KL per latent bit, the decoder's recovered share of the KL, the Z ablations; means over
seeds with t intervals over seeds), each run's own block (analysis/probe.py) folded beneath.
Only the probe files' columns are read (`probe.probe_row`); the posterior CE leaks, so the share
is a diagnostic of latent use, never a score.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from common.kappa import kappa_label

from .probe import (
    TABLE_COLS,
    final_docs,
    probe_html,
    probe_row,
    read_probes,
)
from .render import png, template
from .stats import mean_ci

matplotlib.use("Agg")  # PNGs only, never a display

ABLATION_COLS = (("d_fixed", "one code\nper sequence"), ("d_zeroed", "Z zeroed"),
                 ("d_posterior_LEAKING", "posterior\n(LEAKING)"))
AGG_COLS = ["kappa_bits", "latent_bits", "n_seeds", "kl_bits", "kl_bits_lo", "kl_bits_hi",
            "share", "share_lo", "share_hi", "d_fixed", "d_fixed_lo", "d_fixed_hi", "d_zeroed",
            "d_zeroed_lo", "d_zeroed_hi", "d_posterior_LEAKING", "d_posterior_LEAKING_lo",
            "d_posterior_LEAKING_hi", "run_ids"]


def per_run(docs: Iterable[dict]) -> pd.DataFrame:
    """One row per probe file: its probe_row plus the recovered share and the per-bit KL."""
    rows = []
    for doc in docs:
        r = probe_row(doc)
        r["share"] = r["recovered_share"]  # the probe's latent_use record (NaN without one)
        r["per_bit"] = [float(x) if isinstance(x, (int, float)) else math.nan
                        for x in ((doc.get("kl") or {}).get("per_bit_bits") or [])]
        rows.append(r)
    return pd.DataFrame(rows)


def aggregate(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (kappa, H): means over seeds with 95% t intervals over seeds (AGG_COLS)."""
    out = []
    if runs.empty:
        return pd.DataFrame(columns=AGG_COLS)
    for (k, h), g in runs.groupby(["kappa_bits", "latent_bits"], sort=True):
        r: dict = {"kappa_bits": float(k), "latent_bits": h, "n_seeds": len(g),
                   "run_ids": " ".join(map(str, g["run_id"]))}
        for col in ("kl_bits", "share", "d_fixed", "d_zeroed", "d_posterior_LEAKING"):
            m, lo, hi = mean_ci(g[col].to_numpy(dtype=float))
            r[col], r[f"{col}_lo"], r[f"{col}_hi"] = m, lo, hi
        out.append(r)
    return pd.DataFrame(out, columns=AGG_COLS)


def kappa_figure(g: pd.DataFrame, agg: pd.Series) -> plt.Figure:
    """One kappa's figure over its seeds: KL per bit, the recovered share, the ablations."""
    fig, axes = plt.subplots(1, 3, figsize=(12, 2.9), gridspec_kw={"width_ratios": [3, 1.2, 2]})
    bits = np.array([b for b in g["per_bit"] if b], dtype=float) if len(g) else np.zeros((0, 0))
    ax = axes[0]
    if bits.ndim == 2 and bits.size:
        m = np.nanmean(bits, axis=0)
        ci = [mean_ci(bits[:, j]) for j in range(bits.shape[1])]
        # error bars from each bit's own t interval (clipped at 0: rounding, never negative)
        lo = np.array([max(0.0, m[j] - c[1]) if math.isfinite(c[1]) else 0
                       for j, c in enumerate(ci)])
        hi = np.array([max(0.0, c[2] - m[j]) if math.isfinite(c[2]) else 0
                       for j, c in enumerate(ci)])
        ax.bar(range(len(m)), m, yerr=[lo, hi], capsize=3, color="tab:blue")
        for row in bits:
            ax.plot(range(len(row)), row, ".", color="k", ms=3, alpha=0.5)
    ax.set(xlabel="latent bit h", ylabel="KL to uniform (bits)")
    ax.set_title(f"KL per bit, mean over {len(g)} seeds (dots: seeds); total "
                 f"{agg['kl_bits']:.3g} bits/token", fontsize=8)
    ax = axes[1]
    s = g["share"].to_numpy(dtype=float)
    ax.plot(np.zeros(len(s)) + np.linspace(-0.1, 0.1, len(s)), 100 * s, ".", color="k", ms=4)
    if math.isfinite(agg["share"]):
        lo = agg["share_lo"] if math.isfinite(agg["share_lo"]) else agg["share"]
        hi = agg["share_hi"] if math.isfinite(agg["share_hi"]) else agg["share"]
        ax.errorbar([0.3], [100 * agg["share"]], yerr=[[max(0.0, 100 * (agg["share"] - lo))],
                                                      [max(0.0, 100 * (hi - agg["share"]))]],
                    fmt="o", color="tab:red", capsize=4)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xlim(-0.5, 0.6)
    ax.set_xticks([])
    ax.set_ylabel("% of the KL recovered")
    ax.set_title("decoder's recovered share\n(prior CE − posterior CE) / KL", fontsize=8)
    ax = axes[2]
    for i, (col, _) in enumerate(ABLATION_COLS):
        m, lo, hi = agg[col], agg[f"{col}_lo"], agg[f"{col}_hi"]
        if not math.isfinite(m):
            continue
        err = [[max(0.0, m - lo) if math.isfinite(lo) else 0],
               [max(0.0, hi - m) if math.isfinite(hi) else 0]]
        ax.errorbar([i], [m], yerr=err, fmt="o", capsize=4,
                    color="tab:red" if "LEAKING" in col else "tab:blue")
        ax.plot(np.zeros(len(g)) + i + 0.15, g[col].to_numpy(dtype=float), ".", color="k",
                ms=3, alpha=0.5)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(range(len(ABLATION_COLS)), [lab for _, lab in ABLATION_COLS], fontsize=7)
    ax.set_ylabel("CE − CE(prior Z), nats/token")
    ax.set_title("Z ablations, mean over seeds (95% t interval)", fontsize=8)
    fig.suptitle(f"kappa = {kappa_label(agg['kappa_bits'])} bit, H = {agg['latent_bits']}: "
                 f"{len(g)} seeds", fontsize=9)
    fig.tight_layout()
    return fig


def _ci(m: float, lo: float, hi: float, pct: bool = False) -> str:
    """'m [lo, hi]' over seeds (the share in % of the KL); 'm (no interval)' from one seed."""
    f, u = (100.0, "%") if pct else (1.0, "")
    if not math.isfinite(m):
        return "—"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return f"{f * m:.3g}{u} (no interval)"
    return f"{f * m:.3g}{u} [{f * lo:.3g}, {f * hi:.3g}]"


def latent_section(run_dirs: Iterable[str | Path], out_dir: str | Path | None = None) -> str:
    """The report's probe section (templates/probe.html.j2): per kappa one aggregate figure and
    a line of numbers with intervals over seeds; every run's own block (probe.probe_html)
    folded in <details>. Writes <out_dir>/probe.csv (one row per file) and probe_by_kappa.csv
    (the aggregates)."""
    docs, bad = read_probes(run_dirs)
    docs = final_docs(docs)  # one probe per run, of its last weights (over training: latent.csv)
    kappas = []
    if docs:
        runs = per_run(docs)
        agg = aggregate(runs)
        if out_dir is not None:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            # probe.TABLE_COLS (share is its recovered_share: one name per thing in the file)
            runs[[c for c in TABLE_COLS if c in runs]].to_csv(Path(out_dir) / "probe.csv",
                                                              index=False)
            agg.to_csv(Path(out_dir) / "probe_by_kappa.csv", index=False)
        for _, a in agg.iterrows():
            g = runs[(runs["kappa_bits"] == a["kappa_bits"])
                     & (runs["latent_bits"] == a["latent_bits"])]
            k = kappa_label(a["kappa_bits"])
            kappas.append((a, k, png(kappa_figure(g, a), 90)))
            if out_dir is not None:
                (Path(out_dir) / f"probe_kappa{k}_H{a['latent_bits']}.png").write_bytes(
                    kappas[-1][2])
    return template("probe.html.j2").render(bad=bad, kappas=kappas, ci3=_ci,
                                            runs=[(d, probe_html(d)) for d in docs])
