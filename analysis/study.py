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
from common.arms import BASELINE, FREE_ZCUT
from common.errors import UsageError, cli
from common.io import atomic_write_text
from common.text import one_line

from .render import md
from .stats import ALPHA, LEVEL, POWER
from .stats import mde as mde_of

NOT_RUN = "not yet run"
FT_TASKS = tuple(b.task for b in benchmarks.by_group()[benchmarks.CODE_MATH] if b.task)
"""The paper's headline benchmarks (generative code and math), in its order."""
GOLD = benchmarks.gold_tasks(FT_TASKS)
VAL_ROWS = (("val", "val_ce"), ("val", "val_bpb"))
PRIMARY = "tokens:baseline"
"""The paper's comparison: each Free Transformer against the plain baseline, equal tokens."""
COMPARISON_TEXT = {
    "tokens:baseline": " (each Free Transformer against the plain baseline: the paper's)",
    "tokens:baseline_plus1": " (against the one-layer-deeper control: the bryanvine parameter "
                             "control)",
    "tokens:free_zcut": " (against the Z-cut control: the Free Transformer with its encoder, KL "
                        "and extra block, Z cut from the decoder; does the latent itself help?)",
    "tokens:baseline:controls": " (each control against the baseline, paired by seed: what the "
                                "extra layer, and the encoder without Z, cost or gain)",
    "flops:baseline_flops": " (against the baseline trained on more tokens to the Free "
                            "Transformer's FLOPs)",
}


def _num(x: object) -> float:
    try:
        return float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def f4(x: object) -> str:
    """A measured value: 4 decimals; '?' when missing (never 0)."""
    v = _num(x)
    return f"{v:.4f}" if math.isfinite(v) else "?"


def s4(x: object) -> str:
    """A signed difference: 4 decimals with its sign."""
    v = _num(x)
    return f"{v:+.4f}" if math.isfinite(v) else "?"


def kappa_text(k: object) -> str:
    """kappa in bits as the grid writes it (0.5, 1, 2)."""
    v = _num(k)
    return "?" if math.isnan(v) else f"{v:g}"


def _int(x: object) -> str:
    v = _num(x)
    return str(int(v)) if math.isfinite(v) else "?"


def _truthy(x: object) -> bool:
    return str(x).strip().lower() in ("true", "1", "1.0")


def _flag(x: object) -> str:
    s = str(x).strip().lower()
    return "yes" if s in ("true", "1", "1.0") else "no" if s in ("false", "0", "0.0") else "?"


def _treatment(arm: object) -> bool:
    a = arms.find(arm)
    return a is not None and a.is_treatment


def verdict(r: pd.Series) -> str:
    """A row's verdict from the table's own Holm-corrected test. 'inconclusive' says why: the
    interval includes 0, or it excludes 0 but the Holm-adjusted p over its family is not under
    ALPHA; 'identical' is a paired difference of 0 up to float32 rounding in every seed."""
    if not math.isfinite(_num(r.get("delta"))):
        return "no Δ" if _treatment(r.get("arm")) else "reference"
    if _truthy(r.get("identical")):
        return "identical"
    if _truthy(r.get("significant_holm")):
        return "better" if _truthy(r.get("better")) else "worse"
    lo, hi = _num(r.get("delta_lo")), _num(r.get("delta_hi"))
    if math.isfinite(lo) and math.isfinite(hi) and (lo > 0 or hi < 0):
        m = _num(r.get("holm_m"))
        fam = f" over its {int(m)} tests" if math.isfinite(m) and m > 1 else ""
        return (f"inconclusive: the interval excludes 0 but Holm p {f4(r.get('p_holm'))} is "
                f"not under {ALPHA:g}{fam}")
    return "inconclusive (the interval includes 0)"


def tost_text(r: pd.Series) -> str:
    """The equivalence test of a Δ row: 'equivalent: 90% [lo, hi] vs ±m', 'not shown ...'."""
    eq = str(r.get("equivalence") or "")
    if eq in ("", "nan", "identical"):
        return "" if eq != "identical" else eq
    lo, hi = r.get("tost_lo"), r.get("tost_hi")
    iv = f"[{s4(lo)}, {s4(hi)}]" if math.isfinite(_num(lo)) else "(no interval)"
    return f"{eq}: 90% {iv} vs ±{_num(r.get('tost_margin')):g}"


def at_floor(rows: pd.DataFrame) -> bool:
    """Every arm's mean is 0 (pass@1 / accuracy of a small model): nothing to compare."""
    m = pd.to_numeric(rows["mean"], errors="coerce")
    return bool(len(m) and m.notna().all() and (m == 0).all())


def _metric_rows(t: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(task, metric, label) of the rows the study reports, in order, when the table has them."""
    have = t.dropna(subset=["task", "metric"])
    unit = {"val_ce": "nats/token", "val_bpb": "bits/byte"}
    out = [(task, metric, f"validation {metric} ({unit[metric]}, honest: prior Z)")
           for task, metric in VAL_ROWS
           if ((have["task"] == task) & (have["metric"] == metric)).any()]
    for task in (*GOLD, *FT_TASKS):
        out += [(task, str(m), f"{task} ({m})")
                for m in dict.fromkeys(have.loc[have["task"] == task, "metric"])]
    return out


RESULT_COLS = ["metric", "column", f"mean [{LEVEL:.0%} interval]", "n seeds",
               f"Δ vs reference [{LEVEL:.0%} interval]", "Holm p", "MDE (this row)",
               "equivalence (TOST)", "verdict"]


def _result_row(label: str, r: pd.Series) -> list[str]:
    n = int(_num(r.get("n_seeds"))) if math.isfinite(_num(r.get("n_seeds"))) else 0
    if not n:
        return [label, r["column"], r.get("status") or "missing", "", "", "", "", "", "missing"]
    d = _num(r.get("delta"))
    st = str(r.get("status") or "")
    row = [label, r["column"], f"{f4(r['mean'])} [{f4(r['lo'])}, {f4(r['hi'])}]",
           f"{n} ({st})" if st.startswith("missing") else str(n), "", "", "",
           "", verdict(r)]
    if math.isfinite(d):
        row[4:8] = [f"{s4(d)} [{s4(r['delta_lo'])}, {s4(r['delta_hi'])}]", f4(r.get("p_holm")),
                    f4(r.get("mde")), tost_text(r)]
        if _truthy(r.get("identical")):
            row[4:7] = [f"{s4(d)} (identical)", "", ""]
    return row


def results_section(t: pd.DataFrame | None, view: str) -> list[str]:
    """The results table of one view: mean [interval], Δ [interval], Holm p, MDE, verdict."""
    out = ["### " + ("Equal tokens (the paper's protocol)" if view == "tokens"
                     else "Equal FLOPs"), ""]
    if t is None or t.empty or "comparison" not in t.columns or "mean" not in t.columns:
        return out + [f"{NOT_RUN} (docs/study/table_{view}.csv has no rows).", ""]
    for comp, ct in t.groupby("comparison", sort=False):
        rows = []
        for task, metric, label in _metric_rows(ct):
            sel = ct[(ct["task"] == task) & (ct["metric"] == metric) & ct["column"].notna()
                     & (ct["column"].astype(str) != "")]
            if at_floor(sel):
                rows.append([label, "every column", "at the floor (every mean is 0)", "", "",
                             "", "", "", "not compared"])
            else:
                rows += [_result_row(label, r) for _, r in sel.iterrows()]
        if not rows:
            continue
        out += [f"Comparison `{comp}`{COMPARISON_TEXT.get(str(comp), '')}:", "",
                md(pd.DataFrame(rows, columns=RESULT_COLS)), ""]
        fams = [str(x) for x in ct.get("holm_family", pd.Series(dtype=object)).dropna()
                if str(x) and not str(x).startswith("none")]
        if fams:
            cols = fams[0].split(": ", 1)[1] if ": " in fams[0] else fams[0]
            out += [f"Holm family: per metric row, the tests of this comparison's columns "
                    f"({cols.rsplit(' (m = ', 1)[0]}); a column identical to its reference "
                    "is not tested and not counted.", ""]
        if "delta_estimand" in ct:
            floor = {x for x, g in ct.groupby("task") if at_floor(g)}
            est = ct.dropna(subset=["delta_estimand"])
            parts = [f"{', '.join(dict.fromkeys(g['task'].astype(str)))}: {e}"
                     for e, g in est[~est["task"].isin(floor)].groupby("delta_estimand")]
            if parts:
                out += ["Δ estimand, per row: " + "; ".join(parts) + ".", ""]
    return out


def _row(t: pd.DataFrame | None, task: str, metric: str, treatment: bool = True,
         arm: str = "", kappa: float | None = None, comparison: str = PRIMARY) -> pd.DataFrame:
    """The rows of one metric: the treatment arm's (or `arm`'s) in one comparison, with seeds."""
    if t is None or t.empty or "task" not in t.columns:
        return pd.DataFrame()
    who = t["arm"].map(_treatment) if treatment and not arm else t["arm"] == arm
    sel = t[(t["task"] == task) & (t["metric"] == metric) & who & (t["comparison"] == comparison)]
    if kappa is not None:
        sel = sel[pd.to_numeric(sel["kappa_bits"], errors="coerce") == kappa]
    return sel[pd.to_numeric(sel["n_seeds"], errors="coerce").fillna(0) > 0]


def mde_section(t: pd.DataFrame | None, meta: dict) -> list[str]:
    target = _num(meta.get("mde_target_nats"))
    out = ["## What the data can and cannot say", ""]
    v = pd.to_numeric(_row(t, "val", "val_ce").get("mde", pd.Series(dtype=float)),
                      errors="coerce").dropna()
    if v.empty:
        return out + [f"Minimum detectable effect on honest validation nats/token: {NOT_RUN} "
                      f"(target at most {f4(target)}).", ""]
    m = float(v.max())
    out.append(f"Against the baseline (`{PRIMARY}`), the largest minimum detectable effect "
               f"(two-sided {ALPHA:.0%}, {POWER:.0%} power, paired t over seeds; the max over "
               f"the kappas' rows) on honest validation nats/token is {f4(m)} against the target "
               f"{f4(target)}: {'met' if m <= target else 'NOT met'}. A true difference smaller "
               "than the MDE would usually be missed, so an 'inconclusive' verdict does not show "
               "the arms are equal.")
    prim = t[(t["comparison"] == PRIMARY) & t["arm"].map(_treatment) & t["task"].isin(GOLD)]
    for task, g in prim.groupby("task", sort=False):
        v = pd.to_numeric(g["mde"], errors="coerce").dropna()
        if len(v):
            out.append(f"- {task}: MDE at most {f4(v.max())} bits/byte (max over the kappas' "
                       "rows).")
    return out + [""]


def likelihood_section(lik: pd.DataFrame | None) -> list[str]:
    """Each Free Transformer's likelihood bound against its own seed's baseline."""
    out = ["## Honest likelihood: IWAE and prior bounds per run", ""]
    if lik is None or lik.empty:
        return out + [f"{NOT_RUN} (docs/study/likelihood.csv absent or empty).", ""]
    rows = [[r["column"], _int(r.get("seed")), *(["", "", "", "", "", r.get("tightest") or
                                                   "missing", "", ""]
                                                 if not math.isfinite(_num(r.get(
                                                     "gap_nats_per_token"))) else
                                                 [_int(r["n_tokens"]), f4(r["baseline_bpb"]),
                                                  f4(r["free_bpb_kmax"]), _int(r["gap_k"]),
                                                  s4(r["gap_nats_per_token"]), r["tightest"],
                                                  s4(r["tightest_gap_nats_per_token"]),
                                                  f4(r["kl_nats_per_token"])])]
            for _, r in lik.iterrows()]
    return out + [
        "Gap = Free Transformer minus its seed's baseline, nats/token, on the same validation "
        "rows: an upper bound on the true gap (the FT's NLL is bounded from above). The "
        "posterior-Z CE leaks and is not shown.", "",
        md(pd.DataFrame(rows, columns=["column", "seed", "tokens", "baseline bits/byte",
                                       "FT bits/byte (IWAE, largest k)", "k", "gap (IWAE)",
                                       "tightest bound", "gap (tightest)", "KL nats/token"])),
        ""]


def _share(r: pd.Series) -> str:
    v, lo, hi = (_num(r.get(k)) + 0.0 for k in ("recovered_share", "recovered_share_lo",
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


def latent_section(lat: pd.DataFrame | None, probe: pd.DataFrame | None,
                   cells: list[dict]) -> list[str]:
    """Decoder-side latent use per run (latent.csv): the recovered share of the KL, the KL
    split into information and marginal bias, and the state with its rule."""
    out = ["## The latent, measured on the decoder's side: dead or leaking", ""]
    if lat is None or lat.empty:
        return out + [f"{NOT_RUN} (docs/study/latent.csv absent).", ""] + \
            _encoder_side(probe, cells)
    rule = next((str(x) for x in lat["rule"].dropna()), "")
    fin = lat[lat["final"].map(_truthy)].assign(
        seed_=lambda f: [_seed_of(cells).get(str(r)) for r in f["run_id"]])
    fin = fin.sort_values(["arm", "kappa_bits", "seed_"], kind="stable")
    out += ["A latent can fail two opposite ways, and the word *collapse* has meant both: it is "
            "**dead** when the decoder ignores Z (whatever the encoder spends), and **leaking** "
            "when the posterior carries the text so that generation from the prior breaks (the "
            "paper's kappa = 4 bits). The probe (docs/PROBE.md) measures both on the decoder's "
            "side: the *recovered share* is (CE with prior Z - CE with posterior Z) / KL, both "
            "in nats per token (live latents recover most of what they spend); the KL to the "
            "uniform prior splits into the *information* Z carries about the text (a mutual-"
            "information estimate over the probed tokens) and the *marginal bias* (the KL of "
            "the mean code distribution to uniform: bits biased the same way on every token, "
            "which carry nothing). Rule, as written in every probe file: " + rule, "",
            md(pd.DataFrame([[r["arm"], kappa_text(r["kappa_bits"]), _seed_text(r["seed_"]),
                              _int(r["step"]), f4(r["kl_bits"]), f4(r["information_bits"]),
                              f4(r["marginal_bias_bits"]), _share(r), r["latent_state"]]
                             for _, r in fin.iterrows()],
                            columns=["arm", "kappa (bits)", "seed", "step", "KL (bits/token)",
                                     "information", "marginal bias",
                                     "recovered share [95% interval]", "state"])), ""]
    for (arm, k), g in fin.groupby(["arm", "kappa_bits"], sort=True):
        st, sh = g["latent_state"].astype(str), pd.to_numeric(g["recovered_share"],
                                                              errors="coerce")
        out.append(f"- {arm} kappa {kappa_text(k)}: dead in {int((st == 'dead').sum())} of "
                   f"{len(g)}, leaking in {int((st == 'leaking').sum())}, used in "
                   f"{int((st == 'used').sum())}, undetermined in "
                   f"{int((st == 'undetermined').sum())}; recovered share {100 * sh.min():+.2f}% "
                   f"to {100 * sh.max():+.2f}% (mean {100 * sh.mean():+.2f}%).")
    if (~lat["final"].map(_truthy)).any():
        rows = [[arm, kappa_text(k), _int(step), len(g),
                 f"{100 * pd.to_numeric(g['recovered_share'], errors='coerce').mean():+.2f}%",
                 f"{100 * pd.to_numeric(g['recovered_share'], errors='coerce').max():+.2f}%",
                 int((g["latent_state"].astype(str) == "dead").sum()),
                 int((g["latent_state"].astype(str) == "used").sum())]
                for (arm, k, step), g in lat.groupby(["arm", "kappa_bits", "step"], sort=True)]
        out += ["", "Over training (the evaluation checkpoints probed the same way; figure: "
                "[latent_over_training.png](study/latent_over_training.png)):", "",
                md(pd.DataFrame(rows, columns=["arm", "kappa (bits)", "step", "runs",
                                               "recovered share, mean", "max", "dead", "used"]))]
    used = int((fin["latent_state"].astype(str) == "used").sum())
    out += ["", f"Free Transformers whose decoder uses Z: {used} of "
            f"{int(fin['arm'].map(_treatment).sum())}. "
            + ("So the equal-tokens comparisons above set the baseline against a Free "
               "Transformer whose decoder ignores its latent: they say nothing yet about the "
               "paper's mechanism, only what carrying an unused encoder costs at this size."
               if used == 0 else "The comparisons mix runs that use Z with runs that do not."),
            ""]
    return out + _encoder_side(probe, cells)


def _encoder_side(probe: pd.DataFrame | None, cells: list[dict]) -> list[str]:
    """KL, active bits (KL > 0.01 bit to the uniform prior, biased bits included), the leak flag."""
    out = ["### Encoder side: KL and active bits (probe.csv)", ""]
    if probe is None or probe.empty:
        return out + [f"{NOT_RUN} (docs/study/probe.csv absent).", ""]
    p = probe.assign(seed=[_seed_of(cells).get(str(r)) for r in probe["run_id"]]).sort_values(
        ["kappa_bits", "seed"], na_position="last")
    out += ["An active bit is one whose KL to the uniform prior exceeds 0.01 bit; that counts "
            "biased bits too, so a bit can be active while the decoder ignores it (the "
            "decoder-side state above is the flag).", "",
            md(pd.DataFrame([[kappa_text(r["kappa_bits"]), _seed_text(r["seed"]),
                              f4(r["kl_bits"]), _int(r["n_active"]), _flag(r["collapse"])]
                             for _, r in p.iterrows()],
                            columns=["kappa (bits)", "seed", "KL (bits/token)",
                                     "active bits (encoder side)", "collapse (leaking)"])), ""]
    for k, g in p.groupby("kappa_bits", sort=True):
        flags = g["collapse"].map(_flag)
        out.append(f"- kappa {kappa_text(k)}: {int((flags == 'yes').sum())} of "
                   f"{int((flags != '?').sum())} seeds leak (collapse in the paper's sense).")
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


def _states(lat: pd.DataFrame | None, kappa: float | None = None) -> tuple[int, int, int]:
    """(dead, leaking, n) over the Free Transformers' final probes (at one kappa if given)."""
    if lat is None or lat.empty:
        return 0, 0, 0
    g = lat[lat["arm"].map(_treatment) & lat["final"].map(_truthy)]
    if kappa is not None:
        g = g[pd.to_numeric(g["kappa_bits"], errors="coerce") == kappa]
    st = g["latent_state"].astype(str)
    return int((st == "dead").sum()), int((st == "leaking").sum()), len(g)


def ours(key: str, t: pd.DataFrame | None, probe: pd.DataFrame | None,
         lat: pd.DataFrame | None = None) -> str:
    """Our side of one bryanvine row, from our tables; NOT_RUN when they do not have it. A row
    whose two sides measure different things says so before any number."""
    dead, _, n = _states(lat)
    inert = (f"not comparable: theirs is the likelihood (ELBO/IWAE) cost of a live latent; ours "
             f"is the honest prior-Z CE difference of a latent that is dead in {dead} of {n} "
             "runs (the decoder ignores it). Ours: " if n else "")
    sel = _row(t, "val", "val_ce")
    if key in ("latent_cost", "ppl_ratio", "best_kappa") and sel.empty:
        return NOT_RUN
    if key == "latent_cost":
        return inert + "; ".join(
            f"kappa {kappa_text(r['kappa_bits'])}: {s4(r['delta'])} [{s4(r['delta_lo'])}, "
            f"{s4(r['delta_hi'])}] nats/token" + (f" ({tost_text(r)})" if tost_text(r) else "")
            for _, r in sel.iterrows())
    if key == "ppl_ratio":
        sel = sel[pd.to_numeric(sel["delta"], errors="coerce").notna()]
        return inert + "; ".join(f"kappa {kappa_text(r['kappa_bits'])}: "
                                 f"{100 * math.expm1(_num(r['delta'])):+.1f}%"
                                 for _, r in sel.iterrows()) if len(sel) else NOT_RUN
    if key == "plus1":  # the paired Δ of the control against the baseline, with its TOST
        p1 = _row(t, "val", "val_ce", arm="baseline_plus1",
                  comparison="tokens:baseline:controls")
        if p1.empty or not math.isfinite(_num(p1.iloc[0].get("delta"))):
            return NOT_RUN
        r = p1.iloc[0]
        return (f"paired Δ (control minus baseline, {_int(r['n_seeds'])} seeds) "
                f"{s4(r['delta'])} [{s4(r['delta_lo'])}, {s4(r['delta_hi'])}] nats/token; "
                f"{tost_text(r)}: {verdict(r)}")
    if key == "collapse_k05":
        d, leak, n5 = _states(lat, 0.5)
        if n5:
            return (f"measured differently: theirs is death seen from the encoder (its KL "
                    f"falls to about 0.001 bit); ours is seen from the decoder (it ignores Z "
                    f"while the encoder still spends KL). Ours at kappa 0.5: dead in {d} of "
                    f"{n5}, leaking in {leak} of {n5}")
        if probe is None or probe.empty:
            return NOT_RUN
        flags = probe[pd.to_numeric(probe["kappa_bits"], errors="coerce") == 0.5][
            "collapse"].map(_flag)
        known = int((flags != "?").sum())
        return f"leaking in {int((flags == 'yes').sum())} of {known}" if known else NOT_RUN
    if key == "best_kappa":
        m = pd.to_numeric(sel["mean"], errors="coerce")
        mde, span, b = pd.to_numeric(sel["mde"], errors="coerce").max(), m.max() - m.min(), \
            sel.loc[m.idxmin()]
        if math.isfinite(mde) and span < mde:
            return (f"none identified: the kappas' means span {f4(span)} nats/token, under the "
                    f"largest MDE {f4(mde)}, so the study cannot rank them (claims.csv: the "
                    "equivalence test across kappas)")
        return (f"lowest mean at kappa {kappa_text(b['kappa_bits'])} ({f4(b['mean'])} "
                f"nats/token; the means span {f4(span)}, the largest MDE is {f4(mde)}): a "
                "ranking of means, not a test (claims.csv has the pairwise tests)")
    return NOT_RUN


def bryanvine_section(bv: pd.DataFrame | None, t: pd.DataFrame | None,
                      probe: pd.DataFrame | None, meta: dict,
                      lat: pd.DataFrame | None = None) -> list[str]:
    out = ["## Beside bryanvine/free-transformer", ""]
    if bv is None or bv.empty:
        return out + ["docs/study/bryanvine.csv absent.", ""]
    rows = [[r["finding"], r["theirs"], r["scale_n"], r["source"],
             ours(str(r["key"]), t, probe, lat)] for _, r in bv.iterrows()]
    return out + ["Their figures are theirs (their scale, their data, their n); ours are this "
                  f"study's ({meta.get('preset', '?')} preset). The two columns are never "
                  "combined.", "", md(pd.DataFrame(rows, columns=[
                      "finding", "theirs", "their scale, n", "source", "ours"])), ""]


def _q(sizing: pd.DataFrame | None, name: str) -> float:
    if sizing is None or "quantity" not in sizing.columns:
        return math.nan
    v = sizing.loc[sizing["quantity"] == name, "value"]
    return _num(v.iloc[0]) if len(v) else math.nan


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
    out += [md(pd.DataFrame([[r["quantity"], val(_num(r["value"])), r["unit"], r["note"]]
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
    tw = _q(sizing, "sweep_total_flops") / rate / _num(meta.get("cores")) / 60
    if math.isfinite(tw):
        out.append(f"Training alone: the sweep's FLOPs at the quiet baseline rate, one job per "
                   f"core, is {f4(tw)} wall minutes; the rest of the budget is evaluation, "
                   "likelihood, probes and the report.")
    cells, cores = _num(meta.get("n_cells_planned")), _num(meta.get("cores"))
    if math.isfinite(cells) and cells:
        out.append(f"Budget: {_num(meta.get('budget_min')):g} wall minutes on {_int(cores)} "
                   f"cores over {int(cells)} runs is "
                   f"{f4(_num(meta.get('budget_min')) * cores / cells)} core-minutes per run "
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
        "table_tokens", "table_flops", "probe", "sizing", "bryanvine", "per_seed", "latent",
        "likelihood")}
    tt, ps = t["table_tokens"], t["per_seed"]
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
    lines += ["## Results", "",
              "Verdicts are Holm-corrected within a family named under each table (per metric "
              "row, that comparison's columns). 'inconclusive' says why: the interval includes 0, "
              "or it excludes 0 before correction while the Holm-adjusted p is not under "
              f"{ALPHA:g}. 'identical': every seed's paired difference is 0 up to float32 "
              "rounding (no test is run on it). Equivalence (TOST) is the only basis for \"no "
              "difference\": 'equivalent' when the 90% interval of Δ lies inside the stated "
              "margin (analysis/tables.py TOST_MARGIN), 'not shown' otherwise; an interval that "
              "merely includes 0 is never read as equality. Every Δ recomputes from "
              "[docs/study/per_seed.csv](study/per_seed.csv) (per-seed values of every compared "
              "metric): the mean over seeds of test minus reference.", ""]
    lines += results_section(tt, "tokens") + results_section(t["table_flops"], "flops")
    lines += mde_section(tt, meta) + likelihood_section(t["likelihood"]) + zcut_section(ps)
    lines += latent_section(t["latent"], t["probe"], cells)
    lines += bryanvine_section(t["bryanvine"], tt, t["probe"], meta, t["latent"])
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
