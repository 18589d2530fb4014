"""The one launcher interface: every job the suite submits goes through a Launcher, local or
SLURM (`make_launcher`): sweep cells, chained evaluations and evaluation points, corpus units,
synthetic seeds. `slurm_parameters` is THE translation of the cluster schema
(sweeps/cluster.py) to submitit's parameters; nothing else spells them.

Roles (sweeps.cluster.ROLES): "train" (a cell, a synthetic seed), "eval" (a chained evaluation
or an evaluation point: the cluster file's eval section, one node), "corpus" (a corpus unit: the
corpus section, no GPU by default), "report" (`make paper`'s report: the report section, no GPU
by default). Local jobs have no cluster: each runs as a process of this machine, `slots` of
them at a time as the caller schedules them, with `threads` torch threads and its slot's GPUs.

Why submitit for local jobs too: the same job object, pickle and result file serve both
launchers, so a local job's outcome (done, failed with its last error line, interrupted) is
read exactly as a SLURM job's. Why not submitit's local executor for `map`: it starts every job
at once and each one is a fresh interpreter with pickles on disk; corpus units are many and short,
so `map` runs them in a spawn process pool of `slots` workers instead.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil

from common.errors import UsageError

from .cluster import ClusterConfig, load_cluster

KINDS = ("local", "slurm")
LOCAL_TIMEOUT_MIN = 7 * 24 * 60
"""Local jobs: no practical time limit (submitit's default is 2 minutes)."""
RESULTS_TIMEOUT_S = 2
"""How long a finished local job's result pickle is waited for (submitit waits 15 s for one
that a killed job never writes)."""
SLURM_ALIVE = {"PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "RESIZING",
               "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "UNKNOWN"}
FAILED_PREFIX = "sweeps.job.CellFailed: "
"""What submitit writes before a job's own failure line (sweeps.job.CellFailed)."""


# ------------------------------------------------------------------------------- the schema
def slurm_parameters(cluster: ClusterConfig, role: str = "train") -> dict[str, Any]:
    """AutoExecutor.update_parameters kwargs of one role's jobs: one task per GPU (DDP/FSDP via
    JobEnvironment, sweeps/job.py). The only place the cluster schema becomes submitit's
    parameters (a raw cluster file passed through would hand submitit keys such as
    max_num_timeout, which it reads as an executor named 'max')."""
    c = cluster.for_role(role)
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


def local_jobs(jobs: int | None) -> tuple[int, int]:
    """(parallel jobs, threads per job) for this machine: one job per core by default, and the
    cores shared evenly (jobs side by side each with every core would oversubscribe them)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = max(1, cores or 1)
    n = max(1, int(jobs) if jobs else cores)
    return n, max(1, cores // n)


def visible_gpus() -> list[str]:
    """The GPUs this process may hand to its jobs: CUDA_VISIBLE_DEVICES's entries when it is set
    (empty or -1: none), else every device torch counts (0 on a machine without CUDA)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        ids = [d.strip() for d in env.split(",") if d.strip()]
        return [] if not ids or ids[0] == "-1" else ids
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # no usable torch build: no GPUs to hand out
        return []


def gpu_sets(gpus: Sequence[str], slots: int) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES of each local slot: the GPUs split into `slots` equal contiguous
    sets (a remainder left unused, so every cell gets the same hardware); with fewer GPUs than
    slots, slot i shares GPU i mod n. None for every slot on a machine without GPUs."""
    if not gpus:
        return [None] * slots
    if len(gpus) < slots:
        return [gpus[i % len(gpus)] for i in range(slots)]
    k = len(gpus) // slots
    return [",".join(gpus[i * k:(i + 1) * k]) for i in range(slots)]


def pid_alive(pid: int) -> bool:
    """A zombie (finished, not yet reaped) counts as dead; one we may not inspect as alive."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


@contextlib.contextmanager
def ignoring_sigint() -> Iterator[None]:
    """Processes started inside inherit Ctrl-C ignored: submitit's local job controller (which
    writes to this terminal) and its task would each print a KeyboardInterrupt traceback; the
    job's command restores it (sweeps.job.child_signals) and the driver stops its jobs itself
    (sweeps.driver). Only the main thread may set a handler: elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "unknown error"


# ------------------------------------------------------------------------------- launchers
class Launcher:
    """What both launchers share: where their jobs' files go, and reading a job's result."""

    kind = ""

    def __init__(self, folder: str | os.PathLike, *, job_name: str = "",
                 executor_factory: Callable[[Path], Any] | None = None) -> None:
        self.folder = Path(folder)
        """submitit's job folder: scripts, pickles, logs, result files."""
        self.job_name = job_name
        self.executor_factory = executor_factory
        """Tests: a stand-in for submitit's executor (called with the folder)."""

    # ---- submitting ------------------------------------------------------------------------
    def submit(self, job: Callable[[], Any], *, role: str = "train", name: str = "",
               after: str | None = None, after_any: Sequence[str] = (),
               slot: int | None = None) -> Any:
        """`after`: a job id this job runs after once it succeeded (afterok); `after_any`: job
        ids it runs after however they ended (afterany); `slot`: the local slot it runs in
        (its GPU set)."""
        raise NotImplementedError

    def map(self, fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]], *,
            parallelism: int | None = None) -> Iterator[Any]:
        raise NotImplementedError

    # ---- what became of a job --------------------------------------------------------------
    def alive(self, job_id: str | None) -> bool:
        raise NotImplementedError

    def _result(self, job_id: str) -> tuple[str, Any] | None:
        from submitit.core.utils import JobPaths

        p = JobPaths(self.folder, job_id).result_pickle
        if not p.exists():
            return None
        with open(p, "rb") as f:
            return pickle.load(f)

    def failure(self, job_id: str | None) -> str | None:
        """The one-line reason the job failed, from its result pickle, or None."""
        if not job_id:
            return None
        try:
            res = self._result(job_id)
        except Exception as e:  # a torn or foreign pickle: say so rather than crash the status
            return f"unreadable result of job {job_id}: {type(e).__name__}"
        if res is None or res[0] != "error":
            return None
        return last_line(str(res[1])).removeprefix(FAILED_PREFIX)

    def succeeded(self, job_id: str | None) -> bool:
        """True iff the job left a success result whose outcome is not 'interrupted'."""
        if not job_id:
            return False
        try:
            res = self._result(job_id)
        except Exception:  # torn or foreign: not a success we can vouch for
            return False
        if res is None:
            return False
        status, payload = res
        return status == "success" and not (isinstance(payload, dict)
                                            and payload.get("state") == "interrupted")

    def outcome(self, job: Any) -> tuple[str, str | None]:
        """(state, reason) of a finished job handle: done; failed (the command exited with an
        error: its last error line); pending (killed or stopped: resumes on the next run)."""
        from submitit.core.utils import FailedJobError, UncompletedJobError

        job._results_timeout_s = RESULTS_TIMEOUT_S
        try:
            r = job.result()
        except FailedJobError as e:
            return "failed", self.failure(str(job.job_id)) or last_line(str(e))
        except UncompletedJobError:
            return "pending", (f"interrupted: job {job.job_id} ended without a result (killed?); "
                               f"resumes from its newest checkpoint on re-run")
        if isinstance(r, dict) and r.get("state") == "interrupted":
            return "pending", str(r.get("reason"))
        return "done", None


class LocalLauncher(Launcher):
    """Jobs as processes of this machine, through submitit's local executor; `slots` of them at
    a time (the caller schedules: the local executor would start every job at once), each with
    `threads` torch threads and, on a GPU machine, its own GPU set (`gpu_sets`: a job given its
    slot sees only that set through CUDA_VISIBLE_DEVICES; without it every cell ran on GPU 0).
    On a GPU machine JOBS defaults to one job per GPU."""

    kind = "local"

    def __init__(self, folder: str | os.PathLike, *, jobs: int | None = None,
                 job_name: str = "", gpus: Sequence[str] | None = None,
                 executor_factory: Callable[[Path], Any] | None = None) -> None:
        super().__init__(folder, job_name=job_name, executor_factory=executor_factory)
        self.gpus = list(visible_gpus() if gpus is None else gpus)
        """The GPUs the slots share out (tests: a list of ids)."""
        self.slots, self.threads = local_jobs(jobs or len(self.gpus) or None)
        self._executor: Any = None

    def executor(self) -> Any:
        if self._executor is None:
            if self.executor_factory is not None:
                self._executor = self.executor_factory(self.folder)
            else:
                import submitit

                self._executor = submitit.AutoExecutor(folder=self.folder, cluster="local")
                self._executor.update_parameters(timeout_min=LOCAL_TIMEOUT_MIN,
                                                 name=self.job_name or "ftbench")
        return self._executor

    def submit(self, job: Callable[[], Any], *, role: str = "train", name: str = "",
               after: str | None = None, after_any: Sequence[str] = (),
               slot: int | None = None) -> Any:
        # `after`, `after_any`: the local caller starts a job only once its dependencies ended
        dev = gpu_sets(self.gpus, self.slots)[slot % self.slots] if slot is not None else None
        if dev is not None and isinstance(getattr(job, "env", None), dict):
            job.env["CUDA_VISIBLE_DEVICES"] = dev  # type: ignore[attr-defined]
        with ignoring_sigint():
            return self.executor().submit(job)

    def map(self, fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]], *,
            parallelism: int | None = None) -> Iterator[Any]:
        n = parallelism or self.slots
        if n <= 1 or len(calls) <= 1:
            for args in calls:
                yield fn(*args)
            return
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        # spawn: the parent may hold tokenizers' thread pool or torch threads (fork is unsafe)
        with ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("spawn")) as ex:
            for f in as_completed([ex.submit(fn, *args) for args in calls]):
                yield f.result()

    def alive(self, job_id: str | None) -> bool:
        # a local job id is the pid of the process submitit started
        return bool(job_id) and str(job_id).isdigit() and pid_alive(int(str(job_id)))


class SlurmLauncher(Launcher):
    """Jobs on a SLURM cluster through submitit, with the cluster file's parameters for their
    role. Picklable: a training job carries one to submit its evaluation points."""

    kind = "slurm"

    def __init__(self, folder: str | os.PathLike, cluster: ClusterConfig | None = None, *,
                 job_name: str = "", executor_factory: Callable[[Path], Any] | None = None,
                 cluster_name: str = "slurm") -> None:
        super().__init__(folder, job_name=job_name, executor_factory=executor_factory)
        self.cluster = cluster
        """None: this launcher only reads what became of jobs (make sweep-status)."""
        self.cluster_name = cluster_name
        """submitit's executor: "slurm" (tests: "local", which takes no SLURM option)."""

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "executor_factory": None}  # a test's stand-in stays here

    def parameters(self, role: str = "train") -> dict[str, Any]:
        if self.cluster is None:
            raise UsageError("LAUNCHER=slurm needs a cluster file to submit jobs")
        return slurm_parameters(self.cluster, role)

    def executor(self, role: str = "train", *, name: str = "", after: str | None = None,
                 after_any: Sequence[str] = (), parallelism: int | None = None) -> Any:
        """A submitit executor with `role`'s parameters; `after`: a job id this job waits for
        (sbatch --dependency=afterok); `after_any`: job ids it waits for however they end
        (afterany). A dependent job is cancelled when its dependency can no longer be met
        (--kill-on-invalid-dep): an evaluation whose training failed would otherwise pend
        forever, and with it the report waiting for the evaluations."""
        if self.executor_factory is not None:
            return self.executor_factory(self.folder)
        import submitit

        params = self.parameters(role)  # UsageError without a cluster file
        if parallelism:
            params["slurm_array_parallelism"] = int(parallelism)
        deps = ([f"afterok:{after}"] if after else []) \
            + ([f"afterany:{':'.join(map(str, after_any))}"] if after_any else [])
        if deps:
            params["slurm_additional_parameters"] = {
                **params.get("slurm_additional_parameters", {}), "dependency": ",".join(deps),
                "kill_on_invalid_dep": "yes"}
        ex = submitit.AutoExecutor(folder=self.folder, cluster=self.cluster_name,
                                   # an executor setting, not a job parameter
                                   slurm_max_num_timeout=int(
                                       self.cluster.or_default("max_num_timeout")))
        if self.cluster_name != "slurm":  # a stand-in cluster: only what every executor takes
            params = {k: v for k, v in params.items() if k in ("timeout_min",)}
        ex.update_parameters(name=name or self.job_name or f"ftbench-{role}", **params)
        return ex

    def submit(self, job: Callable[[], Any], *, role: str = "train", name: str = "",
               after: str | None = None, after_any: Sequence[str] = (),
               slot: int | None = None) -> Any:
        # `slot`: SLURM binds each job's GPUs itself
        return self.executor(role, name=name, after=after, after_any=after_any).submit(job)

    def submit_array(self, jobs: Sequence[Callable[[], Any]], *, role: str = "train",
                     name: str = "") -> list[Any]:
        return list(self.executor(role, name=name).submit_array(list(jobs)))

    def map(self, fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]], *,
            parallelism: int | None = None) -> Iterator[Any]:
        if not calls:
            return
        ex = self.executor("corpus", parallelism=parallelism)
        jobs = ex.map_array(fn, *[list(col) for col in zip(*calls, strict=True)])
        for j in jobs:  # in submission order: each result waits for its own job
            yield j.result()

    def alive(self, job_id: str | None) -> bool:
        if not job_id:
            return False
        import submitit

        try:
            state = submitit.SlurmJob(folder=self.folder, job_id=job_id).state
        except Exception:  # sacct unavailable: trust the manifest rather than resubmit twice
            return True
        return state.split()[0].rstrip("+") in SLURM_ALIVE


def make_launcher(kind: str, folder: str | os.PathLike, *, jobs: int | None = None,
                  cluster: ClusterConfig | None = None, cluster_file: str | Path | None = None,
                  job_name: str = "", load: bool = True,
                  executor_factory: Callable[[Path], Any] | None = None) -> Launcher:
    """The launcher LAUNCHER names: local (JOBS at once) or slurm (the cluster file: `cluster`,
    else `cluster_file`, else FTBENCH_CLUSTER or sweeps/cluster.yaml; `load=False` for a
    launcher that only reads what became of jobs). UsageError (one line) on a bad name or file."""
    kind = (kind or "local").strip()
    if kind not in KINDS:
        raise UsageError(f"LAUNCHER: {kind!r} is not local or slurm")
    if kind == "local":
        return LocalLauncher(folder, jobs=jobs, job_name=job_name,
                             executor_factory=executor_factory)
    if cluster is None and load:
        cluster = load_cluster(Path(cluster_file) if cluster_file else None)
    return SlurmLauncher(folder, cluster, job_name=job_name, executor_factory=executor_factory)

