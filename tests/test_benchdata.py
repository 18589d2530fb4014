"""Offline data files are checked against the pinned sha256 sums; problems fit in one line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from common.errors import UsageError
from experiments.eval.tasks.benchdata import pinned_checksums, require, verify

SIX = ["gsm8k", "mmlu", "arc_easy", "arc_challenge", "commonsense_qa", "humaneval_plus",
       "mbpp_plus"]


def test_shared_benchmarks_verify(bench_dir) -> None:
    chk = verify(bench_dir, SIX)
    assert chk.ok, chk.line()
    assert len(chk.checksums) == 8 + 114  # 8 json(l) files + 57 test + 57 dev MMLU csvs
    assert chk.checksums["gsm8k/test.jsonl"] == \
        "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14"
    assert "mmlu/test/anatomy_test.csv" in pinned_checksums(bench_dir)


def test_missing_and_altered_files_named_in_one_line(bench_dir, tmp_path: Path) -> None:
    d = tmp_path / "bench"
    for rel in ("README.md", "gsm8k/test.jsonl", "gsm8k/train.jsonl",
                "arc/arc_easy_test.llmfoundry.jsonl"):
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(bench_dir / rel, d / rel)
    with open(d / "gsm8k/test.jsonl", "a") as f:
        f.write("\n")  # one extra byte
    chk = verify(d, ["gsm8k", "arc_easy", "commonsense_qa"])
    line = chk.line()
    assert not chk.ok and "\n" not in line
    assert "missing: commonsenseqa/train_rand_split.jsonl, commonsenseqa/dev_rand_split.jsonl" \
        in line
    assert "altered (sha256 differs): gsm8k/test.jsonl" in line
    assert "gsm8k/train.jsonl" not in line and "arc_easy" not in line
    with pytest.raises(UsageError, match="gsm8k/test.jsonl"):
        require(d, ["gsm8k"])
    assert verify(tmp_path / "nowhere", ["gsm8k"]).line().endswith("missing: "
                                                                    + str(tmp_path / "nowhere"))


def test_smoke_data_ships_verified() -> None:
    """The repository's own few items (experiments/eval/smoke_data) are pinned by SHA256SUMS."""
    smoke = Path(__file__).resolve().parents[1] / "experiments" / "eval" / "smoke_data"
    chk = verify(smoke, ["arc_easy", "gsm8k", "humaneval_plus"])
    assert chk.ok and len(chk.checksums) == 4, chk.line()
