"""`python -m experiments.bench` bad inputs: one line, exit 2, no traceback, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.bench import __main__ as bench

REPO = Path(__file__).resolve().parents[1]


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# (args, extra env, text the message must contain); {tmp} is the test's temporary directory
CASES = [
    (["--sections", "train,nope"], {}, "nope"),
    (["--reps", "4"], {}, "--reps 4"),
    (["--warmup", "-1"], {}, "--warmup -1"),
    ([], {"BENCH_SIZE": "huge"}, "huge"),
    (["--threads", "0"], {}, "--threads 0"),
    (["--reps", "x"], {}, "'x'"),
    # a results root under a regular file can never be created (even by root)
    ([], {"FTBENCH_RESULTS": "{tmp}/afile/res"}, "afile"),
    (["--md", "{tmp}/afile/out.md"], {}, "afile"),
]


@pytest.mark.parametrize("args,env,named", CASES, ids=[" ".join(c[0]) or str(c[1])
                                                       for c in CASES])
def test_bad_input_one_line_exit_2_nothing_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        args: list[str], env: dict[str, str], named: str) -> None:
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("FTBENCH_RESULTS", str(tmp_path / "results"))
    monkeypatch.delenv("BENCH_SIZE", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v.format(tmp=tmp_path))
    before = _tree(tmp_path)
    assert bench.main([a.format(tmp=tmp_path) for a in args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m experiments.bench: error: ")
    assert len(err.strip().splitlines()) == 1, err
    assert named in err
    assert _tree(tmp_path) == before  # nothing written, the results root not even created


def test_bad_input_through_the_real_cli(tmp_path: Path) -> None:
    env = {**os.environ, "FTBENCH_RESULTS": str(tmp_path / "results")}
    r = subprocess.run([sys.executable, "-m", "experiments.bench", "--reps", "0"], cwd=REPO,
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        "python -m experiments.bench: error: --reps 0: every figure is a median of at least "
        "5 reps"]
    assert list(tmp_path.iterdir()) == []
