"""Issue 24, item 6: an unwritable results root or cache directory ends every entry point (train,
eval, sweep, synthetic, report) in one line on stderr, exit 2, before any work. The regression:
`FTBENCH_RESULTS=/proc/ftbench python -m experiments.train model=1M train.tokens=4096` ended in a
FileNotFoundError traceback from the tokenizer cache (the sweep's from its folder's mkdir).

/proc refuses new files even to root, so it stands for an unwritable place; a results root that
exists but is read-only is a read-only bind mount in a private mount namespace where possible
(as root, chmod does not stop writes), else chmod.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import can_mount_ro
from fake import write_fake_sweep

REPO = Path(__file__).resolve().parents[1]
BAD = "/proc/ftbench-unwritable"


def _run(args: list[str], tmp: Path, ro: Path | None = None, **env: str) -> tuple[int, str, str]:
    e = {k: v for k, v in os.environ.items() if k != "FTBENCH_CACHE"}
    e.update({"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0",
              "FTBENCH_RESULTS": str(tmp / "results"), **env})
    cmd = [sys.executable, "-m", *args]
    if ro is not None:
        cmd = ["unshare", "-m", "sh", "-c", 'mount --bind -o ro "$0" "$0" && exec "$@"',
               str(ro), *cmd]
    r = subprocess.run(cmd, cwd=REPO, env=e, capture_output=True, text=True, timeout=600)
    return r.returncode, r.stdout, r.stderr


def _one_line(rc: int, err: str, *needles: str) -> None:
    lines = [x for x in err.splitlines() if x.strip()]
    assert rc == 2, err[-2000:]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    for n in needles:
        assert n in lines[0], lines[0]


def test_unwritable_probe(tmp_path):
    from common.io import unwritable  # new in issue 24

    assert unwritable(tmp_path / "a" / "b") is None
    assert not (tmp_path / "a").exists()  # the probe creates nothing
    assert "/proc" in str(unwritable(BAD)) and "not writable" in str(unwritable(BAD))
    (tmp_path / "f").write_text("x")
    assert str(unwritable(tmp_path / "f" / "sub")) == f"{tmp_path / 'f'} is a file"
    assert list(tmp_path.iterdir()) == [tmp_path / "f"]


@pytest.mark.slow  # multi-process or end to end: the CI tier (make test-all)
def test_train_results_and_cache(tmp_path):
    rc, _, err = _run(["experiments.train", "model=1M", "train.tokens=4096"], tmp_path,
                      FTBENCH_RESULTS=BAD)
    _one_line(rc, err, BAD, "FTBENCH_RESULTS")
    rc, _, err = _run(["experiments.train", "model=1M", "train.tokens=4096"], tmp_path,
                      FTBENCH_CACHE=BAD + "/cache")
    _one_line(rc, err, "cache directory", BAD)
    assert not (tmp_path / "results").exists()  # nothing started


def test_tokenizer_cache_error_is_one_line(tmp_path):
    from common.errors import UsageError
    from experiments.corpus.tokenizer import train_bpe

    with pytest.raises(UsageError, match="tokenizer cache .*not writable"):
        train_bpe(["some text " * 50], 300, cache_dir=BAD)


@pytest.mark.slow  # multi-process or end to end: the CI tier (make test-all)
def test_sweep(tmp_path):
    rc, _, err = _run(["sweeps", "run", "--name", "t1", "--kappa", "0.5", "--h", "4",
                       "--seeds", "0", "--tokens", "4096"], tmp_path, FTBENCH_RESULTS=BAD)
    _one_line(rc, err, "sweep: error:", BAD)
    rc, _, err = _run(["sweeps", "run", "--name", "t1", "--kappa", "0.5", "--h", "4",
                       "--seeds", "0", "--tokens", "4096"], tmp_path, FTBENCH_CACHE=BAD)
    _one_line(rc, err, "cache directory", BAD)
    assert not (tmp_path / "results" / "sweeps" / "t1").exists()


def test_report(tmp_path):
    rc, _, err = _run(["analysis.report", "--name", "t1"], tmp_path, FTBENCH_RESULTS=BAD)
    _one_line(rc, err, "t1")
    # an existing sweep in a read-only results root (root ignores chmod: a read-only mount)
    root = tmp_path / "results"
    write_fake_sweep(root, "ro", kappas=(0.5,), controls=())
    before = sorted(p for p in root.rglob("*"))
    if can_mount_ro(tmp_path):
        rc, _, err = _run(["analysis.report", "--name", "ro", "--n-boot", "20"], tmp_path,
                          ro=root)
    else:
        if os.geteuid() == 0:
            pytest.skip("root without a private mount namespace: cannot make a read-only dir")
        (root / "sweeps" / "ro").chmod(0o555)
        try:
            rc, _, err = _run(["analysis.report", "--name", "ro", "--n-boot", "20"], tmp_path)
        finally:
            (root / "sweeps" / "ro").chmod(0o755)
    _one_line(rc, err, "cannot write the report", "not writable")
    assert sorted(p for p in root.rglob("*")) == before


@pytest.mark.slow  # multi-process or end to end: the CI tier (make test-all)
def test_eval_caches(tmp_path, toy_checkpoint, bench_dir):
    ck = toy_checkpoint(tmp_path / "results" / "runs" / "toyrun" / "checkpoints" / "final.pt")
    args = ["experiments.eval", str(ck), "--limit", "1", "--data", str(bench_dir)]
    rc, _, err = _run([*args, "--tasks", "arc_easy"], tmp_path, HF_DATASETS_CACHE=BAD)
    _one_line(rc, err, "HF datasets cache", BAD, "HF_DATASETS_CACHE")
    rc, _, err = _run([*args, "--tasks", "humaneval_plus"], tmp_path, XDG_CACHE_HOME=BAD)
    _one_line(rc, err, "evalplus ground-truth cache", BAD, "XDG_CACHE_HOME")
    rc, _, err = _run([*args, "--tasks", "arc_easy", "--out-dir", BAD + "/eval"], tmp_path)
    _one_line(rc, err, BAD)
    assert not (ck.parent.parent / "eval").exists()
