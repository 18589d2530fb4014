"""`results/sweeps/<name>/manifest.json` (schema in docs/RESULTS.md) and the status table.

Only the sweep driver and `sweep-status` write the manifest, under an exclusive lock, with an
atomic rename; jobs never touch it. A cell's state is re-derived from facts on every refresh:

    done     the run directory holds its final checkpoint (shared by every sweep naming the run)
    running  its job is alive (a local pid, or SLURM says PENDING/RUNNING/REQUEUED...)
    failed   its job raised (the trainer exited with an error); retried only on request
    pending  not started yet, or interrupted (killed, node lost, driver stopped): the reason says
             which, and a re-run resumes it from its newest checkpoint

A cell's chained evaluation (EVAL=1) has its own state in `eval`; a failed evaluation is a
failure in the summary line (and in `make sweep`'s exit code), not hidden behind a done cell.
"""

from __future__ import annotations

import contextlib
import json
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from common.io import LockHeld, atomic_write_text, flocked

from .grid import SweepError

STATES = ("pending", "running", "done", "failed")
SLURM_ALIVE = {"PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "RESIZING",
               "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "UNKNOWN"}


class SweepBusy(SweepError):
    """Another driver holds this sweep."""


def sweep_dir(results: Path, name: str) -> Path:
    return results / "sweeps" / name


def load(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def save(path: Path, manifest: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(manifest, indent=1, sort_keys=False, default=str) + "\n")


@contextlib.contextmanager
def locked(folder: Path, *, wait: bool = True) -> Iterator[None]:
    """An exclusive lock on the sweep folder (one driver per sweep; status waits its turn)."""
    lock = folder / ".lock"
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(flocked(lock, wait=wait))
        except LockHeld:
            who = lock.read_text().strip() or "another process"
            raise SweepBusy(f"sweep {folder.name} is being driven by {who}; wait for it or "
                            f"use `make sweep-status NAME={folder.name}`") from None
        yield


def pid_alive(pid: int) -> bool:
    """A zombie (finished, not yet reaped) counts as dead; one we may not inspect as alive."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def job_failure(folder: Path, job_id: str) -> str | None:
    """The one-line reason a submitit job failed, from its result pickle, or None."""
    from submitit.core.utils import JobPaths

    p = JobPaths(folder, job_id).result_pickle
    if not p.exists():
        return None
    try:
        with open(p, "rb") as f:
            status, payload = pickle.load(f)
    except Exception as e:  # a torn or foreign pickle: say so rather than crash the status
        return f"unreadable result {p.name}: {type(e).__name__}"
    if status != "error":
        return None
    return last_line(str(payload)).removeprefix("sweeps.job.CellFailed: ")


def job_succeeded(folder: Path, job_id: str | None) -> bool:
    """True iff the submitit job left a success result whose outcome is not 'interrupted'."""
    from submitit.core.utils import JobPaths

    if not job_id:
        return False
    p = JobPaths(folder, job_id).result_pickle
    try:
        with open(p, "rb") as f:
            status, payload = pickle.load(f)
    except Exception:  # missing, torn or foreign: not a success we can vouch for
        return False
    return status == "success" and not (isinstance(payload, dict)
                                        and payload.get("state") == "interrupted")


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "unknown error"


def job_alive(launcher: str, folder: Path, job_id: str | None) -> bool:
    if not job_id:
        return False
    if launcher == "local":
        return job_id.isdigit() and pid_alive(int(job_id))
    import submitit

    try:
        state = submitit.SlurmJob(folder=folder, job_id=job_id).state
    except Exception:  # sacct unavailable: trust the manifest rather than resubmit twice
        return True
    return state.split()[0].rstrip("+") in SLURM_ALIVE


def counts(manifest: dict[str, Any]) -> dict[str, int]:
    c = dict.fromkeys(STATES, 0)
    for cell in manifest["cells"]:
        c[cell["state"]] = c.get(cell["state"], 0) + 1
    return c


def eval_counts(manifest: dict[str, Any]) -> dict[str, int]:
    """States of the cells' chained evaluations ({} when none was ever started)."""
    c: dict[str, int] = {}
    for cell in manifest["cells"]:
        st = (cell.get("eval") or {}).get("state")
        if st:
            c[st] = c.get(st, 0) + 1
    return {s: c.get(s, 0) for s in STATES} if c else {}


TAIL_BYTES = 65536
"""How much of metrics.jsonl's end `live_progress` reads (the last train line is near it)."""


def live_progress(run_dir: str | Path, planned_tokens: float | None) -> dict[str, Any] | None:
    """A running cell's live position from the last `kind: train` line of its metrics.jsonl
    (not its last checkpoint, which lags by up to ckpt_every steps): {"step", "tokens",
    "tokens_per_s", "eta_s"}; eta_s = remaining planned tokens / the line's tokens/s (None when
    either is unknown). None when the run has logged no train line yet."""
    path = Path(run_dir) / "metrics.jsonl"
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - TAIL_BYTES))
            tail = f.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(tail):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a partial first line of the tail, or a line being written
        if not isinstance(rec, dict) or rec.get("kind") != "train":
            continue
        tok, tps = rec.get("tokens"), rec.get("tokens_per_s")
        eta = None
        if planned_tokens and isinstance(tok, (int, float)) and isinstance(tps, (int, float)) \
                and tps > 0:
            eta = max(0.0, (float(planned_tokens) - tok) / tps)
        return {"step": rec.get("step"), "tokens": tok, "tokens_per_s": tps, "eta_s": eta}
    return None


def _dur(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else (
        f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s")


def table(manifest: dict[str, Any]) -> str:
    """The status table `make sweep-status` prints. A running cell shows its live step (from
    metrics.jsonl), tokens/s and ETA; others the step of their newest checkpoint."""
    rows = [("cell", "arm", "run-id", "state", "step", "tok/s", "ETA", "job", "eval", "reason")]
    for c in manifest["cells"]:
        ev = c.get("eval") or {}
        reason = c.get("reason") or (f"eval: {ev['reason']}" if ev.get("state") == "failed"
                                     and ev.get("reason") else "")
        step, tps, eta = str(c.get("step") or "-"), "-", "-"
        if c["state"] == "running" and c.get("run_dir"):
            live = live_progress(c["run_dir"], c.get("tokens"))
            if live is not None:
                step = str(live["step"])
                tps = f"{live['tokens_per_s']:.0f}" if isinstance(
                    live["tokens_per_s"], (int, float)) else "-"
                eta = _dur(live["eta_s"])
        rows.append((c["cell"], c["arm"], c["run_id"], c["state"], step, tps, eta,
                     str(c.get("job_id") or "-"), ev.get("state", "-"), reason))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1]
             for r in rows]
    n = counts(manifest)
    summary = ", ".join(f"{n[s]} {s}" for s in STATES)
    head = (f"sweep {manifest['name']} ({manifest['launcher']}): {len(manifest['cells'])} cells: "
            f"{summary}")
    ev = eval_counts(manifest)
    if ev:
        head += "; eval: " + ", ".join(f"{ev[s]} {s}" for s in STATES)
        if ev["failed"]:
            head += " (failed evaluations count as failures)"
    return "\n".join([head, *[ln.rstrip() for ln in lines]])
