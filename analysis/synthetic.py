"""What Z encodes on the synthetic task (paper §4.1, Figure 4): table, acceptance check, figure.

Reads only `results/synthetic/<name>/samples.jsonl` (written by `experiments/synthetic.py`) and
writes `table.csv`, `table.md`, `acceptance.json` and `figure.png` beside it, and, when the run
kept checkpoints along training, `agreement.csv` and `agreement.png` (the agreement over training).

samples.jsonl holds one JSON object per line, told apart by `kind`:
- `meta`: the settings of the run (name, kappas, model shape, steps, seeds, wall time);
- `model`: one per trained model: `model` label, `arm`, `kappa_bits`, `latent_bits`, `run_id`,
  `kl_bits` (mean KL per token, Z from the encoder), `ce_prior` (CE, Z from the uniform prior:
  the honest number), `ce_encoder` (CE, Z from the encoder: it has seen the targets, it leaks),
  `ce_scope`, `train_wall_s`, `steps`;
- `sample`: one generated sequence: `model`, `prompt_idx`, `letter`, `group`, `group_kind`
  (`per_sequence`: every row its own uniform Z; `shared`: every row of the group the same pinned
  uniform Z; for the baseline, which has no Z, the same layout of independent samples), `row`,
  `text` (the generated characters after the prompt);
- `point` and `point_sample`: the same as `model` and `sample`, with a `step`, for each
  checkpoint the run kept along training before its final step (the agreement over training;
  the final model is the last point). Files from before these existed have none.

Metrics, per model, from the generated samples:
- validity: the body is 64 characters of '_', '!' and the prompted letter, and the letters fit in
  exactly one window of 8 consecutive positions made only of the letter and '!' (the noise may
  replace letters of the run; a run of 7 with '_' on both sides, a second run, a run of 9, or a
  foreign letter are invalid);
- position agreement: over pairs of valid samples, the fraction with the same run start; within
  a shared-Z group, across two shared-Z groups of the same prompt, and within the per-sequence
  group (independent Z; the chance level is about 1/57);
- noise agreement: the same pairs, Jaccard similarity of the sets of '!' positions (1 when both
  are empty); over all samples of full length, valid or not.

Over seeds (`--names s0 s1 s2 [--out DIR]`, one `make synthetic` run per seed): `per_seed.csv`
(per run and model: KL, position and noise agreement shared vs across and their gaps, validity,
CE, and whether the kappa's regime of Figure 4 holds: REGIMES), `summary.csv` (per model: the
mean over the measured runs and n per number, the regime's pass/fail counts), `curves.csv` (KL
per token over training, from each arm's metrics.jsonl, binned), `agreement.csv` (per run, model
and kept checkpoint: the held-out KL, CE, validity and agreement gaps; empty when the runs kept
no checkpoints), `aggregate.json` (provenance: the sources with their sha256, settings, wall
times and load), `summary.md`, `kl_curves.png`, `agreement.png`, and `gaps.csv`: every gap
(position and noise, shared - across) per run, model and measured step with its 95% jackknife
interval over the shared Z groups and a one-sided permutation p, n stated (groups, rows, pairs),
plus validity minus the same seed's baseline and CE with prior Z, each with its interval
(GAP_COLUMNS; the statistics are described at `gap_tests`).
`intervals DIR [DIR ...]` recomputes gaps.csv of committed folders from their committed samples
(`DIR/samples/<name>.samples.jsonl.gz`, each checked against aggregate.json's sha256).
A name with no samples.jsonl yet is missing: its rows are empty and every count says n.
`render-doc [--doc docs/SYNTHETIC.md] [--check]` rewrites the doc's generated blocks from such
folders (committed under docs/synthetic/), so no number in the doc is typed by hand.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from itertools import combinations
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.patches import Rectangle
from scipy import stats

from common.arms import FREE
from common.io import atomic_write_text
from common.kappa import kappa_label as common_kappa_label
from common.paths import RunDir, results_root
from common.text import one_line

matplotlib.use("Agg")  # PNGs only, never a display

BODY_LEN = 64
RUN_LEN = 8
NOISE_CHAR = "!"
BLANK_CHAR = "_"
N_STARTS = BODY_LEN - RUN_LEN + 1

# Colours of the paper's Figure 4: blue box = Z drawn per sequence, green = one Z per group.
BLUE = "#2b5fb8"
GREEN = "#2e9b3a"
GREY = "#888888"

# The acceptance check (issue 6), thresholds fixed before looking at any run.
NO_BETTER_MARGIN = 0.05  # 1/64 bit: within - across <= this ("no better than across")
CLEARLY_HIGHER_MARGIN = 0.10  # 1/8 or 1 bit: within - across >= this ("clearly higher")
VALIDITY_DROP = 0.20  # 8 bits: validity <= baseline's - this ("well below")


def _either_passes(have: list[float], n_arms: int) -> str:
    """"1/8 or 1 bit": one measured arm passing is a pass; a fail needs every arm measured
    (a reduced run without the 1-bit arm cannot contradict the claim)."""
    if any(g >= CLEARLY_HIGHER_MARGIN for g in have):
        return "pass"
    return "fail" if len(have) == n_arms else "n/a"


# --------------------------------------------------------------------------- parsing
@dataclass(frozen=True)
class Parsed:
    valid: bool
    start: int | None  # run start in the body when valid
    noise: frozenset[int]  # positions of '!' in the body (any sample)
    full_length: bool


def parse_body(body: str, letter: str) -> Parsed:
    """Read one generated body (the 64 characters after the prompt "<letter>>")."""
    noise = frozenset(i for i, c in enumerate(body[:BODY_LEN]) if c == NOISE_CHAR)
    full = len(body) == BODY_LEN
    invalid = Parsed(False, None, noise, full)
    if not full or any(c not in (BLANK_CHAR, NOISE_CHAR, letter) for c in body):
        return invalid
    pos = [i for i, c in enumerate(body) if c == letter]
    if not pos or pos[-1] - pos[0] + 1 > RUN_LEN:
        return invalid
    lo, hi = pos[0], pos[-1]
    for s in range(max(0, hi - RUN_LEN + 1), min(lo, BODY_LEN - RUN_LEN) + 1):
        if all(c in (letter, NOISE_CHAR) for c in body[s:s + RUN_LEN]):
            return Parsed(True, s, noise, full)  # the first window that fits
    return invalid


def jaccard(a: frozenset[int], b: frozenset[int]) -> float:
    union = a | b
    return 1.0 if not union else len(a & b) / len(union)


# --------------------------------------------------------------------------- metrics
def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def group_metrics(samples: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Validity and agreement metrics for one model's samples (see the module docstring)."""
    groups: dict[tuple[int, int], list[Parsed]] = defaultdict(list)
    kinds: dict[tuple[int, int], str] = {}
    for s in samples:
        key = (int(s["prompt_idx"]), int(s["group"]))
        groups[key].append(parse_body(s["text"], s["letter"]))
        kinds[key] = s["group_kind"]
    parsed = [p for g in groups.values() for p in g]
    pos: dict[str, list[float]] = {"within": [], "across": [], "per_seq": []}
    noi: dict[str, list[float]] = {"within": [], "across": [], "per_seq": []}

    def add(kind: str, a: Parsed, b: Parsed) -> None:
        if a.valid and b.valid:
            pos[kind].append(float(a.start == b.start))
        if a.full_length and b.full_length:
            noi[kind].append(jaccard(a.noise, b.noise))

    for key, g in groups.items():
        kind = "within" if kinds[key] == "shared" else "per_seq"
        for a, b in combinations(g, 2):
            add(kind, a, b)
    shared = sorted(k for k in groups if kinds[k] == "shared")
    for k1, k2 in combinations(shared, 2):
        if k1[0] != k2[0]:
            continue  # across groups means: same prompt, different Z
        for a in groups[k1]:
            for b in groups[k2]:
                add("across", a, b)
    n = len(parsed)
    return {
        "n_samples": n,
        "validity": _mean([float(p.valid) for p in parsed]),
        "pos_agree_within": _mean(pos["within"]),
        "pos_agree_across": _mean(pos["across"]),
        "pos_agree_per_seq": _mean(pos["per_seq"]),
        "noise_jaccard_within": _mean(noi["within"]),
        "noise_jaccard_across": _mean(noi["across"]),
        "noise_jaccard_per_seq": _mean(noi["per_seq"]),
        "noise_rate": _mean([len(p.noise) / BODY_LEN for p in parsed if p.full_length]),
        "n_pairs_within": len(pos["within"]),
        "n_pairs_across": len(pos["across"]),
    }


# --------------------------------------------------------------------------- io
def read_kinds(path: str | os.PathLike) -> tuple[dict, dict[str, list[dict]]]:
    """samples.jsonl in one read -> (meta, records by kind: model, sample, point,
    point_sample; the last two empty in files written before kept checkpoints existed)."""
    with open(path, encoding="utf-8") as f:
        return read_kinds_lines(f)


def read_kinds_lines(lines: Iterable[str]) -> tuple[dict, dict[str, list[dict]]]:
    """read_kinds on the lines of a samples.jsonl (e.g. a committed .gz, decompressed)."""
    meta: dict[str, Any] = {}
    by_kind: dict[str, list[dict]] = {k: [] for k in ("model", "sample", "point",
                                                      "point_sample")}
    for line in lines:
        if not line.strip():
            continue
        r = json.loads(line)
        kind = r.get("kind")
        if kind == "meta":
            meta = r
        elif kind in by_kind:
            by_kind[kind].append(r)
    return meta, by_kind


def kappa_label(kappa_bits: float | None) -> str:
    """common.kappa's label; None (no latent) is the baseline."""
    return "baseline" if kappa_bits is None else common_kappa_label(kappa_bits)


def build_table(models: list[dict], samples: list[dict]) -> pd.DataFrame:
    by_model: dict[str, list[dict]] = defaultdict(list)
    for s in samples:
        by_model[s["model"]].append(s)
    rows = []
    for m in models:
        r = {"model": m["model"], "arm": m["arm"], "kappa_bits": m.get("kappa_bits"),
             "latent_bits": m.get("latent_bits", 0)}
        r.update(group_metrics(by_model.get(m["model"], [])))
        for k in ("kl_bits", "ce_prior", "ce_encoder", "steps", "train_wall_s", "run_id"):
            r[k] = m.get(k)
        rows.append(r)
    df = pd.DataFrame(rows)
    df["_order"] = [(-1.0 if a == "baseline" else float(k)) for a, k in
                    zip(df["arm"], df["kappa_bits"], strict=True)]
    return df.sort_values("_order").drop(columns="_order").reset_index(drop=True)


# --------------------------------------------------------------------------- acceptance
def acceptance(df: pd.DataFrame) -> list[dict[str, Any]]:
    """The issue's expected pattern, checked on the measured table (pass, fail or n/a)."""

    def row_at(kappa: float) -> dict | None:
        hit = df[(df["arm"] == FREE.name) & ((df["kappa_bits"] - kappa).abs() < 1e-9)]
        return None if hit.empty else hit.iloc[0].to_dict()

    def gap(r: dict | None) -> float | None:
        if r is None or r["pos_agree_within"] is None or r["pos_agree_across"] is None:
            return None
        w, a = r["pos_agree_within"], r["pos_agree_across"]
        if any(isinstance(v, float) and math.isnan(v) for v in (w, a)):
            return None
        return float(w - a)

    out = []
    g = gap(row_at(1 / 64))
    out.append({"check": "1/64 bit: position agreement within shared-Z groups no better than "
                         f"across (within - across <= {NO_BETTER_MARGIN})",
                "measured": g, "result": "n/a" if g is None else
                ("pass" if g <= NO_BETTER_MARGIN else "fail")})
    gaps = {k: gap(row_at(v)) for k, v in (("1/8", 1 / 8), ("1", 1.0))}
    have = [v for v in gaps.values() if v is not None]
    out.append({"check": "1/8 or 1 bit: position agreement within shared-Z groups clearly "
                         f"higher than across (within - across >= {CLEARLY_HIGHER_MARGIN})",
                "measured": gaps, "result": _either_passes(have, len(gaps))})
    r8 = row_at(8.0)
    base = df[df["arm"] == "baseline"]
    if r8 is None or base.empty:
        out.append({"check": "8 bits: validity well below the baseline's", "measured": None,
                    "result": "n/a"})
    else:
        v8, vb = float(r8["validity"]), float(base.iloc[0]["validity"])
        out.append({"check": f"8 bits: validity well below the baseline's "
                             f"(<= baseline - {VALIDITY_DROP})",
                    "measured": {"kappa_8": v8, "baseline": vb},
                    "result": "pass" if v8 <= vb - VALIDITY_DROP else "fail"})
    return out


# --------------------------------------------------------------------------- rendering
TABLE_COLUMNS = {
    "model": "model", "kappa_bits": "kappa (bits)", "n_samples": "N", "validity": "validity",
    "pos_agree_within": "pos. agree, shared Z", "pos_agree_across": "pos. agree, across Z",
    "pos_agree_per_seq": "pos. agree, Z per seq.",
    "noise_jaccard_within": "noise Jaccard, shared Z",
    "noise_jaccard_across": "noise Jaccard, across Z", "noise_rate": "'!' rate",
    "kl_bits": "KL bits/token", "ce_prior": "CE prior Z", "ce_encoder": "CE encoder Z (leaks)",
}


def _fmt(v: Any, col: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if col == "kappa_bits":
        return kappa_label(float(v))
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def table_markdown(df: pd.DataFrame, meta: dict, checks: list[dict]) -> str:
    shown = pd.DataFrame({TABLE_COLUMNS[c]: [_fmt(v, c) for v in df[c]] for c in TABLE_COLUMNS})
    lines = [shown.to_markdown(index=False, disable_numparse=True)]
    s = meta.get("settings", {})
    notes = [
        "",
        f"N = generated samples per model ({s.get('n_prompts', '?')} prompts x "
        f"({s.get('n_shared_groups', '?')} shared-Z groups + 1 group with Z per sequence) x "
        f"{s.get('group_size', '?')} rows), temperature {s.get('temperature', '?')}. "
        "Agreement = fraction of pairs of valid samples with the same run start (chance about "
        f"1/{N_STARTS} = {1 / N_STARTS:.3f}); noise Jaccard over the sets of '!' positions. "
        f"CE in nats per character over the {BODY_LEN} body characters of "
        f"{s.get('n_eval', '?')} held-out sequences; KL per token from the encoder, in bits. "
        "CE with encoder Z leaks (the encoder has seen the targets); CE with prior Z is the "
        "model's honest number.",
        "",
        f"Setting `{s.get('setting', '?')}`, H = {s.get('latent_bits', '?')} latent bits, "
        f"training overrides: `{' '.join(s.get('train_overrides', []))}`; "
        f"training {sum(float(m) for m in df['train_wall_s'] if m == m and m is not None):.0f} "
        f"s summed over the arms (per arm in table.csv), measurement "
        f"{meta.get('wall_s', float('nan')):.0f} s.",
        "",
        "Acceptance check (issue 6; thresholds fixed before the runs):",
        "",
    ]
    for c in checks:
        notes.append(f"- **{c['result']}**: {c['check']}; measured: {_fmt_measured(c['measured'])}")
    return "\n".join(lines + notes) + "\n"


def _fmt_measured(m: Any) -> str:
    if m is None:
        return "n/a"
    if isinstance(m, dict):
        return ", ".join(f"{k}: {_fmt_measured(v)}" for k, v in m.items())
    if isinstance(m, float):
        return f"{m:.3f}"
    return str(m)


def _panel_title(m: dict) -> str:
    if m["arm"] == "baseline":
        return "baseline (no Z)"
    kl = m.get("kl_bits")
    kl_s = "" if kl is None else f", KL {kl:.3f} bit/token"
    return f"kappa = {kappa_label(m['kappa_bits'])} bit{kl_s}"


def render_figure(models: list[dict], samples: list[dict], path: str | os.PathLike,
                  rows_per_group: int = 8, prompt_idx: int = 0, fontsize: float = 6.5) -> Path:
    """The Figure-4 analogue: per model, for one prompt, one group with Z drawn per sequence
    (blue box) and two groups each sharing one Z (green boxes), as monospaced text."""
    order = sorted(models, key=lambda m: -1.0 if m["arm"] == "baseline" else m["kappa_bits"])
    by: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for s in samples:
        if int(s["prompt_idx"]) == prompt_idx:
            by[(s["model"], int(s["group"]))].append(s)
    cw = 0.602 * fontsize / 72.0  # monospace advance, inches
    lh = 1.22 * fontsize / 72.0  # line height, inches
    n_chars = 2 + BODY_LEN + 4
    gap_lines, title_lines = 1.2, 2.2
    panel_lines = title_lines + 3 * (rows_per_group + gap_lines) + 2.2
    ncols = 2 if len(order) > 2 else 1
    nrows = math.ceil(len(order) / ncols)
    pw, ph = n_chars * cw, panel_lines * lh
    margin = 0.25
    fw = ncols * pw + (ncols + 1) * margin
    fh = nrows * ph + (nrows + 1) * margin
    fig = plt.figure(figsize=(fw, fh), dpi=170)
    for i, m in enumerate(order):
        r, c = divmod(i, ncols)
        left = (margin + c * (pw + margin)) / fw
        bottom = 1 - (margin + (r + 1) * ph + r * margin) / fh
        ax = fig.add_axes((left, bottom, pw / fw, ph / fh))
        ax.set_xlim(0, n_chars)
        ax.set_ylim(panel_lines, 0)  # y in lines, top to bottom
        ax.axis("off")
        ax.text(0.3, 1.0, _panel_title(m), fontsize=fontsize + 1.5, fontweight="bold",
                va="center", ha="left")
        y = title_lines
        groups = sorted({g for (mm, g) in by if mm == m["model"]})
        per_seq = [g for g in groups if by[(m["model"], g)][0]["group_kind"] == "per_sequence"]
        shared = [g for g in groups if by[(m["model"], g)][0]["group_kind"] == "shared"]
        for j, g in enumerate(per_seq[:1] + shared[:2]):
            rows = sorted(by[(m["model"], g)], key=lambda s: s["row"])[:rows_per_group]
            kind = rows[0]["group_kind"]
            base = m["arm"] == "baseline"
            colour = GREY if base else (BLUE if kind == "per_sequence" else GREEN)
            label = ("independent samples" if base else
                     "Z drawn per sequence" if kind == "per_sequence" else f"shared Z #{j}")
            ax.add_patch(Rectangle((1.0, y - 0.55), 2 + BODY_LEN + 1.0, len(rows) + 0.1,
                                   fill=False, edgecolor=colour, linewidth=1.3))
            ax.text(n_chars - 0.2, y - 0.9, label, fontsize=fontsize - 1, color=colour,
                    ha="right", va="center")
            for k, s in enumerate(rows):
                ax.text(1.5, y + k, f"{s['letter']}>{s['text']}", family="monospace",
                        fontsize=fontsize, va="center", ha="left")
            y += len(rows) + gap_lines
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out


# --------------------------------------------------------------------------- seeds
# The four regimes of Figure 4, one per kappa, each judged per seed. The position margins are
# the acceptance check's; the noise margins reuse them (fixed before any multi-seed run).
NOISE_MARGIN = CLEARLY_HIGHER_MARGIN  # 1 bit: noise Jaccard shared - across >= this


@dataclass(frozen=True)
class Regime:
    kappa_bits: float
    expected: str  # what the paper shows at this kappa
    rule: str  # the rule, in words, as the tables print it


REGIMES = (
    Regime(1 / 64, "Z unused",
           f"position gap <= {NO_BETTER_MARGIN} and noise gap <= {NO_BETTER_MARGIN}"),
    Regime(1 / 8, "position",
           f"position gap >= {CLEARLY_HIGHER_MARGIN}"),
    Regime(1.0, "position and noise",
           f"position gap >= {CLEARLY_HIGHER_MARGIN} and noise gap >= {NOISE_MARGIN}"),
    Regime(8.0, "collapse (leaking)",
           f"validity <= the same seed's baseline's - {VALIDITY_DROP}"),
)

# per-seed columns: the measured numbers (None where not measured, never 0)
SEED_METRICS = ("kl_bits", "pos_agree_within", "pos_agree_across", "pos_gap",
                "noise_jaccard_within", "noise_jaccard_across", "noise_gap", "validity",
                "noise_rate", "ce_prior", "ce_encoder", "train_wall_s")
CURVE_POINTS = 16  # KL over training: the logged training batches binned into this many points


def regime_for(kappa_bits: float | None) -> Regime | None:
    if kappa_bits is None:
        return None
    return next((r for r in REGIMES if abs(r.kappa_bits - kappa_bits) < 1e-12), None)


def _num(v: Any) -> float | None:
    """A measured number, or None (missing; NaN from a CSV counts as missing)."""
    if v is None:
        return None
    f = float(v)
    return None if math.isnan(f) else f


def _diff(a: Any, b: Any) -> float | None:
    a, b = _num(a), _num(b)
    return None if a is None or b is None else a - b


def regime_result(kappa_bits: float | None, row: dict,
                  baseline_validity: float | None) -> str | None:
    """'pass', 'fail' or 'n/a' (not measurable) for the row's regime; None: no regime here."""
    r = regime_for(kappa_bits)
    if r is None:
        return None
    pos, noise = _num(row.get("pos_gap")), _num(row.get("noise_gap"))
    if r.expected == "Z unused":
        if pos is None or noise is None:
            return "n/a"
        return "pass" if pos <= NO_BETTER_MARGIN and noise <= NO_BETTER_MARGIN else "fail"
    if r.expected == "position":
        return "n/a" if pos is None else ("pass" if pos >= CLEARLY_HIGHER_MARGIN else "fail")
    if r.expected == "position and noise":
        if pos is None or noise is None:
            return "n/a"
        return "pass" if pos >= CLEARLY_HIGHER_MARGIN and noise >= NOISE_MARGIN else "fail"
    v = _num(row.get("validity"))
    if v is None or baseline_validity is None:
        return "n/a"
    return "pass" if v <= baseline_validity - VALIDITY_DROP else "fail"


AGREEMENT_COLUMNS = ("name", "seed", "model", "kappa_bits", "step", "final", "kl_bits",
                     "ce_prior", "ce_encoder", "validity", "pos_agree_within",
                     "pos_agree_across", "pos_gap", "noise_jaccard_within",
                     "noise_jaccard_across", "noise_gap", "n_samples")


def agreement_rows(models: list[dict], samples: list[dict], points: list[dict],
                   point_samples: list[dict]) -> list[dict[str, Any]]:
    """Per model with kept checkpoints: one row per checkpoint, then the final model at its
    step, each with the held-out measures (KL and CE from the encoder and prior on the held-out
    sequences; validity and agreement from the samples). A model that kept none has no rows."""
    def row(rec: dict, smp: list[dict], step: Any, final: bool) -> dict[str, Any]:
        g = group_metrics(smp)
        r = {"model": rec["model"], "kappa_bits": None if rec.get("arm") == "baseline"
             else _num(rec.get("kappa_bits")), "step": int(step), "final": final,
             **{k: _num(rec.get(k)) for k in ("kl_bits", "ce_prior", "ce_encoder")},
             **{k: _num(g[k]) for k in ("validity", "pos_agree_within", "pos_agree_across",
                                        "noise_jaccard_within", "noise_jaccard_across")},
             "n_samples": g["n_samples"]}
        r["pos_gap"] = _diff(r["pos_agree_within"], r["pos_agree_across"])
        r["noise_gap"] = _diff(r["noise_jaccard_within"], r["noise_jaccard_across"])
        return r

    by_point: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for sm in point_samples:
        by_point[(sm["model"], int(sm["step"]))].append(sm)
    by_model: dict[str, list[dict]] = defaultdict(list)
    for sm in samples:
        by_model[sm["model"]].append(sm)
    out = []
    for m in models:
        pts = sorted((p for p in points if p["model"] == m["model"]), key=lambda p: p["step"])
        if not pts:
            continue
        out += [row(p, by_point[(m["model"], int(p["step"]))], p["step"], False) for p in pts]
        if m.get("steps") is not None:  # the final model is the last point
            out.append(row(m, by_model[m["model"]], m["steps"], True))
    return out


# --------------------------------------------------------------------------- intervals
# Every gap (shared Z - across Z) carries a 95% interval and a permutation p (issue 38).
# - p: one-sided permutation test of "Z does not matter": within each prompt the shared rows'
#   group labels are shuffled (group sizes kept), N_PERM times; p = (1 + #{shuffled gap >=
#   observed}) / (1 + N_PERM). Exact under the null (the rows of a prompt's shared groups are
#   exchangeable when Z carries nothing), whatever the dependence between pairs.
# - interval: delete-one-group jackknife over the shared Z groups (the unit Z is drawn for),
#   gap +- t(n_groups - 1) * se. Pairs share rows, so a plain binomial interval over pairs would
#   be far too narrow; the groups are the independent draws. docs/CALIBRATION.md measures its
#   coverage on planted truth (a percentile bootstrap over groups covered less; see there).
# - validity minus the same seed's baseline: the same jackknife over all groups of each arm
#   (the arms are independent), se added in quadrature, t with min(n_groups) - 1 df.
# - CE with prior Z: mean +- t * sd / sqrt(n_eval) where the run recorded the per-sequence SD
#   (`ce_prior_sd`, written since issue 38); older runs have no interval (said, never invented).
# scipy/numpy have no permutation test for a pair statistic with this blocked design
# (scipy.stats.permutation_test permutes samples, not group labels of pairs), hence the code.
GAP_ALPHA = 0.05
GAP_LEVEL = 0.95
N_PERM = 9999
PERM_SEED = 38  # one fixed stream: the same shuffles for every model, rerunnable
GAP_KINDS = ("pos", "noise")

GAP_COLUMNS = ("name", "seed", "model", "kappa_bits", "latent_bits", "step", "final",
               "n_groups", "n_rows", "pos_gap", "pos_lo", "pos_hi", "pos_p", "n_pos_within",
               "n_pos_across", "noise_gap", "noise_lo", "noise_hi", "noise_p",
               "n_noise_within", "n_noise_across", "validity", "validity_lo", "validity_hi",
               "n_groups_all", "n_rows_all", "validity_base", "validity_diff",
               "validity_diff_lo", "validity_diff_hi", "ce_prior",
               "ce_prior_lo", "ce_prior_hi", "n_perm")


@dataclass
class _PromptPairs:
    """One prompt's shared-Z rows: group index per row and the pair matrices (zero diagonal):
    pos = both valid and the same start, pos_n = both valid, noise = Jaccard of the '!' sets
    when both are full length, noise_n = both full length."""

    labels: np.ndarray
    mats: dict[str, np.ndarray]


def _prompt_pairs(samples: Iterable[dict[str, Any]]) -> list[_PromptPairs]:
    rows: dict[int, list[tuple[int, Parsed]]] = defaultdict(list)
    for s in samples:
        if s["group_kind"] == "shared":
            rows[int(s["prompt_idx"])].append((int(s["group"]),
                                               parse_body(s["text"], s["letter"])))
    out = []
    for p in sorted(rows):
        groups = sorted({g for g, _ in rows[p]})
        labels = np.array([groups.index(g) for g, _ in rows[p]])
        ps = [x for _, x in rows[p]]
        n = len(ps)
        m = {k: np.zeros((n, n)) for k in ("pos", "pos_n", "noise", "noise_n")}
        for i, j in combinations(range(n), 2):
            a, b = ps[i], ps[j]
            if a.valid and b.valid:
                m["pos_n"][i, j] = m["pos_n"][j, i] = 1.0
                m["pos"][i, j] = m["pos"][j, i] = float(a.start == b.start)
            if a.full_length and b.full_length:
                m["noise_n"][i, j] = m["noise_n"][j, i] = 1.0
                m["noise"][i, j] = m["noise"][j, i] = jaccard(a.noise, b.noise)
        out.append(_PromptPairs(labels, m))
    return out


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def _gap_of(within: dict[str, float], total: dict[str, float], kind: str) -> float | None:
    """shared - across from summed pair values: within[k] over same-group pairs, total[k] over
    all pairs of a prompt's shared rows (across = total - within)."""
    w = _ratio(within[kind], within[kind + "_n"])
    a = _ratio(total[kind] - within[kind], total[kind + "_n"] - within[kind + "_n"])
    return None if w is None or a is None else w - a


def _blocks(pp: _PromptPairs) -> dict[str, np.ndarray]:
    """Per matrix, the group-by-group sums L^T M L (G x G; the diagonal counts each within
    pair twice, an off-diagonal cell the pairs between two groups)."""
    L = np.eye(int(pp.labels.max()) + 1)[pp.labels]
    return {k: L.T @ m @ L for k, m in pp.mats.items()}


def gap_tests(samples: Sequence[dict[str, Any]], n_perm: int = N_PERM,
              seed: int = PERM_SEED, level: float = GAP_LEVEL) -> dict[str, Any]:
    """Position and noise gaps of one model's samples (one checkpoint) with their jackknife
    interval over the shared Z groups and one-sided permutation p; n stated (groups, rows,
    pairs). A gap with no pair on one side is None, and so are its interval and p."""
    prompts = [pp for pp in _prompt_pairs(samples) if pp.labels.size]
    keys = ("pos", "pos_n", "noise", "noise_n")
    blocks = [_blocks(pp) for pp in prompts]
    within = {k: sum(float(np.trace(b[k])) / 2 for b in blocks) for k in keys}
    total = {k: sum(float(b[k].sum()) / 2 for b in blocks) for k in keys}
    n_groups = sum(int(pp.labels.max()) + 1 for pp in prompts)
    out: dict[str, Any] = {"n_groups": n_groups,
                           "n_rows": sum(int(pp.labels.size) for pp in prompts),
                           "n_perm": n_perm}
    for kind in GAP_KINDS:
        out[f"n_{kind}_within"] = int(within[kind + "_n"])
        out[f"n_{kind}_across"] = int(total[kind + "_n"] - within[kind + "_n"])
    # jackknife: drop one (prompt, group) at a time
    loo: dict[str, list[float]] = {kind: [] for kind in GAP_KINDS}
    for b in blocks:
        for g in range(b["pos"].shape[0]):
            w = {k: within[k] - float(b[k][g, g]) / 2 for k in keys}
            t = {k: total[k] - float(b[k][g].sum()) + float(b[k][g, g]) / 2 for k in keys}
            for kind in GAP_KINDS:
                v = _gap_of(w, t, kind)
                if v is not None:
                    loo[kind].append(v)
    # permutations: the same shuffles for both gaps
    rng = np.random.default_rng(seed)
    perm_w = {k: np.zeros(n_perm) for k in keys}
    for pp in prompts:
        G = int(pp.labels.max()) + 1
        lab = rng.permuted(np.tile(pp.labels, (n_perm, 1)), axis=1)
        L = np.eye(G)[lab]  # (n_perm, rows, G)
        for k in keys:
            perm_w[k] += (L * (pp.mats[k] @ L)).sum(axis=(1, 2)) / 2
    for kind in GAP_KINDS:
        g = _gap_of(within, total, kind)
        lo = hi = p = None
        if g is not None:
            jk = np.asarray(loo[kind])
            n = jk.size
            if n >= 2:
                se = math.sqrt((n - 1) / n * float(((jk - jk.mean()) ** 2).sum()))
                half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * se
                lo, hi = max(-1.0, g - half), min(1.0, g + half)
            with np.errstate(invalid="ignore", divide="ignore"):
                pw = perm_w[kind] / perm_w[kind + "_n"]
                pa = ((total[kind] - perm_w[kind])
                      / (total[kind + "_n"] - perm_w[kind + "_n"]))
            pg = pw - pa
            # a shuffle with no pair on one side counts against the finding (conservative)
            hits = int(np.sum(~np.isfinite(pg) | (pg >= g - 1e-12)))
            p = (1 + hits) / (1 + n_perm)
        out.update({f"{kind}_gap": g, f"{kind}_lo": lo, f"{kind}_hi": hi, f"{kind}_p": p})
    return out


def _validity_jackknife(samples: Sequence[dict[str, Any]]
                        ) -> tuple[float | None, float, int, int]:
    """Validity over all rows, its delete-one-group jackknife variance, groups, rows."""
    groups: dict[tuple[int, int], list[bool]] = defaultdict(list)
    for s in samples:
        groups[(int(s["prompt_idx"]), int(s["group"]))].append(
            parse_body(s["text"], s["letter"]).valid)
    k = np.array([sum(v) for v in groups.values()], dtype=float)
    n = np.array([len(v) for v in groups.values()], dtype=float)
    if n.sum() == 0:
        return None, math.nan, 0, 0
    v = float(k.sum() / n.sum())
    m = k.size
    if m < 2:
        return v, math.nan, m, int(n.sum())
    jk = (k.sum() - k) / (n.sum() - n)
    var = (m - 1) / m * float(((jk - jk.mean()) ** 2).sum())
    return v, var, m, int(n.sum())


def validity_diff(ft: Sequence[dict[str, Any]], base: Sequence[dict[str, Any]],
                  level: float = GAP_LEVEL) -> dict[str, Any]:
    """Validity of `ft` minus the baseline's (same seed, same step), with its interval."""
    v, var, m, _ = _validity_jackknife(ft)
    vb, varb, mb, _ = _validity_jackknife(base)
    if v is None or vb is None:
        return {"validity_diff": None, "validity_diff_lo": None, "validity_diff_hi": None}
    d = v - vb
    if not (math.isfinite(var) and math.isfinite(varb)) or min(m, mb) < 2:
        return {"validity_diff": d, "validity_diff_lo": None, "validity_diff_hi": None}
    half = float(stats.t.ppf(0.5 + level / 2, min(m, mb) - 1)) * math.sqrt(var + varb)
    return {"validity_diff": d, "validity_diff_lo": max(-1.0, d - half),
            "validity_diff_hi": min(1.0, d + half)}


def ce_interval(rec: dict[str, Any], level: float = GAP_LEVEL) -> tuple[float | None,
                                                                         float | None]:
    """CE with prior Z +- t * sd / sqrt(n_eval), from the per-sequence SD the run recorded
    (`ce_prior_sd`); (None, None) for runs that did not record it."""
    ce, sd, n = _num(rec.get("ce_prior")), _num(rec.get("ce_prior_sd")), _num(rec.get("n_eval"))
    if ce is None or sd is None or n is None or n < 2:
        return None, None
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return ce - half, ce + half


def gap_rows(name: str, seed: Any, models: list[dict], samples: list[dict],
             points: list[dict], point_samples: list[dict],
             n_perm: int = N_PERM) -> list[dict[str, Any]]:
    """One row per model and measured step (every kept checkpoint, then the final model):
    the gaps with intervals and p, validity minus the same seed's baseline at the same step,
    and CE with prior Z with its interval where recorded (GAP_COLUMNS)."""
    by: dict[tuple[str, int | None], list[dict]] = defaultdict(list)
    for s in samples:
        by[(s["model"], None)].append(s)
    for s in point_samples:
        by[(s["model"], int(s["step"]))].append(s)
    base = next((m["model"] for m in models if m.get("arm") == "baseline"), None)
    final_step = {m["model"]: m.get("steps") for m in models}
    out = []
    units: list[tuple[dict, int | None]] = [(p, int(p["step"])) for p in points]
    units += [(m, None) for m in models]
    for rec, step in units:
        smp = by[(rec["model"], step)]
        if not smp:
            continue
        g = gap_tests(smp, n_perm=n_perm)
        base_key = None
        if base is not None:
            base_key = (base, step) if (base, step) in by else None
        vd = (validity_diff(smp, by[base_key]) if base_key is not None and
              rec["model"] != base else {"validity_diff": None, "validity_diff_lo": None,
                                         "validity_diff_hi": None})
        v, var, m_all, n_all = _validity_jackknife(smp)
        v_lo = v_hi = None
        if v is not None and math.isfinite(var) and m_all >= 2:
            half = float(stats.t.ppf(0.5 + GAP_LEVEL / 2, m_all - 1)) * math.sqrt(var)
            v_lo, v_hi = max(0.0, v - half), min(1.0, v + half)
        vb = (_validity_jackknife(by[base_key])[0] if base_key is not None
              and rec["model"] != base else None)
        lo, hi = ce_interval(rec)
        st = final_step.get(rec["model"]) if step is None else step
        out.append({"name": name, "seed": seed, "model": rec["model"],
                    "kappa_bits": None if rec.get("arm") == "baseline"
                    else _num(rec.get("kappa_bits")),
                    "latent_bits": rec.get("latent_bits"),
                    "step": None if st is None else int(st), "final": step is None, **g,
                    "validity": v, "validity_lo": v_lo, "validity_hi": v_hi,
                    "n_groups_all": m_all, "n_rows_all": n_all, "validity_base": vb, **vd,
                    "ce_prior": _num(rec.get("ce_prior")), "ce_prior_lo": lo,
                    "ce_prior_hi": hi})
    return out


# --------------------------------------------------------------------------- rules v2
# Issue 38's regime rules ("v2"), written and committed before any interval of the committed
# runs was computed (their point estimates, in the tables since issue 6, and a reviewer's
# permutation p for 1/8 bit were known). The v1 rules (REGIMES, issue 6) stay, and every table
# shows both. Each predicate is three-valued: "yes", "no" or "unclear" (the data shows neither);
# a rule holds when every predicate it needs has the wanted value, fails when one has the other
# value, and is unclear otherwise. A rule is an intersection of tests, so it needs no
# multiplicity correction (it holds only if each test does at its own 5%).
NEGLIGIBLE_MARGIN = NO_BETTER_MARGIN  # 0.05: a gap below this is too small to call encoding
LEAK_VALIDITY_DROP = VALIDITY_DROP  # 0.2: validity this far below the baseline's is broken
_P_LETTER = RUN_LEN / BODY_LEN * (1 - 1 / 16)
_P_BLANK = (BODY_LEN - RUN_LEN) / BODY_LEN * (1 - 1 / 16)
UNIGRAM_CE = -sum(p * math.log(p) for p in (_P_LETTER, 1 / 16, _P_BLANK))
"""0.587 nats/char: CE of a predictor that knows the prompt's letter and how often each
character occurs, but nothing of where the run is (a task constant, not a measurement). A model
whose CE with prior Z is above it predicts the real sequences worse than that: the Z it draws
from the prior misleads its decoder, i.e. generation from the prior breaks."""

PREDICATES: dict[str, str] = {
    "pos_encoded": (f"Z encodes the position: yes if the position gap's permutation p < "
                    f"{GAP_ALPHA}; no if p >= {GAP_ALPHA} and its 95% interval lies below "
                    f"{NEGLIGIBLE_MARGIN}; unclear otherwise"),
    "noise_encoded": "Z encodes the noise: the same on the noise gap",
    "pos_negligible": (f"the position gap is negligible: yes if its 95% interval lies below "
                       f"{NEGLIGIBLE_MARGIN}; no if it lies above {NEGLIGIBLE_MARGIN}; "
                       "unclear otherwise"),
    "noise_negligible": "the noise gap is negligible: the same on the noise gap",
    "validity_drop": (f"validity is broken: yes if the 95% interval of validity minus the same "
                      f"seed's baseline's lies below -{LEAK_VALIDITY_DROP}; no if it lies above "
                      f"-{LEAK_VALIDITY_DROP} (with no baseline arm: no if the validity's own "
                      f"interval lies above 1 - {LEAK_VALIDITY_DROP}); unclear otherwise"),
    "ce_broken": (f"CE with prior Z is broken: yes if it is above {UNIGRAM_CE:.3f} nats/char "
                  "(the task's unigram CE: the prompt's letter and the character frequencies, "
                  "nothing of the position) by its 95% interval; no if below it; unclear "
                  "otherwise; runs that recorded no per-sequence SD are judged on the point "
                  "estimate"),
    "leaking": ("leaking (the encoder passes the tokens through Z; generation with Z from the "
                "prior breaks): validity is broken or CE with prior Z is broken (yes if either "
                "is yes, no if both are no, unclear otherwise)"),
}


@dataclass(frozen=True)
class RuleV2:
    kappa_bits: float
    regime: str  # what the paper shows at this kappa, in this file's words
    needs: tuple[tuple[str, bool], ...]  # (predicate, wanted: True = yes, False = no)
    text: str  # the rule in words, as the doc and tables print it


REGIMES_V2 = (
    RuleV2(1 / 64, "Z unused", (("pos_negligible", True), ("noise_negligible", True)),
           "position gap negligible and noise gap negligible"),
    RuleV2(1 / 8, "position",
           (("pos_encoded", True), ("noise_negligible", True), ("leaking", False)),
           "Z encodes the position, the noise gap is negligible, and not leaking"),
    RuleV2(1.0, "position and noise",
           (("pos_encoded", True), ("noise_encoded", True), ("leaking", False)),
           "Z encodes the position and the noise, and not leaking"),
    RuleV2(8.0, "leaking (the paper's collapse)", (("leaking", True),), "leaking"),
)

VERDICT_COLUMNS = ("name", "seed", "model", "kappa_bits", "latent_bits", "kl_penalty",
                   "regime", "result_v1", "result_v2", *PREDICATES, "why_v2")


def rule_v2_for(kappa_bits: float | None) -> RuleV2 | None:
    if kappa_bits is None:
        return None
    return next((r for r in REGIMES_V2 if abs(r.kappa_bits - kappa_bits) < 1e-12), None)


def _yes_no(yes: bool | None, no: bool | None) -> str:
    """'yes' / 'no' / 'unclear' from two conditions (None: not measurable)."""
    if yes:
        return "yes"
    if no:
        return "no"
    return "unclear"


def _or3(a: str, b: str) -> str:
    if "yes" in (a, b):
        return "yes"
    return "no" if a == b == "no" else "unclear"


def predicates(row: dict[str, Any]) -> dict[str, str]:
    """The v2 predicates of one final-model row of gaps.csv (PREDICATES says each rule)."""
    out: dict[str, str] = {}
    for kind in GAP_KINDS:
        p, lo, hi = (_num(row.get(f"{kind}_{k}")) for k in ("p", "lo", "hi"))
        below = None if hi is None else hi < NEGLIGIBLE_MARGIN
        above = None if lo is None else lo > NEGLIGIBLE_MARGIN
        detected = None if p is None else p < GAP_ALPHA
        out[f"{kind}_encoded"] = _yes_no(detected, (detected is False) and below)
        out[f"{kind}_negligible"] = _yes_no(below, above)
    d_lo, d_hi = _num(row.get("validity_diff_lo")), _num(row.get("validity_diff_hi"))
    if d_lo is not None and d_hi is not None:
        out["validity_drop"] = _yes_no(d_hi < -LEAK_VALIDITY_DROP, d_lo > -LEAK_VALIDITY_DROP)
    else:  # no baseline at this step: no baseline can sit 0.2 above a validity above 0.8
        v_lo = _num(row.get("validity_lo"))
        out["validity_drop"] = _yes_no(None, None if v_lo is None
                                       else v_lo > 1 - LEAK_VALIDITY_DROP)
    ce = _num(row.get("ce_prior"))
    c_lo, c_hi = _num(row.get("ce_prior_lo")), _num(row.get("ce_prior_hi"))
    if ce is None:
        out["ce_broken"] = "unclear"
    else:
        lo_, hi_ = (c_lo, c_hi) if c_lo is not None and c_hi is not None else (ce, ce)
        out["ce_broken"] = _yes_no(lo_ > UNIGRAM_CE, hi_ <= UNIGRAM_CE)
    out["leaking"] = _or3(out["validity_drop"], out["ce_broken"])
    return out


def judge_v2(kappa_bits: float | None, preds: dict[str, str]) -> tuple[str | None, str]:
    """('holds' | 'fails' | 'unclear', why) for the kappa's v2 rule; (None, '') without one."""
    rule = rule_v2_for(kappa_bits)
    if rule is None:
        return None, ""
    parts, bad, unsure = [], False, False
    for pred, want in rule.needs:
        v = preds[pred]
        parts.append(f"{pred.replace('_', ' ')}: {v}")
        bad |= v == ("no" if want else "yes")
        unsure |= v == "unclear"
    return ("fails" if bad else "unclear" if unsure else "holds"), "; ".join(parts)


def result_v1(kappa_bits: float | None, row: dict[str, Any]) -> str | None:
    """The issue-6 rule (regime_result) from a gaps.csv row's point estimates."""
    return regime_result(kappa_bits, row, _num(row.get("validity_base")))


def verdicts(gaps: pd.DataFrame) -> pd.DataFrame:
    """Per run and model (final models only): the v1 and v2 results side by side, with every
    v2 predicate and why (VERDICT_COLUMNS)."""
    rows = []
    for _, r in gaps[gaps["final"].astype(bool)].iterrows():
        k = _num(r["kappa_bits"])
        if k is None:
            continue
        row = r.to_dict()
        preds = predicates(row)
        res, why = judge_v2(k, preds)
        h = _num(r.get("latent_bits"))
        rule = rule_v2_for(k)
        rows.append({"name": r["name"], "seed": r["seed"], "model": r["model"],
                     "kappa_bits": k, "latent_bits": None if h is None else int(h),
                     # KL <= H bits, so max(0, KL - kappa) is identically 0 when kappa >= H
                     "kl_penalty": ("none (kappa >= H)" if h is not None and k >= h
                                    else "free bits"),
                     "regime": rule.regime if rule else None,
                     "result_v1": result_v1(k, row), "result_v2": res, **preds,
                     "why_v2": why})
    return pd.DataFrame(rows, columns=list(VERDICT_COLUMNS))


def _run_metrics_path(model: dict, root: Path) -> Path | None:
    """The arm's metrics.jsonl: at its recorded run_dir, else under <results>/runs/<run_id>."""
    for run in (model.get("run_dir") and RunDir(Path(model["run_dir"])),
                model.get("run_id") and RunDir.of(model["run_id"], root)):
        if run and run.has_metrics:
            return run.metrics_path
    return None


def kl_curve(metrics_path: Path, points: int = CURVE_POINTS,
             has_kl: bool = True) -> list[dict[str, Any]]:
    """The trainer's per-batch KL (bits/token) and CE (nats/token, Z from the encoder),
    averaged in `points` equal bins of steps; each point is labelled by its bin's last step.
    has_kl=False (the baseline, whose log says 0.0): KL is None, not zero."""
    recs = []
    for line in metrics_path.read_text(encoding="utf-8").splitlines():
        if '"train"' in line:
            r = json.loads(line)
            if r.get("kind") == "train" and r.get("ce") is not None:
                recs.append(r)
    if not recs:
        return []
    last = max(int(r["step"]) for r in recs)
    width = max(1, math.ceil(last / points))
    bins: dict[int, list[dict]] = defaultdict(list)
    for r in recs:
        bins[min(last, math.ceil(int(r["step"]) / width) * width)].append(r)
    return [{"step": s, "kl_bits": _mean([float(r["kl_bits"]) for r in rs
                                          if has_kl and r.get("kl_bits") is not None]),
             "ce": _mean([float(r["ce"]) for r in rs if r.get("ce") is not None]),
             "n_batches": len(rs)} for s, rs in sorted(bins.items())]


@dataclass
class SeedAggregate:
    per_seed: pd.DataFrame  # one row per (name, model); missing names: rows of None
    summary: pd.DataFrame  # one row per model: mean and n of every metric, regime counts
    curves: pd.DataFrame  # KL over training per (name, model, step)
    meta: dict[str, Any]  # provenance: sources, settings, wall times
    agreement: pd.DataFrame  # held-out measures per (name, model, kept checkpoint)
    gaps: pd.DataFrame | None = None  # gaps with intervals and p per (name, model, step)


def aggregate(names: Sequence[str], root: Path | None = None) -> SeedAggregate:
    """Several `make synthetic` runs (one per seed) -> per-seed and mean tables.

    A name without samples.jsonl is missing: its rows are None and every count says so.
    ValueError when no name has one."""
    import hashlib

    root = results_root() if root is None else Path(root)
    if len(set(names)) != len(names):
        raise ValueError(f"--names {' '.join(names)}: a name is given twice")
    rows: list[dict[str, Any]] = []
    curve_rows: list[dict[str, Any]] = []
    agree_rows: list[dict[str, Any]] = []
    gap_rows_all: list[dict[str, Any]] = []
    sources: list[dict[str, Any]] = []
    labels: dict[str, float | None] = {}
    missing: list[str] = []
    for name in names:
        f = root / "synthetic" / name / "samples.jsonl"
        if not f.is_file():
            missing.append(name)
            sources.append({"name": name, "status": "missing", "path": str(f)})
            continue
        meta, kinds = read_kinds(f)  # one read: final models, samples and kept checkpoints
        models, samples = kinds["model"], kinds["sample"]
        if not models:
            raise ValueError(f"{f} holds no model records")
        st = meta.get("settings", {})
        seed = st.get("seed")
        agree_rows += [{"name": name, "seed": seed, **r} for r in
                       agreement_rows(models, samples, kinds["point"], kinds["point_sample"])]
        gap_rows_all += gap_rows(name, seed, models, samples, kinds["point"],
                                 kinds["point_sample"])
        df = build_table(models, samples)
        base = df[df["arm"] == "baseline"]
        base_v = _num(base.iloc[0]["validity"]) if not base.empty else None
        no_curve = []
        for m, r in zip(models, (df.set_index("model").loc[m["model"]].to_dict()
                                 for m in models), strict=True):
            k = None if m["arm"] == "baseline" else float(m["kappa_bits"])
            labels[m["model"]] = k
            row = {"name": name, "seed": seed, "status": "measured", "model": m["model"],
                   "kappa_bits": k, "steps": m.get("steps"), "run_id": m.get("run_id")}
            for c in SEED_METRICS:
                if c not in ("pos_gap", "noise_gap"):
                    row[c] = _num(r.get(c))
            row["pos_gap"] = _diff(row["pos_agree_within"], row["pos_agree_across"])
            row["noise_gap"] = _diff(row["noise_jaccard_within"], row["noise_jaccard_across"])
            reg = regime_for(k)
            row["regime"] = reg.expected if reg else None
            row["regime_result"] = regime_result(k, row, base_v)
            rows.append(row)
            mp = _run_metrics_path(m, root)
            if mp is None:
                no_curve.append(m["model"])
            for p in (kl_curve(mp, has_kl=k is not None) if mp else []):
                curve_rows.append({"name": name, "seed": seed, "model": m["model"],
                                   "kappa_bits": k, **p})
        sources.append({"name": name, "status": "measured", "path": str(f),
                        "sha256": hashlib.sha256(f.read_bytes()).hexdigest(),
                        "created": meta.get("created"), "seed": seed,
                        "setting": st.get("setting"), "latent_bits": st.get("latent_bits"),
                        "high_latent_bits": st.get("high_latent_bits"),
                        "kappas": st.get("kappas"), "baseline": st.get("baseline"),
                        "train_overrides": st.get("train_overrides"),
                        "extra_overrides": st.get("overrides"),
                        "wall_s": meta.get("wall_s"),
                        "train_wall_s": _sum_or_none([_num(m.get("train_wall_s"))
                                                      for m in models]),
                        "n_arms": len(models), "threads": meta.get("threads"),
                        "cpu_count": meta.get("cpu_count"),
                        "loadavg_start": meta.get("loadavg_start"),
                        "loadavg_end": meta.get("loadavg_end"),
                        "curves_missing": no_curve})
    if len(missing) == len(names):
        raise ValueError(f"none of {', '.join(names)} has samples.jsonl under "
                         f"{root / 'synthetic'}; run make synthetic first")
    order = sorted(labels, key=lambda lb: -1.0 if labels[lb] is None else labels[lb])
    for name in missing:  # missing is never zero: rows of None, so counts show n
        for lb in order:
            reg = regime_for(labels[lb])
            rows.append({"name": name, "seed": None, "status": "missing", "model": lb,
                         "kappa_bits": labels[lb], "steps": None, "run_id": None,
                         **{c: None for c in SEED_METRICS},
                         "regime": reg.expected if reg else None, "regime_result": None})
    per_seed = pd.DataFrame(rows)
    per_seed["_o"] = [order.index(m) for m in per_seed["model"]]
    per_seed["_n"] = [list(names).index(n) for n in per_seed["name"]]
    per_seed = per_seed.sort_values(["_o", "_n"]).drop(columns=["_o", "_n"])
    per_seed = per_seed.reset_index(drop=True)
    summary = _summarize(per_seed, order, labels, len(names))
    curves = pd.DataFrame(curve_rows, columns=["name", "seed", "model", "kappa_bits", "step",
                                               "kl_bits", "ce", "n_batches"])
    meta_out = {"kind": "synthetic-seeds", "created": datetime.now(timezone.utc).isoformat(),
                "written_by": "python -m analysis.synthetic --names " + " ".join(names),
                "names": list(names), "missing": missing,
                "sources": sources, "regimes": [asdict(r) for r in REGIMES],
                "margins": {"no_better": NO_BETTER_MARGIN, "clearly_higher":
                            CLEARLY_HIGHER_MARGIN, "noise": NOISE_MARGIN,
                            "validity_drop": VALIDITY_DROP},
                "curve_points": CURVE_POINTS}
    agreement = pd.DataFrame(agree_rows, columns=list(AGREEMENT_COLUMNS))
    gaps = pd.DataFrame(gap_rows_all, columns=list(GAP_COLUMNS))
    return SeedAggregate(per_seed, summary, curves, meta_out, agreement, gaps)


def _sum_or_none(xs: Sequence[float | None]) -> float | None:
    return None if not xs or any(x is None for x in xs) else float(sum(xs))  # type: ignore[misc]


def _summarize(per_seed: pd.DataFrame, order: list[str], labels: dict[str, float | None],
               n_names: int) -> pd.DataFrame:
    out = []
    for lb in order:
        g = per_seed[per_seed["model"] == lb]
        meas = g[g["status"] == "measured"]
        r: dict[str, Any] = {"model": lb, "kappa_bits": labels[lb], "n_names": n_names,
                             "n_measured": len(meas)}
        for c in SEED_METRICS:
            vals = [v for v in (_num(x) for x in meas[c]) if v is not None]
            r[c] = _mean(vals)
            r[f"{c}_n"] = len(vals)
        reg = regime_for(labels[lb])
        res = list(meas["regime_result"]) if reg else []
        r["regime"] = reg.expected if reg else None
        r["regime_pass"] = sum(x == "pass" for x in res) if reg else None
        r["regime_fail"] = sum(x == "fail" for x in res) if reg else None
        r["regime_na"] = sum(x == "n/a" for x in res) if reg else None
        out.append(r)
    return pd.DataFrame(out)


def write_aggregate(agg: SeedAggregate, out_dir: str | os.PathLike) -> dict[str, Path]:
    """per_seed.csv, summary.csv, curves.csv, aggregate.json, summary.md, kl_curves.png."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    out = {k: d / k for k in ("per_seed.csv", "summary.csv", "curves.csv", "agreement.csv",
                              "aggregate.json", "summary.md", "kl_curves.png",
                              "agreement.png")}
    agg.per_seed.to_csv(out["per_seed.csv"], index=False, float_format="%.6g")
    agg.summary.to_csv(out["summary.csv"], index=False, float_format="%.6g")
    agg.curves.to_csv(out["curves.csv"], index=False, float_format="%.6g")
    agg.agreement.to_csv(out["agreement.csv"], index=False, float_format="%.6g")
    if agg.gaps is not None:
        out.update(write_gaps(agg.gaps, d))
    out.update(copy_samples(agg.meta, d))
    out["aggregate.json"].write_text(json.dumps(agg.meta, indent=1) + "\n", encoding="utf-8")
    out["summary.md"].write_text(render_block(d), encoding="utf-8")
    render_kl_curves(agg.curves, out["kl_curves.png"])
    if agg.agreement.empty:
        out.pop("agreement.png")
        (d / "agreement.png").unlink(missing_ok=True)  # never a stale figure beside new tables
    else:
        render_agreement(agg.agreement, out["agreement.png"])
    return out


def _model_order(df: pd.DataFrame) -> pd.DataFrame:
    """Baseline first, then by kappa; within a model by run name and step (final last)."""
    if df.empty:
        return df
    k = [-1.0 if _num(x) is None else float(x) for x in df["kappa_bits"]]
    names = list(dict.fromkeys(df["name"]))
    order = df.assign(_k=k, _n=[names.index(n) for n in df["name"]],
                      _s=[math.inf if f else float(st) for f, st in
                          zip(df["final"], df["step"], strict=True)])
    return order.sort_values(["_k", "_n", "_s"], kind="stable").drop(
        columns=["_k", "_n", "_s"]).reset_index(drop=True)


def write_gaps(gaps: pd.DataFrame, out_dir: str | os.PathLike) -> dict[str, Path]:
    """gaps.csv (every gap with its interval and p, per run, model and measured step) and
    verdicts.csv (per run and model: the v1 and v2 regime results, v2's predicates)."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    out = {"gaps.csv": d / "gaps.csv", "verdicts.csv": d / "verdicts.csv"}
    _model_order(gaps).to_csv(out["gaps.csv"], index=False, float_format="%.6g")
    # judged from the file as written, so anyone re-judging gaps.csv gets the same verdicts
    verdicts(pd.read_csv(out["gaps.csv"])).to_csv(out["verdicts.csv"], index=False,
                                                  float_format="%.6g")
    return out


def copy_samples(meta: dict[str, Any], out_dir: str | os.PathLike) -> dict[str, Path]:
    """Every measured run's samples.jsonl, gzipped (mtime 0: the same bytes every time) into
    `<out>/samples/<name>.samples.jsonl.gz`, so the folder holds what its tables came from and
    `intervals` can recompute them there (each decompresses to aggregate.json's sha256)."""
    import gzip
    import hashlib

    out = {}
    for src in meta.get("sources", []):
        if src.get("status") != "measured":
            continue
        raw = Path(src["path"]).read_bytes()
        if hashlib.sha256(raw).hexdigest() != src["sha256"]:
            raise ValueError(f"{src['path']} changed while its tables were written; rerun")
        gz = Path(out_dir) / "samples" / f"{src['name']}.samples.jsonl.gz"
        gz.parent.mkdir(parents=True, exist_ok=True)
        gz.write_bytes(gzip.compress(raw, mtime=0))
        out[f"samples/{gz.name}"] = gz
    return out


def committed_samples(agg_dir: str | os.PathLike) -> dict[str, list[str]]:
    """The samples.jsonl lines of every measured run of a committed aggregate folder, from
    `<dir>/samples/<name>.samples.jsonl.gz`, each checked against the sha256 that
    aggregate.json names. ValueError (one line) when one is absent or differs."""
    import gzip
    import hashlib

    d = Path(agg_dir)
    meta = json.loads((d / "aggregate.json").read_text(encoding="utf-8"))
    out = {}
    for src in meta["sources"]:
        if src.get("status") != "measured":
            continue
        gz = d / "samples" / f"{src['name']}.samples.jsonl.gz"
        if not gz.is_file():
            raise ValueError(f"{gz}: not committed, so the gaps of {src['name']} cannot be "
                             "recomputed here; commit the run's samples.jsonl gzipped there")
        raw = gzip.decompress(gz.read_bytes())
        if hashlib.sha256(raw).hexdigest() != src["sha256"]:
            raise ValueError(f"{gz}: sha256 differs from aggregate.json's for {src['name']}; "
                             "the tables were made from other samples")
        out[src["name"]] = raw.decode("utf-8").splitlines()
    return out


def intervals_from_committed(agg_dir: str | os.PathLike,
                             n_perm: int = N_PERM) -> pd.DataFrame:
    """gaps.csv's rows recomputed from a committed folder's samples (committed_samples)."""
    rows: list[dict[str, Any]] = []
    for name, lines in committed_samples(agg_dir).items():
        meta, kinds = read_kinds_lines(lines)
        seed = meta.get("settings", {}).get("seed")
        rows += gap_rows(name, seed, kinds["model"], kinds["sample"], kinds["point"],
                         kinds["point_sample"], n_perm=n_perm)
    return pd.DataFrame(rows, columns=list(GAP_COLUMNS))


def render_agreement(agreement: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Over training, per kappa: the position and noise gaps (shared Z - across Z; grey line:
    the regime rules' 0.1) and below them the validity, the same seed's baseline in grey."""
    ks = sorted({float(k) for k in agreement["kappa_bits"].dropna()})
    fig, axes = plt.subplots(2, max(1, len(ks)), figsize=(3.2 * max(1, len(ks)), 5.2),
                             dpi=110, squeeze=False, sharex="col")
    base = agreement[agreement["kappa_bits"].isna()]
    for j, k in enumerate(ks):
        g = agreement[(agreement["kappa_bits"] - k).abs() < 1e-12]
        top, bot = axes[0][j], axes[1][j]
        for i, (name, gs) in enumerate(g.groupby("name", sort=False)):
            top.plot(gs["step"], gs["pos_gap"], color=BLUE, marker=".", lw=1,
                     label="position gap" if i == 0 else None)
            top.plot(gs["step"], gs["noise_gap"], color=GREEN, marker=".", lw=1, ls="--",
                     label="noise gap" if i == 0 else None)
            bot.plot(gs["step"], gs["validity"], color=BLUE, marker=".", lw=1,
                     label="this kappa" if i == 0 else None)
            b = base[base["name"] == name]
            if not b.empty:
                bot.plot(b["step"], b["validity"], color=GREY, lw=1,
                         label="baseline" if i == 0 else None)
        top.axhline(CLEARLY_HIGHER_MARGIN, ls=":", color=GREY, lw=1)
        top.set_title(f"kappa = {kappa_label(k)} bit", fontsize=9)
        bot.set_xlabel("step", fontsize=8)
        for ax in (top, bot):
            ax.tick_params(labelsize=7)
            ax.legend(fontsize=6)
    axes[0][0].set_ylabel("shared - across Z", fontsize=8)
    axes[1][0].set_ylabel("validity", fontsize=8)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out


def render_kl_curves(curves: pd.DataFrame, path: str | os.PathLike) -> Path:
    """KL per token over training, one panel per kappa, one line per seed; the dashed line is
    the free-bits threshold (below it the KL costs nothing)."""
    ks = sorted({float(k) for k in curves["kappa_bits"].dropna()})
    fig, axes = plt.subplots(1, max(1, len(ks)), figsize=(3.2 * max(1, len(ks)), 2.8),
                             dpi=110, squeeze=False)
    for ax, k in zip(axes[0], ks, strict=False):
        g = curves[(curves["kappa_bits"] - k).abs() < 1e-12]
        for name, gs in g.groupby("name", sort=False):
            ax.plot(gs["step"], gs["kl_bits"], marker=".", lw=1, label=str(name))
        ax.axhline(k, ls="--", color=GREY, lw=1)
        ax.set_yscale("log")
        ax.set_title(f"kappa = {kappa_label(k)} bit", fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    axes[0][0].set_ylabel("KL, bits/token (training batches)", fontsize=8)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out


def _cell(v: Any, n: int | None = None, total: int | None = None) -> str:
    s = _fmt(_num(v) if not isinstance(v, str) else v, "")
    return s if n is None or n == total or n == 0 else f"{s} (n={n})"


def render_block(agg_dir: str | os.PathLike) -> str:
    """The generated Markdown for one aggregate directory, from its committed files only."""
    d = Path(agg_dir)
    if not (d / "aggregate.json").is_file():  # a block reserved for runs not made yet
        return (f"Not run yet: no tables in `{d.parent.name}/{d.name}/` (its aggregate.json "
                "is absent); the runs' command is in the text above this block.\n")
    per_seed = pd.read_csv(d / "per_seed.csv")
    summary = pd.read_csv(d / "summary.csv")
    curves = pd.read_csv(d / "curves.csv")
    meta = json.loads((d / "aggregate.json").read_text(encoding="utf-8"))
    names, missing = meta["names"], meta["missing"]
    srcs = [s for s in meta["sources"] if s["status"] == "measured"]
    n_all = len(names)
    L: list[str] = []
    seeds = ", ".join(f"{s['name']} (seed {s['seed']})" for s in srcs)
    L.append(f"Runs: {len(srcs)} of {n_all} measured: {seeds}."
             + (f" Missing (not finished): {', '.join(missing)}." if missing else ""))
    settings = sorted({(s.get("setting"), s.get("latent_bits"), s.get("high_latent_bits") or 0,
                        " ".join(s.get("train_overrides") or []),
                        " ".join(s.get("extra_overrides") or [])) for s in srcs})
    for setting, h, high, ov, extra in settings:
        hs = f"H = {h}" + (f" (H = {high} for kappa >= {h})" if high else "")
        L.append(f"Setting `{setting}`, {hs}: `{ov}`"
                 + (f", plus `{extra}`" if extra else "") + ".")
    L += _regimes_block(summary, d / "verdicts.csv", n_all)
    cols = [("kl_bits", "KL bits/token"), ("pos_agree_within", "pos. shared"),
            ("pos_agree_across", "pos. across"), ("pos_gap", "pos. gap"),
            ("noise_jaccard_within", "noise shared"), ("noise_jaccard_across", "noise across"),
            ("noise_gap", "noise gap"), ("validity", "validity"), ("ce_prior", "CE prior Z"),
            ("ce_encoder", "CE encoder Z")]
    L += ["", "Mean over seeds (n = seeds measured where fewer than "
          f"{n_all}; KL from the encoder on held-out sequences; CE in nats/char, with Z "
          "from the prior (honest) and from the encoder (which has seen the targets: below the "
          "prior's, the decoder reads Z)):", "",
          "| model | n | " + " | ".join(h for _, h in cols) + " |",
          "|---|---|" + "---|" * len(cols)]
    for _, r in summary.iterrows():
        L.append(f"| {r['model']} | {int(r['n_measured'])}/{n_all} | "
                 + " | ".join(_cell(r[c], int(r[f'{c}_n']), int(r["n_measured"]))
                              for c, _ in cols) + " |")
    L += ["", "Per seed:", "",
          "| model | run | steps | " + " | ".join(h for _, h in cols) + " | regime (v1) |",
          "|---|---|---|" + "---|" * (len(cols) + 1)]
    for _, r in per_seed.iterrows():
        res = r["regime_result"] if isinstance(r["regime_result"], str) else "–"
        who = r["name"] if r["status"] == "measured" else f"{r['name']} (missing)"
        L.append(f"| {r['model']} | {who} | {_secs(r['steps'])} | "
                 + " | ".join(_cell(r[c]) for c, _ in cols) + f" | {res} |")
    if not curves.empty:
        steps = sorted({int(s) for s in curves["step"]})
        shown = sorted({steps[min(len(steps) - 1, round(i * (len(steps) - 1) / 5))]
                        for i in range(6)})
        L += ["", "KL over training (bits/token on the training batches, mean over seeds of "
              "each bin of steps ending at the step shown):", "",
              "| model | " + " | ".join(f"step {s}" for s in shown) + " |",
              "|---|" + "---|" * len(shown)]
        for m, g in curves[curves["kappa_bits"].notna()].groupby("model", sort=False):
            cells = []
            for s in shown:
                v = g[g["step"] == s]["kl_bits"].dropna()
                cells.append(_cell(v.mean() if len(v) else None,
                                   len(v), len(srcs)))
            L.append(f"| {m} | " + " | ".join(cells) + " |")
        gains = _ce_vs_baseline(curves, shown)
        if gains:
            L += ["", "CE on the training batches with Z from the encoder minus the same "
                  "seed's baseline at the same steps (nats/token, mean over seeds; below 0: "
                  "the decoder uses what Z carries):", "",
                  "| model | " + " | ".join(f"step {s}" for s in shown) + " |",
                  "|---|" + "---|" * len(shown)]
            for m, cells in gains.items():
                L.append(f"| {m} | " + " | ".join(_cell(v, n, len(srcs)) for v, n in cells)
                         + " |")
    L += _agreement_block(d / "agreement.csv", len(srcs))
    L += _gaps_block(d / "gaps.csv")
    L += ["", "Wall time per run (from the runs' own records; load = 1-minute load average "
          "at start and end, on a machine with the given CPUs):", "",
          "| run | arms | training s (sum) | whole run s | threads | CPUs | load |",
          "|---|---|---|---|---|---|---|"]
    for s in srcs:
        la, lb = s.get("loadavg_start"), s.get("loadavg_end")
        load = f"{la[0]:.1f} -> {lb[0]:.1f}" if la and lb else "not recorded"
        L.append(f"| {s['name']} | {s['n_arms']} | {_secs(s.get('train_wall_s'))} | "
                 f"{_secs(s.get('wall_s'))} | {s.get('threads') or '–'} | "
                 f"{s.get('cpu_count') or '–'} | {load} |")
    return "\n".join(L) + "\n"


def _regimes_block(summary: pd.DataFrame, verdicts_path: Path, n_all: int) -> list[str]:
    """The regimes table: the v1 rules (issue 6, point estimates) and their counts from
    summary.csv beside the v2 rules (issue 38, intervals and p) and theirs from verdicts.csv,
    then one row per run with both results and v2's reasons."""
    # "n/a" is a result here, not a missing value
    ver = (pd.read_csv(verdicts_path, keep_default_na=False, na_values=[""])
           if verdicts_path.is_file() else None)
    L = ["", "Regimes, judged per seed (gap = shared Z - across Z). v1: the rules of issue 6 on "
         "point estimates, fixed before any run; v2: the rules of issue 38 on the intervals "
         "and permutation p, fixed before the intervals were computed (this file's section "
         "on the rules says each predicate):", "",
         "| kappa (bits) | paper's regime | v1 rule | v1 holds in | v2 rule | v2 holds / "
         "fails / unclear |", "|---|---|---|---|---|---|"]
    for _, r in summary.iterrows():
        if not isinstance(r["regime"], str):
            continue
        k = float(r["kappa_bits"])
        reg, rule = regime_for(k), rule_v2_for(k)
        judged = int(r["regime_pass"]) + int(r["regime_fail"])
        na = int(r["regime_na"])
        held = f"{int(r['regime_pass'])}/{judged} seeds" + (f", {na} not measurable"
                                                            if na else "")
        if int(r["n_measured"]) < n_all:
            held += f" ({n_all - int(r['n_measured'])} missing)"
        if ver is None:
            v2 = "not judged (no gaps.csv)"
        else:
            g = ver[(ver["kappa_bits"] - k).abs() < 1e-12]
            res = list(g["result_v2"])
            v2 = (f"{res.count('holds')} / {res.count('fails')} / {res.count('unclear')} of "
                  f"{len(res)} seeds")
            if any(str(x).startswith("none") for x in g["kl_penalty"]):
                v2 += " (no KL penalty: kappa >= H)"
        L.append(f"| {kappa_label(k)} | {rule.regime if rule else r['regime']} | "
                 f"{reg.rule if reg else '–'} | {held} | {rule.text if rule else '–'} | "
                 f"{v2} |")
    if ver is None or ver.empty:
        return L
    L += ["", "Per run (v2's predicates: yes / no / unclear, as each rule needs them):", "",
          "| model | run | H | KL penalty | v1 | v2 | why (v2) |", "|---|---|---|---|---|---|---|"]
    for _, r in ver.iterrows():
        h = _num(r["latent_bits"])
        pen = "none (kappa >= H)" if str(r["kl_penalty"]).startswith("none") else "free bits"
        v1 = r["result_v1"] if isinstance(r["result_v1"], str) else "–"
        v2 = r["result_v2"] if isinstance(r["result_v2"], str) else "–"
        L.append(f"| {r['model']} | {r['name']} | {'–' if h is None else int(h)} | {pen} | "
                 f"{v1} | **{v2}** | {r['why_v2'] if isinstance(r['why_v2'], str) else ''} |")
    return L


def _agreement_block(path: Path, n_runs: int) -> list[str]:
    """The agreement over training, from agreement.csv (absent or empty: said, never zeros)."""
    agree = pd.read_csv(path) if path.is_file() else pd.DataFrame()
    if agree.empty:
        return ["", "Agreement over training: not measured (these runs kept no checkpoints "
                "along training; the agreement above is the final model's only)."]
    steps = sorted({int(s) for s in agree["step"]})
    L = ["", "Agreement over training (every kept checkpoint generates from the same prompts "
         "and pinned Z as the final model, and is scored on the same held-out sequences; mean "
         "over seeds, n where fewer; the last step is the final model; KL from the encoder, "
         "held out):", "",
         "| model | measure | " + " | ".join(f"step {s}" for s in steps) + " |",
         "|---|---|" + "---|" * len(steps)]
    for m, g in agree.groupby("model", sort=False):
        free = g["kappa_bits"].notna().any()
        measures = ([("pos_gap", "position gap"), ("noise_gap", "noise gap"),
                     ("validity", "validity"), ("kl_bits", "KL bits/token")] if free
                    else [("validity", "validity")])
        for col, label in measures:
            cells = []
            for st in steps:
                v = [x for x in (_num(y) for y in g[g["step"] == st][col]) if x is not None]
                cells.append(_cell(_mean(v), len(v), n_runs))
            L.append(f"| {m} | {label} | " + " | ".join(cells) + " |")
    return L


def _ci_cell(v: Any, lo: Any, hi: Any, digits: int = 3) -> str:
    x, a, b = _num(v), _num(lo), _num(hi)
    if x is None:
        return "–"
    s = f"{x:.{digits}f}"
    return s if a is None or b is None else f"{s} [{a:.{digits}f}, {b:.{digits}f}]"


def _p_cell(v: Any) -> str:
    x = _num(v)
    return "–" if x is None else f"{x:.4f}"


def _gaps_block(path: Path) -> list[str]:
    """Every gap with its interval and p, from gaps.csv (absent: said, never zeros)."""
    if not path.is_file():
        if (path.parent / "samples").is_dir():
            return ["", "Gaps with intervals: not computed yet (`python -m analysis.synthetic "
                    "intervals DIR` computes them from the committed samples)."]
        return ["", "Gaps with intervals: not computed (the samples behind these tables are not "
                "committed, so no interval can be recomputed from them)."]
    g = pd.read_csv(path)
    if g.empty:
        return []
    fin = g[g["final"].astype(bool)]
    n_perm = sorted({int(x) for x in g["n_perm"]})
    ns = sorted({(int(a), int(b)) for a, b in zip(fin["n_groups"], fin["n_rows"], strict=True)})
    n_text = ", ".join(f"{a} groups of {b // a if a else 0} rows" for a, b in ns)
    L = ["", "Gaps with 95% intervals and permutation p (final models; gap = shared Z - across "
         f"Z; interval: jackknife over the shared-Z groups, n = {n_text} per model; p: "
         f"one-sided, {', '.join(map(str, n_perm))} shuffles of the group labels within each "
         "prompt, so the smallest p is "
         f"{1 / (1 + max(n_perm)):.4f}; validity minus the same seed's baseline with the "
         "jackknife over every group of both arms; CE with prior Z with its interval where "
         "the run recorded the per-sequence SD; pair counts per row in gaps.csv):", "",
         "| model | run | position gap [95% CI] | p | noise gap [95% CI] | p | "
         "validity - baseline [95% CI] | CE prior Z [95% CI] |",
         "|---|---|---|---|---|---|---|---|"]
    for _, r in fin.iterrows():
        L.append(f"| {r['model']} | {r['name']} | "
                 f"{_ci_cell(r['pos_gap'], r['pos_lo'], r['pos_hi'])} | {_p_cell(r['pos_p'])} | "
                 f"{_ci_cell(r['noise_gap'], r['noise_lo'], r['noise_hi'])} | "
                 f"{_p_cell(r['noise_p'])} | "
                 f"{_ci_cell(r['validity_diff'], r['validity_diff_lo'], r['validity_diff_hi'])}"
                 f" | {_ci_cell(r['ce_prior'], r['ce_prior_lo'], r['ce_prior_hi'])} |")
    pts = g[~g["final"].astype(bool)]
    if pts.empty:
        return L + ["", "Gaps over training: not measured (no checkpoints kept along training)."]
    steps = sorted({int(x) for x in g["step"].dropna()})
    for kind, label in (("pos", "Position"), ("noise", "Noise")):
        L += ["", f"{label} gap over training, per run (95% interval; * = p < {GAP_ALPHA}; "
              "the last step is the final model):", "",
              "| model | run | " + " | ".join(f"step {st}" for st in steps) + " |",
              "|---|---|" + "---|" * len(steps)]
        for (m, name), gr in g.groupby(["model", "name"], sort=False):
            cells = []
            for st in steps:
                hit = gr[gr["step"] == st]
                if hit.empty:
                    cells.append("–")
                    continue
                r = hit.iloc[-1]
                star = "*" if (_num(r[f"{kind}_p"]) or 1.0) < GAP_ALPHA else ""
                cells.append(_ci_cell(r[f"{kind}_gap"], r[f"{kind}_lo"], r[f"{kind}_hi"], 2)
                             + star)
            L.append(f"| {m} | {name} | " + " | ".join(cells) + " |")
    return L


def _ce_vs_baseline(curves: pd.DataFrame, steps: list[int]
                    ) -> dict[str, list[tuple[float | None, int]]]:
    """Per free model and step: mean over runs of (its CE - the run's baseline CE), with n."""
    base = curves[curves["kappa_bits"].isna()].set_index(["name", "step"])["ce"]
    if base.empty:
        return {}
    out: dict[str, list[tuple[float | None, int]]] = {}
    free = curves[curves["kappa_bits"].notna()]
    for m, g in free.groupby("model", sort=False):
        cells = []
        for s in steps:
            d = [_diff(r["ce"], base.get((r["name"], s))) for _, r in g[g["step"] == s].iterrows()]
            d = [x for x in d if x is not None]
            cells.append((_mean(d), len(d)))
        out[str(m)] = cells
    return out


def _secs(v: Any) -> str:
    x = _num(v)
    return "–" if x is None else f"{x:.0f}"


DOC_BEGIN = "<!-- BEGIN GENERATED by `python -m analysis.synthetic render-doc` from "
DOC_END = "<!-- END GENERATED -->"


RULES_BLOCK = "rules"
"""A generated block `from rules` holds the regime rules, rendered from the code that judges."""


def render_rules() -> str:
    """The v1 and v2 regime rules in words, from REGIMES, REGIMES_V2 and PREDICATES."""
    L = ["v1 (issue 6, on point estimates; a regime holds or fails):", ""]
    L += [f"- kappa = {kappa_label(r.kappa_bits)} bit, {r.expected}: {r.rule}." for r in REGIMES]
    L += ["", f"v2 (issue 38, on the 95% intervals and one-sided permutation p, alpha = "
          f"{GAP_ALPHA}; each predicate is yes, no or unclear; a rule holds when every "
          "predicate it needs has the wanted value, fails when one has the other value, and "
          "is unclear otherwise):", ""]
    L += [f"- kappa = {kappa_label(r.kappa_bits)} bit, {r.regime}: {r.text}; needs "
          + ", ".join(f"{p.replace('_', ' ')} = {'yes' if w else 'no'}" for p, w in r.needs)
          + "." for r in REGIMES_V2]
    L += ["", "The predicates:", ""]
    L += [f"- {name.replace('_', ' ')}: {text}." for name, text in PREDICATES.items()]
    L += ["", f"Constants: negligible margin {NEGLIGIBLE_MARGIN}, validity drop "
          f"{LEAK_VALIDITY_DROP}, unigram CE {UNIGRAM_CE:.4f} nats/char (from the task: "
          f"letter {_P_LETTER:.4f}, '!' {1 / 16:.4f}, '_' {_P_BLANK:.4f} per body character), "
          f"{N_PERM} permutations per gap."]
    return "\n".join(L) + "\n"


FINDINGS_SUFFIX = "#findings"
"""A block `from DIR#findings` holds the verdict counts and ranges per kappa, from DIR's
verdicts.csv and gaps.csv: the sentences that count seeds are generated, never typed."""


def _span(xs: Sequence[float | None], digits: int = 3) -> str:
    """'lo to hi' over the measured values, '(n=k)' when some were not measurable."""
    v = sorted(x for x in xs if x is not None)
    if not v:
        return "not measurable"
    s = f"{v[0]:.{digits}f}" if len(v) == 1 or v[0] == v[-1] \
        else f"{v[0]:.{digits}f} to {v[-1]:.{digits}f}"
    return s if len(v) == len(xs) else f"{s} (n={len(v)})"


def render_findings(agg_dir: str | os.PathLike) -> str:
    """Per kappa: how many seeds each rule set holds in, and the ranges over seeds of the
    measures its v2 rule reads (gap, its interval's ends, p; validity minus baseline; CE)."""
    d = Path(agg_dir)
    vp, gp = d / "verdicts.csv", d / "gaps.csv"
    if not vp.is_file() or not gp.is_file():
        return "No findings: this folder has no verdicts.csv and gaps.csv.\n"
    ver = pd.read_csv(vp, keep_default_na=False, na_values=[""])
    gaps = pd.read_csv(gp)
    fin = gaps[gaps["final"].astype(bool)]
    L = []
    for k in sorted({float(x) for x in ver["kappa_bits"]}):
        v = ver[(ver["kappa_bits"] - k).abs() < 1e-12]
        g = fin[(fin["kappa_bits"] - k).abs() < 1e-12]
        rule, n = rule_v2_for(k), len(v)
        r2 = list(v["result_v2"])
        r1 = [x for x in v["result_v1"] if isinstance(x, str)]
        head = (f"- **kappa = {kappa_label(k)} bit, {rule.regime if rule else '?'}**: v2 holds "
                f"in {r2.count('holds')} of {n} seeds, fails in {r2.count('fails')}, unclear in "
                f"{r2.count('unclear')}; v1 passed in {r1.count('pass')} of {n}"
                + (f" ({r1.count('n/a')} not measurable)" if r1.count("n/a") else "") + ".")
        parts = []
        for kind, word in (("pos", "Position"), ("noise", "noise")):
            col = [_num(x) for x in g[f"{kind}_gap"]]
            if all(x is None for x in col):
                parts.append(f"{word} gap not measurable (no valid pair)")
                continue
            parts.append(
                f"{word} gap {_span(col)} over seeds (interval ends "
                f"{_span([_num(x) for x in g[f'{kind}_lo']])} / "
                f"{_span([_num(x) for x in g[f'{kind}_hi']])}; permutation p "
                f"{_span([_num(x) for x in g[f'{kind}_p']], 4)})")
        vd = [_num(x) for x in g["validity_diff"]]
        parts.append("validity minus the baseline's "
                     + (_span(vd) if any(x is not None for x in vd) else "not measured "
                        "(no baseline arm)"))
        parts.append(f"CE with prior Z {_span([_num(x) for x in g['ce_prior']])} nats/char "
                     f"(unigram CE {UNIGRAM_CE:.3f})")
        leak = list(v["leaking"])
        parts.append(f"leaking: yes in {leak.count('yes')}, no in {leak.count('no')}, unclear "
                     f"in {leak.count('unclear')}")
        if any(str(x).startswith("none") for x in v["kl_penalty"]):
            parts.append("trained with no KL penalty (kappa >= H)")
        L.append(head + " " + "; ".join(parts) + ".")
    base = gaps[gaps["kappa_bits"].isna()]
    if not base.empty:  # no Z: its "shared" groups are independent samples, a built-in null

        def null(rows: pd.DataFrame) -> str:
            ps = [x for x in (_num(v) for c in ("pos_p", "noise_p") for v in rows[c])
                  if x is not None]
            cover = sum(_num(lo) <= 0 <= _num(hi) for c in GAP_KINDS
                        for lo, hi in zip(rows[f"{c}_lo"], rows[f"{c}_hi"], strict=True)
                        if _num(lo) is not None and _num(hi) is not None)
            n_ci = sum(_num(x) is not None for c in GAP_KINDS for x in rows[f"{c}_lo"])
            return (f"permutation p < {GAP_ALPHA} in {sum(p < GAP_ALPHA for p in ps)} of "
                    f"{len(ps)} gaps (about {GAP_ALPHA * len(ps):.1f} expected by chance), the "
                    f"95% interval containing 0 in {cover} of {n_ci}")

        fb = base[base["final"].astype(bool)]
        line = (f"- **baseline (no Z, so its 'shared' groups are independent samples: a null "
                f"check of the statistics)**: final models: {null(fb)}.")
        if len(base) > len(fb):
            line += (f" Every measured step: {null(base)}; these are not independent tests "
                     "(every checkpoint of a run generates from the same prompts and the same "
                     "sampling draws, so one unlucky draw repeats along training).")
        L.append(line)
    return "\n".join(L) + "\n"


def render_doc(doc: str | os.PathLike) -> tuple[str, list[str]]:
    """The doc with every generated block re-rendered: `<!-- BEGIN GENERATED ... from DIR -->`
    ... `<!-- END GENERATED -->`, DIR relative to the doc's folder. Returns (text, dirs)."""
    p = Path(doc)
    text = p.read_text(encoding="utf-8")
    out: list[str] = []
    dirs: list[str] = []
    pos = 0
    while (b := text.find(DOC_BEGIN, pos)) >= 0:
        head_end = text.find("-->", b + len(DOC_BEGIN))
        e = text.find(DOC_END, head_end)
        if head_end < 0 or e < 0:
            raise ValueError(f"{p}: a generated block opened at offset {b} is never closed "
                             f"by {DOC_END}")
        rel = text[b + len(DOC_BEGIN):head_end].strip().strip("`").strip()
        dirs.append(rel)
        if rel == RULES_BLOCK:
            body = render_rules()
        elif rel.endswith(FINDINGS_SUFFIX):
            body = render_findings(p.parent / rel[:-len(FINDINGS_SUFFIX)])
        else:
            body = render_block(p.parent / rel)
        out.append(text[pos:head_end + 3] + "\n" + body)
        pos = e
    out.append(text[pos:])
    return "".join(out), dirs


def _main_render_doc(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m analysis.synthetic render-doc",
                                description="re-render the generated tables of a doc")
    p.add_argument("--doc", default="docs/SYNTHETIC.md")
    p.add_argument("--check", action="store_true",
                   help="exit 1 if the doc differs from its re-rendering; write nothing")
    a = p.parse_args(argv)
    if not Path(a.doc).is_file():
        _fail(f"--doc {a.doc}: no such file")
    try:
        new, dirs = render_doc(a.doc)
    except (OSError, ValueError, KeyError) as e:
        _fail(f"{a.doc}: {one_line(e)}")
    if not dirs:
        _fail(f"{a.doc}: no generated block ({DOC_BEGIN}DIR -->)")
    old = Path(a.doc).read_text(encoding="utf-8")
    if a.check:
        if new != old:
            print(f"{a.doc}: out of date; run python -m analysis.synthetic render-doc",
                  file=sys.stderr)
            raise SystemExit(1)
        print(f"{a.doc}: up to date ({', '.join(dirs)})")
        return
    if new != old:
        atomic_write_text(Path(a.doc), new)
    print(f"{a.doc}: rendered {', '.join(dirs)}")


# --------------------------------------------------------------------------- entry point
def render(run_dir: str | os.PathLike) -> dict[str, Path]:
    """samples.jsonl in run_dir -> table.csv, table.md, acceptance.json, figure.png."""
    d = Path(run_dir)
    meta, kinds = read_kinds(d / "samples.jsonl")
    models, samples = kinds["model"], kinds["sample"]
    if not models:
        raise ValueError(f"{d / 'samples.jsonl'} holds no model records")
    df = build_table(models, samples)
    checks = acceptance(df)
    out = {"table.csv": d / "table.csv", "table.md": d / "table.md",
           "acceptance.json": d / "acceptance.json", "figure.png": d / "figure.png"}
    df.to_csv(out["table.csv"], index=False)
    out["table.md"].write_text(table_markdown(df, meta, checks), encoding="utf-8")
    out["acceptance.json"].write_text(json.dumps(checks, indent=2) + "\n", encoding="utf-8")
    render_figure(models, samples, out["figure.png"],
                  rows_per_group=int(meta.get("settings", {}).get("figure_rows", 8)))
    rows = agreement_rows(models, samples, kinds["point"], kinds["point_sample"])
    for k in ("agreement.csv", "agreement.png"):  # never a stale file beside new tables
        (d / k).unlink(missing_ok=True)
    if rows:  # the run kept checkpoints along training
        ag = pd.DataFrame([{"name": d.name, "seed": meta.get("settings", {}).get("seed"), **r}
                           for r in rows], columns=list(AGREEMENT_COLUMNS))
        out["agreement.csv"], out["agreement.png"] = d / "agreement.csv", d / "agreement.png"
        ag.to_csv(out["agreement.csv"], index=False, float_format="%.6g")
        render_agreement(ag, out["agreement.png"])
    return out


def _fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def _plain_name(name: str) -> bool:
    return bool(name.strip()) and name not in (".", "..") and not any(c in name for c in "/\\\0")


def _main_seeds(names: list[str], out: str | None) -> None:
    bad = [n for n in names if not _plain_name(n)]
    if bad:
        _fail(f"--names {bad[0]!r}: a plain folder name under results/synthetic/")
    d = Path(out) if out else results_root() / "synthetic" / ("seeds-" + "-".join(names))
    try:
        agg = aggregate(names)
    except ValueError as e:
        _fail(one_line(e))
    files = write_aggregate(agg, d)
    print(files["summary.md"].read_text(encoding="utf-8"))
    for k, v in files.items():
        print(f"wrote {k}: {v}")


def _main_intervals(argv: list[str]) -> None:
    p = argparse.ArgumentParser(
        prog="python -m analysis.synthetic intervals",
        description="recompute gaps.csv (every gap with its interval and p) of committed "
                    "aggregate folders from their committed samples (sha256 checked)")
    p.add_argument("dirs", nargs="+", metavar="DIR", help="e.g. docs/synthetic/cpu")
    p.add_argument("--n-perm", type=int, default=N_PERM)
    a = p.parse_args(argv)
    if a.n_perm < 1:
        _fail(f"--n-perm {a.n_perm}: must be >= 1")
    done = []
    for d in a.dirs:  # every folder checked before any is written
        if not (Path(d) / "aggregate.json").is_file():
            _fail(f"{d}: no aggregate.json; give a folder written by --names ... --out")
    computed = {}
    for d in a.dirs:  # every folder computed before any file is written
        try:
            computed[d] = intervals_from_committed(d, n_perm=a.n_perm)
        except (OSError, ValueError, KeyError) as e:
            _fail(f"{d}: {one_line(e)}")
    for d, gaps in computed.items():
        done += [str(f) for f in write_gaps(gaps, d).values()]
    for f in done:
        print(f"wrote {f}")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["render-doc"]:
        _main_render_doc(argv[1:])
        return
    if argv[:1] == ["intervals"]:
        _main_intervals(argv[1:])
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--name", default="default", help="results/synthetic/<name>")
    p.add_argument("--dir", default=None, help="explicit directory (overrides --name)")
    p.add_argument("--names", nargs="+", default=None, metavar="NAME",
                   help="several runs (one per seed) -> per-seed and mean tables, KL curves")
    p.add_argument("--out", default=None, help="with --names: the output folder (default "
                   "results/synthetic/seeds-<names>)")
    a = p.parse_args(argv)
    if a.names is not None:
        _main_seeds(a.names, a.out)
        return
    if a.out is not None:
        _fail("--out goes with --names")
    if a.dir is None and not _plain_name(a.name):
        _fail(f"--name {a.name!r}: a plain folder name under results/synthetic/ (or give --dir)")
    d = Path(a.dir) if a.dir else results_root() / "synthetic" / a.name
    f = d / "samples.jsonl"
    if not f.is_file():
        _fail(f"no synthetic run at {f}; run `make synthetic SYN_NAME={a.name}` first "
              "(or give --dir)")
    try:
        out = render(d)
    except ValueError as e:  # JSONDecodeError is a ValueError; so is "holds no model records"
        _fail(f"{f}: {one_line(e)}")
    print((d / "table.md").read_text(encoding="utf-8"))
    for k, v in out.items():
        print(f"wrote {k}: {v}")


if __name__ == "__main__":
    main()
