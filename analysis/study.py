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
from common.arms import BASELINE, FREE, FREE_ZCUT
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
    """A row's verdict from the table's own Holm-corrected test. 'inconclusive' says why: the
    interval includes 0, or it excludes 0 but the Holm-adjusted p over its family is not under
    ALPHA (the family is named under the table); 'identical' is a paired difference of 0 up to
    float32 rounding in every seed (no test run on it)."""
    if not math.isfinite(_num(r.get("delta"))):
        return "reference" if str(r.get("arm")) != FREE.name else "no Δ"
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
    """The equivalence test of a Δ row: 'equivalent [lo, hi] ±m', 'not shown ...' or ''."""
    eq = str(r.get("equivalence") or "")
    if eq in ("", "nan"):
        return ""
    if eq == "identical":
        return "identical"
    lo, hi, m = _num(r.get("tost_lo")), _num(r.get("tost_hi")), _num(r.get("tost_margin"))
    iv = f"[{s4(lo)}, {s4(hi)}]" if math.isfinite(lo) else "(no interval)"
    return f"{eq}: 90% {iv} vs ±{m:g}"


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
        out += [f"Comparison `{comp}`{COMPARISON_TEXT.get(str(comp), '')}:", "",
                f"| metric | column | mean [{LEVEL:.0%} interval] | n seeds | Δ vs reference "
                f"[{LEVEL:.0%} interval] | Holm p | MDE (this row) | equivalence (TOST) | "
                "verdict |",
                "|---|---|---|---|---|---|---|---|---|"]
        for task, metric, label in rows:
            sel = ct[(ct["task"] == task) & (ct["metric"] == metric) & ct["column"].notna()
                     & (ct["column"].astype(str) != "")]
            if at_floor(sel):
                out.append(f"| {label} | every column | at the floor (every mean is 0) | | | | "
                           "| | not compared |")
                continue
            for _, r in sel.iterrows():
                n = int(_num(r.get("n_seeds")) or 0) if math.isfinite(_num(r.get("n_seeds"))) \
                    else 0
                if not n:
                    out.append(f"| {label} | {r['column']} | {r.get('status') or 'missing'} | "
                               "| | | | | missing |")
                    continue
                mean = f"{f4(r['mean'])} [{f4(r['lo'])}, {f4(r['hi'])}]"
                d = _num(r.get("delta"))
                dtext = (f"{s4(d)} [{s4(r['delta_lo'])}, {s4(r['delta_hi'])}]"
                         if math.isfinite(d) else "")
                p = f4(r.get("p_holm")) if math.isfinite(d) else ""
                m = f4(r.get("mde")) if math.isfinite(d) else ""
                st = str(r.get("status") or "")
                nt = f"{n} ({st})" if st.startswith("missing") else str(n)
                if _truthy(r.get("identical")):
                    dtext, p, m = f"{s4(d)} (identical)", "", ""
                out.append(f"| {label} | {r['column']} | {mean} | {nt} | {dtext} | {p} | {m} | "
                           f"{tost_text(r) if math.isfinite(d) else ''} | {verdict(r)} |")
        out.append("")
        fams = [str(x) for x in ct.get("holm_family", pd.Series(dtype=object)).dropna()
                if str(x) and not str(x).startswith("none")]
        if fams:
            cols = fams[0].split(": ", 1)[1] if ": " in fams[0] else fams[0]
            out += [f"Holm family: per metric row, the tests of this comparison's columns "
                    f"({cols.rsplit(' (m = ', 1)[0]}); a column identical to its reference "
                    "is not tested and not counted.", ""]
        if "delta_estimand" in ct:
            est = ct.dropna(subset=["delta_estimand"])
            floor = {x for x, g in ct.groupby("task") if at_floor(g)}
            est = est[~est["task"].isin(floor)]
            parts = [f"{', '.join(dict.fromkeys(g['task'].astype(str)))}: {e}"
                     for e, g in est.groupby("delta_estimand", sort=True)]
            if parts:
                out += ["Δ estimand, per row: " + "; ".join(parts) + ".", ""]
    return out


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
               f"seeds; the max over the kappas' rows) on honest validation nats/token is "
               f"{f4(m)} against the target "
               f"{f4(target)}: {met}. A true difference smaller than the MDE would usually be "
               "missed, so an 'inconclusive' verdict does not show the arms are equal.")
    t = primary(t)
    gold = t[t["task"].isin(GOLD) & (t["arm"] == FREE.name)] if t is not None else pd.DataFrame(
        columns=["task", "mde"])
    for task, g in gold.groupby("task", sort=False):
        v = pd.to_numeric(g["mde"], errors="coerce").dropna()
        if len(v):
            out.append(f"- {task}: MDE at most {f4(v.max())} bits/byte (max over the "
                       "kappas' rows).")
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


def _seeds_of(cells: list[dict]) -> dict[str, object]:
    return {str(c.get("run_id")): c.get("seed") for c in cells}


def _share(r: pd.Series) -> str:
    v, lo, hi = (_num(r.get(k)) + 0.0 for k in ("recovered_share", "recovered_share_lo",
                                                "recovered_share_hi"))  # + 0.0: no "-0.00%"
    if not math.isfinite(v):
        return "?"
    iv = f" [{100 * lo:+.2f}%, {100 * hi:+.2f}%]" if math.isfinite(lo) and math.isfinite(hi) \
        else ""
    return f"{100 * v:+.2f}%{iv}"


def latent_section(lat: pd.DataFrame | None, probe: pd.DataFrame | None,
                   cells: list[dict]) -> list[str]:
    """Decoder-side latent use per run (latent.csv: the probes of every latent run's final
    and evaluation checkpoints): the recovered share of the KL, the KL split into information
    and marginal bias, and the state (dead | leaking | used | undetermined) with its rule."""
    out = ["## The latent, measured on the decoder's side: dead or leaking", ""]
    if lat is None or lat.empty:
        return out + [f"{NOT_RUN} (docs/study/latent.csv absent).", ""] + \
            _encoder_side(probe, cells)
    rule = next((str(x) for x in lat["rule"].dropna()), "")
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
            "| arm | kappa (bits) | seed | step | KL (bits/token) | information | marginal bias "
            "| recovered share [95% interval] | state |", "|---|---|---|---|---|---|---|---|---|"]
    seeds = _seeds_of(cells)
    fin = lat[lat["final"].map(_truthy)].copy()
    fin["seed_"] = [seeds.get(str(r)) for r in fin["run_id"]]
    fin = fin.sort_values(["arm", "kappa_bits", "seed_"], kind="stable")
    for _, r in fin.iterrows():
        sd = r["seed_"]
        out.append(f"| {r['arm']} | {kappa_text(r['kappa_bits'])} | "
                   f"{'?' if sd is None or sd != sd else int(sd)} | {_int_text(r['step'])} | "
                   f"{f4(r['kl_bits'])} | {f4(r['information_bits'])} | "
                   f"{f4(r['marginal_bias_bits'])} | {_share(r)} | {r['latent_state']} |")
    out.append("")
    for (arm, k), g in fin.groupby(["arm", "kappa_bits"], sort=True):
        st = g["latent_state"].astype(str)
        sh = pd.to_numeric(g["recovered_share"], errors="coerce")
        out.append(f"- {arm} kappa {kappa_text(k)}: dead in {int((st == 'dead').sum())} of "
                   f"{len(g)}, leaking in {int((st == 'leaking').sum())}, used in "
                   f"{int((st == 'used').sum())}, undetermined in "
                   f"{int((st == 'undetermined').sum())}; recovered share "
                   f"{100 * sh.min():+.2f}% to {100 * sh.max():+.2f}% (mean "
                   f"{100 * sh.mean():+.2f}%).")
    over = lat[~lat["final"].map(_truthy)]
    if len(over):
        out += ["", "Over training (the evaluation checkpoints probed the same way; figure: "
                "[latent_over_training.png](study/latent_over_training.png)):", "",
                "| arm | kappa (bits) | step | runs | recovered share, mean | max | dead | "
                "used |", "|---|---|---|---|---|---|---|---|"]
        for (arm, k, step), g in lat.groupby(["arm", "kappa_bits", "step"], sort=True):
            sh = pd.to_numeric(g["recovered_share"], errors="coerce")
            st = g["latent_state"].astype(str)
            out.append(f"| {arm} | {kappa_text(k)} | {_int_text(step)} | {len(g)} | "
                       f"{100 * sh.mean():+.2f}% | {100 * sh.max():+.2f}% | "
                       f"{int((st == 'dead').sum())} | {int((st == 'used').sum())} |")
    used = int((fin["latent_state"].astype(str) == "used").sum())
    ft = int((fin["arm"] == FREE.name).sum())
    out += ["", f"Free Transformers whose decoder uses Z: {used} of {ft}. "
            + ("So the equal-tokens comparisons above set the baseline against a Free "
               "Transformer whose decoder ignores its latent: they say nothing yet about the "
               "paper's mechanism, only what carrying an unused encoder costs at this size."
               if used == 0 else "The comparisons mix runs that use Z with runs that do not."),
            ""]
    return out + _encoder_side(probe, cells)


def _encoder_side(probe: pd.DataFrame | None, cells: list[dict]) -> list[str]:
    """The encoder-side view kept beside it (probe.csv): KL, active bits (KL > 0.01 bit to the
    uniform prior, which also counts biased bits), the leak flag."""
    out = ["### Encoder side: KL and active bits (probe.csv)", ""]
    if probe is None or probe.empty:
        return out + [f"{NOT_RUN} (docs/study/probe.csv absent).", ""]
    seeds = _seeds_of(cells)
    out += ["An active bit is one whose KL to the uniform prior exceeds 0.01 bit; that counts "
            "biased bits too, so a bit can be active while the decoder ignores it (the "
            "decoder-side state above is the flag).", "",
            "| kappa (bits) | seed | KL (bits/token) | active bits (encoder side) | "
            "collapse (leaking) |", "|---|---|---|---|---|"]
    p = probe.copy()
    p["seed"] = [seeds.get(str(r), None) for r in p["run_id"]]
    p = p.sort_values(["kappa_bits", "seed"], na_position="last")
    for _, r in p.iterrows():
        seed = r["seed"]
        out.append(f"| {kappa_text(r['kappa_bits'])} | "
                   f"{'?' if seed is None or seed != seed else int(seed)} | {f4(r['kl_bits'])} | "
                   f"{_int_text(r['n_active'])} | {_flag(r['collapse'])} |")
    out.append("")
    for k, g in p.groupby("kappa_bits", sort=True):
        known = g["collapse"].map(_flag) != "?"
        out.append(f"- kappa {kappa_text(k)}: {collapse_count(g)} of {int(known.sum())} seeds "
                   "leak (collapse in the paper's sense).")
    return out + [""]


def zcut_section(ps: pd.DataFrame | None, t: pd.DataFrame | None) -> list[str]:
    """Why the Z-cut control trains the baseline, with the per-seed differences that show it."""
    out = ["## The Z-cut control trains the baseline", ""]
    if ps is None or ps.empty or not (ps["arm"] == FREE_ZCUT.name).any():
        return out + [f"{NOT_RUN} (no free_zcut rows in docs/study/per_seed.csv).", ""]
    v = ps[(ps["task"] == "val") & (ps["metric"] == "val_ce")]
    z = v[v["arm"] == FREE_ZCUT.name].set_index("seed")["value"]
    b = v[v["arm"] == BASELINE.name].set_index("seed")["value"]
    common = sorted(set(z.index) & set(b.index))
    d = (z[common] - b[common]).abs()
    n_exact = int((d == 0).sum())
    out += ["The Z-cut arm (`free_zcut`, `CONTROLS=zcut`) is the Free Transformer with its "
            "encoder, KL and extra block kept and Z multiplied by 0 before it enters block L/2: "
            "the control the paper's reviewers asked for, separating \"the latent helps\" from "
            "\"the extra block helps\". Here it trains the baseline: with Z cut, the encoder's "
            "only gradient is the free-bits penalty max(0, KL - kappa), which is 0 while the KL "
            "stays under kappa, and the near-uniform initial encoder starts there; so the shared "
            "lower blocks never feel the encoder, the decoder is the baseline's, and both see "
            "the same data in the same order. The runs agree to float32 rounding, not bit for "
            f"bit: validation CE differs from its seed's baseline by at most {d.max():.2g} "
            f"nats/token ({n_exact} of {len(common)} seeds exactly equal), and the final "
            "weights differ at the level of float32 rounding (about 1e-6 in the seeds checked "
            "by hand: block L/2 reads its keys and values from x + 0·r, a separate tensor, so "
            "its matmuls need not round as the baseline's do). The tables read "
            "such a Δ as *identical* (analysis/stats.py `identical`: every seed within a few "
            "float32 ulps), with no interval and no p: a t-test on rounding noise would mean "
            "nothing. The encoder still spends KL (see the latent section: its marginal bias), "
            "and the decoder recovers none of it, exactly: the Z-cut's probe is the null of "
            "latent use.", ""]
    return out


def realised_sd_text(ps: pd.DataFrame | None, sizing: pd.DataFrame | None) -> str:
    """The pilot SD against what the study realised (the baseline's seed SD and the per-seed
    differences' SD), both of validation nats/token."""
    if ps is None or ps.empty or sizing is None:
        return ""
    v = ps[(ps["task"] == "val") & (ps["metric"] == "val_ce")]
    b = v[v["arm"] == BASELINE.name].set_index("seed")["value"]
    if len(b) < 2:
        return ""
    pilot = _q(sizing, "pilot_sd_val_ce")
    sd = float(b.std(ddof=1))
    diffs = []
    for _, g in v[v["arm"] == FREE.name].groupby("kappa_bits"):
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


def provenance_section(ps: pd.DataFrame | None, meta: dict) -> list[str]:
    out = ["## Provenance", ""]
    if ps is None or ps.empty:
        return out + [f"{NOT_RUN} (docs/study/per_seed.csv absent).", ""]
    runs = ps.drop_duplicates("run_id")
    dirty = runs[runs["git_dirty"].map(_truthy)]
    commits = sorted({str(c)[:7] for c in runs["git_commit"].dropna()})
    out.append(f"Per-seed values of every compared metric: "
               f"[docs/study/per_seed.csv](study/per_seed.csv) ({len(ps)} rows, {len(runs)} "
               f"runs; each row names its run, eval file, commit and whether the tree was "
               f"dirty). Trained from commit(s) {', '.join(commits) or '?'}; "
               f"{len(dirty)} of {len(runs)} runs from a working tree with uncommitted changes"
               + (f" ({', '.join(sorted(map(str, dirty['run_id'])))})" if len(dirty) else "")
               + ". `make study` refuses to train from uncommitted changes to tracked source "
               "unless told to (`--allow-dirty`, which marks the cells); a re-run that trains "
               "nothing does not check.")
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


def sizing_section(sizing: pd.DataFrame | None, meta: dict,
                   per_seed: pd.DataFrame | None = None) -> list[str]:
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
    rs = realised_sd_text(per_seed, sizing)
    if rs:
        out.append(rs)
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


def _states(lat: pd.DataFrame | None, kappa: float | None = None) -> tuple[int, int, int]:
    """(dead, leaking, n) over the Free Transformers' final probes (at one kappa if given)."""
    if lat is None or lat.empty:
        return 0, 0, 0
    g = lat[(lat["arm"] == FREE.name) & lat["final"].map(_truthy)]
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
    if key == "latent_cost":
        sel = _row(t, "val", "val_ce", FREE.name)
        if sel.empty:
            return NOT_RUN
        return inert + "; ".join(
            f"kappa {kappa_text(r['kappa_bits'])}: {s4(r['delta'])} [{s4(r['delta_lo'])}, "
            f"{s4(r['delta_hi'])}] nats/token" + (f" ({tost_text(r)})" if tost_text(r) else "")
            for _, r in sel.iterrows())
    if key == "ppl_ratio":
        sel = _row(t, "val", "val_ce", FREE.name)
        sel = sel[pd.to_numeric(sel["delta"], errors="coerce").notna()] if len(sel) else sel
        if sel.empty:
            return NOT_RUN
        return inert + "; ".join(f"kappa {kappa_text(r['kappa_bits'])}: "
                                 f"{pct(math.expm1(_num(r['delta'])))}"
                                 for _, r in sel.iterrows())
    if key == "plus1":  # the paired Δ of the control against the baseline, with its TOST
        p1 = _row(t, "val", "val_ce", "baseline_plus1", comparison="tokens:baseline:controls")
        if p1.empty or not math.isfinite(_num(p1.iloc[0].get("delta"))):
            return NOT_RUN
        r = p1.iloc[0]
        return (f"paired Δ (control minus baseline, {_int_text(r['n_seeds'])} seeds) "
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
        g = probe[pd.to_numeric(probe["kappa_bits"], errors="coerce") == 0.5]
        known = g["collapse"].map(_flag) != "?"
        return (f"leaking in {collapse_count(g)} of {int(known.sum())}" if int(known.sum())
                else NOT_RUN)
    if key == "best_kappa":
        sel = _row(t, "val", "val_ce", FREE.name)
        if sel.empty:
            return NOT_RUN
        m = pd.to_numeric(sel["mean"], errors="coerce")
        mde = pd.to_numeric(sel["mde"], errors="coerce").max()
        span = m.max() - m.min()
        b = sel.loc[m.idxmin()]
        if math.isfinite(mde) and span < mde:
            return (f"none identified: the kappas' means span {f4(span)} nats/token, under the "
                    f"largest MDE {f4(mde)}, so the study cannot rank them (claims.csv: the "
                    "equivalence test across kappas)")
        return (f"lowest mean at kappa {kappa_text(b['kappa_bits'])} ({f4(b['mean'])} "
                f"nats/token; the means span {f4(span)}, the largest MDE is {f4(mde)}): a "
                "ranking of means, not a test (claims.csv has the pairwise tests)")
    return NOT_RUN


def pct(x: float) -> str:
    return f"{100 * x:+.1f}%" if math.isfinite(x) else "?"


def bryanvine_section(bv: pd.DataFrame | None, t: pd.DataFrame | None,
                      probe: pd.DataFrame | None, meta: dict,
                      lat: pd.DataFrame | None = None) -> list[str]:
    out = ["## Beside bryanvine/free-transformer", ""]
    if bv is None or bv.empty:
        return out + ["docs/study/bryanvine.csv absent.", ""]
    out += ["Their figures are theirs (their scale, their data, their n); ours are this "
            f"study's ({meta.get('preset', '?')} preset). The two columns are never combined.",
            "", "| finding | theirs | their scale, n | source | ours |", "|---|---|---|---|---|"]
    for _, r in bv.iterrows():
        out.append(f"| {r['finding']} | {r['theirs']} | {r['scale_n']} | {r['source']} | "
                   f"{ours(str(r['key']), t, probe, lat)} |")
    return out + [""]


def setup_facts(st: dict) -> list[str]:
    """The data, the tokenizer and what the model size means, from the runs' own records
    (study.json's `setup`); nothing when an old study.json lacks them."""
    out = []
    d, m = st.get("data") or {}, st.get("model") or {}
    b, ft = st.get("baseline") or {}, st.get("ft") or {}
    if d:
        ck = ", ".join(str(c)[:12] for c in d.get("checksums") or []) or "?"
        out.append(f"- Data: the Python standard library's own source (`data.source="
                   f"{d.get('source')}`: the .py files of the interpreter's Lib/, Python "
                   f"{d.get('python')}, no site-packages; sha256 {ck}), the first "
                   f"{d.get('max_bytes')} bytes in sorted file order, {d.get('val_fraction')} "
                   f"of it held out, {d.get('val_tokens')} validation tokens. Code only: no "
                   "natural language, no benchmark text.")
        out.append(f"- Tokenizer: a byte-level BPE of {m.get('vocab_size')} tokens trained on "
                   f"that corpus (sha256 {str(d.get('tokenizer_sha256'))[:12]}).")
    if m:
        out.append(f"- Model size: the preset is named `{m.get('preset')}` for its order of "
                   f"magnitude, not its exact count: dim {m.get('dim')}, {m.get('n_layers')} "
                   f"layers, {m.get('n_heads')} heads ({m.get('n_kv_heads')} key/value), FFN "
                   f"{m.get('ffn_dim')}, context {m.get('max_seq_len')}, tied embeddings; the "
                   f"baseline has {b.get('params_total')} parameters ({b.get('params_embedding')} "
                   f"in the embedding), the Free Transformer {ft.get('params_total')} "
                   f"({ft.get('params_latent')} in the encoder block, its readout and the "
                   "post-sampler).")
    return out


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
            *setup_facts(meta.get("setup") or {}),
            f"- Probe of every latent run (the Free Transformers and the Z-cut control, at the "
            f"final and the evaluation checkpoints): `{g('probe_args')}`.",
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
    ps, lat = _read_csv(tables, "per_seed.csv"), _read_csv(tables, "latent.csv")
    lines += setup_section(meta) + sizing_section(sizing, meta, ps)
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
    lines += results_section(tt, "tokens") + results_section(tf, "flops")
    lines += mde_section(tt, meta) + likelihood_section(_read_csv(tables, "likelihood.csv"))
    lines += zcut_section(ps, tt)
    lines += latent_section(lat, probe, cells)
    lines += bryanvine_section(bv, tt, probe, meta, lat)
    lines += provenance_section(ps, meta)
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
