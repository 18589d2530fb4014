"""docs/STUDY.md from the study's committed tables (docs/study/), by a command:

    python -m analysis.study render [--tables docs/study] [--out docs/STUDY.md]

Every number comes from a file in the tables directory (written by `python -m pipelines.study`:
study.json, cells.json, the report's table_tokens/table_flops/likelihood/probe/latent/per_seed
CSVs; and the two measured inputs, sizing.csv and bryanvine.csv, which say where each number
came from), or is computed here from them (the perplexity ratio, the planned MDE, the counts).
An absent table makes its section say "not yet run", never 0; bad input is one line, exit 2,
nothing written.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pandas as pd

from common import arms, benchmarks
from common.arms import BASELINE, FREE, FREE_ZCUT
from common.errors import UsageError, cli
from common.io import atomic_write_text
from common.latent_use import (
    DEAD_INFO_BITS,
    DEAD_SHARE,
    USED_KL_BITS,
    USED_SHARE,
    USED_SHARE_LO,
    use_state,
)
from common.text import one_line

from .render import fmt, md, num
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
VERDICT_RULE = ("One verdict word per row: **identical** (every seed's paired difference is 0 "
                "up to float32 rounding: no test), **better** / **worse** (the paired t over "
                "seeds is significant after Holm within the row's family), **equivalent** (not "
                "significant, and the TOST's 90% interval lies inside ±margin), "
                "**inconclusive** otherwise. An interval that merely includes 0 is never read "
                "as equality.")


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


def signal_noise(ps: pd.DataFrame) -> str:
    """Signal and noise over the arms the primary comparison contrasts (the baseline and the
    kappas): the SD of their means against the mean within-arm seed SD."""
    task, metric, ref = PRIMARY
    groups = [_vals(ps, task, metric, ref)["value"]]
    groups += [_vals(ps, task, metric, FREE.name, k)["value"] for k in _kappas(ps)]
    means = pd.Series([g.mean() for g in groups])
    noise = math.sqrt(pd.Series([g.var(ddof=1) for g in groups]).mean())  # lead.py's pooling
    return (f"Signal and noise over the arms the primary comparison contrasts (the baseline and "
            f"the {len(groups) - 1} kappas): the SD of their means is {means.std(ddof=1):.4f} "
            f"nats/token against a pooled seed SD of {noise:.4f} (ratio "
            f"{means.std(ddof=1) / noise:.2f}): the arms differ "
            f"{'less' if means.std(ddof=1) < noise else 'more'} than seeds do. (The "
            "report's signal_noise.csv spreads over every arm, the equal-FLOPs control "
            "included, whose extra tokens alone move the CE by more than the seeds do.)")


def results_section(ps: pd.DataFrame | None, sizing: pd.DataFrame | None) -> list[str]:
    out = ["## Results", ""]
    if ps is None or ps.empty:
        return out + [f"{NOT_RUN} (docs/study/per_seed.csv absent).", ""]
    task, metric, ref = PRIMARY
    extra, gain, pct = token_equivalent(ps, sizing, task, metric)
    margins = []
    for t, mt in ((task, metric), *((g, "bpb") for g in GOLD)):
        _, g_, p_ = token_equivalent(ps, sizing, t, mt)
        margins.append(f"{_label(t, mt)} ±{tost_margin('val_ce' if t == 'val' else mt):g}, "
                       f"the gain of {100 * p_:.1f}% more training tokens (the equal-FLOPs "
                       f"baseline gains {g_:.4f})")
    out += [
        "Every number below is computed by `make study-render` from "
        "[docs/study/per_seed.csv](study/per_seed.csv) (each run's value of each metric); the "
        "report's own tables (table_tokens.csv, table_flops.csv) hold the same Δs. Δ = the "
        "mean over seeds of (column - reference), paired by seed, with a 95% t interval over "
        "seeds. " + VERDICT_RULE, "",
        f"The equivalence margins, one per metric, stated before the runs in nats and bits "
        f"(analysis/tables.py TOST_MARGIN) and here in training-token equivalents from the "
        f"study's own equal-FLOPs arm, which trained {100 * extra:.1f}% more tokens than the "
        f"baseline (the Free Transformer's extra FLOPs per token; sizing.csv), paired over "
        f"seeds, taken as linear in tokens: " + "; ".join(margins) + ".", "",
        "### The primary endpoint", "",
        "Honest validation CE (Z from the prior), each Free Transformer against the baseline "
        "at equal tokens (the paper's comparison). The latent is dead in every run (below), so "
        "the prior-Z CE is the tightest honest bound these models have (likelihood.csv's "
        "'tightest'): the ELBO, the endpoint of a study whose latent lives, adds the unused "
        "KL. Holm family: the kappas.", "",
        md(pd.DataFrame(_test_rows(ps, [PRIMARY]), columns=TEST_COLS)), "",
        signal_noise(ps), "",
        "### Secondary endpoints", "",
        "Each row's Holm family is its metric and reference over the kappas. Bits per byte of "
        "validation (`val_bpb`) is the validation CE in other units, not a second test; "
        "pass@1 and exact match are 0 for every arm and seed (not compared).", "",
        md(pd.DataFrame(_test_rows(ps, SECONDARY), columns=TEST_COLS)), "",
        "### Descriptive (no test)", "",
        "The gold-answer bits per byte against the two controls, and the controls against the "
        "baseline (the Z-cut's rows are the check of the next-but-one section, shown once).",
        ""]
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
    return out + [md(pd.DataFrame(rows, columns=["metric", "reference", "column",
                                                 f"Δ [{LEVEL:.0%} t]"])), ""]


def mde_section(meta: dict, sizing: pd.DataFrame | None) -> list[str]:
    sd, m, n = planned_mde(sizing, meta)
    return ["## What the data can and cannot say", "",
            f"The design's resolution is its planned minimum detectable effect, {f4(m)} "
            f"nats/token with {n} seeds (two-sided {ALPHA:.0%}, {POWER:.0%} power; Why this "
            "size). An 'inconclusive' row does not show the arms equal; only 'equivalent' "
            "does, against the margins above. Per-row detectable effects computed from the "
            "realised seed SD would be post-hoc power, which says nothing the interval does not: "
            "the intervals are the evidence.", ""]


def likelihood_section(lik: pd.DataFrame | None) -> list[str]:
    """The Free Transformers' bounds against their seed's baseline, per kappa over seeds."""
    out = ["## Honest likelihood: the bounds per kappa", ""]
    if lik is None or lik.empty:
        return out + [f"{NOT_RUN} (docs/study/likelihood.csv absent or empty).", ""]
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
    n_tok = _int(lik["n_tokens"].iloc[0])
    return out + [
        "Free Transformer minus its seed's baseline (exact), nats/token, on the same "
        f"validation rows, mean over seeds with a 95% t interval: the IWAE bound at its "
        f"largest k (k = {_int(lik['gap_k'].iloc[0])}) and the tightest of the estimates "
        "measured (here the prior-Z CE, which for a dead latent is tighter than the encoder's "
        "proposal). Both are upper bounds on the true gap. The posterior-Z CE leaks and is "
        f"not shown. These files cover only the first {n_tok} validation tokens (8 rows), not "
        "the full set: the baseline's bits per byte on them (last column) is far from its "
        "full-set value (val_bpb above); `make study` now measures all 64 "
        "(pipelines/study.py), but the study's checkpoints are not on this machine, so the "
        "committed table is the 8-row one.", "",
        md(pd.DataFrame(rows, columns=["column", "n seeds", "gap, IWAE [95% t]",
                                       "gap, tightest [95% t]", "tightest", "KL nats/token",
                                       "baseline bits/byte (these rows)"])), ""]


def _share(r: pd.Series) -> str:
    v, lo, hi = (num(r.get(k)) + 0.0 for k in ("recovered_share", "recovered_share_lo",
                                                "recovered_share_hi"))  # + 0.0: no "-0.00%"
    if not math.isfinite(v):
        return "?"
    iv = f" [{100 * lo:+.2f}%, {100 * hi:+.2f}%]" if math.isfinite(lo) and math.isfinite(hi) \
        else ""
    return f"{100 * v:+.2f}%{iv}"


def _seed_of(cells: list[dict]) -> dict[str, object]:
    return {str(c.get("run_id")): c.get("seed") for c in cells}


def _seed_text(sd: object) -> str:
    return "?" if sd is None or sd != sd else str(int(sd))  # type: ignore[arg-type]


DEAD_RULE = (f"dead = the upper end of the recovered share's 95% interval under {DEAD_SHARE}, or "
             f"information under {DEAD_INFO_BITS} bit/token (the probe's rule, unchanged since "
             f"these files were written); used = share >= {USED_SHARE}, its lower end >= "
             f"{USED_SHARE_LO:.2f}, KL >= {USED_KL_BITS} bit; otherwise undetermined")


def _state(r: pd.Series) -> str:
    """common.latent_use's state of a latent.csv row; a row with no share is undetermined."""
    return use_state(*(num(r.get(k)) for k in ("recovered_share", "recovered_share_lo",
                                               "recovered_share_hi", "kl_bits",
                                               "information_bits"))) or "undetermined"


def latent_section(lat: pd.DataFrame | None, probe: pd.DataFrame | None,
                   cells: list[dict]) -> list[str]:
    """Decoder-side latent use per run (latent.csv): the recovered share of the KL, the KL
    split into information and marginal bias, the state by the probe's rule."""
    out = ["## The latent, measured on the decoder's side", ""]
    if lat is None or lat.empty:
        return out + [f"{NOT_RUN} (docs/study/latent.csv absent).", ""] + \
            _encoder_side(probe, cells)
    lat = lat.assign(state=[_state(r) for _, r in lat.iterrows()])
    fin = lat[lat["final"].map(_truthy)].assign(
        seed_=lambda f: [_seed_of(cells).get(str(r)) for r in f["run_id"]])
    fin = fin.sort_values(["arm", "kappa_bits", "seed_"], kind="stable")
    out += ["The latent is **dead** when the decoder ignores Z (whatever the encoder spends) "
            "and **used** when the decoder turns the KL into lower cross-entropy. The probe "
            "(docs/PROBE.md) measures it on the decoder's side: the *recovered share* is (CE "
            "with prior Z - CE with posterior Z) / KL, both in nats per token; the KL to the "
            "uniform prior splits into the *information* Z carries about the text and the "
            "*marginal bias* (bits biased the same way on every token, which carry nothing). "
            "An exact latent model (decoder Bayes-consistent with its encoder) has a share of "
            "at least 2, so the share says used or dead, never more; whether generation from "
            "the prior breaks is judged from samples only (experiments/eval/samples.py). "
            f"States: {DEAD_RULE}.", "",
            md(pd.DataFrame([[r["arm"], kappa_text(r["kappa_bits"]), _seed_text(r["seed_"]),
                              _int(r["step"]), f4(r["kl_bits"]), f4(r["information_bits"]),
                              f4(r["marginal_bias_bits"]), _share(r), r["state"]]
                             for _, r in fin.iterrows()],
                            columns=["arm", "kappa (bits)", "seed", "step", "KL (bits/token)",
                                     "information", "marginal bias",
                                     "recovered share [95% interval]", "state"])), ""]
    for (arm, k), g in fin.groupby(["arm", "kappa_bits"], sort=True):
        st, sh = g["state"], pd.to_numeric(g["recovered_share"], errors="coerce")
        out.append(f"- {arm} kappa {kappa_text(k)}: dead in {int((st == 'dead').sum())} of "
                   f"{len(g)}, used in {int((st == 'used').sum())}, undetermined in "
                   f"{int((st == 'undetermined').sum())}; recovered share {100 * sh.min():+.2f}% "
                   f"to {100 * sh.max():+.2f}% (mean {100 * sh.mean():+.2f}%).")
    if (~lat["final"].map(_truthy)).any():
        rows = [[arm, kappa_text(k), _int(step), len(g),
                 f"{100 * pd.to_numeric(g['recovered_share'], errors='coerce').mean():+.2f}%",
                 f"{100 * pd.to_numeric(g['recovered_share'], errors='coerce').max():+.2f}%",
                 int((g["state"] == "dead").sum()), int((g["state"] == "used").sum())]
                for (arm, k, step), g in lat.groupby(["arm", "kappa_bits", "step"], sort=True)]
        out += ["", "Over training (the evaluation checkpoints probed the same way; figure: "
                "[latent_over_training.png](study/latent_over_training.png)):", "",
                md(pd.DataFrame(rows, columns=["arm", "kappa (bits)", "step", "runs",
                                               "recovered share, mean", "max", "dead", "used"]))]
    used = int((fin["state"] == "used").sum())
    out += ["", f"Free Transformers whose decoder uses Z: {used} of "
            f"{int(fin['arm'].map(_treatment).sum())}. "
            + ("So the comparisons above set the baseline against a Free Transformer whose "
               "decoder ignores its latent: they say nothing yet about the paper's mechanism, "
               "only what carrying an unused encoder costs at this size (docs/ALIVE.md trains "
               "longer until the latent lives)." if used == 0 else
               "The comparisons mix runs that use Z with runs that do not."), ""]
    return out + _encoder_side(probe, cells)


def _encoder_side(probe: pd.DataFrame | None, cells: list[dict]) -> list[str]:
    """KL, active bits (KL > 0.01 bit to the uniform prior, biased bits included), the
    over-budget flag."""
    out = ["### Encoder side: KL and active bits (probe.csv)", ""]
    if probe is None or probe.empty:
        return out + [f"{NOT_RUN} (docs/study/probe.csv absent).", ""]
    p = probe.assign(seed=[_seed_of(cells).get(str(r)) for r in probe["run_id"]]).sort_values(
        ["kappa_bits", "seed"], na_position="last")
    flag = "over_budget" if "over_budget" in p else "collapse"  # the older files' name
    out += ["An active bit is one whose KL to the uniform prior exceeds 0.01 bit; that counts "
            "biased bits too, so a bit can be active while the decoder ignores it. Over budget: "
            "the KL exceeds kappa by more than max(kappa/2, 0.1 bit) and the decoder cashes "
            "in more than half of it (the encoder's side of the paper's collapse; it says "
            "nothing about samples).", "",
            md(pd.DataFrame([[kappa_text(r["kappa_bits"]), _seed_text(r["seed"]),
                              f4(r["kl_bits"]), _int(r["n_active"]), _flag(r[flag])]
                             for _, r in p.iterrows()],
                            columns=["kappa (bits)", "seed", "KL (bits/token)",
                                     "active bits (encoder side)", "KL over budget"])), ""]
    for k, g in p.groupby("kappa_bits", sort=True):
        flags = g[flag].map(_flag)
        out.append(f"- kappa {kappa_text(k)}: over budget in {int((flags == 'yes').sum())} of "
                   f"{int((flags != '?').sum())} seeds.")
    return out + [""]


def zcut_section(ps: pd.DataFrame | None) -> list[str]:
    """Why the Z-cut control trains the baseline, with the per-seed differences that show it."""
    out = ["## The Z-cut control trains the baseline", ""]
    if ps is None or ps.empty or not (ps["arm"] == FREE_ZCUT.name).any():
        return out + [f"{NOT_RUN} (no free_zcut rows in docs/study/per_seed.csv).", ""]
    v = ps[(ps["task"] == "val") & (ps["metric"] == "val_ce")]
    z = v[v["arm"] == FREE_ZCUT.name].set_index("seed")["value"]
    b = v[v["arm"] == BASELINE.name].set_index("seed")["value"]
    common = sorted(set(z.index) & set(b.index))
    d = (z[common] - b[common]).abs()
    return out + [
        "The Z-cut arm (`free_zcut`, `CONTROLS=zcut`) is the Free Transformer with its "
        "encoder, KL and extra block kept and Z multiplied by 0 before it enters block L/2: "
        "the control the paper's reviewers asked for, separating \"the latent helps\" from "
        "\"the extra block helps\". Here it trains the baseline: with Z cut, the encoder's "
        "only gradient is the free-bits penalty max(0, KL - kappa), which is 0 while the KL "
        "stays under kappa, and the near-uniform initial encoder starts there; so the shared "
        "lower blocks never feel the encoder, the decoder is the baseline's, and both see "
        "the same data in the same order. The runs agree to float32 rounding, not bit for "
        f"bit: validation CE differs from its seed's baseline by at most {d.max():.2g} "
        f"nats/token ({int((d == 0).sum())} of {len(common)} seeds exactly equal), and the "
        "final weights differ at the level of float32 rounding (about 1e-6 in the seeds "
        "checked by hand: block L/2 reads its keys and values from x + 0·r, a separate tensor, "
        "so its matmuls need not round as the baseline's do). The tables read such a Δ as "
        "*identical* (analysis/stats.py `identical`: every seed within a few float32 ulps), "
        "with no interval and no p: a t-test on rounding noise would mean nothing. The encoder "
        "still spends KL (see the latent section: its marginal bias), and the decoder recovers "
        "none of it, exactly: the Z-cut's probe is the null of latent use.", ""]


def their_51m(bv51: pd.DataFrame | None) -> dict[str, str]:
    """bryanvine's 51M sweep (docs/alive/kappa/bryanvine_51M.csv, quoted from their repository
    at a named commit) in our definitions, one text per side-table key."""
    if bv51 is None or bv51.empty:
        return {}
    base = float(bv51.loc[bv51["config"] == "baseline", "elbo"].iloc[0])
    f = bv51[bv51["config"] == "free"].sort_values("kappa_bits")
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
                      ps: pd.DataFrame | None, probe: pd.DataFrame | None, meta: dict,
                      lat: pd.DataFrame | None = None) -> list[str]:
    out = ["## Beside bryanvine/free-transformer", ""]
    theirs = their_51m(bv51)
    if bv is None or bv.empty or not theirs:
        return out + ["docs/study/bryanvine.csv or docs/alive/kappa/bryanvine_51M.csv absent.",
                      ""]
    rows = [[r["finding"], theirs.get(str(r["key"]), r.get("theirs", "")), theirs["n"],
             ours(str(r["key"]), ps, lat, probe)] for _, r in bv.iterrows()]
    return out + [
        "Theirs: their 51M sweep (8 layers, d = 512, TinyStories, 131M tokens, H = 16), quoted "
        "at commit 783ed901 of their repository in "
        "[docs/alive/kappa/bryanvine_51M.csv](alive/kappa/bryanvine_51M.csv) and put in our "
        "definitions here (docs/alive/kappa/PREREGISTERED.md maps their columns onto ours). "
        f"Ours: this study's ({meta.get('preset', '?')} preset, 1M tokens a run). The two sides "
        "are never combined; their 124M figures, known here only second-hand, are left out.",
        "", md(pd.DataFrame(rows, columns=["finding", "theirs (51M; nats/token unless named)",
                                           "their n", "ours"])), ""]


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


def realised_sd_text(ps: pd.DataFrame | None, sizing: pd.DataFrame | None) -> str:
    """The pilot SD against what the study realised (the baseline's seed SD and the per-seed
    differences' SD), both of validation nats/token."""
    if ps is None or ps.empty or sizing is None:
        return ""
    v = ps[(ps["task"] == "val") & (ps["metric"] == "val_ce")]
    b = v[v["arm"] == BASELINE.name].set_index("seed")["value"]
    if len(b) < 2:
        return ""
    pilot, sd = _q(sizing, "pilot_sd_val_ce"), float(b.std(ddof=1))
    diffs = []
    for _, g in v[v["arm"].map(_treatment)].groupby("kappa_bits"):
        f = g.set_index("seed")["value"]
        c = sorted(set(f.index) & set(b.index))
        if len(c) >= 2:
            diffs.append(float((f[c] - b[c]).std(ddof=1)))
    ratio = f" ({sd / pilot:.1f} times the pilot's)" if math.isfinite(pilot) and pilot else ""
    dt = (f"; the SD of the per-seed Free Transformer minus baseline differences, which the MDE "
          f"rests on, is {min(diffs):.4f} to {max(diffs):.4f} over the kappas (the planned MDE "
          f"took sqrt(2) x the pilot SD, {math.sqrt(2) * pilot:.4f})" if diffs and
          math.isfinite(pilot) else "")
    return (f"Realised: the baseline's seed SD of validation CE is {sd:.4f} nats/token over "
            f"{len(b)} seeds against the pilot's {f4(pilot)}{ratio}{dt}. The pilot's three "
            "seeds underestimated the seed spread; pairing by seed is what kept the MDE near "
            "its target.")


def sizing_section(sizing: pd.DataFrame | None, meta: dict,
                   per_seed: pd.DataFrame | None = None) -> list[str]:
    out = ["## Why this size", ""]
    if sizing is None or sizing.empty:
        return out + ["docs/study/sizing.csv absent: the size is not justified by measurements.",
                      ""]
    val = (lambda v: "not measured" if not math.isfinite(v) else f4(v) if abs(v) < 1e5
           else f"{v:.4g}")
    out += [md(pd.DataFrame([[r["quantity"], val(num(r["value"])), r["unit"], r["note"]]
                             for _, r in sizing.iterrows()],
                            columns=["quantity", "value", "unit", "how it was measured"])), ""]
    sd, m, n = planned_mde(sizing, meta)
    if math.isfinite(m):
        out.append(f"Planned MDE on validation nats/token with {n} seeds, taking the per-seed "
                   f"difference's SD as the pilot SD {f4(sd)} times the square root of two (no "
                   f"credit for pairing): {f4(m)} (target at most "
                   f"{f4(meta.get('mde_target_nats'))}).")
    rs = realised_sd_text(per_seed, sizing)
    if rs:
        out.append(rs)
    rate = _q(sizing, "flops_per_token_baseline") * _q(sizing, "quiet_tokens_per_s_baseline")
    tw = _q(sizing, "sweep_total_flops") / rate / num(meta.get("cores")) / 60
    if math.isfinite(tw):
        out.append(f"Training alone: the sweep's FLOPs at the quiet baseline rate, one job per "
                   f"core, is {f4(tw)} wall minutes; the rest of the budget is evaluation, "
                   "likelihood, probes and the report.")
    cells, cores = num(meta.get("n_cells_planned")), num(meta.get("cores"))
    if math.isfinite(cells) and cells:
        out.append(f"Budget: {num(meta.get('budget_min')):g} wall minutes on {_int(cores)} "
                   f"cores over {int(cells)} runs is "
                   f"{f4(num(meta.get('budget_min')) * cores / cells)} core-minutes per run "
                   "(training, evaluation, likelihood and probe together).")
    return out + [""]


def setup_section(meta: dict) -> list[str]:
    g = meta.get
    st = meta.get("setup") or {}
    d, m, b, ft = (st.get(k) or {} for k in ("data", "model", "baseline", "ft"))
    facts = []  # the data, the tokenizer and the model size, from the runs' own records
    if d:
        ck = ", ".join(str(c)[:12] for c in d.get("checksums") or []) or "?"
        facts += [f"- Data: the Python standard library's own source (`data.source="
                  f"{d.get('source')}`: the .py files of the interpreter's Lib/, Python "
                  f"{d.get('python')}, no site-packages; sha256 {ck}), the first "
                  f"{d.get('max_bytes')} bytes in sorted file order, {d.get('val_fraction')} of "
                  f"it held out, {d.get('val_tokens')} validation tokens. Code only: no natural "
                  "language, no benchmark text.",
                  f"- Tokenizer: a byte-level BPE of {m.get('vocab_size')} tokens trained on "
                  f"that corpus (sha256 {str(d.get('tokenizer_sha256'))[:12]})."]
    if m:
        facts.append(f"- Model size: the preset is named `{m.get('preset')}` for its order of "
                     f"magnitude, not its exact count: dim {m.get('dim')}, {m.get('n_layers')} "
                     f"layers, {m.get('n_heads')} heads ({m.get('n_kv_heads')} key/value), FFN "
                     f"{m.get('ffn_dim')}, context {m.get('max_seq_len')}, tied embeddings; the "
                     f"baseline has {b.get('params_total')} parameters "
                     f"({b.get('params_embedding')} in the embedding), the Free Transformer "
                     f"{ft.get('params_total')} ({ft.get('params_latent')} in the encoder block, "
                     "its readout and the post-sampler).")
    return ["## Setup", "",
            f"- Size `{g('size')}`, sweep `{g('name')}`: preset {g('preset')}, H = {g('h')} "
            f"latent bits, kappa in {{{g('kappa')}}} bits, seeds {{{g('seeds')}}}, "
            f"{g('tokens')} training tokens per equal-tokens run, controls {{{g('controls')}}}.",
            f"- Trainer overrides: `{g('overrides')}`.",
            f"- Evaluation (each run, Z from the prior): {g('tasks')}, first {g('limit')} "
            f"documents each, generation budget {g('gen_toks')} tokens, offline data "
            f"`{g('bench_data')}`; {g('eval_points')} evaluation points for the curves; the "
            f"likelihood bound (IWAE and prior) on {g('likelihood_rows')} validation rows.",
            *facts,
            f"- Probe of every latent run (the Free Transformers and the Z-cut control, at the "
            f"final and the evaluation checkpoints): `{g('probe_args')}`.",
            f"- Cells: {g('n_done')} of {g('n_cells') or g('n_cells_planned')} trained, "
            f"{g('n_eval_done')} evaluated.", ""]


def provenance_section(ps: pd.DataFrame | None) -> list[str]:
    out = ["## Provenance", ""]
    if ps is None or ps.empty:
        return out + [f"{NOT_RUN} (docs/study/per_seed.csv absent).", ""]
    runs = ps.drop_duplicates("run_id")
    dirty = runs[runs["git_dirty"].map(_truthy)]
    commits = sorted({str(c)[:7] for c in runs["git_commit"].dropna()})
    return out + [
        f"Per-seed values of every compared metric: [docs/study/per_seed.csv]"
        f"(study/per_seed.csv) ({len(ps)} rows, {len(runs)} runs; each row names its run, eval "
        f"file, commit and whether the tree was dirty). Trained from commit(s) "
        f"{', '.join(commits) or '?'}; {len(dirty)} of {len(runs)} runs from a working tree "
        "with uncommitted changes"
        + (f" ({', '.join(sorted(map(str, dirty['run_id'])))})" if len(dirty) else "")
        + ". `make study` refuses to train from uncommitted changes to tracked source unless "
        "told to (`--allow-dirty`, which marks the cells); a re-run that trains nothing does "
        "not check.", ""]


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
    lines = ["# The study: does the Free Transformer beat the baseline at CPU scale?", "",
             "<!-- generated by `python -m analysis.study render` from docs/study/; "
             "do not edit by hand -->", "",
             "One command, offline, on 2 CPU cores: `make study` (`STUDY_SIZE=full|tiny`, "
             "`STUDY_NAME=`), resumable. The report: [docs/study/report.html](study/report.html)"
             "; its tables: docs/study/*.csv (curves over training: table3.csv and the report's "
             "figures).", ""]
    if not meta.get("n_done"):
        lines += [f"**Status: {NOT_RUN}.** The sections below fill in when `make study` has "
                  "run and its tables are committed.", ""]
    lines += setup_section(meta) + sizing_section(t["sizing"], meta, ps)
    lines += results_section(ps, t["sizing"]) + mde_section(meta, t["sizing"])
    lines += likelihood_section(t["likelihood"]) + zcut_section(ps)
    lines += latent_section(t["latent"], t["probe"], cells)
    bv51 = tables.parent / "alive" / "kappa" / "bryanvine_51M.csv"
    lines += bryanvine_section(t["bryanvine"], pd.read_csv(bv51) if bv51.is_file() else None,
                               ps, t["probe"], meta, t["latent"])
    lines += provenance_section(ps)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.study", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=("render",))
    ap.add_argument("--tables", default="docs/study", help="the study's tables directory")
    ap.add_argument("--out", default="docs/STUDY.md", help="the Markdown to write")
    a = ap.parse_args(argv)

    def body() -> int:
        try:
            atomic_write_text(Path(a.out), render(Path(a.tables)))
        except OSError as e:
            raise UsageError(f"{e.filename or a.out}: {e.strerror}") from None
        print(f"study: {Path(a.out).resolve()}")
        return 0

    return cli("study", body)


if __name__ == "__main__":
    sys.exit(main())
