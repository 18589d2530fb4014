"""The latent, measured: tables and figures from probe files (experiments/eval/probe.py writes
them as `<run>/eval/probe.<spec_id>.step<N>.json`; docs/PROBE.md says how to read them).

Plain reading of JSON (no torch, no model): `probe_table` is one row per probe file,
`write_figures` writes the four PNGs of one file beside it, `final_docs` keeps one file per run
for the report's probe section (analysis/latent.py), which folds one block per Free Transformer
(`probe_html`). A null in a file is NaN here and a grey dash in HTML, never 0.

    python -m analysis.probe <probe file or run dir>...   figures beside each file + the table
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.pyplot as plt
import pandas as pd

from common.arms import FREE_ZCUT
from common.errors import UsageError, cli
from common.io import atomic_write
from common.paths import RunDir

from .render import cell_html, ci, template
from .render import num as _f  # None, text and NaN are missing (NaN), never 0
from .render import png as png_bytes

matplotlib.use("Agg")  # PNGs only, never a display

SCHEMA = "ftbench-probe-v1"
ABLATIONS = ("fixed_per_sequence", "zeroed", "posterior")
FIGURES = ("kl_bits", "kl_positions", "ablations", "steering")
TABLE_COLS = ["run_id", "step", "latent_bits", "kappa_bits", "n_rows", "kl_bits", "n_active",
              "active_bits", "frac_le_kappa", "over_budget", "latent_unused",
              "prior_ce", "d_fixed", "d_fixed_lo", "d_fixed_hi", "d_zeroed", "d_zeroed_lo",
              "d_zeroed_hi", "d_posterior_LEAKING", "d_posterior_lo", "d_posterior_hi",
              "steer_effect", "steer_null", "steer_diff", "steer_diff_lo", "steer_diff_hi",
              "steer_n_prompts", "recovered_share", "recovered_share_lo", "recovered_share_hi",
              "information_bits", "marginal_bias_bits", "exact_model_share", "latent_state",
              "dead", "z_cut", "file"]
"""probe.csv: one row per probe file. `over_budget` is the file's `collapse` flag (encoder side),
`latent_state` / `dead` its `latent_use` record (decoder side): docs/PROBE.md says how to read
each; a file without the record has no state (NaN, never a guess)."""
LATENT_COLS = ["run_id", "arm", "z_cut", "latent_bits", "kappa_bits", "step", "final", "kl_bits",
               "information_bits", "marginal_bias_bits", "recovered_nats", "recovered_share",
               "recovered_share_lo", "recovered_share_hi", "d_posterior_LEAKING",
               "d_posterior_lo", "d_posterior_hi", "steer_diff", "exact_model_share",
               "latent_state", "dead", "rule", "file"]
"""latent.csv: one row per probe file (a run's final checkpoint and its evaluation checkpoints:
the latent's use over training)."""


def read_probe(path: str | Path) -> dict[str, Any]:
    """One probe file as a dict, with `file` set; UsageError (one line) when it is not one."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: unreadable ({type(e).__name__})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise UsageError(f"{path}: not a {SCHEMA} file")
    return {**doc, "file": str(path)}


def probe_files(paths: Iterable[str | Path]) -> list[Path]:
    """Probe files named directly, or found under run dirs (<run>/eval/probe.*.json)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            ev = RunDir(p).eval_dir if RunDir(p).eval_dir.is_dir() else p
            out.extend(sorted(ev.glob("probe.*.json")))
        else:
            out.append(p)
    return out


def probe_row(doc: dict[str, Any]) -> dict[str, Any]:
    """The table row of one probe file."""
    kl = doc.get("kl") or {}
    col = doc.get("collapse") or {}
    abl = (doc.get("ablations") or {}).get("modes") or {}
    st = doc.get("steering") or {}
    row: dict[str, Any] = {
        "run_id": doc.get("run_id"), "step": doc.get("checkpoint_step"),
        "latent_bits": doc.get("latent_bits"), "kappa_bits": _f(doc.get("kappa_bits")),
        "n_rows": doc.get("n_rows"), "kl_bits": _f(kl.get("mean_bits_per_token")),
        "n_active": kl.get("n_active"),
        "active_bits": ",".join(map(str, kl.get("active_bits") or [])) or "none",
        "frac_le_kappa": _f(kl.get("frac_tokens_kl_le_kappa")),
        "over_budget": col.get("flag"), "latent_unused": col.get("latent_unused"),
        "prior_ce": _f((doc.get("ablations") or {}).get("prior_ce_nats_per_token")),
        "file": doc.get("file")}
    for mode, key in (("fixed_per_sequence", "d_fixed"), ("zeroed", "d_zeroed"),
                      ("posterior", "d_posterior")):
        d = (abl.get(mode) or {}).get("delta_vs_prior") or {}
        name = "d_posterior_LEAKING" if mode == "posterior" else key
        row[name], row[f"{key}_lo"], row[f"{key}_hi"] = (_f(d.get("mean")), _f(d.get("lo")),
                                                         _f(d.get("hi")))
    use = doc.get("latent_use") or {}
    row.update({**{k: _f(use.get(k)) for k in (
                    "recovered_share", "recovered_share_lo", "recovered_share_hi",
                    "information_bits", "marginal_bias_bits", "exact_model_share")},
                # version 1's share-based "leaking" is withdrawn: no state, never a guess
                "latent_state": None if use.get("state") == "leaking" else use.get("state"),
                "dead": use.get("dead"), "z_cut": doc.get("z_cut")})
    diff = st.get("difference") or {}
    row.update({"steer_effect": _f((st.get("effect") or {}).get("mean")),
                "steer_null": _f((st.get("null") or {}).get("mean")),
                "steer_diff": _f(diff.get("mean")), "steer_diff_lo": _f(diff.get("lo")),
                "steer_diff_hi": _f(diff.get("hi")), "steer_n_prompts": st.get("n_prompts")})
    return row


def probe_table(docs: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """One row per probe file (TABLE_COLS); d_* are CE changes against prior Z in nats per
    token (the posterior's leaks: its column says so)."""
    rows = [probe_row(d) for d in docs]
    return pd.DataFrame(rows, columns=TABLE_COLS)


def final_docs(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One probe per run, of its last weights: files of evaluation checkpoints (the latent over
    training: `latent_table`) are left out, and of a run probed under several specs the file
    with the latent-use record, else the newest, is kept. Order of first appearance."""
    best: dict[str, dict[str, Any]] = {}
    for d in docs:
        if "eval_step_" in str(d.get("checkpoint")):
            continue
        rid = str(d.get("run_id"))
        key = (bool(d.get("latent_use")), str((d.get("provenance") or {}).get("created")))
        old = best.get(rid)
        if old is None or key > (bool(old.get("latent_use")),
                                 str((old.get("provenance") or {}).get("created"))):
            best[rid] = d
    keep = {id(d) for d in best.values()}
    return [d for d in docs if id(d) in keep]


def latent_table(run_dirs: Iterable[str | Path], arms: dict[str, str] | None = None
                 ) -> pd.DataFrame:
    """One row per latent-use probe file (LATENT_COLS): the decoder's recovered share of the
    KL, the KL split into information and marginal bias, the state and its rule; `final` marks
    the run's last checkpoint. `arms`: run-id -> the sweep's arm name (the file records the
    model's kind and `z_cut`)."""
    best: dict[tuple[str, Any], tuple[float, dict[str, Any]]] = {}
    for doc in read_probes(run_dirs)[0]:
        if not doc.get("latent_use"):
            continue
        # one file per (run, step), the newest: a run probed again under a new spec keeps its
        # old file, which is skipped
        key = (str(doc.get("run_id")), doc.get("checkpoint_step"))
        t = Path(doc["file"]).stat().st_mtime
        if key not in best or t > best[key][0]:
            best[key] = (t, doc)
    rows = []
    for _, doc in sorted(best.values(), key=lambda x: Path(x[1]["file"])):
        r = probe_row(doc)
        use = doc.get("latent_use") or {}
        rows.append({**{k: r.get(k) for k in LATENT_COLS if k in r},
                     "arm": (arms or {}).get(str(doc.get("run_id")),
                                             FREE_ZCUT.name if doc.get("z_cut")
                                             else doc.get("arm")),
                     "recovered_nats": _f(use.get("recovered_nats_per_token")),
                     "rule": use.get("rule"), "final": "eval_step_" not in str(
                         doc.get("checkpoint"))})
    t = pd.DataFrame(rows, columns=LATENT_COLS)
    return t.sort_values(["arm", "kappa_bits", "run_id", "step"], kind="stable",
                         ignore_index=True) if len(t) else t


def latent_over_training_png(t: pd.DataFrame) -> bytes | None:
    """The recovered share of the KL against training step, one line per run, coloured by arm
    and kappa, with the dead threshold: does the latent come alive as training goes on?"""
    if t.empty or not t["recovered_share"].notna().any():
        return None
    fig, ax = plt.subplots(figsize=(6.5, 3.5))
    groups = list(t.groupby(["arm", "kappa_bits"], dropna=False, sort=True))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, ((arm, k), g) in enumerate(groups):
        for j, (_, run) in enumerate(g.groupby("run_id", sort=True)):
            run = run.sort_values("step")
            ax.plot(run["step"], 100 * run["recovered_share"], marker="o", ms=3, lw=1,
                    color=colors[i % len(colors)],
                    label=f"{arm} kappa={k:g}" if j == 0 else None)
    ax.axhline(5, color="k", ls=":", lw=1, label="dead below 5% (upper end)")
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xlabel("training step")
    ax.set_ylabel("recovered share of the KL (%)")
    ax.set_title("Decoder-side latent use over training: (CE_prior - CE_posterior) / KL",
                 fontsize=8)
    ax.legend(fontsize=6)
    return _png(fig)


# ------------------------------------------------------------------------ figures
_png = partial(png_bytes, dpi=110)


def _title(doc: dict[str, Any]) -> str:
    return (f"{doc.get('run_id')} step {doc.get('checkpoint_step')}: H={doc.get('latent_bits')}, "
            f"kappa={doc.get('kappa_bits')} bit, n={doc.get('n_rows')} rows")


def figure_pngs(doc: dict[str, Any]) -> dict[str, bytes]:
    """{figure name: PNG bytes} for one probe file (FIGURES)."""
    kl = doc.get("kl") or {}
    out: dict[str, bytes] = {}
    per_bit = [_f(v) for v in kl.get("per_bit_bits") or []]
    thr = _f(kl.get("active_threshold_bits"))
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.bar(range(len(per_bit)), per_bit,
           color=["tab:blue" if v > thr else "tab:gray" for v in per_bit])
    ax.axhline(thr, color="k", ls=":", lw=1, label=f"active threshold {thr:g} bit")
    ax.set_xlabel("latent bit h")
    ax.set_ylabel("mean KL to uniform (bits)")
    ax.set_title("KL per latent bit (posterior; blue = active)\n" + _title(doc), fontsize=8)
    ax.legend(fontsize=7)
    out["kl_bits"] = _png(fig)

    per_pos = [_f(v) for v in kl.get("per_position_bits") or []]
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot(range(len(per_pos)), per_pos, lw=1)
    kappa = _f(doc.get("kappa_bits"))
    ax.axhline(kappa, color="tab:red", ls="--", lw=1, label=f"kappa = {kappa:g} bit")
    ax.set_xlabel("token position")
    ax.set_ylabel("KL per token (bits)")
    ax.set_title("KL per position, mean over rows\n" + _title(doc), fontsize=8)
    ax.legend(fontsize=7)
    out["kl_positions"] = _png(fig)

    modes = (doc.get("ablations") or {}).get("modes") or {}
    labels, means, err_lo, err_hi = [], [], [], []
    for mode in ABLATIONS:
        d = (modes.get(mode) or {}).get("delta_vs_prior") or {}
        m, lo, hi = _f(d.get("mean")), _f(d.get("lo")), _f(d.get("hi"))
        labels.append("posterior\n(LEAKING)" if mode == "posterior" else mode.replace("_", " "))
        means.append(m)
        err_lo.append(m - lo if math.isfinite(lo) else 0.0)
        err_hi.append(hi - m if math.isfinite(hi) else 0.0)
    fig, ax = plt.subplots(figsize=(6, 3))
    bars = ax.bar(labels, means, yerr=[err_lo, err_hi], capsize=4,
                  color=["tab:blue", "tab:orange", "tab:red"])
    bars[-1].set_hatch("//")
    ax.axhline(0, color="k", lw=0.8)
    ax.set_ylabel("CE - CE(prior Z), nats/token")
    ax.set_title("Z ablations vs prior Z (95% bootstrap over rows)\n" + _title(doc), fontsize=8)
    out["ablations"] = _png(fig)

    st = doc.get("steering") or {}
    pp = st.get("per_position") or {}
    fig, ax = plt.subplots(figsize=(6, 3))
    for key, lab, ls in (("shared_z", "one Z per group", "-"),
                         ("independent_z", "own Z per sample (null)", "--")):
        ys = [_f(v) for v in pp.get(key) or []]
        ax.plot(range(1, len(ys) + 1), ys, marker="o", ms=3, ls=ls, label=lab)
    diff = st.get("difference") or {}
    ax.set_xlabel("generated position")
    ax.set_ylabel("within-group agreement")
    ax.set_title(f"Steering: difference {_f(diff.get('mean')):.3g} "
                 f"[{_f(diff.get('lo')):.3g}, {_f(diff.get('hi')):.3g}], "
                 f"n={st.get('n_prompts')} prompts\n" + _title(doc), fontsize=8)
    ax.legend(fontsize=7)
    out["steering"] = _png(fig)
    return out


def write_figures(path: str | Path) -> dict[str, Path]:
    """The four PNGs of a probe file, beside it: <file stem>.<figure>.png."""
    path = Path(path)
    doc = read_probe(path)
    out = {}
    for name, png in figure_pngs(doc).items():
        out[name] = atomic_write(path.with_name(f"{path.stem}.{name}.png"),
                                 lambda f, b=png: f.write(b))
    return out


# ------------------------------------------------------------------------ report section
_cell = partial(cell_html, spec=".4g")
_ci = partial(ci, spec="+.4g", none=_cell(math.nan), lone=" (no interval)")


def probe_html(doc: dict[str, Any]) -> str:
    """One Free Transformer's block of the section (templates/probe_run.html.j2): its numbers
    with intervals and its four figures, embedded."""
    return template("probe_run.html.j2").render(
        r=probe_row(doc), use_rule=(doc.get("latent_use") or {}).get("rule"),
        coll_rule=(doc.get("collapse") or {}).get("rule"), figures=figure_pngs(doc),
        cell=_cell, ci=_ci)


def read_probes(run_dirs: Iterable[str | Path]) -> tuple[list[dict[str, Any]], list[str]]:
    """The probe files of the given runs, and one line per unreadable file (named, never
    skipped silently)."""
    docs, bad = [], []
    for f in probe_files(run_dirs):
        try:
            docs.append(read_probe(f))
        except UsageError as e:
            bad.append(str(e))
    return docs, bad


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m analysis.probe",
                                 description="figures beside probe files, and their table")
    ap.add_argument("paths", nargs="+", help="probe files or run dirs")
    a = ap.parse_args(argv)

    def body() -> int:
        files = probe_files(a.paths)
        if not files:
            raise UsageError(f"no probe files in {' '.join(a.paths)}")
        docs = [read_probe(f) for f in files]  # every file read before any figure is written
        for f in files:
            for p in write_figures(f).values():
                print(f"probe: {p}")
        with pd.option_context("display.width", 200, "display.max_columns", 12):
            print(probe_table(docs).drop(columns=["file"]).T.to_string(header=False))
        return 0

    return cli("probe", body)


if __name__ == "__main__":
    raise SystemExit(main())
