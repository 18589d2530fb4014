"""docs/STUDY.md (`make study-render`) from the study's committed tables in docs/study/ (what
`python -m pipelines.study` wrote, plus the measured inputs sizing.csv and bryanvine.csv): every
number is read from them or computed here from them; an absent table makes its section say
"not yet run", never 0.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from common import arms, benchmarks
from common.arms import BASELINE, FREE, FREE_ZCUT
from common.errors import UsageError
from common.latent_use import RULE, UNDETERMINED, use_state
from common.text import one_line

from .render import fmt, md, num, template
from .stats import (
    ALPHA,
    LEVEL,
    POWER,
    holm,
    identical,
    mean_ci,
    seed_delta,
    seed_diffs,
    seed_tost,
)
from .stats import mde as mde_of
from .tables import tost_margin

NOT_RUN = "not yet run"
FT_TASKS = tuple(b.task for b in benchmarks.by_group()[benchmarks.CODE_MATH] if b.task)
"""The paper's headline benchmarks (generative code and math), in its order."""
GOLD = benchmarks.gold_tasks(FT_TASKS)


def f4(x: object) -> str:
    """A measured value: 4 decimals; '?' when missing (never 0)."""
    return fmt(x, ".4f", "?")


def s4(x: object) -> str:
    """A signed difference: 4 decimals with its sign."""
    return fmt(x, "+.4f", "?")


def kappa_text(k: object) -> str:
    """kappa in bits as the grid writes it (0.5, 1, 2)."""
    v = num(k)
    return "?" if math.isnan(v) else f"{v:g}"


def _int(x: object) -> str:
    v = num(x)
    return str(int(v)) if math.isfinite(v) else "?"


def _truthy(x: object) -> bool:
    return str(x).strip().lower() in ("true", "1", "1.0")


def _flag(x: object) -> str:
    s = str(x).strip().lower()
    return "yes" if s in ("true", "1", "1.0") else "no" if s in ("false", "0", "0.0") else "?"


def _treatment(arm: object) -> bool:
    a = arms.find(arm)
    return a is not None and a.is_treatment


# ---- the endpoints, from per_seed.csv ---------------------------------------------------------
PRIMARY = ("val", "val_ce", BASELINE.name)
"""The study's one primary endpoint: honest validation CE (nats/token, Z from the prior), each
Free Transformer against the baseline at equal tokens; its Holm family is the kappas."""
SECONDARY = [*((t, "bpb", BASELINE.name) for t in GOLD), ("val", "val_ce", "baseline_plus1"),
             ("val", "val_ce", "baseline_flops")]
"""Tested, each (task, metric, reference) its own Holm family over the kappas."""
DESCRIPTIVE = [*((t, "bpb", "baseline_plus1") for t in GOLD),
               *((t, "bpb", "baseline_flops") for t in GOLD)]
"""Shown with intervals, never tested."""
REF_TEXT = {BASELINE.name: "baseline (equal tokens)",
            "baseline_plus1": "+1-layer control (equal tokens)",
            "baseline_flops": "baseline trained to the FT's FLOPs (equal FLOPs)"}
def _vals(ps: pd.DataFrame, task: str, metric: str, arm: str,
          kappa: float | None = None) -> pd.DataFrame:
    v = ps[(ps["task"] == task) & (ps["metric"] == metric) & (ps["arm"] == arm)]
    if kappa is not None:
        v = v[pd.to_numeric(v["kappa_bits"], errors="coerce") == kappa]
    return v[["seed", "value"]]


def _kappas(ps: pd.DataFrame) -> list[float]:
    return sorted(pd.to_numeric(ps.loc[ps["arm"].map(_treatment), "kappa_bits"],
                                errors="coerce").dropna().unique())


def family(ps: pd.DataFrame, task: str, metric: str, ref: str) -> list[dict]:
    """Each kappa against `ref` on one metric: the mean, the paired Δ with its t interval, the
    TOST against the metric's margin, Holm over the family, the verdict word."""
    margin = tost_margin("val_ce" if task == "val" else metric)
    rows = []
    r = _vals(ps, task, metric, ref)
    for k in _kappas(ps):
        t = _vals(ps, task, metric, FREE.name, k)
        if t.empty or r.empty:
            continue
        d, e = seed_delta(t, r, metric), seed_tost(t, r, margin)
        seeds, diffs = seed_diffs(t, r)
        mag = float(pd.concat([t["value"], r["value"]]).abs().max())
        m, lo, hi = mean_ci(t.groupby("seed")["value"].mean().to_numpy(float))
        rows.append({"column": f"FT k={kappa_text(k)}", "kappa": k, "mean": m, "lo": lo,
                     "hi": hi, "n": len(seeds), "d": d, "e": e, "margin": margin,
                     "identical": identical(diffs, mag)})
    padj = holm([math.nan if x["identical"] else x["d"].p for x in rows])
    m = int(pd.notna(padj).sum()) if len(rows) else 0
    for x, pa in zip(rows, padj, strict=True):
        x["p_holm"], x["m"] = pa, m
        sig = bool(x["d"].significant and math.isfinite(pa) and pa < ALPHA)
        x["verdict"] = ("identical" if x["identical"] else
                        ("worse" if x["d"].delta > 0 else "better") if sig else
                        "equivalent" if x["e"].equivalent else "inconclusive")
    return rows


def token_equivalent(ps: pd.DataFrame, sizing: pd.DataFrame | None, task: str,
                     metric: str) -> tuple[float, float, float]:
    """(extra tokens of the equal-FLOPs baseline as a fraction, its paired gain on the metric
    over the baseline, the margin as the gain of that fraction of extra tokens): the margin in
    training-token equivalents, from the study's own equal-FLOPs arm (linear in tokens)."""
    extra = _q(sizing, "flops_per_token_ft_h8") / _q(sizing, "flops_per_token_baseline") - 1
    _, diffs = seed_diffs(_vals(ps, task, metric, BASELINE.name),
                          _vals(ps, task, metric, "baseline_flops"))
    gain = float(diffs.mean()) if len(diffs) else math.nan
    margin = tost_margin("val_ce" if task == "val" else metric)
    return extra, gain, margin / gain * extra if gain > 0 else math.nan


def _label(task: str, metric: str) -> str:
    return ("validation CE (nats/token, prior Z)" if task == "val" else
            f"{task} (bits/byte)")


def _test_rows(ps: pd.DataFrame, fams: list[tuple[str, str, str]]) -> list[list[str]]:
    out = []
    for task, metric, ref in fams:
        for x in family(ps, task, metric, ref):
            d, e = x["d"], x["e"]
            dtxt = (f"{s4(d.delta)} (identical)" if x["identical"] else
                    f"{s4(d.delta)} [{s4(d.lo)}, {s4(d.hi)}]")
            etxt = "" if x["identical"] else (f"[{s4(e.lo)}, {s4(e.hi)}] vs ±{x['margin']:g}"
                                              if math.isfinite(e.lo) else "(no interval)")
            out.append([_label(task, metric), REF_TEXT[ref], x["column"],
                        f"{f4(x['mean'])} [{f4(x['lo'])}, {f4(x['hi'])}]", str(x["n"]), dtxt,
                        "" if x["identical"] else f"{f4(x['p_holm'])} (m = {x['m']})", etxt,
                        x["verdict"]])
    return out


TEST_COLS = ["metric", "reference", "column", f"mean [{LEVEL:.0%} t]", "n seeds",
             f"Δ vs reference [{LEVEL:.0%} t]", "Holm p (family)", "TOST 90% vs margin",
             "verdict"]


def signal_noise(ps: pd.DataFrame) -> dict[str, float]:
    """Signal and noise over the arms the primary comparison contrasts (the baseline and the
    kappas): the SD of their means against the mean within-arm seed SD."""
    task, metric, ref = PRIMARY
    groups = [_vals(ps, task, metric, ref)["value"]]
    groups += [_vals(ps, task, metric, FREE.name, k)["value"] for k in _kappas(ps)]
    means = pd.Series([g.mean() for g in groups])
    noise = math.sqrt(pd.Series([g.var(ddof=1) for g in groups]).mean())  # lead.py's pooling
    return {"n_kappas": len(groups) - 1, "signal": means.std(ddof=1), "noise": noise}


def results_section(ps: pd.DataFrame | None, sizing: pd.DataFrame | None) -> dict | None:
    """The tested and descriptive comparisons; None without per_seed.csv."""
    if ps is None or ps.empty:
        return None
    task, metric, ref = PRIMARY
    margins = []
    for t, mt in ((task, metric), *((g, "bpb") for g in GOLD)):
        _, g_, p_ = token_equivalent(ps, sizing, t, mt)
        margins.append((_label(t, mt), tost_margin("val_ce" if t == "val" else mt), p_, g_))
    rows = []
    for t, mt, rf in DESCRIPTIVE:
        for x in family(ps, t, mt, rf):
            rows.append([_label(t, mt), REF_TEXT[rf], x["column"],
                         f"{s4(x['d'].delta)} [{s4(x['d'].lo)}, {s4(x['d'].hi)}]"])
    for arm in ("baseline_plus1", FREE_ZCUT.name):
        _, dd = seed_diffs(_vals(ps, task, metric, arm), _vals(ps, task, metric, ref))
        d = seed_delta(_vals(ps, task, metric, arm), _vals(ps, task, metric, ref), metric)
        same = identical(dd, float(_vals(ps, task, metric, ref)["value"].abs().max()))
        rows.append([_label(task, metric), REF_TEXT[ref], f"{arm} (control)",
                     f"{s4(d.delta)} (identical: the check)" if same else
                     f"{s4(d.delta)} [{s4(d.lo)}, {s4(d.hi)}]"])
    return {"extra": token_equivalent(ps, sizing, task, metric)[0], "margins": margins,
            "primary": md(pd.DataFrame(_test_rows(ps, [PRIMARY]), columns=TEST_COLS)),
            "signal": signal_noise(ps),
            "secondary": md(pd.DataFrame(_test_rows(ps, SECONDARY), columns=TEST_COLS)),
            "descriptive": md(pd.DataFrame(rows, columns=["metric", "reference", "column",
                                                          f"Δ [{LEVEL:.0%} t]"]))}


def likelihood_section(lik: pd.DataFrame | None) -> dict | None:
    """The Free Transformers' bounds against their seed's baseline, per kappa over seeds."""
    if lik is None or lik.empty:
        return None
    rows = []
    for col, g in lik.groupby("column", sort=True):
        cells = [col, str(len(g))]
        for c in ("gap_nats_per_token", "tightest_gap_nats_per_token"):
            m, lo, hi = mean_ci(pd.to_numeric(g[c], errors="coerce").to_numpy(float))
            cells.append(f"{s4(m)} [{s4(lo)}, {s4(hi)}]")
        cells += [", ".join(sorted(set(map(str, g["tightest"])))),
                  f4(pd.to_numeric(g["kl_nats_per_token"], errors="coerce").mean()),
                  f4(pd.to_numeric(g["baseline_bpb"], errors="coerce").mean())]
        rows.append(cells)
    return {"k": _int(lik["gap_k"].iloc[0]), "n_tok": _int(lik["n_tokens"].iloc[0]),
            "table": md(pd.DataFrame(rows, columns=[
                "column", "n seeds", "gap, IWAE [95% t]", "gap, tightest [95% t]", "tightest",
                "KL nats/token", "baseline bits/byte (these rows)"]))}


def _share(r: pd.Series) -> str:
    v, lo, hi = (num(r.get(k)) + 0.0 for k in ("recovered_share", "recovered_share_lo",
                                                "recovered_share_hi"))  # + 0.0: no "-0.00%"
    if not math.isfinite(v):
        return "?"
    iv = f" [{100 * lo:+.2f}%, {100 * hi:+.2f}%]" if math.isfinite(lo) and math.isfinite(hi) \
        else ""
    return f"{100 * v:+.2f}%{iv}"


def _state(r: pd.Series) -> str:
    """common.latent_use's state of a latent.csv row; a row with no share is undetermined."""
    return use_state(*(num(r.get(k)) for k in ("recovered_share", "recovered_share_lo",
                                               "recovered_share_hi", "kl_bits",
                                               "information_bits"))) or UNDETERMINED


def latent_section(lat: pd.DataFrame | None) -> dict | None:
    """Decoder-side latent use per run (latent.csv, with each run's seed): the recovered share
    of the KL, the KL split into information and marginal bias, the state by the probe's
    rule."""
    if lat is None or lat.empty:
        return None
    lat = lat.assign(state=[_state(r) for _, r in lat.iterrows()])
    fin = lat[lat["final"].map(_truthy)].sort_values(["arm", "kappa_bits", "seed"], kind="stable")
    table = md(pd.DataFrame([[r["arm"], kappa_text(r["kappa_bits"]), _int(r["seed"]),
                              _int(r["step"]), f4(r["kl_bits"]), f4(r["information_bits"]),
                              f4(r["marginal_bias_bits"]), _share(r), r["state"]]
                             for _, r in fin.iterrows()],
                            columns=["arm", "kappa (bits)", "seed", "step", "KL (bits/token)",
                                     "information", "marginal bias",
                                     "recovered share [95% interval]", "state"]))
    groups = []
    for (arm, k), g in fin.groupby(["arm", "kappa_bits"], sort=True):
        st, sh = g["state"], pd.to_numeric(g["recovered_share"], errors="coerce")
        groups.append((arm, kappa_text(k), len(g), int((st == "dead").sum()),
                       int((st == "used").sum()), int((st == UNDETERMINED).sum()),
                       sh.min(), sh.max(), sh.mean()))
    training = None
    if (~lat["final"].map(_truthy)).any():
        rows = [[arm, kappa_text(k), _int(step), len(g),
                 f"{100 * pd.to_numeric(g['recovered_share'], errors='coerce').mean():+.2f}%",
                 f"{100 * pd.to_numeric(g['recovered_share'], errors='coerce').max():+.2f}%",
                 int((g["state"] == "dead").sum()), int((g["state"] == "used").sum())]
                for (arm, k, step), g in lat.groupby(["arm", "kappa_bits", "step"], sort=True)]
        training = md(pd.DataFrame(rows, columns=["arm", "kappa (bits)", "step", "runs",
                                                  "recovered share, mean", "max", "dead",
                                                  "used"]))
    return {"table": table, "groups": groups, "training": training,
            "used": int((fin["state"] == "used").sum()),
            "n_ft": int(fin["arm"].map(_treatment).sum())}


def encoder_section(probe: pd.DataFrame | None, cells: list[dict]) -> dict | None:
    """KL, active bits (KL > 0.01 bit to the uniform prior, biased bits included), the
    over-budget flag."""
    if probe is None or probe.empty:
        return None
    seed_of = {str(c.get("run_id")): c.get("seed") for c in cells}
    p = probe.assign(seed=[seed_of.get(str(r)) for r in probe["run_id"]]).sort_values(
        ["kappa_bits", "seed"], na_position="last")
    flag = "over_budget" if "over_budget" in p else "collapse"  # the older files' name
    flags = p[flag].map(_flag)
    return {"table": md(pd.DataFrame([[kappa_text(r["kappa_bits"]), _int(r["seed"]),
                                       f4(r["kl_bits"]), _int(r["n_active"]), _flag(r[flag])]
                                      for _, r in p.iterrows()],
                                     columns=["kappa (bits)", "seed", "KL (bits/token)",
                                              "active bits (encoder side)", "KL over budget"])),
            "kappas": [(kappa_text(k), int((f == "yes").sum()), int((f != "?").sum()))
                       for k, f in flags.groupby(p["kappa_bits"], sort=True)]}


def zcut_section(ps: pd.DataFrame | None) -> dict | None:
    """The per-seed differences that show the Z-cut control trains the baseline."""
    if ps is None or ps.empty or not (ps["arm"] == FREE_ZCUT.name).any():
        return None
    seeds, d = seed_diffs(_vals(ps, *PRIMARY[:2], FREE_ZCUT.name), _vals(ps, *PRIMARY))
    return {"max": abs(d).max() if len(d) else math.nan,  # no shared seed: missing, not 0
            "equal": int((d == 0).sum()), "n": len(seeds)}


def their_51m(bv51: pd.DataFrame | None) -> dict[str, str]:
    """bryanvine's 51M sweep (docs/alive/kappa/bryanvine_51M.csv, quoted from their repository
    at a named commit) in our definitions, one text per side-table key."""
    if bv51 is None or bv51.empty:
        return {}
    is_base = bv51["config"] == "baseline"  # their labels: "baseline", else a Free Transformer
    base = float(bv51.loc[is_base, "elbo"].iloc[0])
    f = bv51[~is_base].sort_values("kappa_bits")
    k = [kappa_text(x) for x in f["kappa_bits"]]
    share = (f["prior_ce_k1"] - f["post_ce"]) / (f["kl_bits_per_token"] * math.log(2))
    gap = f["elbo"] - base
    low = f.loc[gap.idxmin(), "kappa_bits"]
    return {
        "elbo_gap": ", ".join(f"{a}: {b:+.3f}" for a, b in zip(k, gap, strict=True)),
        "prior_ce_gap": ", ".join(f"{a}: {b:+.3f}" for a, b in
                                  zip(k, f["prior_ce_k1"] - base, strict=True)),
        "share": ", ".join(f"{a}: {b:.2f}" for a, b in zip(k, share, strict=True)),
        "kl": ", ".join(f"{a}: {b:.3f}" for a, b in zip(k, f["kl_bits_per_token"], strict=True)),
        "death": "; ".join(f"kappa {kappa_text(kk)}: " + str(x).split("(", 1)[1].rstrip(")")
                           for kk, x in zip(f["kappa_bits"], f["source"], strict=True)
                           if "collapsed" in str(x)),
        "best_kappa": (f"the ELBO gap rises with kappa ({', '.join(f'{b:+.3f}' for b in gap)}): "
                       f"lowest at kappa {kappa_text(low)}"),
        "n": f"{int(f['n_seeds'].min())} seeds per kappa (means; unpaired)"}


def ours(key: str, ps: pd.DataFrame | None, lat: pd.DataFrame | None,
         probe: pd.DataFrame | None) -> str:
    """Our side of one bryanvine row, computed from our tables; NOT_RUN when they lack it."""
    if ps is None or ps.empty:
        return NOT_RUN
    fam = family(ps, *PRIMARY)
    if key == "prior_ce_gap":
        return "the row above: our val_ce is the prior-Z CE"
    if key == "elbo_gap":
        return ("latent dead in every run, so its tightest bound is the prior-Z CE; Δ val_ce "
                "vs the baseline, paired over seeds: " + "; ".join(
                    f"{x['column'].removeprefix('FT ')}: {s4(x['d'].delta)} "
                    f"[{s4(x['d'].lo)}, {s4(x['d'].hi)}] ({x['verdict']})" for x in fam))
    if key == "share" and lat is not None and len(lat):
        fin = lat[lat["final"].map(_truthy) & (lat["arm"] == FREE.name)]
        return "; ".join(f"k={kappa_text(k)}: {pd.to_numeric(g['recovered_share']).min():.4f} "
                         f"to {pd.to_numeric(g['recovered_share']).max():.4f}"
                         for k, g in fin.groupby("kappa_bits"))
    if key == "kl" and probe is not None and len(probe):
        return "; ".join(f"k={kappa_text(k)}: {pd.to_numeric(g['kl_bits']).mean():.3f} (mean "
                         f"of {len(g)})" for k, g in probe.groupby("kappa_bits"))
    if key == "death" and lat is not None and len(lat):
        st = [_state(r) for _, r in lat[lat["final"].map(_truthy)
                                        & (lat["arm"] == FREE.name)].iterrows()]
        return (f"dead from the decoder's side in {st.count('dead')} of {len(st)} runs, while "
                "the encoder still spends KL (so not their kind of death, KL near 0)")
    if key == "best_kappa":
        return ("none identified: no kappa differs from the baseline beyond the intervals "
                "(the primary endpoint above)")
    return NOT_RUN


def bryanvine_section(bv: pd.DataFrame | None, bv51: pd.DataFrame | None,
                      ps: pd.DataFrame | None, probe: pd.DataFrame | None,
                      lat: pd.DataFrame | None = None) -> str | None:
    """Their findings beside ours (a table), None when either side's file is absent."""
    theirs = their_51m(bv51)
    if bv is None or bv.empty or not theirs:
        return None
    rows = [[r["finding"], theirs.get(str(r["key"]), r.get("theirs", "")), theirs["n"],
             ours(str(r["key"]), ps, lat, probe)] for _, r in bv.iterrows()]
    return md(pd.DataFrame(rows, columns=["finding", "theirs (51M; nats/token unless named)",
                                          "their n", "ours"]))


def _q(sizing: pd.DataFrame | None, name: str) -> float:
    if sizing is None or "quantity" not in sizing.columns:
        return math.nan
    v = sizing.loc[sizing["quantity"] == name, "value"]
    return num(v.iloc[0]) if len(v) else math.nan


def planned_mde(sizing: pd.DataFrame | None, meta: dict) -> tuple[float, float, int]:
    """(pilot SD of validation nats/token, planned MDE, seeds): the MDE of a paired t over the
    study's seeds if the per-seed difference had SD sqrt(2) x the pilot's (no credit for
    pairing)."""
    n, s = len(str(meta.get("seeds", "")).split()), _q(sizing, "pilot_sd_val_ce")
    if not math.isfinite(s) or n < 2:
        return math.nan, math.nan, n
    return s, mde_of(math.sqrt(2) * s / math.sqrt(n), n - 1), n


def realised_sd(ps: pd.DataFrame | None, sizing: pd.DataFrame | None) -> dict | None:
    """The pilot SD against what the study realised (the baseline's seed SD and the per-seed
    differences' SD), both of validation nats/token."""
    if ps is None or ps.empty or sizing is None:
        return None
    base = _vals(ps, *PRIMARY)
    b = base.set_index("seed")["value"]
    if len(b) < 2:
        return None
    pilot, sd = _q(sizing, "pilot_sd_val_ce"), float(b.std(ddof=1))
    diffs = []
    for k in _kappas(ps):
        _, d = seed_diffs(_vals(ps, *PRIMARY[:2], FREE.name, k), base)
        if len(d) >= 2:
            diffs.append(float(d.std(ddof=1)))
    return {"sd": sd, "n": len(b), "pilot": pilot, "sqrt2_pilot": math.sqrt(2) * pilot,
            "ratio": sd / pilot if math.isfinite(pilot) and pilot else None,
            "diffs": diffs if math.isfinite(pilot) else []}


def sizing_section(sizing: pd.DataFrame | None, meta: dict,
                   per_seed: pd.DataFrame | None = None) -> dict | None:
    """sizing.csv as a table, the planned MDE, the realised SD, the training time and budget."""
    if sizing is None or sizing.empty:
        return None
    val = (lambda v: "not measured" if not math.isfinite(v) else f4(v) if abs(v) < 1e5
           else f"{v:.4g}")
    sd, m, n = planned_mde(sizing, meta)
    rate = _q(sizing, "flops_per_token_baseline") * _q(sizing, "quiet_tokens_per_s_baseline")
    tw = _q(sizing, "sweep_total_flops") / rate / num(meta.get("cores")) / 60
    cells, cores, budget = (num(meta.get(k)) for k in ("n_cells_planned", "cores", "budget_min"))
    return {"table": md(pd.DataFrame([[r["quantity"], val(num(r["value"])), r["unit"], r["note"]]
                                      for _, r in sizing.iterrows()],
                                     columns=["quantity", "value", "unit",
                                              "how it was measured"])),
            "sd": sd, "mde": m if math.isfinite(m) else None, "n": n,
            "realised": realised_sd(per_seed, sizing),
            "train_min": tw if math.isfinite(tw) else None,
            "budget": {"min": budget, "cores": _int(cores), "cells": int(cells),
                       "per_run": budget * cores / cells} if math.isfinite(cells) and cells
            else None}


def setup_section(meta: dict) -> dict:
    """The data, the tokenizer and the model size, from the runs' own records."""
    st = meta.get("setup") or {}
    d, m, b, ft = (st.get(k) or {} for k in ("data", "model", "baseline", "ft"))
    return {"d": d, "m": m, "b": b, "ft": ft,
            "checksums": ", ".join(str(c)[:12] for c in d.get("checksums") or []) or "?"}


def provenance_section(ps: pd.DataFrame | None) -> dict | None:
    if ps is None or ps.empty:
        return None
    runs = ps.drop_duplicates("run_id")
    dirty = runs[runs["git_dirty"].map(_truthy)]
    return {"rows": len(ps), "runs": len(runs),
            "commits": sorted({str(c)[:7] for c in runs["git_commit"].dropna()}),
            "dirty": sorted(map(str, dirty["run_id"]))}


def _read_csv(d: Path, name: str) -> pd.DataFrame | None:
    p = d / name
    if not p.is_file():
        return None
    try:
        return pd.read_csv(p)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise UsageError(f"{p}: unreadable ({one_line(e)})") from None


def render(tables: Path) -> str:
    """The Markdown of docs/STUDY.md from the files in `tables`."""
    mp = tables / "study.json"
    if not mp.is_file():
        raise UsageError(f"{mp}: missing; run `python -m pipelines.study` (or `... docs`) first")
    try:
        meta = json.loads(mp.read_text(encoding="utf-8"))
        cp = tables / "cells.json"
        cells = json.loads(cp.read_text(encoding="utf-8")) if cp.is_file() else []
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{tables}: unreadable JSON ({one_line(e)})") from None
    t = {n: _read_csv(tables, f"{n}.csv") for n in (
        "probe", "sizing", "bryanvine", "per_seed", "latent", "likelihood")}
    ps = t["per_seed"]
    bv51 = tables.parent / "alive" / "kappa" / "bryanvine_51M.csv"
    _, m, n = planned_mde(t["sizing"], meta)
    return template("study.md.j2").render(
        meta=meta, not_run=NOT_RUN, f4=f4, setup=setup_section(meta),
        sizing=sizing_section(t["sizing"], meta, ps), results=results_section(ps, t["sizing"]),
        mde={"m": m, "n": n, "alpha": f"{ALPHA:.0%}", "power": f"{POWER:.0%}"},
        lik=likelihood_section(t["likelihood"]), zcut=zcut_section(ps),
        latent=latent_section(t["latent"]), dead_rule=RULE,
        encoder=encoder_section(t["probe"], cells),
        bryanvine=bryanvine_section(t["bryanvine"], pd.read_csv(bv51) if bv51.is_file() else None,
                                    ps, t["probe"], t["latent"]),
        prov=provenance_section(ps)).rstrip() + "\n"
