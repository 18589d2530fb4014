"""`make synthetic-seeds`: one `make synthetic` run per seed, several at once, with progress.

    python -m pipelines.synthetic_seeds --name default --seeds "0 1 2" [--jobs N]
        [--interval 60] [experiments.synthetic options and overrides...]

Each seed runs `python -m experiments.synthetic --name <name>-s<seed> --seed <seed> <options>` in
its own process (one torch thread, experiments.synthetic's default), writing its output to
`<results>/synthetic/<name>-s<seed>.log`. `--jobs` seeds run at once (default: all of them; each
uses one thread, so on C cores up to C run at full speed, and more only share the cores). Every
`--interval` seconds one line says, per seed, the arms done and the arm training, with an ETA
from the arms finished so far. A seed that fails prints its log's last lines; the others run to
the end and the exit status is 1.

Every seed's options are checked before any process starts (a bad one: one line, exit 2, nothing
written). A second call redoes no training: the trainer returns at once for a finished run, so
only the measurement runs again.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from common.paths import results_root
from common.text import one_line

_TRAINING = re.compile(r"^\[synthetic\] (\S+): training")
_DONE = re.compile(r"^\[synthetic\] (\S+): ce_prior=")
_RUN_ID = re.compile(r"^run-id\s+(\S+)")  # the trainer's plan, printed as each arm starts
_STEPS = re.compile(r"^tokens\s+.*= ([\d,]+) steps")


class SeedsArgsError(ValueError):
    """Bad input: one line; raised before any process starts."""


@dataclass
class Seed:
    seed: int
    name: str
    log: Path
    argv: list[str]
    arms: int
    proc: subprocess.Popen | None = None
    rc: int | None = None
    started: float = field(default_factory=time.time)

    def progress(self) -> tuple[int, str | None, float]:
        """(arms done, the arm training now or None, arms done plus the training arm's share of
        its steps), from one read of the seed's log and the training arm's metrics.jsonl."""
        done, now, run = self._read()
        frac = float(done)
        if now is not None and run is not None:
            step = _last_step(results_root() / "runs" / run[0] / "metrics.jsonl")
            frac += min(1.0, step / run[1]) if step and run[1] else 0.0
        return done, now, frac

    def _read(self) -> tuple[int, str | None, tuple[str, int] | None]:
        done, now, run_id, run = 0, None, None, None
        if self.log.is_file():
            for line in self.log.read_text(encoding="utf-8", errors="replace").splitlines():
                if m := _DONE.match(line):
                    done, now, run = done + 1, None, None
                elif m := _TRAINING.match(line):
                    now, run = m.group(1), None
                elif m := _RUN_ID.match(line):
                    run_id = m.group(1)
                elif (m := _STEPS.match(line)) and run_id:
                    run = (run_id, int(m.group(1).replace(",", "")))
        return done, now, run


def _last_step(path: Path) -> int | None:
    """The step of the last training record in a metrics.jsonl (its tail only)."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            tail = f.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(tail):
        if m := re.search(r'"kind": "train", "step": (\d+)', line):
            return int(m.group(1))
    return None


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
            raise SeedsArgsError(f"{flag} is set per seed here; give --seeds and --name")
    return a, rest


def plan(a: argparse.Namespace, rest: list[str]) -> list[Seed]:
    """Every seed's run, its options checked as experiments.synthetic checks them."""
    from experiments import synthetic as S

    toks = a.seeds.replace(",", " ").split()
    if not toks or not all(re.fullmatch(r"\d+", t) for t in toks):
        raise SeedsArgsError(f"--seeds {a.seeds!r}: give seeds as integers >= 0, e.g. '0 1 2'")
    seeds = [int(t) for t in toks]
    if len(set(seeds)) != len(seeds):
        raise SeedsArgsError(f"--seeds {a.seeds!r}: a seed is given twice")
    if a.jobs < 0 or a.interval <= 0:
        raise SeedsArgsError(f"--jobs {a.jobs} must be >= 0 and --interval {a.interval} > 0")
    out = []
    for s in seeds:
        argv = ["--name", f"{a.name}-s{s}", "--seed", str(s), *rest]
        st = S.parse_args(argv)
        arms = S.check(st)
        out.append(Seed(s, st.name, results_root() / "synthetic" / f"{st.name}.log", argv,
                        len(arms)))
    return out


def status_line(seeds: list[Seed], t0: float) -> str:
    """Per seed its arms done and state; then arms done, the share of all arms' steps done and
    an ETA (arms that run at once progress together, so elapsed / share is the whole time)."""
    parts, done_all, share = [], 0, 0.0
    for s in seeds:
        done, now, frac = s.progress()
        done_all, share = done_all + done, share + frac
        state = ("waiting" if s.proc is None and s.rc is None else
                 "done" if s.rc == 0 else f"failed (exit {s.rc})" if s.rc is not None else
                 f"training {now}" if now else "starting")
        parts.append(f"s{s.seed}: {done}/{s.arms} {state}")
    total = sum(s.arms for s in seeds)
    share /= total
    eta = ("ETA once training has begun" if share <= 0 else
           f"{share:.0%} of all steps, ETA {(time.time() - t0) * (1 - share) / share / 60:.0f} min")
    return (f"[synthetic-seeds {time.strftime('%H:%M:%S')}, {(time.time() - t0) / 60:.1f} min] "
            + "; ".join(parts) + f" | {done_all}/{total} arms done, {eta}")


def run(seeds: list[Seed], jobs: int, interval: float) -> int:
    t0 = time.time()
    jobs = jobs or len(seeds)
    waiting, running = list(seeds), []
    last = 0.0
    while waiting or running:
        while waiting and len(running) < jobs:
            s = waiting.pop(0)
            s.log.parent.mkdir(parents=True, exist_ok=True)
            with s.log.open("w", encoding="utf-8") as fh:  # the child owns it from here
                s.proc = subprocess.Popen([sys.executable, "-m", "experiments.synthetic",
                                           *s.argv], stdout=fh, stderr=subprocess.STDOUT,
                                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
            s.started = time.time()
            print(f"[synthetic-seeds] seed {s.seed}: started, log {s.log}", flush=True)
            running.append(s)
        for s in list(running):
            if s.proc is not None and (rc := s.proc.poll()) is not None:
                s.rc = rc
                running.remove(s)
                mins = (time.time() - s.started) / 60
                if rc == 0:
                    print(f"[synthetic-seeds] seed {s.seed}: done in {mins:.1f} min", flush=True)
                else:
                    tail = s.log.read_text(encoding="utf-8", errors="replace").splitlines()[-8:]
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
    from experiments.synthetic import SyntheticArgsError
    from experiments.train.config import ConfigError

    try:
        a, rest = parse(sys.argv[1:] if argv is None else argv)
        seeds = plan(a, rest)
    except (SeedsArgsError, SyntheticArgsError, ConfigError) as e:
        print(f"error: {one_line(str(e))}", file=sys.stderr)
        return 2
    return run(seeds, a.jobs, a.interval)


if __name__ == "__main__":
    raise SystemExit(main())
