"""`make paper RECIPE=...` / `python -m pipelines.paper`: the paper's protocol as one command.

Three stages, each through its public entry point in this process and each resumable, so a re-run
does only what is missing (docs/RECIPES.md says what each does): 1. corpus (pipelines.corpus,
built once where the trainer looks for it), 2. sweep (sweeps.api.run: every cell, its
evaluation points and final evaluation, the likelihood bound), 3. report (analysis.report, once
everything is done and only when its inputs changed; with LAUNCHER=slurm a job of its own that
runs after every training and evaluation job). --dry prints the whole plan and writes nothing.
Bad input: one line on stderr, exit 2, nothing written.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

from common import benchmarks
from common.errors import ArgParser, UsageError, cli
from common.paths import SweepDir
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

STATE = "paper-state.json"
"""Beside the sweep's manifest: the fingerprint of the inputs the report was last built from."""

EVAL_REQUESTS: dict[str, int] = {b.task: b.requests for b in benchmarks.BENCHMARKS
                                  if b.task and b.requests}
"""Requests per benchmark on its full split, as measured in docs/BENCH.md (the registry's
`requests`: each generation task's gold-answer bits-per-byte requests included). triviaqa (a
partial copy was measured) and race were not measured: their cost is reported as unknown."""


DEFAULT_GPU = "H100-80GB"
"""The GPU type whose micro-batch a multi-GPU recipe takes when GPU= is not given: the paper's
(§4.2: H100s)."""


def _now() -> str:
    return time.strftime("%H:%M:%S", time.gmtime())


def _say(i: int, n: int, text: str, t0: float) -> None:
    print(f"[paper {i}/{n} {_now()}] {text} (elapsed {(time.time() - t0) / 60:.1f} min)",
          flush=True)


# ------------------------------------------------------------------------------- the stages
def corpus_stage(rec: Any, extra: list[str]) -> dict[str, Any]:
    """Where the trainer will look for the recipe's corpus, whether it is built, and the
    `python -m pipelines.corpus` arguments that build it there."""
    from experiments.corpus.build import read_manifest as read_corpus
    from experiments.corpus.config import GENERATED_SOURCES
    from experiments.train.config import compose
    from experiments.train.data import corpus_dir
    from sweeps.recipe import merge_overrides

    cfg = compose(list(merge_overrides(rec.training_overrides(), extra)))
    d = corpus_dir(cfg.data, cfg.model.vocab_size, cfg.paths.cache)
    man = read_corpus(d) if cfg.data.source not in GENERATED_SOURCES else None
    data_ov = [o for o in merge_overrides(rec.corpus_overrides(), extra)
               if o.startswith("data.") and not o.startswith("data.corpus=")]
    argv = ["--data", cfg.data.source, "--out", str(d), "--vocab-size",
            str(cfg.model.vocab_size), *data_ov]
    return {"dir": d, "built": man is not None, "manifest": man, "argv": argv, "cfg": cfg,
            "named": bool(cfg.data.corpus), "source": cfg.data.source}


def corpus_budget_lines(rec: Any, c: dict[str, Any]) -> list[str]:
    """The recipe's corpus against its budget, per source (experiments.corpus.budget: the
    costliest cell's tokens, each source's passes from its known size); UsageError (one line)
    when the corpus cannot reach the budget, before anything is built or submitted."""
    from experiments.corpus.budget import check_budget, manifest_lines

    if c["named"]:
        return []  # a corpus the user built: the trainer checks its passes (data.max_epochs)
    chk = check_budget(c["cfg"].data, rec.budget_tokens,
                       bytes_per_token=rec.corpus.bytes_per_token)
    if chk.refusal is not None:
        raise UsageError(chk.refusal)
    built = manifest_lines(c["manifest"]) if c["manifest"] else []
    return chk.lines + (["  as built (corpus.json):", *built] if built else [])


def eval_cost_text(rec: Any, rate: tuple[float, int] | None, fwd_flops_per_token: float,
                   n_cells: int) -> list[str]:
    """An upper bound on one evaluation point: every request fills the trained window, each
    token costs one forward pass (a third of a training token's FLOPs), at the training rate."""
    window = rec.train.seq_len
    known = {t: EVAL_REQUESTS[t] for t in rec.eval.tasks if t in EVAL_REQUESTS}
    unknown = [t for t in rec.eval.tasks if t not in EVAL_REQUESTS]
    flops = sum(known.values()) * window * fwd_flops_per_token
    lines = [f"evaluation per point (each cell: {rec.eval.points} kept checkpoints and the final "
             f"one; one job on one node): {len(rec.eval.tasks)} tasks, "
             f"{sum(known.values()):,} requests on the measured ones"]
    if rate:
        gh = flops / rate[0] / 3600
        lines.append(f"  at most {flops:.3g} FLOPs = {gh:.3g} GPU-hours per point and cell (upper "
                     f"bound: every request fills the {window}-token window; real contexts are "
                     "shorter), at the training rate")
        lines.append(f"  all {rec.eval.points + 1} evaluations of all {n_cells} cells: at most "
                     f"{gh * (rec.eval.points + 1) * n_cells:.4g} GPU-hours")
    else:
        lines.append(f"  at most {flops:.3g} FLOPs per point and cell (every request fills the "
                     f"{window}-token window)")
    if unknown:
        lines.append(f"  not counted (request counts not measured, docs/BENCH.md): "
                     f"{', '.join(unknown)}")
    return lines


def disk_text(rec: Any, cfg: Any, n_cells: int, corpus: int, *, gpus: bool) -> str:
    """The sweep's disk under the results root: per cell the rotated step checkpoints and the
    one being written (weights and AdamW), and the weights-only exports of the recipe's
    evaluation points (the last is final.pt's hard link); the corpus once, every cell reads the
    same one (counted per cell, and the exports as full checkpoints, the 8B sweep asked for
    12.8 TB where about 3.6 TB is needed)."""
    from sweeps import backend

    ck = backend.checkpoint_sizes(cfg, gpus)
    keep = cfg.logging.keep_checkpoints + 1
    points = max(1, rec.eval.points)
    cell = keep * ck["full"] + points * ck["export"]
    return (f"disk under the results root: at most {cell / 1e9:.4g} GB per cell ({keep} step "
            f"checkpoints of {ck['full'] / 1e9:.4g} GB: rotated and in flight; {points} "
            f"weights-only exports of {ck['export'] / 1e9:.4g} GB: the evaluation points, the "
            f"last of them the final weights) x {n_cells} cells = {cell * n_cells / 1e9:.4g} "
            "GB, plus the corpus once "
            + (f"(at least {corpus / 1e9:.4g} GB) = {(cell * n_cells + corpus) / 1e9:.4g} GB"
               if corpus else "(built)"))


def dry_text(rec: Any, req: api.SweepRequest, fitted: tuple[list[str], int | None] = ([], None)
             ) -> str:
    """The whole plan (`fitted`: `fit_to_cluster`'s line and world); the sweep's own dry run is
    printed after it by the caller."""
    from experiments.train.plan import disk_bytes
    from experiments.train.plan import plan as run_plan
    from sweeps import backend
    from sweeps.grid import expand

    lines = [f"paper recipe {rec.name} ({rec.path}): {' '.join(rec.description.split())}",
             f"GPU type: {req.gpu or 'none (one process)'}"
             + (" (the default; GPU= changes it)" if req.gpu == DEFAULT_GPU else ""), "",
             "filled in by the recipe (the paper does not state these; docs/RECIPES.md):"]
    for key, v, basis, source in rec.filled():
        lines.append(f"  {key} = {v}  [{basis}] {source}")
    c = corpus_stage(rec, list(req.overrides))
    cfg = c["cfg"]  # the recipe's training config, composed once
    rate = backend.gpu_rate(cfg)
    fwd = backend.flops_per_token(cfg) / 3
    n_cells = len(expand(rec.sweep_spec(seeds=req.seeds)))
    disk = disk_bytes(cfg, run_plan(cfg, 1))  # the same bytes for any world
    lines += ["", f"corpus ({c['source']}): {c['dir']}  "
              + ("built" if c["built"] else "to build, once, by stage 1 (`python -m "
                 "pipelines.corpus`)")]
    lines += corpus_budget_lines(rec, c)
    if not c["built"]:
        lines.append(f"  its token shards: at least {disk['corpus'] / 1e9:.4g} GB (the trainer's "
                     "estimate: the training tokens at the token width, over data.max_epochs)")
    lines.append(disk_text(rec, cfg, n_cells, 0 if c["built"] else disk["corpus"],
                           gpus=bool(req.gpu)))
    lines += ["", *fitted[0], *memory_text(rec, req, fitted[1])]
    lines += ["", *eval_cost_text(rec, rate[:2] if rate else None, fwd, n_cells)]
    pts = rec.table3_points()
    last = Fraction(rec.eval.average_last).limit_denominator(1000)
    lines += [f"  Table 3 averages points {list(pts)} of 1..{rec.eval.points} (the last "
              f"{last} of training)", "",
              f"sweep {req.name} (python -m sweeps run --recipe {rec.name} --dry 1):"]
    return "\n".join(lines)


def memory_text(rec: Any, req: api.SweepRequest, world: int | None = None) -> list[str]:
    """The dry run's measured per-GPU peak of every phase (experiments/memory.py, on fake
    tensors, cached under paths.cache/memory) for the costliest cell (the Free Transformer at
    the grid's largest H) at its micro-batch for the GPU type, on `world` GPUs (default: the
    recipe's planning world); nothing without a GPU type."""
    if not req.gpu:
        return []
    from experiments.memory import dry_text as measured

    cfg = rec.cell_config(req.gpu, req.overrides, gpus=world)
    return measured(cfg, cache=Path(cfg.paths.cache), label=f"on {req.gpu}").splitlines()


FIT_KEYS = ("train.micro_batch_size=", "train.activation_checkpointing=")


def fit_to_cluster(rec: Any, req: api.SweepRequest
                   ) -> tuple[api.SweepRequest, list[str], int | None]:
    """The micro-batch and activation checkpointing of the sweep's costliest cell for the world
    the cluster file gives (nodes x GPUs per node), chosen by its measured peaks at that world
    (experiments.memory.fit, the HSDP mesh across nodes included): the recipe's own (chosen for
    its train.gpus) when it splits the per-GPU batch and fits, else the choice that does, added
    to the request's overrides (neither is in the run-id). (request, its line, the world);
    UsageError (one line) when nothing fits. Unchanged without a cluster file or a GPU type, or
    when OVERRIDES set either key (the pre-submission checks measure that choice)."""
    if not req.gpu or not (req.launcher == "slurm" or req.cluster.strip()) or any(
            o.startswith(FIT_KEYS) for o in req.overrides):
        return req, [], None
    from sweeps import checks
    from sweeps.cluster import load_cluster

    world = load_cluster(Path(req.cluster) if req.cluster.strip() else None).tasks
    rec.training_overrides(gpu=req.gpu)  # refuses (one line) a GPU type with no measured record
    own = rec.micro_batches()[req.gpu].micro_batch_size  # for the recipe's train.gpus
    per = rec.train.batch_size // world  # a world that does not split it: api refuses below
    start = max((m for m in range(1, min(own, per) + 1) if per % m == 0), default=1)
    req = dataclasses.replace(req, overrides=(*req.overrides, f"{FIT_KEYS[0]}{start}"))
    f = checks.backend.memory_fit(checks.largest_config(api.plan(req)))  # that world's cells
    head = f"memory on the cluster file's {world} GPU(s), {f.line()}"
    if f.micro_batch_size is None:
        raise UsageError(f"{head}; more nodes in the cluster file, or a larger GPU type (GPU=)")
    if (f.micro_batch_size, f.activation_checkpointing) == f.tries[0][:2] and start == own:
        return req, [head + " (the recipe's)"], world
    kept = tuple(o for o in req.overrides if not o.startswith(FIT_KEYS))  # hydra: a key once
    return (dataclasses.replace(req, overrides=(*kept, *f.overrides())),
            [head + f" (chosen here: the recipe's is for {rec.train.gpus} GPUs)"], world)


def _unfinished(cs: list[Any]) -> list[Any]:
    """The manifest cells not yet trained and evaluated (what the report waits for)."""
    return [c for c in cs if c.state != "done" or c.eval is None or c.eval.state != "done"]


def report_stage(name: str) -> tuple[str, int]:
    """('waiting', n) while n cells or evaluations are not done; ('reused'|'built', 0) after;
    RuntimeError when the sweep has no manifest or the report fails."""
    cs = cells(name)
    if not cs:
        raise RuntimeError(f"sweep {name} wrote no manifest (see its lines above)")
    left = len(_unfinished(cs))
    if left:
        return "waiting", left
    state = load_state(name, STATE)
    fp = inputs_fingerprint(name)
    html = SweepDir.of(name).report_html
    if state.get("report_inputs") == fp and html.is_file():
        return "reused", 0
    if not report(name):
        raise RuntimeError("the report failed (see above)")
    state["report_inputs"] = fp
    save_state(name, STATE, state)
    return "built", 0


class ReportJob:
    """The report stage as a job of its own (SLURM): the sweep's manifest refreshed from facts
    (nobody else may have looked since the jobs ended), then `report_stage`. Fails, with the
    count in its one line, when cells or evaluations are still not done (one of them failed):
    the next `make paper` submits it again once they are."""

    def __init__(self, name: str, env: dict[str, str]) -> None:
        self.name, self.env = name, dict(env)

    def __call__(self) -> dict[str, Any]:
        import os

        os.environ.update(self.env)  # the results root the submitting command wrote to
        api.status(self.name)
        how, left = report_stage(self.name)
        if how == "waiting":
            raise RuntimeError(f"{left} cell(s) of sweep {self.name} not trained and evaluated "
                               "when the report ran (see make sweep-status)")
        return {"state": "done", "report": how}


def report_submit(name: str, a: argparse.Namespace) -> tuple[str, str | None]:
    """Stage 3 on SLURM: the report as a job through the one launcher, in the cluster file's
    report role, after every training and evaluation job still queued or running has ended
    (afterany: a failed one must not leave the report pending forever). Returns (what
    happened, job id): 'reused' (up to date: nothing submitted), 'queued' (a report job
    submitted before is still pending or running), 'submitted', or 'failed' (cells or
    evaluations failed and nothing is left running: nothing to wait for)."""
    import os

    from sweeps.launcher import make_launcher

    cs = cells(name)
    state = load_state(name, STATE)
    html = SweepDir.of(name).report_html
    done = bool(cs) and not _unfinished(cs)
    if done and state.get("report_inputs") == inputs_fingerprint(name) and html.is_file():
        return "reused", None
    launcher = make_launcher("slurm", SweepDir.of(name).jobs_dir, cluster_file=a.cluster or None,
                             job_name=f"paper-{name}-report")
    old = state.get("report_job")
    if old and launcher.alive(old):
        return "queued", str(old)
    waits = [j for c in cs for j in (c.job_id if c.state == "running" else None,
                                     c.eval.job_id if c.eval is not None
                                     and c.eval.state == "running" else None) if j]
    if not done and not waits:
        return "failed", None
    env = {k: os.environ[k] for k in ("FTBENCH_RESULTS", "FTBENCH_CACHE", "PYTHONPATH")
           if k in os.environ}
    job = launcher.submit(ReportJob(name, env), role="report", name=f"paper-{name}-report",
                          after_any=sorted(set(waits)))
    state["report_job"] = str(job.job_id)
    save_state(name, STATE, state)
    return "submitted", str(job.job_id)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = ArgParser(prog="python -m pipelines.paper", description=__doc__,
                   formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="", help="a recipe name (sweeps/recipes) or file")
    ap.add_argument("--name", default="", help="sweep name (default: the recipe's name)")
    ap.add_argument("--launcher", default="local", help="local | slurm")
    ap.add_argument("--cluster", default="", help="cluster file (LAUNCHER=slurm)")
    ap.add_argument("--jobs", default="", help="local parallel jobs")
    ap.add_argument("--seeds", default="", help="replace the recipe's seeds, e.g. '0 1'")
    ap.add_argument("--gpu", default="", help="GPU type for the micro-batch (GPU_TYPES)")
    ap.add_argument("--gpus", default="", help="plan for this many GPUs (train.plan_world_size)")
    ap.add_argument("--bench-data", default="", help="offline benchmark dir (else online)")
    ap.add_argument("--eval-args", default="", help="more arguments for experiments.eval")
    ap.add_argument("--likelihood-rows", default="", help="validation rows for the bound")
    ap.add_argument("--workers", default="", help="corpus build workers")
    ap.add_argument("--overrides", default="", help="hydra overrides of every cell")
    ap.add_argument("--retry-failed", action="store_true", help="rerun failed cells")
    ap.add_argument("--dry", action="store_true", help="print the plan; write nothing")
    return ap.parse_args(argv)


def check(a: argparse.Namespace) -> tuple[Any, api.SweepRequest]:
    """The recipe, and its sweep as sweeps' front door takes it (every kept checkpoint and the
    final one evaluated: what `make sweep RECIPE=... EVAL=1` asks); UsageError (one line) on
    bad input, the request's own checks included (LAUNCHER, SEEDS, OVERRIDES, EVAL_ARGS)."""
    from sweeps.grid import parse_count
    from sweeps.recipe import known

    if not a.recipe.strip():
        raise UsageError(f"RECIPE is required; known recipes: {', '.join(known())} (or a file)")
    rec = api.load_recipe(a.recipe)
    name = a.name.strip() or rec.name
    gpus, jobs = parse_count("GPUS", a.gpus, 1), parse_count("JOBS", a.jobs, 1)
    rows = parse_count("LIKELIHOOD_ROWS", a.likelihood_rows, 0)
    parse_count("WORKERS", a.workers, 1)  # passed on as text to pipelines.corpus
    if a.bench_data and not Path(a.bench_data).is_dir():
        raise UsageError(f"BENCH_DATA={a.bench_data}: not a directory (docs/BENCHMARKS.md)")
    gpu = a.gpu.strip() or (DEFAULT_GPU if rec.train.gpus > 1 else "")  # the paper's GPUs
    bench = f"--data {shlex.quote(str(a.bench_data))} " if a.bench_data else ""
    world = f" train.plan_world_size={gpus}" if gpus else ""
    return rec, api.SweepRequest(
        recipe=a.recipe.strip(), name=name, evaluate=True, launcher=a.launcher,
        seeds=a.seeds if a.seeds.strip() else None, gpu=gpu, cluster=a.cluster,
        jobs=jobs, likelihood_rows=api.DEFAULT_LIKELIHOOD_ROWS if rows is None else rows,
        eval_args=(bench + a.eval_args).strip(), overrides=a.overrides + world,
        retry_failed=bool(a.retry_failed))


def corpus_build(c: dict[str, Any], a: argparse.Namespace) -> int:
    """Stage 1: the recipe's corpus through pipelines.corpus (its units through the sweep's
    launcher kind and cluster file); its exit status."""
    from pipelines.corpus import main as corpus_main

    argv = [*c["argv"], *(["--workers", a.workers] if a.workers else []),
            "--launcher", a.launcher, *(["--cluster", a.cluster] if a.cluster else [])]
    return corpus_main(argv)


def main(argv: list[str] | None = None) -> int:
    return cli("paper", lambda: _main(parse(argv)))


def _main(a: argparse.Namespace) -> int:
    try:
        rec, req = check(a)
        req, *fitted = fit_to_cluster(rec, req)  # the cluster's world, measured
        head = dry_text(rec, req, tuple(fitted)) if a.dry else ""
        if not a.dry:  # the corpus against the budget, before anything is built or submitted
            corpus_budget_lines(rec, corpus_stage(rec, list(req.overrides)))
            for ln in fitted[0]:
                print(f"paper: {ln}", flush=True)
    except UsageError:
        raise
    except ValueError as e:  # a UsageError composing the recipe: bad input too
        raise UsageError(one_line(e)) from None
    # each stage runs here; the jobs it submits inherit what they did as processes of their own
    with environment(OFFLINE_ENV if a.bench_data else {}):
        if a.dry:  # the sweep's plan first: a refusal (a world the batch does not split) is
            # one line with nothing printed before it
            tail = api.dry_run(req)
            print(head, tail, sep="\n", flush=True)
            return 0
        return run_paper(a, rec, req)


def run_paper(a: argparse.Namespace, rec: Any, req: api.SweepRequest) -> int:
    """The three stages (module docstring)."""
    t0, n, name = time.time(), 3, req.name
    refuse_dirty("paper", name=name, exit_code=2)  # FTBENCH_ALLOW_DIRTY=1: train, cells marked
    c = corpus_stage(rec, list(req.overrides))
    if c["built"] or c["named"]:
        _say(1, n, f"corpus {c['dir']}: {'built' if c['built'] else 'named by data.corpus'}; "
             "nothing to do", t0)
    else:
        _say(1, n, f"corpus: building {c['dir']} (resumable)", t0)
        rc = corpus_build(c, a)
        if rc != 0:
            print(f"paper: error: the corpus build failed (exit {rc}); re-run to resume",
                  file=sys.stderr)
            return rc
        from experiments.corpus.build import read_manifest as read_corpus

        if read_corpus(c["dir"]) is None:
            print(f"paper: error: the corpus build ended but {c['dir']} has no manifest",
                  file=sys.stderr)
            return 1
    _say(2, n, f"sweep {name}: {len(req.seeds or rec.grid.seeds)} seed(s) of the recipe's "
         f"grid, each cell evaluated at {rec.eval.points} points and its end", t0)
    rc = sweep(req)
    if rc in (2, 130):
        return rc  # refused before anything ran (its line is above), or interrupted
    _say(3, n, "report", t0)
    if req.launcher == "slurm":
        return _report_slurm(name, a, rc)
    try:
        how, left = report_stage(name)
    except RuntimeError as e:
        print(f"paper: error: {e}", file=sys.stderr)
        return 1
    if how == "waiting":
        print(f"paper: {left} cell(s) not yet trained and evaluated; see the sweep's summary "
              "above", flush=True)
        return 1
    html = SweepDir.of(name).report_html
    print(f"[paper done {_now()}] report {'up to date' if how == 'reused' else 'built'}: "
          f"{html.resolve()}", flush=True)
    return 0 if rc == 0 else 1


def _report_slurm(name: str, a: argparse.Namespace, rc: int) -> int:
    """Stage 3 on SLURM (`report_submit`), said in one line; the exit status."""
    how, job = report_submit(name, a)  # a UsageError (a bad cluster file): cli's one line
    html = SweepDir.of(name).report_html.resolve()
    if how == "reused":
        print(f"[paper done {_now()}] report up to date: {html}", flush=True)
    elif how == "failed":
        left = len(_unfinished(cells(name)))
        print(f"paper: {left} cell(s) or evaluation(s) failed and nothing is running; see "
              f"make sweep-status NAME={name} (RETRY_FAILED=1 retries them)", flush=True)
        return 1
    else:
        print(f"paper: report job {job} {'submitted' if how == 'submitted' else 'still queued'}"
              f": it writes {html} once every training and evaluation job has ended (SLURM jobs "
              "run on; re-run this command to see where they are)", flush=True)
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
