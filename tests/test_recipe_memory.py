"""docs/RECIPES.md's measured-memory block is what `pipelines.recipe_memory.block` writes from
its records (docs/memory/recipes.json, measured by `python -m pipelines.recipe_memory`), and
every paper recipe's phases fit its GPU at the recipe's micro-batch (issue 36)."""

from __future__ import annotations

import json

from pipelines import recipe_memory as RM


def _entries() -> list[dict]:
    return json.loads(RM.RECORDS.read_text(encoding="utf-8"))


def test_the_block_is_what_the_generator_writes() -> None:
    doc = RM.DOC.read_text(encoding="utf-8")
    assert RM.block(_entries()) in doc, "docs/RECIPES.md: python -m pipelines.recipe_memory"
    assert RM.main(["--check"]) == 0
    # rewriting the block leaves the document as it is
    assert RM.replace_block(doc, RM.block(_entries())) == doc


def test_every_paper_recipe_is_measured_and_fits_its_gpu() -> None:
    entries = _entries()
    assert {e["recipe"] for e in entries} == set(RM.PAPER_RECIPES)
    for e in entries:
        phases = {p["phase"]: p for p in e["phases"]}
        assert set(phases) == {"train", "validation", "eval", "save"}, e["recipe"]
        for p in phases.values():
            assert p["micro_batch_size"] == e["micro_batch_size"]
            assert 0 < p["peak_bytes"] <= e["memory_gb"] * 1e9, (e["recipe"], p["phase"])


def test_a_stale_block_is_reported(tmp_path, monkeypatch) -> None:
    doc = tmp_path / "RECIPES.md"
    doc.write_text(RM.replace_block(RM.DOC.read_text(encoding="utf-8"),
                                    RM.block(_entries()[:1])), encoding="utf-8")
    monkeypatch.setattr(RM, "DOC", doc)
    assert RM.main(["--check"]) == 1
