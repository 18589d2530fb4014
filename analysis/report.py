"""One self-contained HTML report per sweep: results/sweeps/<name>/report.html.

    python -m analysis.report --name <sweep> [--synthetic <name>] [--n-boot 2000] [--check]

Also writes the tables (CSV, Markdown, LaTeX), the figures (PNG) and the checklist (CSV) under
results/sweeps/<name>/report/. Images are embedded, there is no external script, style sheet or
font, so the file opens offline. Every table goes through analysis/render.py, the page through
templates/report.html.j2. A partial sweep works: a cell with no number says why ("missing: 1
running"), never 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import functools
import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Any

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
from .render import ci, esc, html, template
from .render import png as render_png
from .tables import (
    LEGEND,
    VIEWS,
    cell_text,
    comparisons,
    missing_table,
    specs_used,
    truncation_table,
    wide,
    write_tables,
)

UNCHECKED = "" if PAPER_METRICS_CHECKED else " (unchecked)"
"""Beside every paper metric shown: common/benchmarks.py transcribed them without the paper's
tables at hand (PAPER_METRICS_CHECKED)."""


@functools.cache
def _t() -> Any:
    """The report template's macros, one per section."""
    return template("report.html.j2").module


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


def table_html(long: pd.DataFrame, index: RunIndex) -> str:
    """The paper-style table of ONE comparison, showing the rows evaluated and off the floor;
    the others are one line each under it (per reason not evaluated, and the floor: every arm
    at 0 or chance). Each cell links to its run-ids in the appendix; hover it for its eval
    files, spec and interval methods."""
    st = lead.row_status(long)
    keep = {(r.task, r.metric) for r in st.itertuples() if r.evaluated and not r.floor}
    nocol = long[long["column"] == ""]  # a benchmark the suite cannot run: folded too
    st = pd.concat([st, pd.DataFrame({"benchmark": nocol["benchmark"], "task": nocol["task"],
                                      "metric": nocol["metric"], "evaluated": False,
                                      "floor": False,
                                      "why": nocol["status"].fillna("").replace("", "no score")})
                    ], ignore_index=True)

    def cell(r: pd.Series) -> str:
        cls = "missing" if not r.get("n_seeds") else (
            "better" if r["better"] is True else "worse" if r["better"] is False else "")
        title = (f"eval files: {r.get('files') or 'n/a'}; spec: {r.get('spec_ids') or 'n/a'}; "
                 f"CI: {r['ci_method'] or 'n/a'}; delta: {r['delta_method'] or 'n/a'}; items: "
                 f"{r['n_items']}")
        nt, nr = r.get("n_truncated", math.nan), r.get("n_requests", math.nan)
        if isinstance(nr, float) and math.isfinite(nr):
            title += f"; generation prompts cut: {nt:g}/{nr:g} (see Evaluation completeness)"
        anchor = index.link(r.get("run_ids"), str(r["column"]), r.get("files"))
        return (f'<a class="cell {cls}" href="#{anchor}" title="{esc(title)}">'
                f"{esc(cell_text(r))}</a>")

    kept = long[(long["column"] != "") & pd.Series(
        [k in keep for k in zip(long["task"], long["metric"], strict=True)], index=long.index)]
    shown = None
    if len(kept):
        df = wide(kept, cell)
        # a row label's `[paper: m]` is marked unchecked while the mapping is
        df["benchmark"] = df["benchmark"].map(
            lambda b: esc(b.replace("[paper: ", f"[paper{UNCHECKED}: ")))
        df["group"] = [f'<span class="grp">{esc(g)}</span>' if prev != g else ""
                       for prev, g in zip([None, *df["group"]], df["group"], strict=False)]
        shown = html(df, raw=tuple(df.columns))
    reasons = [(why, ", ".join(dict.fromkeys(g["benchmark"].fillna(g["task"]).astype(str))))
               for why, g in st[~st["evaluated"].astype(bool)].groupby("why", sort=False)]
    fl = st[st["floor"].astype(bool)]
    return _t().comparison(shown, reasons, ", ".join(f"{b} ({m})" for b, m in zip(
        fl["benchmark"].fillna(fl["task"]), fl["metric"], strict=True)))


def completeness_html(data: SweepData) -> str:
    """What the evaluations lost: generation prompts cut to fit the window (per task) and
    scores that are missing (never 0)."""
    return _t().completeness(truncation_table(data).rename(columns=lambda c: c.replace(
        "_", " ").replace("prompts truncated", "prompts cut")), missing_table(data))


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
        return _t().synthetic(None, None, None, None)
    read = (lambda f: (synth / f).read_bytes() if (synth / f).is_file() else None)
    table = pd.read_csv(synth / "table.csv") if (synth / "table.csv").is_file() else None
    # agreement.png: only runs that kept checkpoints have it (no gap when absent)
    return _t().synthetic(synth, read("figure.png"), table, read("agreement.png"))


def _provenance_html(data: SweepData, synth: Path | None) -> str:
    m, c = data.manifest, data.cells
    short = (lambda x, n: x[:n] if isinstance(x, str) and x else None)
    runs = None if c.empty else pd.DataFrame([{
        "run_id": r["run_id"], "cell": r["cell"], "state": r["state"],
        "config_sha256": short(r.get("config_sha256"), 16),
        "git_commit": short(r.get("git_commit"), 12), "git_dirty": r.get("git_dirty"),
        "versions": " ".join(f"{k}={v}" for k, v in sorted((r.get("versions") if isinstance(
            r.get("versions"), dict) else {}).items())) or None,
        "tokenizer_sha256": short(r.get("tokenizer_sha256"), 16),
        **{k: r.get(k) for k in ("launcher", "threads", "host")}} for _, r in c.iterrows()])
    ev = None if not data.evals else pd.DataFrame([{
        **{k: e.get(k) for k in ("file", "suite", "z_mode", "k", "leaks", "seed", "limit",
                                 "spec_id")},
        "used": "yes" if e.get("used", True) else f"no: {e.get('excluded_reason')}",
        "harness": " ".join(f"{k}={v}" for k, v in sorted((e.get("versions") or {}).items())),
        "git_commit": (e.get("git_commit") or "")[:12], "sha256": e["file_sha256"][:16]}
        for e in data.evals])
    sums: dict[str, str] = dict(m.get("data_checksums") or {})
    for d in c.get("data_checksums", pd.Series(dtype=object)).dropna():
        sums.update(d if isinstance(d, dict) else {})
    for e in data.evals:
        sums.update(e.get("data_checksums") or {})
    return _t().provenance(
        m, data.root / "sweeps" / data.name / "manifest.json",
        json.dumps(m.get("grid"), sort_keys=True), runs, ev,
        pd.DataFrame([{"data": k, "sha256": v} for k, v in sorted(sums.items())]) if sums
        else None, synth, data.warnings,
        dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        sys.version.split()[0], pd.__version__)


def _table3_html(data: SweepData, out_dir: Path, main: pd.DataFrame) -> str:
    """The paper's Table-3 pair and Figures 5-7 from the evaluated checkpoints; rows at the
    floor in the main table (every arm 0 or at chance) are one line, and not drawn."""
    t3 = ckpts.table3(data)
    t3.to_csv(out_dir / "table3.csv", index=False)
    st = lead.row_status(main)
    floor = {(r.task, r.metric) for r in st.itertuples() if r.floor}
    p = data.points  # the curves leave out the floor rows and every all-zero curve
    if len(p):
        zero = {k for k, g in p.groupby(["task", "metric"]) if (g["value"].fillna(0) == 0).all()}
        p = p[[(t, m) not in floor | zero for t, m in zip(p["task"], p["metric"], strict=True)]]
    png = render_png(ckpts.curves_figure(dataclasses.replace(data, points=p)))
    if png:
        (out_dir / "benchmark_curves.png").write_bytes(png)
    if t3.empty:
        return _t().table3(True, None, None, None)
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
    return _t().table3(False, shown, sorted(set(view.loc[at_floor, "benchmark"])), png)


def _likelihood_html(data: SweepData, out_dir: Path) -> str:
    lt = ckpts.likelihood_table(data)
    lt.to_csv(out_dir / "likelihood.csv", index=False)
    num = (lambda g, k: pd.to_numeric(g[k], errors="coerce"))
    return _t().likelihood(lt, [
        f"{col}: gap {num(g, 'gap_nats_per_token').mean():+.4f} nats/token, KL spend recovered "
        f"{100 * num(g, 'kl_spend_recovered').mean():.2g}% (mean of "
        f"{num(g, 'gap_nats_per_token').notna().sum()} seeds)"
        for col, g in lt.groupby("column", sort=False)])


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
    curves_png = render_png(figures.learning_curves(data))
    if curves_png:
        (out_dir / "learning_curves.png").write_bytes(curves_png)
    forest.to_csv(out_dir / "lead.csv", index=False)
    st = pd.concat([lead.row_status(t) for t in tables.values() if len(t)]
                   or [lead.row_status(pd.DataFrame())])
    not_eval = sorted(set(st.loc[~st["evaluated"].astype(bool), "benchmark"].dropna()))
    words = lead.verdict_words(forest)
    return _t().lead(png, one_seed, lead.identical_runs(data), lead.ONE_SEED_WHY, pd.DataFrame(
        words, columns=["comparison", "verdict (all kappas, every measured metric)"])
        if words else None, lead.can_cannot(data, forest, tables, not_eval), curves_png)


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
    return _t().claims(len(claims), ", ".join(f"{n} {v}" for v, n in counts.items()),
                       html(shown, raw=tuple(shown.columns)),
                       [c.removeprefix("The Free Transformer beats the baseline ")
                        for c in claims.loc[skip, "claim"]])


def _overhead_html(data: SweepData, index: RunIndex) -> str:
    """The overhead table, after what a wall-clock comparison rests on: its n and the
    machine's load."""
    ot = overhead_table(data)
    has_pairs = not ot.empty and ot["wallclock_pairs"].fillna(0).gt(0).any()
    local = data.manifest.get("local")
    return _t().overhead(linked(ot, index, "overhead"), sorted(set(ot["wallclock_pairs"].fillna(
        0).astype(int))) if has_pairs else [], local if isinstance(local, dict) else {})


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
    c = data.cells
    seeds = sorted(set(c["seed"].dropna())) if len(c) else []
    tpl = _t()
    sections = [
        _lead_html(data, forest, tables, out_dir), tpl.card(lines, summary_png),
        tpl.summary(len(c), int((c["state"] == "done").sum()) if len(c) else 0, seeds, LEGEND,
                    ", ".join(f"{k} {v:g}" for k, v in lead.CHANCE.items())),
        tpl.signal_noise(sn.rename(columns={
            "seed_sd": "seed SD", "spread_across_arms": "spread across arms and kappas (SD of "
            "means)", "signal_to_noise": "signal / noise", "mde": "MDE (median)",
            "n_seeds": "seeds"}), lead.verdict_table(forest))]
    heads = {"tokens": "Equal tokens (the paper's protocol)", "flops": "Equal FLOPs"}
    for view in VIEWS:
        t = tables[view]
        parts = []
        for comp in [x for x in comps if x.view == view] or [None]:
            part = t[t["comparison"] == comp.key] if comp is not None and len(t) else t
            if len(part):
                parts.append((comp.title if comp else "reference missing",
                              table_html(part, index)))
        sections.append(tpl.view(view, heads[view], notes.get(view, ""), t.empty, parts,
                                 specs_used(data, t) if len(t) else []))
    free_runs = [RunDir.of(str(r), data.root).path for r in
                 c.loc[c["arm"] == FREE.name, "run_id"].dropna()]
    sections += [
        _claims_html(claims, index), _table3_html(data, out_dir, main_table),
        _likelihood_html(data, out_dir),
        latent_section(free_runs, out_dir),  # one figure per kappa, runs folded
        tpl.wrap("eval-completeness", "Evaluation completeness: truncation and missing scores",
                 completeness_html(data)),
        tpl.figures(figs, linked(leak_table(data), index, "leak check"),
                    _overhead_html(data, index)),
        tpl.wrap("synthetic", "Synthetic task (paper §4.1)", _synthetic_html(synth))]
    cells = None if c.empty else c.assign(eval_files=c.get("eval_files", "").map(
        lambda x: " ".join(x) if isinstance(x, list) else x))[[
            k for k in ["cell", "arm", "kappa_bits", "latent_bits", "seed", "run_id", "state",
                        "eval_state", "reason", "final_tokens", "final_flops", "wall_s",
                        "tokens_per_s", "eval_files"] if k in c]]
    sections.append(tpl.appendix(index.html(), len(c), cells,
                                 c["state"].fillna("unknown").value_counts() if len(c) else None,
                                 _provenance_html(data, synth)))
    return atomic_write_text(SweepDir.of(name, root).report_html, tpl.page(
        name, CHECK_JS % (json.dumps(REQUIRED_SECTIONS), json.dumps(MEASURED)), sections))


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
    ap.add_argument("--synthetic", default=None, help="results/synthetic/<name> to embed")
    ap.add_argument("--n-boot", type=int, default=2000, help="bootstrap replicates")
    ap.add_argument("--check", action="store_true",
                    help="also open it in headless Chromium and keep a screenshot")
    ap.add_argument("--screenshot", default=None, help="screenshot path for --check")
    a = ap.parse_args(argv)

    def body() -> int:
        preflight(a.name, None, a.n_boot)  # the results root: $FTBENCH_RESULTS, else results/
        path = build_report(a.name, None, a.synthetic, a.n_boot)
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
