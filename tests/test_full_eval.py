"""`python -m pipelines.full_eval`: per-benchmark processes, timing, resume, honest nulls.

The fast tests replace the per-benchmark process with a stand-in that writes an eval file (or
dies); the slow one runs the real `python -m experiments.eval` on a toy checkpoint.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pipelines import full_eval


def _fake_eval(out_dir: Path, task: str, value: float | None, error: str | None = None) -> None:
    entry: dict[str, Any] = {"primary": "acc", "n": 3,
                             "metrics": {"acc": {"value": value}}}
    if error:
        entry = {"primary": "acc", "n": 3, "error": error, "metrics": {"acc": {"value": None}}}
    doc = {"tasks": {task: entry}, "requests": 12, "elapsed_s": 1.5}
    (out_dir / "lm-eval.abc.step10.json").write_text(json.dumps(doc))


@pytest.fixture()
def fake_runs(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """subprocess.run stand-in: 'arc_easy' succeeds, 'gsm8k' dies after writing an error entry."""
    calls: list[list[str]] = []

    def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess:
        calls.append(cmd)
        task = cmd[cmd.index("--tasks") + 1]
        out = Path(cmd[cmd.index("--out-dir") + 1])
        if task == "gsm8k":
            _fake_eval(out, task, None, error="RuntimeError: boom")
            return subprocess.CompletedProcess(cmd, 1)
        _fake_eval(out, task, 0.25)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(full_eval.subprocess, "run", run)
    return calls


def test_failed_benchmark_is_null_and_rerun_finished_one_is_reused(fake_runs, tmp_path: Path):
    ck = tmp_path / "final.pt"
    ck.write_bytes(b"x")
    out = tmp_path / "fe"
    args = dict(ckpt=str(ck), data="/d", out=out, threads=1, extra=[], ident="id1")
    ok = full_eval.run_task("arc_easy", **args)
    bad = full_eval.run_task("gsm8k", **args)
    assert ok["rc"] == 0 and ok["value"] == 0.25 and ok["status"] == "ok" and not ok["reused"]
    assert bad["rc"] == 1 and bad["value"] is None and bad["status"].startswith("error")
    assert len(fake_runs) == 2
    # a second pass: the finished benchmark is reused, the failed one runs again
    assert full_eval.run_task("arc_easy", **args)["reused"]
    (out / "gsm8k" / ".cache").mkdir()
    (out / "gsm8k" / ".cache" / "lm-eval-x.db").write_bytes(b"")  # the crashed run's answers
    again = full_eval.run_task("gsm8k", **args)
    assert not again["reused"] and again["resumed_from_request_cache"]
    assert not ok["resumed_from_request_cache"]
    assert len(fake_runs) == 3
    # another checkpoint or other arguments (a --limit run) never reuse it
    assert not full_eval.run_task("arc_easy", **(args | {"ident": "id2"}))["reused"]
    assert not full_eval.run_task("arc_easy", **(args | {"ident": "id2",
                                                         "extra": ["--limit=2"]}))["reused"]
    md = full_eval.render({
        "checkpoint": str(ck), "argv": ["x"], "workers": 1, "threads": 1, "git_commit": "c",
        "git_dirty": False, "loadavg_start": [1, 1, 1], "loadavg_end": [1, 1, 1],
        "tasks": [ok, again], "totals": {"makespan_s": 60, "sum_wall_s": 60, "ran": 2,
                                       "reused": 0, "failed": ["gsm8k"]}})
    assert "acc = null" in md and "failed: gsm8k" in md and "acc = 0.2500" in md
    assert "gsm8k (resumed: partial time)" in md


def test_task_sets() -> None:
    assert full_eval.task_list("original") == list(full_eval.ORIGINAL)
    assert len(full_eval.task_list("all")) == 14
    assert full_eval.task_list("gsm8k, mmlu,gsm8k") == ["gsm8k", "mmlu"]
    assert set(full_eval.COST_MIN) == set(full_eval.ORIGINAL + full_eval.EXTRA)


@pytest.mark.slow
def test_two_benchmarks_end_to_end(bench_dir, toy_checkpoint, tmp_path: Path) -> None:
    ck = toy_checkpoint(tmp_path / "runs" / "toy" / "checkpoints" / "final.pt")
    out = tmp_path / "fe"
    argv = [str(ck), "--data", str(bench_dir), "--tasks", "arc_easy,gsm8k", "--limit", "2",
            "--workers", "2", "--out", str(out)]
    assert full_eval.main(argv) == 0
    doc = json.loads((out / "full_eval.json").read_text())
    assert [t["task"] for t in doc["tasks"]] == ["gsm8k", "arc_easy"]  # longest first
    for t in doc["tasks"]:
        assert t["rc"] == 0 and t["status"] == "ok" and t["wall_s"] > 0 and t["n"] == 2
        assert Path(t["file"]).is_file()
    assert doc["totals"]["ran"] == 2 and doc["totals"]["makespan_s"] > 0
    assert "Makespan" in (out / "full_eval.md").read_text()
    assert full_eval.main(argv) == 0  # resumed: nothing runs again
    doc2 = json.loads((out / "full_eval.json").read_text())
    assert doc2["totals"]["reused"] == 2 and doc2["totals"]["ran"] == 0
