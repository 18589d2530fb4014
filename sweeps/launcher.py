"""Submit a planned sweep's cells through submitit and report what its jobs did; the manifest
(manifest.py) records every state, the plan (plan.py) says what to run.

    run(plan, ...)            submit what is missing: local = a driver that keeps at most JOBS
                              jobs alive (the local executor would start all at once), each with
                              cores/JOBS threads, longest cells first; slurm = one job array
                              with parameters from sweeps/cluster.yaml, returns at once

Re-running the same command skips done cells (their run directory holds final.pt), resumes
interrupted ones (the trainer restarts from its newest checkpoint) and retries failed ones only
with retry_failed. Cells are named by content (run-id = hash of the resolved config), so two
sweeps that share a cell share its run.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import backend, manifest
from .cluster import ClusterConfig, load_cluster
from .errors import SweepError
from .grid import Cell
from .job import CellJob, PointWatch
from .plan import Plan

LOCAL_TIMEOUT_MIN = 7 * 24 * 60
"""Local jobs: no practical time limit (submitit's default is 2 minutes)."""
POLL_S = 1.0
CHAIN_ENTRY = (sys.executable, "-m", "sweeps", "eval-run")
"""The command a chained evaluation job runs (`python -m sweeps eval-run`, experiments.eval.chain
behind it)."""
POINT_CLUSTER = "slurm"
"""The submitit cluster a SLURM training job submits its point evaluations to (tests: local)."""


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


def run(p: Plan, *, launcher: str = "local", jobs: int | None = None, evaluate: bool = False,
        eval_args: Sequence[str] = (), retry_failed: bool = False,
        cluster: ClusterConfig | None = None, log: Callable[[str], None] = print,
        executor_factory: Callable[[Path], Any] | None = None) -> dict[str, Any]:
    """Submit the missing cells; local blocks until they end, slurm returns once submitted."""
    if launcher not in ("local", "slurm"):
        raise SweepError(f"LAUNCHER: {launcher!r} is not local or slurm")
    if launcher == "slurm" and cluster is None:
        cluster = load_cluster()
    if launcher == "slurm":
        assert cluster is not None
        _check_scratch(p, cluster)
    p.folder.mkdir(parents=True, exist_ok=True)
    with manifest.locked(p.folder, wait=False):
        (p.folder / ".lock").write_text(f"pid {os.getpid()}\n")
        old = manifest.load(p.manifest_path) if p.manifest_path.exists() else None
        m = manifest.build_manifest(p, launcher, old)
        if old is not None and old.get("launcher") != launcher:
            m["launcher"] = old["launcher"]  # states of jobs already submitted need the old one
        m = manifest.refresh(m, p.folder)
        m["launcher"] = launcher
        todo = manifest.select(m, retry_failed)
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


def _train_job(c: dict[str, Any], threads: int | None, launcher: str = "local",
               points: PointWatch | None = None) -> CellJob:
    cell = Cell(c["cell"], c["arm"], c["seed"], tuple(c["overrides"]))
    # FTBENCH_LAUNCHER: the trainer records how it was launched (wall-clock comparability)
    return CellJob(c["cell"], backend.train_argv(cell), run_dir=c["run_dir"],
                   done_file=backend.DONE_FILE, threads=threads, cwd=os.getcwd(),
                   env={"FTBENCH_LAUNCHER": launcher}, points=points)


def _spec_ids(m: dict[str, Any]) -> list[str]:
    return [v["spec_id"] for v in (m.get("eval_specs") or {}).values()]


def _points_on(evaluate: bool, m: dict[str, Any]) -> bool:
    """Kept checkpoints are evaluated as they appear: EVAL=1 with EVAL_POINTS and a spec."""
    return evaluate and bool(m.get("eval_points")) and bool(_spec_ids(m))


def _point_argv(c: dict[str, Any], m: dict[str, Any], eval_args: Sequence[str],
                step: int) -> list[str]:
    """A point job's command: `python -m sweeps eval-run RUN --spec-ids .. --point N -- <eval
    argv>` (the final evaluation's argv, the checkpoint in place of the run dir)."""
    run = Path(c["run_dir"])
    return backend.chain_argv(run, _spec_ids(m), False, None, backend.eval_argv(run, eval_args),
                              entry=CHAIN_ENTRY, point=step)


def _point_job(c: dict[str, Any], m: dict[str, Any], eval_args: Sequence[str], step: int,
               threads: int | None, launcher: str = "local") -> CellJob:
    return CellJob(c["cell"], _point_argv(c, m, eval_args, step), threads=threads,
                   cwd=os.getcwd(), kind="point", env={"FTBENCH_LAUNCHER": launcher})


def _point_watch(p: Plan, c: dict[str, Any], m: dict[str, Any], eval_args: Sequence[str],
                 params: dict[str, Any]) -> PointWatch:
    """What a SLURM training job needs to submit its kept checkpoints' evaluations: the point
    command around its step, the eval jobs' parameters (one node) and where to list them."""
    argv = _point_argv(c, m, eval_args, 0)
    i = argv.index("--point") + 1
    return PointWatch(c["cell"], c["run_dir"], _spec_ids(m), argv[:i], argv[i + 1:],
                      folder=str(p.folder / "jobs"), params=params,
                      record=str(manifest.point_record(p.folder, c["cell"])), cwd=os.getcwd(),
                      env={"FTBENCH_LAUNCHER": "slurm"}, cluster=POINT_CLUSTER)


def _eval_job(c: dict[str, Any], eval_args: Sequence[str], threads: int | None,
              launcher: str = "local", m: dict[str, Any] | None = None) -> CellJob:
    """The chained evaluation: experiments.eval on the final checkpoint; with the sweep's
    EVAL_POINTS also on every kept step checkpoint, and with LIKELIHOOD_ROWS the validation
    likelihood (`chain_argv`)."""
    argv = backend.eval_argv(Path(c["run_dir"]), eval_args)
    if m is not None and (m.get("eval_points") or m.get("likelihood_rows")):
        argv = backend.chain_argv(
            Path(c["run_dir"]), [v["spec_id"] for v in (m.get("eval_specs") or {}).values()],
            bool(m.get("eval_points")), m.get("likelihood_rows"), argv, entry=CHAIN_ENTRY)
    return CellJob(c["cell"], argv, threads=threads,
                   cwd=os.getcwd(), kind="eval", env={"FTBENCH_LAUNCHER": launcher})


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
    queue: list[tuple[str, dict[str, Any], int | None]] = [
        ("train", c, None) for c in sorted(todo, key=lambda c: -c["flops"])]  # longest first
    if evaluate:  # finished cells whose evaluation never ran (or failed, or ran another
        # spec) are evaluated too
        queue += [("eval", c, None) for c in m["cells"]
                  if c["state"] == "done" and manifest.needs_eval(c, m)]
    points = _points_on(evaluate, m)
    seen: set[tuple[str, int]] = set()  # (cell, step) points queued or run by this driver
    active: dict[int, tuple[str, dict[str, Any], Any, float, int | None]] = {}  # slot -> job
    log(f"local: {n} parallel job(s), {threads} thread(s) each; jobs in {p.folder / 'jobs'}")
    t0 = time.time()
    # With a cold data cache, the first cell runs alone until its corpus and tokenizer are
    # built and cached (its config.yaml appears): every cell shares them, and parallel cells
    # would each build them from scratch.
    first: dict[str, Any] | None = None
    if todo and _cold_cache(todo[0]):
        first = next((c for k, c, _ in queue if k == "train"), None)

    def what(kind: str, c: dict[str, Any], step: int | None) -> str:
        return f"{kind} {c['cell']}" + (f" step {step}" if step is not None else "")

    try:
        while queue or active:
            if first is not None and all(k != "train" or c is not first
                                         for k, c, _ in queue) and (
                    first["state"] != "running"
                    or (Path(first["run_dir"]) / "config.yaml").exists()):
                first = None
            for slot in range(n):
                if slot in active or not queue or (first is not None and active):
                    continue
                kind, c, step = queue.pop(0)
                job = ex.submit(
                    _train_job(c, threads) if kind == "train"
                    else _point_job(c, m, eval_args, step, threads) if step is not None
                    else _eval_job(c, eval_args, threads, m=m))
                started = time.time()
                if kind == "train":
                    manifest.started(c, job.job_id, slot=slot)
                elif step is not None:
                    manifest.point_started(c, step, job.job_id, slot=slot)
                else:
                    manifest.eval_started(c, m, job.job_id, slot=slot)
                active[slot] = (kind, c, job, started, step)
                log(f"[{time.time() - t0:6.0f}s] slot {slot}: start {what(kind, c, step)} "
                    f"(job {job.job_id})")
                manifest.save(p.manifest_path, m)
            time.sleep(POLL_S)
            if points and _queue_points(queue, active, seen, m, log, t0):
                manifest.save(p.manifest_path, m)
            for slot, (kind, c, job, started, step) in list(active.items()):
                if not job.done():
                    continue
                del active[slot]
                state, reason = _outcome(job, p.folder / "jobs")
                wall = time.time() - started
                if kind == "train":
                    manifest.finished(c, state, reason, wall)
                    if state == "done" and evaluate:
                        queue.append(("eval", c, None))
                    if state == "failed":  # its kept checkpoints are not evaluated
                        queue[:] = [q for q in queue if not (q[0] == "point" and q[1] is c)]
                        if skipped := manifest.points_skipped(c):
                            log(f"{c['cell']}: points {skipped} not evaluated "
                                f"({manifest.TRAINING_FAILED})")
                elif step is not None:
                    state, reason = manifest.point_finished(c, m, step, state, reason, wall)
                else:
                    state, reason = manifest.eval_finished(c, m, state, reason, wall)
                log(f"[{time.time() - t0:6.0f}s] slot {slot}: {what(kind, c, step)} -> {state}"
                    + (f" ({reason})" if reason else "") + f" in {wall:.0f}s")
                manifest.refresh(m, p.folder, live={a[1]["cell"] for a in active.values()},
                                 live_points={(a[1]["cell"], a[4]) for a in active.values()
                                              if a[4] is not None})
                manifest.save(p.manifest_path, m)
    finally:
        for _, c, step in queue:
            if step is not None:  # seen, never started: the chain's on re-run
                manifest.points_unstarted(c)
        m["local"]["wall_s"] = round(time.time() - t0, 1)
        manifest.refresh(m, p.folder, live=set())
        manifest.save(p.manifest_path, m)


def _queue_points(queue: list[tuple[str, dict[str, Any], int | None]],
                  active: dict[int, tuple[str, dict[str, Any], Any, float, int | None]],
                  seen: set[tuple[str, int]], m: dict[str, Any], log: Callable[[str], None],
                  t0: float) -> bool:
    """Queue the evaluation of every kept checkpoint that appeared in a training cell's run,
    ahead of the trainings and chains waiting (a point is short, and the curve should be
    complete when training ends). True when something was queued."""
    ids, added = _spec_ids(m), False
    for kind, c, *_ in list(active.values()):
        if kind != "train":
            continue
        for step, _ in backend.points_ready(Path(c["run_dir"]), ids):
            if (c["cell"], step) in seen:
                continue
            seen.add((c["cell"], step))
            at = next((i for i, q in enumerate(queue) if q[0] != "point"), len(queue))
            queue.insert(at, ("point", c, step))
            manifest.point_started(c, step, None)
            log(f"[{time.time() - t0:6.0f}s] {c['cell']}: step {step} kept; its evaluation "
                f"is queued")
            added = True
    return added


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


def _check_scratch(p: Plan, cluster: ClusterConfig) -> None:
    """Before anything is submitted: the cells' run directories are under the cluster file's
    results root (when it names one), and its file system has room for the cells not done
    yet (checkpoints, export, corpus); SweepError, one line, otherwise."""
    roots = {Path(c.run_dir).parent.parent for c in p.cells}  # <results>/runs/<run-id>
    if cluster.results:
        want = Path(os.path.expandvars(os.path.expanduser(cluster.results))).absolute()
        off = sorted(str(r) for r in roots if want not in (r.absolute(), *r.absolute().parents))
        if off:
            raise SweepError(f"cluster.yaml results={cluster.results} but this sweep writes "
                             f"under {off[0]}; run it with FTBENCH_RESULTS={want}")
        roots = {want}
    need = 0
    for c in p.cells:
        if backend.is_done(Path(c.run_dir)):
            continue
        need += backend.disk_need(backend.compose(c.cell)) or 0
    for r in roots:
        if need and (why := backend.space_refusal(r, need)) is not None:
            raise SweepError(why)


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
        watch = (lambda c: _point_watch(p, c, m, eval_args, slurm_parameters(
            cluster, for_eval=True) | {"name": f"sweep-{p.name}-point"})) \
            if _points_on(evaluate, m) else (lambda c: None)
        jobs = ex.submit_array([_train_job(c, None, "slurm", watch(c))
                                for c in todo])  # one job array
        for c, j in zip(todo, jobs, strict=True):
            manifest.started(c, j.job_id)
        manifest.save(p.manifest_path, m)
        log(f"slurm: submitted array {jobs[0].job_id.split('_')[0]} with {len(jobs)} cells")
    if evaluate:
        for c in m["cells"]:
            ev = c.get("eval") or {}
            if ev.get("state") == "running" or (ev.get("state") == "done"
                                                and not manifest.needs_eval(c, m)):
                continue
            if c["state"] not in ("done", "running"):
                continue
            ex = executor(True)
            if c["state"] == "running":  # evaluate once training succeeds
                ex.update_parameters(slurm_additional_parameters={
                    **(cluster.additional or {}), "dependency": f"afterok:{c['job_id']}"})
            j = ex.submit(_eval_job(c, eval_args, None, "slurm", m))
            manifest.eval_started(c, m, j.job_id)
        manifest.save(p.manifest_path, m)
    log(f"watch it with: make sweep-status NAME={p.name}")
