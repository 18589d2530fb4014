"""Offline data files are checked against the pinned sha256 sums; problems fit in one line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from common.errors import UsageError
from experiments.eval.tasks.benchdata import pinned_checksums, require, verify

SIX = ["gsm8k", "mmlu", "arc_easy", "arc_challenge", "commonsense_qa", "humaneval_plus",
       "mbpp_plus"]
NEW = ["hellaswag", "winogrande", "openbookqa", "piqa", "boolq", "nq_open", "triviaqa"]


def test_shared_benchmarks_verify(bench_dir) -> None:
    chk = verify(bench_dir, SIX)
    assert chk.ok, chk.line()
    assert len(chk.checksums) == 8 + 114  # 8 json(l) files + 57 test + 57 dev MMLU csvs
    assert chk.checksums["gsm8k/test.jsonl"] == \
        "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14"
    assert "mmlu/test/anatomy_test.csv" in pinned_checksums(bench_dir)
    # mmlu's pins (and so its spec ids) are its test/dev csvs only; validation has its own key
    assert not any(p.startswith("mmlu/validation/") for p in chk.checksums)
    chk = verify(bench_dir, NEW + ["mmlu", "mmlu_validation"])
    assert chk.ok, chk.line()
    val = [p for p in chk.checksums if p.startswith("mmlu/validation/")]
    assert len(val) == 171  # 57 subjects x (arrow, dataset_info.json, state.json)
    assert len(chk.checksums) == 14 + 114 + 171
    assert chk.checksums["piqa/valid-labels.lst"] == \
        "b4192dc3a2a0363d9d60ccf79800cbbe2f32ebb17726efdde6970e0b8131bceb"
    assert chk.checksums["mmlu/validation/anatomy/data-00000-of-00001.arrow"] == \
        "d4e1f73ae79a8802e04476898b5b2dacec303391f0af3b78135c3a21af55f3cd"


def test_altered_and_missing_files_named_in_one_line(bench_dir: Path, tmp_path: Path) -> None:
    d = tmp_path / "bench"
    for rel in ("README.md", "piqa/valid.jsonl", "piqa/valid-labels.lst",
                "mmlu/validation/anatomy/data-00000-of-00001.arrow",
                "mmlu/validation/anatomy/dataset_info.json", "mmlu/validation/anatomy/state.json",
                "mmlu/test/anatomy_test.csv", "mmlu/dev/anatomy_dev.csv"):
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(bench_dir / rel, d / rel)
    for sums in ("mmlu/SHA256SUMS", "mmlu/validation/SHA256SUMS"):  # this subject only
        lines = (bench_dir / sums).read_text().splitlines()
        (d / sums).write_text("\n".join(x for x in lines if "anatomy" in x) + "\n")
    assert verify(d, ["piqa", "mmlu", "mmlu_validation"]).ok
    lab = d / "piqa/valid-labels.lst"
    lab.write_text("1" + lab.read_text()[1:])  # one flipped label
    arrow = d / "mmlu/validation/anatomy/data-00000-of-00001.arrow"
    raw = arrow.read_bytes()
    arrow.write_bytes(raw[:100] + bytes([raw[100] ^ 1]) + raw[101:])  # one bit
    assert verify(d, ["mmlu"]).ok  # the validation copy is not mmlu's
    line = verify(d, ["piqa", "mmlu_validation", "boolq"]).line()
    assert "altered (sha256 differs): piqa/valid-labels.lst, " \
        "mmlu/validation/anatomy/data-00000-of-00001.arrow" in line
    assert "missing: boolq/val.jsonl" in line and "\n" not in line
    assert "piqa/valid.jsonl" not in line  # an intact file is not named
    with pytest.raises(UsageError, match="piqa/valid-labels.lst"):
        require(d, ["piqa"])
    (d / "mmlu/validation/SHA256SUMS").unlink()  # no pins: the sums file itself is missing
    assert "missing: mmlu/validation/SHA256SUMS" in verify(d, ["mmlu_validation"]).line()
    assert verify(tmp_path / "nowhere", ["gsm8k"]).line().endswith("missing: "
                                                                    + str(tmp_path / "nowhere"))


def test_smoke_data_ships_verified() -> None:
    """The repository's own few items (experiments/eval/smoke_data) are pinned by SHA256SUMS."""
    smoke = Path(__file__).resolve().parents[1] / "experiments" / "eval" / "smoke_data"
    chk = verify(smoke, ["arc_easy", "gsm8k", "humaneval_plus"])
    assert chk.ok and len(chk.checksums) == 4, chk.line()
