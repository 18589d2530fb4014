"""The make layer (docs/MAKE.md): every boolean read one way, hydra overrides and the synthetic
sweep named one way on every target (issue 23), any variable no goal takes refused naming the
nearest one (issue 43), values from the command line only and shell-quoted, `make demo` and
`make smoke` wired through the user-facing targets, `make help` in pipeline order and plain text
into a pipe (issue 46).

Only command lines are looked at: `make -n -W .venv/.setup-stamp -o setup ...` neither runs
`setup` (no install) nor any recipe. The demo itself (~30 minutes on 2 CPU cores) is exercised by
running `make demo`; `make smoke` is tests/test_e2e.py's pipeline.
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


CASES = {  # flag -> (target and other variables, the name the flag is given as, what the command
    # line holds when the flag is on, and when off: a sweep flag is always passed, as 1 or 0)
    "DRY_TRAIN": (["train", "OVERRIDES=model=1M"], "DRY", "train.dry_run=true", None),
    "HELP": (["train", "OVERRIDES=model=1M"], "HELP", "-m experiments.train --help", None),
    "DRY": (["sweep"], "DRY", "--dry='1'", "--dry='0'"),
    "EVAL": (["sweep"], "EVAL", "--eval='1'", "--eval='0'"),
    "RETRY_FAILED": (["sweep"], "RETRY_FAILED", "--retry-failed='1'", "--retry-failed='0'"),
    "CHECK": (["report", "NAME=x"], "CHECK", "--check", None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_flag_reads_true_false_and_empty_one_way(case: str) -> None:
    """Every spelling on one flag; on the others a true word, a false word and empty (one make
    function reads them all; a bad spelling is refused: REFUSED below)."""
    args, var, on, off = CASES[case]
    every = ("1", "true", "yes", "0", "false", "no", "")
    for v in every if case == "DRY" else ("yes", "false", ""):
        res = _make(*args, f"{var}={v}")
        assert res.returncode == 0, res.stderr
        true = v in ("1", "true", "yes")
        assert (on in res.stdout) == true and (off is None or (off in res.stdout) != true), \
            (var, v, res.stdout)


def test_not_given_is_off_and_the_environment_does_not_count() -> None:
    env = dict.fromkeys(("DRY", "HELP", "EVAL", "CHECK", "RETRY_FAILED"), "1")
    out = _make("train", "OVERRIDES=model=1M", env=env).stdout
    assert "dry_run" not in out and "--help" not in out, out
    line = next(ln for ln in _make("sweep", env=env).stdout.splitlines() if "sweeps run" in ln)
    assert "--dry" not in line and "--eval" not in line and "--retry" not in line, line
    assert "--check" not in _make("report", "NAME=x", env=env).stdout
    assert _make("train", env={"DRY": "maybe"}).returncode == 0  # nor is a bad value there
    # nor any other variable (WSL sets NAME; other tools set DATA); values survive quotes
    out = _make("sweep", "KAPPA=0.5 it's", "DRY=1", env={"NAME": "wsl", "DATA": "x"}).stdout
    line = next(ln for ln in out.splitlines() if "-m sweeps run" in ln)
    assert "--name" not in line and "--data" not in line, line
    assert "--kappa='0.5 it'\\''s'" in line, line
    res = subprocess.run(["bash", "-c", "printf '%s\\n' " + line.split("run ", 1)[1]],
                         capture_output=True, text=True, check=True)
    assert "--kappa=0.5 it's" in res.stdout.splitlines()
    out = _make("eval", "CKPT=a b", "BENCH_DATA=/bench").stdout  # benchmark files: BENCH_DATA
    assert "'a b'" in out and "--data='/bench'" in out, out


def test_one_name_per_thing_on_every_target() -> None:
    """OVERRIDES (hydra overrides), SYN_NAME (the synthetic sweep), lm-eval's own ARGS."""
    for target in ("train", "sweep", "synthetic"):
        out = _make(target, "OVERRIDES=optim.lr=1e-3 train.seed=7").stdout
        if target == "sweep":
            assert "--overrides='optim.lr=1e-3 train.seed=7'" in out, out
        else:  # a hydra override list: separate words on the program's command line
            assert re.search(r" optim\.lr=1e-3 train\.seed=7(\s|$)", out), out
    out = _make("lm-eval", "CKPT=x", "ARGS=--tasks arc_easy --limit 2").stdout
    assert "lm_eval_cli --ckpt='x'" in out and "--tasks arc_easy --limit 2" in out
    assert "--name 'mid'" in _make("synthetic", "SYN_NAME=mid").stdout
    assert "--name 'mid'" in _make("synthetic-report", "SYN_NAME=mid").stdout
    assert "--synthetic='mid'" in _make("report", "NAME=x", "SYN_NAME=mid").stdout
    assert "--synthetic" not in _make("report", "NAME=x").stdout  # not given: none embedded


def _sweep_line(out: str) -> str:
    m = re.search(r"-m sweeps run (.*)", out)
    assert m, out
    return m.group(1).replace("='", " '")  # --opt 'v' or --opt='v'


def test_demo_runs_sweep_eval_synthetic_report_in_order() -> None:
    out = _make("demo", "DEMO_CHECK=1", "BENCH_DATA=/tmp").stdout
    s = _sweep_line(out)
    for want in ("--kappa '0.5 2 4'", "--h '8'", "--seeds '0'", "--preset '1M'",
                 "--data 'stdlib'", "--tokens '200k'", "--controls 'flops'", "--name 'demo'",
                 "--eval '1'", "--data /tmp", "--limit 30",
                 "--tasks arc_easy,arc_challenge,commonsense_qa,gsm8k,humaneval_plus"):
        assert want in s, (want, s)
    syn = out.index("-m experiments.synthetic --name 'demo'")
    assert out.index("-m sweeps run") < syn < out.index("-m analysis.report --name 'demo'")
    assert "--synthetic='demo' --check" in out
    assert "[demo done" in out and "sweeps/demo/report.html" in out
    assert all(f"[demo {step}" in out for step in ("1/5", "2-3/5", "4/5", "5/5"))
    out = _make("demo", "DEMO_CHECK=0", "BENCH_DATA=/tmp").stdout
    assert "SYN_NAME=demo" in out and "SYNTH" not in out and "SYN_ARGS" not in out, out


def test_smoke_is_the_sweep_with_eval_on_the_shipped_sample_then_the_report() -> None:
    out = _make("smoke").stdout
    s = _sweep_line(out)
    for want in ("--kappa '2'", "--h '4'", "--seeds '0'", "--preset '1M'", "--data 'stdlib'",
                 "--tokens '16k'", "--name 'smoke'", "--eval '1'",
                 "--tasks arc_easy,gsm8k --limit 5", "experiments/eval/smoke_data"):
        assert want in s, (want, s)
    assert "HF_DATASETS_OFFLINE=1" in out and "HF_HUB_OFFLINE=1" in out
    assert out.index("-m sweeps run") < out.index("-m analysis.report --name 'smoke'")
    assert "smoke: done; report: " in out


def test_the_offline_bundle_downloads_the_pinned_wheels_for_the_nodes_python() -> None:
    out = _make("offline-bundle", "OUT=/b", "PY_VERSION=3.12").stdout
    out = re.sub(r"\s*\\\n\s*", " ", out)  # one line per command
    assert ("-m pip download -q --no-deps --only-binary=:all: --python-version '3.12' "
            "--platform 'any' -d '/b' hydra-core==1.3.8 omegaconf==2.3.1 lm_eval==0.4.13 "
            "dill==0.4.1") in out
    assert "-m pip wheel -q --no-deps -w '/b' antlr4-python3-runtime==4.9.3" in out
    assert "python3 -m pip install --no-index --no-deps /b/*.whl" in out


REFUSED = [  # command line -> the one line's start (after make's `*** `)
    # a variable no goal takes: the nearest known name, else who takes it
    (["sweep", "KAPA=1", "DRY=1"], "KAPA: unknown variable for make sweep; did you mean KAPPA?"),
    (["sweep", "SEED=1", "DRY=1"], "SEED: unknown variable for make sweep; did you mean SEEDS?"),
    (["sweep", "kappa=1", "DRY=1"], "kappa: unknown variable for make sweep; did you mean KAPPA?"),
    (["eval", "CKP=x"], "CKP: unknown variable for make eval; did you mean CKPT?"),
    (["eval", "CKPT=x", "DATA=/corpus"], "DATA: unknown variable for make eval; make corpus"),
    (["train", "KAPPA=1"], "KAPPA: unknown variable for make train; make sweep takes it"),
    (["sweep", "report", "NAME=x", "SYN_NAM=y"], "SYN_NAM: unknown variable for make sweep "
                                                  "report; did you mean SYN_NAME?"),
    ([], "FOO: unknown variable for make help"),  # no goal: help
    (["sweep", "FTBENCH_RESULTS=/tmp/x"], "FTBENCH_RESULTS: an environment setting, not a make "
                                         "variable; put it before make"),
    # the old names, naming the new one; a config key outside OVERRIDES
    (["train", "ARGS=model=1M"], "ARGS: hydra overrides are OVERRIDES on every target"),
    (["demo", "SYN_ARGS=train.seed=1"], "SYN_ARGS: renamed OVERRIDES"),
    (["report", "NAME=x", "SYNTH=default"], "SYNTH: renamed SYN_NAME"),
    (["train", "OVERRIDES=model=1M", "train.tokens=20000"],
     "train.tokens: looks like a config key outside OVERRIDES"),
    # a boolean that is none (every flag is read by one function)
    *[([*CASES[c][0], f"{CASES[c][1]}={v}"], f"{CASES[c][1]}={v}: not a boolean; use "
       "1/true/yes for true, 0/false/no or empty for false")
      for c, v in [("DRY", "maybe"), ("CHECK", "TRUE"), ("HELP", "1 0"), ("EVAL", "on")]],
]


@pytest.mark.parametrize("args, line", REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_a_bad_variable_is_refused_in_one_line(args: list[str], line: str) -> None:
    res = _make(*args, *(["FOO=1"] if not args else []))
    assert res.returncode == 2 and res.stdout == "", res.stdout
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].split("*** ", 1)[1].startswith(line), res.stderr


def test_a_refused_variable_stops_make_before_setup_or_any_recipe(tmp_path: Path) -> None:
    """Not a dry run: setup (which would start python and maybe pip) and the sweep never run;
    a recipe's own usage line (report without NAME) stops it too."""
    res = _make("sweep", "KAPA=1", "DRY=1", f"VENV={tmp_path / 'venv'}", dry=False,
                env={"FTBENCH_RESULTS": str(tmp_path / "results")})
    assert res.returncode == 2 and "did you mean KAPPA?" in res.stderr, res.stderr
    assert list(tmp_path.iterdir()) == []  # no venv created, no results root
    res = subprocess.run(["make", "-W", ".venv/.setup-stamp", "-o", "setup", "report"],
                         cwd=ROOT, capture_output=True, text=True, check=False,
                         env={k: v for k, v in os.environ.items() if k != "NAME"})
    assert res.returncode != 0 and "usage: make report NAME=<sweep>" in res.stdout


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


def test_help_lists_the_targets_in_pipeline_order_as_plain_text_in_a_pipe() -> None:
    out = _make("help", dry=False).stdout  # into a pipe: `make help | cat`
    assert "\x1b" not in out and "  sweeps " in out, out
    idx = {n: i for i, n in enumerate(_targets())}
    pipeline = ["setup", "demo", "train", "sweep", "eval", "report", "test", "test-all"]
    assert [idx[n] for n in pipeline] == sorted(idx[n] for n in pipeline), idx
    assert "-m sweeps list" in _make("sweeps").stdout
