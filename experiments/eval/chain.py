"""The chained evaluation of one finished run, resumable: the final checkpoint, then every kept
checkpoint without its eval files (EVAL_POINTS), then the validation likelihood.

A sweep (sweeps/) runs it as one job per cell after training; it knows nothing of manifests:

    chain_argv(...)                the job's command line (`<entry> RUN --spec-ids ... -- <argv>`)
    kept_checkpoints(run)          the checkpoints EVAL_POINTS evaluates, oldest first
    checkpoint_evals_missing(...)  those still lacking an eval file for some spec_id
    eval_chain(...)                run the chain; the first failing exit code, else 0
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from common import paths

LIKELIHOOD_MODULE = "experiments.eval.likelihood"


def chain_argv(run: Path, spec_ids: Sequence[str], points: bool, likelihood_rows: int | None,
               final_argv: Sequence[str], *, entry: Sequence[str]) -> list[str]:
    """`<entry> RUN --spec-ids a,b [--points] [--likelihood-rows n] -- <final eval argv>`;
    `entry` is the command that parses this (a sweep's `python -m sweeps eval-run`)."""
    out = [*entry, str(run), "--spec-ids", ",".join(spec_ids)]
    if points:
        out.append("--points")
    if likelihood_rows:
        out += ["--likelihood-rows", str(likelihood_rows)]
    return [*out, "--", *final_argv]


def kept_checkpoints(run: Path) -> list[tuple[int, Path]]:
    """The checkpoints EVAL_POINTS evaluates, oldest first: the trainer's
    `eval_step_<N>.pt` (logging.keep_eval_checkpoints: evenly spaced by tokens, outside the
    rotation); a run without any (trained before the key existed) offers its `step_<N>.pt`."""
    ckdir = paths.checkpoint_dir(run)
    return paths.eval_checkpoints(ckdir) or paths.step_checkpoints(ckdir)


def checkpoint_evals_missing(run: Path, spec_ids: Sequence[str]) -> list[tuple[int, Path]]:
    """Kept checkpoints (`kept_checkpoints`) lacking an eval file for some spec_id
    (`*.<spec_id>.step<N>.json`): what a resumed chain still has to evaluate."""
    out = []
    for step, ck in kept_checkpoints(run):
        if any(not list((run / "eval").glob(f"*.{sid}.step{step}.json")) for sid in spec_ids):
            out.append((step, ck))
    return out


def eval_chain(run: Path, spec_ids: Sequence[str], points: bool, likelihood_rows: int | None,
               final_argv: Sequence[str]) -> int:
    """Run the chained evaluation of one cell, resumably: the final checkpoint (the eval itself
    skips a spec whose file exists), then every kept checkpoint without its files (EVAL_POINTS;
    the same argv with the checkpoint in place of the run dir), then the likelihood file unless
    present. Returns the first failing exit code (0 when all succeeded)."""

    def call(argv: Sequence[str], what: str) -> int:
        rc = subprocess.call(list(argv))
        if rc:
            print(f"sweep: error: {what} exited with code {rc}", file=sys.stderr)
        return rc

    final_argv = list(final_argv)
    if rc := call(final_argv, f"evaluation of {run}"):
        return rc
    if points:
        i = final_argv.index(str(run))
        for step, ck in checkpoint_evals_missing(run, spec_ids):
            argv = [*final_argv[:i], str(ck), *final_argv[i + 1:]]
            if rc := call(argv, f"evaluation of {ck} (step {step})"):
                return rc
    if likelihood_rows:
        if not list((run / "eval").glob("likelihood.*.json")):
            return call([sys.executable, "-m", LIKELIHOOD_MODULE, str(run),
                         "--max-rows", str(likelihood_rows)], f"likelihood of {run}")
    return 0
