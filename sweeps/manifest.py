"""`results/sweeps/<name>/manifest.json` as the sweep driver keeps it: built from a plan
(`build`), read (`load`), written (`save`) under an exclusive lock (`locked`), refreshed from
facts (`status`), printed (`table`). Its schema, with every state transition of a cell as a
method, is common.records (`Manifest`, `ManifestCell`): the one class family analysis reads.

Only the sweep driver and `sweep-status` write the manifest, under the lock, with an atomic
rename; jobs never touch it. A cell's state is re-derived from facts on every refresh:

    done     the run directory holds its final checkpoint (shared by every sweep naming the run)
    running  its job is alive (a local pid, or SLURM says PENDING/RUNNING/REQUEUED...)
    failed   its job raised (the trainer exited with an error); retried only on request
    pending  not started yet, or interrupted (killed, node lost, driver stopped): the reason says
             which, and a re-run resumes it from its newest checkpoint

A cell's chained evaluation (EVAL=1) has its own state in `eval`; a failed evaluation is a
failure in the summary line (and in `make sweep`'s exit code), not hidden behind a done cell.
With EVAL_POINTS, each kept checkpoint's evaluation (a point job, started while the cell still
trains, or the chain) has its state in `points` ({"<step>": {...}}, `POINT_STATES`).
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common.arms import find as find_arm
from common.errors import UsageError
from common.io import LockHeld, atomic_write_text, flocked
from common.paths import RunDir, SweepDir
from common.provenance import git_state
from common.records import (  # noqa: F401 - POINT_STATES, TRAINING_FAILED: importers
    POINT_STATES,
    STATES,
    TRAINING_FAILED,
    EvalSpec,
    JobProbe,
    Manifest,
    ManifestCell,
    now,
)

from .grid import skipped_controls
from .plan import Plan, combined_spec

SweepManifest = Manifest
SweepCell = ManifestCell
"""The old names, while tests/test_eval_points.py and pipelines/shared.py (through sweeps.api)
use them."""


class SweepBusy(UsageError):
    """Another driver holds this sweep."""


def probe(launcher: str, folder: Path) -> JobProbe:
    """The launcher that reads what became of a sweep's jobs (`folder/jobs`), submitting
    nothing (no cluster file needed)."""
    from .launcher import make_launcher

    return make_launcher(launcher, SweepDir(folder).jobs_dir, load=False)


# ------------------------------------------------------------------------------- files
def load(path: Path) -> Manifest:
    """The manifest at `path`; UsageError (one line) for one this code cannot read."""
    try:
        with open(path, encoding="utf-8") as f:
            return Manifest.from_json(json.load(f), str(path))
    except (json.JSONDecodeError, UsageError) as e:
        raise UsageError(f"{path}: {str(e).splitlines()[0]}") from None


def save(path: Path, m: Manifest) -> None:
    atomic_write_text(path, json.dumps(m.to_json(), indent=1, default=str) + "\n")


def build(p: Plan, launcher: str, old: Manifest | None) -> Manifest:
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
        cells.append(ManifestCell(
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
    return Manifest(
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


def refresh(m: Manifest, folder: Path, jobs: JobProbe, *,
            live: set[str] | frozenset[str] = frozenset(),
            live_points: set[tuple[str, int]] | frozenset[tuple[str, int]] = frozenset()
            ) -> Manifest:
    """Re-derive each cell's state from facts (the cells' transitions): its run directory, the
    point jobs a SLURM watcher listed (`point_record`), its jobs (`jobs`: the launcher that
    submitted them; `probe` reads them without submitting). `live`: cells the calling driver
    is itself watching (left as they are); `live_points`: the (cell, step) point jobs it
    watches."""
    for c in m.cells:
        rd, prov = RunDir(c.run), {}
        c.reconcile(jobs, rd, prov, watched=c.cell in live)
        # a finished run records its data and tokenizer: the report shows them per sweep
        m.data_checksums.update(prov.get("data_checksums") or {})
        if prov.get("tokenizer_sha256"):
            m.tokenizer_sha256 = prov["tokenizer_sha256"]
        c.reconcile_eval(m, jobs, rd, watched=c.cell in live)
        try:
            submitted = json.loads(point_record(folder, c.cell).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            submitted = {}
        c.settle_points(m, rd, submitted if isinstance(submitted, dict) else {}, jobs,
                        live_points)
    m.updated = now()
    return m


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
    submitted (`{"<step>": {"job_id", "submitted"} | {"reason"}}`); read by `refresh`."""
    return SweepDir(folder).points_record(cell)


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


def table(m: Manifest) -> str:
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


def status(name: str, results: Path | None = None) -> Manifest:
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
            m = load(path)
            save(path, refresh(m, folder, probe(m.launcher, folder)))
    except SweepBusy:  # a driver is running: show its view plus runs finished since
        m = load(path)
        jobs = probe(m.launcher, folder)
        for c in m.cells:  # every job is the driver's to watch; a finished run is done anyway
            c.reconcile(jobs, RunDir(c.run), {}, watched=True)
    return m
