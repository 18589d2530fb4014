"""The sweep's report card: what was asked, what ran, on what, at what cost, and the headline Δs,
as one HTML block (templates/report.html.j2) and one PNG (`report/summary.png`) a reviewer can
paste.

Modelled on nanochat's report card (the run's environment, data, cost and scores in one place).
Every line comes from the sweep's own files (manifest, config.yaml provenance and accounting,
metrics.jsonl final lines) through `SweepData`; a fact no file records reads "not recorded".
The headline Δs are the lead forest's rows of the first metric (validation CE when measured),
which are the paper-format tables' own numbers (analysis/lead.py).
"""

from __future__ import annotations

import math
from collections import Counter

import matplotlib
import matplotlib.pyplot as plt
import pandas as pd

from common.kappa import kappa_label

from .frame import SweepData
from .lead import IDENTICAL, ROUNDING, _fin, _rows, draw_forest, forest_height, lead_metrics

matplotlib.use("Agg")  # PNGs only, never a display

NOT_RECORDED = "not recorded"


def _si(x: float) -> str:
    if not _fin(x):
        return NOT_RECORDED
    for div, suf in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suf}"
    return f"{x:.3g}"


def question(data: SweepData) -> str:
    g = data.manifest.get("grid") or {}
    ks = ", ".join(kappa_label(k) for k in g.get("kappa_bits") or []) or "?"
    hs = ", ".join(str(h) for h in g.get("latent_bits") or []) or "?"
    budget = (f"{_si(g['tokens'])} tokens per run" if g.get("tokens")
              else f"{_si(g['flops'])} FLOPs per run" if g.get("flops") else "its budget")
    return (f"Does the Free Transformer (kappa {ks} bits, H = {hs}) beat a Llama-style baseline "
            f"of the same size, at equal tokens and at equal FLOPs? Preset "
            f"{g.get('preset', '?')}, {budget}.")


def facts(data: SweepData, forest: pd.DataFrame | None = None) -> list[tuple[str, str]]:
    """(label, text) lines of the card, in order."""
    m, c = data.manifest, data.cells
    g = m.get("grid") or {}
    out: list[tuple[str, str]] = [("question", question(data))]
    if c.empty:
        return out + [("cells", "the manifest lists no cells")]
    done = c[c["state"] == "done"]
    counts = Counter(c["arm"].astype(str))
    out.append(("arms", ", ".join(f"{a} ×{n}" for a, n in counts.items())
                + " (cells; docs/DESIGN.md says what each control matches)"))
    seeds = sorted(set(c["seed"].dropna().astype(int)))
    out.append(("cells", f"{len(c)} ({len(done)} done); seeds {', '.join(map(str, seeds))} "
                         f"(n = {len(seeds)})"))
    tok = c.get("tokenizer_sha256", pd.Series(dtype=object)).dropna().unique()
    vocab = c.get("vocab_size", pd.Series(dtype=float)).dropna().unique()
    sums = m.get("data_checksums") or {}
    data_txt = str(g.get("data", NOT_RECORDED))
    if sums:
        data_txt += " (" + ", ".join(f"{k.split(':')[0]} sha256 {v[:12]}" for k, v in
                                     sorted(sums.items())) + ")"
    tok_txt = (f"vocabulary {int(vocab[0])}" if len(vocab) == 1 else NOT_RECORDED) + (
        f", tokenizer sha256 {tok[0][:12]}" if len(tok) == 1 else
        f", {len(tok)} tokenizers" if len(tok) else "")
    out.append(("data, tokenizer", f"{data_txt}; {tok_txt}"))
    per = []
    for a, ga in done.groupby("arm", sort=False):
        t, f = ga["final_tokens"].astype(float), ga["final_flops"].astype(float)
        per.append(f"{a} {_si(t.mean())} tokens, {_si(f.mean())} FLOPs")
    out.append(("tokens, FLOPs per run (mean)", "; ".join(per) or NOT_RECORDED))
    commits = c.get("git_commit", pd.Series(dtype=object)).dropna().astype(str)
    dirty = c.get("git_dirty", pd.Series(dtype=object))
    n_dirty = int(dirty.fillna(False).astype(bool).sum()) if len(dirty) else 0
    n_known = int(dirty.notna().sum()) if len(dirty) else 0
    cm = ", ".join(x[:12] for x in commits.unique()) or str(m.get("git_commit") or "")[:12] \
        or NOT_RECORDED
    clean = (f"clean tree for all {n_known} runs" if n_known and not n_dirty else
             f"UNCOMMITTED CHANGES in {n_dirty} of {n_known} runs" if n_dirty else
             "tree state not recorded")
    out.append(("commit", f"{cm}; {clean}"))
    hosts = sorted(set(c.get("host", pd.Series(dtype=object)).dropna().astype(str)))
    thr = sorted(set(c.get("threads", pd.Series(dtype=float)).dropna().astype(int)))
    torch_v = sorted({(v or {}).get("torch") for v in c.get("versions", pd.Series(dtype=object))
                      if isinstance(v, dict) and (v or {}).get("torch")})
    launch = sorted(set(c.get("launcher", pd.Series(dtype=object)).dropna().astype(str)))
    local = m.get("local") if isinstance(m.get("local"), dict) else {}
    hw = (f"host {', '.join(hosts) or NOT_RECORDED}; {'/'.join(map(str, thr)) or '?'} "
          f"thread(s) per run; launcher {', '.join(launch) or m.get('launcher', '?')}"
          + (f", {local['jobs']} jobs at once" if local.get("jobs") else "")
          + (f"; torch {', '.join(torch_v)}" if torch_v else ""))
    out.append(("hardware", hw))
    wall = done["wall_s"].astype(float) if "wall_s" in done else pd.Series(dtype=float)
    threads = done["threads"].astype(float) if "threads" in done else pd.Series(dtype=float)
    core_h = float((wall * threads.fillna(1)).sum()) / 3600 if wall.notna().any() else math.nan
    gpu = any("+cu" in str(v) or "rocm" in str(v) for v in torch_v)  # the CUDA/ROCm builds
    sweep_wall = local.get("wall_s")
    cost = (f"sweep wall-clock {sweep_wall / 60:.0f} min; " if _fin(sweep_wall) else "") + (
        f"training {wall.sum() / 3600:.2f} h summed over runs" if wall.notna().any()
        else f"training time {NOT_RECORDED}")
    if gpu:  # the runs record their wall time, not their GPU count
        cost += "; GPU-hours = these hours x GPUs per run"
    elif wall.notna().any():
        cost += f", {core_h:.2f} core-hours (x threads per run); 0 GPU-hours (CPU runs)"
    out.append(("wall-clock, cost", cost + " (training only; evaluation and probes not "
                                           "included)"))
    if forest is not None and len(forest):
        out.append(("headline Δ", headline(forest)))
    return out


def headline(forest: pd.DataFrame) -> str:
    """The first lead metric's Δ per comparison, kappa by kappa, with the verdict."""
    task, metric = lead_metrics(forest)[0]
    sub = forest[(forest["task"] == task) & (forest["metric"] == metric)]
    parts = []
    for comp, g in sub.groupby("comparison", sort=False):
        ds = []
        for r in g.itertuples():
            k = f"κ={kappa_label(r.kappa_bits)} " if _fin(r.kappa_bits) else ""
            ds.append(k + ("0" if r.verdict in (IDENTICAL, ROUNDING) else f"{r.delta:+.3f}"))
        vs = list(dict.fromkeys(g["verdict"]))
        parts.append(f"{comp}: {', '.join(ds)} ({vs[0] if len(vs) == 1 else 'mixed'})")
    return f"{sub['label'].iloc[0]}, Δ in {sub['unit'].iloc[0]}: " + "; ".join(parts)


def summary_figure(lines: list[tuple[str, str]], forest: pd.DataFrame, name: str
                   ) -> tuple[plt.Figure, list[dict]]:
    """The card as one PNG: its lines above, the lead forest (first two metrics) below.
    Returns (figure, the forest points it drew, each with its numbers)."""
    import textwrap

    keys = lead_metrics(forest)[:2] if len(forest) else []
    drawn: list[dict] = []
    text = []
    for k, v in lines:
        wrapped = textwrap.wrap(v, 120) or [""]
        text.append(f"{k}: {wrapped[0]}")
        text += [" " * (len(k) + 2) + w for w in wrapped[1:]]
    n_text = len(text)
    w = 12.0
    h_text = 0.13 * n_text + 0.55
    h_fig = forest_height(len(_rows(forest, keys))) if keys else 0.0
    fig = plt.figure(figsize=(w, h_text + h_fig))
    fig.text(0.01, 1 - 0.25 / (h_text + h_fig), f"Free Transformer bench: sweep {name}",
             fontsize=11, weight="bold", va="top", family="sans-serif")
    fig.text(0.01, 1 - 0.5 / (h_text + h_fig), "\n".join(text), fontsize=7.2, va="top",
             family="monospace")
    if keys:
        # the forest drawn again into this figure's lower part (same function, same numbers)
        total = h_text + h_fig
        gs = fig.add_gridspec(1, len(keys), left=0.2, right=0.98, bottom=0.35 / total,
                              top=(h_fig - 0.45) / total, wspace=0.08)
        axes = [fig.add_subplot(gs[0, i]) for i in range(len(keys))]
        drawn = draw_forest(axes, forest, keys, values=True)
    return fig, drawn
