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
times and load), `summary.md`, `kl_curves.png`, `agreement.png`.
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
import pandas as pd
from matplotlib.patches import Rectangle

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
    meta: dict[str, Any] = {}
    by_kind: dict[str, list[dict]] = {k: [] for k in ("model", "sample", "point",
                                                      "point_sample")}
    with open(path, encoding="utf-8") as f:
        for line in f:
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
    Regime(8.0, "collapse", f"validity <= the same seed's baseline's - {VALIDITY_DROP}"),
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
    return SeedAggregate(per_seed, summary, curves, meta_out, agreement)


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
    out["aggregate.json"].write_text(json.dumps(agg.meta, indent=1) + "\n", encoding="utf-8")
    out["summary.md"].write_text(render_block(d), encoding="utf-8")
    render_kl_curves(agg.curves, out["kl_curves.png"])
    if agg.agreement.empty:
        out.pop("agreement.png")
        (d / "agreement.png").unlink(missing_ok=True)  # never a stale figure beside new tables
    else:
        render_agreement(agg.agreement, out["agreement.png"])
    return out


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
    settings = sorted({(s.get("setting"), s.get("latent_bits"),
                        " ".join(s.get("train_overrides") or []),
                        " ".join(s.get("extra_overrides") or [])) for s in srcs})
    for setting, h, ov, extra in settings:
        L.append(f"Setting `{setting}`, H = {h}: `{ov}`"
                 + (f", plus `{extra}`" if extra else "") + ".")
    L += ["", "Regimes (one rule per kappa, judged per seed; gap = shared Z - across Z):", "",
          "| kappa (bits) | paper's regime | rule | holds in |", "|---|---|---|---|"]
    for _, r in summary.iterrows():
        if not isinstance(r["regime"], str):
            continue
        reg = regime_for(float(r["kappa_bits"]))
        judged = int(r["regime_pass"]) + int(r["regime_fail"])
        na = int(r["regime_na"])
        held = f"{int(r['regime_pass'])}/{judged} seeds" + (f", {na} not measurable"
                                                            if na else "")
        if int(r["n_measured"]) < n_all:
            held += f" ({n_all - int(r['n_measured'])} missing)"
        L.append(f"| {kappa_label(float(r['kappa_bits']))} | {r['regime']} | "
                 f"{reg.rule if reg else '–'} | {held} |")
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
          "| model | run | steps | " + " | ".join(h for _, h in cols) + " | regime |",
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
        out.append(text[pos:head_end + 3] + "\n" + render_block(p.parent / rel))
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


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["render-doc"]:
        _main_render_doc(argv[1:])
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
