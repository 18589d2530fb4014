"""The paper recipes train with the micro-batch the fake-tensor measurement chose
(measured/memory/recipes.json, written by `python -m sweeps.recipe measure`): every paper recipe is
measured as it is now and its phases fit its GPU (issue 36); a record of another version of a
recipe is not its measurement."""

from __future__ import annotations

import json

import pytest

from experiments.memory import FIT_PHASES, USABLE_FRACTION
from sweeps import recipe as R

RECIPES = ("paper-1.5B", "paper-8B", "paper-8B-1T", "cpu-mini")


def test_every_recipe_is_measured_and_fits_its_gpu() -> None:
    """Every shipped recipe on every GPU type, measured for the recipe as it is now (else: run
    python -m sweeps.recipe measure); the chosen micro-batch's training, validation and save
    fit USABLE_FRACTION, and the recipe trains with it."""
    entries = json.loads(R.MEASURED_RECORDS.read_text(encoding="utf-8"))
    assert {e["recipe"] for e in entries} == set(RECIPES) == set(R.known())
    for name in RECIPES:
        rec = R.load(name)
        mine = {e["gpu"]: e for e in entries if e["recipe"] == name}
        assert set(mine) == set(R.GPU_TYPES), name
        table = rec.micro_batches()
        for gpu, e in mine.items():
            assert e["recipe_key"] == rec.memory_key(), \
                f"{name} changed since it was measured: python -m sweeps.recipe measure {name}"
            assert e["fits"] is True, (name, gpu)
            phases = {p["phase"]: p for p in e["phases"]}
            assert set(phases) == {"train", "validation", "eval", "save"}, e["recipe"]
            for ph in FIT_PHASES:
                p = phases[ph]
                assert p["micro_batch_size"] == e["micro_batch_size"]
                assert 0 < p["peak_bytes"] <= USABLE_FRACTION * e["memory_gb"] * 1e9, \
                    (name, gpu, ph)
            # the recipe trains with the measured choice
            mb = table[gpu]
            assert mb.micro_batch_size == e["micro_batch_size"]
            assert mb.activation_checkpointing == e["activation_checkpointing"]
            ov = rec.training_overrides(gpu=gpu)
            assert f"train.micro_batch_size={e['micro_batch_size']}" in ov
        # on the recipes' own GPU the evaluator's batch fits too
        ev = {p["phase"]: p for p in mine["H100-80GB"]["phases"]}["eval"]
        assert ev["peak_bytes"] <= 80e9, name


def test_a_changed_recipe_or_an_unmeasured_gpu_is_refused_never_guessed(tmp_path,
                                                                        monkeypatch) -> None:
    rec = R.load("paper-1.5B")
    per_gpu = rec.train.batch_size // rec.train.gpus
    rec_file = tmp_path / "recipes.json"
    entry = {"recipe": "paper-1.5B", "gpu": "H200-141GB", "recipe_key": rec.memory_key(),
             "basis": "measured", "fits": True, "parallel": "ddp", "micro_batch_size": 1,
             "grad_accum": per_gpu, "activation_checkpointing": True, "measured_gb": 2.0}
    rec_file.write_text(json.dumps([entry]))
    monkeypatch.setattr(R, "MEASURED_RECORDS", rec_file)
    mb = rec.micro_batches()["H200-141GB"]
    assert (mb.micro_batch_size, mb.measured_gb) == (1, 2.0)
    assert set(rec.micro_batches()) == {"H200-141GB"}
    with pytest.raises(R.UsageError, match="no measured micro-batch .* --gpus H100-80GB"):
        rec.training_overrides(gpu="H100-80GB")
    assert "H100-80GB   no measured micro-batch" in R.show(rec)
    for text in (json.dumps([{**entry, "recipe_key": "0" * 16}]), "not json"):
        rec_file.write_text(text)
        assert rec.micro_batches() == {}


def test_measure_reproduces_the_committed_record_in_place_and_refuses_a_bad_gpu(
        tmp_path, monkeypatch, capsys) -> None:
    """`python -m sweeps.recipe measure cpu-mini --gpus H100-80GB` (fake tensors, a few seconds)
    measures the committed record's peaks again, replaces that record where it stood and leaves
    every other one as it was; an unknown GPU type is one line, exit 2, nothing written."""
    committed = R.MEASURED_RECORDS.read_text(encoding="utf-8")
    records = tmp_path / "recipes.json"
    records.write_text(committed, encoding="utf-8")
    monkeypatch.setattr(R, "MEASURED_RECORDS", records)

    assert R.main(["measure", "cpu-mini", "--gpus", "X100"]) == 2
    assert "--gpus X100: GPU types are" in capsys.readouterr().err
    assert records.read_text(encoding="utf-8") == committed

    assert R.main(["measure", "cpu-mini", "--gpus", "H100-80GB"]) == 0
    old, new = json.loads(committed), json.loads(records.read_text(encoding="utf-8"))
    assert [(e["recipe"], e["gpu"]) for e in new] == [(e["recipe"], e["gpu"]) for e in old]
    i = next(i for i, e in enumerate(old) if (e["recipe"], e["gpu"]) == ("cpu-mini", "H100-80GB"))
    assert new[:i] + new[i + 1:] == old[:i] + old[i + 1:]

    def peaks(e):  # what was measured, not how long it took
        return [{k: v for k, v in p.items() if k != "seconds"} for p in e["phases"]]

    assert peaks(new[i]) == peaks(old[i])
    assert {k: v for k, v in new[i].items() if k != "phases"} == \
        {k: v for k, v in old[i].items() if k != "phases"}
