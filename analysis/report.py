"""One self-contained HTML report per sweep: results/sweeps/<name>/report.html.

    python -m analysis.report --name <sweep> [--synthetic <name>] [--n-boot 2000] [--check]

Also writes the tables (CSV, Markdown, LaTeX), the figures (PNG) and the checklist (CSV) under
results/sweeps/<name>/report/. Images are embedded, there is no external script, style sheet or
font, so the file opens offline. Every table goes through analysis/render.py. A partial sweep
works: a cell with no number says why ("missing: 1 running"), never 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import hashlib
import json
import math
import sys
from pathlib import Path

import pandas as pd

from common.arms import FREE
from common.benchmarks import PAPER_METRICS_CHECKED
from common.errors import UsageError, cli
from common.io import atomic_write_text, unwritable
from common.paths import RunDir, SweepDir, results_root, sweeps_dir
from common.records import Manifest, RecordError

from . import card as rcard
from . import checkpoints as ckpts
from . import figures, lead
from .browser import CHECK_JS, MEASURED, REQUIRED_SECTIONS, check_report
from .claims import checklist
from .derived import leak_table, overhead_table
from .frame import SweepData, load_sweep
from .latent import latent_section
from .render import ci, esc, html, img
from .render import png as render_png
from .tables import (
    LEGEND,
    VIEWS,
    cell_text,
    comparisons,
    missing_table,
    row_label,
    specs_used,
    truncation_table,
    write_tables,
)

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;
 max-width:1400px;color:#222;line-height:1.4}
h1{font-size:22px} h2{font-size:18px;border-bottom:1px solid #ccc;padding-top:8px}
table{border-collapse:collapse;font-size:12px;margin:8px 0}
td,th{border:1px solid #ccc;padding:3px 6px;vertical-align:top}
th{background:#f3f3f3} .grp{font-weight:600}
.better{background:#dff5df} .worse{background:#f8dddd} .missing{color:#888;font-style:italic}
.supported{background:#dff5df} .contradicted{background:#f8dddd} .inconclusive{background:#f4f0d8}
.note{background:#eef4fb;border-left:4px solid #5b8bd0;padding:6px 10px;font-size:13px}
img{max-width:100%;border:1px solid #ddd;margin:6px 0}
code,.mono{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:11px}
footer{font-size:11px;color:#444} .wide{overflow-x:auto;max-width:100%}
.lead-row{display:flex;gap:16px;align-items:flex-start}
.lead-fig{flex:0 0 62%} .lead-fig img{width:100%;margin:0}
.lead-side{flex:1 1 auto;font-size:12px} .lead-side table{font-size:11.5px}
table.card th{text-align:left;white-space:nowrap;width:1%} table.card{font-size:11.5px;width:100%}
.fold{font-size:12px;color:#444;margin:2px 0} a.cell{color:inherit;text-decoration:none}
a.cell:hover{text-decoration:underline} details{margin:6px 0} summary{cursor:pointer}
.cannot{background:#fff7e0;border-left:4px solid #d9a400;padding:6px 10px;font-size:12.5px}
"""


UNCHECKED = "" if PAPER_METRICS_CHECKED else " (unchecked)"
"""Beside every paper metric shown: common/benchmarks.py transcribed them without the paper's
tables at hand (PAPER_METRICS_CHECKED)."""


def paper_mark(label: str) -> str:
    """A row label's `[paper: m]` marked unchecked while the mapping is."""
    return label.replace("[paper: ", f"[paper{UNCHECKED}: ")


class RunIndex:
    """The appendix's index of run-id sets: every table cell that needs its runs links to one
    anchor here (`link`); `html` renders the appendix table (one row per distinct set)."""

    def __init__(self) -> None:
        self.rows: dict[str, dict] = {}

    def link(self, run_ids: object, label: str, files: object = "") -> str:
        ids = " ".join(sorted(str(run_ids).split())) if isinstance(run_ids, str) else ""
        if not ids:
            return ""
        anchor = "ids-" + hashlib.sha1(ids.encode()).hexdigest()[:10]
        r = self.rows.setdefault(anchor, {"labels": [], "run_ids": ids, "files": set()})
        if label not in r["labels"]:
            r["labels"].append(label)
        if isinstance(files, str) and files:
            r["files"].update(files.split())
        return anchor

    def a(self, run_ids: object, label: str, text: str = "runs") -> str:
        anchor = self.link(run_ids, label)
        return f'<a href="#{anchor}">{text}</a>' if anchor else ""

    def html(self) -> str:
        if not self.rows:
            return '<p class="missing">no table cell names runs</p>'
        return html(pd.DataFrame([{
            "runs of": f'<span id="{k}"></span>' + esc("; ".join(r["labels"][:6]))
                       + (" ..." if len(r["labels"]) > 6 else ""),
            "run-ids": f'<span class="mono">{esc(r["run_ids"])}</span>',
            "eval files": f'<span class="mono">{esc(" ".join(sorted(r["files"])))}</span>'}
            for k, r in self.rows.items()]), raw=("runs of", "run-ids", "eval files"))


def linked(df: pd.DataFrame, index: RunIndex, label: str) -> str:
    """A table whose `run_ids` column becomes a link to the runs in the appendix."""
    if df is None or df.empty:
        return html(df)
    runs = [index.a(r, f"{label} row {i + 1}") for i, r in enumerate(df["run_ids"])]
    return html(df.drop(columns="run_ids").assign(runs=runs), raw=("runs",))


def _fold_lines(st: pd.DataFrame) -> str:
    """The one-line summaries under a table: rows not evaluated (one line per reason) and rows
    at the floor."""
    out = []
    for why, g in st[~st["evaluated"].astype(bool)].groupby("why", sort=False):
        names = ", ".join(dict.fromkeys(g["benchmark"].fillna(g["task"]).astype(str)))
        out.append(f'<p class="fold">{esc(why)}: {esc(names)}</p>')
    fl = st[st["floor"].astype(bool)]
    if len(fl):
        names = ", ".join(f"{b} ({m})" for b, m in zip(fl["benchmark"].fillna(fl["task"]),
                                                        fl["metric"], strict=True))
        out.append(f'<p class="fold">At the floor (every arm scores 0, or holds chance in '
                   f"its interval; not drawn, no verdict possible): {esc(names)}</p>")
    return "".join(out)


def table_html(long: pd.DataFrame, index: RunIndex) -> str:
    """The paper-style table of ONE comparison, showing the rows evaluated and off the floor
    (the others are one line each under it). Each cell links to its run-ids in the appendix;
    hover it for its eval files, spec and interval methods."""
    cols = [c for c in dict.fromkeys(long["column"]) if c]
    st = lead.row_status(long[long["column"] != ""])
    keep = {(r.task, r.metric) for r in st.itertuples() if r.evaluated and not r.floor}
    nocol = long[long["column"] == ""]  # a benchmark the suite cannot run: folded too
    st = pd.concat([st, pd.DataFrame({"benchmark": nocol["benchmark"], "task": nocol["task"],
                                      "metric": nocol["metric"], "evaluated": False,
                                      "floor": False,
                                      "why": nocol["status"].fillna("").replace("", "no score")})
                    ], ignore_index=True)
    rows: dict[tuple[str, str], dict[str, str]] = {}
    for _, r in long[long["column"] != ""].iterrows():
        if (r["task"], r["metric"]) not in keep:
            continue
        row = rows.setdefault((r["group"], row_label(r)), {"benchmark": esc(paper_mark(
            row_label(r)))})
        cls = "missing" if not r.get("n_seeds") else (
            "better" if r["better"] is True else "worse" if r["better"] is False else "")
        title = (f"eval files: {r.get('files') or 'n/a'}; spec: {r.get('spec_ids') or 'n/a'}; "
                 f"CI: {r['ci_method'] or 'n/a'}; delta: {r['delta_method'] or 'n/a'}; items: "
                 f"{r['n_items']}")
        nt, nr = r.get("n_truncated", math.nan), r.get("n_requests", math.nan)
        if isinstance(nr, float) and math.isfinite(nr):
            title += f"; generation prompts cut: {nt:g}/{nr:g} (see Evaluation completeness)"
        anchor = index.link(r.get("run_ids"), str(r["column"]), r.get("files"))
        row[r["column"]] = (f'<a class="cell {cls}" href="#{anchor}" title="{esc(title)}">'
                            f"{esc(cell_text(r))}</a>")
    if not rows:
        return '<p class="missing">no benchmark row was evaluated off the floor</p>' + \
            _fold_lines(st)
    groups = [g for g, _ in rows]
    shown = pd.DataFrame([{"group": f'<span class="grp">{esc(g)}</span>'
                           if i == 0 or groups[i - 1] != g else "", **row}
                          for i, ((g, _), row) in enumerate(rows.items())],
                         columns=["group", "benchmark", *cols])
    return html(shown.fillna(""), raw=tuple(shown.columns)) + _fold_lines(st)


def completeness_html(data: SweepData) -> str:
    """What the evaluations lost: generation prompts cut to fit the window (per task) and
    scores that are missing (never 0)."""
    tr, mt = truncation_table(data), missing_table(data)
    out = ["<h3>Generation prompts and budget</h3>"]
    if tr.empty:
        out.append('<p class="missing">no generation task with a truncation record in the '
                   "eval files these tables use (log-likelihood tasks cut nothing; eval files "
                   "written before the record existed do not say)</p>")
    else:
        out.append("<p>Rule (experiments/eval/lm_adapter.py <code>plan_generation</code>): the "
                   "generation budget shrinks first, down to 1 token, so a prompt that fits the "
                   "window is kept whole; only a prompt that alone fills the window is cut from "
                   "the left (few-shot examples first, the question kept), leaving a budget of "
                   "min(requested, half the window). Counts are summed, extremes taken, over "
                   "the cells whose eval files recorded it (cells_recorded).</p>"
                   + html(tr.rename(columns=lambda c: c.replace("_", " ").replace(
                       "prompts truncated", "prompts cut"))))
    out.append("<h3>Missing scores (never counted as 0)</h3>")
    out.append("<p>none: every task of every used eval file was scored in full</p>" if mt.empty
               else "<p>A task whose run died has null metrics; an item whose code check "
               "crashed or timed out is unscored. Tables average over scored items and seeds "
               "only, and each such cell says so.</p>" + html(mt))
    return "".join(out) + "<p>Files: report/truncation.csv, report/missing.csv</p>"


def find_synthetic(root: Path, sweep: str, name: str | None) -> Path | None:
    """results/synthetic/<name>: the one asked for, else one named like the sweep, else
    'demo', else 'default', else the only one there is."""
    base = root / "synthetic"
    if name:
        return base / name
    for cand in (sweep, "demo", "default"):
        if (base / cand).is_dir():
            return base / cand
    dirs = sorted(p for p in base.glob("*") if p.is_dir()) if base.is_dir() else []
    return dirs[0] if len(dirs) == 1 else None


def _synthetic_html(synth: Path | None) -> str:
    if synth is None or not synth.is_dir():
        return ('<p class="missing">synthetic experiment: no results (run '
                '<code>make synthetic</code>)</p>')
    read = (lambda f: (synth / f).read_bytes() if (synth / f).is_file() else None)
    parts = [f"<p>from <code>{esc(synth)}</code></p>",
             img(read("figure.png"), "synthetic figure", "figure.png missing"),
             html(pd.read_csv(synth / "table.csv")) if (synth / "table.csv").is_file()
             else '<p class="missing">table missing</p>']
    if read("agreement.png"):  # only runs that kept checkpoints have it: no gap when absent
        parts += ["<p>Agreement over training (every kept checkpoint measured as the final "
                  "model; the rows are in <code>agreement.csv</code>):</p>",
                  img(read("agreement.png"), "agreement over training", "")]
    return "\n".join(parts)


def _provenance_html(data: SweepData, synth: Path | None) -> str:
    m, c = data.manifest, data.cells
    short = (lambda x, n: x[:n] if isinstance(x, str) and x else None)
    out = ["<p>Every number above comes from the runs of its column: a table cell links to its "
           "run-ids above; the CSV tables carry a <code>run_ids</code> column.</p>",
           f"<p>sweep <b>{esc(m.get('name'))}</b>, created {esc(m.get('created'))}, launcher "
           f"{esc(m.get('launcher'))}, git commit <code>{esc(m.get('git_commit'))}</code>; "
           f"manifest <code>{esc(data.root / 'sweeps' / data.name / 'manifest.json')}</code></p>",
           f"<p>grid: <code>{esc(json.dumps(m.get('grid'), sort_keys=True))}</code></p>"]
    if not c.empty:
        runs = pd.DataFrame([{
            "run_id": r["run_id"], "cell": r["cell"], "state": r["state"],
            "config_sha256": short(r.get("config_sha256"), 16),
            "git_commit": short(r.get("git_commit"), 12), "git_dirty": r.get("git_dirty"),
            "versions": " ".join(f"{k}={v}" for k, v in sorted((r.get("versions") if isinstance(
                r.get("versions"), dict) else {}).items())) or None,
            "tokenizer_sha256": short(r.get("tokenizer_sha256"), 16),
            **{k: r.get(k) for k in ("launcher", "threads", "host")}} for _, r in c.iterrows()])
        out.append(f"<details><summary>Runs ({len(runs)}): config hash, commit, tree state, "
                   "versions, host</summary>" + html(runs) + "</details>")
    if data.evals:
        ev = pd.DataFrame([{
            **{k: e.get(k) for k in ("file", "suite", "z_mode", "k", "leaks", "seed", "limit",
                                     "spec_id")},
            "spec": "legacy (derived)" if e.get("spec_legacy") else "recorded",
            "used": "yes" if e.get("used", True) else f"no: {e.get('excluded_reason')}",
            "harness": " ".join(f"{k}={v}" for k, v in sorted((e.get("versions") or {}).items())),
            "git_commit": (e.get("git_commit") or "")[:12], "sha256": e["file_sha256"][:16]}
            for e in data.evals])
        out.append(f"<details><summary>Evaluations ({len(ev)} files: harness versions, specs, "
                   "checksums)</summary>" + html(ev) + "</details>")
    sums: dict[str, str] = dict(m.get("data_checksums") or {})
    for d in c.get("data_checksums", pd.Series(dtype=object)).dropna():
        sums.update(d if isinstance(d, dict) else {})
    for e in data.evals:
        sums.update(e.get("data_checksums") or {})
    out.append("<h3>Data checksums (sha256)</h3>" + (html(pd.DataFrame(
        [{"data": k, "sha256": v} for k, v in sorted(sums.items())])) if sums else
        '<p class="missing">none recorded</p>'))
    if synth is not None:
        out.append(f"<p>synthetic experiment: <code>{esc(synth)}</code></p>")
    if data.warnings:
        out.append("<h3>Warnings</h3><ul>" + "".join(f"<li>{esc(w)}</li>"
                                                     for w in data.warnings) + "</ul>")
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join(out) + (f"\n<p>report generated {now} by analysis.report (python "
                             f"{sys.version.split()[0]}, pandas {pd.__version__}).</p>")


def _summary_html(data: SweepData) -> str:
    c = data.cells
    seeds = sorted(set(c["seed"].dropna())) if len(c) else []
    chance = ", ".join(f"{k} {v:g}" for k, v in lead.CHANCE.items())
    return (f"<p>{len(c)} cells, {int((c['state'] == 'done').sum()) if len(c) else 0} done; "
            f"seeds {esc(seeds)}. {esc(LEGEND)}</p>"
            + ('<p class="note">One seed: every Δ is an item-level bootstrap (marked †) that does '
               "not include seed-to-seed variance, so no claim below is supported or "
               "contradicted on it. Run SEEDS=\"0 1 2\" for verdicts.</p>" if len(seeds) < 2
               else "")
            + '<p class="note">Read small-scale numbers with care: models this small score near '
            f"chance on these benchmarks (chance: {chance}), so accuracy differences are mostly "
            "noise and the smooth metrics (bits per byte of gold answers, validation CE in nats) "
            "carry the signal. A verdict of 'inconclusive' is the expected outcome of a demo; "
            "the minimum detectable effect beside each verdict (and in Signal and noise) says "
            "what the sweep could have seen.</p>")


def _table3_html(data: SweepData, out_dir: Path, main: pd.DataFrame) -> str:
    """The paper's Table-3 pair and Figures 5-7 from the evaluated checkpoints; rows at the
    floor in the main table (every arm 0 or at chance) are one line, and not drawn."""
    t3 = ckpts.table3(data)
    t3.to_csv(out_dir / "table3.csv", index=False)
    st = lead.row_status(main[main["column"] != ""]) if len(main) else lead.row_status(main)
    floor = {(r.task, r.metric) for r in st.itertuples() if r.floor}
    p = data.points  # the curves leave out the floor rows and every all-zero curve
    if len(p):
        zero = {k for k, g in p.groupby(["task", "metric"]) if (g["value"].fillna(0) == 0).all()}
        p = p[[(t, m) not in floor | zero for t, m in zip(p["task"], p["metric"], strict=True)]]
    fig = ckpts.curves_figure(dataclasses.replace(data, points=p))
    png = render_png(fig)
    if png:
        (out_dir / "benchmark_curves.png").write_bytes(png)
    title = "Training curves and Table 3 (final value, mean over the last third)"
    if t3.empty:
        return _section("table3", title, '<p class="missing">no evaluated checkpoints besides '
                        "the final one: run the sweep with EVAL=1 EVAL_POINTS=n (n evenly spaced "
                        "checkpoints) for the paper's curves and its last-third average</p>")
    view = t3.assign(
        benchmark=t3["benchmark"] + " (" + t3["metric"] + "; paper " + t3["paper_metric"]
        + UNCHECKED + ")",
        **{"final [95% CI over seeds]": [ci(*x, none="—") for x in zip(
            t3["final"], t3["final_lo"], t3["final_hi"], strict=True)],
           "last third [95% CI over seeds]": [ci(*x, none="—") for x in zip(
               t3["last_third"], t3["last_third_lo"], t3["last_third_hi"], strict=True)]})
    zero = {k for k, g in t3.groupby(["task", "metric"])
            if (pd.to_numeric(g["final"], errors="coerce").fillna(0) == 0).all()}
    at_floor = [(t, m) in floor | zero for t, m in zip(view["task"], view["metric"], strict=True)]
    shown = view[[not f for f in at_floor]][[
        "group", "benchmark", "column", "n_seeds", "n_points", "final [95% CI over seeds]",
        "last third [95% CI over seeds]", "steps", "ci_method"]]
    fl = sorted(set(view.loc[at_floor, "benchmark"]))
    return _section(
        "table3", title,
        "<p>Per seed: the final checkpoint's value and the mean over the evaluated "
        "checkpoints in the last third of training (tokens >= 2/3 of the final's; "
        "n_points of them, steps listed); then the mean over seeds with a t interval over "
        "seeds (none with one seed). Leaking (posterior-Z) scores are never used.</p>"
        + (f"<details><summary>Table 3 ({len(shown)} rows)</summary>{html(shown)}</details>"
           if len(shown) else "")
        + (f'<p class="fold">At the floor (every arm 0; not shown, not drawn): '
           f'{esc(", ".join(fl))}</p>' if fl else "")
        + img(png, "benchmark curves vs training tokens",
              "every evaluated checkpoint's score is at the floor"
              if png is None and not len(shown) else "fewer than two steps")
        + "<p>Files: report/table3.csv, report/benchmark_curves.png</p>")


def _likelihood_html(data: SweepData, out_dir: Path) -> str:
    lt = ckpts.likelihood_table(data)
    lt.to_csv(out_dir / "likelihood.csv", index=False)
    title = "Likelihood: both arms on one honest basis"
    if lt.empty:
        return _section("likelihood", title, '<p class="missing">no likelihood files (the '
                        "chained evaluation writes them with EVAL=1; or run <code>python -m "
                        "experiments.eval.likelihood &lt;run dir&gt;</code>)</p>")
    per = [f"{col}: gap {pd.to_numeric(g['gap_nats_per_token'], errors='coerce').mean():+.4f} "
           "nats/token, KL spend recovered "
           f"{100 * pd.to_numeric(g['kl_spend_recovered'], errors='coerce').mean():.2g}% (mean "
           f"of {pd.to_numeric(g['gap_nats_per_token'], errors='coerce').notna().sum()} seeds)"
           for col, g in lt.groupby("column", sort=False)]
    return _section(
        "likelihood", title,
        "<p>Validation bits per byte from experiments/eval/likelihood.py on the same "
        "rows for both arms: the baseline's is exact, the Free Transformer's an "
        "importance-weighted (IWAE) upper bound on its NLL at k = 1, 8, 64 (spread = how "
        "far the bound moved from the smallest to the largest k). gap = FT minus baseline "
        "NLL in nats per token at the largest k (an upper bound on the true gap). "
        "KL spend recovered = (CE_baseline - CE_posterior) / KL (bryanvine's figure); the "
        "_iwae variant replaces the ELBO by the IWAE bound. The posterior-Z CE is "
        "<b>leaking</b> (Z from an encoder that reads the scored tokens): it is not a "
        "likelihood and is never compared with the baseline's CE.</p>"
        f"<p>{esc('; '.join(per))}</p><details><summary>Per Free Transformer and seed "
        f"({len(lt)} rows)</summary>{html(lt)}</details><p>File: report/likelihood.csv</p>")


def _lead_html(data: SweepData, forest: pd.DataFrame, tables: dict[str, pd.DataFrame],
               out_dir: Path) -> str:
    """The first screen: the forest (lead figure; with one seed each run's value instead) and
    the learning curves beside the verdicts in words, runs that trained identically, and what
    the sweep can and cannot say."""
    one_seed = len(data.cells) > 0 and data.cells["seed"].dropna().nunique() < 2
    fig, _ = lead.per_run_figure(tables) if one_seed else lead.forest_figure(forest)
    png = render_png(fig)
    if png:
        (out_dir / "lead_forest.png").write_bytes(png)
    curves = figures.learning_curves(data)
    curves_png = render_png(curves)
    if curves_png:
        (out_dir / "learning_curves.png").write_bytes(curves_png)
    forest.to_csv(out_dir / "lead.csv", index=False)
    same = lead.identical_runs(data)
    st = pd.concat([lead.row_status(t[t["column"] != ""]) for t in tables.values() if len(t)]
                   or [lead.row_status(pd.DataFrame())])
    not_eval = sorted(set(st.loc[~st["evaluated"].astype(bool), "benchmark"].dropna()))
    words = lead.verdict_words(forest)
    side = html(pd.DataFrame(words, columns=["comparison", "verdict (all kappas, every "
                                             "measured metric)"])) if words else \
        '<p class="missing">no comparison has a Δ yet</p>'
    return ('<section id="lead"><div class="lead-row"><div class="lead-fig">'
            + img(png, "lead figure: each run's value per metric" if one_seed else
                  "lead figure: forest of Δ per comparison, kappa and metric",
                  "no comparison has a Δ yet (nothing evaluated, or no reference arm)")
            + '</div><div class="lead-side">'
            + "".join(f'<p class="cannot"><b>Trained identically.</b> {esc(x)}.</p>'
                      for x in same)
            + (f'<p class="note">{esc(lead.ONE_SEED_WHY)}.</p>' if one_seed else "")
            + '<b>Verdicts</b> (Holm across kappas; grey band '
            f"= ±MDE at 80% power){side}"
            f'<p class="cannot"><b>What this sweep can and cannot say.</b> '
            f"{esc(lead.can_cannot(data, forest, tables, not_eval))}</p>"
            + img(curves_png, "learning curves: validation CE against tokens and FLOPs",
                  "no validation line yet")
            + "<p>Details: <a href=\"#verdicts\">verdicts by metric</a>, "
            "<a href=\"#table-tokens\">tables</a>, <a href=\"#signal-noise\">signal and "
            "noise</a>, <a href=\"#probe\">the latent</a>, <a href=\"#appendix\">run-ids "
            "and provenance</a>. Files: report/lead.csv, report/lead_forest.png, "
            "report/learning_curves.png, report/summary.png</p></div></div></section>")


def _claims_html(claims: pd.DataFrame, index: RunIndex) -> str:
    counts = claims["verdict"].value_counts() if len(claims) else pd.Series(dtype=int)
    skip = claims["evidence"].astype(str).str.endswith(": not evaluated in this sweep") \
        if len(claims) else pd.Series(dtype=bool)
    shown = pd.DataFrame({
        "claim": claims["claim"].map(esc),
        "verdict": [f'<span class="{esc(v)}"><b>{esc(v)}</b></span>' for v in claims["verdict"]],
        "our evidence": claims["evidence"].map(esc), "source": claims["source"].map(esc),
        "runs": [index.a(r, f"claim: {c[:60]}") if isinstance(r, str) else ""
                 for c, r in zip(claims["claim"], claims["run_ids"], strict=True)]})[~skip]
    unjudged = [c.removeprefix("The Free Transformer beats the baseline ")
                for c in claims.loc[skip, "claim"]]
    return _section("claims", "Paper claims checklist", f"<details><summary>{len(claims)} claims: "
            f"{esc(', '.join(f'{n} {v}' for v, n in counts.items()))} (open for the evidence)"
            f"</summary>{html(shown, raw=tuple(shown.columns))}"
            + (f'<p class="fold">Inconclusive, the benchmark not evaluated in this sweep: '
               f'{esc("; ".join(unjudged))}</p>' if unjudged else "")
            + "</details><p>File: report/claims.csv</p>")


def _signal_noise_html(sn: pd.DataFrame, verdicts: pd.DataFrame) -> str:
    body = '<p class="missing">no metric with scores yet</p>' if sn.empty else (
        "<p>Per metric: the seed SD (pooled over every arm's column), the spread of the "
        "columns' means across arms and kappas, and their ratio (the signal-to-noise of "
        "Heineman et al. 2025, <i>Signal and Noise</i>: a benchmark tells models apart when "
        "the spread is large against the seed noise), beside the median minimum detectable "
        "effect of the lead figure's comparisons.</p>" + html(sn.rename(columns={
            "seed_sd": "seed SD", "spread_across_arms": "spread across arms and kappas (SD of "
            "means)", "signal_to_noise": "signal / noise", "mde": "MDE (median)",
            "n_seeds": "seeds"})))
    return _section("signal-noise", "Signal and noise per metric", body) + _section(
        "verdicts", "Verdicts by metric", html(verdicts) + "<p>File: report/lead.csv (every Δ "
        "of the lead figure, with its source table)</p>")


def _overhead_html(data: SweepData, index: RunIndex) -> str:
    """The overhead table, after what a wall-clock comparison rests on: its n and the
    machine's load."""
    ot = overhead_table(data)
    table = linked(ot, index, "overhead")
    if ot.empty or not ot["wallclock_pairs"].fillna(0).gt(0).any():
        return table
    n = sorted(set(ot["wallclock_pairs"].fillna(0).astype(int)))
    local = data.manifest.get("local") if isinstance(data.manifest.get("local"), dict) else {}
    load = (f"{local['jobs']} job(s) ran at once, {local.get('threads_per_job', '?')} thread(s) "
            "each" if local.get("jobs") else "the jobs' concurrency is not recorded")
    return (f'<p class="note">Wall-clock overhead: the median over n = {"/".join(map(str, n))} '
            "seed pair(s) per column, each pair run on one host with the same threads and "
            f"launcher; {load}, and the machine's other load was not recorded: on a shared "
            "CPU one pair can be off by tens of percent. The FLOPs overhead is analytic and "
            "exact.</p>" + table)


def _section(sid: str, title: str, body: str) -> str:
    return f'<section id="{sid}"><h2>{esc(title)}</h2>{body}</section>'


def build_report(name: str, root: str | Path | None = None, synthetic: str | None = None,
                 n_boot: int = 2000) -> Path:
    """Write report.html (and report/ with tables, figures, checklist, summary.png); return
    its path."""
    root = results_root(root)
    data = load_sweep(name, root)
    out_dir = SweepDir.of(name, root).report_dir
    tables = write_tables(data, out_dir, n_boot=n_boot)
    synth = find_synthetic(root, name, synthetic)
    comps, notes = comparisons(data)
    claims = checklist(data, tables, synth, notes)
    claims.to_csv(out_dir / "claims.csv", index=False)
    index = RunIndex()
    forest = lead.forest_frame(tables)
    lines = rcard.facts(data, forest)
    summary_png = render_png(rcard.summary_figure(lines, forest, name)[0])
    (out_dir / "summary.png").write_bytes(summary_png)
    sn = lead.signal_noise(data, tables, forest)
    sn.to_csv(out_dir / "signal_noise.csv", index=False)
    main_table = tables["tokens"] if len(tables["tokens"]) else tables["flops"]
    figs = {}
    for key, fn in (("training_curves", figures.training_curves),
                    ("val_ce_vs_kappa", figures.val_ce_vs_kappa),
                    ("benchmarks_vs_kappa", lambda _: figures.benchmarks_vs_kappa(main_table)),
                    ("overhead", figures.overhead)):
        figs[key] = render_png(fn(data))
        if figs[key]:
            (out_dir / f"{key}.png").write_bytes(figs[key])
    sections = [
        _lead_html(data, forest, tables, out_dir),
        _section("card", "Report card", rcard.card_html(lines) + "<details><summary>summary.png "
                 "(this card and the headline forest as one picture, for a review)</summary>"
                 + img(summary_png, "report card (summary.png)", "not drawn") + "</details>"),
        _section("summary", "How to read this report", _summary_html(data)),
        _signal_noise_html(sn, lead.verdict_table(forest))]
    heads = {"tokens": "Equal tokens (the paper's protocol)", "flops": "Equal FLOPs"}
    for view in VIEWS:
        t = tables[view]
        body = [f'<p class="note">{esc(notes.get(view, ""))}</p>']
        if t.empty:
            body.append('<p class="missing">no table for this view (see the note above)</p>')
        for comp in [c for c in comps if c.view == view] or [None]:
            part = t[t["comparison"] == comp.key] if comp is not None and len(t) else t
            if len(part):
                body.append(f"<h3>{esc(comp.title if comp else 'reference missing')}</h3>"
                            + table_html(part, index))
        specs = specs_used(data, t) if len(t) else []
        if specs:
            body.append("<p>Eval specs of these cells (one per suite; never mixed): "
                        + "; ".join(f"<code>{esc(x)}</code>" for x in specs) + "</p>")
        sections.append(_section(f"table-{view}", heads[view], "".join(body)
                                 + f"<p>Files: report/table_{view}.csv, .md, .tex (every row, "
                                 "for pasting)</p>"))
    free_runs = [RunDir.of(str(r), data.root).path for r in
                 data.cells.loc[data.cells["arm"] == FREE.name, "run_id"].dropna()]
    sections += [
        _claims_html(claims, index), _table3_html(data, out_dir, main_table),
        _likelihood_html(data, out_dir),
        latent_section(free_runs, out_dir),  # one figure per kappa, runs folded
        _section("eval-completeness", "Evaluation completeness: truncation and missing scores",
                 completeness_html(data)),
        _section("figures", "Figures",
                 img(figs["training_curves"], "training curves", "no training metrics yet")
                 + img(figs["val_ce_vs_kappa"], "validation CE vs kappa",
                       "no Free Transformer validation CE yet")
                 + "<h3>Leak check (the paper's \"collapse\")</h3>"
                 + linked(leak_table(data), index, "leak check")
                 + img(figs["benchmarks_vs_kappa"], "benchmarks vs kappa",
                       "no benchmark scores off the floor yet")
                 + img(figs["overhead"], "overhead vs 1/L", "no accounting or throughput yet")
                 + "<h3>Overhead</h3>" + _overhead_html(data, index)),
        _section("synthetic", "Synthetic task (paper §4.1)", _synthetic_html(synth))]
    c = data.cells
    status = '<p class="missing">the manifest lists no cells</p>' if c.empty else (
        "<p>cells: " + ", ".join(f"{n} {esc(s)}" for s, n in
                                 c["state"].fillna("unknown").value_counts().items()) + "</p>"
        + html(c.assign(eval_files=c.get("eval_files", "").map(
            lambda x: " ".join(x) if isinstance(x, list) else x))[[
                k for k in ["cell", "arm", "kappa_bits", "latent_bits", "seed", "run_id",
                            "state", "eval_state", "reason", "final_tokens", "final_flops",
                            "wall_s", "tokens_per_s", "eval_files"] if k in c]]))
    sections.append(_section(
        "appendix", "Appendix: run-ids, cells and provenance",
        "<h3>Run-ids of every table cell</h3><p>Each table cell links here; the run-id is the "
        "hash of the resolved training config (docs/RESULTS.md).</p>" + index.html()
        + f'<div id="runs"><details><summary>Cells and their state ({len(c)})</summary>'
        f"{status}</details></div>"
        f'<footer id="provenance"><h3>Provenance</h3>{_provenance_html(data, synth)}</footer>'))
    doc = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
           f"<title>Free Transformer benchmark: {esc(name)}</title><style>{CSS}</style>"
           f"<script>{CHECK_JS % (json.dumps(REQUIRED_SECTIONS), json.dumps(MEASURED))}</script>"
           f"</head><body><h1>Free Transformer vs baseline: sweep <code>{esc(name)}</code></h1>"
           + "\n".join(sections) + "</body></html>\n")
    return atomic_write_text(SweepDir.of(name, root).report_html, doc)


def preflight(name: str, root: str | Path | None, n_boot: int) -> None:
    """Every check that needs no work: the sweep exists, its manifest parses, the report's
    places are writable. UsageError naming the file and what to do."""
    if n_boot < 1:
        raise UsageError(f"--n-boot: {n_boot} must be >= 1")
    if not name.strip() or "/" in name or name in (".", ".."):
        raise UsageError(f"NAME {name!r} is not a sweep name (a folder under results/sweeps)")
    root = results_root(root)
    sdir = SweepDir.of(name, root)
    man = sdir.manifest_path
    if not sdir.exists():
        raise UsageError(f"no sweep {name!r}: {man} does not exist; sweeps under "
                         f"{sweeps_dir(root)}: {' '.join(SweepDir.names(root)) or 'none'}")
    try:
        m = json.loads(man.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{man} is corrupt ({type(e).__name__}: {e}); re-run the sweep "
                         "command to rewrite it") from None
    except OSError as e:
        raise UsageError(f"{man} cannot be read ({e.strerror})") from None
    if not isinstance(m, dict) or not isinstance(m.get("cells", []), list):
        raise UsageError(f"{man} is not a sweep manifest (no list of cells)")
    try:  # e.g. a manifest written by a newer version of the suite
        Manifest.from_json(m, str(man))
    except RecordError as e:
        raise UsageError(str(e)) from None
    for d in (sdir.path, sdir.report_dir):
        bad = unwritable(d)
        if bad is not None:
            raise UsageError(f"cannot write the report: {bad.blocker} is not a writable directory "
                             f"({bad}; fix its permissions or set FTBENCH_RESULTS)")
    if sdir.report_html.exists() and unwritable(sdir.report_html, file=True) is not None:
        raise UsageError(f"cannot write the report: {sdir.report_html} is not a writable file")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Write results/sweeps/<name>/report.html")
    ap.add_argument("--name", required=True, help="sweep name (results/sweeps/<name>)")
    ap.add_argument("--root", default=None, help="results root (default $FTBENCH_RESULTS or "
                                                 "results/)")
    ap.add_argument("--synthetic", default=None, help="results/synthetic/<name> to embed")
    ap.add_argument("--n-boot", type=int, default=2000, help="bootstrap replicates")
    ap.add_argument("--check", action="store_true",
                    help="also open it in headless Chromium and keep a screenshot")
    ap.add_argument("--screenshot", default=None, help="screenshot path for --check")
    a = ap.parse_args(argv)

    def body() -> int:
        preflight(a.name, a.root, a.n_boot)
        path = build_report(a.name, a.root, a.synthetic, a.n_boot)
        print(f"report: {path.resolve()}")
        if a.check:
            res = check_report(path, Path(a.screenshot) if a.screenshot
                               else path.parent / "report" / "report.png")
            print(f"chromium check: {res}")
            return 0 if res["ok"] else 1
        return 0

    return cli("report", body)


if __name__ == "__main__":
    sys.exit(main())
