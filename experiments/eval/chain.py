"""The chained evaluation of one finished run, resumable (`eval_chain`: the final checkpoint,
then every kept checkpoint without its eval files, then the validation likelihood), and the
evaluation of one kept checkpoint while the run still trains (`eval_point`). A point is
evaluated under an exclusive lock (`point_lock`) and its files looked for again once held, so
no checkpoint is evaluated twice.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from common.io import flocked
from common.paths import RunDir

LIKELIHOOD_MODULE = "experiments.eval.likelihood"


def _run(run: RunDir | Path) -> RunDir:
    return run if isinstance(run, RunDir) else RunDir(Path(run))


def chain_argv(run: RunDir | Path, spec_ids: Sequence[str], points: bool,
               likelihood_rows: int | None, final_argv: Sequence[str], *, entry: Sequence[str],
               point: int | None = None) -> list[str]:
    """`<entry> RUN --spec-ids a,b [--points] [--likelihood-rows n] -- <final eval argv>`;
    `entry` is the command that parses this (a sweep's `python -m sweeps eval-run`). With
    `point=N`: `<entry> RUN --spec-ids a,b --point N -- <final eval argv>`, the evaluation of
    kept checkpoint N alone (`eval_point`)."""
    out = [*entry, str(_run(run).path), "--spec-ids", ",".join(spec_ids)]
    if point is not None:
        return [*out, "--point", str(point), "--", *final_argv]
    if points:
        out.append("--points")
    if likelihood_rows:
        out += ["--likelihood-rows", str(likelihood_rows)]
    return [*out, "--", *final_argv]


def kept_checkpoints(run: RunDir | Path) -> list[tuple[int, Path]]:
    """The checkpoints EVAL_POINTS evaluates, oldest first: the trainer's
    `eval_step_<N>.pt` (logging.keep_eval_checkpoints: evenly spaced by tokens, outside the
    rotation); a run without any (trained before the key existed) offers its `step_<N>.pt`."""
    run = _run(run)
    return run.eval_checkpoints() or run.step_checkpoints()


def checkpoint_evals_missing(run: RunDir | Path, spec_ids: Sequence[str]
                             ) -> list[tuple[int, Path]]:
    """Kept checkpoints (`kept_checkpoints`) lacking an eval file for some spec_id
    (`*.<spec_id>.step<N>.json`): what a resumed chain still has to evaluate."""
    run = _run(run)
    return [(step, ck) for step, ck in kept_checkpoints(run)
            if not run.point_evaluated(step, spec_ids)]


def point_lock(run: RunDir | Path, step: int) -> Path:
    """The lock a point's evaluation holds (`<run>/eval/.point_step<N>.lock`)."""
    return _run(run).eval_file(f".point_step{step}.lock")


def _point_argv(final_argv: Sequence[str], run: RunDir, ck: Path) -> list[str]:
    """The final evaluation's argv with the checkpoint in place of the run dir."""
    argv = list(final_argv)
    i = argv.index(str(run.path))
    return [*argv[:i], str(ck), *argv[i + 1:]]


def _evaluate_point(run: RunDir, step: int, ck: Path, spec_ids: Sequence[str],
                    final_argv: Sequence[str]) -> int:
    """Evaluate kept checkpoint `ck` under its lock, unless its files exist once the lock is
    held (another job evaluated it meanwhile)."""
    with flocked(point_lock(run, step)):
        if run.point_evaluated(step, spec_ids):
            print(f"sweep: step {step} of {run.path} is evaluated already", flush=True)
            return 0
        rc = subprocess.call(_point_argv(final_argv, run, ck))
    if rc:
        print(f"sweep: error: evaluation of {ck} (step {step}) exited with code {rc}",
              file=sys.stderr)
    return rc


def eval_point(run: RunDir | Path, step: int, spec_ids: Sequence[str],
               final_argv: Sequence[str]) -> int:
    """A point job: evaluate kept checkpoint `step` of `run` (the final evaluation's argv with
    the checkpoint in place of the run dir) unless its files exist. 2 when the checkpoint is
    not there (one line on stderr), else the evaluation's exit code."""
    run = _run(run)
    found = dict(kept_checkpoints(run))
    if step not in found:
        print(f"sweep: error: {run.path} has no kept checkpoint of step {step} "
              f"({run.eval_checkpoint(step)})", file=sys.stderr)
        return 2
    return _evaluate_point(run, step, found[step], spec_ids, final_argv)


def eval_chain(run: RunDir | Path, spec_ids: Sequence[str], points: bool,
               likelihood_rows: int | None, final_argv: Sequence[str]) -> int:
    """Run the chained evaluation of one cell, resumably (the final checkpoint, every kept
    checkpoint without its files, the likelihood file unless present); the first failing exit
    code, else 0."""

    def call(argv: Sequence[str], what: str) -> int:
        rc = subprocess.call(list(argv))
        if rc:
            print(f"sweep: error: {what} exited with code {rc}", file=sys.stderr)
        return rc

    run = _run(run)
    final_argv = list(final_argv)
    if rc := call(final_argv, f"evaluation of {run.path}"):
        return rc
    if points:  # under each point's lock: a point job may be evaluating it right now
        for step, ck in checkpoint_evals_missing(run, spec_ids):
            if rc := _evaluate_point(run, step, ck, spec_ids, final_argv):
                return rc
    if likelihood_rows:
        if not run.eval_files("likelihood.*.json"):
            return call([sys.executable, "-m", LIKELIHOOD_MODULE, str(run.path),
                         "--max-rows", str(likelihood_rows)], f"likelihood of {run.path}")
    return 0
