"""evalplus's per-input time limit holds against code that cancels its own timers (issue 30).

The limit is enforced from outside the sandbox: the inputs go in one at a time and the evaluator
times each answer on its own clock, killing the sandbox when an input's limit passes. Code that
cancels the in-sandbox interval timer, replaces signal.setitimer/alarm and the time functions,
and then answers correctly but too slowly is a timeout (it passed before: only the whole check's
wall clock bounded it), on any input, not just the first; a correct answer under the limit still
passes, and a stall of the evaluator itself never makes an answer late.
"""

from __future__ import annotations

import selectors
import time

import pytest

from experiments.eval import codecheck, sandbox
from experiments.eval.codecheck_child import dumps

PROMPT = "def f(x):\n"
CANONICAL = "    return x + 1\n"

# the completion: cancel the timer, make it uncancellable and the clocks blind, sleep
# past the limit once, answer right
DISARM = '''
import signal, time as _time
_sleep, _now = _time.sleep, _time.monotonic
signal.setitimer(signal.ITIMER_REAL, 0)
signal.signal(signal.SIGALRM, signal.SIG_IGN)
signal.setitimer = lambda *a, **k: (0.0, 0.0)
signal.alarm = lambda *a, **k: 0
signal.signal = lambda *a, **k: None
for _n in ("time", "monotonic", "perf_counter", "process_time"):
    setattr(_time, _n, lambda: 0.0)
'''
ATTACK = DISARM + '''
_slept = []
def f(x):
    if not _slept:
        _slept.append(1)
        _sleep(3)
    return x + 1
'''
CONTROL = DISARM + "def f(x):\n    return x + 1\n"  # the same, without the sleep
BUSY = DISARM + '''
def f(x):
    t = _now()
    while _now() - t < 3:
        pass
    return x + 1
'''
# fast on every input but the last plus input: the sum of the limits would have covered it
LATE_ONE = DISARM + '''
def f(x):
    if x == 40:
        _sleep(3)
    return x + 1
'''
COOPERATIVE_SLOW = "import time\ndef f(x):\n    time.sleep(3)\n    return x + 1\n"
JUST_UNDER = "import time\ndef f(x):\n    time.sleep(0.7)\n    return x + 1\n"


def problem(task_id: str) -> dict:
    """2 base inputs, 5 plus inputs, all with evalplus's minimum limit (1 s) here."""
    return {"task_id": task_id, "prompt": PROMPT, "canonical_solution": CANONICAL,
            "entry_point": "f", "base_input": [[1], [2]],
            "plus_input": [[3], [4], [5], [6], [40]], "atol": 0}


@pytest.mark.slow  # multi-process or end to end: the CI tier (make test-all)
def test_slow_answers_time_out_whatever_the_code_does_to_its_timers() -> None:
    sols = {"T/attack": ATTACK, "T/control": CONTROL, "T/busy": BUSY, "T/late_one": LATE_ONE,
            "T/cooperative": COOPERATIVE_SLOW, "T/just_under": JUST_UNDER}
    rep = codecheck.evaluate("humaneval", [problem(t) for t in sols], sols, parallel=2,
                             budget_s=240)
    st = {t: (o.base.status, o.plus.status) for t, o in rep.outcomes.items()}
    assert st["T/control"] == ("pass", "pass"), st  # the disarming alone is no failure
    assert st["T/attack"] == ("timeout", "fail"), st  # plus is not run after a failed base
    assert st["T/busy"] == ("timeout", "fail"), st
    # base answered fast; the fifth plus input's own limit passed: a timeout, though the whole
    # check was still well within min(60, sum of limits) + slack
    assert st["T/late_one"] == ("pass", "timeout"), st
    # an overrun the code lets evalplus's own timer interrupt is evalplus's verdict: fail
    assert st["T/cooperative"] == ("fail", "fail"), st
    assert st["T/just_under"] == ("pass", "pass"), st
    assert not rep.budget_exhausted


def _job(code: str, n: int, mode: str = "check") -> dict:
    return {"mode": mode, "code": code, "entry_point": "f",
            "inputs": [dumps([i]) for i in range(n)], "time_limits": [30.0] * n}


def test_the_late_input_is_named_and_answers_inside_their_limit_are_on_time() -> None:
    """With the timer off, an answer that takes 0.8 s of a 2.5 s limit is on time; the input not
    answered within its limit is named and the run ends there, not at the run's 60 s."""
    code = DISARM + "def f(x):\n    _sleep({0: 0.8, 3: 60}.get(x, 0))\n    return x + 1\n"
    t0 = time.monotonic()
    r = sandbox.run_child(_job(code, 6), timeout_s=60, input_limits_s=[2.5] + [1.5] * 5)
    took = time.monotonic() - t0
    assert r.ready and r.late == 3 and r.result is None and not r.timed_out, r
    rt = r.round_trips
    assert len(rt) == 3 and 0.8 <= rt[0] < 2.5 and all(x < 1.5 for x in rt[1:]), r
    assert took < 30


LIMIT = 0.9  # the exchange's waits are capped at 1 s: a shorter one is a wait for an answer


class _Stalling(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """Sleeps once, 2.5 s, on its first wait for an answer: the evaluator stalled (a busy
    machine, another thread holding the GIL) past that input's limit."""

    stalled = False

    def select(self, timeout: float | None = None) -> list:
        if timeout is not None and timeout <= LIMIT and not self.stalled:
            self.stalled = True
            time.sleep(2.5)
        return super().select(timeout)


@pytest.mark.slow  # end to end, 6-15 s: the slow tier (CI runs it)
def test_a_stall_of_the_evaluator_never_makes_an_answer_late(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox.selectors, "DefaultSelector", _Stalling)
    r = sandbox.run_child(_job("def f(x):\n    return x + 1\n", 2), timeout_s=60,
                          input_limits_s=[LIMIT, LIMIT])
    assert r.late is None and r.result is not None and r.result["status"] == "ok", r
    assert r.round_trips[0] >= 2.5  # the stall is in the round trip: the rule, not luck
    # the same stall with an answer that really is late
    code = DISARM + "def f(x):\n    _sleep(4)\n    return x + 1\n"
    r = sandbox.run_child(_job(code, 2), timeout_s=60, input_limits_s=[LIMIT, LIMIT])
    assert r.late == 0 and r.result is None


def test_answers_written_ahead_of_their_input_are_not_answers() -> None:
    """The code knows the (public) inputs and writes the protocol's answers for all of them
    at once: none is the runner's answer to an input it read, so the check leaves no result."""
    code = '''
import os, stat
for fd in range(3, 64):
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.write(fd, b"ftbench-sandbox-loaded\\n" + b'{"o":1}\\n{"o":2}\\n{"o":3}\\n')
    except OSError:
        pass
def f(x):
    import time
    time.sleep(30)
'''
    r = sandbox.run_child(_job(code, 3), timeout_s=60, input_limits_s=[20.0] * 3)
    assert r.ready and r.result is None and r.late is None, r


def test_expected_outputs_carry_round_trips_and_the_limits_follow() -> None:
    rep = codecheck.Report({}, {}, 0.0, 60.0, False)
    p = problem("T/gt")
    base, plus = codecheck.problem_inputs(p, "humaneval")
    gt = codecheck.expected_outputs(p, "humaneval", base, plus, time.monotonic() + 120, rep)
    assert not isinstance(gt, codecheck.Check), gt
    assert gt["base"] == [2, 3] and gt["plus"] == [4, 5, 6, 7, 41]
    for k in ("base", "plus"):
        assert len(gt[f"{k}_rt"]) == len(gt[k]) == len(gt[f"{k}_time"])
        # the whole cost of an input includes its call (two clocks: a little leeway)
        assert all(rt >= t - 1e-3 and t >= 0
                   for rt, t in zip(gt[f"{k}_rt"], gt[f"{k}_time"], strict=True))
    # evalplus: max(1 s, 4 x the canonical time); ours on top: slack + 2 x the transfer overhead
    limits, outside = codecheck.input_limits([0.0, 0.5, 2.0], [0.25, 0.5, 2.0 + 1.0])
    assert limits == [1.0, 2.0, 8.0]
    assert outside == pytest.approx([1.0 + 0.5 + 0.5, 2.0 + 0.5, 8.0 + 0.5 + 2.0])
    # an input with no overhead measured (clock noise: round trip below the call's own time)
    assert codecheck.input_limits([1.0], [0.9])[1] == pytest.approx([4.5])
