"""Make reads every boolean one way, names hydra overrides and the synthetic sweep one way on
every target, and refuses the old names (issue 23; docs/MAKE.md).

Only command lines are looked at: `make -n -W .venv/.setup-stamp -o setup ...` neither runs
`setup` (no install) nor any recipe.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")

TRUE = ("1", "true", "yes")
FALSE = ("0", "false", "no", "")
BAD = ("maybe", "TRUE", "on", "2", "1 0", "yes please")


def _make(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("DRY", "HELP", "EVAL", "CHECK",
                                                          "RETRY_FAILED", "MAKEFLAGS")}
    return subprocess.run(["make", "-s", "-n", "-W", ".venv/.setup-stamp", "-o", "setup", *args],
                          cwd=ROOT, capture_output=True, text=True, env={**e, **(env or {})},
                          check=False)


def _reads(res: subprocess.CompletedProcess, var: str) -> bool:
    """What the printed command says the flag `var` was read as."""
    assert res.returncode == 0, res.stderr
    out = res.stdout
    if var == "DRY_TRAIN":
        return "train.dry_run=true" in out
    if var == "HELP":
        return "-m experiments.train --help" in out
    if var == "CHECK":
        return "--check" in out
    opt = {"DRY": "dry", "EVAL": "eval", "RETRY_FAILED": "retry-failed"}[var]
    m = re.search(rf"--{opt}='([01])'", out)
    assert m, out  # given on the command line: always passed, as 1 or 0
    return m.group(1) == "1"


CASES = {  # flag -> (target and other variables, the name the flag is given as)
    "DRY_TRAIN": (["train", "OVERRIDES=model=1M"], "DRY"),
    "HELP": (["train", "OVERRIDES=model=1M"], "HELP"),
    "DRY": (["sweep"], "DRY"),
    "EVAL": (["sweep"], "EVAL"),
    "RETRY_FAILED": (["sweep"], "RETRY_FAILED"),
    "CHECK": (["report", "NAME=x"], "CHECK"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_flag_reads_true_false_and_empty_one_way(case: str) -> None:
    args, var = CASES[case]
    for v in TRUE:
        assert _reads(_make(*args, f"{var}={v}"), case), (var, v)
    for v in FALSE:
        assert not _reads(_make(*args, f"{var}={v}"), case), (var, v)


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_boolean_is_refused_in_one_line(case: str) -> None:
    args, var = CASES[case]
    for v in BAD:
        res = _make(*args, f"{var}={v}")
        assert res.returncode == 2 and res.stdout == "", (var, v, res.stdout)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1, res.stderr
        assert f"{var}={v}: not a boolean; use 1/true/yes for true, 0/false/no or empty for " \
               f"false" in lines[0]


def test_not_given_is_off_and_the_environment_does_not_count() -> None:
    env = dict.fromkeys(("DRY", "HELP", "EVAL", "CHECK", "RETRY_FAILED"), "1")
    out = _make("train", "OVERRIDES=model=1M", env=env).stdout
    assert "dry_run" not in out and "--help" not in out, out
    line = next(ln for ln in _make("sweep", env=env).stdout.splitlines() if "sweeps run" in ln)
    assert "--dry" not in line and "--eval" not in line and "--retry" not in line, line
    assert "--check" not in _make("report", "NAME=x", env=env).stdout
    # a bad value in the environment is not read either
    assert _make("train", env={"DRY": "maybe"}).returncode == 0


def test_the_old_train_bug_dry_false_is_not_a_dry_run() -> None:
    """Before: `make train DRY=false` did a dry run and `make report CHECK=true` did not check."""
    assert "dry_run" not in _make("train", "OVERRIDES=model=1M", "DRY=false").stdout
    assert "--check" in _make("report", "NAME=x", "CHECK=true").stdout


@pytest.mark.parametrize("target", ["train", "sweep", "synthetic"])
def test_overrides_is_the_hydra_override_variable_on_every_target(target: str) -> None:
    out = _make(target, "OVERRIDES=optim.lr=1e-3 train.seed=7").stdout
    if target == "sweep":
        assert "--overrides='optim.lr=1e-3 train.seed=7'" in out, out
    else:  # a hydra override list: separate words on the program's command line
        assert re.search(r" optim\.lr=1e-3 train\.seed=7(\s|$)", out), out


@pytest.mark.parametrize("args, new", [
    (["train", "ARGS=model=1M"], "OVERRIDES"),
    (["sweep", "ARGS=model=1M"], "OVERRIDES"),
    (["synthetic", "SYN_ARGS=train.seed=1"], "OVERRIDES"),
    (["demo", "SYN_ARGS=train.seed=1"], "OVERRIDES"),
    (["report", "NAME=x", "SYNTH=default"], "SYN_NAME"),
])
def test_old_names_are_refused_naming_the_new_one(args: list[str], new: str) -> None:
    res = _make(*args)
    old = args[-1].split("=")[0]
    assert res.returncode == 2 and res.stdout == "", res.stdout
    line = res.stderr.strip()
    assert len(line.splitlines()) == 1 and line.split("*** ")[1].startswith(f"{old}:"), line
    assert new in line


def test_lm_eval_keeps_args_for_its_own_flags() -> None:
    out = _make("lm-eval", "CKPT=x", "ARGS=--tasks arc_easy --limit 2").stdout
    assert "lm_eval_cli --ckpt='x'" in out and "--tasks arc_easy --limit 2" in out


def test_syn_name_names_the_synthetic_sweep_on_every_target() -> None:
    assert "--name 'mid'" in _make("synthetic", "SYN_NAME=mid").stdout
    assert "--name 'mid'" in _make("synthetic-report", "SYN_NAME=mid").stdout
    assert "--synthetic='mid'" in _make("report", "NAME=x", "SYN_NAME=mid").stdout
    assert "--synthetic" not in _make("report", "NAME=x").stdout  # not given: none embedded
    out = _make("demo", "DEMO_CHECK=0", "BENCH_DATA=/tmp").stdout
    assert "SYN_NAME=demo" in out and "SYNTH" not in out and "SYN_ARGS" not in out, out
