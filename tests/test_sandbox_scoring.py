"""A code check that could not be made scores as missing (null + reason), never as 0.

Through `evalplus_suite.run_task` (the path `make eval` takes) with a stand-in model: a sandbox
that crashed, did not start, or is unavailable on the machine, and an evaluation budget that ran
out, each leave the item null with a one-line reason; pass@1 is over the scored items and
carries n_missing; a task whose every item is missing has value null; the run never raises.
Sandbox output (which the code controls) is never stored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from experiments.eval import evalplus_suite, sandbox

BENCH = Path(__file__).resolve().parents[2] / "shared" / "benchmarks"
HEP = BENCH / "humanevalplus" / "HumanEvalPlus-v0.1.10.jsonl"


class _LM:
    """generate_until returns fixed completions; gold bpb gets a constant loglikelihood."""

    def __init__(self, completions: list[str]) -> None:
        self.completions = completions
        self.draw_logliks: dict = {}

    def generate_until(self, reqs: list) -> list[str]:
        return self.completions[:len(reqs)]

    def loglikelihood_pairs(self, pairs: list) -> list[tuple[float, bool]]:
        return [(-10.0, False) for _ in pairs]

    def truncation_record(self, args: list) -> dict:
        return {"n_requests": len(args)}


def _canonical(n: int) -> list[str]:
    with open(HEP, encoding="utf-8") as f:
        return [json.loads(next(f))["canonical_solution"] for _ in range(n)]


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    probe = sandbox.isolation
    probe()  # probed before any test breaks run_child
    yield
    probe.cache_clear()  # a test may have cached a refusal


def _run(tmp_path: Path, completions: list[str], **kw: Any) -> dict:
    out = evalplus_suite.run_task(_LM(completions), "humaneval_plus", BENCH, len(completions),
                                tmp_path / "work", **kw)
    return out["humaneval_plus"]


def _assert_all_missing(e: dict, why: str) -> None:
    for it in e["items"]:
        assert it["base"] is None and it["plus"] is None, it
        assert why in it["reason"], it["reason"]
    for m in ("pass@1_base", "pass@1_plus"):
        assert e["metrics"][m]["value"] is None and e["metrics"][m]["n"] == 0
        assert e["metrics"][m]["n_missing"] == len(e["items"])
    assert e["sandbox"]["scored"] == 0 and e["sandbox"]["n_missing"] == len(e["items"])


def _raise(msg: str):
    def crash(*a: Any, **k: Any) -> None:
        raise OSError(msg)
    return crash


DEAD = sandbox.ChildRun(ready=False, result=None, timed_out=False, overflow=False, returncode=1,
                        elapsed_s=0.01, leftovers=0, stderr_tail="oops")
BROKEN = {  # what breaks -> (attribute of sandbox, its stand-in, re-probe, the reason says)
    # a sandbox that crashed, after the probe found one
    "crashed": ("run_child", _raise("bwrap: cannot create namespace"), False, "sandbox error"),
    # even the probe run fails: the machine has no sandbox (the probe's error is named)
    "probe-crashed": ("run_child", _raise("bwrap: setting up uid map: Permission denied"),
                      True, "sandbox unavailable: bubblewrap cannot create namespaces here"),
    # never started: its stderr (which the code controls) is never stored
    "never-started": ("run_child", lambda *a, **k: DEAD, False, "sandbox did not start"),
    "no-bwrap": ("isolation", lambda: sandbox.Isolation(
        "unavailable", "bubblewrap (bwrap) is not installed"), False,
        "sandbox unavailable: bubblewrap"),
}


@pytest.mark.parametrize("what", list(BROKEN))
def test_a_check_that_could_not_be_made_is_missing_not_zero(what: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    attr, stand_in, reprobe, why = BROKEN[what]
    if reprobe:
        sandbox.isolation.cache_clear()
    monkeypatch.setattr(sandbox, attr, stand_in)
    e = _run(tmp_path, _canonical(2))
    _assert_all_missing(e, why)
    assert "oops" not in json.dumps(e)
    if what == "probe-crashed":
        assert "uid map" in e["items"][0]["reason"]
    if attr == "isolation" or reprobe:
        assert e["sandbox"]["isolation"]["mode"] == "unavailable"


def test_partly_missing_scores_over_the_scored_items(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """One real pass and one check whose sandbox crashed: 1/1 scored, 1 missing (not 1/2)."""
    real = sandbox.run_child

    def flaky(job: dict, *a: Any, **k: Any) -> Any:
        if "# crash-this-check" in job["code"]:
            raise OSError("lost the sandbox")
        return real(job, *a, **k)

    monkeypatch.setattr(sandbox, "run_child", flaky)
    c = _canonical(2)
    e = _run(tmp_path, [c[0], c[1] + "# crash-this-check\n"])
    a, b = e["items"]
    assert (a["base"], a["plus"], a["base_status"]) == (1.0, 1.0, "pass") and "reason" not in a
    assert b["base"] is None and "lost the sandbox" in b["reason"]
    m = e["metrics"]["pass@1_plus"]
    assert m["value"] == 1.0 and m["n"] == 1 and m["n_missing"] == 1
    assert e["sandbox"]["isolation"]["mode"].startswith("bwrap")


def test_budget_exhausted_is_missing_and_ends_on_time(tmp_path: Path) -> None:
    # hangs at definition time, which only the check's whole wall clock bounds (a hang inside
    # the function is a per-input timeout, scored, long before any budget)
    hang = "    return None\nimport signal\nsignal.setitimer(signal.ITIMER_REAL, 0)\n" \
           "while True:\n    pass\n"
    e = _run(tmp_path, [hang, hang], timeout_s=2)
    assert e["sandbox"]["timed_out"] is True and e["sandbox"]["elapsed_s"] < 2 + 6
    _assert_all_missing(e, "budget")


def test_wrong_and_hostile_code_fails_and_its_output_is_not_stored(tmp_path: Path) -> None:
    """A real failure is 0 (not missing); what the code prints never reaches the result."""
    leak = ("    import os, sys\n    m = 'LEAK' + 'MARK'\n    print(m)\n"
            "    sys.stderr.write(m)\n    os.write(2, m.encode())\n    raise ValueError(m)\n")
    e = _run(tmp_path, [leak, "    return None\n"])
    assert [(it["base"], it["plus"]) for it in e["items"]] == [(0.0, 0.0), (0.0, 0.0)]
    assert e["metrics"]["pass@1_base"] == {"value": 0.0, "stderr": 0.0, "n": 2, "n_missing": 0}
    assert "LEAKMARK" not in json.dumps(e)
