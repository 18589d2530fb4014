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
    out = _dry("demo", "DEMO_CHECK=1", "BENCH_DATA=/tmp")
    sweep = re.search(r"-m sweeps run (.*)", out)
    assert sweep, out
    s = sweep.group(1).replace("='", " '")  # --opt 'v' or --opt='v'
    for want in ("--kappa '0.5 2 4'", "--h '8'", "--seeds '0'", "--preset '1M'",
                 "--data 'stdlib'", "--tokens '200k'", "--controls 'flops'", "--name 'demo'",
                 "--eval '1'",
                 "--tasks arc_easy,arc_challenge,commonsense_qa,gsm8k,humaneval_plus",
                 "--limit 30"):
        assert want in s, (want, s)
    assert "--data /tmp" in s
    syn = out.index("-m experiments.synthetic --name 'demo'")
    rep = out.index("-m analysis.report --name 'demo'")
    assert out.index("-m sweeps run") < syn < rep
    assert "--synthetic='demo' --check" in out
    assert "[demo done" in out and "sweeps/demo/report.html" in out
    for step in ("1/5", "2-3/5", "4/5", "5/5"):
        assert f"[demo {step}" in out


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_smoke_is_the_sweep_with_eval_on_the_shipped_sample_then_the_report():
    """`make smoke` is tests/test_e2e.py's pipeline through make: its wiring, not its run."""
    out = _dry("smoke")
    sweep = re.search(r"-m sweeps run (.*)", out)
    assert sweep, out
    s = sweep.group(1).replace("='", " '")
    for want in ("--kappa '2'", "--h '4'", "--seeds '0'", "--preset '1M'", "--data 'stdlib'",
                 "--tokens '16k'", "--name 'smoke'", "--eval '1'",
                 "--tasks arc_easy,gsm8k --limit 5", "experiments/eval/smoke_data"):
        assert want in s, (want, s)
    assert "HF_DATASETS_OFFLINE=1" in out and "HF_HUB_OFFLINE=1" in out
    assert out.index("-m sweeps run") < out.index("-m analysis.report --name 'smoke'")
    assert "smoke: done; report: " in out


def test_report_target_requires_a_name():
    env = {**os.environ}
    env.pop("NAME", None)
    res = subprocess.run(["make", "-W", ".venv/.setup-stamp", "-o", "setup", "report"], cwd=ROOT,
                         capture_output=True, text=True, env=env, check=False)
    assert res.returncode != 0 and "usage: make report NAME=<sweep>" in res.stdout


def _make(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-W", ".venv/.setup-stamp", "-o", "setup", *args], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, **(env or {})},
                          check=False)


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_make_arguments_come_from_the_command_line_only_and_survive_quotes():
    # the environment never leaks in (WSL sets NAME; other tools set DATA)
    out = _make("-n", "sweep", "KAPPA=0.5 it's", "DRY=1", env={"NAME": "wsl", "DATA": "x"}).stdout
    line = next(ln for ln in out.splitlines() if "-m sweeps run" in ln)
    assert "--name" not in line and "--data" not in line, line
    assert "--kappa='0.5 it'\\''s'" in line, line
    res = subprocess.run(["bash", "-c", "printf '%s\\n' " + line.split("run ", 1)[1]],
                         capture_output=True, text=True, check=True)
    assert "--kappa=0.5 it's" in res.stdout.splitlines()
    # eval reads benchmark files from BENCH_DATA (DATA, a training corpus, is refused there:
    # tests/test_make_flags.py)
    out = _make("-n", "eval", "CKPT=a b", "BENCH_DATA=/bench").stdout
    assert "'a b'" in out and "--data='/bench'" in out, out


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_an_unquoted_config_key_outside_overrides_is_refused():
    res = _make("-n", "train", "OVERRIDES=model=1M", "train.tokens=20000")
    assert res.returncode == 2
    assert "train.tokens: looks like a config key outside OVERRIDES" in res.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_help_lists_targets_in_pipeline_order():
    out = _make("help").stdout
    names = [re.sub(r"\x1b\[[0-9;]*m", "", ln).split()[0] for ln in out.splitlines() if ln.strip()]
    assert names
    idx = {n: i for i, n in enumerate(names)}
    pipeline = ["setup", "demo", "train", "sweep", "eval", "report", "test", "test-all"]
    assert [n for n in pipeline if n in idx] == pipeline, names
    assert all(idx[a] < idx[b] for a, b in zip(pipeline, pipeline[1:], strict=False)), names
