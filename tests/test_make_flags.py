"""Make reads every boolean one way, names hydra overrides and the synthetic sweep one way on
every target, refuses the old names (issue 23) and any variable no goal takes, naming the nearest
one (issue 43); `make help` writes plain text into a pipe (issue 46). docs/MAKE.md.

Only command lines are looked at: `make -n -W .venv/.setup-stamp -o setup ...` neither runs
`setup` (no install) nor any recipe.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")

TRUE = ("1", "true", "yes")
FALSE = ("0", "false", "no", "")
BAD = ("maybe", "TRUE", "on", "2", "1 0", "yes please")


# the make a user starts: under `make test` pytest inherits the outer make's level and flags, and a
# make at level 1 is a sub-make, whose variables are not checked
MAKE_ENV = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")


def _make(*args: str, env: dict[str, str] | None = None, dry: bool = True
          ) -> subprocess.CompletedProcess:
    """`make -n` by default: the command lines only, setup neither run nor printed."""
    e = {k: v for k, v in os.environ.items() if k not in ("DRY", "HELP", "EVAL", "CHECK",
                                                          "RETRY_FAILED", *MAKE_ENV)}
    flags = ["-n", "-W", ".venv/.setup-stamp", "-o", "setup"] if dry else []
    return subprocess.run(["make", "-s", *flags, *args], cwd=ROOT, capture_output=True,
                          text=True, env={**e, **(env or {})}, check=False)


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


# ------------------------------------------------------------- mistyped variables (issue 43)
TYPOS = [  # command line -> the one line's start (the nearest known name, else who takes it)
    (["sweep", "KAPA=1", "DRY=1"], "KAPA: unknown variable for make sweep; did you mean KAPPA?"),
    (["sweep", "SEED=1", "DRY=1"], "SEED: unknown variable for make sweep; did you mean SEEDS?"),
    (["sweep", "kappa=1", "DRY=1"], "kappa: unknown variable for make sweep; did you mean KAPPA?"),
    (["eval", "CKP=x"], "CKP: unknown variable for make eval; did you mean CKPT?"),
    (["train", "OVERRIDE=model=1M"], "OVERRIDE: unknown variable for make train; did you mean "
                                     "OVERRIDES?"),
    (["eval", "CKPT=x", "DATA=/corpus"], "DATA: unknown variable for make eval; make corpus"),
    (["train", "KAPPA=1"], "KAPPA: unknown variable for make train; make sweep takes it"),
    (["sweep", "report", "NAME=x", "SYN_NAM=y"], "SYN_NAM: unknown variable for make sweep "
                                                  "report; did you mean SYN_NAME?"),
    (["help", "FOO=1"], "FOO: unknown variable for make help"),
    ([], "FOO: unknown variable for make help"),  # no goal: help
    (["sweep", "FTBENCH_RESULTS=/tmp/x"], "FTBENCH_RESULTS: an environment setting, not a make "
                                         "variable; put it before make"),
]


@pytest.mark.parametrize("args, line", TYPOS, ids=[" ".join(a) for a, _ in TYPOS])
def test_a_variable_no_goal_takes_is_refused_naming_the_intended_one(args, line) -> None:
    res = _make(*args, *(["FOO=1"] if not args else []))
    assert res.returncode == 2 and res.stdout == "", res.stdout
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].split("*** ", 1)[1].startswith(line), res.stderr


def test_a_refused_variable_stops_make_before_setup_or_any_recipe(tmp_path: Path) -> None:
    """Not a dry run: setup (which would start python and maybe pip) and the sweep never run."""
    res = _make("sweep", "KAPA=1", "DRY=1", f"VENV={tmp_path / 'venv'}", dry=False,
                env={"FTBENCH_RESULTS": str(tmp_path / "results")})
    assert res.returncode == 2 and "did you mean KAPPA?" in res.stderr, res.stderr
    assert list(tmp_path.iterdir()) == []  # no venv created, no results root


def _targets() -> list[str]:
    out = _make("help", dry=False).stdout
    return [ln.split()[0] for ln in out.splitlines() if ln.startswith("  ")]


def _trace(target: str, *args: str) -> tuple[set[str], set[str]]:
    """(the variables the target takes, those its recipe asked `given` about) in this make."""
    res = _make(target, "_TRACE_VARS=1", *args)
    assert res.returncode == 0, res.stderr
    known = next(ln for ln in res.stdout.splitlines() if ln.startswith("known:")).split()[1:]
    asked = {ln.split()[1] for ln in res.stdout.splitlines() if ln.startswith("given[0]:")}
    return set(known), asked


BRANCHES = {  # the variables that open a recipe's other branches (make expands only the taken one)
    "train": [["DRY=1"], ["HELP=1"], ["NNODES=2", "MASTER_ADDR=h", "NPROC=2"]],
    "eval": [["CKPT=x", "NPROC=2", "BENCH_DATA=/b"]],
    "demo": [["BENCH_DATA=/b"]], "offline-bundle": [["OUT=/o"]],
}


@pytest.mark.parametrize("target", _targets() if shutil.which("make") else [])
def test_every_variable_a_recipe_reads_is_in_its_targets_table(target: str) -> None:
    """KNOWN_<target> cannot drift from the recipe: what the recipe asks `given` about (every
    `arg`, `opt`, `flag` goes through it), on each branch, is in the table."""
    for args in [[], *BRANCHES.get(target, [])]:
        known, asked = _trace(target, *args)
        assert asked <= known, (target, args, sorted(asked - known))


def test_the_command_lines_the_readme_and_mk_files_show_are_accepted() -> None:
    """Every `make <target> VAR=...` in README.md and in the mk/*.mk usage comments."""
    snippets = re.findall(r"`(make [a-z][^`]*)`", (ROOT / "README.md").read_text())
    for f in sorted((ROOT / "mk").glob("*.mk")):
        snippets += re.findall(r"^#\s+(make [a-z][a-z-]*(?: [A-Z_]+=(?:\"[^\"]*\"|\S*))*)",
                               f.read_text(), flags=re.M)
    targets, wanted = set(_targets()), {}
    for s in snippets:
        words = shlex.split(s.replace("\\|", "|").replace("[", " ").replace("]", " "))
        if words[1] in targets:
            wanted.setdefault(words[1], set()).update(
                w.split("=")[0] for w in words[2:] if re.match(r"[A-Za-z_]\w*=", w))
    assert {"sweep", "train", "eval", "paper"} <= set(wanted)  # the scan sees the commands
    for target, names in wanted.items():
        known, _ = _trace(target, *BRANCHES.get(target, [[]])[0])
        assert names <= known, (target, sorted(names - known))


def test_help_writes_plain_text_into_a_pipe_and_sweeps_lists_the_sweeps() -> None:
    out = _make("help", dry=False).stdout  # into a pipe: `make help | cat`
    assert "\x1b" not in out and "  sweeps " in out, out
    assert "-m sweeps list" in _make("sweeps").stdout
