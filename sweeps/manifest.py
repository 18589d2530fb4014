"""`results/sweeps/<name>/manifest.json` (schema in docs/RESULTS.md), typed, and the status table.

    SweepManifest   the whole file: the grid, the eval specs, the bookkeeping, the cells; built
                    from a plan (`build`), read (`load`), refreshed from facts (`refresh`),
                    written (`save`); `record()` is common.records.Manifest, what analysis reads
    SweepCell       one cell: what the plan says (run dir, overrides, tokens, FLOPs, config) and
                    its running state (state, job, attempts, slot, times, step), with its
                    chained evaluation (EvalState) and its evaluation points (PointState)

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

Every state transition of a cell is a method of SweepCell, and nothing else assigns a state:
the driver reports what its jobs did (started, finished with an outcome) and the methods write
it; `refresh` re-derives the rest from facts (the run directory, the job's liveness and result,
read through the launcher that submitted it).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from common.arms import find as find_arm
from common.errors import UsageError
from common.io import LockHeld, atomic_write_text, flocked
from common.paths import RunDir, SweepDir
from common.provenance import git_state
from common.records import SCHEMAS, EvalSpec, Manifest

from . import backend
from .grid import skipped_controls
from .plan import Plan, combined_spec

STATES = ("pending", "running", "done", "failed")
POINT_STATES = ("pending", "queued", "running", "done", "failed", "skipped")
"""A kept checkpoint's evaluation: queued (seen, waiting for a local slot), running (its point
job is alive), done (a file for every suite's spec_id), failed (its job ended without them),
skipped (the cell's training failed: never evaluated, never a value), pending (interrupted, or
the spec changed: the chain evaluates it on re-run)."""
TRAINING_FAILED = "skipped: training failed"


class SweepBusy(UsageError):
    """Another driver holds this sweep."""


class JobProbe(Protocol):
    """What the manifest asks of the launcher that submitted a job (sweeps.launcher)."""

    def alive(self, job_id: str | None) -> bool: ...

    def failure(self, job_id: str | None) -> str | None: ...

    def succeeded(self, job_id: str | None) -> bool: ...


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _opt(d: dict[str, Any], **kv: Any) -> dict[str, Any]:
    """d with the keys whose value is not None (optional keys are left out, as written before)."""
    return {**d, **{k: v for k, v in kv.items() if v is not None}}


def _int(x: Any) -> int | None:
    try:
        return None if x is None or isinstance(x, bool) else int(x)
    except (TypeError, ValueError):
        return None


# ------------------------------------------------------------------------------- points, eval
@dataclass
class PointState:
    """The evaluation of one kept checkpoint (`points["<step>"]`)."""

    state: str = "pending"
    job_id: str | None = None
    reason: str | None = None
    started: str | None = None
    slot: int | None = None
    wall_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    KEYS = ("state", "job_id", "reason", "started", "slot", "wall_s")

    def to_json(self) -> dict[str, Any]:
        return _opt({"state": self.state, "job_id": self.job_id, "reason": self.reason},
                    started=self.started, slot=self.slot, wall_s=self.wall_s) | self.extra

    @classmethod
    def from_json(cls, d: Any) -> PointState:
        d = d if isinstance(d, Mapping) else {}
        return cls(state=d.get("state") or "pending",
                   job_id=None if d.get("job_id") is None else str(d["job_id"]),
                   reason=d.get("reason"), started=d.get("started"), slot=_int(d.get("slot")),
                   wall_s=d.get("wall_s"),
                   extra={k: v for k, v in d.items() if k not in cls.KEYS})


@dataclass
class EvalState:
    """A cell's chained evaluation (`eval`): its job, the spec it ran under, the files it left."""

    state: str = "pending"
    job_id: str | None = None
    spec_id: str | None = None
    slot: int | None = None
    reason: str | None = None
    wall_s: float | None = None
    files: dict[str, str | None] | None = None
    """{suite: its eval file relative to the run dir, or None}: what settle() found."""
    file: str | None = None
    """The one suite's file, when the spec has one suite."""
    points: list[int] | None = None
    """With EVAL_POINTS: the steps with a file for every suite (the Table-3 points)."""
    extra: dict[str, Any] = field(default_factory=dict)

    KEYS = ("state", "job_id", "spec_id", "slot", "reason", "wall_s", "files", "file", "points")

    def to_json(self) -> dict[str, Any]:
        return _opt({"state": self.state, "job_id": self.job_id}, slot=self.slot) | {
            "spec_id": self.spec_id} | _opt({}, reason=self.reason, wall_s=self.wall_s,
                                            files=self.files, file=self.file,
                                            points=self.points) | self.extra

    @classmethod
    def from_json(cls, d: Any) -> EvalState | None:
        if not isinstance(d, Mapping):
            return None
        return cls(state=d.get("state") or "pending",
                   job_id=None if d.get("job_id") is None else str(d["job_id"]),
                   spec_id=d.get("spec_id"), slot=_int(d.get("slot")), reason=d.get("reason"),
                   wall_s=d.get("wall_s"),
                   files=dict(d["files"]) if isinstance(d.get("files"), Mapping) else None,
                   file=d.get("file"), points=list(d["points"]) if isinstance(
                       d.get("points"), list) else None,
                   extra={k: v for k, v in d.items() if k not in cls.KEYS})


# ------------------------------------------------------------------------------- cells
CELL_IDENTITY = ("cell", "arm", "kappa_bits", "latent_bits", "match_latent_bits", "seed",
                 "run_id")
CELL_KEYS = (*CELL_IDENTITY, "state", "reason", "job_id", "eval", "run_dir", "overrides",
             "tokens", "flops", "flops_per_token", "step", "attempts", "slot", "started",
             "finished", "wall_s", "points", "config")


@dataclass
class SweepCell:
    """One cell of the manifest: the plan's identity and numbers, and its running state."""

    cell: str
    arm: str
    kappa_bits: float | None = None
    latent_bits: int = 0
    """The model's own H (0 for every baseline and FLOPs control)."""
    match_latent_bits: int | None = None
    """The H a FLOPs-matched control is matched to."""
    seed: int | None = None
    run_id: str | None = None
    state: str = "pending"
    reason: str | None = None
    job_id: str | None = None
    """The training job (a local pid or a SLURM job id)."""
    eval: EvalState | None = None
    run_dir: str = ""
    overrides: list[str] = field(default_factory=list)
    tokens: float = 0.0
    flops: float = 0.0
    flops_per_token: float = 0.0
    step: int | None = None
    """The step of the run's newest checkpoint, as last seen."""
    attempts: int = 0
    """Training jobs submitted for the cell, over every run of the sweep."""
    slot: int | None = None
    """The local driver's slot of the last training job."""
    started: str | None = None
    finished: str | None = None
    wall_s: float | None = None
    points: dict[int, PointState] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    """The resolved training config (the plan's)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Keys this version does not know, kept as they were."""

    # ---- the file ----------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "cell": self.cell, "arm": self.arm, "kappa_bits": self.kappa_bits,
            "latent_bits": self.latent_bits, "match_latent_bits": self.match_latent_bits,
            "seed": self.seed, "run_id": self.run_id, "state": self.state,
            "reason": self.reason, "job_id": self.job_id,
            "eval": self.eval.to_json() if self.eval is not None else None,
            "run_dir": self.run_dir, "overrides": list(self.overrides), "tokens": self.tokens,
            "flops": self.flops, "flops_per_token": self.flops_per_token, "step": self.step,
            "attempts": self.attempts, "slot": self.slot, "started": self.started,
            "finished": self.finished, "wall_s": self.wall_s}
        if self.points:
            d["points"] = {str(s): p.to_json() for s, p in sorted(self.points.items())}
        return d | {"config": self.config} | self.extra

    @classmethod
    def from_json(cls, d: Any) -> SweepCell:
        if not isinstance(d, Mapping):
            raise UsageError(f"manifest cell: expected an object, got {type(d).__name__}")
        pts = d.get("points") if isinstance(d.get("points"), Mapping) else {}
        return cls(cell=str(d.get("cell")), arm=str(d.get("arm")), kappa_bits=d.get("kappa_bits"),
                   latent_bits=_int(d.get("latent_bits")) or 0,
                   match_latent_bits=_int(d.get("match_latent_bits")), seed=_int(d.get("seed")),
                   run_id=d.get("run_id"), state=d.get("state") or "pending",
                   reason=d.get("reason"),
                   job_id=None if d.get("job_id") is None else str(d["job_id"]),
                   eval=EvalState.from_json(d.get("eval")), run_dir=str(d.get("run_dir") or ""),
                   overrides=list(d.get("overrides") or []),
                   tokens=d.get("tokens") or 0.0, flops=d.get("flops") or 0.0,
                   flops_per_token=d.get("flops_per_token") or 0.0, step=_int(d.get("step")),
                   attempts=_int(d.get("attempts")) or 0, slot=_int(d.get("slot")),
                   started=d.get("started"), finished=d.get("finished"),
                   wall_s=d.get("wall_s"),
                   points={int(s): PointState.from_json(p) for s, p in pts.items()
                           if str(s).lstrip("-").isdigit()},
                   config=dict(d.get("config") or {}),
                   extra={k: v for k, v in d.items() if k not in CELL_KEYS})

    @property
    def run(self) -> Path:
        return Path(self.run_dir)

    @property
    def rundir(self) -> RunDir:
        """The cell's run directory: its records, checkpoints and eval files."""
        return RunDir(Path(self.run_dir))

    # ---- transitions of the training -------------------------------------------------------
    def job_started(self, job_id: str, *, slot: int | None = None) -> None:
        """A training job was submitted for the cell (slot: the local driver's slot)."""
        self.state, self.job_id, self.reason = "running", str(job_id), None
        self.started = now()
        # attempts counts submissions across re-runs: a cell that keeps being resubmitted
        # without finishing shows it in the status table
        self.attempts += 1
        if slot is not None:  # SLURM has no slot: the last local one is left as it was
            self.slot = slot

    def job_ended(self, state: str, reason: str | None, wall_s: float) -> None:
        """The cell's training job ended with `state` (done | failed | pending) and `reason`."""
        self.state, self.reason = state, reason
        self.finished, self.wall_s = now(), round(wall_s, 1)
        # the newest checkpoint is where a pending cell resumes: the table shows it
        self.step = self.rundir.latest_step() or self.step

    def reconcile(self, jobs: JobProbe, provenance: dict[str, Any], *,
                  watched: bool = False) -> None:
        """Re-derive the training state from facts: the run directory first (a finished run
        is done whoever finished it), then the job's liveness and result. `watched`: the
        calling driver watches the job itself (its outcome is reported by `job_ended`)."""
        rd = self.rundir
        self.step = rd.latest_step() or self.step
        if rd.finished:
            if self.state != "done":
                self.state, self.reason = "done", None
            provenance.update(run_provenance(rd))
        elif watched:
            pass
        elif self.state == "done":
            # its run directory was removed since: train it again rather than report a result
            # that no longer exists
            self.state = "pending"
            self.reason = f"{rd.final_checkpoint} is gone; the cell runs again"
        elif self.state == "running" and not jobs.alive(self.job_id):
            why = jobs.failure(self.job_id)
            if why and "interrupted" not in why:  # the trainer raised: retried only on request
                self.state, self.reason = "failed", why
            else:  # killed, preempted, node lost: resumed from its checkpoint on re-run
                self.state = "pending"
                self.reason = (f"interrupted: job {self.job_id} ended before the run finished; "
                               f"resumes from step {self.step or 0} on re-run")

    # ---- transitions of the chained evaluation ---------------------------------------------
    def needs_eval(self, m: SweepManifest) -> bool:
        """Not evaluated yet, failed, or evaluated under another spec than the sweep's now."""
        ev = self.eval
        return ev is None or ev.state != "done" or ev.spec_id != m.eval_spec_id

    def eval_started(self, m: SweepManifest, job_id: str, *, slot: int | None = None) -> None:
        """An evaluation job was submitted for the cell, under the sweep's eval spec now (the
        spec_id it ran under decides later whether a new spec needs another run)."""
        # a fresh record: an earlier evaluation's files and reason belong to its own spec
        self.eval = EvalState(state="running", job_id=str(job_id), slot=slot,
                              spec_id=m.eval_spec_id)

    def eval_ended(self, m: SweepManifest, state: str, reason: str | None,
                      wall_s: float) -> tuple[str, str | None]:
        """The cell's evaluation job ended; done only if it wrote every suite's file
        (settle_eval). Returns the cell's eval (state, reason)."""
        ev = self.eval if self.eval is not None else EvalState()
        # an interrupted evaluation is a failure here: the driver saw it end without a result
        ev.state, ev.reason, ev.wall_s = ("failed" if state != "done" else "done"), reason, \
            round(wall_s, 1)
        self.eval = ev
        self.settle_eval(m)
        return ev.state, ev.reason

    def settle_eval(self, m: SweepManifest) -> None:
        """A finished eval job counts as done only if it wrote a file for every suite of the
        sweep's eval spec (an exit status of 0 with no file is a failure, never a silent 0)."""
        ev = self.eval
        specs = m.eval_specs or {}
        if ev is None or ev.state != "done" or not specs:
            return
        files = eval_files(self.run, specs)
        ev.files = files
        if len(files) == 1:
            ev.file = next(iter(files.values()))
        if m.eval_points:  # steps with a file for every suite (the Table-3 points)
            ids = m.spec_ids()
            ev.points = sorted(step for step, _ in backend.kept_checkpoints(self.run)
                               if self.rundir.point_evaluated(step, ids))
        missing = [s for s, f in files.items() if f is None]
        if missing:
            ev.state = "failed"
            ev.reason = ("the evaluation exited 0 but wrote no file for "
                         + ", ".join(f"{s} (spec_id {specs[s].id})" for s in missing))

    def reconcile_eval(self, m: SweepManifest, jobs: JobProbe, *, watched: bool = False) -> None:
        """An evaluation job the manifest thinks is running, re-derived from its job: done (then
        settled against the files), failed with the job's reason, or pending (interrupted)."""
        ev = self.eval
        if ev is None or ev.state != "running" or watched or jobs.alive(ev.job_id):
            return
        why = jobs.failure(ev.job_id)
        ok = jobs.succeeded(ev.job_id)
        # a result says done or failed; no result means it was killed: run again, not failed
        ev.state = "done" if ok else "failed" if why else "pending"
        ev.reason = why or (None if ok else "interrupted: evaluation job ended without a "
                            "result; EVAL=1 runs it again")
        self.settle_eval(m)

    # ---- transitions of the evaluation points ----------------------------------------------
    def point_started(self, step: int, job_id: str | None, *, slot: int | None = None) -> None:
        """Kept checkpoint `step` was seen: queued for a local slot (job_id None) or submitted."""
        # queued: the local driver saw it but its slots are full; it starts before the next
        # training (a point is short and the curve should be whole when training ends)
        self.points[step] = PointState(
            state="queued" if job_id is None else "running",
            job_id=None if job_id is None else str(job_id), reason=None,
            started=None if job_id is None else now(), slot=slot)

    def point_ended(self, m: SweepManifest, step: int, state: str, reason: str | None,
                       wall_s: float) -> tuple[str, str | None]:
        """A point job ended: done only if it left a file for every suite's spec_id. Returns the
        point's (state, reason)."""
        pt = self.points.setdefault(step, PointState())
        # an exit status of 0 is not enough: the files are what the report reads
        ok = state == "done" and self.rundir.point_evaluated(step, m.spec_ids())
        pt.state, pt.wall_s = ("done" if ok else "failed"), round(wall_s, 1)
        pt.reason = None if ok else reason or ("the point's evaluation exited 0 but wrote no "
                                               "file for every suite")
        return pt.state, pt.reason

    def points_skipped(self, reason: str = TRAINING_FAILED, *, to: str = "skipped") -> list[int]:
        """The cell's seen points neither evaluated nor being evaluated become `to` (skipped: the
        training failed, so its checkpoints are never scored and never read as a value); their
        steps."""
        out = []
        for step, pt in self.points.items():
            if pt.state in ("queued", "pending") and pt.state != to:
                pt.state, pt.reason = to, reason
                out.append(step)
        return out

    def points_unstarted(self) -> list[int]:
        """The driver stopped with the cell's points still queued: pending, the chain's on
        re-run (the chained evaluation scores every kept checkpoint without a file)."""
        return self.points_skipped("interrupted: the driver stopped before its evaluation "
                                   "started; the chain evaluates it on re-run", to="pending")

    def settle_points(self, m: SweepManifest, folder: Path, jobs: JobProbe,
                      live: frozenset[tuple[str, int]] | set[tuple[str, int]] = frozenset()
                      ) -> None:
        """Re-derive the cell's point states from facts: the jobs a SLURM watcher submitted,
        the eval files (done, whoever wrote them), the jobs' liveness, the cell's training
        failure. `live`: (cell, step) the calling driver is watching itself."""
        ids = m.spec_ids()
        if not m.eval_points or not ids:
            return
        try:
            submitted = json.loads(SweepDir(folder).points_record(self.cell).read_text(
                encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            submitted = {}
        for key, rec in (submitted if isinstance(submitted, dict) else {}).items():
            if not str(key).isdigit():
                continue
            step, pt = int(key), self.points.get(int(key))
            if rec.get("job_id") and (pt is None or pt.job_id != rec["job_id"]) and (
                    pt is None or pt.state != "done"):
                # a SLURM training job's watcher submitted it: its job is the point's now
                self.points[step] = PointState(state="running", job_id=str(rec["job_id"]),
                                               started=rec.get("submitted"))
            elif rec.get("reason") and pt is None:
                self.points[step] = PointState(state="pending", reason=rec["reason"])
        # the trainer's kept checkpoints only (rotated step_<N>.pt come and go)
        rd = self.rundir
        for step, _ in rd.eval_checkpoints():
            self.points.setdefault(step, PointState())
        for step, pt in self.points.items():
            if rd.point_evaluated(step, ids):
                if pt.state != "done":  # its files exist: done, whoever wrote them
                    pt.state, pt.reason = "done", None
                continue
            if pt.state == "done":  # evaluated under another spec: not under this one
                pt.state, pt.reason = "pending", "not evaluated under the sweep's eval spec now"
            elif pt.state == "skipped" and self.state != "failed":  # retried since
                pt.state, pt.reason = "pending", None
            elif pt.state == "running" and (self.cell, step) not in live and \
                    not jobs.alive(pt.job_id):
                why = jobs.failure(pt.job_id) if pt.job_id else None
                pt.state = "failed" if why else "pending"
                pt.reason = why or ("interrupted: the point's job ended without its files; "
                                    "the chain evaluates it on re-run")
        self.points = dict(sorted(self.points.items()))
        if self.state == "failed":
            self.points_skipped()


# ------------------------------------------------------------------------------- the manifest
HEADER = ("created", "updated", "git_commit", "git_dirty", "launcher", "command", "shared",
          "skipped_controls", "eval_points", "likelihood_rows", "data_checksums",
          "tokenizer_sha256", "totals", "local")


@dataclass
class SweepManifest:
    """results/sweeps/<name>/manifest.json, typed, as the driver works on it."""

    name: str
    cells: list[SweepCell] = field(default_factory=list)
    grid: dict[str, Any] = field(default_factory=dict)
    eval_spec: EvalSpec | None = None
    eval_spec_id: str | None = None
    eval_specs: dict[str, EvalSpec] | None = None
    created: str | None = None
    updated: str | None = None
    git_commit: str | None = None
    git_dirty: bool | None = None
    launcher: str = "local"
    """The launcher of the jobs in the file (their ids mean something to it only)."""
    command: list[str] = field(default_factory=list)
    shared: dict[str, Any] = field(default_factory=dict)
    skipped_controls: dict[str, str] = field(default_factory=dict)
    eval_points: int | None = None
    likelihood_rows: int | None = None
    data_checksums: dict[str, Any] = field(default_factory=dict)
    tokenizer_sha256: str | None = None
    totals: dict[str, Any] = field(default_factory=dict)
    local: dict[str, Any] | None = None
    """The local driver's jobs, threads and wall time (absent for SLURM)."""
    extra: dict[str, Any] = field(default_factory=dict)

    # ---- the file ----------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        especs = None if self.eval_specs is None else {
            s: {"spec": sp.to_json(), "spec_id": sp.id} for s, sp in self.eval_specs.items()}
        head = {k: getattr(self, k) for k in HEADER if k != "local"}
        if self.local is not None:
            head["local"] = self.local
        return {"schema": SCHEMAS["manifest"], "name": self.name, **head, **self.extra,
                "grid": self.grid,
                "eval_spec": self.eval_spec.to_json() if self.eval_spec is not None else None,
                "eval_spec_id": self.eval_spec_id, "eval_specs": especs,
                "cells": [c.to_json() for c in self.cells]}

    @classmethod
    def from_json(cls, d: Any, name: str = "") -> SweepManifest:
        rec = Manifest.from_json(d, name)  # the schema version and the eval specs, checked
        head = dict(rec.extra)
        raw_cells = d.get("cells") or []
        return cls(name=rec.name, cells=[SweepCell.from_json(c) for c in raw_cells],
                   grid=dict(rec.grid), eval_spec=rec.eval_spec, eval_spec_id=rec.eval_spec_id,
                   eval_specs=dict(rec.eval_specs) if rec.eval_specs is not None else None,
                   created=head.pop("created", None), updated=head.pop("updated", None),
                   git_commit=head.pop("git_commit", None),
                   git_dirty=head.pop("git_dirty", None),
                   launcher=head.pop("launcher", None) or "local",
                   command=list(head.pop("command", None) or []),
                   shared=dict(head.pop("shared", None) or {}),
                   skipped_controls=dict(head.pop("skipped_controls", None) or {}),
                   eval_points=_int(head.pop("eval_points", None)),
                   likelihood_rows=_int(head.pop("likelihood_rows", None)),
                   data_checksums=dict(head.pop("data_checksums", None) or {}),
                   tokenizer_sha256=head.pop("tokenizer_sha256", None),
                   totals=dict(head.pop("totals", None) or {}),
                   local=head.pop("local", None), extra=head)

    def record(self) -> Manifest:
        """The typed record of the file (common.records), what analysis and the drivers read."""
        return Manifest.from_json(self.to_json())

    @classmethod
    def load(cls, path: Path) -> SweepManifest:
        """The manifest at `path`; UsageError (one line) for one this code cannot read."""
        try:
            with open(path, encoding="utf-8") as f:
                return cls.from_json(json.load(f), str(path))
        except (json.JSONDecodeError, UsageError) as e:
            raise UsageError(f"{path}: {str(e).splitlines()[0]}") from None

    def save(self, path: Path) -> None:
        save(path, self.to_json())

    # ---- reading -----------------------------------------------------------------------------
    def cell(self, name: str) -> SweepCell:
        return next(c for c in self.cells if c.cell == name)

    def spec_ids(self) -> list[str]:
        """Every suite's spec_id: an eval file of a step counts only under one of these."""
        return [sp.id for sp in (self.eval_specs or {}).values()]

    def counts(self) -> dict[str, int]:
        c = dict.fromkeys(STATES, 0)
        for cell in self.cells:
            c[cell.state] = c.get(cell.state, 0) + 1
        return c

    def eval_counts(self) -> dict[str, int]:
        """States of the cells' chained evaluations ({} when none was ever started)."""
        c: dict[str, int] = {}
        for cell in self.cells:
            if cell.eval is not None and cell.eval.state:
                c[cell.eval.state] = c.get(cell.eval.state, 0) + 1
        return {s: c.get(s, 0) for s in STATES} if c else {}

    def select(self, retry_failed: bool) -> list[SweepCell]:
        """The cells a run submits: neither done nor running, and failed ones only on request."""
        return [c for c in self.cells if c.state not in ("done", "running")
                and (c.state != "failed" or retry_failed)]

    # ---- building and refreshing -------------------------------------------------------------
    @classmethod
    def build(cls, p: Plan, launcher: str, old: SweepManifest | None) -> SweepManifest:
        """A fresh manifest for the plan, keeping job ids, states and history from `old`: a
        cell's `latent_bits` is its own H (0 for every baseline and FLOPs control),
        `match_latent_bits` the H a FLOPs-matched control is matched to."""
        if old is not None and old.grid != p.spec.to_manifest():
            raise UsageError(f"sweep {p.name} already exists with a different grid "
                             f"({p.manifest_path}); pick another NAME")
        prev = {c.cell: c for c in (old.cells if old is not None else [])}
        sha, dirty = git_state(untracked=False)
        if p.eval_specs:
            especs: dict[str, EvalSpec] | None = {
                s: EvalSpec.from_json(sp) for s, sp in p.eval_specs.items()}
            espec: EvalSpec | None = EvalSpec.from_json(combined_spec(p.eval_specs))
            espec_id = espec.id if espec is not None else None
        elif old is not None:  # not evaluating this time: the evaluation planned before applies
            espec, especs, espec_id = old.eval_spec, old.eval_specs, old.eval_spec_id
        else:
            espec, especs, espec_id = None, None, None
        cells = []
        for c in p.cells:
            o = prev.get(c.cell.name)
            if o is not None and o.run_id not in (None, c.run_id):
                o = None  # the code's config changed under the same name: a new run
            arm = find_arm(c.cell.arm)
            matched = arm is not None and arm.flops_matched  # the grid's H is the one it matches
            cells.append(SweepCell(
                cell=c.cell.name, arm=c.cell.arm, kappa_bits=c.cell.kappa_bits,
                latent_bits=0 if matched else int(c.cell.latent_bits or 0),
                match_latent_bits=c.cell.latent_bits if matched else None, seed=c.cell.seed,
                run_id=c.run_id, run_dir=str(c.run_dir), overrides=list(c.cell.overrides),
                tokens=c.tokens, flops=c.flops, flops_per_token=c.flops_per_token,
                config=c.config,
                **({} if o is None else {
                    "state": o.state, "reason": o.reason, "job_id": o.job_id, "eval": o.eval,
                    "step": o.step, "attempts": o.attempts, "slot": o.slot,
                    "started": o.started, "finished": o.finished, "wall_s": o.wall_s,
                    "points": o.points})))
        return cls(
            name=p.name, cells=cells, grid=p.spec.to_manifest(), eval_spec=espec,
            eval_spec_id=espec_id, eval_specs=especs,
            created=old.created if old is not None and old.created else now(), updated=now(),
            git_commit=sha, git_dirty=dirty, launcher=launcher, command=list(sys.argv),
            shared=p.shared, skipped_controls=skipped_controls(p.spec),
            eval_points=p.eval_points if p.eval_specs else (
                old.eval_points if old is not None else None),
            likelihood_rows=p.likelihood_rows if p.eval_specs else (
                old.likelihood_rows if old is not None else None),
            data_checksums=dict(old.data_checksums) if old is not None else {},
            tokenizer_sha256=old.tokenizer_sha256 if old is not None else None,
            totals={"cells": len(p.cells), "tokens": sum(c.tokens for c in p.cells),
                    "flops": sum(c.flops for c in p.cells)})

    def refresh(self, folder: Path, jobs: JobProbe | None = None, *,
                live: set[str] | frozenset[str] = frozenset(),
                live_points: set[tuple[str, int]] | frozenset[tuple[str, int]] = frozenset()
                ) -> SweepManifest:
        """Re-derive each cell's state from its run directory and its jobs (module docstring).

        `jobs`: the launcher that submitted them (default: the manifest's, read-only);
        `live`: cells the calling driver is itself watching (left as they are); `live_points`:
        the (cell, step) point jobs it is watching.
        """
        if jobs is None:
            jobs = probe(self.launcher, folder)
        for c in self.cells:
            prov: dict[str, Any] = {}
            c.reconcile(jobs, prov, watched=c.cell in live)
            # a finished run records its data and tokenizer: the report shows them per sweep
            self.data_checksums.update(prov.get("data_checksums") or {})
            if prov.get("tokenizer_sha256"):
                self.tokenizer_sha256 = prov["tokenizer_sha256"]
            c.reconcile_eval(self, jobs, watched=c.cell in live)
            c.settle_points(self, folder, jobs, live_points)
        self.updated = now()
        return self


def probe(launcher: str, folder: Path) -> JobProbe:
    """The launcher that reads what became of a sweep's jobs (`folder/jobs`), submitting
    nothing (no cluster file needed)."""
    from .launcher import make_launcher

    return make_launcher(launcher, SweepDir(folder).jobs_dir, load=False)


# ------------------------------------------------------------------------------- files
def load(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def save(path: Path, manifest: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(manifest, indent=1, sort_keys=False, default=str) + "\n")


def build_manifest(p: Plan, launcher: str, old: dict[str, Any] | None) -> dict[str, Any]:
    """SweepManifest.build, as the file's JSON (what the analysis tests plant)."""
    prior = SweepManifest.from_json(old) if old is not None else None
    return SweepManifest.build(p, launcher, prior).to_json()


def run_provenance(rd: RunDir) -> dict[str, Any]:
    """A finished run's recorded provenance (data checksums, tokenizer, commit), {} when its
    run record is missing or unreadable (the manifest then simply lacks them)."""
    try:
        return dict(rd.record().provenance)
    except (OSError, UsageError):
        return {}


@contextlib.contextmanager
def locked(folder: Path, *, wait: bool = True) -> Iterator[None]:
    """An exclusive lock on the sweep folder (one driver per sweep; status waits its turn)."""
    lock = SweepDir(folder).lock_path
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(flocked(lock, wait=wait))
        except LockHeld:
            who = lock.read_text().strip() or "another process"
            raise SweepBusy(f"sweep {folder.name} is being driven by {who}; wait for it or "
                            f"use `make sweep-status NAME={folder.name}`") from None
        yield


def point_record(folder: Path, cell: str) -> Path:
    """Where a SLURM training job's point watcher (sweeps/job.py) lists the point jobs it
    submitted (`{"<step>": {"job_id", "submitted"} | {"reason"}}`); read by `settle_points`."""
    return SweepDir(folder).points_record(cell)


def eval_files(run_dir: Path, specs: Mapping[str, EvalSpec]) -> dict[str, str | None]:
    """{suite: path of its eval file relative to the run dir (the newest for that spec_id),
    or None when there is none}."""
    out: dict[str, str | None] = {}
    rd = RunDir(run_dir)
    for suite, sp in specs.items():
        # the final checkpoint's file: the highest step (EVAL_POINTS writes earlier steps too,
        # possibly later in time); stepNA (unknown) last, then the newest
        hits = sorted(rd.eval_files(f"*.{sp.id}.step*.json"),
                      key=lambda q: (_step_of(q), q.stat().st_mtime_ns))
        out[suite] = str(hits[-1].relative_to(run_dir)) if hits else None
    return out


def spec_id_of(spec: dict[str, Any]) -> str:
    return EvalSpec.from_json(spec).id


def _step_of(path: Path) -> int:
    tail = path.name.rsplit(".step", 1)[-1].removesuffix(".json")
    return int(tail) if tail.isdigit() else -1


# ------------------------------------------------------------------------------- status
TAIL_BYTES = 65536
"""How much of the metrics lines' end `live_progress` reads (the last train line is near it)."""


def live_progress(run_dir: str | Path, planned_tokens: float | None) -> dict[str, Any] | None:
    """A running cell's live position from the last `kind: train` line of its metrics lines
    (not its last checkpoint, which lags by up to ckpt_every steps): {"step", "tokens",
    "tokens_per_s", "eta_s"}; eta_s = remaining planned tokens / the line's tokens/s (None when
    either is unknown). None when the run has logged no train line yet. Reads the file's tail
    only: a long run's metrics are many lines, and the table refreshes every cell."""
    path = RunDir(Path(run_dir)).metrics_path
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


def table(m: SweepManifest) -> str:
    """The status table `make sweep-status` prints. A running cell shows its live step (its
    last training record), tokens/s and ETA; others the step of their newest checkpoint."""
    rows = [("cell", "arm", "run-id", "state", "step", "tok/s", "ETA", "job", "eval", "reason")]
    for c in m.cells:
        ev = c.eval
        reason = c.reason or (f"eval: {ev.reason}" if ev is not None and ev.state == "failed"
                              and ev.reason else "")
        step, tps, eta = str(c.step or "-"), "-", "-"
        if c.state == "running" and c.run_dir:
            live = live_progress(c.run_dir, c.tokens)
            if live is not None:
                step = str(live["step"])
                tps = f"{live['tokens_per_s']:.0f}" if isinstance(
                    live["tokens_per_s"], (int, float)) else "-"
                eta = _dur(live["eta_s"])
        pts = [p.state for p in c.points.values()]
        evs = (ev.state if ev is not None else "-") + (
            f" ({pts.count('done')}/{len(pts)} points)" if pts else "")
        rows.append((c.cell, c.arm, str(c.run_id), c.state, step, tps, eta,
                     str(c.job_id or "-"), evs, reason))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1]
             for r in rows]
    n = m.counts()
    summary = ", ".join(f"{n[s]} {s}" for s in STATES)
    head = f"sweep {m.name} ({m.launcher}): {len(m.cells)} cells: {summary}"
    ev_n = m.eval_counts()
    if ev_n:
        head += "; eval: " + ", ".join(f"{ev_n[s]} {s}" for s in STATES)
        if ev_n["failed"]:
            head += " (failed evaluations count as failures)"
    return "\n".join([head, *[ln.rstrip() for ln in lines]])


def manifest_path(name: str, results: Path | None = None) -> Path:
    return SweepDir.of(name, results).manifest_path


def status(name: str, results: Path | None = None) -> SweepManifest:
    """The sweep's manifest, refreshed from facts and saved when no driver holds the sweep;
    else the driver's view plus the runs finished since. UsageError when there is none."""
    sd = SweepDir.of(name, results)
    folder, path = sd.path, sd.manifest_path
    if not path.exists():
        known = SweepDir.names(results)
        raise UsageError(f"no sweep {name!r} under {sd.path.parent}"
                         + (f"; known: {' '.join(known)}" if known else ""))
    try:
        with locked(folder, wait=False):
            m = SweepManifest.load(path).refresh(folder)
            m.save(path)
    except SweepBusy:  # a driver is running: show its view plus runs finished since
        m = SweepManifest.load(path)
        jobs = probe(m.launcher, folder)
        for c in m.cells:  # every job is the driver's to watch; a finished run is done anyway
            c.reconcile(jobs, {}, watched=True)
    return m
