"""lm-eval's own interfaces: `make lm-eval` is lm-eval's CLI with `ftbench` registered and the
device picked automatically; `make tasks` writes the offline task YAMLs where any lm-eval
backend finds them with --include_path."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _make(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    env = os.environ | {"FTBENCH_RESULTS": str(tmp / "results"), "OMP_NUM_THREADS": "1"}
    return subprocess.run(["make", "-s", "-C", str(ROOT), *args], env=env, capture_output=True,
                          text=True, timeout=600)


def test_make_tasks_writes_the_offline_dir(bench_dir: Path, tmp_path: Path) -> None:
    r = _make(f"BENCH_DATA={bench_dir}", "tasks", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "results" / "lm_eval_tasks"  # the documented default
    assert f"--include_path {out}" in r.stdout
    arc = yaml.safe_load((out / "arc_easy.yaml").read_text().replace("!function", ""))
    assert arc["dataset_kwargs"]["data_files"]["test"].startswith(str(bench_dir.resolve()))
    assert (out / "triviaqa.yaml").is_file() and (out / "mmlu" / "_mmlu.yaml").is_file()
    r = _make(f"BENCH_DATA={bench_dir}", f"OUT={tmp_path / 'mine'}", "tasks", tmp=tmp_path)
    assert r.returncode == 0 and (tmp_path / "mine" / "gsm8k.yaml").is_file()


@pytest.mark.slow
def test_make_lm_eval_offline_device_auto(bench_dir: Path, toy_checkpoint,
                                          tmp_path: Path) -> None:
    import torch

    ck = toy_checkpoint(tmp_path / "runs" / "r" / "checkpoints" / "final.pt")
    out = tmp_path / "lmout"
    r = _make(f"CKPT={ck.parent.parent}", f"BENCH_DATA={bench_dir}",
              f"ARGS=--tasks arc_easy --limit 2 --output_path {out} --log_samples",
              "lm-eval", tmp=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ftbench" in r.stdout and "arc_easy" in r.stdout  # lm-eval's own table
    (res,) = out.glob("*/results_*.json")
    doc = json.loads(res.read_text())
    assert doc["n-samples"]["arc_easy"]["effective"] == 2
    assert doc["config"]["model"] == "ftbench"
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert doc["config"]["device"] == want  # picked automatically
    assert len(list(out.glob("*/samples_arc_easy_*.jsonl"))) == 1
