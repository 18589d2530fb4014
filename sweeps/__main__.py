"""`python -m sweeps run ...` (make sweep) and `python -m sweeps status NAME` (make sweep-status).

Every input problem ends the command before anything is submitted, with one line on stderr:
`sweep: error: <what is wrong>` and exit code 2.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from common.text import one_line

from . import backend, manifest
from . import plan as P
from .cluster import load_cluster
from .errors import SweepError
from .grid import SweepSpec
from .launcher import run as launch

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
"""The grid flags' values when neither they nor a recipe are given."""
GRID_VARS = {"kappa": "KAPPA", "h": "H", "preset": "PRESET", "data": "DATA", "tokens": "TOKENS",
             "flops": "FLOPS", "controls": "CONTROLS"}
"""What a recipe sets and a make variable may not contradict (SEEDS may replace its seeds)."""
KEEP_EVAL_KEY = "keep_eval_checkpoints"
"""The trainer's key (<section>.<key>=n) that keeps n checkpoints evenly spaced by tokens."""


def keep_eval_key() -> str | None:
    """The full config key of keep_eval_checkpoints in this checkout ('logging.' or 'train.'),
    None when the trainer does not have it."""
    import dataclasses

    for section in ("logging", "train"):
        if KEEP_EVAL_KEY in {f.name for f in dataclasses.fields(backend.GROUPS[section])}:
            return f"{section}.{KEEP_EVAL_KEY}"
    return None


def _count(name: str, text: str, minimum: int) -> int | None:
    """'' -> None; an integer >= minimum; else SweepError naming the variable."""
    t = str(text or "").strip()
    if not t:
        return None
    if not t.isdigit() or int(t) < minimum:
        raise SweepError(f"{name}: {t!r} must be an integer >= {minimum}")
    return int(t)


TRUE_WORDS = ("1", "true", "yes")
FALSE_WORDS = ("0", "false", "no", "")
"""A boolean is read as make reads it (docs/MAKE.md); anything else is refused."""


def _flag(name: str, v: str | None) -> bool:
    """1/true/yes -> True; 0/false/no/empty -> False; else SweepError naming the variable."""
    t = str(v or "").strip()
    if t in TRUE_WORDS or t in FALSE_WORDS:
        return t in TRUE_WORDS
    raise SweepError(f"{name}: {t!r} is not a boolean; use 1/true/yes for true, 0/false/no or "
                     "empty for false")


def _recipe(a: argparse.Namespace) -> Any:
    """The recipe --recipe names (None without one); SweepError on a bad recipe or a grid flag
    that would contradict it."""
    if not a.recipe.strip():
        return None
    from . import recipe as R

    try:
        rec = R.load(a.recipe)
    except R.RecipeError as e:
        raise SweepError(f"RECIPE: {one_line(e)}") from e
    given = [var for k, var in GRID_VARS.items() if getattr(a, k) is not None]
    if given:
        raise SweepError(f"RECIPE={rec.name} sets the grid and the budget; {', '.join(given)} "
                         "cannot be given with it (SEEDS and OVERRIDES can)")
    return rec


def _recipe_eval(rec: Any) -> list[str]:
    """The recipe's evaluation arguments: one group (the tasks at their stock few-shot counts)."""
    runs = rec.eval_runs()
    if len(runs) != 1:
        raise SweepError(f"RECIPE={rec.name}: its tasks need {len(runs)} few-shot groups; a sweep "
                         "evaluates one group (give every task the stock count)")
    return runs[0]


def _recipe_spec(rec: Any, a: argparse.Namespace) -> SweepSpec:
    from . import recipe as R

    seeds = None
    if a.seeds is not None:
        seeds = SweepSpec.from_text(kappa="1", h="1", seeds=a.seeds).seeds
    gpu = a.gpu.strip() or None
    if gpu is not None and gpu not in R.GPU_TYPES:
        raise SweepError(f"GPU: {gpu!r} is not one of {', '.join(R.GPU_TYPES)}")
    try:
        return rec.sweep_spec(seeds=seeds, gpu=gpu, extra=shlex.split(a.overrides))
    except R.RecipeError as e:
        raise SweepError(f"RECIPE: {one_line(e)}") from e
    except ValueError as e:  # shlex
        raise SweepError(f"OVERRIDES: {e}") from e


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sweeps", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="plan, then submit the missing cells (DRY: plan only)")
    # grid flags default to None so that a recipe can tell them from defaults (GRID_DEFAULTS)
    r.add_argument("--kappa", default=None, help="free-bits thresholds in bits, e.g. '0.5 2' "
                   f"(default {GRID_DEFAULTS['kappa']!r})")
    r.add_argument("--h", default=None,
                   help=f"latent bits H (1..20), e.g. '8 16' (default {DEFAULT_H}; the paper's "
                        f"16 costs 4x the 1M baseline per token: slow on a CPU)")
    r.add_argument("--seeds", default=None, help="seeds, e.g. '0 1 2' (default '0'; with "
                   "--recipe: replaces the recipe's seeds)")
    r.add_argument("--preset", default=None, help="model preset (model.PRESETS; default 1M)")
    r.add_argument("--data", default=None, help="data config (stdlib, files, hf, ...)")
    r.add_argument("--tokens", default=None,
                   help=f"training tokens per cell (e.g. 2e6, 500k; default {DEFAULT_TOKENS}, "
                        f"minutes on a CPU; '' = train.py's own default)")
    r.add_argument("--flops", default=None, help="training FLOPs per cell instead of tokens")
    r.add_argument("--controls", default=None, help="'flops' and/or 'plus1' (equal-compute arms)")
    r.add_argument("--recipe", default="",
                   help="a recipe (sweeps/recipes/<name>.yaml or a file; docs/RECIPES.md): its "
                        "grid, training settings, evaluation tasks and points; the grid flags "
                        "above (but --seeds) cannot be given with it")
    r.add_argument("--gpu", default="", help="with --recipe: a GPU type (sweeps.recipe.GPU_TYPES)"
                   " whose micro-batch, parallelism and checkpointing the cells take")
    r.add_argument("--overrides", default="", help="extra hydra overrides for every cell")
    r.add_argument("--name", default="", help="sweep name (default: from the grid's content)")
    r.add_argument("--launcher", default="local", help="local | slurm")
    r.add_argument("--jobs", default="", help="local parallel jobs (default: one per core)")
    r.add_argument("--eval", default="", help="1: evaluate final checkpoints as further jobs")
    r.add_argument("--eval-args", default="", help="extra arguments for experiments.eval")
    r.add_argument("--eval-points", default="",
                   help="n: keep n evenly spaced checkpoints (train.keep_eval_checkpoints) and "
                        "evaluate each (needs EVAL=1; the paper's Table 3 and curves)")
    r.add_argument("--likelihood-rows", default=str(DEFAULT_LIKELIHOOD_ROWS),
                   help="validation rows for the chained likelihood (experiments.eval.likelihood) "
                        f"when EVAL=1 (default {DEFAULT_LIKELIHOOD_ROWS}; 0 = skip it)")
    r.add_argument("--dry", default="", help="1: print grid and compute, submit nothing")
    r.add_argument("--retry-failed", default="", help="1: also rerun failed cells")
    r.add_argument("--cluster", default="", help="cluster config (default sweeps/cluster.yaml)")
    s = sub.add_parser("status", help="table of pending, running, done and failed cells")
    s.add_argument("name")
    s.add_argument("--results", default="", help="results root (default FTBENCH_RESULTS)")
    e = sub.add_parser("eval-run", help=argparse.SUPPRESS)  # a chained eval job's own command
    e.add_argument("run")
    e.add_argument("--spec-ids", default="")
    e.add_argument("--points", action="store_true")
    e.add_argument("--likelihood-rows", type=int, default=None)
    e.add_argument("--point", type=int, default=None)  # a point job: that kept checkpoint only
    argv = list(sys.argv[1:] if argv is None else argv)
    final_argv: list[str] = []
    if argv[:1] == ["eval-run"] and "--" in argv:  # the final checkpoint's eval command
        i = argv.index("--")
        argv, final_argv = argv[:i], argv[i + 1:]
    a = ap.parse_args(argv)

    if a.cmd == "eval-run":
        if a.point is not None:
            return backend.eval_point(Path(a.run), a.point,
                                      [x for x in a.spec_ids.split(",") if x], final_argv)
        return backend.eval_chain(Path(a.run), [x for x in a.spec_ids.split(",") if x], a.points,
                            a.likelihood_rows, final_argv)
    try:
        if a.cmd == "status":
            if not a.name.strip():
                raise SweepError("NAME is required: make sweep-status NAME=<sweep>")
            print(manifest.status(a.name.strip(), Path(a.results) if a.results else None))
            return 0
        evaluate, dry = _flag("EVAL", a.eval), _flag("DRY", a.dry)
        retry_failed = _flag("RETRY_FAILED", a.retry_failed)
        rec = _recipe(a)
        if rec is None:
            if a.gpu.strip():
                raise SweepError("GPU: a GPU type is read from a recipe's micro-batch table; "
                                 "give RECIPE=<name> (or set train.micro_batch_size in OVERRIDES)")
            if (a.flops or "").strip() and a.tokens is None:
                a.tokens = ""  # FLOPS given: it is the budget
            for k, v in GRID_DEFAULTS.items():
                if getattr(a, k) is None:
                    setattr(a, k, v)
        elif evaluate:
            if not a.eval_points.strip():
                a.eval_points = str(rec.eval.points)
            a.eval_args = shlex.join(_recipe_eval(rec)) + " " + a.eval_args
        points = _count("EVAL_POINTS", a.eval_points, minimum=1)
        rows = _count("LIKELIHOOD_ROWS", a.likelihood_rows, minimum=0)
        if points:
            if not evaluate:
                raise SweepError(f"EVAL_POINTS={points} evaluates kept checkpoints: it needs "
                                 "EVAL=1")
            if points < 2:
                raise SweepError(f"EVAL_POINTS: {points} must be >= 2 (a curve needs two "
                                 "points; the final checkpoint is always evaluated)")
            key = keep_eval_key()
            if key is None:
                raise SweepError("EVAL_POINTS: this checkout's experiments/train/config.py has no "
                                 f"{KEEP_EVAL_KEY} key, so the trainer would keep no evenly "
                                 "spaced checkpoints to evaluate")
            a.overrides = f"{a.overrides} {key}={points}".strip()
        if rec is None:
            spec = SweepSpec.from_text(kappa=a.kappa, h=a.h, seeds=a.seeds, preset=a.preset,
                                       data=a.data, tokens=a.tokens, flops=a.flops,
                                       controls=a.controls, overrides=a.overrides)
        else:
            spec = _recipe_spec(rec, a)
        launcher = a.launcher.strip() or "local"
        if launcher not in ("local", "slurm"):
            raise SweepError(f"LAUNCHER: {launcher!r} is not local or slurm")
        jobs = a.jobs.strip()
        if jobs and (not jobs.isdigit() or int(jobs) < 1):
            raise SweepError(f"JOBS: {jobs!r} must be a positive integer")
        cluster = load_cluster(Path(a.cluster) if a.cluster else None) \
            if launcher == "slurm" else None
        try:
            eval_args = shlex.split(a.eval_args)
        except ValueError as e:
            raise SweepError(f"EVAL_ARGS: {e}") from e
        # the evaluation's arguments and task names are checked now, before any training
        parsed = backend.validate_eval_args(eval_args) if evaluate or eval_args else None
        p = P.plan(spec, a.name.strip() or None)
        if evaluate and parsed is not None:
            p.eval_specs = P.eval_specs(parsed, p)
            p.eval_points, p.likelihood_rows = points, rows or None
        if dry:
            print(P.dry_run_text(p))
            return 0
        from common.io import unwritable
        from common.paths import cache_dir, runs_dir

        for what, d in (("sweep", p.folder), ("runs", runs_dir()), ("cache", cache_dir())):
            if (why := unwritable(d)) is not None:  # before anything is submitted
                raise SweepError(f"{what} directory {d}: {why}; set FTBENCH_RESULTS (and "
                                 "FTBENCH_CACHE) to a writable directory")
        m = launch(p, launcher=launcher, jobs=int(jobs) if jobs else None,
                  evaluate=evaluate, eval_args=eval_args,
                  retry_failed=retry_failed, cluster=cluster)
        print(manifest.table(m))
        if launcher == "local":
            bad = [c for c in m["cells"] if c["state"] != "done"]
            bad_eval = [c for c in m["cells"] if evaluate
                        and (c.get("eval") or {}).get("state") != "done"]
            return 1 if bad or bad_eval else 0
        return 0
    except SweepError as e:
        print(f"sweep: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("sweep: interrupted; re-run the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    os.environ.setdefault("HYDRA_FULL_ERROR", "0")
    sys.exit(main())
