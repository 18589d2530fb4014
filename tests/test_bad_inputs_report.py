"""Issue 15: bad inputs to `python -m analysis.report`, `python -m sweeps status` and
`python -m experiments.eval.likelihood` get one line naming what is wrong, exit 2, no traceback, and
no new files. One table; each case sets up its results root, runs the command's main in-process
(the real entry is checked once per command in a subprocess below)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from fake import write_fake_sweep

ROOT = Path(__file__).resolve().parents[1]


def _none(root: Path) -> None:
    (root / "sweeps").mkdir(parents=True)


def _corrupt(root: Path) -> None:
    d = root / "sweeps" / "bad"
    d.mkdir(parents=True)
    (d / "manifest.json").write_text('{"name": "bad", "cells": [', encoding="utf-8")


def _not_manifest(root: Path) -> None:
    d = root / "sweeps" / "bad"
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(json.dumps([1, 2]), encoding="utf-8")


def _report_dir_is_file(root: Path) -> None:
    write_fake_sweep(root, "ok", kappas=(2.0,), seeds=(0,), controls=())
    (root / "sweeps" / "ok" / "report").write_text("not a folder", encoding="utf-8")


def _report_html_is_dir(root: Path) -> None:
    write_fake_sweep(root, "ok", kappas=(2.0,), seeds=(0,), controls=())
    (root / "sweeps" / "ok" / "report.html").mkdir()


def _unwritable(root: Path) -> None:
    write_fake_sweep(root, "ok", kappas=(2.0,), seeds=(0,), controls=())
    os.chmod(root / "sweeps" / "ok", 0o555)


def _run_without_ckpt(root: Path) -> None:
    (root / "runs" / "r1").mkdir(parents=True)


def _report(name: str, *extra: str) -> Callable[[Path], list[str]]:
    return lambda root: ["analysis.report", "--name", name, "--root", str(root), *extra]


def _lik(*args: str) -> Callable[[Path], list[str]]:
    return lambda root: ["experiments.eval.likelihood",
                         *[a.replace("ROOT", str(root)) for a in args]]


CASES = [  # id, setup, argv (module first), the named value in the one line
    ("report-missing-sweep", _none, _report("nope"), "no sweep 'nope'"),
    ("report-missing-results-root", lambda r: None, _report("nope"), "does not exist"),
    ("report-corrupt-manifest", _corrupt, _report("bad"),
     "sweeps/bad/manifest.json is corrupt (JSONDecodeError"),
    ("report-manifest-not-object", _not_manifest, _report("bad"), "is not a sweep manifest"),
    ("report-dir-is-a-file", _report_dir_is_file, _report("ok"),
     "sweeps/ok/report is not a writable directory"),
    ("report-html-is-a-dir", _report_html_is_dir, _report("ok"),
     "report.html is not a writable file"),
    ("report-unwritable", _unwritable, _report("ok"), "sweeps/ok is not a writable directory"),
    ("report-n-boot-0", _none, _report("nope", "--n-boot", "0"), "--n-boot: 0 must be >= 1"),
    ("report-name-with-slash", _none, _report("../x"), "NAME '../x' is not a sweep name"),
    ("status-missing-sweep", _none, lambda r: ["sweeps", "status", "nope", "--results", str(r)],
     "no sweep 'nope'"),
    ("likelihood-missing-run", _none, _lik("ROOT/runs/none"), "no such run directory"),
    ("likelihood-no-checkpoint", _run_without_ckpt, _lik("ROOT/runs/r1"), "no checkpoint at"),
    ("likelihood-bad-k", _run_without_ckpt, _lik("ROOT/runs/r1", "--k", "1,x"),
     "--k: '1,x' is not a comma-separated list"),
    ("likelihood-k-zero", _run_without_ckpt, _lik("ROOT/runs/r1", "--k", "0,8"),
     "must list integers >= 1"),
    ("likelihood-max-rows-0", _run_without_ckpt, _lik("ROOT/runs/r1", "--max-rows", "0"),
     "--max-rows: 0 must be >= 1"),
]


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


def _main(module: str) -> Callable[[list[str]], int | None]:
    if module == "analysis.report":
        from analysis.report import main
    elif module == "sweeps":
        from sweeps.__main__ import main
    else:
        from experiments.eval.likelihood import main
    return main


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_one_line(case: tuple, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cid, setup, argv, named = case
    if cid == "report-unwritable" and os.geteuid() == 0:
        pytest.skip("root writes through directory permissions; the file-type cases cover it")
    root = tmp_path / "results"
    setup(root)
    before = _tree(root)
    module, *args = argv(root)
    try:
        rc = _main(module)(args)
    except SystemExit as e:
        rc = e.code
    finally:
        if root.exists():
            for d in root.rglob("*"):
                if d.is_dir():
                    os.chmod(d, 0o755)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert named in err, err
    assert _tree(root) == before  # nothing half-written


@pytest.mark.parametrize("argv", [
    ["analysis.report", "--name", "nope"], ["sweeps", "status", "nope"],
    ["experiments.eval.likelihood", "nope-run"]])
def test_real_entry_points(argv: list[str], tmp_path: Path) -> None:
    env = {**os.environ, "FTBENCH_RESULTS": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "nope" in r.stderr
    assert not list(tmp_path.iterdir())
