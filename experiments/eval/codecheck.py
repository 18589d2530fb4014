"""HumanEval+ / MBPP+ checks whose verdict the checked code cannot reach.

For each problem:
1. expected outputs: the dataset's canonical solution runs on the base and plus inputs in a
   sandbox (as evalplus's `get_groundtruth`/`trusted_exec` runs it, with its per-input times);
2. each sample runs on the same inputs in a fresh sandbox (`experiments.eval.sandbox`) and
   prints its outputs as builtin data (`codecheck_child`); it never sees the expected outputs.
   The inputs go in one at a time and this process times each answer: an input not answered
   within evalplus's limit for it (max(1 s, 4 x the canonical time)) plus INPUT_SLACK_S plus
   twice what the canonical run spent on that input beyond the call is a "timeout" (the sandbox is
   killed then), whatever the code did to its own timers or clocks. An overrun that evalplus's
   in-process timer interrupts is evalplus's "fail", as there;
3. the comparison runs in a separate worker process that never ran model code: evalplus's own
   `untrusted_check`/`unsafe_execute` (tolerances, float handling, MBPP/HumanEval special oracles,
   fast check) applied to a stand-in function that replays the decoded outputs. An output of
   over a million nodes (MBPP/255 returns ten-million-element lists) may cross as a digest
   where evalplus compares by plain == (`digests_ok`); equal digests then stand for ==.

Statuses are evalplus's ("pass", "fail", "timeout"). A sample that crashes, exits early, hangs,
prints too much or returns a non-builtin value fails. A check that could not be made (no sandbox,
the sandbox itself broke, the canonical solution failed, the evaluation's wall-clock budget ran
out) is missing: status None with a one-line reason, never a fail.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiments.eval import sandbox
from experiments.eval.codecheck_child import (
    CodecError,
    Undigestible,
    decode,
    digest,
    dumps,
    is_digest,
)

GT_TIMEOUT_S = 300.0  # the canonical solution on all inputs of one problem
STARTUP_SLACK_S = 5.0  # bwrap + interpreter start on a busy machine, on top of evalplus's limit
# per input, on top of evalplus's limit: the pipe round trip and the runner being scheduled on a
# busy machine (this process's own stalls never count: see sandbox._exchange)
INPUT_SLACK_S = 0.5
OVERHEAD_FACTOR = 2.0  # x the canonical run's per-input cost beyond the call: decode, encode
CACHE_VERSION = "ftbench-gt-4"  # 4: per-input whole costs ("base_rt", "plus_rt")


@dataclass
class Check:
    status: str | None  # "pass" | "fail" | "timeout" | None (missing)
    reason: str | None = None  # why missing (never the sandbox's own output)


@dataclass
class Outcome:
    base: Check
    plus: Check


@dataclass
class Report:
    """Per task_id outcomes, and how the evaluation went."""
    outcomes: dict[str, Outcome]
    isolation: dict[str, Any]
    elapsed_s: float
    budget_s: float
    budget_exhausted: bool
    sandboxes: int = 0
    leftovers_killed: int = 0
    stats_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


def problem_inputs(problem: dict, dataset: str) -> tuple[list, list]:
    """Base and plus inputs as evalplus hands them to the function (MBPP+ deserialized)."""
    base, plus = problem["base_input"], problem["plus_input"]
    if dataset == "mbpp":
        from evalplus.data.mbpp import mbpp_deserialize_inputs

        base = mbpp_deserialize_inputs(problem["task_id"], base)
        plus = mbpp_deserialize_inputs(problem["task_id"], plus)
    return base, plus


@dataclass(frozen=True)
class Digest:
    """An expected output too large to carry: its digest (codecheck_child.digest)."""
    hex: str


def digests_ok(problem: dict, dataset: str) -> bool:
    """Huge outputs may cross as digests only where evalplus compares by plain == (no
    tolerance, no special oracle): there, equal digests mean ==."""
    from evalplus.eval._special_oracle import MBPP_OUTPUT_NOT_NONE_TASKS, MBPP_OUTPUT_SET_EQ_TASKS

    special = {"humaneval": {"find_zero"},
               "mbpp": {"are_equivalent", "sum_div", "surface_Area", "digit_distance_nums",
                        *MBPP_OUTPUT_SET_EQ_TASKS, *MBPP_OUTPUT_NOT_NONE_TASKS}}[dataset]
    return problem["atol"] == 0 and problem["entry_point"] not in special


def _decode_gt(v: Any) -> Any:
    return Digest(v[1]) if is_digest(v) else decode(v)


def _job(problem: dict, dataset: str, mode: str, code: str, inputs: list) -> dict:
    """The sandbox's job for `code` on `inputs` (the runner: codecheck_child)."""
    from evalplus.eval._special_oracle import MBPP_OUTPUT_NOT_NONE_TASKS

    ep = problem["entry_point"]
    return {"mode": mode, "code": code, "entry_point": ep, "inputs": [dumps(x) for x in inputs],
            "output_not_none": dataset == "mbpp" and ep in MBPP_OUTPUT_NOT_NONE_TASKS,
            "digests": digests_ok(problem, dataset)}


# ---- the comparison worker (spawned; never runs model code) ----

_replay_it: Any = iter(())


def _replay(*_args: Any) -> Any:
    """Stands in for the checked function inside evalplus's unsafe_execute: the next output."""
    return next(_replay_it)


def _compare(dataset: str, entry_point: str, inputs: list, expected: list, outputs: list,
             atol: float, ref_time: list[float], digests: bool = False) -> str:
    """evalplus's verdict for decoded-on-arrival outputs ("pass" | "fail" | "timeout")."""
    global _replay_it
    from evalplus.eval import untrusted_check

    if len(outputs) != len(inputs) or len(expected) != len(inputs) or \
            not entry_point.isidentifier():
        return "fail"
    outs, expected = [], list(expected)
    try:
        for i, o in enumerate(outputs):
            if is_digest(o) or isinstance(expected[i], Digest):
                if not digests:
                    return "fail"
                e = expected[i]
                de = e.hex if isinstance(e, Digest) else digest(e)
                do = o[1] if is_digest(o) else digest(decode(o))
                # equal digests mean ==: hand evalplus a pair that compares as they do
                expected[i] = "ftbench:digest"
                outs.append("ftbench:digest" if de == do else "ftbench:digest-differs")
            else:
                outs.append(decode(o))
    except (CodecError, Undigestible, RecursionError):
        return "fail"
    if dataset == "humaneval" and entry_point == "find_zero":
        # evalplus 0.3.1's unsafe_execute `continue`s past `details[i] = True` in this branch, so
        # HumanEval/32 can never pass there (not even its canonical solution); evalplus fixed
        # it upstream by recording the pass first. Same oracle (its _poly, the task's atol):
        from evalplus.eval._special_oracle import _poly

        try:
            ok = all(abs(_poly(*i, o)) <= atol for i, o in zip(inputs, outs, strict=True))
            return "pass" if ok else "fail"
        except Exception:
            return "fail"
    _replay_it = iter(outs)  # the forked unsafe_execute inherits it
    if multiprocessing.get_start_method(allow_none=True) != "fork":
        multiprocessing.set_start_method("fork", force=True)  # this worker is single-threaded
    code = f"from experiments.eval.codecheck import _replay as {entry_point}\n"
    status, _ = untrusted_check(dataset, code, inputs, entry_point, expected=expected,
                                atol=atol, ref_time=ref_time, fast_check=True)
    return status


class _Comparer:
    """A small pool of spawned workers; recreated if one dies."""

    def __init__(self, n: int) -> None:
        self.n, self.lock = n, threading.Lock()
        self.pool = self._new()

    def _new(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(self.n, mp_context=multiprocessing.get_context("spawn"))

    def __call__(self, *args: Any) -> Check:
        pool = self.pool
        try:
            return Check(pool.submit(_compare, *args).result())
        except BrokenProcessPool:
            with self.lock:
                if self.pool is pool:
                    self.pool = self._new()
            return Check(None, "the comparison process died")

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)


# ---- expected outputs ----

def _gt_key(problem: dict, dataset: str) -> str:
    blob = json.dumps([CACHE_VERSION, dataset, problem["task_id"], problem["prompt"],
                       problem["canonical_solution"], problem["base_input"],
                       problem["plus_input"]], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


GT_KEYS = ("base", "base_time", "base_rt", "plus", "plus_time", "plus_rt")


def expected_outputs(problem: dict, dataset: str, base: list, plus: list, deadline: float,
                     report: Report, cache_dir: Path | None = None) -> dict | Check:
    """{"base", "base_time", "base_rt", "plus", "plus_time", "plus_rt"} (outputs decoded;
    *_rt: all each input cost the runner, decoding it and encoding its answer included), or a
    missing Check."""
    def decoded(gt: dict) -> dict:
        return {k: [_decode_gt(v) for v in gt[k]] if k in ("base", "plus") else gt[k]
                for k in GT_KEYS}

    path = cache_dir / f"{_gt_key(problem, dataset)}.json" if cache_dir else None
    if path is not None and path.is_file():
        try:
            return decoded(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, CodecError):
            pass  # recompute
    job = _job(problem, dataset, "gt", problem["prompt"] + problem["canonical_solution"],
               [*base, *plus])
    r = _run(job, GT_TIMEOUT_S, deadline, report)
    if isinstance(r, Check):
        return r
    res = r.result
    n = len(base) + len(plus)
    if res is None or res.get("status") != "ok" or len(res.get("outputs", [])) != n or \
            len(res.get("times", [])) != n or len(res.get("walls", [])) != n:
        if r.timed_out:
            why = f"timed out after {GT_TIMEOUT_S:.0f} s"
        elif r.overflow:
            why = "printed more than the output limit"
        elif res is not None and res.get("status") == "error":
            why = f"{str(res.get('kind', 'failed'))[:20]} on input {res.get('at')}"
        else:
            why = f"left no result (exit status {r.returncode})"
        return Check(None, f"expected outputs unavailable: the canonical solution {why}")
    outs, times = res["outputs"], [float(t) for t in res["times"]]
    rts = [float(w) for w in res["walls"]]
    nb = len(base)
    gt = {"base": outs[:nb], "base_time": times[:nb], "base_rt": rts[:nb],
          "plus": outs[nb:], "plus_time": times[nb:], "plus_rt": rts[nb:]}
    if path is not None:
        from common.io import atomic_write_text

        try:
            atomic_write_text(path, json.dumps(gt))
        except OSError:
            pass  # a cache only
    try:
        return decoded(gt)
    except CodecError:
        return Check(None, "expected outputs unavailable: undecodable")


# ---- one sandboxed run, classified ----

def _run(job: dict, own_limit: float, deadline: float, report: Report,
         input_limits: list[float] | None = None) -> sandbox.ChildRun | Check:
    left = deadline - time.monotonic()
    if left <= 1.0:
        return Check(None, "evaluation wall-clock budget exhausted")
    limit = min(own_limit, left)
    try:
        r = sandbox.run_child(job, timeout_s=limit, input_limits_s=input_limits)
    except Exception as e:  # the machinery failed, not the code: missing, and go on
        return Check(None, f"sandbox error: {type(e).__name__}: {str(e)[:120]}")
    with report.stats_lock:
        report.sandboxes += 1
        report.leftovers_killed += r.leftovers
    if r.timed_out and limit < own_limit:
        return Check(None, "evaluation wall-clock budget exhausted")
    if not r.ready:
        if r.timed_out:
            return Check(None, f"sandbox did not start within {limit:.0f} s")
        closed = report.isolation.get("closed_parent")
        why = f": its uid cannot traverse {closed}" if closed else ""
        return Check(None, f"sandbox did not start (exit status {r.returncode}){why}")
    return r


def input_limits(ref_time: list[float], ref_rt: list[float]) -> tuple[list[float], list[float]]:
    """(evalplus's per-input limits, the limits this process enforces on each answer)."""
    from evalplus.config import DEFAULT_GT_TIME_LIMIT_FACTOR, DEFAULT_MIN_TIME_LIMIT

    limits = [max(DEFAULT_MIN_TIME_LIMIT, DEFAULT_GT_TIME_LIMIT_FACTOR * t) for t in ref_time]
    outside = [lim + INPUT_SLACK_S + OVERHEAD_FACTOR * max(0.0, rt - t)
               for lim, t, rt in zip(limits, ref_time, ref_rt, strict=True)]
    return limits, outside


def check_split(problem: dict, dataset: str, solution: str, inputs: list, expected: list,
                ref_time: list[float], deadline: float, report: Report,
                comparer: _Comparer, ref_rt: list[float]) -> Check:
    """One sample on one input split (base or plus); ref_rt: the canonical per-input costs."""
    limits, outside = input_limits(ref_time, ref_rt)
    # evalplus's whole-check timeout, enforced here from outside the sandbox
    timeout = min(float(os.getenv("EVALPLUS_TIMEOUT_PER_TASK", 60)), sum(limits)) + 2
    job = _job(problem, dataset, "check", solution, inputs) | {"time_limits": limits}
    # huge outputs (digested in the expected ones) take seconds to serialize, time evalplus
    # spends comparing in C; give them that time on top of evalplus's limit
    slack = STARTUP_SLACK_S + (60.0 if any(isinstance(e, Digest) for e in expected) else 0.0)
    r = _run(job, timeout + slack, deadline, report, outside)
    if isinstance(r, Check):
        return r
    if r.timed_out or r.late is not None:  # killed by our clock: evalplus's "timeout"
        return Check("timeout")
    res = r.result
    if r.overflow or res is None or res.get("status") != "ok" or \
            not isinstance(res.get("outputs"), list):
        return Check("fail")  # crashed, exited early, raised, or printed nonsense
    return comparer(dataset, problem["entry_point"], list(inputs), expected, res["outputs"],
                    problem["atol"], ref_time, digests_ok(problem, dataset))


def evaluate(dataset: str, problems: list[dict], solutions: dict[str, str],
             parallel: int = 2, budget_s: float | None = None,
             cache_dir: Path | None = None) -> Report:
    """Check one solution per problem; never raises for a sample's or a sandbox's failure."""
    t0 = time.monotonic()
    budget = budget_s if budget_s is not None else 120.0 + 20.0 * len(problems)
    deadline = t0 + budget
    iso = sandbox.isolation()
    report = Report({}, iso.record(), 0.0, budget, False)
    if not iso.usable:
        miss = Check(None, f"sandbox unavailable: {iso.reason}")
        report.outcomes = {p["task_id"]: Outcome(miss, miss) for p in problems}
        return report
    comparer = _Comparer(max(1, parallel))

    def one(p: dict) -> Outcome:
        try:
            base_in, plus_in = problem_inputs(p, dataset)
            gt = expected_outputs(p, dataset, base_in, plus_in, deadline, report, cache_dir)
            if isinstance(gt, Check):
                return Outcome(gt, gt)
            sol = solutions[p["task_id"]]
            base = check_split(p, dataset, sol, base_in, gt["base"], gt["base_time"],
                               deadline, report, comparer, gt["base_rt"])
            if base.status != "pass":  # plus counts only on top of base: not run
                return Outcome(base, Check(base.status and "fail", base.reason))
            plus = check_split(p, dataset, sol, plus_in, gt["plus"], gt["plus_time"],
                               deadline, report, comparer, gt["plus_rt"])
            return Outcome(base, plus)
        except Exception as e:  # our bug or a bad problem row: this item is missing
            miss = Check(None, f"evaluation error: {type(e).__name__}: {str(e)[:120]}")
            return Outcome(miss, miss)

    try:
        with ThreadPoolExecutor(max(1, parallel)) as ex:
            outs = list(ex.map(one, problems))
    finally:
        comparer.close()
    report.outcomes = {p["task_id"]: o for p, o in zip(problems, outs, strict=True)}
    report.elapsed_s = time.monotonic() - t0
    report.budget_exhausted = any("budget" in (c.reason or "") for o in outs
                                  for c in (o.base, o.plus))
    return report
