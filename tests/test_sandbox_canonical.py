"""The sandboxed checker agrees with evalplus: canonical solutions pass, wrong ones fail.

Every HumanEval+ (164) and MBPP+ (378) canonical solution must pass (base and plus) and a wrong
variant of each must fail, the problems on evalplus's special paths included (float tolerance,
HumanEval/32's polynomial oracle, MBPP's set-equality, "is not None", surface-area and
digit-distance oracles). Slow tier: the fast tier has the oracles in-process (test_sandbox's
comparison test) and real canonical solutions through the sandbox (test_sandbox_scoring, the
hostile batch's controls).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from experiments.eval import codecheck

BENCH = Path(__file__).resolve().parents[2] / "shared" / "benchmarks"
FILES = {"humaneval": BENCH / "humanevalplus" / "HumanEvalPlus-v0.1.10.jsonl",
         "mbpp": BENCH / "mbppplus" / "MbppPlus-v0.2.0.jsonl"}
ALWAYS_PASSES = {"Mbpp/164"}  # evalplus's oracle for are_equivalent accepts any output

# a wrong solution: the canonical one, with every result nudged off its expected value
PERTURB = '''
_ftbench_right = {ep}
def _ftbench_off(r):
    if type(r) is bool:
        return not r
    if type(r) in (int, float, complex):
        return r + 1 + abs(r)
    if type(r) is str:
        return r + "\\x00"
    if type(r) in (list, tuple):
        return r + type(r)([None])
    if type(r) is dict:
        return {{**r, "\\x00": None}}
    if type(r) is set:
        return r | {{"\\x00"}}
    return 0 if r is None else None
def {ep}(*a):
    return _ftbench_off(_ftbench_right(*a))
'''


def _problems(ds: str) -> list[dict]:
    with open(FILES[ds], encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _right(p: dict) -> str:
    return p["prompt"] + p["canonical_solution"]


def _wrong(p: dict) -> str:
    return _right(p) + PERTURB.format(ep=p["entry_point"])


def _check(ds: str, probs: list[dict], cache: Path, parallel: int) -> tuple[dict, dict, float]:
    t0 = time.monotonic()
    right = codecheck.evaluate(ds, probs, {p["task_id"]: _right(p) for p in probs},
                               parallel=parallel, budget_s=3600, cache_dir=cache)
    wrong = codecheck.evaluate(ds, probs, {p["task_id"]: _wrong(p) for p in probs},
                               parallel=parallel, budget_s=3600, cache_dir=cache)
    return right.outcomes, wrong.outcomes, time.monotonic() - t0


def _assert_agree(right: dict, wrong: dict) -> None:
    bad = {t: (o.base, o.plus) for t, o in right.items()
           if (o.base.status, o.plus.status) != ("pass", "pass")}
    assert bad == {}, bad
    passed = {t for t, o in wrong.items() if o.base.status == "pass" or o.base.status is None}
    assert passed <= ALWAYS_PASSES, {t: wrong[t] for t in passed - ALWAYS_PASSES}


@pytest.mark.slow
@pytest.mark.parametrize("ds,n", [("humaneval", 164), ("mbpp", 378)])
def test_every_canonical_solution_passes_and_wrong_ones_fail(ds: str, n: int,
                                                             tmp_path: Path) -> None:
    probs = _problems(ds)
    assert len(probs) == n
    # 4 sandboxes a problem (expected outputs, base, plus, the wrong one's base): their cost is
    # start-up and clean-up latency (bwrap, the uid and cgroup sweeps), not CPU (measured: 60
    # MBPP problems took 76 s at 2 at once and 45 s at 8 on 2 busy cores, ~37 ms CPU a sandbox;
    # no limit was hit), so more run at once than there are cores
    right, wrong, elapsed = _check(ds, probs, tmp_path, max(8, 2 * (os.cpu_count() or 2)))
    print(f"{ds}: {n} canonical + {n} wrong solutions checked in {elapsed:.0f} s")
    _assert_agree(right, wrong)
