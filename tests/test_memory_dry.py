"""`make train DRY=1` (python -m experiments.memory --dry-run): the trainer's plan, then the
measured peak of every phase beside the GPU's capacity, the one memory model printed; the
measurement is cached by everything it depends on (issue 36)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments import memory
from experiments.train.config import compose

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BASE = ["model=1M", "model.vocab_size=512", "train.seq_len=64", "train.batch_size=4",
        "train.micro_batch_size=2", "logging.val_batch_size=4", "train.cpu_tokens_per_s=10"]


def test_dry_run_prints_the_plan_then_measured_peaks_and_caches_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ov = [*BASE, f"paths.results={tmp_path / 'r'}", f"paths.cache={tmp_path / 'c'}"]
    assert memory.main(["--dry-run", *ov]) == 0
    out = capsys.readouterr().out
    assert "memory      measured per phase" in out  # the trainer's plan first
    assert "hand estimate" not in out  # one memory model: the measurement
    assert "memory: measured peak per GPU on fake tensors" in out
    for phase in memory.PHASES:
        assert any(line.strip().startswith(phase) for line in out.splitlines()), phase
    assert "fits the GPU: every phase" in out
    cached = list((tmp_path / "c" / "memory").glob("*.json"))
    assert len(cached) == 1
    recs = json.loads(cached[0].read_text())["records"]
    assert [r["phase"] for r in recs] == list(memory.PHASES)
    # the second dry run reads the same figures back; a changed shape is another measurement
    cfg = compose(ov)
    again, path = memory.measure_cached(cfg, device_type="cuda", cache=tmp_path / "c")
    assert path == cached[0] and [r.to_json() for r in again] == recs
    key = memory.measure_key(cfg, 1, "none", "cuda", 16, 3)
    assert path.stem == key != memory.measure_key(
        compose([*ov, "logging.val_batch_size=2"]), 1, "none", "cuda", 16, 3)
    # a phase over the GPU is named (the capacity is no part of the key: read from the cache)
    small = compose([*ov, "train.gpu_memory_gb=0.001"])
    text = memory.dry_text(small, world_size=1, cache=tmp_path / "c")
    assert "fits the GPU: NO: train" in text and f"read from {path}" in text
