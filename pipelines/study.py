"""`make study` / `python -m pipelines.study [run|render|docs]`: the suite's first finding, one
command, offline (docs/STUDY.md; sizes: SIZES below). Each stage runs in this process through
its public entry point and is resumable on its own, so a re-run does only what is missing:
the sweep (`sweeps.api.run`, each run evaluated when it finishes), the latent probe of every
finished latent run, the report (rebuilt only when its inputs changed), then the report's
tables copied to docs/study/ with study.json and docs/STUDY.md rendered from them. It refuses
to train from uncommitted changes to tracked source unless --allow-dirty.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from common.arms import BASELINE, FREE
from common.arms import find as find_arm
from common.errors import ArgParser, UsageError, cli, positive_int
from common.io import atomic_write_text
from common.paths import RunDir, SweepDir
from common.text import one_line
from pipelines.shared import (
    OFFLINE_ENV,
    cells,
    environment,
    inputs_fingerprint,
    load_state,
    refuse_dirty,
    report,
    save_state,
    sweep,
)
from sweeps import api

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "study"
SMOKE_DATA = ROOT / "experiments" / "eval" / "smoke_data"
STATE = "study-state.json"
SYNTHETIC_VERDICTS = ROOT / "measured" / "synthetic" / "cpu" / "verdicts.csv"
"""The committed synthetic experiment's per-seed verdicts (the CPU default, v2 rules)."""
CORES = 2
"""The machine the sizes are planned for (docs/STUDY.md)."""
TABLES = ("table_tokens.csv", "table_flops.csv", "likelihood.csv", "table3.csv", "probe.csv",
          "claims.csv", "per_seed.csv", "lead.csv", "signal_noise.csv", "summary.png")
"""What the report writes under report/ that docs/study/ keeps (the HTML is kept too)."""


@dataclass(frozen=True)
class Size:
    """One study size: every knob of the sweep, the evaluation and the probe."""

    preset: str
    h: int
    kappa: str
    seeds: str
    tokens: str
    controls: str
    overrides: str
    tasks: str
    limit: int
    gen_toks: int
    eval_points: int
    likelihood_rows: int
    probe_args: str
    mde_target_nats: float
    budget_min: float
    """Planned wall minutes on 2 CPU cores (docs/STUDY.md splits it across cells)."""
    bench: str = ""
    """Offline benchmark dir when BENCH_DATA is not given: '' = none (BENCH_DATA required)."""


SIZES: dict[str, Size] = {
    # CI: 8 cells of 8 steps (one kappa; the two controls with a latent or a planned budget
    # of their own), two seeds so the seed-level intervals exist; the benchmark sample the
    # repository ships (no MBPP+ there), two documents each.
    "tiny": Size(
        preset="1M", h=4, kappa="1", seeds="0 1", tokens="4096", controls="flops zcut",
        overrides="data.max_bytes=2000000 data.val_tokens=4096 logging.val_every=0 "
                  "train.seq_len=64 train.batch_size=8 optim.warmup_steps=1",
        tasks="gsm8k,humaneval_plus", limit=2, gen_toks=8, eval_points=2, likelihood_rows=2,
        probe_args="--rows 2 --draws 1 --prompts 2 --prompt-len 8 --gen-tokens 4 "
                   "--group-size 2 --groups 2 --n-boot 100",
        mde_target_nats=0.03, budget_min=6.0, bench=str(SMOKE_DATA)),
    # The finding: 6 arms x 7 seeds = 42 runs of the 1M preset on 2 CPU cores, ~90 min
    # (docs/STUDY.md gives the measured step time and the pilot SD this rests on). It was first
    # run with 5 seeds; the report's MDE on the honest validation likelihood was 0.034 nats/token
    # for kappa 1 (target 0.03), so two seeds were added: the sweep reuses the 30 finished runs.
    "full": Size(
        preset="1M", h=8, kappa="0.5 1 2", seeds="0 1 2 3 4 5 6", tokens="1M",
        controls="flops plus1 zcut",
        overrides="data.max_bytes=8000000 data.val_tokens=16384 logging.val_every=49",
        tasks="gsm8k,humaneval_plus,mbpp_plus", limit=16, gen_toks=48, eval_points=2,
        likelihood_rows=64,  # every validation row (16384 tokens / 256): issue 44; it was 8
        probe_args="--rows 8 --draws 2 --prompts 4 --gen-tokens 8 --groups 2 --n-boot 1000",
        mde_target_nats=0.03, budget_min=90.0),
}


def _now() -> str:
    return time.strftime("%H:%M:%S", time.gmtime())


def stage(t0: float, size: Size, i: int, n: int, text: str) -> None:
    """`[study i/n HH:MM:SS] ...` with the elapsed time against the planned total (the sweep's
    own lines give the measured ETA: SweepEta)."""
    print(f"[study {i}/{n} {_now()}] {text} (elapsed {(time.time() - t0) / 60:.1f} min of "
          f"{size.budget_min:.0f} planned on 2 cores)", flush=True)


def find_bench(given: str | None, size: Size) -> Path:
    """BENCH_DATA, else $FTBENCH_DATA, else the size's default (the repository's sample, for
    tiny); UsageError when none is a directory. Nothing outside the repository is guessed."""
    tried = [given, os.environ.get("FTBENCH_DATA"), size.bench or None]
    for t in tried:
        if t:
            if Path(t).is_dir():
                return Path(t).resolve()
            if t == given:
                raise UsageError(f"BENCH_DATA={t}: not a directory; give a directory laid out "
                                 "as in docs/BENCHMARKS.md")
    raise UsageError("offline benchmark files not found; give BENCH_DATA=<dir laid out as in "
                     "docs/BENCHMARKS.md> (or set FTBENCH_DATA)")


def sweep_request(size: Size, name: str, bench: Path, jobs: int | None) -> api.SweepRequest:
    """The sweep of this size, for sweeps' front door."""
    eval_args = (f"--tasks {size.tasks} --limit {size.limit} --max-gen-toks {size.gen_toks} "
                 f"--threads 1 --data {bench}")
    return api.SweepRequest(kappa=size.kappa, h=str(size.h), seeds=size.seeds, preset=size.preset,
                            data="stdlib", tokens=size.tokens, controls=size.controls,
                            overrides=size.overrides, name=name, evaluate=True,
                            eval_args=eval_args, eval_points=size.eval_points,
                            likelihood_rows=size.likelihood_rows, jobs=jobs)


class SweepEta:
    """After each job the sweep reports ended, one line with an ETA: the mean wall time of the
    jobs ended so far times the jobs left (each cell to train = a training and its chained
    evaluation; a trained cell whose evaluation is not done = one job). Fed the sweep's typed
    events (sweeps.driver)."""

    def __init__(self) -> None:
        self.t0, self.total, self.finished = time.time(), 0, 0

    def __call__(self, ev: api.Event) -> None:
        if isinstance(ev, api.Planned):
            self.total = 2 * ev.to_run + ev.evals_to_run
        elif isinstance(ev, api.JobEnded):
            self.finished += 1
            self.total = max(self.total, self.finished)
            eta = (time.time() - self.t0) / self.finished * (self.total - self.finished) / 60
            print(f"[study {_now()}] sweep: {self.finished}/{self.total} jobs finished; ETA of "
                  f"the sweep ~{eta:.0f} min", flush=True)


def probe_targets(run: RunDir) -> list[Path]:
    """What a latent run's probes measure: its final checkpoint, then every evaluation
    checkpoint before the final step (the latent's use over training). An evaluation point at
    the final step holds the final weights and would write the same file name: left out."""
    final = run.final_checkpoint
    last = max((s for s, _ in run.eval_checkpoints()), default=None)
    out = [final]
    for step, path in run.eval_checkpoints():
        if step != last or not final.is_file():
            out.append(path)
    return out


def probe_all(name: str, size: Size, state: dict) -> tuple[int, int, list[str]]:
    """Probe every finished run with a latent (the Free Transformers and the Z-cut control,
    whose probe is the null of latent use: its decoder cannot read Z) at its final and
    evaluation checkpoints: (ran, reused, failures). probe_run itself reuses a file of the same
    spec and checkpoint without loading the model, so a changed probe spec (a new field) probes
    again and an unchanged one costs a file read."""
    import torch

    from experiments.eval.probe import DEFAULTS, probe_run

    done = state.setdefault("probes", {})
    ran = skipped = 0
    failed: list[str] = []
    toks = size.probe_args.split()  # '--prompt-len 8' is prompt_len=8, typed as its default
    opts = {(k := f.removeprefix("--").replace("-", "_")): type(DEFAULTS[k])(v)
            for f, v in zip(toks[::2], toks[1::2], strict=True)}
    for c in cells(name):
        a = find_arm(c.arm)
        if a is None or not a.latent or c.state != "done":
            continue
        rid = str(c.run_id)
        for ck in probe_targets(RunDir.of(rid)):
            before = torch.get_num_threads()  # as many as the probe had as its own process
            torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 1))
            try:
                path, reused = probe_run(ck, opts)
            except Exception as e:  # a crash of one probe fails it, not the study
                what = "probe: error" if isinstance(e, ValueError) else type(e).__name__
                failed.append(f"{c.cell} ({ck.name}): {what}: {one_line(e)}")
                continue
            finally:
                torch.set_num_threads(before)
            files = done.setdefault(rid, {"files": []})
            files["args"] = size.probe_args
            if str(path) not in files["files"]:
                files["files"].append(str(path))
            if reused:
                skipped += 1
            else:
                ran += 1
                save_state(name, STATE, state)
    return ran, skipped, failed


def study_meta(name: str, size_name: str, size: Size, bench: Path) -> dict:
    """The settings docs/STUDY.md states, with the cells' planned tokens and FLOPs."""
    cs = cells(name)
    return {"name": name, "size": size_name, **{k: v for k, v in asdict(size).items()
                                                   if k != "bench"},
            "bench_data": bench.name, "n_cells": len(cs), "cores": CORES,
            "n_cells_planned": (1 + len(size.kappa.split()) + len(size.controls.split()))
            * len(size.seeds.split()),
            "n_done": sum(c.state == "done" for c in cs), "setup": study_setup(name),
            "n_eval_done": sum(c.eval is not None and c.eval.state == "done" for c in cs)}


def export(name: str, meta: dict, docs: Path) -> None:
    """Copy the report's tables and HTML into docs/study/ and write study.json beside them."""
    sd = SweepDir.of(name)
    docs.mkdir(parents=True, exist_ok=True)
    for t in TABLES:
        src = sd.report_dir / t
        if src.is_file():
            shutil.copyfile(src, docs / t)
    if sd.report_html.is_file():
        shutil.copyfile(sd.report_html, docs / "report.html")
    if (docs / "claims.csv").is_file() and SYNTHETIC_VERDICTS.is_file():
        # the study's sweep has no synthetic results of its own: its synthetic claims are
        # judged from the committed synthetic experiment's per-seed verdicts (docs/SYNTHETIC.md)
        from analysis.claims import rejudge_synthetic

        rejudge_synthetic(docs / "claims.csv", SYNTHETIC_VERDICTS)
    if docs.resolve() != DOCS.resolve():  # the measured inputs the renderer also reads
        for f in ("sizing.csv", "bryanvine.csv"):
            if (DOCS / f).is_file():
                shutil.copyfile(DOCS / f, docs / f)
    latent_docs(name, docs)
    rows = [{k: getattr(c, k) for k in ("cell", "arm", "kappa_bits", "latent_bits", "seed",
                                         "run_id", "state")} for c in cells(name)]
    atomic_write_text(docs / "cells.json", json.dumps(rows, indent=1) + "\n")
    atomic_write_text(docs / "study.json", json.dumps(meta, indent=1, sort_keys=True) + "\n")


def latent_docs(name: str, docs: Path) -> None:
    """latent.csv (the decoder-side latent use of every probed checkpoint of every latent run:
    the Free Transformers and the Z-cut control) and latent_over_training.png, from the probe
    files through analysis.probe's entry points."""
    from analysis.probe import latent_over_training_png, latent_table

    lat = [c for c in cells(name) if (a := find_arm(c.arm)) is not None and a.latent
           and c.run_id]
    t = latent_table([RunDir.of(str(c.run_id)).path for c in lat],
                     {str(c.run_id): c.arm for c in lat})
    t.insert(list(t.columns).index("step"), "seed",
             [next((c.seed for c in lat if str(c.run_id) == str(r)), None) for r in t["run_id"]])
    atomic_write_text(docs / "latent.csv", t.to_csv(index=False))
    png = latent_over_training_png(t)
    if png is not None:
        (docs / "latent_over_training.png").write_bytes(png)


def study_setup(name: str) -> dict[str, Any]:
    """What STUDY.md's setup states about the data, the tokenizer and the model size, read from
    the runs' own config.yaml (the first finished baseline and Free Transformer)."""
    out: dict[str, Any] = {}
    for c in cells(name):
        a = find_arm(c.arm)
        if c.state != "done" or a is None or a.name not in (BASELINE.name, FREE.name):
            continue
        key = "ft" if a.latent else "baseline"
        if key in out:
            continue
        try:
            rec = RunDir.of(str(c.run_id)).record()
        except Exception:  # an unreadable record leaves the fact unstated, never invented
            continue
        model, acc = dict(rec.model), dict(rec.accounting)
        prov, data = dict(rec.provenance), dict(rec.data)
        params = dict(acc.get("params") or {})
        out[key] = {"params_total": params.get("total"), "params_embedding":
                    params.get("embedding"), "params_latent": params.get("latent")}
        if key == "baseline":
            out["model"] = {k: model.get(k) for k in ("preset", "vocab_size", "dim", "n_layers",
                                                      "n_heads", "n_kv_heads", "ffn_dim",
                                                      "max_seq_len", "tie_embeddings")}
            out["data"] = {"source": data.get("source"), "max_bytes": data.get("max_bytes"),
                           "val_fraction": data.get("val_fraction"),
                           "val_tokens": data.get("val_tokens"),
                           "python": (prov.get("versions") or {}).get("python"),
                           "checksums": sorted((prov.get("data_checksums") or {}).values()),
                           "tokenizer_sha256": prov.get("tokenizer_sha256")}
    return out


def render(docs: Path) -> int:
    """docs/STUDY.md (beside `docs`) from the tables in `docs` (analysis.study.render)."""
    from analysis.study import render as study_md

    out = docs.parent / "STUDY.md"
    try:
        atomic_write_text(out, study_md(docs))
    except OSError as e:
        raise UsageError(f"{e.filename or out}: {e.strerror}") from None
    print(f"study: {out.resolve()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = ArgParser(prog="python -m pipelines.study", description=__doc__,
                   formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", nargs="?", default="run", choices=("run", "render", "docs"),
                    help="run (default): the whole study; render: docs/STUDY.md from docs/study/;"
                         " docs: export what the sweep has so far (nothing run) and render")
    ap.add_argument("--size", default="full", help=f"one of {', '.join(SIZES)} (default full)")
    ap.add_argument("--name", default="", help="sweep name (default: study, or study-tiny)")
    ap.add_argument("--bench-data", default="", help="offline benchmark dir (docs/BENCHMARKS.md)")
    ap.add_argument("--docs", default="",
                    help="where the tables go, STUDY.md beside that directory (default: "
                         "docs/study for full, results/sweeps/<name>/docs/study otherwise; "
                         "'-' = do not export)")
    ap.add_argument("--jobs", type=positive_int, default=None,
                    help="parallel training jobs (default: sweeps' own)")
    ap.add_argument("--dry", action="store_true", help="print the sweep's plan only")
    ap.add_argument("--allow-dirty", action="store_true",
                    help="train even from uncommitted changes to tracked source (the cells are "
                         "marked: sweep's dirty.json, each run's git_dirty)")
    return cli("study", lambda: _main(ap.parse_args(argv)))


def _main(a: argparse.Namespace) -> int:
    if a.cmd == "render":
        return render(Path(a.docs) if a.docs and a.docs != "-" else DOCS)
    if a.size not in SIZES:
        raise UsageError(f"STUDY_SIZE={a.size!r}: not one of {', '.join(SIZES)}")
    size = SIZES[a.size]
    name = a.name.strip() or ("study" if a.size == "full" else f"study-{a.size}")
    if not name.replace("-", "").replace("_", "").isalnum():
        raise UsageError(f"STUDY_NAME={name!r}: use letters, digits, '-' and '_'")
    bench = find_bench(a.bench_data.strip() or None, size)
    # --docs, else docs/study for the full study, else beside the sweep (a tiny run never
    # overwrites the committed tables); '-': no export
    docs = (None if a.docs == "-" else Path(a.docs) if a.docs else
            DOCS if a.size == "full" else SweepDir.of(name).path / "docs" / "study")
    if a.cmd == "docs":
        if docs is None:
            raise UsageError("--docs=-: nothing to export")
        export(name, study_meta(name, a.size, size, bench), docs)
        return render(docs)
    with environment(OFFLINE_ENV):  # what its jobs inherit, as when each stage was a process
        return run_study(a, size, name, bench, docs, a.jobs)


def run_study(a: argparse.Namespace, size: Size, name: str, bench: Path, docs: Path | None,
              jobs: int | None) -> int:
    """The four stages (module docstring), each in this process."""
    req = sweep_request(size, name, bench, jobs)
    if a.dry:
        return sweep(req, dry=True)
    todo = [c.run_id for c in api.plan(req).cells if not RunDir(c.run_dir).finished]
    if todo:  # nothing trains from a dirty tree unless asked; reusing finished runs is fine
        refuse_dirty("study", bool(getattr(a, "allow_dirty", False)), name, todo)
    t0 = time.time()
    n = 4
    stage(t0, size, 1, n, f"sweep {name}: baseline + FT kappa {{{size.kappa}}} H={size.h} + "
          f"controls {{{size.controls}}}, seeds {{{size.seeds}}}, preset {size.preset}, "
          f"{size.tokens} tokens/run, each evaluated on {size.tasks} (first {size.limit} "
          f"docs) with the likelihood on {size.likelihood_rows} rows")
    rc = sweep(req, on_event=SweepEta())
    if rc in (2, 130):  # bad input, refused before anything ran; or interrupted (Ctrl-C)
        return rc
    state = load_state(name, STATE)
    stage(t0, size, 2, n, "latent probe of every finished Free Transformer")
    ran, skipped, failed = probe_all(name, size, state)
    print(f"study: probes run {ran}, reused {skipped}, failed {len(failed)}"
          + "".join(f"\n  {f}" for f in failed), flush=True)
    stage(t0, size, 3, n, "report")
    fp = inputs_fingerprint(name)
    html = SweepDir.of(name).report_html
    if state.get("report_inputs") == fp and html.is_file():
        print("study: report up to date (inputs unchanged)", flush=True)
    else:
        if not report(name, n_boot=2000):
            print("study: error: the report failed (see above)", file=sys.stderr)
            return 1
        state["report_inputs"] = fp
        save_state(name, STATE, state)
    if docs is not None:
        stage(t0, size, 4, n, f"tables to {docs}, then {docs.parent / 'STUDY.md'}")
        export(name, study_meta(name, a.size, size, bench), docs)
        render(docs)
    print(f"[study done {_now()}] report: {html.resolve()}", flush=True)
    return 1 if rc != 0 or failed else 0


if __name__ == "__main__":
    sys.exit(main())
