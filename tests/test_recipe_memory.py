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
    """Every paper recipe on every GPU type, measured for the recipe as it is now (else: run
    python -m pipelines.recipe_memory); the chosen micro-batch's training, validation and save
    fit USABLE_FRACTION, and the recipe trains with it."""
    from sweeps import recipe as R

    entries = _entries()
    assert {e["recipe"] for e in entries} == set(RM.PAPER_RECIPES)
    for name in RM.PAPER_RECIPES:
        rec = R.load(name)
        mine = {e["gpu"]: e for e in entries if e["recipe"] == name}
        assert set(mine) == set(R.GPU_TYPES), name
        table = rec.micro_batches()
        for gpu, e in mine.items():
            assert e["recipe_key"] == rec.memory_key(), \
                f"{name} changed since it was measured: python -m pipelines.recipe_memory"
            assert e["fits"] is True, (name, gpu)
            phases = {p["phase"]: p for p in e["phases"]}
            assert set(phases) == {"train", "validation", "eval", "save"}, e["recipe"]
            for ph in RM.FIT_PHASES:
                p = phases[ph]
                assert p["micro_batch_size"] == e["micro_batch_size"]
                assert 0 < p["peak_bytes"] <= R.USABLE_FRACTION * e["memory_gb"] * 1e9, \
                    (name, gpu, ph)
            # the recipe trains with the measured choice
            mb = table[gpu]
            assert mb.basis == "measured" and mb.micro_batch_size == e["micro_batch_size"]
            assert mb.activation_checkpointing == e["activation_checkpointing"]
            ov = rec.training_overrides(gpu=gpu)
            assert f"train.micro_batch_size={e['micro_batch_size']}" in ov
        # on the recipes' own GPU the evaluator's batch fits too
        ev = {p["phase"]: p for p in mine["H100-80GB"]["phases"]}["eval"]
        assert ev["peak_bytes"] <= 80e9, name


def test_the_choice_steps_down_from_the_hand_pick_and_a_changed_recipe_is_not_measured(
        tmp_path, monkeypatch) -> None:
    from sweeps import recipe as R

    rec = R.load("paper-1.5B")
    hand = rec.hand_micro_batches()["H200-141GB"]
    c = RM.candidates(rec, hand)
    per_gpu = rec.train.batch_size // rec.train.gpus
    assert c[0] == (hand.micro_batch_size, hand.activation_checkpointing)
    assert [m for m, ck in c if not ck] == [d for d in range(hand.micro_batch_size, 0, -1)
                                            if per_gpu % d == 0]
    assert c[-1] == (1, True) and all(m * (per_gpu // m) == per_gpu for m, _ in c)
    # a record for another version of the recipe is not this recipe's measurement
    rec_file = tmp_path / "recipes.json"
    entry = {"recipe": "paper-1.5B", "gpu": "H200-141GB", "recipe_key": rec.memory_key(),
             "basis": "measured", "fits": True, "parallel": "ddp", "micro_batch_size": 1,
             "grad_accum": per_gpu, "activation_checkpointing": True, "estimate_gb": 1.0,
             "measured_gb": 2.0}
    rec_file.write_text(json.dumps([entry]))
    monkeypatch.setattr(R, "MEASURED_RECORDS", rec_file)
    mb = rec.micro_batches()["H200-141GB"]
    assert (mb.basis, mb.micro_batch_size, mb.measured_gb) == ("measured", 1, 2.0)
    rec_file.write_text(json.dumps([{**entry, "recipe_key": "0" * 16}]))
    mb = rec.micro_batches()["H200-141GB"]
    assert mb.basis == "hand estimate" and mb.micro_batch_size == hand.micro_batch_size
    rec_file.write_text("not json")
    assert rec.micro_batches()["H200-141GB"].basis == "hand estimate"


def test_a_stale_block_is_reported(tmp_path, monkeypatch) -> None:
    doc = tmp_path / "RECIPES.md"
    doc.write_text(RM.replace_block(RM.DOC.read_text(encoding="utf-8"),
                                    RM.block(_entries()[:1])), encoding="utf-8")
    monkeypatch.setattr(RM, "DOC", doc)
    assert RM.main(["--check"]) == 1
