"""What Z encodes on the synthetic task (paper §4.1, Figure 4): table, acceptance check, figure.

Reads only `results/synthetic/<name>/samples.jsonl` (written by `experiments/synthetic.py`) and
writes `table.csv`, `table.md`, `acceptance.json` and `figure.png` beside it.

samples.jsonl holds one JSON object per line, told apart by `kind`:
- `meta`: the settings of the run (name, kappas, model shape, steps, seeds, wall time);
- `model`: one per trained model: `model` label, `arm`, `kappa_bits`, `latent_bits`, `run_id`,
  `kl_bits` (mean KL per token, Z from the encoder), `ce_prior` (CE, Z from the uniform prior:
  the honest number), `ce_encoder` (CE, Z from the encoder: it has seen the targets, it leaks),
  `ce_scope`, `train_wall_s`, `steps`;
- `sample`: one generated sequence: `model`, `prompt_idx`, `letter`, `group`, `group_kind`
  (`per_sequence`: every row its own uniform Z; `shared`: every row of the group the same pinned
  uniform Z; for the baseline, which has no Z, the same layout of independent samples), `row`,
  `text` (the generated characters after the prompt).

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
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.patches import Rectangle

from common.kappa import kappa_label as common_kappa_label
from common.paths import results_root
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
def read_samples(path: str | os.PathLike) -> tuple[dict, list[dict], list[dict]]:
    """samples.jsonl -> (meta, model records, sample records)."""
    meta: dict[str, Any] = {}
    models: list[dict] = []
    samples: list[dict] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            kind = r.get("kind")
            if kind == "meta":
                meta = r
            elif kind == "model":
                models.append(r)
            elif kind == "sample":
                samples.append(r)
    return meta, models, samples


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
        hit = df[(df["arm"] == "free") & ((df["kappa_bits"] - kappa).abs() < 1e-9)]
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


# --------------------------------------------------------------------------- entry point
def render(run_dir: str | os.PathLike) -> dict[str, Path]:
    """samples.jsonl in run_dir -> table.csv, table.md, acceptance.json, figure.png."""
    d = Path(run_dir)
    meta, models, samples = read_samples(d / "samples.jsonl")
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
    return out


def _fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--name", default="default", help="results/synthetic/<name>")
    p.add_argument("--dir", default=None, help="explicit directory (overrides --name)")
    a = p.parse_args(argv)
    if a.dir is None and (not a.name.strip() or a.name in (".", "..")
                          or any(c in a.name for c in "/\\\0")):
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
