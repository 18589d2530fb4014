"""The typed, in-process front door of sweeps: what `make sweep` / `make sweep-status` (through
`python -m sweeps`) and every pipeline (pipelines/) call: a SweepRequest (the make variables,
typed: grid text as make passes it, so a bad value is refused naming its variable) to `plan`,
`dry_run`, `run` (submits what is missing; `on_event` receives the driver's typed events) and
`status`. Every input problem is a UsageError (one line naming the value) raised before anything is
written or submitted.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from common.errors import UsageError
from common.paths import SweepDir
from common.text import one_line

from . import backend
from . import checks as C
from . import grid as G
from . import plan as P
from .cluster import CLUSTER_FILE, ClusterConfig, load_cluster
from .driver import Event, JobEnded, Planned, ignore_event
from .driver import run as drive
from .grid import SweepSpec
from .launcher import make_launcher
from .manifest import Manifest, ManifestCell, table
from .manifest import status as _status

__all__ = ["DEFAULT_LIKELIHOOD_ROWS", "Event", "JobEnded", "Planned", "ManifestCell",
           "UsageError", "Manifest", "SweepRequest", "SweepRun", "dry_run", "ignore_event",
           "load", "load_recipe", "plan", "recipe_eval", "recipe_spec", "run",
           "status", "table"]

DEFAULT_H = "8"
"""CPU-sized default: H=16 (the paper's) makes the binary mapper work over 65536 codes per
token, about 4x the FLOPs of the whole 1M baseline."""
DEFAULT_TOKENS = "131072"
"""32 optimizer steps of train.py's default batch (16 x 256): a CPU-sized default."""
DEFAULT_LIKELIHOOD_ROWS = 8
"""Validation rows the chained likelihood uses by default (measured: 8 rows of 256 tokens took
62 s for a 1M Free Transformer, k = 1, 8, 64, on 2 shared CPU cores; the baseline 10 s). The
rows are recorded in the file's spec."""
GRID_DEFAULTS = {"kappa": "0.5 2 4", "h": DEFAULT_H, "seeds": "0", "preset": "1M",
                 "data": "stdlib", "tokens": DEFAULT_TOKENS, "flops": "", "controls": ""}
"""The grid's values when neither they nor a recipe are given."""
GRID_VARS = {"kappa": "KAPPA", "h": "H", "preset": "PRESET", "data": "DATA", "tokens": "TOKENS",
             "flops": "FLOPS", "controls": "CONTROLS"}
"""What a recipe sets and a make variable may not contradict (SEEDS may replace its seeds)."""
KEEP_EVAL_KEY = "logging.keep_eval_checkpoints"
"""The trainer's key (=n) that keeps n checkpoints evenly spaced by tokens."""


@dataclass(frozen=True)
class SweepRequest:
    """What `make sweep` asks for, typed where it is made: a value given as text (what make
    passes: KAPPA="0.5 2") is parsed here, once, into `grid` (SweepSpec.from_text: kappa by
    common.kappa, the rest by sweeps.grid); a grid value not given (None) takes the grid's
    default, or the recipe's. Bad input is one UsageError line naming the variable, raised
    before anything else happens."""

    kappa: tuple[float, ...] | str | None = None
    h: tuple[int, ...] | str | None = None
    seeds: tuple[int, ...] | str | None = None
    """With a recipe: replaces the recipe's seeds."""
    preset: str | None = None
    data: str | None = None
    tokens: float | str | None = None
    """'' = train.py's own default."""
    flops: float | str | None = None
    controls: tuple[str, ...] | str | None = None
    """The controls' arm names (text: their CONTROLS names, "flops plus1")."""
    recipe: str = ""
    """A recipe (sweeps/recipes/<name>.yaml or a file): its grid, settings, tasks and points;
    the grid values above (but seeds) cannot be given with it."""
    gpu: str = ""
    """With a recipe: the GPU type whose micro-batch, parallelism and checkpointing cells take."""
    overrides: tuple[str, ...] | str = ()
    """Extra hydra overrides for every cell (text: split as a shell splits it)."""
    name: str = ""
    """The sweep's name ('' = from the grid's content)."""
    launcher: str = "local"
    jobs: int | None = None
    """Local jobs at once (None: one per core)."""
    cluster: str = ""
    """The cluster file (LAUNCHER=slurm; '' = FTBENCH_CLUSTER or sweeps/cluster.yaml)."""
    evaluate: bool = False
    """Evaluate every final checkpoint (and the points) as further jobs."""
    eval_args: tuple[str, ...] | str = ()
    """Arguments for experiments.eval (text: split as a shell splits it), checked before
    anything trains."""
    eval_points: int | None = None
    """Keep this many evenly spaced checkpoints and evaluate each (needs evaluate)."""
    likelihood_rows: int | None = DEFAULT_LIKELIHOOD_ROWS
    """Validation rows for the chained likelihood when evaluating (0 or None: skip it)."""
    retry_failed: bool = False
    grid: SweepSpec | None = field(default=None, init=False)
    """The grid values above, typed and checked (None with a recipe: its grid)."""

    def __post_init__(self) -> None:
        def put(key: str, value: Any) -> None:
            object.__setattr__(self, key, value)

        recipe = self.recipe.strip()
        given = [var for k, var in GRID_VARS.items() if getattr(self, k) is not None]
        if recipe and given:
            raise UsageError(f"RECIPE={recipe} sets the grid and the budget; {', '.join(given)} "
                             "cannot be given with it (SEEDS and OVERRIDES can)")
        if not recipe:
            if self.gpu.strip():
                raise UsageError("GPU: a GPU type is read from a recipe's micro-batch table; "
                                 "give RECIPE=<name> (or set train.micro_batch_size in "
                                 "OVERRIDES)")
            if self.tokens is None and str(self.flops or "").strip():
                put("tokens", "")  # FLOPS given: it is the budget
            put("grid", SweepSpec.from_text(**{  # type: ignore[arg-type]
                k: d if (v := getattr(self, k)) is None else v
                for k, d in GRID_DEFAULTS.items()}, overrides=self.overrides))
        if self.seeds is not None:
            put("seeds", tuple(G.parse_ints(self.seeds, "SEEDS")))
        put("overrides", G.split_overrides(self.overrides))
        try:
            put("eval_args", tuple(shlex.split(self.eval_args) if isinstance(self.eval_args, str)
                                   else self.eval_args))
        except ValueError as e:
            raise UsageError(f"EVAL_ARGS: {e}") from None
        put("name", self.name.strip())
        if not all(ch.isalnum() or ch in "._-" for ch in self.name):
            raise UsageError(f"NAME: {self.name!r} may use letters, digits, '.', '_' and '-' "
                             "only")
        put("launcher", self.launcher.strip() or "local")
        if self.launcher not in ("local", "slurm"):
            raise UsageError(f"LAUNCHER: {self.launcher!r} is not local or slurm")
        if self.jobs is not None and self.jobs < 1:
            raise UsageError(f"JOBS: {self.jobs!r} must be a positive integer")


@dataclass
class SweepRun:
    """What `run` did: the sweep's typed manifest after submitting."""

    manifest: Manifest
    launcher: str
    evaluate: bool

    @property
    def ok(self) -> bool:
        """Local: every cell done and, with EVAL=1, evaluated (a failed evaluation is a failure).
        SLURM: submitted (the jobs run on; `status` follows them)."""
        if self.launcher != "local":
            return True
        m = self.manifest
        return all(c.state == "done" for c in m.cells) and not any(
            self.evaluate and (c.eval is None or c.eval.state != "done") for c in m.cells)


def load_recipe(name: str) -> Any:
    """The recipe RECIPE= names (None without one); UsageError (one line) on a bad recipe."""
    if not name.strip():
        return None
    from . import recipe as R

    try:
        return R.load(name.strip())
    except ValueError as e:  # a UsageError (the request, or composing it)
        raise UsageError(f"RECIPE: {one_line(e)}") from e


def recipe_eval(rec: Any) -> list[str]:
    """The recipe's evaluation arguments: one group (the tasks at their stock few-shot counts)."""
    runs = rec.eval_runs()
    if len(runs) != 1:
        raise UsageError(f"RECIPE={rec.name}: its tasks need {len(runs)} few-shot groups; a sweep "
                         "evaluates one group (give every task the stock count)")
    return runs[0]


def recipe_spec(rec: Any, req: SweepRequest,
                overrides: tuple[str, ...] | None = None) -> SweepSpec:
    """The recipe's grid with the request's seeds, GPU type and overrides."""
    from . import recipe as R

    gpu = req.gpu.strip() or None
    if gpu is not None and gpu not in R.GPU_TYPES:
        raise UsageError(f"GPU: {gpu!r} is not one of {', '.join(R.GPU_TYPES)}")
    try:
        return rec.sweep_spec(seeds=req.seeds, gpu=gpu,
                              extra=req.overrides if overrides is None else overrides)
    except UsageError as e:
        raise UsageError(f"RECIPE: {one_line(e)}") from e


@dataclass
class _Resolved:
    plan: P.Plan
    eval_args: list[str]
    cluster: ClusterConfig | None
    cluster_file: str | None = None


WORLD_KEY = "train.plan_world_size"


def _cluster_world(overrides: tuple[str, ...], cluster: ClusterConfig,
                   file: str) -> tuple[str, ...]:
    """The cluster file is the source of the world size: every cell plans for its nodes x GPUs
    per node (the ranks a training job gets), not the recipe's train.gpus; a different world
    asked for in OVERRIDES (GPUS=) is refused in one line."""
    given = [o for o in overrides if o.startswith(f"{WORLD_KEY}=")]
    n = cluster.tasks
    if given and given[-1].split("=", 1)[1].strip() != str(n):
        raise UsageError(f"{given[-1]} (GPUS=) but {file} gives {cluster.or_default('nodes')} "
                         f"node(s) x {max(1, int(cluster.or_default('gpus_per_node')))} GPU(s) "
                         f"= {n}: change nodes or gpus_per_node there, or leave GPUS out")
    return (*overrides, f"{WORLD_KEY}={n}")


def _resolve(req: SweepRequest) -> _Resolved:
    """The request planned: every UsageError before anything is written."""
    rec = load_recipe(req.recipe)
    eval_args, eval_points, overrides = req.eval_args, req.eval_points, req.overrides
    if rec is not None and req.evaluate:
        eval_points = eval_points or rec.eval.points
        eval_args = (*recipe_eval(rec), *eval_args)
    if eval_points:
        if not req.evaluate:
            raise UsageError(f"EVAL_POINTS={eval_points} evaluates kept checkpoints: it needs "
                             "EVAL=1")
        if eval_points < 2:
            raise UsageError(f"EVAL_POINTS: {eval_points} must be >= 2 (a curve needs two "
                             "points; the final checkpoint is always evaluated)")
        overrides = (*overrides, f"{KEEP_EVAL_KEY}={eval_points}")
    cluster = file = None
    if req.launcher == "slurm" or req.cluster.strip():  # CLUSTER= is read for a local dry run
        # too: its checks and its world; `file` as the messages name it
        cluster = load_cluster(Path(req.cluster) if req.cluster else None)
        file = req.cluster.strip() or os.environ.get("FTBENCH_CLUSTER") or str(CLUSTER_FILE)
        overrides = _cluster_world(overrides, cluster, file)
    spec = recipe_spec(rec, req, overrides) if rec is not None else replace(
        req.grid, overrides=overrides)  # type: ignore[arg-type]  # set without a recipe
    # the evaluation's arguments and task names are checked now, before any training
    parsed = backend.validate_eval_args(eval_args) if req.evaluate or eval_args else None
    p = P.plan(spec, req.name or None)
    if cluster is not None and (why := C.world_refusal(p, cluster, str(file))):
        raise UsageError(why)
    if req.evaluate and parsed is not None:
        p.eval_specs = P.eval_specs(parsed, p)
        p.eval_points, p.likelihood_rows = eval_points, req.likelihood_rows or None
    return _Resolved(p, list(eval_args), cluster, file)


def plan(req: SweepRequest) -> P.Plan:
    """Every cell composed and checked, the evaluation attached (EVAL=1); nothing written."""
    return _resolve(req).plan


def dry_run(req: SweepRequest) -> str:
    """What `make sweep DRY=1` prints: the grid, FLOPs, the eval specs, the costliest cell,
    and the pre-submission checks (sweeps.checks) against the cluster file or this host."""
    r = _resolve(req)
    cs = C.checks(r.plan, r.cluster, r.cluster_file)
    if r.cluster is None:  # a local plan: this host's limits, said only when they fail
        cs = [c for c in cs if not c.ok]
    from .launcher import local_jobs, visible_gpus

    local = local_jobs(req.jobs or len(visible_gpus()) or None) \
        if req.launcher == "local" else None
    return "\n".join([P.dry_run_text(r.plan, local), *C.text(cs)])


def run(req: SweepRequest, *, log: Callable[[str], None] = print,
        on_event: Callable[[Event], None] = ignore_event,
        executor_factory: Callable[[Path], Any] | None = None) -> SweepRun:
    """Plan, check the directories, then submit the missing cells through the launcher: local
    blocks until they end, slurm returns once submitted. Returns the typed manifest."""
    r = _resolve(req)
    p, kind = r.plan, req.launcher
    # before anything is written or submitted: the checks the dry run lists (a local run
    # checks this host's limits only: its cluster file, if any, is not where the cells run)
    C.refuse(C.checks(p, r.cluster if kind == "slurm" else None, r.cluster_file))
    launcher = make_launcher(kind, SweepDir(p.folder).jobs_dir, jobs=req.jobs, cluster=r.cluster,
                             job_name=f"sweep-{p.name}", executor_factory=executor_factory)
    from common.io import unwritable
    from common.paths import cache_dir, runs_dir

    for what, d in (("sweep", p.folder), ("runs", runs_dir()), ("cache", cache_dir())):
        if (why := unwritable(d)) is not None:  # before anything is submitted
            raise UsageError(f"{what} directory {d}: {why}; set FTBENCH_RESULTS (and "
                             "FTBENCH_CACHE) to a writable directory")
    m = drive(p, launcher, evaluate=req.evaluate, eval_args=r.eval_args,
              retry_failed=req.retry_failed, log=log, on_event=on_event)
    return SweepRun(m, launcher.kind, req.evaluate)


def status(name: str, results: Path | None = None) -> Manifest:
    """The sweep's typed manifest, refreshed from facts; UsageError when there is none."""
    if not name.strip():
        raise UsageError("NAME is required: make sweep-status NAME=<sweep>")
    return _status(name.strip(), results)


def load(name: str, results: Path | None = None) -> Manifest | None:
    """The sweep's typed manifest as written (None before its first run); nothing refreshed."""
    sd = SweepDir.of(name, results)
    return sd.manifest() if sd.exists() else None

