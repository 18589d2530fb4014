"""A sweep's plan: its cells composed with the trainer's config (the shared-settings guard
run, per-cell tokens and FLOPs), its evaluation specs, the dry-run text, and the one rule for a
cell's time and a sweep's over its slots (`cell_seconds`, `schedule`: the dry run's, and the
ETAs of sweeps.manifest.live). Nothing here writes a file or submits a job.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.arms import find as find_arm
from common.errors import UsageError
from common.kappa import kappa_label
from common.paths import RunDir, SweepDir
from common.records import spec_id

from . import backend
from .grid import Cell, SweepSpec, expand, shared_settings, skipped_controls


@dataclass
class PlannedCell:
    cell: Cell
    config: dict[str, Any]
    run_id: str
    run_dir: Path
    tokens: float
    flops: float
    flops_per_token: float
    cfg: Any = None
    """The composed training config (backend.compose), which the dry run and checks read."""


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
        return SweepDir(self.folder).manifest_path

    @property
    def todo(self) -> list[PlannedCell]:
        """The cells whose run has no final checkpoint yet."""
        return [c for c in self.cells if not RunDir(c.run_dir).finished]

    @property
    def costliest(self) -> PlannedCell:
        """The cell with the most training FLOPs (the dry run's and the checks' reference)."""
        return max(self.cells, key=lambda c: c.flops)


def plan(spec: SweepSpec, name: str | None = None) -> Plan:
    """Compose and check every cell; raises UsageError (one line) on any problem."""
    cells = expand(spec)
    planned: list[PlannedCell] = []
    for c in cells:
        cfg = backend.compose(c)
        try:
            tokens, flops = backend.planned(cfg)
        except UsageError as e:
            raise UsageError(f"{c.name}: {e}") from e
        planned.append(PlannedCell(c, backend.to_dict(cfg), backend.run_id(cfg),
                                   backend.run_dir(cfg), tokens, flops,
                                   backend.flops_per_token(cfg), cfg))
    ids = [p.run_id for p in planned]
    if len(set(ids)) != len(ids):
        dup = next(p.cell.name for p in planned if ids.count(p.run_id) > 1)
        raise UsageError(f"two cells resolve to the same config (run-id of {dup}); "
                         f"is an override masking an axis?")
    shared = shared_settings(cells, [p.config for p in planned], backend.IGNORED_PREFIXES)
    results = Path(planned[0].config["paths"]["results"])
    name = name or spec.default_name()
    return Plan(name, spec, SweepDir.of(name, results).path, results, planned, shared)


# ------------------------------------------------------------------------------- eval spec
def eval_specs(args: argparse.Namespace, p: Plan) -> dict[str, dict[str, Any]]:
    """{suite: spec} the chained evaluation of this plan's cells will write."""
    # the evaluation window is the trained seq_len (experiments.eval.run.trained_context)
    lens = {(c.config.get("train") or {}).get("seq_len") for c in p.cells}
    return backend.planned_eval_specs(args, lens.pop() if len(lens) == 1 else None)


# ------------------------------------------------------------------------------- time
VAL_PASS = 1 / 3
"""A validation token costs about one forward pass: a third of a training token (forward and
backward)."""


def passes(arm: str) -> int:
    """Forward passes a validation token costs an arm's model (a latent arm scores it with Z
    from the prior and from the encoder)."""
    a = find_arm(arm)
    return 2 if a is not None and a.latent else 1


def validations(config: dict[str, Any], tokens: float | None) -> tuple[int | None, list[int],
                                                                        float]:
    """(steps, the steps that validate, tokens per validation) of a run's resolved config: step
    0, every logging.val_every steps, and the last (the trainer's `val_due`)."""
    tr, lg = config.get("train") or {}, config.get("logging") or {}
    per_step = (tr.get("batch_size") or 0) * (tr.get("seq_len") or 0)
    if not per_step or not tokens:
        return None, [], 0.0
    steps = max(1, round(tokens / per_step))
    every = int(lg.get("val_every") or 0)
    vals = sorted({0, steps, *(range(every, steps, every) if every > 0 else ())})
    return steps, vals, float((config.get("data") or {}).get("val_tokens") or 0)


def cell_seconds(arm: str, config: dict[str, Any], tokens: float | None, tokens_per_s: float,
                 from_step: int = 0, from_tokens: float = 0.0) -> float:
    """Seconds a run still trains from `from_step` at `tokens_per_s`: its remaining tokens and
    its remaining validations at VAL_PASS of a training token each (start-up not counted). The
    one rule behind a dry run's time on this machine (at its measured rate) and a running
    sweep's ETAs (at the rate its metrics lines report: sweeps.manifest.live)."""
    _, vals, val_tokens = validations(config, tokens)
    left = max(0.0, float(tokens or 0) - from_tokens)
    n_val = sum(v >= from_step for v in vals)
    return (left + n_val * val_tokens * passes(arm) * VAL_PASS) / tokens_per_s


def schedule(busy: list[float], todo: list[float], slots: int) -> float:
    """Wall seconds until `slots` workers end: `busy` the ones at work (their seconds left),
    `todo` the jobs waiting, taken longest first by the first worker free (the local driver's
    order)."""
    free = sorted([*busy, *[0.0] * max(0, slots - len(busy))])
    for d in sorted(todo, reverse=True):
        free[0] += d
        free.sort()
    return max(free, default=0.0)


def columns(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows as aligned text columns (the dry run's, the status table's, the sweeps list)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]


# ------------------------------------------------------------------------------- dry run
def human(x: float) -> str:
    for unit, v in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= v:
            return f"{x / v:.3g}{unit}"
    return f"{x:.3g}"


def _rate(p: Plan) -> tuple[float, int, str, str] | None:
    """The sweep's GPU rate and world (backend.gpu_rate of its costliest cell; every cell shares
    the world and the MFU assumption), None for a stand-in trainer or an unplannable world."""
    if not p.cells:
        return None
    try:
        return backend.gpu_rate(p.costliest.cfg)
    except ValueError:  # a UsageError too
        return None


def local_seconds(p: Plan, threads: int) -> tuple[dict[str, float], str] | None:
    """Each cell's time on this machine as one local job with `threads` threads ({cell: s}, and
    where the rate comes from): its tokens and validations (`cell_seconds`) at the trainer's
    own measured rate (backend.local_rate) of the costliest cell's model, as FLOP/s: the other
    cells at that FLOP/s and their own FLOPs per token (one model timed, not one per cell).
    None when no rate can be had (a stand-in trainer, a model too large to time)."""
    if not p.cells:
        return None
    big = max(p.cells, key=lambda c: c.flops_per_token)
    got = backend.local_rate(big.cfg, threads)
    if got is None:
        return None
    flop_s = got[0] * big.flops_per_token
    return {c.cell.name: cell_seconds(c.cell.arm, c.config, c.tokens,
                                      flop_s / c.flops_per_token) for c in p.cells}, (
        f"{got[0]:,.0f} tokens/s for {big.cell.name} ({got[1]}; the other cells at its "
        "FLOP/s)")


def dry_run_text(p: Plan, local: tuple[int, int] | None = None) -> str:
    """What `make sweep DRY=1` prints; `local` = (jobs at once, threads each) of a local sweep,
    whose cells are then timed on this machine."""
    rate = _rate(p)
    here = local_seconds(p, local[1]) if local else None
    rows = [("cell", "arm", "kappa", "H", "seed", "run-id", "FLOPs/tok", "tokens", "FLOPs",
             *(("GPU-h",) if rate else ()), *(("time here",) if here else ()), "status")]
    todo = p.todo
    for c in p.cells:
        rows.append((c.cell.name, c.cell.arm,
                     kappa_label(c.cell.kappa_bits) if c.cell.kappa_bits is not None else "-",
                     str(c.cell.latent_bits or "-"), str(c.cell.seed), c.run_id,
                     human(c.flops_per_token), human(c.tokens), human(c.flops),
                     *((f"{c.flops / rate[0] / 3600:.3g}",) if rate else ()),
                     *((backend.duration(here[0][c.cell.name]),) if here else ()),
                     "to run" if any(c is t for t in todo) else "done"))
    s = p.spec
    head = (f"sweep {p.name}: preset {s.preset}, data {s.data}, kappa "
            f"{' '.join(map(kappa_label, s.kappa_bits))}, H {' '.join(map(str, s.latent_bits))}, "
            f"seeds {' '.join(map(str, s.seeds))}, controls {' '.join(s.controls) or 'none'}")
    total = sum(c.flops for c in p.cells)
    left = sum(c.flops for c in todo)
    gpu = ""
    if rate:
        gh, n = left / rate[0] / 3600, rate[1]
        gpu = (f"GPU time to run: {gh:.4g} GPU-hours = {gh / n:.4g} h wall on {n} GPU(s) "
               f"({rate[2]}), at {rate[0] / 1e12:.4g} TFLOP/s per GPU sustained (MFU x "
               f"train.gpu_peak_tflops; MFU {rate[3]}); all cells "
               f"{total / rate[0] / 3600:.4g} GPU-hours\n")
    if local and here:
        wall = schedule([], [here[0][c.cell.name] for c in todo], local[0])
        gpu += (f"time on this machine to run: {backend.duration(wall)} for {len(todo)} cell(s), "
                f"{local[0]} at once with {local[1]} thread(s) each (every cell: its tokens and "
                f"validations at {here[1]}; start-up, a first corpus build and evaluations not "
                "counted)\n")
    elif local:
        gpu += ("time on this machine: not estimated (a model this size is not timed here; "
                "state train.cpu_tokens_per_s in OVERRIDES)\n")
    tail = (f"total: {len(p.cells)} cells, {human(sum(c.tokens for c in p.cells))} tokens, "
            f"{human(total)} FLOPs; to run: {len(todo)} cells, {human(left)} FLOPs\n{gpu}"
            f"manifest: {p.manifest_path}  (DRY=1: nothing submitted)")
    evl = []
    if p.eval_specs:
        for name, sp in p.eval_specs.items():
            evl += [f"eval (checked): {name} tasks {','.join(sp['tasks'])}, limit "
                    f"{sp['limit']}, z {sp['z_mode']}, gen_tokens {sp['gen_tokens']}, spec_id "
                    f"{spec_id(sp)}", *backend.limit_lines(sp["tasks"], sp["limit"])]
    skip = [f"skipped control: {why}" for why in skipped_controls(s).values()]
    return "\n".join([head, *columns(rows), *skip, *evl, *cost_text(p), tail])


def cost_text(p: Plan) -> list[str]:
    """Memory per GPU, fit and GPU time of the sweep's costliest cell (the trainer's own dry-run
    estimate), so a GPU-hour is never spent on a cell that cannot fit."""
    if not p.cells:
        return []
    big = p.costliest
    est = backend.estimate_text(big.cfg)
    if est is None:  # a stand-in trainer's config (tests)
        return []
    return [f"costliest cell {big.cell.name} (its own `make train DRY=1` gives more):",
            *("  " + ln for ln in est.splitlines())]
