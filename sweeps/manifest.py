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
With EVAL_POINTS, each kept checkpoint's evaluation (a point job, started while the cell still
trains, or the chain) has its state in `points` ({"<step>": {...}}, `POINT_STATES`).

Every state transition of a cell is written here and nowhere else: build_manifest (from a plan,
keeping what an earlier manifest knew), started / finished and eval_started / eval_finished
(what the launcher's jobs did), refresh (re-derived from facts) and status (make sweep-status).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import pickle
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from common.io import LockHeld, atomic_write_text, flocked
from common.paths import checkpoint_dir, eval_checkpoints, results_root
from common.provenance import git_state

from . import backend
from .errors import SweepError
from .grid import skipped_controls
from .plan import Plan, combined_spec, sweep_dir

STATES = ("pending", "running", "done", "failed")
POINT_STATES = ("pending", "queued", "running", "done", "failed", "skipped")
"""A kept checkpoint's evaluation: queued (seen, waiting for a local slot), running (its point
job is alive), done (a file for every suite's spec_id), failed (its job ended without them),
skipped (the cell's training failed: never evaluated, never a value), pending (interrupted, or
the spec changed: the chain evaluates it on re-run)."""
TRAINING_FAILED = "skipped: training failed"
SLURM_ALIVE = {"PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "RESIZING",
               "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "UNKNOWN"}


class SweepBusy(SweepError):
    """Another driver holds this sweep."""


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
        pts = [p.get("state") for p in (c.get("points") or {}).values()]
        evs = ev.get("state", "-") + (f" ({pts.count('done')}/{len(pts)} points)" if pts else "")
        rows.append((c["cell"], c["arm"], c["run_id"], c["state"], step, tps, eta,
                     str(c.get("job_id") or "-"), evs, reason))
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


# ------------------------------------------------------------------------------- building
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
                   **({"points": o["points"]} if o.get("points") else {}),
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


# ------------------------------------------------------------------------------- eval files
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
            step for step, _ in backend.kept_checkpoints(Path(c["run_dir"]))
            if backend.point_evaluated(Path(c["run_dir"]), step, ids))
    missing = [s for s, f in files.items() if f is None]
    if missing:
        ev.update(state="failed", reason="the evaluation exited 0 but wrote no file for "
                  + ", ".join(f"{s} (spec_id {spec_id_of(specs[s])})" for s in missing))


# ------------------------------------------------------------------------------- transitions
# Every change of a cell's state happens in this module: the launcher reports what its jobs did
# (started, finished with an outcome) and these functions write it; refresh() re-derives the
# rest from facts.
def started(c: dict[str, Any], job_id: str, *, slot: int | None = None) -> None:
    """A training job was submitted for the cell (slot: the local driver's slot)."""
    c.update(state="running", job_id=str(job_id), reason=None, started=now(),
             attempts=c.get("attempts", 0) + 1)
    if slot is not None:
        c["slot"] = slot


def finished(c: dict[str, Any], state: str, reason: str | None, wall_s: float) -> None:
    """The cell's training job ended with `state` (done | failed | pending) and `reason`."""
    c.update(state=state, reason=reason, finished=now(), wall_s=round(wall_s, 1),
             step=backend.latest_step(Path(c["run_dir"])) or c.get("step"))


def eval_started(c: dict[str, Any], m: dict[str, Any], job_id: str, *,
                 slot: int | None = None) -> None:
    """An evaluation job was submitted for the cell, under the sweep's eval spec now."""
    c["eval"] = {"state": "running", "job_id": str(job_id),
                 **({"slot": slot} if slot is not None else {}),
                 "spec_id": m.get("eval_spec_id")}


def eval_finished(c: dict[str, Any], m: dict[str, Any], state: str, reason: str | None,
                  wall_s: float) -> tuple[str, str | None]:
    """The cell's evaluation job ended; done only if it wrote every suite's file
    (settle_eval). Returns the cell's eval (state, reason)."""
    c["eval"].update(state="failed" if state != "done" else "done", reason=reason,
                     wall_s=round(wall_s, 1))
    settle_eval(c, m)
    return c["eval"]["state"], c["eval"].get("reason")


def point_started(c: dict[str, Any], step: int, job_id: str | None, *,
                  slot: int | None = None) -> None:
    """Kept checkpoint `step` was seen: queued for a local slot (job_id None) or submitted."""
    pts = c.setdefault("points", {})
    pts[str(step)] = {"state": "queued" if job_id is None else "running",
                      "job_id": None if job_id is None else str(job_id), "reason": None,
                      "started": None if job_id is None else now(),
                      **({"slot": slot} if slot is not None else {})}


def point_finished(c: dict[str, Any], m: dict[str, Any], step: int, state: str,
                   reason: str | None, wall_s: float) -> tuple[str, str | None]:
    """A point job ended: done only if it left a file for every suite's spec_id. Returns the
    point's (state, reason)."""
    pt = c.setdefault("points", {}).setdefault(str(step), {})
    ok = state == "done" and backend.point_evaluated(Path(c["run_dir"]), step, _spec_ids(m))
    pt.update(state="done" if ok else "failed", wall_s=round(wall_s, 1),
              reason=None if ok else reason or "the point's evaluation exited 0 but wrote no "
              "file for every suite")
    return pt["state"], pt["reason"]


def points_skipped(c: dict[str, Any], reason: str = TRAINING_FAILED, *,
                   to: str = "skipped") -> list[int]:
    """The cell's seen points neither evaluated nor being evaluated become `to` (skipped: the
    training failed); their steps."""
    out = []
    for step, pt in (c.get("points") or {}).items():
        if pt.get("state") in ("queued", "pending") and pt.get("state") != to:
            pt.update(state=to, reason=reason)
            out.append(int(step))
    return out


def points_unstarted(c: dict[str, Any]) -> list[int]:
    """The driver stopped with the cell's points still queued: pending, the chain's on re-run."""
    return points_skipped(c, "interrupted: the driver stopped before its evaluation started; "
                          "the chain evaluates it on re-run", to="pending")


def _spec_ids(m: dict[str, Any]) -> list[str]:
    return [v["spec_id"] for v in (m.get("eval_specs") or {}).values()]


def point_record(folder: Path, cell: str) -> Path:
    """Where a SLURM training job's point watcher (sweeps/job.py) lists the point jobs it
    submitted (`{"<step>": {"job_id", "submitted"} | {"reason"}}`); read by `settle_points`."""
    return folder / "points" / f"{cell}.json"


def settle_points(c: dict[str, Any], m: dict[str, Any], folder: Path,
                  live: set[tuple[str, int]] = frozenset()) -> None:
    """Re-derive the cell's point states from facts: the jobs a SLURM watcher submitted, the
    eval files (done, whoever wrote them), the jobs' liveness, the cell's training failure.
    `live`: (cell, step) the calling driver is watching itself."""
    ids = _spec_ids(m)
    if not m.get("eval_points") or not ids:
        return
    run, jobs = Path(c["run_dir"]), folder / "jobs"
    pts: dict[str, dict[str, Any]] = c.get("points") or {}
    try:
        submitted = load(point_record(folder, c["cell"]))
    except (OSError, json.JSONDecodeError):
        submitted = {}
    for step, rec in submitted.items():
        pt = pts.get(step) or {}
        if rec.get("job_id") and pt.get("job_id") != rec["job_id"] and pt.get("state") != "done":
            pts[step] = {"state": "running", "job_id": rec["job_id"], "reason": None,
                         "started": rec.get("submitted")}
        elif rec.get("reason") and not pt:
            pts[step] = {"state": "pending", "job_id": None, "reason": rec["reason"]}
    # the trainer's kept checkpoints only (rotated step_<N>.pt come and go)
    for step, _ in eval_checkpoints(checkpoint_dir(run)):
        pts.setdefault(str(step), {"state": "pending", "job_id": None, "reason": None})
    for step, pt in pts.items():
        if backend.point_evaluated(run, int(step), ids):
            if pt.get("state") != "done":
                pt.update(state="done", reason=None)
            continue
        if pt.get("state") == "done":  # evaluated under another spec: not under this one
            pt.update(state="pending", reason="not evaluated under the sweep's eval spec now")
        elif pt.get("state") == "skipped" and c["state"] != "failed":  # retried since
            pt.update(state="pending", reason=None)
        elif pt.get("state") == "running" and (c["cell"], int(step)) not in live and \
                not job_alive(m["launcher"], jobs, pt.get("job_id")):
            why = job_failure(jobs, pt["job_id"]) if pt.get("job_id") else None
            pt.update(state="failed" if why else "pending",
                      reason=why or "interrupted: the point's job ended without its files; "
                      "the chain evaluates it on re-run")
    if pts:
        c["points"] = dict(sorted(pts.items(), key=lambda kv: int(kv[0])))
    if c["state"] == "failed":
        points_skipped(c)


def needs_eval(c: dict[str, Any], m: dict[str, Any]) -> bool:
    """Not evaluated yet, failed, or evaluated under another spec than the sweep's now."""
    ev = c.get("eval") or {}
    return ev.get("state") != "done" or ev.get("spec_id") != m.get("eval_spec_id")


def select(m: dict[str, Any], retry_failed: bool) -> list[dict[str, Any]]:
    """The cells a run submits: neither done nor running, and failed ones only on request."""
    out = []
    for c in m["cells"]:
        if c["state"] == "done" or c["state"] == "running":
            continue
        if c["state"] == "failed" and not retry_failed:
            continue
        out.append(c)
    return out


# ------------------------------------------------------------------------------- refresh, status
def refresh(m: dict[str, Any], folder: Path, *, live: set[str] = frozenset(),
            live_points: set[tuple[str, int]] = frozenset()) -> dict[str, Any]:
    """Re-derive each cell's state from its run directory and its job (see manifest.py).

    `live`: cells the calling driver is itself watching (left as they are); `live_points`:
    the (cell, step) point jobs it is watching.
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
        elif c["state"] == "running" and not job_alive(m["launcher"], jobs,
                                                                c["job_id"]):
            why = job_failure(jobs, c["job_id"]) if c["job_id"] else None
            if why and "interrupted" not in why:
                c["state"], c["reason"] = "failed", why
            else:
                c["state"] = "pending"
                c["reason"] = (f"interrupted: job {c['job_id']} ended before the run finished; "
                               f"resumes from step {c['step'] or 0} on re-run")
        ev = c.get("eval")
        if ev and ev.get("state") == "running" and not job_alive(
                m["launcher"], jobs, ev.get("job_id")) and c["cell"] not in live:
            why = job_failure(jobs, ev["job_id"])
            ok = job_succeeded(jobs, ev["job_id"])
            ev["state"] = "done" if ok else "failed" if why else "pending"
            ev["reason"] = why or (None if ok else "interrupted: evaluation job ended without "
                                   "a result; EVAL=1 runs it again")
            settle_eval(c, m)
        settle_points(c, m, folder, live_points)
    m["updated"] = now()
    return m


def status(name: str, results: Path | None = None) -> str:
    """Refresh (when no driver holds the sweep) and render the status table."""
    root = results_root(results)
    folder = sweep_dir(root, name)
    path = folder / "manifest.json"
    if not path.exists():
        known = sorted(q.name for q in (root / "sweeps").glob("*") if (q / "manifest.json")
                       .exists()) if (root / "sweeps").exists() else []
        raise SweepError(f"no sweep {name!r} under {root / 'sweeps'}"
                         + (f"; known: {' '.join(known)}" if known else ""))
    try:
        with locked(folder, wait=False):
            m = refresh(load(path), folder)
            save(path, m)
    except SweepBusy:  # a driver is running: show its view plus runs finished since
        m = load(path)
        for c in m["cells"]:
            if backend.is_done(Path(c["run_dir"])):
                c["state"], c["reason"] = "done", None
            c["step"] = backend.latest_step(Path(c["run_dir"])) or c.get("step")
    return table(m)
