"""`results/sweeps/<name>/manifest.json` as the sweep driver keeps it: built from a plan
(`build`), written (`save`) under an exclusive lock (`locked`), refreshed from facts (`status`),
printed (`table`); read by common.paths.SweepDir.manifest. Its schema, with every state
transition of a cell as a method, is common.records (`Manifest`, `ManifestCell`; the states:
`STATES`, `POINT_STATES`).

Only the sweep driver and `sweep-status` write the manifest, under the lock, with an atomic
rename; jobs never touch it. A cell's state is re-derived from facts on every refresh. A failed
chained evaluation (EVAL=1) is a failure in the summary line and in `make sweep`'s exit code,
not hidden behind a done cell.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from common.arms import find as find_arm
from common.errors import UsageError
from common.io import LockHeld, atomic_write_text, flocked
from common.kappa import kappa_label
from common.paths import RunDir, SweepDir, sweeps_dir
from common.provenance import git_state
from common.records import (
    STATES,
    EvalSpec,
    JobProbe,
    Manifest,
    ManifestCell,
    now,
)
from common.text import one_line

from . import backend
from . import plan as P
from .grid import skipped_controls
from .plan import Plan


class SweepBusy(UsageError):
    """Another driver holds this sweep."""


def probe(launcher: str, folder: Path) -> JobProbe:
    """The launcher that reads what became of a sweep's jobs (`folder/jobs`), submitting
    nothing (no cluster file needed)."""
    from .launcher import make_launcher

    return make_launcher(launcher, SweepDir(folder).jobs_dir, load=False)


# ------------------------------------------------------------------------------- files
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
        # one suite: its spec itself (its spec_id is the eval files'); several: their union
        # with each suite's spec inside (`suites`), so each suite's file matches its own id
        espec: EvalSpec | None = next(iter(especs.values())) if len(especs) == 1 \
            else EvalSpec.union(especs)
        espec_id = espec.id
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
        planned = dict(
            cell=c.cell.name, arm=c.cell.arm, kappa_bits=c.cell.kappa_bits,
            latent_bits=0 if matched else int(c.cell.latent_bits or 0),
            match_latent_bits=c.cell.latent_bits if matched else None, seed=c.cell.seed,
            run_id=c.run_id, run_dir=str(c.run_dir), overrides=list(c.cell.overrides),
            tokens=c.tokens, flops=c.flops, flops_per_token=c.flops_per_token,
            config=c.config)
        # the plan's identity and numbers; its state and history (job, eval, points) kept
        cells.append(ManifestCell(**planned) if o is None else replace(o, **planned))
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
    point jobs a SLURM watcher listed (SweepDir.points_record: `{"<step>": {"job_id",
    "submitted"} | {"reason"}}`), its jobs (`jobs`: the launcher that
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
            submitted = json.loads(SweepDir(folder).points_record(c.cell).read_text(
                encoding="utf-8"))
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


# ------------------------------------------------------------------------------- status
TAIL_BYTES = 65536
"""How much of the metrics lines' end is read (the last lines are near it)."""
PHASES = ("starting", "validating", "training", "saving", "evaluating")
"""What a running cell is doing, read from its run's files (`live`)."""
def _tail(path: Path) -> list[dict[str, Any]]:
    """The metrics lines at the file's end (a partial line, or one being written, is skipped):
    a long run's metrics are many lines, and the table refreshes every cell."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - TAIL_BYTES))
            text = f.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return []
    out = []
    for line in text:
        with contextlib.suppress(json.JSONDecodeError):
            if isinstance(rec := json.loads(line), dict):
                out.append(rec)
    return out


def live_progress(run_dir: str | Path, planned_tokens: float | None) -> dict[str, Any] | None:
    """A run's position from the last `kind: train` line of its metrics lines (not its last
    checkpoint, which lags by up to ckpt_every steps): {"step", "tokens", "tokens_per_s",
    "eta_s"}; eta_s = remaining planned tokens / the line's tokens/s (training only; None when
    either is unknown). None when the run has logged no train line yet."""
    rec = next((r for r in reversed(_tail(RunDir(Path(run_dir)).metrics_path))
                if r.get("kind") == "train"), None)
    if rec is None:
        return None
    tok, tps = rec.get("tokens"), rec.get("tokens_per_s")
    eta = None
    if planned_tokens and isinstance(tok, (int, float)) and isinstance(tps, (int, float)) \
            and tps > 0:
        eta = max(0.0, (float(planned_tokens) - tok) / tps)
    return {"step": rec.get("step"), "tokens": tok, "tokens_per_s": tps, "eta_s": eta}


@dataclass(frozen=True)
class Live:
    """What a running cell is doing (one of PHASES) and when it should end, from the files its
    run writes: config.yaml (written once the corpus and the model are ready), metrics.jsonl's
    last lines and their file's time, final.pt. `eta_s` None: not known yet."""

    phase: str
    step: int | None = None
    steps: int | None = None
    tokens_per_s: float | None = None
    """As its last train line says (None before one)."""
    eta_s: float | None = None
    speed: float | None = None
    """The tokens/s its ETA assumes: its own, else estimated (step 0's validation, or the
    sweep's other cells)."""


def _epoch(iso: str | None) -> float | None:
    try:
        return dt.datetime.fromisoformat(str(iso)).timestamp() if iso else None
    except ValueError:
        return None


def live(c: ManifestCell, flop_rate: float | None = None, now: float | None = None
         ) -> Live | None:
    """A cell's phase and ETA while it runs (None when it does not): `flop_rate` (training
    FLOP/s of one job, from the sweep's other cells: `flop_rate`) estimates a cell that has
    not logged its own speed yet. Phases: starting (corpus, tokenizer, model, or a resume
    before it writes again), validating (step 0, a val_every step, the last), training,
    saving (the final export), evaluating (its chained evaluation or a point's)."""
    now = time.time() if now is None else now
    ev_running = (c.eval is not None and c.eval.state == "running") or any(
        p.state == "running" for p in c.points.values())
    if c.state != "running":
        return Live("evaluating") if ev_running else None
    rd = RunDir(c.run)
    steps, vals, _ = P.validations(c.config or {}, c.tokens)
    started = _epoch(c.started)
    lines = _tail(rd.metrics_path) if rd.has_record else []
    try:
        mtime = rd.metrics_path.stat().st_mtime
    except OSError:
        mtime = None
    train = next((r for r in reversed(lines) if r.get("kind") == "train"), None)
    last = lines[-1] if lines else None
    tps = train.get("tokens_per_s") if train else None
    tps = float(tps) if isinstance(tps, (int, float)) and tps > 0 else None
    if tps is None and len(lines) == 1 and lines[0].get("kind") == "val" and mtime is not None:
        # only step 0's validation so far: it began as the run record was written and ended
        # with its line, and a validation token costs VAL_PASS of a training token
        with contextlib.suppress(OSError, TypeError, KeyError):
            began = rd.record_path.stat().st_mtime
            if started is None or began >= started - 1:  # this attempt wrote the record
                tps = float(lines[0]["val_tokens"]) * P.passes(c.arm) * P.VAL_PASS / max(
                    mtime - began, 1e-3)
    if tps is None and flop_rate and c.flops_per_token:
        tps = flop_rate / c.flops_per_token  # the other cells' speed, this cell's FLOPs
    step = int(last["step"]) if last and isinstance(last.get("step"), int) else 0
    if not rd.has_record or (started is not None and mtime is not None and lines
                             and mtime < started - 1):
        phase = "starting"  # nothing written by this attempt yet
    elif last is None:
        phase = "validating"  # step 0's, before the first line
    elif last.get("kind") == "final" or (last.get("kind") == "val" and step == steps):
        phase = "saving"
    elif last.get("kind") == "train" and step in vals:
        phase = "validating"
    else:
        phase = "training"
    eta = None
    if tps is not None:
        if phase == "starting":
            spent = now - started if started is not None else 0.0
            eta = P.cell_seconds(c.arm, c.config or {}, c.tokens, tps) - spent
        elif phase != "saving":
            tok = train.get("tokens") if train else None
            done_val = last is not None and last.get("kind") == "val"  # its step validated
            eta = P.cell_seconds(c.arm, c.config or {}, c.tokens, tps, step + done_val,
                                 float(tok) if isinstance(tok, (int, float)) else 0.0)
            if mtime is not None:
                eta -= now - mtime  # the work done since the last line was written
        eta = eta if eta is not None and eta > 0 else None  # spent: not known, never "0 s"
    return Live(phase, step if lines else None, steps, tps if train else None, eta, tps)


def flop_rate(m: Manifest) -> float | None:
    """One job's training FLOP/s in this sweep: the median over its cells' last train lines of
    tokens/s x FLOPs per token (None before any cell logged one)."""
    rates = []
    for c in m.cells:
        rec = live_progress(c.run, None) if c.run_dir and c.flops_per_token else None
        if rec and isinstance(rec["tokens_per_s"], (int, float)) and rec["tokens_per_s"] > 0:
            rates.append(rec["tokens_per_s"] * c.flops_per_token)
    return statistics.median(rates) if rates else None


def sweep_eta(m: Manifest, lives: dict[str, Live | None], rate: float | None) -> float | None:
    """Seconds until every cell still to train is trained (evaluations not counted): the running
    cells' ETAs and the pending ones at `rate`, on the local driver's slots (SLURM: every cell at
    once). None while a cell's time is unknown."""
    running = [lives.get(c.cell) for c in m.cells if c.state == "running"]
    if any(x is None or x.eta_s is None for x in running):
        return None
    if rate is None:  # no train line yet: the running cells' estimated speeds
        est = [lv.speed * c.flops_per_token for c in m.cells
               if (lv := lives.get(c.cell)) is not None and lv.speed and c.flops_per_token]
        rate = statistics.median(est) if est else None
    waiting = [c for c in m.cells if c.state == "pending"]
    if waiting and not rate:
        return None
    todo = [P.cell_seconds(c.arm, c.config or {}, c.tokens, rate / c.flops_per_token)
            for c in waiting if c.flops_per_token]
    slots = int((m.local or {}).get("jobs") or 0) or len(m.cells)
    return P.schedule([x.eta_s for x in running if x is not None and x.eta_s], todo, slots)


def dur(s: float | None) -> str:
    """Seconds as the trainer's dry run writes them; "?" when not known."""
    return "?" if s is None else backend.duration(s)


def table(m: Manifest, now: float | None = None, running_only: bool = False) -> str:
    """The status table `make sweep-status` prints (and, `running_only`, the local driver every
    PROGRESS_S: the cells training or evaluating). A running cell shows its phase, live step
    (its last metrics line), tokens/s and ETA (? until known); the head line the sweep's ETA."""
    rate = flop_rate(m)
    lives = {c.cell: live(c, rate, now) for c in m.cells}
    rows = [("cell", "arm", "run-id", "state", "phase", "step", "tok/s", "ETA", "job", "eval",
             "reason")]
    for c in m.cells:
        if running_only and lives[c.cell] is None:
            continue
        ev, lv = c.eval, lives[c.cell]
        reason = c.reason or (f"eval: {ev.reason}" if ev is not None and ev.state == "failed"
                              and ev.reason else "")
        step, tps, eta = str(c.step or "-"), "-", "-"
        if lv is not None and c.state == "running":
            step = f"{lv.step if lv.step is not None else '-'}/{lv.steps or '?'}"
            tps = f"{lv.tokens_per_s:.0f}" if lv.tokens_per_s else "-"
            eta = dur(lv.eta_s)
        pts = [p.state for p in c.points.values()]
        evs = (ev.state if ev is not None else "-") + (
            f" ({pts.count('done')}/{len(pts)} points)" if pts else "")
        rows.append((c.cell, c.arm, str(c.run_id), c.state, lv.phase if lv else "-", step, tps,
                     eta, str(c.job_id or "-"), evs, reason))
    n = m.counts()
    head = (f"sweep {m.name} ({m.launcher}): {len(m.cells)} cells: "
            + ", ".join(f"{n[s]} {s}" for s in STATES))
    ev_n = m.eval_counts()
    if ev_n:
        head += "; eval: " + ", ".join(f"{ev_n[s]} {s}" for s in STATES)
        if ev_n["failed"]:
            head += " (failed evaluations count as failures)"
    if n["running"]:
        head += f"; training ETA {dur(sweep_eta(m, lives, rate))}"
    return "\n".join([head, *P.columns(rows)])


def listing(results: Path | None = None) -> str:
    """`make sweeps`: one line per sweep under the results root, newest first: its name, when
    it last changed (its manifest or a run's metrics lines, UTC), cells trained (done in the
    manifest, or with a final checkpoint since) and failed, and its grid."""
    rows, root = [], sweeps_dir(results)
    for path in root.glob("*/manifest.json"):
        try:
            m = SweepDir(path.parent).manifest()
        except UsageError as e:
            rows.append((path.stat().st_mtime, (path.parent.name, "?", "?", one_line(e))))
            continue
        runs = {c.cell: RunDir(c.run) for c in m.cells if c.run_dir}
        times = [path.stat().st_mtime, *(r.metrics_path.stat().st_mtime for r in runs.values()
                                         if r.metrics_path.is_file())]
        g = m.grid
        failed = sum(c.state == "failed" for c in m.cells)
        done = sum(c.state == "done" or (c.cell in runs and runs[c.cell].finished)
                   for c in m.cells)
        rows.append((max(times), (
            m.name, dt.datetime.fromtimestamp(max(times), dt.timezone.utc).strftime(
                "%Y-%m-%d %H:%M UTC"),
            f"{done}/{len(m.cells)} trained"
            + (f", {failed} failed" if failed else ""),
            f"arms {','.join(dict.fromkeys(c.arm for c in m.cells)) or '-'}; kappa "
            f"{' '.join(map(kappa_label, g.get('kappa_bits') or [])) or '-'}; H "
            f"{' '.join(map(str, g.get('latent_bits') or [])) or '-'}; seeds "
            f"{' '.join(map(str, g.get('seeds') or [])) or '-'}; controls "
            f"{' '.join(g.get('controls') or []) or 'none'}")))
    if not rows:
        return f"no sweeps under {root} (make sweep starts one)"
    return "\n".join(P.columns([r for _, r in sorted(rows, key=lambda x: -x[0])]))


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
            m = sd.manifest()
            save(path, refresh(m, folder, probe(m.launcher, folder)))
    except SweepBusy:  # a driver is running: show its view plus runs finished since
        m = sd.manifest()
        jobs = probe(m.launcher, folder)
        for c in m.cells:  # every job is the driver's to watch; a finished run is done anyway
            c.reconcile(jobs, RunDir(c.run), {}, watched=True)
    return m
