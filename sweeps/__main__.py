"""`python -m sweeps run ...` (make sweep), `python -m sweeps status NAME` (make sweep-status) and
`python -m sweeps list` (make sweeps): the command line of the front door (sweeps/api.py), which
pipelines call in-process.

Every input problem ends the command before anything is submitted, with one line on stderr:
`sweep: error: <what is wrong>` and exit code 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from common.errors import ArgParser, cli

from . import api, backend
from .api import DEFAULT_H, DEFAULT_LIKELIHOOD_ROWS, DEFAULT_TOKENS, GRID_DEFAULTS
from .grid import parse_count
from .manifest import listing

BOOL = {"choices": ("0", "1"), "default": "0"}
"""EVAL, DRY, RETRY_FAILED: make reads the words (docs/MAKE.md) and passes 1 or 0."""


def request(a: argparse.Namespace) -> tuple[api.SweepRequest, bool]:
    """The command line's `run` arguments as the front door's request, and DRY; UsageError on a
    value the text itself rules out (the request's meaning is checked by api.plan)."""
    evaluate, dry, retry_failed = a.eval == "1", a.dry == "1", a.retry_failed == "1"
    jobs = parse_count("JOBS", a.jobs, minimum=1)
    points = parse_count("EVAL_POINTS", a.eval_points, minimum=1)
    rows = parse_count("LIKELIHOOD_ROWS", a.likelihood_rows, minimum=0)
    req = api.SweepRequest(
        kappa=a.kappa, h=a.h, seeds=a.seeds, preset=a.preset, data=a.data, tokens=a.tokens,
        flops=a.flops, controls=a.controls, recipe=a.recipe, gpu=a.gpu, overrides=a.overrides,
        name=a.name, launcher=a.launcher, jobs=jobs,
        cluster=a.cluster, evaluate=evaluate, eval_args=a.eval_args, eval_points=points,
        likelihood_rows=rows, retry_failed=retry_failed)
    return req, dry


def parser() -> argparse.ArgumentParser:
    ap = ArgParser(prog="python -m sweeps", description=__doc__)
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
    r.add_argument("--eval", **BOOL, help="1: evaluate final checkpoints as further jobs")
    r.add_argument("--eval-args", default="", help="extra arguments for experiments.eval")
    r.add_argument("--eval-points", default="",
                   help="n: keep n evenly spaced checkpoints (logging.keep_eval_checkpoints) and "
                        "evaluate each (needs EVAL=1; the paper's Table 3 and curves)")
    r.add_argument("--likelihood-rows", default=str(DEFAULT_LIKELIHOOD_ROWS),
                   help="validation rows for the chained likelihood (experiments.eval.likelihood) "
                        f"when EVAL=1 (default {DEFAULT_LIKELIHOOD_ROWS}; 0 = skip it)")
    r.add_argument("--dry", **BOOL, help="1: print grid and compute, submit nothing")
    r.add_argument("--retry-failed", **BOOL, help="1: also rerun failed cells")
    r.add_argument("--cluster", default="", help="cluster config (default sweeps/cluster.yaml)")
    s = sub.add_parser("status", help="table of pending, running, done and failed cells")
    s.add_argument("name")
    ls = sub.add_parser("list", help="the sweeps under the results root, newest first")
    for x in (s, ls):
        x.add_argument("--results", default="", help="results root (default FTBENCH_RESULTS)")
    e = sub.add_parser("eval-run", help=argparse.SUPPRESS)  # a chained eval job's own command
    e.add_argument("run")
    e.add_argument("--spec-ids", default="")
    e.add_argument("--points", action="store_true")
    e.add_argument("--likelihood-rows", type=int, default=None)
    e.add_argument("--point", type=int, default=None)  # a point job: that kept checkpoint only
    return ap


def next_commands(name: str, launcher: str, ok: bool) -> str:
    """The last lines of `make sweep`: what to run next."""
    if launcher != "local":
        return (f"next: make sweep-status NAME={name}   (the jobs run on; re-run the same "
                f"command to submit what is missing)\n      make report NAME={name}   (once "
                "they are done; a partial sweep works)")
    return (f"next: make report NAME={name}   (the HTML report"
            + ("" if ok else "; a partial sweep works, each missing cell says why") + ")\n"
            f"      make sweep-status NAME={name}   (the cells' states)"
            + ("" if ok else "\n      re-run the same command to resume what is unfinished "
               "(RETRY_FAILED=1 also reruns failed cells)"))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    final_argv: list[str] = []
    if argv[:1] == ["eval-run"] and "--" in argv:  # the final checkpoint's eval command
        i = argv.index("--")
        argv, final_argv = argv[:i], argv[i + 1:]

    def body() -> int:
        a = parser().parse_args(argv)
        results = Path(a.results) if getattr(a, "results", "") else None
        if a.cmd == "eval-run":
            ids = [x for x in a.spec_ids.split(",") if x]
            if a.point is not None:
                return backend.eval_point(Path(a.run), a.point, ids, final_argv)
            return backend.eval_chain(Path(a.run), ids, a.points, a.likelihood_rows, final_argv)
        if a.cmd == "list":
            print(listing(results))
            return 0
        if a.cmd == "status":
            print(api.table(api.status(a.name, results)))
            return 0
        req, dry = request(a)
        if dry:
            print(api.dry_run(req))
            return 0
        done = api.run(req)
        print(api.table(done.manifest))
        print(next_commands(done.manifest.name, done.launcher, done.ok))
        return 0 if done.ok else 1

    return cli("sweep", body)


if __name__ == "__main__":
    os.environ.setdefault("HYDRA_FULL_ERROR", "0")
    sys.exit(main())
