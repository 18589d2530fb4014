"""Plan a sweep, write its manifest, and run its cells through submitit (local or SLURM).

    plan(spec, name)          compose every cell with train.py's config, run the shared-settings
                              guard, compute per-cell tokens/FLOPs (nothing is submitted)
    run(plan, ...)            submit what is missing: local = a driver that keeps at most JOBS
                              jobs alive (the local executor would start all at once), each with
                              cores/JOBS threads, longest cells first; slurm = one job array
                              with parameters from sweeps/cluster.yaml, returns at once
    refresh(manifest)         re-derive every cell's state from facts (see manifest.py)

Re-running the same command skips done cells (their run directory holds final.pt), resumes
interrupted ones (the trainer restarts from its newest checkpoint) and retries failed ones only
with retry_failed. Cells are named by content (run-id = hash of the resolved config), so two
sweeps that share a cell share its run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import paths
from common.paths import results_root
from common.provenance import git_state

from . import backend, manifest
from .cluster import ClusterConfig, load_cluster
from .grid import Cell, SweepError, SweepSpec, expand, fmt_num, shared_settings, skipped_controls
from .job import CellJob

LOCAL_TIMEOUT_MIN = 7 * 24 * 60
"""Local jobs: no practical time limit (submitit's default is 2 minutes)."""
POLL_S = 1.0


@dataclass
class PlannedCell:
    cell: Cell
    config: dict[str, Any]
    run_id: str
    run_dir: Path
    tokens: float
    flops: float
    flops_per_token: float


@dataclass
class Plan:
    name: str
    spec: SweepSpec
    folder: Path
    results: Path
    cells: list[PlannedCell]
    shared: dict[str, Any] = field(default_factory=dict)
    eval_specs: dict[str, dict[str, Any]] | None = None
    """{suite: spec} of the chained evaluation (EVAL=1), as its files will record it."""
    eval_points: int | None = None
    """EVAL_POINTS: the trainer keeps this many evenly spaced checkpoints and the chained
    evaluation scores each of them (the paper's Table 3 / Figures 5-7)."""
    likelihood_rows: int | None = None
    """Validation rows for the chained `experiments.eval.likelihood` (None: not run)."""

    @property
    def manifest_path(self) -> Path:
        return self.folder / "manifest.json"


def plan(spec: SweepSpec, name: str | None = None) -> Plan:
    """Compose and check every cell; raises SweepError (one line) on any problem."""
    cells = expand(spec)
    planned: list[PlannedCell] = []
    for c in cells:
        cfg = backend.compose(c)
        try:
            tokens, flops = backend.planned(cfg)
        except SweepError as e:
            raise SweepError(f"{c.name}: {e}") from e
        planned.append(PlannedCell(c, backend.to_dict(cfg), backend.run_id(cfg),
                                   backend.run_dir(cfg), tokens, flops,
                                   backend.flops_per_token(cfg)))
    ids = [p.run_id for p in planned]
    if len(set(ids)) != len(ids):
        dup = next(p.cell.name for p in planned if ids.count(p.run_id) > 1)
        raise SweepError(f"two cells resolve to the same config (run-id of {dup}); "
                         f"is an override masking an axis?")
    shared = shared_settings(cells, [p.config for p in planned], backend.IGNORED_PREFIXES)
    results = Path(planned[0].config["paths"]["results"])
    name = name or spec.default_name()
    if not all(ch.isalnum() or ch in "._-" for ch in name):
        raise SweepError(f"NAME: {name!r} may use letters, digits, '.', '_' and '-' only")
    return Plan(name, spec, manifest.sweep_dir(results, name), results, planned, shared)


# ------------------------------------------------------------------------------- eval spec
def validate_eval_args(argv: Sequence[str]) -> argparse.Namespace:
    """EVAL_ARGS checked as experiments.eval will parse them (flags, values, task names,
    offline data): SweepError (one line) before anything trains."""
    from experiments.eval import benchdata
    from experiments.eval.run import EvalArgsError, validate_args

    try:
        return validate_args(list(argv))
    except (EvalArgsError, benchdata.DataError) as e:
        raise SweepError(f"EVAL_ARGS: {' '.join(str(e).split())}") from e


def eval_specs(args: argparse.Namespace, p: Plan) -> dict[str, dict[str, Any]]:
    """{suite: spec} the chained evaluation of this plan's cells will write."""
    from experiments.eval import benchdata
    from experiments.eval.run import planned_specs

    lens = {(c.config.get("model") or {}).get("max_seq_len") for c in p.cells}
    max_len = lens.pop() if len(lens) == 1 else None
    try:
        return planned_specs(args, max_len)
    except benchdata.DataError as e:
        raise SweepError(f"EVAL_ARGS: {' '.join(str(e).split())}") from e


def combined_spec(specs: dict[str, dict[str, Any]] | None) -> dict[str, Any] | None:
    """The manifest's `eval_spec`: the suite's spec itself when there is one suite (so its
    spec_id is the eval files'), else their union with the per-suite specs inside (`suites`:
    {suite: spec}, so each suite's file is matched by its own spec_id)."""
    from common.records import EvalSpec

    if not specs:
        return None
    if len(specs) == 1:
        return next(iter(specs.values()))
    return EvalSpec.union({s: EvalSpec.from_json(sp) for s, sp in specs.items()}).to_json()


def eval_files(run_dir: Path, specs: dict[str, dict[str, Any]]) -> dict[str, str | None]:
    """{suite: path of its eval file relative to the run dir (the newest for that spec_id),
    or None when there is none}."""
    out: dict[str, str | None] = {}
    for suite, sp in specs.items():
        # the final checkpoint's file: the highest step (EVAL_POINTS writes earlier steps too,
        # possibly later in time); stepNA (unknown) last, then the newest
        hits = sorted((run_dir / "eval").glob(f"*.{spec_id_of(sp)}.step*.json"),
                      key=lambda q: (_step_of(q), q.stat().st_mtime_ns))
        out[suite] = str(hits[-1].relative_to(run_dir)) if hits else None
    return out


def spec_id_of(spec: dict[str, Any]) -> str:
    from common.records import EvalSpec

    return EvalSpec.from_json(spec).id


def _step_of(path: Path) -> int:
    tail = path.name.rsplit(".step", 1)[-1].removesuffix(".json")
    return int(tail) if tail.isdigit() else -1


def settle_eval(c: dict[str, Any], m: dict[str, Any]) -> None:
    """A finished eval job counts as done only if it wrote a file for every suite of the
    sweep's eval spec; else it failed, with the reason."""
    ev = c.get("eval") or {}
    specs = {s: v["spec"] for s, v in (m.get("eval_specs") or {}).items()}
    if ev.get("state") != "done" or not specs:
        return
    files = eval_files(Path(c["run_dir"]), specs)
    ev["files"] = files
    if len(files) == 1:
        ev["file"] = next(iter(files.values()))
    if m.get("eval_points"):  # steps with a file for every suite (the Table-3 points)
        ids = [spec_id_of(sp) for sp in specs.values()]
        ev["points"] = sorted(
            step for step, _ in kept_checkpoints(Path(c["run_dir"]))
            if all(list((Path(c["run_dir"]) / "eval").glob(f"*.{i}.step{step}.json"))
                   for i in ids))
    missing = [s for s, f in files.items() if f is None]
    if missing:
        from experiments.eval.run import spec_id

        ev.update(state="failed", reason="the evaluation exited 0 but wrote no file for "
                  + ", ".join(f"{s} (spec_id {spec_id(specs[s])})" for s in missing))


# ------------------------------------------------------------------------------- dry run
def human(x: float) -> str:
    for unit, v in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= v:
            return f"{x / v:.3g}{unit}"
    return f"{x:.3g}"


def dry_run_text(p: Plan) -> str:
    rows = [("cell", "arm", "kappa", "H", "seed", "run-id", "FLOPs/tok", "tokens", "FLOPs",
             "status")]
    for c in p.cells:
        done = backend.is_done(c.run_dir)
        rows.append((c.cell.name, c.cell.arm,
                     fmt_num(c.cell.kappa_bits) if c.cell.kappa_bits is not None else "-",
                     str(c.cell.latent_bits or "-"), str(c.cell.seed), c.run_id,
                     human(c.flops_per_token), human(c.tokens), human(c.flops),
                     "done" if done else "to run"))
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(v.ljust(n) for v, n in zip(r, w, strict=True)).rstrip() for r in rows]
    todo = [c for c in p.cells if not backend.is_done(c.run_dir)]
    s = p.spec
    head = (f"sweep {p.name}: preset {s.preset}, data {s.data}, kappa "
            f"{' '.join(map(fmt_num, s.kappa_bits))}, H {' '.join(map(str, s.latent_bits))}, "
            f"seeds {' '.join(map(str, s.seeds))}, controls {' '.join(s.controls) or 'none'}")
    total = sum(c.flops for c in p.cells)
    left = sum(c.flops for c in todo)
    tail = (f"total: {len(p.cells)} cells, {human(sum(c.tokens for c in p.cells))} tokens, "
            f"{human(total)} FLOPs; to run: {len(todo)} cells, {human(left)} FLOPs\n"
            f"manifest: {p.manifest_path}  (DRY=1: nothing submitted)")
    evl = []
    if p.eval_specs:
        from experiments.eval.run import spec_id

        evl = [f"eval (checked): {s} tasks {','.join(sp['tasks'])}, limit {sp['limit']}, "
               f"z {sp['z_mode']}, gen_tokens {sp['gen_tokens']}, spec_id {spec_id(sp)}"
               for s, sp in p.eval_specs.items()]
    skip = [f"skipped control: {why}" for why in skipped_controls(s).values()]
    return "\n".join([head, *lines, *skip, *evl, *cost_text(p), tail])


def cost_text(p: Plan) -> list[str]:
    """Memory per GPU, fit and GPU time of the sweep's costliest cell (the trainer's own dry-run
    estimate), so a GPU-hour is never spent on a cell that cannot fit."""
    from experiments.train.config import TrainConfig
    from experiments.train.plan import dry_parallel, format_estimate, plan

    if not p.cells:
        return []
    big = max(p.cells, key=lambda c: c.flops)
    cfg = backend.compose(big.cell)
    if not isinstance(cfg, TrainConfig):  # a stand-in trainer's config (tests)
        return []
    rp = plan(cfg)
    est = format_estimate(cfg, rp, dry_parallel(cfg, rp))
    return [f"costliest cell {big.cell.name} (its own `make train DRY=1` gives more):",
            *("  " + ln for ln in est.splitlines())]


# ------------------------------------------------------------------------------- manifest
def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def build_manifest(p: Plan, launcher: str, old: dict[str, Any] | None) -> dict[str, Any]:
    """A fresh manifest for the plan, keeping job ids, states and history from `old`. Built as
    a common.records.Manifest: a cell's `latent_bits` is its own H (0 for every baseline and
    control), `match_latent_bits` the H a FLOPs-matched control is matched to."""
    from common.records import FLOPS_MATCHED_ARMS, EvalSpec, Manifest, ManifestCell

    if old is not None and old.get("grid") != p.spec.to_manifest():
        raise SweepError(f"sweep {p.name} already exists with a different grid "
                         f"({p.manifest_path}); pick another NAME")
    prev = {c["cell"]: c for c in (old or {}).get("cells", [])}
    sha, dirty = git_state(untracked=False)
    if p.eval_specs:
        especs = {s: EvalSpec.from_json(sp) for s, sp in p.eval_specs.items()}
        espec = EvalSpec.from_json(combined_spec(p.eval_specs))
        espec_id = espec.id
    else:  # not evaluating this time: the evaluation planned before (if any) still applies
        prior = Manifest.from_json(old or {"name": p.name})
        espec, especs, espec_id = prior.eval_spec, prior.eval_specs, prior.eval_spec_id
    cells = []
    for c in p.cells:
        o = prev.get(c.cell.name, {})
        if o.get("run_id") not in (None, c.run_id):
            o = {}  # the code's config changed under the same name: a new run
        matched = c.cell.arm in FLOPS_MATCHED_ARMS  # the grid's H is then the one it matches
        cells.append(ManifestCell(
            cell=c.cell.name, arm=c.cell.arm, kappa_bits=c.cell.kappa_bits,
            latent_bits=0 if matched else int(c.cell.latent_bits or 0),
            match_latent_bits=c.cell.latent_bits if matched else None, seed=c.cell.seed,
            run_id=c.run_id, state=o.get("state", "pending"), reason=o.get("reason"),
            job_id=o.get("job_id"), eval=o.get("eval"),
            extra={"run_dir": str(c.run_dir), "overrides": list(c.cell.overrides),
                   "tokens": c.tokens, "flops": c.flops, "flops_per_token": c.flops_per_token,
                   "step": o.get("step"), "attempts": o.get("attempts", 0),
                   "slot": o.get("slot"), "started": o.get("started"),
                   "finished": o.get("finished"), "wall_s": o.get("wall_s"),
                   "config": c.config}))
    return Manifest(
        name=p.name, cells=tuple(cells), grid=p.spec.to_manifest(), eval_spec=espec,
        eval_spec_id=espec_id, eval_specs=especs,
        extra={"created": (old or {}).get("created", now()), "updated": now(),
               "git_commit": sha, "git_dirty": dirty, "launcher": launcher,
               "command": sys.argv, "shared": p.shared,
               "skipped_controls": skipped_controls(p.spec),
               "eval_points": p.eval_points if p.eval_specs else (old or {}).get("eval_points"),
               "likelihood_rows": p.likelihood_rows if p.eval_specs else (old or {}).get(
                   "likelihood_rows"),
               "data_checksums": (old or {}).get("data_checksums", {}),
               "tokenizer_sha256": (old or {}).get("tokenizer_sha256"),
               "totals": {"cells": len(p.cells), "tokens": sum(c.tokens for c in p.cells),
                          "flops": sum(c.flops for c in p.cells)}}).to_json()


def refresh(m: dict[str, Any], folder: Path, *, live: set[str] = frozenset()) -> dict[str, Any]:
    """Re-derive each cell's state from its run directory and its job (see manifest.py).

    `live`: cells the calling driver is itself watching (left as they are).
    """
    jobs = folder / "jobs"
    for c in m["cells"]:
        run = Path(c["run_dir"])
        c["step"] = backend.latest_step(run) or c.get("step")
        if backend.is_done(run):
            if c["state"] != "done":
                c["state"], c["reason"] = "done", None
            prov = backend.provenance(run)
            m["data_checksums"].update(prov.get("data_checksums") or {})
            if prov.get("tokenizer_sha256"):
                m["tokenizer_sha256"] = prov["tokenizer_sha256"]
        elif c["cell"] in live:
            pass
        elif c["state"] == "done":  # its run directory was removed since: train it again
            c["state"] = "pending"
            c["reason"] = f"{run / backend.DONE_FILE} is gone; the cell runs again"
        elif c["state"] == "running" and not manifest.job_alive(m["launcher"], jobs,
                                                                c["job_id"]):
            why = manifest.job_failure(jobs, c["job_id"]) if c["job_id"] else None
            if why and "interrupted" not in why:
                c["state"], c["reason"] = "failed", why
            else:
                c["state"] = "pending"
                c["reason"] = (f"interrupted: job {c['job_id']} ended before the run finished; "
                               f"resumes from step {c['step'] or 0} on re-run")
        ev = c.get("eval")
        if ev and ev.get("state") == "running" and not manifest.job_alive(
                m["launcher"], jobs, ev.get("job_id")) and c["cell"] not in live:
            why = manifest.job_failure(jobs, ev["job_id"])
            ok = manifest.job_succeeded(jobs, ev["job_id"])
            ev["state"] = "done" if ok else "failed" if why else "pending"
            ev["reason"] = why or (None if ok else "interrupted: evaluation job ended without "
                                   "a result; EVAL=1 runs it again")
            settle_eval(c, m)
    m["updated"] = now()
    return m


# ------------------------------------------------------------------------------- cluster config
def slurm_parameters(cluster: ClusterConfig, *, for_eval: bool = False) -> dict[str, Any]:
    """AutoExecutor.update_parameters kwargs: one task per GPU (DDP/FSDP via JobEnvironment)."""
    c = cluster.for_eval() if for_eval else cluster
    gpus = int(c.or_default("gpus_per_node"))
    params: dict[str, Any] = {
        "slurm_partition": c.partition,
        "timeout_min": int(c.or_default("timeout_min")),
        "nodes": int(c.or_default("nodes")),
        "gpus_per_node": gpus,
        "tasks_per_node": max(1, gpus),
        "cpus_per_task": int(c.or_default("cpus_per_task")),
        "slurm_signal_delay_s": int(c.or_default("signal_delay_s")),
        "slurm_array_parallelism": int(c.or_default("array_parallelism")),
    }
    if c.mem_gb:
        params["mem_gb"] = float(c.mem_gb)
    for k in ("account", "qos", "constraint", "exclude"):
        if getattr(c, k):
            params[f"slurm_{k}"] = getattr(c, k)
    if c.setup:
        params["slurm_setup"] = list(c.setup)
    if c.additional:
        params["slurm_additional_parameters"] = dict(c.additional)
    return params


# ------------------------------------------------------------------------------- running
def local_jobs(jobs: int | None) -> tuple[int, int]:
    """(parallel jobs, threads per job) for this machine."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = max(1, cores or 1)
    n = max(1, int(jobs) if jobs else cores)
    return n, max(1, cores // n)


def _select(m: dict[str, Any], retry_failed: bool) -> list[dict[str, Any]]:
    out = []
    for c in m["cells"]:
        if c["state"] == "done" or c["state"] == "running":
            continue
        if c["state"] == "failed" and not retry_failed:
            continue
        out.append(c)
    return out


def run(p: Plan, *, launcher: str = "local", jobs: int | None = None, evaluate: bool = False,
        eval_args: Sequence[str] = (), retry_failed: bool = False,
        cluster: ClusterConfig | None = None, log: Callable[[str], None] = print,
        executor_factory: Callable[[Path], Any] | None = None) -> dict[str, Any]:
    """Submit the missing cells; local blocks until they end, slurm returns once submitted."""
    if launcher not in ("local", "slurm"):
        raise SweepError(f"LAUNCHER: {launcher!r} is not local or slurm")
    if launcher == "slurm" and cluster is None:
        cluster = load_cluster()
    p.folder.mkdir(parents=True, exist_ok=True)
    with manifest.locked(p.folder, wait=False):
        (p.folder / ".lock").write_text(f"pid {os.getpid()}\n")
        old = manifest.load(p.manifest_path) if p.manifest_path.exists() else None
        m = build_manifest(p, launcher, old)
        if old is not None and old.get("launcher") != launcher:
            m["launcher"] = old["launcher"]  # states of jobs already submitted need the old one
        m = refresh(m, p.folder)
        m["launcher"] = launcher
        todo = _select(m, retry_failed)
        manifest.save(p.manifest_path, m)
        skipped = sum(c["state"] == "done" for c in m["cells"])
        failed = [c["cell"] for c in m["cells"] if c["state"] == "failed" and not retry_failed]
        log(f"sweep {p.name}: {len(m['cells'])} cells, {skipped} done, {len(todo)} to run"
            + (f", {len(failed)} failed left alone (RETRY_FAILED=1 retries them)"
               if failed else ""))
        for why in m["skipped_controls"].values():
            log(f"skipped control: {why}")
        if launcher == "local":
            _run_local(p, m, todo, jobs, evaluate, eval_args, log, executor_factory)
        else:
            assert cluster is not None  # loaded above
            _submit_slurm(p, m, todo, cluster, evaluate, eval_args, log,
                          executor_factory)
        return m


def _train_job(c: dict[str, Any], threads: int | None, launcher: str = "local") -> CellJob:
    cell = Cell(c["cell"], c["arm"], c["seed"], tuple(c["overrides"]))
    # FTBENCH_LAUNCHER: the trainer records how it was launched (wall-clock comparability)
    return CellJob(c["cell"], backend.train_argv(cell), run_dir=c["run_dir"],
                   done_file=backend.DONE_FILE, threads=threads, cwd=os.getcwd(),
                   env={"FTBENCH_LAUNCHER": launcher})


def _eval_job(c: dict[str, Any], eval_args: Sequence[str], threads: int | None,
              launcher: str = "local", m: dict[str, Any] | None = None) -> CellJob:
    """The chained evaluation: experiments.eval on the final checkpoint; with the sweep's
    EVAL_POINTS also on every kept step checkpoint, and with LIKELIHOOD_ROWS the validation
    likelihood (`chain_argv`)."""
    argv = backend.eval_argv(Path(c["run_dir"]), eval_args)
    if m is not None and (m.get("eval_points") or m.get("likelihood_rows")):
        argv = chain_argv(Path(c["run_dir"]), m, argv)
    return CellJob(c["cell"], argv, threads=threads,
                   cwd=os.getcwd(), kind="eval", env={"FTBENCH_LAUNCHER": launcher})


def chain_argv(run: Path, m: dict[str, Any], final_argv: Sequence[str]) -> list[str]:
    """`python -m sweeps eval-run RUN ... -- <the final checkpoint's eval argv>`."""
    ids = ",".join(v["spec_id"] for v in (m.get("eval_specs") or {}).values())
    out = [sys.executable, "-m", "sweeps", "eval-run", str(run), "--spec-ids", ids]
    if m.get("eval_points"):
        out.append("--points")
    if m.get("likelihood_rows"):
        out += ["--likelihood-rows", str(m["likelihood_rows"])]
    return [*out, "--", *final_argv]


def kept_checkpoints(run: Path) -> list[tuple[int, Path]]:
    """The checkpoints EVAL_POINTS evaluates, oldest first: the trainer's
    `eval_step_<N>.pt` (logging.keep_eval_checkpoints: evenly spaced by tokens, outside the
    rotation); a run without any (trained before the key existed) offers its `step_<N>.pt`."""
    ckdir = run / "checkpoints"
    found = sorted((int(m.group(1)), p) for p in ckdir.glob("eval_step_*.pt")
                   if (m := re.fullmatch(r"eval_step_(\d+)\.pt", p.name))) \
        if ckdir.is_dir() else []
    return found or paths.step_checkpoints(ckdir)


def checkpoint_evals_missing(run: Path, spec_ids: Sequence[str]) -> list[tuple[int, Path]]:
    """Kept checkpoints (`kept_checkpoints`) lacking an eval file for some spec_id
    (`*.<spec_id>.step<N>.json`): what a resumed chain still has to evaluate."""
    out = []
    for step, ck in kept_checkpoints(run):
        if any(not list((run / "eval").glob(f"*.{sid}.step{step}.json")) for sid in spec_ids):
            out.append((step, ck))
    return out


def eval_chain(run: Path, spec_ids: Sequence[str], points: bool, likelihood_rows: int | None,
               final_argv: Sequence[str]) -> int:
    """Run the chained evaluation of one cell, resumably: the final checkpoint (the eval itself
    skips a spec whose file exists), then every kept checkpoint without its files (EVAL_POINTS;
    the same argv with the checkpoint in place of the run dir), then the likelihood file unless
    present. Returns the first failing exit code (0 when all succeeded)."""
    import subprocess

    def call(argv: Sequence[str], what: str) -> int:
        rc = subprocess.call(list(argv))
        if rc:
            print(f"sweep: error: {what} exited with code {rc}", file=sys.stderr)
        return rc

    final_argv = list(final_argv)
    if rc := call(final_argv, f"evaluation of {run}"):
        return rc
    if points:
        i = final_argv.index(str(run))
        for step, ck in checkpoint_evals_missing(run, spec_ids):
            argv = [*final_argv[:i], str(ck), *final_argv[i + 1:]]
            if rc := call(argv, f"evaluation of {ck} (step {step})"):
                return rc
    if likelihood_rows:
        if not list((run / "eval").glob("likelihood.*.json")):
            return call([sys.executable, "-m", "experiments.eval.likelihood", str(run),
                         "--max-rows", str(likelihood_rows)], f"likelihood of {run}")
    return 0


def _needs_eval(c: dict[str, Any], m: dict[str, Any]) -> bool:
    """Not evaluated yet, failed, or evaluated under another spec than the sweep's now."""
    ev = c.get("eval") or {}
    return ev.get("state") != "done" or ev.get("spec_id") != m.get("eval_spec_id")


def _run_local(p: Plan, m: dict[str, Any], todo: list[dict[str, Any]], jobs: int | None,
               evaluate: bool, eval_args: Sequence[str], log: Callable[[str], None],
               executor_factory: Callable[[Path], Any] | None) -> None:
    import submitit

    n, threads = local_jobs(jobs)
    if executor_factory is not None:
        ex = executor_factory(p.folder / "jobs")
    else:
        ex = submitit.AutoExecutor(folder=p.folder / "jobs", cluster="local")
        ex.update_parameters(timeout_min=LOCAL_TIMEOUT_MIN, name=f"sweep-{p.name}")
    m["local"] = {"jobs": n, "threads_per_job": threads}
    queue: list[tuple[str, dict[str, Any]]] = [
        ("train", c) for c in sorted(todo, key=lambda c: -c["flops"])]  # longest first
    if evaluate:  # finished cells whose evaluation never ran (or failed, or ran another
        # spec) are evaluated too
        queue += [("eval", c) for c in m["cells"] if c["state"] == "done" and _needs_eval(c, m)]
    active: dict[int, tuple[str, dict[str, Any], Any, float]] = {}  # slot -> job
    log(f"local: {n} parallel job(s), {threads} thread(s) each; jobs in {p.folder / 'jobs'}")
    t0 = time.time()
    # With a cold data cache, the first cell runs alone until its corpus and tokenizer are
    # built and cached (its config.yaml appears): every cell shares them, and parallel cells
    # would each build them from scratch.
    first: dict[str, Any] | None = None
    if todo and _cold_cache(todo[0]):
        first = next((c for k, c in queue if k == "train"), None)
    try:
        while queue or active:
            if first is not None and all(c is not first for _, c in queue) and (
                    first["state"] != "running"
                    or (Path(first["run_dir"]) / "config.yaml").exists()):
                first = None
            for slot in range(n):
                if slot in active or not queue or (first is not None and active):
                    continue
                kind, c = queue.pop(0)
                job = ex.submit(_train_job(c, threads) if kind == "train"
                                else _eval_job(c, eval_args, threads, m=m))
                started = time.time()
                if kind == "train":
                    c.update(state="running", job_id=str(job.job_id), reason=None, slot=slot,
                             started=now(), attempts=c.get("attempts", 0) + 1)
                else:
                    c["eval"] = {"state": "running", "job_id": str(job.job_id), "slot": slot,
                                 "spec_id": m.get("eval_spec_id")}
                active[slot] = (kind, c, job, started)
                log(f"[{time.time() - t0:6.0f}s] slot {slot}: start {kind} {c['cell']} "
                    f"(job {job.job_id})")
                manifest.save(p.manifest_path, m)
            time.sleep(POLL_S)
            for slot, (kind, c, job, started) in list(active.items()):
                if not job.done():
                    continue
                del active[slot]
                state, reason = _outcome(job, p.folder / "jobs")
                wall = time.time() - started
                if kind == "train":
                    c.update(state=state, reason=reason, finished=now(), wall_s=round(wall, 1),
                             step=backend.latest_step(Path(c["run_dir"])) or c.get("step"))
                    if state == "done" and evaluate:
                        queue.append(("eval", c))
                else:
                    c["eval"].update(state="failed" if state != "done" else "done",
                                     reason=reason, wall_s=round(wall, 1))
                    settle_eval(c, m)
                    state, reason = c["eval"]["state"], c["eval"].get("reason")
                log(f"[{time.time() - t0:6.0f}s] slot {slot}: {kind} {c['cell']} -> {state}"
                    + (f" ({reason})" if reason else "") + f" in {wall:.0f}s")
                refresh(m, p.folder, live={a[1]["cell"] for a in active.values()})
                manifest.save(p.manifest_path, m)
    finally:
        m["local"]["wall_s"] = round(time.time() - t0, 1)
        refresh(m, p.folder, live=set())
        manifest.save(p.manifest_path, m)


def _cold_cache(c: dict[str, Any]) -> bool:
    cache = (c.get("config") or {}).get("paths", {}).get("cache")
    return bool(cache) and not any(Path(cache).glob("corpora/*"))


def _outcome(job: Any, folder: Path) -> tuple[str, str | None]:
    """(state, reason) of a finished local job: done; failed (the command exited with an
    error: its last error line); pending (killed or stopped: resumes on the next run)."""
    from submitit.core.utils import FailedJobError, UncompletedJobError

    job._results_timeout_s = 2  # local files: no need to wait 15 s for a pickle that never comes
    try:
        r = job.result()
    except FailedJobError as e:
        return "failed", manifest.job_failure(folder, str(job.job_id)) or \
            manifest.last_line(str(e))
    except UncompletedJobError:
        return "pending", (f"interrupted: job {job.job_id} ended without a result (killed?); "
                           f"resumes from its newest checkpoint on re-run")
    if isinstance(r, dict) and r.get("state") == "interrupted":
        return "pending", str(r.get("reason"))
    return "done", None


def _submit_slurm(p: Plan, m: dict[str, Any], todo: list[dict[str, Any]],
                  cluster: ClusterConfig, evaluate: bool, eval_args: Sequence[str],
                  log: Callable[[str], None],
                  executor_factory: Callable[[Path], Any] | None) -> None:
    import submitit

    def executor(for_eval: bool) -> Any:
        if executor_factory is not None:
            return executor_factory(p.folder / "jobs")
        ex = submitit.AutoExecutor(folder=p.folder / "jobs", cluster="slurm",
                                   slurm_max_num_timeout=int(
                                       cluster.or_default("max_num_timeout")))
        ex.update_parameters(name=f"sweep-{p.name}{'-eval' if for_eval else ''}",
                             **slurm_parameters(cluster, for_eval=for_eval))
        return ex

    if todo:
        ex = executor(False)
        jobs = ex.submit_array([_train_job(c, None, "slurm") for c in todo])  # one job array
        for c, j in zip(todo, jobs, strict=True):
            c.update(state="running", job_id=str(j.job_id), reason=None, started=now(),
                     attempts=c.get("attempts", 0) + 1)
        manifest.save(p.manifest_path, m)
        log(f"slurm: submitted array {jobs[0].job_id.split('_')[0]} with {len(jobs)} cells")
    if evaluate:
        for c in m["cells"]:
            ev = c.get("eval") or {}
            if ev.get("state") == "running" or (ev.get("state") == "done"
                                                and not _needs_eval(c, m)):
                continue
            if c["state"] not in ("done", "running"):
                continue
            ex = executor(True)
            if c["state"] == "running":  # evaluate once training succeeds
                ex.update_parameters(slurm_additional_parameters={
                    **(cluster.additional or {}), "dependency": f"afterok:{c['job_id']}"})
            j = ex.submit(_eval_job(c, eval_args, None, "slurm", m))
            c["eval"] = {"state": "running", "job_id": str(j.job_id),
                         "spec_id": m.get("eval_spec_id")}
        manifest.save(p.manifest_path, m)
    log(f"watch it with: make sweep-status NAME={p.name}")


def status(name: str, results: Path | None = None) -> str:
    """Refresh (when no driver holds the sweep) and render the status table."""
    root = results_root(results)
    folder = manifest.sweep_dir(root, name)
    path = folder / "manifest.json"
    if not path.exists():
        known = sorted(q.name for q in (root / "sweeps").glob("*") if (q / "manifest.json")
                       .exists()) if (root / "sweeps").exists() else []
        raise SweepError(f"no sweep {name!r} under {root / 'sweeps'}"
                         + (f"; known: {' '.join(known)}" if known else ""))
    try:
        with manifest.locked(folder, wait=False):
            m = refresh(manifest.load(path), folder)
            manifest.save(path, m)
    except manifest.SweepBusy:  # a driver is running: show its view plus runs finished since
        m = manifest.load(path)
        for c in m["cells"]:
            if backend.is_done(Path(c["run_dir"])):
                c["state"], c["reason"] = "done", None
            c["step"] = backend.latest_step(Path(c["run_dir"])) or c.get("step")
    return manifest.table(m)
