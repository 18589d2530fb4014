"""The callable a submitit job runs (dino's `run_with_submitit.Trainer`, made thin).

`CellJob` runs one command (`python -m experiments.train <overrides>` or the eval CLI) as a child
process and knows nothing about the model. Training code knows nothing about submitit:

- W&B: a training child gets WANDB_RUN_ID = its run-id and WANDB_RESUME=allow, so a requeued
  cell goes on logging to the same W&B run;
- threads: the child gets OMP/MKL threads = the job's share of the cores (local sweeps);
- multi-GPU: with several tasks per job, submitit's JobEnvironment is mapped to the torchrun
  variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), which
  train.py reads for DDP/FSDP;
- preemption/timeout: submitit calls `checkpoint()` on its signal (USR2). It sends SIGTERM to the
  trainer, which writes a checkpoint and exits (within `grace_s`, inside the signal's lead),
  then returns a `DelayedSubmission` of a fresh copy of this job: submitit requeues it and the
  trainer resumes from that checkpoint. The child ignores USR2 itself (SLURM signals every
  process of the step; only this wrapper may act on it).

A requeue that makes no progress is not repeated forever: when two attempts in a row end with
the run's newest checkpoint at the step they started from, `checkpoint()` raises CellFailed
naming the slot length and where the trainer was (submitit would otherwise requeue a preempted
job without limit, and a timed-out one until max_num_timeout).

Point evaluations (EVAL_POINTS on SLURM): the global rank 0 of a training job given a
`PointWatch` (every task of a multi-GPU job runs this wrapper; one submits) looks for new
kept checkpoints (`RunDir.points_ready`) every WATCH_S while its trainer runs, and submits
each one's evaluation as a job of its own (through the sweep's launcher, in the eval role:
one node), listing them in the sweep's `points/<cell>.json` for the manifest. The local
driver does the same from its polling loop instead (a job it did not start would escape its
JOBS slots).

Outcome: `{"state": "done"}`; `{"state": "interrupted", "reason": ...}` when the child was
killed (it resumes on the next run); an exception (the job fails) when the child exits with an
error code.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from submitit.helpers import DelayedSubmission

from common.io import atomic_write_text
from common.paths import RunDir
from common.records import now

GRACE_S = 120.0
"""How long `checkpoint()` waits for the trainer to save and exit before killing it, when the
job is not given its own (a SLURM training job gets `grace_for(signal_delay_s)`)."""
GRACE_MARGIN_S = 30.0
"""What the signal's lead over the time limit keeps back beyond the trainer's grace: submitit's
requeue call (scontrol) and the wrapper's own exit must also happen before SLURM kills the job.
With a grace equal to the lead (the old 120 s and 120 s), a slow save raced the kill."""
EXIT_PREEMPTED = 75
"""train.py's exit code after SIGTERM/SIGUSR1 once its checkpoint is written (EX_TEMPFAIL)."""
INTERRUPT_CODES = {130, 137, 143, 138, 140}
"""Exit codes of a child stopped by SIGINT/SIGKILL/SIGTERM/SIGUSR1/SIGUSR2 through a shell."""
MAX_STALLS = 2
"""Attempts in a row without a newer checkpoint before the cell fails instead of requeueing."""
WATCH_S = 30.0
"""How often a training job's PointWatch looks for new kept checkpoints."""


def grace_for(signal_delay_s: float) -> float:
    """The trainer's grace inside a `signal_delay_s` lead: the lead less GRACE_MARGIN_S (at
    least a tenth of the lead, for a very short lead)."""
    return max(signal_delay_s - GRACE_MARGIN_S, signal_delay_s / 10)


def is_global_rank0() -> bool:
    """True outside a multi-task submitit job, and in its global rank 0: the one task of a
    training job that submits its evaluation points (every task runs this wrapper; without the
    guard each of 8 tasks submitted its own copy of every point)."""
    try:
        import submitit

        return submitit.JobEnvironment().global_rank == 0
    except RuntimeError:  # not inside a submitit job
        return True


class PointWatch:
    """Submits the evaluation of each kept checkpoint of a training job's run as it appears
    (SLURM): `argv_prefix + [step] + argv_suffix` is the point job's command (`python -m sweeps
    eval-run RUN --spec-ids .. --point N -- <eval argv>`), submitted through `launcher` (the
    sweep's, in the eval role). `record` lists what was submitted (read back on a requeue, so
    nothing is submitted twice)."""

    def __init__(self, cell: str, run_dir: str, spec_ids: list[str], argv_prefix: list[str],
                 argv_suffix: list[str], *, launcher: Any, record: str,
                 cwd: str | None = None, env: dict[str, str] | None = None) -> None:
        self.cell, self.run_dir, self.spec_ids = cell, run_dir, list(spec_ids)
        self.argv_prefix, self.argv_suffix = list(argv_prefix), list(argv_suffix)
        self.launcher, self.record = launcher, record
        """A sweeps.launcher.SlurmLauncher (picklable: it travels in the job array's pickle)."""
        self.cwd, self.env = cwd, dict(env or {})

    def submitted(self) -> dict[str, Any]:
        try:
            with open(self.record, encoding="utf-8") as f:
                return json.load(f)
        except (OSError, json.JSONDecodeError):
            return {}

    def poll(self) -> list[int]:
        """Submit the kept checkpoints ready and not submitted yet; their steps. A failed
        submission is listed with its reason (the chain evaluates that point after training)
        and never stops the training."""
        done = self.submitted()
        new = [s for s, _ in RunDir(Path(self.run_dir)).points_ready(self.spec_ids)
               if str(s) not in done]
        for step in new:
            job = CellJob(self.cell, [*self.argv_prefix, str(step), *self.argv_suffix],
                          cwd=self.cwd, env=self.env, kind="point")
            try:
                with _submission_env():
                    j = self.launcher.submit(job, role="eval")
                done[str(step)] = {"job_id": str(j.job_id), "submitted": now()}
                print(f"[sweeps] {self.cell}: step {step} kept; its evaluation is job "
                      f"{j.job_id}", flush=True)
            except Exception as e:  # sbatch refused: the chain evaluates it after training
                done[str(step)] = {"reason": f"submitting its evaluation failed: "
                                             f"{type(e).__name__}: {str(e)[:200]}"}
                print(f"[sweeps] {self.cell}: step {step}: {done[str(step)]['reason']}",
                      flush=True)
            Path(self.record).parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.record, json.dumps(done, indent=1) + "\n")
        return new


class CommandJob:
    """A command run to its end as one job, its output (stdout and stderr) written to `log`:
    a synthetic seed (pipelines/synthetic_seeds.py). Its result is the exit status, read by the
    caller (a failing command is the caller's to report, with its log's last lines)."""

    def __init__(self, name: str, argv: list[str], log: str, *, cwd: str | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.name, self.argv, self.log = name, list(argv), log
        self.cwd, self.env = cwd, dict(env or {})

    def __call__(self) -> dict[str, Any]:
        Path(self.log).parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w", encoding="utf-8") as fh:  # the child owns it from here
            rc = subprocess.run(self.argv, cwd=self.cwd, stdout=fh, stderr=subprocess.STDOUT,
                                env={**os.environ, **self.env}, check=False,
                                preexec_fn=child_signals(None)).returncode
        return {"name": self.name, "rc": rc}


class CellFailed(RuntimeError):
    """The child exited with an error code; the message's last line is the manifest reason."""


class CellJob:
    def __init__(self, cell: str, argv: list[str], *, run_dir: str | None = None,
                 threads: int | None = None,
                 cwd: str | None = None, env: dict[str, str] | None = None,
                 kind: str = "train", stalls: int = 0,
                 points: PointWatch | None = None, grace_s: float = GRACE_S) -> None:
        self.cell = cell
        self.argv = list(argv)
        self.run_dir = run_dir
        """A training job's run directory: finished when its final checkpoint is there
        (common.paths.RunDir); None for an evaluation."""
        self.threads = threads
        self.cwd = cwd
        self.env = dict(env or {})
        self.kind = kind
        self.stalls = stalls
        """Attempts in a row, before this one, that ended without a newer checkpoint."""
        self.points = points
        """SLURM training with EVAL_POINTS: submit each kept checkpoint's evaluation (global
        rank 0 only)."""
        self.grace_s = grace_s
        """How long `checkpoint()` lets the trainer save and exit (inside the signal's lead)."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._started: float | None = None
        self._step0: int | None = None

    # ---- submitit entry points -------------------------------------------------------------
    def __call__(self) -> dict[str, Any]:
        if self.is_done():
            return {"state": "done", "cell": self.cell, "skipped": True}
        env = {**os.environ, **self.env, **self._thread_env(), **self._dist_env(),
               **self._tracker_env()}
        points = self.points if is_global_rank0() else None
        print(f"[sweeps] {self.kind} {self.cell}: {' '.join(self.argv)}", flush=True)
        sys.stdout.flush()
        self._started, self._step0 = time.monotonic(), self.latest_step()
        self._proc = subprocess.Popen(self.argv, cwd=self.cwd, env=env,
                                      preexec_fn=child_signals(_submitit_signal()))
        # poll, never a blocking wait(): checkpoint() may run in a signal handler meanwhile
        watched = 0.0
        while (rc := self._proc.poll()) is None:
            if points is not None and time.monotonic() - watched >= WATCH_S:
                watched = time.monotonic()
                try:
                    points.poll()
                except Exception as e:  # never stop a training over its evaluations
                    print(f"[sweeps] {self.cell}: looking for kept checkpoints failed: "
                          f"{type(e).__name__}: {e}", flush=True)
            time.sleep(0.2)
        return self._outcome(rc)

    def checkpoint(self, *args: Any, **kwargs: Any) -> DelayedSubmission:
        slot = time.monotonic() - self._started if self._started is not None else None
        p = self._proc
        if p is not None and p.poll() is None:
            print(f"[sweeps] {self.cell}: preempted/timed out; asking the trainer to checkpoint",
                  flush=True)
            p.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + self.grace_s
            while p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            if p.poll() is None:
                p.kill()
                p.wait()
            print(f"[sweeps] {self.cell}: trainer exited with {p.returncode}", flush=True)
        nxt = self.fresh()
        if self.kind == "train" and self.run_dir and not self.is_done():
            now = self.latest_step()
            moved = now is not None and (self._step0 is None or now > self._step0)
            nxt.stalls = 0 if moved else self.stalls + 1
            if nxt.stalls >= MAX_STALLS:
                raise CellFailed(self._stall_reason(nxt.stalls, slot))
        print(f"[sweeps] {self.cell}: requeueing", flush=True)
        return DelayedSubmission(nxt)

    # ---- helpers ---------------------------------------------------------------------------
    def fresh(self) -> CellJob:
        return CellJob(self.cell, self.argv, run_dir=self.run_dir,
                       threads=self.threads, cwd=self.cwd, env=self.env, kind=self.kind,
                       stalls=self.stalls, points=self.points, grace_s=self.grace_s)

    def latest_step(self) -> int | None:
        """Step of the run's newest checkpoint (None before the first)."""
        return RunDir(Path(self.run_dir or ".")).latest_step()

    def _stall_reason(self, stalls: int, slot: float | None) -> str:
        """`slot`: seconds from this attempt's start to the preemption signal."""
        step = "no checkpoint yet" if self._step0 is None else f"step {self._step0}"
        last = _last_log_line(RunDir(Path(self.run_dir or ".")).log_path)
        return (f"no progress in {stalls} attempts in a row: the slot of "
                f"{f'{slot:.0f} s' if slot is not None else 'unknown length'} ends before "
                f"startup + one training step (still at {step}"
                + (f"; the trainer's last log line: {last!r}" if last else "")
                + "); give each attempt more time (cluster.yaml timeout_min, or a partition "
                  "with longer slots)")

    def __getstate__(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["_proc"] = None
        return d

    def is_done(self) -> bool:
        return bool(self.run_dir) and RunDir(Path(self.run_dir or ".")).finished

    def _outcome(self, rc: int) -> dict[str, Any]:
        if rc == 0 and (self.run_dir is None or self.is_done()):
            return {"state": "done", "cell": self.cell}
        if rc == 0:  # the trainer says finished, but not where the sweep planned it
            return {"state": "interrupted", "cell": self.cell,
                    "reason": f"interrupted: the {self.kind} command exited 0 but "
                              f"{RunDir(Path(self.run_dir or '.')).final_checkpoint} is missing "
                              f"(did the code change the run-id since the sweep was planned? "
                              f"re-run the command to re-plan)"}
        if rc == EXIT_PREEMPTED:
            return {"state": "interrupted", "cell": self.cell,
                    "reason": "interrupted: the trainer was stopped and wrote a checkpoint"}
        if rc < 0 or rc in INTERRUPT_CODES:
            sig = -rc if rc < 0 else rc - 128
            try:
                name = signal.Signals(sig).name
            except ValueError:
                name = f"signal {sig}"
            return {"state": "interrupted", "cell": self.cell,
                    "reason": f"interrupted: {self.kind} process killed by {name}"}
        raise CellFailed(f"{self.kind} {self.cell} exited with code {rc}: {self._stderr_tail()}")

    def _stderr_tail(self) -> str:
        try:
            import submitit

            path = submitit.JobEnvironment().paths.stderr
            lines = [ln for ln in path.read_text(errors="replace").splitlines()
                     if ln.strip() and not ln.startswith("submitit ")]
            return lines[-1].strip()[:300] if lines else "no error output"
        except Exception:  # not inside a submitit job (debug executor) or no log file
            return "see the job's log"

    def _thread_env(self) -> dict[str, str]:
        if not self.threads:
            return {}
        t = str(self.threads)
        return {"OMP_NUM_THREADS": t, "MKL_NUM_THREADS": t, "FTBENCH_THREADS": t}

    def _tracker_env(self) -> dict[str, str]:
        """A training job's W&B run id is its run-id, resumed when it exists: every attempt of
        a requeued cell logs to one W&B run instead of starting a new one (wandb.init reads
        WANDB_RUN_ID and WANDB_RESUME when it is given no id; the trainer gives none)."""
        if self.kind != "train" or not self.run_dir:
            return {}
        return {"WANDB_RUN_ID": Path(self.run_dir).name, "WANDB_RESUME": "allow"}

    def _dist_env(self) -> dict[str, str]:
        """torchrun's variables from submitit's job environment (only for multi-task jobs)."""
        try:
            import submitit

            je = submitit.JobEnvironment()
        except RuntimeError:  # not inside a submitit job
            return {}
        if je.num_tasks <= 1:
            return {}
        port = 20000 + zlib.crc32(str(je.raw_job_id).encode()) % 20000
        return {"RANK": str(je.global_rank), "LOCAL_RANK": str(je.local_rank),
                "WORLD_SIZE": str(je.num_tasks),
                "LOCAL_WORLD_SIZE": str(je.num_tasks // je.num_nodes),
                "GROUP_RANK": str(je.node), "NODE_RANK": str(je.node),
                "MASTER_ADDR": je.hostnames[0], "MASTER_PORT": str(port)}


@contextlib.contextmanager
def _submission_env() -> Iterator[None]:
    """Submit from inside a job: without this job's SLURM_*/SUBMITIT_*/torchrun variables
    (submitit.helpers.clean_env; an inherited SLURM_ARRAY_JOB_ID makes the new job look for the
    array task's pickles, submitit issue 1782), and with the preemption signals held until they
    are back (submitit's handler reads them)."""
    from submitit.helpers import clean_env

    sigs = {signal.SIGTERM} | ({usr} if (usr := _submitit_signal()) else set())
    held = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        with clean_env():
            yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _last_log_line(path: Path) -> str | None:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return None
    return lines[-1].strip()[:200] if lines else None


def child_signals(usr: signal.Signals | None) -> Callable[[], None]:
    """The command's signals, set in the child before exec: Ctrl-C back to its default (a local
    job's controller and task ignore it, `sweeps.launcher.ignoring_sigint`, so that only the
    command answers it: the trainer with a checkpoint, the evaluator with one line); submitit's
    preemption signal `usr` ignored (only this wrapper may act on it)."""
    def set_them() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if usr:
            signal.signal(usr, signal.SIG_IGN)
    return set_them


def _submitit_signal() -> signal.Signals | None:
    try:
        from submitit.core.job_environment import JobEnvironment

        return JobEnvironment._usr_sig()
    except Exception:  # unknown SUBMITIT_PREEMPT_SIGNAL: leave the default
        return None
