"""A sweep's plan: its cells composed with the trainer's config, its evaluation specs and the
dry-run text. Nothing here writes a file or submits a job.

    plan(spec, name)          compose every cell with train.py's config, run the shared-settings
                              guard, compute per-cell tokens/FLOPs
    eval_specs(args, plan)    {suite: spec} the chained evaluation of the cells will write
    dry_run_text(plan)        what `make sweep DRY=1` prints: the grid, FLOPs, the eval specs
                              and the costliest cell's memory and GPU time
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.errors import UsageError
from common.kappa import kappa_label
from common.paths import RunDir, SweepDir
from common.records import spec_id

from . import backend
from .grid import Cell, SweepSpec, expand, shared_settings, skipped_controls


def sweep_dir(results: Path, name: str) -> Path:
    """A sweep's folder under a results root (common.paths.SweepDir: its manifest, job folders
    and report)."""
    return SweepDir.of(name, results).path


@dataclass
class PlannedCell:
    cell: Cell
    config: dict[str, Any]
    run_id: str
    run_dir: Path
    tokens: float
    flops: float
    flops_per_token: float


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
                                   backend.flops_per_token(cfg)))
    ids = [p.run_id for p in planned]
    if len(set(ids)) != len(ids):
        dup = next(p.cell.name for p in planned if ids.count(p.run_id) > 1)
        raise UsageError(f"two cells resolve to the same config (run-id of {dup}); "
                         f"is an override masking an axis?")
    shared = shared_settings(cells, [p.config for p in planned], backend.IGNORED_PREFIXES)
    results = Path(planned[0].config["paths"]["results"])
    name = name or spec.default_name()
    if not all(ch.isalnum() or ch in "._-" for ch in name):
        raise UsageError(f"NAME: {name!r} may use letters, digits, '.', '_' and '-' only")
    return Plan(name, spec, sweep_dir(results, name), results, planned, shared)


# ------------------------------------------------------------------------------- eval spec
def eval_specs(args: argparse.Namespace, p: Plan) -> dict[str, dict[str, Any]]:
    """{suite: spec} the chained evaluation of this plan's cells will write."""
    # the evaluation window is the trained seq_len (experiments.eval.run.trained_context)
    lens = {(c.config.get("train") or {}).get("seq_len") for c in p.cells}
    return backend.planned_eval_specs(args, lens.pop() if len(lens) == 1 else None)


def combined_spec(specs: dict[str, dict[str, Any]] | None) -> dict[str, Any] | None:
    """The manifest's `eval_spec`: the suite's spec itself when there is one suite (so its
    spec_id is the eval files'), else their union with the per-suite specs inside (`suites`:
    {suite: spec}, so each suite's file is matched by its own spec_id)."""
    from common.records import EvalSpec

    if not specs:
        return None
    if len(specs) == 1:
        return next(iter(specs.values()))
    return EvalSpec.union({s: EvalSpec.from_json(sp) for s, sp in specs.items()}).to_json()


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
        return backend.gpu_rate(backend.compose(max(p.cells, key=lambda c: c.flops).cell))
    except ValueError:  # a UsageError too
        return None


def dry_run_text(p: Plan) -> str:
    rate = _rate(p)
    rows = [("cell", "arm", "kappa", "H", "seed", "run-id", "FLOPs/tok", "tokens", "FLOPs",
             *(("GPU-h",) if rate else ()), "status")]
    for c in p.cells:
        done = RunDir(c.run_dir).finished
        rows.append((c.cell.name, c.cell.arm,
                     kappa_label(c.cell.kappa_bits) if c.cell.kappa_bits is not None else "-",
                     str(c.cell.latent_bits or "-"), str(c.cell.seed), c.run_id,
                     human(c.flops_per_token), human(c.tokens), human(c.flops),
                     *((f"{c.flops / rate[0] / 3600:.3g}",) if rate else ()),
                     "done" if done else "to run"))
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(v.ljust(n) for v, n in zip(r, w, strict=True)).rstrip() for r in rows]
    todo = [c for c in p.cells if not RunDir(c.run_dir).finished]
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
    tail = (f"total: {len(p.cells)} cells, {human(sum(c.tokens for c in p.cells))} tokens, "
            f"{human(total)} FLOPs; to run: {len(todo)} cells, {human(left)} FLOPs\n{gpu}"
            f"manifest: {p.manifest_path}  (DRY=1: nothing submitted)")
    evl = []
    if p.eval_specs:
        evl = [f"eval (checked): {s} tasks {','.join(sp['tasks'])}, limit {sp['limit']}, "
               f"z {sp['z_mode']}, gen_tokens {sp['gen_tokens']}, spec_id {spec_id(sp)}"
               for s, sp in p.eval_specs.items()]
    skip = [f"skipped control: {why}" for why in skipped_controls(s).values()]
    return "\n".join([head, *lines, *skip, *evl, *cost_text(p), tail])


def cost_text(p: Plan) -> list[str]:
    """Memory per GPU, fit and GPU time of the sweep's costliest cell (the trainer's own dry-run
    estimate), so a GPU-hour is never spent on a cell that cannot fit."""
    if not p.cells:
        return []
    big = max(p.cells, key=lambda c: c.flops)
    est = backend.estimate_text(backend.compose(big.cell))
    if est is None:  # a stand-in trainer's config (tests)
        return []
    return [f"costliest cell {big.cell.name} (its own `make train DRY=1` gives more):",
            *("  " + ln for ln in est.splitlines())]
