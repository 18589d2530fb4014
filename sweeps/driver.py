"""Drive a planned sweep's cells through a launcher (sweeps/launcher.py) and report what its jobs
did; the manifest (manifest.py) records every state, the plan (plan.py) says what to run.
Local: this driver keeps at most JOBS jobs alive (submitit's local executor would start all at
once), longest cells first; SLURM: one job array, and `run` returns at once.

What happens is told twice: as lines for a person (`log`) and as typed events for a program
(`on_event`: Planned, JobEnded), so a pipeline follows a sweep without reading its
lines. Re-running the same command skips done cells (their run directory holds its final
checkpoint), resumes interrupted ones (the trainer restarts from its newest checkpoint) and
retries failed ones only with retry_failed. Cells are named by content (run-id = hash of the
resolved config), so two sweeps that share a cell share its run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from common.errors import UsageError
from common.paths import RunDir, SweepDir
from common.records import TRAINING_FAILED

from . import backend
from . import manifest as M
from .cluster import ClusterConfig
from .job import GRACE_S, CellJob, PointWatch, grace_for
from .launcher import Launcher, LocalLauncher, SlurmLauncher
from .manifest import Manifest, ManifestCell, locked
from .plan import Plan

POLL_S = 1.0
PROGRESS_S = 30.0
"""The local driver prints the status table of its running cells at least this often."""
STOP_WAIT_S = 120.0
"""After Ctrl-C, how long the driver waits for its jobs to checkpoint and stop."""
CHAIN_ENTRY = (sys.executable, "-m", "sweeps", "eval-run")
"""The command a chained evaluation job runs (`python -m sweeps eval-run`, experiments.eval.chain
behind it)."""
POINT_CLUSTER = "slurm"
"""The submitit cluster a SLURM training job submits its point evaluations to (tests: local)."""


# ------------------------------------------------------------------------------- events
@dataclass(frozen=True)
class Planned:
    """The run's plan against the manifest: what it will do."""

    name: str
    cells: int
    done: int
    to_run: int
    """Cells it trains (each then evaluated with EVAL=1)."""
    failed_left: int
    """Failed cells left alone (RETRY_FAILED=1 retries them)."""
    evals_to_run: int
    """Trained cells whose chained evaluation it runs (EVAL=1)."""


@dataclass(frozen=True)
class JobEnded:
    """A job the local driver watched has ended (SLURM jobs end after the driver returns)."""

    kind: str
    cell: str
    state: str
    reason: str | None
    wall_s: float
    step: int | None = None
    slot: int | None = None


Event = Planned | JobEnded


def ignore_event(_: Event) -> None:
    """The default `on_event`: nobody follows the events (the log lines say the same)."""


# ------------------------------------------------------------------------------- running
def run(p: Plan, launcher: Launcher, *, evaluate: bool = False, eval_args: Sequence[str] = (),
        retry_failed: bool = False, log: Callable[[str], None] = print,
        on_event: Callable[[Event], None] = ignore_event) -> Manifest:
    """Submit the missing cells; local blocks until they end, slurm returns once submitted."""
    if isinstance(launcher, SlurmLauncher):
        if launcher.cluster is None:
            raise UsageError("LAUNCHER=slurm needs a cluster file to submit jobs")
        _check_scratch(p, launcher.cluster)
    p.folder.mkdir(parents=True, exist_ok=True)
    with locked(p.folder, wait=False):
        SweepDir(p.folder).lock_path.write_text(f"pid {os.getpid()}\n")  # who drives it
        old = SweepDir(p.folder).manifest() if p.manifest_path.exists() else None
        m = M.build(p, launcher.kind, old)
        # states of jobs already submitted are read through the launcher that submitted them
        M.refresh(m, p.folder, M.probe(old.launcher if old is not None else launcher.kind,
                                       p.folder))
        todo = m.select(retry_failed)
        M.save(p.manifest_path, m)
        done = sum(c.state == "done" for c in m.cells)
        failed = [c.cell for c in m.cells if c.state == "failed" and not retry_failed]
        evals = [c for c in m.cells if evaluate and c.state == "done" and c.needs_eval(m)]
        log(f"sweep {p.name}: {len(m.cells)} cells, {done} done, {len(todo)} to run"
            + (f", {len(failed)} failed left alone (RETRY_FAILED=1 retries them)"
               if failed else ""))
        on_event(Planned(p.name, len(m.cells), done, len(todo), len(failed), len(evals)))
        for why in m.skipped_controls.values():
            log(f"skipped control: {why}")
        if isinstance(launcher, LocalLauncher):
            _run_local(p, m, todo, launcher, evaluate, eval_args, log, on_event)
        else:
            assert isinstance(launcher, SlurmLauncher)
            _submit_slurm(p, m, todo, launcher, evaluate, eval_args, log)
        return m


def _train_job(c: ManifestCell, threads: int | None, launcher: str = "local",
               points: PointWatch | None = None, grace_s: float = GRACE_S) -> CellJob:
    # FTBENCH_LAUNCHER: the trainer records how it was launched (wall-clock comparability)
    return CellJob(c.cell, backend.train_argv(c.overrides), run_dir=c.run_dir, threads=threads,
                   cwd=os.getcwd(),
                   env={"FTBENCH_LAUNCHER": launcher}, points=points, grace_s=grace_s)


def _points_on(evaluate: bool, m: Manifest) -> bool:
    """Kept checkpoints are evaluated as they appear: EVAL=1 with EVAL_POINTS and a spec."""
    return evaluate and bool(m.eval_points) and bool(m.spec_ids())


def _point_argv(c: ManifestCell, m: Manifest, eval_args: Sequence[str],
                step: int) -> list[str]:
    """A point job's command: `python -m sweeps eval-run RUN --spec-ids .. --point N -- <eval
    argv>` (the final evaluation's argv, the checkpoint in place of the run dir)."""
    return backend.chain_argv(c.run, m.spec_ids(), False, None, backend.eval_argv(c.run, eval_args),
                              entry=CHAIN_ENTRY, point=step)


def _point_job(c: ManifestCell, m: Manifest, eval_args: Sequence[str], step: int,
               threads: int | None, launcher: str = "local") -> CellJob:
    return CellJob(c.cell, _point_argv(c, m, eval_args, step), threads=threads,
                   cwd=os.getcwd(), kind="point", env={"FTBENCH_LAUNCHER": launcher})


def _point_watch(p: Plan, c: ManifestCell, m: Manifest, eval_args: Sequence[str],
                 launcher: SlurmLauncher) -> PointWatch:
    """What a SLURM training job needs to submit its kept checkpoints' evaluations: the point
    command around its step, a launcher for the eval role (one node) and where to list them."""
    argv = _point_argv(c, m, eval_args, 0)
    i = argv.index("--point") + 1
    points = SlurmLauncher(launcher.folder, launcher.cluster, job_name=f"sweep-{p.name}-point",
                           cluster_name=POINT_CLUSTER)
    return PointWatch(c.cell, c.run_dir, m.spec_ids(), argv[:i], argv[i + 1:],
                      launcher=points, record=str(SweepDir(p.folder).points_record(c.cell)),
                      cwd=os.getcwd(), env={"FTBENCH_LAUNCHER": "slurm"})


def _eval_job(c: ManifestCell, eval_args: Sequence[str], threads: int | None,
              launcher: str = "local", m: Manifest | None = None) -> CellJob:
    """The chained evaluation: experiments.eval on the final checkpoint; with the sweep's
    EVAL_POINTS also on every kept step checkpoint, and with LIKELIHOOD_ROWS the validation
    likelihood (`chain_argv`)."""
    argv = backend.eval_argv(c.run, eval_args)
    if m is not None and (m.eval_points or m.likelihood_rows):
        argv = backend.chain_argv(c.run, m.spec_ids(), bool(m.eval_points), m.likelihood_rows,
                                  argv, entry=CHAIN_ENTRY)
    return CellJob(c.cell, argv, threads=threads,
                   cwd=os.getcwd(), kind="eval", env={"FTBENCH_LAUNCHER": launcher})


QueueItem = tuple[str, ManifestCell, "int | None"]
"""(kind, cell, step): a job the local driver has yet to start."""


Active = dict[int, tuple[str, ManifestCell, Any, float, "int | None"]]
"""slot -> (kind, cell, job handle, start time, step): the local driver's running jobs."""


def _run_local(p: Plan, m: Manifest, todo: list[ManifestCell], launcher: LocalLauncher,
               evaluate: bool, eval_args: Sequence[str], log: Callable[[str], None],
               on_event: Callable[[Event], None]) -> None:
    n, threads = launcher.slots, launcher.threads
    m.local = {"jobs": n, "threads_per_job": threads}
    queue: list[QueueItem] = [
        ("train", c, None) for c in sorted(todo, key=lambda c: -c.flops)]  # longest first
    if evaluate:  # finished cells whose evaluation never ran (or failed, or ran another
        # spec) are evaluated too
        queue += [("eval", c, None) for c in m.cells if c.state == "done" and c.needs_eval(m)]
    points = _points_on(evaluate, m)
    seen: set[tuple[str, int]] = set()  # (cell, step) points queued or run by this driver
    active: Active = {}
    log(f"local: {n} parallel job(s), {threads} thread(s) each; jobs in {launcher.folder}")
    t0 = told = time.time()
    # With a cold data cache, the first cell runs alone until its corpus and tokenizer are
    # built and cached (its run record appears): every cell shares them, and parallel cells
    # would each build them from scratch.
    first: ManifestCell | None = None
    if todo and _cold_cache(todo[0]):
        first = next((c for k, c, _ in queue if k == "train"), None)

    def say(text: str) -> None:
        log(f"[{time.time() - t0:6.0f}s] {text}")

    def ended(slot: int) -> None:
        kind, c, job, started, step = active.pop(slot)
        state, reason = launcher.outcome(job)
        wall = time.time() - started
        if kind == "train":
            c.job_ended(state, reason, wall, RunDir(c.run))
            if state == "done" and evaluate:
                queue.append(("eval", c, None))
            if state == "failed":  # its kept checkpoints are not evaluated
                queue[:] = [q for q in queue if not (q[0] == "point" and q[1] is c)]
                if skipped := c.points_skipped():
                    log(f"{c.cell}: points {skipped} not evaluated ({TRAINING_FAILED})")
        elif step is not None:
            state, reason = c.point_ended(m, step, state, reason, wall, RunDir(c.run))
        else:
            state, reason = c.eval_ended(m, state, reason, wall, RunDir(c.run))
        say(f"slot {slot}: {_what(kind, c, step)} -> {state}"
            + (f" ({reason})" if reason else "") + f" in {wall:.0f}s")
        on_event(JobEnded(kind, c.cell, state, reason, round(wall, 1), step, slot))
        M.refresh(m, p.folder, launcher, live={a[1].cell for a in active.values()},
                  live_points={(a[1].cell, a[4]) for a in active.values() if a[4] is not None})
        M.save(p.manifest_path, m)

    try:
        while queue or active:
            if first is not None and all(k != "train" or c is not first
                                         for k, c, _ in queue) and (
                    first.state != "running" or RunDir(first.run).has_record):
                first = None
            for slot in range(n):
                if slot in active or not queue or (first is not None and active):
                    continue
                kind, c, step = queue.pop(0)
                job = launcher.submit(
                    _train_job(c, threads) if kind == "train"
                    else _point_job(c, m, eval_args, step, threads) if step is not None
                    else _eval_job(c, eval_args, threads, m=m),
                    role="train" if kind == "train" else "eval", slot=slot)
                if kind == "train":
                    c.job_started(job.job_id, slot=slot)
                elif step is not None:
                    c.point_started(step, job.job_id, slot=slot)
                else:
                    c.eval_started(m, job.job_id, slot=slot)
                active[slot] = (kind, c, job, time.time(), step)
                say(f"slot {slot}: start {_what(kind, c, step)} (job {job.job_id})")
                M.save(p.manifest_path, m)
            time.sleep(POLL_S)
            if points and _queue_points(queue, active, seen, m, log, t0):
                M.save(p.manifest_path, m)
            for slot in [s for s, a in active.items() if a[2].done()]:
                ended(slot)
            if active and time.time() - told >= PROGRESS_S:
                told = time.time()
                for line in M.table(m, running_only=True).splitlines():
                    say(line)
    except KeyboardInterrupt:
        _stop(active, log)
        for slot in [s for s, a in active.items() if a[2].done()]:
            ended(slot)
        raise
    finally:
        for _, c, step in queue:
            if step is not None:  # seen, never started: the chain's on re-run
                c.points_unstarted()
        m.local["wall_s"] = round(time.time() - t0, 1)
        M.refresh(m, p.folder, launcher, live=set())
        M.save(p.manifest_path, m)


def _what(kind: str, c: ManifestCell, step: int | None) -> str:
    return f"{kind} {c.cell}" + (f" step {step}" if step is not None else "")


def _stop(active: Active, log: Callable[[str], None]) -> None:
    """Ctrl-C: ask every running job's command to stop (SIGINT: the trainer writes a checkpoint
    and exits, the evaluator exits; a terminal's Ctrl-C reached them already, a `kill -INT` of
    this process did not) and wait for them up to STOP_WAIT_S; a second Ctrl-C stops waiting."""
    if not active:
        return
    log(f"interrupted: stopping {len(active)} job(s) (a training writes its checkpoint first; "
        "Ctrl-C again to stop waiting)")
    for *_, job, _, _ in active.values():
        with contextlib.suppress(ValueError, psutil.Error):  # the controller's id is its pid
            for proc in psutil.Process(int(job.job_id)).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    proc.send_signal(signal.SIGINT)  # the controller and task ignore it
    deadline = time.time() + STOP_WAIT_S
    try:
        while time.time() < deadline and not all(a[2].done() for a in active.values()):
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    if left := [a[1].cell for a in active.values() if not a[2].done()]:
        log(f"still stopping: {', '.join(left)}; a re-run leaves them alone until they end")


def _queue_points(queue: list[QueueItem], active: Active,
                  seen: set[tuple[str, int]], m: Manifest, log: Callable[[str], None],
                  t0: float) -> bool:
    """Queue the evaluation of every kept checkpoint that appeared in a training cell's run,
    ahead of the trainings and chains waiting (a point is short, and the curve should be
    complete when training ends). True when something was queued."""
    ids, added = m.spec_ids(), False
    for kind, c, *_ in list(active.values()):
        if kind != "train":
            continue
        for step, _ in RunDir(c.run).points_ready(ids):
            if (c.cell, step) in seen:
                continue
            seen.add((c.cell, step))
            at = next((i for i, q in enumerate(queue) if q[0] != "point"), len(queue))
            queue.insert(at, ("point", c, step))
            c.point_started(step, None)
            log(f"[{time.time() - t0:6.0f}s] {c.cell}: step {step} kept; its evaluation "
                f"is queued")
            added = True
    return added


def _cold_cache(c: ManifestCell) -> bool:
    cache = (c.config or {}).get("paths", {}).get("cache")
    return bool(cache) and not any(Path(cache).glob("corpora/*"))


def _check_scratch(p: Plan, cluster: ClusterConfig) -> None:
    """Before anything is submitted: the cells' run directories are under the cluster file's
    results root, when it names one (its free space is sweeps.checks.disk's); UsageError, one
    line, otherwise."""
    if not cluster.results:
        return
    want = Path(os.path.expandvars(os.path.expanduser(cluster.results))).absolute()
    roots = {Path(c.run_dir).parent.parent for c in p.cells}  # <results>/runs/<run-id>
    off = sorted(str(r) for r in roots if want not in (r.absolute(), *r.absolute().parents))
    if off:
        raise UsageError(f"cluster.yaml results={cluster.results} but this sweep writes "
                         f"under {off[0]}; run it with FTBENCH_RESULTS={want}")


def _submit_slurm(p: Plan, m: Manifest, todo: list[ManifestCell], launcher: SlurmLauncher,
                  evaluate: bool, eval_args: Sequence[str], log: Callable[[str], None]) -> None:
    if todo:
        watch = (lambda c: _point_watch(p, c, m, eval_args, launcher)) \
            if _points_on(evaluate, m) else (lambda c: None)
        # the trainer's grace to checkpoint lies inside the signal's lead (sweeps.job.grace_for)
        grace = grace_for(float(launcher.cluster.or_default("signal_delay_s"))) \
            if launcher.cluster is not None else GRACE_S
        jobs = launcher.submit_array([_train_job(c, None, "slurm", watch(c), grace)
                                      for c in todo],
                                     role="train", name=f"sweep-{p.name}")  # one job array
        for c, j in zip(todo, jobs, strict=True):
            c.job_started(j.job_id)
        M.save(p.manifest_path, m)
        log(f"slurm: submitted array {jobs[0].job_id.split('_')[0]} with {len(jobs)} cells")
    if evaluate:
        for c in m.cells:
            ev = c.eval
            if ev is not None and (ev.state == "running"
                                   or (ev.state == "done" and not c.needs_eval(m))):
                continue
            if c.state not in ("done", "running"):
                continue
            # a cell still training is evaluated once its training succeeds (afterok)
            j = launcher.submit(_eval_job(c, eval_args, None, "slurm", m), role="eval",
                                name=f"sweep-{p.name}-eval",
                                after=c.job_id if c.state == "running" else None)
            c.eval_started(m, j.job_id)
        M.save(p.manifest_path, m)
    log(f"watch it with: make sweep-status NAME={p.name}")
