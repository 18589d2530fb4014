"""Issue 24, item 5: benchmark data is read-only to the suite. HF `datasets` caches a processed
copy beside a `save_to_disk` source, so an evaluation including hellaswag left two cache-*.arrow
files (19 MB) in <data>/hellaswag/validation/. Here an offline evaluation (hellaswag's loader
path and arc_easy's) runs against a copy of the data that is (a) mounted read-only in a private
mount namespace where that is possible (as root, chmod does not stop writes), and (b) listed
before and after with sha256, size and mtime: nothing may change and nothing may be added.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import can_mount_ro

from common.io import sha256_file

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FILES = ["README.md", "arc/arc_easy_test.llmfoundry.jsonl",
         *(f"hellaswag/validation/{f}" for f in ("data-00000-of-00001.arrow",
                                                 "dataset_info.json", "state.json"))]
REPO = Path(__file__).resolve().parents[1]


def _listing(root: Path) -> dict[str, tuple]:
    """Every path under root (directories too) -> (sha256 or 'dir', size, mtime_ns)."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        kind = "dir" if p.is_dir() else sha256_file(p)
        out[str(p.relative_to(root))] = (kind, None if p.is_dir() else st.st_size,
                                         st.st_mtime_ns)
    return out


@pytest.mark.slow  # end to end, 6-15 s: the slow tier (CI runs it)
def test_offline_evaluation_never_writes_into_the_data(bench_dir, toy_checkpoint, tmp_path):
    data = tmp_path / "bench"
    for rel in FILES:
        (data / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(bench_dir / rel, data / rel)
    ck = toy_checkpoint(tmp_path / "results" / "runs" / "toyrun" / "checkpoints" / "final.pt")
    before = _listing(data)
    mounted = can_mount_ro(tmp_path)
    if not mounted:  # not root: then the permission bits do stop writes
        for p in [data, *data.rglob("*")]:
            p.chmod(0o555 if p.is_dir() else 0o444)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "FTBENCH_RESULTS": str(tmp_path / "results"), "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "hf-cache")}
    cmd = [sys.executable, "-m", "experiments.eval", str(ck), "--tasks", "hellaswag,arc_easy",
           "--limit", "2", "--data", str(data), "--threads", "1", "--batch-size", "4"]
    if mounted:
        cmd = ["unshare", "-m", "sh", "-c", 'mount --bind -o ro "$0" "$0" && exec "$@"',
               str(data), *cmd]
    try:
        r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    finally:
        for p in [data, *data.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    after = _listing(data)
    added = sorted(set(after) - set(before))
    assert not added, f"written into the benchmark data: {added}"
    assert after == before
    # and the evaluation did score both tasks from that data
    files = list((tmp_path / "results" / "runs" / "toyrun" / "eval").glob("lm-eval.*.json"))
    assert len(files) == 1
    doc = json.loads(files[0].read_text())
    assert {"hellaswag", "arc_easy"} <= set(doc["tasks"])
    for t in ("hellaswag", "arc_easy"):
        assert len(doc["tasks"][t]["items"]) == 2
    assert "hellaswag/validation/data-00000-of-00001.arrow" in doc["data_checksums"]
