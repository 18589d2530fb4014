"""`make synthetic-seeds`: one `make synthetic` run per seed, several at once, with progress.

Each seed runs `python -m experiments.synthetic --name <name>-s<seed> --seed <seed> <options>` as
one job of the local launcher (sweeps/launcher.py), writing its output to
`<results>/synthetic/<name>-s<seed>.log`. `--jobs` seeds run at once (default: all of them; each
uses one thread, so on C cores up to C run at full speed, and more only share the cores). Every
`--interval` seconds one line says, per seed, the arms done and the arm training, with an ETA
from the share of all arms' steps done. A seed that fails prints its log's last lines; the
others run to the end and the exit status is 1.

Progress is read from the records the runs write, never from the logs: each arm's run-id and
step count come from the trainer's plan (the seed's settings are composed before anything
starts), an arm is done when its run is finished, and the training arm's step is the last
training record of its run (sweeps.manifest.live_progress, as `make sweep-status` reads it).

Every seed's options are checked before any process starts (a bad one: one line, exit 2, nothing
written). A second call redoes no training: the trainer returns at once for a finished run, so
only the measurement runs again.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.errors import UsageError, cli
from common.paths import RunDir, results_root
from sweeps.job import CommandJob
from sweeps.launcher import LocalLauncher
from sweeps.manifest import live_progress

COMMAND = [sys.executable, "-m", "experiments.synthetic"]
"""What each seed runs (its options appended)."""


@dataclass(frozen=True)
class ArmRun:
    """One arm of a seed's synthetic run, as the trainer's plan names it."""

    label: str
    """experiments.synthetic's model label (baseline, kappa=1/8, ...)."""
    run_dir: Path
    steps: int
    """Training steps the trainer's plan gives it."""
    reused: bool = False
    """Given by --reuse: never trained here (counts as done)."""


@dataclass
class Seed:
    seed: int
    name: str
    log: Path
    argv: list[str]
    arms: int
    runs: list[ArmRun] = field(default_factory=list)
    """The arms in training order (experiments.synthetic trains them one after another)."""
    job: Any = None
    """The launcher's job handle once started."""
    rc: int | None = None
    started: float = field(default_factory=time.time)
    slot: int | None = None
    """The launcher slot it runs in (its GPU set on a GPU machine)."""

    def progress(self) -> tuple[int, str | None, float]:
        """(arms done, the arm training now or None, arms done plus the training arm's share of
        its steps), from the runs' records: an arm is done when its run is finished; the first
        arm not done is training once its run has logged a training step."""
        done = 0
        for arm in self.runs:
            if arm.reused or RunDir(arm.run_dir).finished:
                done += 1
                continue
            live = live_progress(arm.run_dir, None)
            step = live.get("step") if live else None
            if not isinstance(step, int):
                return done, None, float(done)
            return done, arm.label, done + (min(1.0, step / arm.steps) if arm.steps else 0.0)
        return done, None, float(done)


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(prog="python -m pipelines.synthetic_seeds", allow_abbrev=False,
                                description=__doc__.splitlines()[0])
    p.add_argument("--name", default="default")
    p.add_argument("--seeds", default="0 1 2", help="space separated, e.g. '0 1 2'")
    p.add_argument("--jobs", type=int, default=0, help="seeds at once (0: all)")
    p.add_argument("--interval", type=float, default=60.0, help="seconds between progress lines")
    a, rest = p.parse_known_args(argv)
    for flag in ("--seed", "--name"):
        if any(r == flag or r.startswith(flag + "=") for r in rest):
            raise UsageError(f"{flag} is set per seed here; give --seeds and --name")
    return a, rest


def arm_runs(st: Any, arms: list[tuple[int, float | None]]) -> list[ArmRun]:
    """Each arm's run directory and planned steps, from the trainer's own config and plan (what
    the run will be named and how long it trains, before it starts)."""
    from experiments import synthetic as S
    from experiments.train.config import compose
    from experiments.train.plan import plan as run_plan
    from experiments.train.plan import run_dir

    out = []
    for h, k in arms:
        label = S.model_label(h, k)
        if label in st.reuse:
            out.append(ArmRun(label, Path(st.reuse[label]), 0, reused=True))
            continue
        cfg = compose(S.arm_overrides(st, h, 0.0 if k is None else k))
        out.append(ArmRun(label, run_dir(cfg), run_plan(cfg, 1).steps))
    return out


def plan(a: argparse.Namespace, rest: list[str]) -> list[Seed]:
    """Every seed's run, its options checked as experiments.synthetic checks them."""
    from experiments import synthetic as S

    toks = a.seeds.replace(",", " ").split()
    if not toks or not all(re.fullmatch(r"\d+", t) for t in toks):
        raise UsageError(f"--seeds {a.seeds!r}: give seeds as integers >= 0, e.g. '0 1 2'")
    seeds = [int(t) for t in toks]
    if len(set(seeds)) != len(seeds):
        raise UsageError(f"--seeds {a.seeds!r}: a seed is given twice")
    if a.jobs < 0 or a.interval <= 0:
        raise UsageError(f"--jobs {a.jobs} must be >= 0 and --interval {a.interval} > 0")
    out = []
    for s in seeds:
        argv = ["--name", f"{a.name}-s{s}", "--seed", str(s), *rest]
        st = S.parse_args(argv)
        arms = S.check(st)
        out.append(Seed(s, st.name, results_root() / "synthetic" / f"{st.name}.log", argv,
                        len(arms), arm_runs(st, arms)))
    return out


def status_line(seeds: list[Seed], t0: float) -> str:
    """Per seed its arms done and state; then arms done, the share of all arms' steps done and
    an ETA (arms that run at once progress together, so elapsed / share is the whole time)."""
    parts, done_all, share = [], 0, 0.0
    for s in seeds:
        done, now, frac = s.progress()
        done_all, share = done_all + done, share + frac
        state = ("waiting" if s.job is None and s.rc is None else
                 "done" if s.rc == 0 else f"failed (exit {s.rc})" if s.rc is not None else
                 f"training {now}" if now else "starting")
        parts.append(f"s{s.seed}: {done}/{s.arms} {state}")
    total = sum(s.arms for s in seeds)
    share /= total
    eta = ("ETA once training has begun" if share <= 0 else
           f"{share:.0%} of all steps, ETA {(time.time() - t0) * (1 - share) / share / 60:.0f} min")
    return (f"[synthetic-seeds {time.strftime('%H:%M:%S')}, {(time.time() - t0) / 60:.1f} min] "
            + "; ".join(parts) + f" | {done_all}/{total} arms done, {eta}")


def _exit_status(launcher: LocalLauncher, job: Any) -> int:
    """The seed command's exit status (1 when its job itself ended without a result)."""
    res = job.result() if launcher.outcome(job)[0] == "done" else None
    return int(res.get("rc", 1)) if isinstance(res, dict) else 1


def run(seeds: list[Seed], jobs: int, interval: float) -> int:
    """The seeds as jobs of the local launcher, `jobs` at once (0: all), with a progress line
    every `interval` seconds; 1 when a seed failed."""
    t0 = time.time()
    jobs = jobs or len(seeds)
    launcher = LocalLauncher(seeds[0].log.parent / ".jobs", jobs=jobs, job_name="synthetic-seed")
    env = {"PYTHONUNBUFFERED": "1"}  # the log shows each line as the seed prints it
    waiting, running = list(seeds), []
    last = 0.0
    while waiting or running:
        while waiting and len(running) < jobs:
            s = waiting.pop(0)
            s.slot = min(set(range(jobs)) - {r.slot for r in running})
            s.job = launcher.submit(CommandJob(
                s.name, [*COMMAND, *s.argv], str(s.log),
                cwd=os.getcwd(), env=dict(env)), slot=s.slot)
            s.started = time.time()
            print(f"[synthetic-seeds] seed {s.seed}: started, log {s.log}", flush=True)
            running.append(s)
        for s in list(running):
            if s.job is not None and s.job.done():
                s.rc = rc = _exit_status(launcher, s.job)
                running.remove(s)
                mins = (time.time() - s.started) / 60
                if rc == 0:
                    print(f"[synthetic-seeds] seed {s.seed}: done in {mins:.1f} min", flush=True)
                else:
                    tail = s.log.read_text(encoding="utf-8", errors="replace").splitlines()[-8:] \
                        if s.log.is_file() else ["(no log)"]
                    print(f"[synthetic-seeds] seed {s.seed}: FAILED (exit {rc}); the end of "
                          f"{s.log}:\n  " + "\n  ".join(tail), flush=True)
        if time.time() - last >= interval and running:
            print(status_line(seeds, t0), flush=True)
            last = time.time()
        time.sleep(min(1.0, interval))
    failed = [s.seed for s in seeds if s.rc != 0]
    print(f"[synthetic-seeds] {len(seeds) - len(failed)}/{len(seeds)} seeds done in "
          f"{(time.time() - t0) / 60:.1f} min" + (f"; failed: {failed}" if failed else ""),
          flush=True)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    def body() -> int:
        a, rest = parse(sys.argv[1:] if argv is None else argv)
        return run(plan(a, rest), a.jobs, a.interval)  # every seed checked before any starts

    return cli("synthetic-seeds", body)


if __name__ == "__main__":
    raise SystemExit(main())
