"""`make demo` is wired through the user-facing targets with its documented settings.

This is the dry-run check (`make -n`, seconds). The end-to-end demo itself takes ~30 minutes on
2 CPU cores and is exercised by running `make demo`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _dry(*args: str) -> str:
    env = {**os.environ, "FTBENCH_RESULTS": "/nonexistent-results"}
    # -W marks the venv stamp as new, so `setup` prints nothing and nothing is installed
    out = subprocess.run(["make", "-n", "-W", ".venv/.setup-stamp", "-o", "setup", *args],
                         cwd=ROOT, capture_output=True, text=True, env=env, check=True)
    return out.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_demo_runs_sweep_eval_synthetic_report_in_order():
    out = _dry("demo", "DEMO_CHECK=1")
    sweep = re.search(r"-m sweeps run (.*)", out)
    assert sweep, out
    s = sweep.group(1).replace("='", " '")  # --opt 'v' or --opt='v'
    for want in ("--kappa '0.5 2 4'", "--h '8'", "--seeds '0'", "--preset '1M'",
                 "--data 'stdlib'", "--tokens '200k'", "--controls 'flops'", "--name 'demo'",
                 "--eval '1'",
                 "--tasks arc_easy,arc_challenge,commonsense_qa,gsm8k,humaneval_plus",
                 "--limit 30"):
        assert want in s, (want, s)
    assert re.search(r"--data \S*/benchmarks", s)
    syn = out.index("-m experiments.synthetic --name demo")
    rep = out.index("-m analysis.report --name demo")
    assert out.index("-m sweeps run") < syn < rep
    assert "--synthetic demo --check" in out
    assert "[demo done" in out and "sweeps/demo/report.html" in out
    for step in ("1/5", "2-3/5", "4/5", "5/5"):
        assert f"[demo {step}" in out


def test_report_target_requires_a_name():
    env = {**os.environ}
    env.pop("NAME", None)
    res = subprocess.run(["make", "-W", ".venv/.setup-stamp", "-o", "setup", "report"], cwd=ROOT,
                         capture_output=True, text=True, env=env, check=False)
    assert res.returncode != 0 and "usage: make report NAME=<sweep>" in res.stdout
