"""`make gpu-check RECIPE=..` (issue 36): what a CPU can check of the recipe's real shape on the
GPUs present (its allocator peaks, tokens/s and MFU need a GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from experiments.train import plan as P
from experiments.train import trainer as TR
from experiments.train.config import compose
from experiments.train.data import RandomTokens, build_corpus
from pipelines import gpu_check as G
from sweeps import recipe as R

TINY = ["model=1M", "model.vocab_size=4096", "train.seq_len=256", "model.max_seq_len=256"]


def _value(args: list[str], key: str) -> str:
    return next(a for a in args if a.startswith(key + "=")).split("=", 1)[1]


def test_the_recipe_shape_is_the_recipes_own_on_random_tokens():
    rec = R.load("paper-1.5B")
    args, shape = G.recipe_args(rec, "H100-80GB", 1, 20, 80.0, disk_free=1e15)
    cfg = compose(args)
    mb = rec.micro_batches()["H100-80GB"]
    assert cfg.data.source == "random" and not any(a.startswith("data.hf") for a in args)
    assert cfg.model.vocab_size == 131072 and cfg.train.seq_len == 4096
    assert cfg.model.preset == "1.5B" and cfg.model.n_layers == 28 and shape["layer_sliced"] is None
    assert cfg.model.latent_bits == max(rec.grid.latent_bits)
    assert cfg.train.micro_batch_size == mb.micro_batch_size == shape["micro_batch_size"]
    assert cfg.train.batch_size == mb.micro_batch_size * G.RECIPE_ACCUM
    assert str(cfg.train.precision) == rec.train.precision
    p = P.plan(cfg, 1)
    assert p.steps == 20 and p.grad_accum == G.RECIPE_ACCUM
    assert cfg.data.val_tokens == cfg.logging.val_batch_size * 4096  # one validation batch
    assert cfg.logging.ckpt_every == 11 and cfg.logging.val_every == 10
    # gpu-check in 10 minutes by construction: its time plan (the plan's FLOPs at the planned
    # MFU, the first contact's start-up, compile, copy and load rates, two step checkpoints, one
    # resume) for one H100 at the default 20 steps stays under BUDGET_S (a plan over it is
    # refused before anything runs)
    t = G.time_plan(cfg, 1, 989.0, planned=True)
    assert set(t) == {"plan", "train", "eval", "resume", "total"}
    assert t["plan"] == 0 and t["total"] == pytest.approx(sum(t.values()) / 2)
    assert t["total"] < G.BUDGET_S, t
    assert G.time_plan(cfg, 1, 989.0, planned=False)["plan"] > 60  # never measured


def test_8b_on_one_gpu_is_layer_sliced_at_the_same_widths_and_says_so():
    rec = R.load("paper-8B")
    args, shape = G.recipe_args(rec, "H100-80GB", 1, 20, 80.0, disk_free=200e9)
    cfg = compose(args)
    full = compose(["model=8B"])
    s = shape["layer_sliced"]
    assert s is not None and s["of"] == full.model.n_layers and s["layers"] < s["of"]
    assert cfg.model.n_layers == s["layers"] and s["layers"] % 2 == 0
    assert cfg.model.dim == full.model.dim and cfg.model.ffn_dim == full.model.ffn_dim
    assert "same widths" in s["why"] and "200 GB free" in s["why"]
    p = P.plan(cfg, 1)
    assert P.hand_bytes(p, "none") <= G.SLICE_FIT * 80e9
    assert P.disk_bytes(cfg, p, "cuda")["run"] <= 200e9  # the trainer's own disk rule
    # two more layers would not have fitted (the largest slice that does)
    c2 = compose([*args, f"model.n_layers={s['layers'] + 2}"])
    more = P.plan(c2, 1)
    assert (P.hand_bytes(more, "none") > G.SLICE_FIT * 80e9
            or P.disk_bytes(c2, more, "cuda")["run"] > 200e9)
    # a disk that holds not even the 2-layer slice's checkpoints: refused in one line
    with pytest.raises(ValueError, match="even 2 of the model's 32 layers"):
        G.recipe_args(rec, "H100-80GB", 1, 20, 80.0, disk_free=20e9)


@pytest.mark.parametrize("recipe", ["paper-1.5B", "paper-8B"])
def test_the_slicing_and_the_trainer_agree_on_the_disk(recipe, monkeypatch, tmp_path):
    """One disk rule (issue 45: they disagreed between 61.9 and 63.1 GB free): gpu-check keeps
    the whole model exactly when the trainer would start it (plan.start_refusal) on that free
    space, and a sliced model is one the trainer starts."""
    rec = R.load(recipe)
    monkeypatch.setattr(P.torch.cuda, "is_available", lambda: True)  # the trainer on a GPU
    full, _ = G.recipe_args(rec, "H100-80GB", 1, 20, 1e6, disk_free=None)  # unsliced
    whole = compose([*full, f"paths.results={tmp_path}"])
    need = P.disk_bytes(whole, P.plan(whole, 1), "cuda")["run"]
    for free in (need - 1, need):  # the boundary, to the byte
        monkeypatch.setattr(P, "free_bytes", lambda _root, f=free: int(f))
        args, shape = G.recipe_args(rec, "H100-80GB", 1, 20, 1e6, disk_free=free)
        cfg = compose([*args, f"paths.results={tmp_path}"])
        refused = P.start_refusal(whole, P.plan(whole, 1), tmp_path / "run")
        assert (shape["layer_sliced"] is not None) == (refused is not None), free
        assert P.start_refusal(cfg, P.plan(cfg, 1), tmp_path / "run") is None, free


def test_random_tokens_are_a_function_of_the_sample_index():
    a = RandomTokens(131072, 64, seed=3, split="train")
    x, y = a.get(5, 4)
    assert x.shape == (4, 64) and torch.equal(x[:, 1:], y[:, :-1])
    assert int(x.max()) < 131072 and int(x.min()) >= 0
    x2, _ = a.get(7, 1)  # random access: sample 7 alone is sample 7 of the batch above
    assert torch.equal(x2[0], x[2])
    assert not torch.equal(RandomTokens(131072, 64, 4, "train").get(5, 1)[0][0], x[0])
    assert not torch.equal(RandomTokens(131072, 64, 3, "val").get(5, 1)[0][0], x[0])
    cfg = compose(["data=random", *TINY, "data.val_tokens=1024"])
    c = build_corpus(cfg.data, vocab_size=4096, seq_len=256, seed=0, cache_dir="/nonexistent")
    assert c.tokenizer.vocab_size == 4096 and len(c.token_bytes) == 4096
    assert c.val_x.shape == (4, 256)
    assert all(0xD800 > ord(ch) or ord(ch) > 0xDFFF for ch in c.tokenizer.alphabet)


def test_the_trainer_keeps_each_phases_allocator_peak(monkeypatch):
    """_DevicePeaks on a stand-in CUDA allocator: each phase keeps its own largest peak, the
    steps between phases count as train."""
    state = {"peak": 0, "now": 10}

    def alloc(n: int) -> None:
        state["peak"] = max(state["peak"], state["now"] + n)

    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: state["peak"])
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d=None: state["peak"] + 1)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats",
                        lambda d=None: state.update(peak=state["now"]))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (50, 100))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: 30)
    dp = TR._DevicePeaks(torch.device("cuda"))
    alloc(90)  # training steps
    with dp.phase("validation"):
        alloc(40)
    alloc(500)  # steps between the phases
    with dp.phase("save"):
        alloc(60)
    alloc(5)
    dp.note("train")
    s = dp.summary()
    assert s["cuda_peak_bytes"] == {"train": {"allocated": 510, "reserved": 511},
                                    "validation": {"allocated": 50, "reserved": 51},
                                    "save": {"allocated": 70, "reserved": 71}}
    assert s["cuda_outside_torch_bytes"] == 100 - 50 - 30
    assert TR._DevicePeaks(torch.device("cpu")).summary() is None  # absent on CPU, never 0


def _doc(tmp: Path, name: str, **kw) -> None:
    base = {"mode": "recipe", "recipe": "paper-1.5B", "preset": "1.5B", "passed": True,
            "gpu": "NVIDIA H100 80GB HBM3", "n_gpus": 1, "mfu": 0.41,
            "created": "2026-12-01T00:00:00+00:00", "layer_sliced": None}
    (tmp / "gpu_check").mkdir(parents=True, exist_ok=True)
    (tmp / "gpu_check" / name).write_text(json.dumps({**base, **kw}))


def test_the_dry_run_reads_the_newest_measured_mfu_for_its_gpu_and_preset(tmp_path,
                                                                          monkeypatch):
    from common import paths

    monkeypatch.setattr(paths, "MEASURED", tmp_path / "measured")  # not the repository's files
    ov = ["model=1.5B", "train.seq_len=4096", "train.batch_size=64", "train.tokens=1e9",
          "train.plan_world_size=32", f"paths.results={tmp_path}"]
    mfu, src = P.planned_mfu(compose(ov))
    assert mfu == P.ASSUMED_MFU and src.startswith("assumed")
    _doc(tmp_path, "a.json", mfu=0.30, created="2026-11-30T00:00:00+00:00")
    _doc(tmp_path, "b.json", mfu=0.41)  # the newest
    _doc(tmp_path, "c.json", mfu=0.9, created="2027-01-01", passed=False)  # failed
    _doc(tmp_path, "d.json", mfu=0.8, created="2027-01-01", preset="8B")  # another preset
    _doc(tmp_path, "e.json", mfu=0.7, created="2027-01-01", gpu="NVIDIA A100-SXM4-80GB")
    _doc(tmp_path, "f.json", mfu=0.6, created="2027-01-01", mode=None)  # the 16M smoke test
    _doc(tmp_path, "g.json", mfu=None, created="2027-01-01")  # missing is not a measurement
    (tmp_path / "gpu_check" / "h.json").write_text("{not json")
    mfu, src = P.planned_mfu(compose(ov))
    assert mfu == 0.41 and "measured by make gpu-check RECIPE=paper-1.5B" in src
    assert "b.json" in src and "H100" in src
    mfu, src = P.planned_mfu(compose([*ov, "train.gpu_name=A100"]))
    assert mfu == 0.7
    mfu, src = P.planned_mfu(compose([*ov, "train.mfu=0.5"]))
    assert (mfu, src) == (0.5, "given (train.mfu)")
    text = P.format_estimate(compose(ov), P.plan(compose(ov), 32), "ddp")
    assert "at MFU 41% of 989 TFLOP/s" in text and "measured by make gpu-check" in text
    # the committed folder's table: one row per recipe measurement, a dash where one is missing
    from dev.gpu_check_doc import measurements_doc

    rows = measurements_doc(tmp_path / "gpu_check").splitlines()[6:]
    assert len(rows) == 6 and rows[0].startswith("| a.json | 2026-11-30")
    assert "| – | yes |" in next(r for r in rows if r.startswith("| g.json"))


def test_the_measurements_doc_is_generated_from_the_committed_folder():
    from dev.gpu_check_doc import DOC, measurements_doc

    assert DOC.read_text(encoding="utf-8") == measurements_doc(), \
        "docs/gpu_check/README.md: python -m dev.gpu_check_doc"


@pytest.mark.slow
def test_the_recipe_check_rehearses_on_cpu_with_a_resume(tmp_path, capsys):
    """The whole flow at a tiny width on CPU: the recipe's micro-batch and precision, random
    tokens, validations, a checkpoint inside the run, the resume from it matching the
    uninterrupted run to float32 rounding; no allocator peaks and no speed figures (null, with
    why)."""
    rc = G.main(["--recipe", "paper-1.5B", "--cpu", "--steps", "4", "--results",
                 str(tmp_path), "--set", *TINY])
    out = capsys.readouterr().out
    assert rc == 0, out
    doc = json.loads(next((tmp_path / "gpu_check").glob("*-cpu-paper-1.5B.json")).read_text())
    assert doc["mode"] == "recipe" and doc["device"] == "cpu" and doc["passed"] is True
    assert doc["val_steps"] == [0, 2, 4] and doc["resumed_from_step"] == 3
    # compiled CPU kernels in two processes agree bitwise on some runs but only to float32
    # rounding on others (CI measured 3.1e-7 on the loss); AdamW turns such a difference in a
    # near-zero gradient into an update of up to ~lr of either sign, so a resumed step may move a
    # weight by up to 2 lr (CI measured 2.4e-4 at lr 4e-4 once). Bitwise resume is tested eager:
    # tests/test_train.py (kill -9 and SIGTERM), tests/test_checkpoint_sharded.py
    lr = 4e-4
    assert f"optim.lr={lr}" in R.load("paper-1.5B").training_overrides()
    assert doc["resume"] == "ok" and doc["resume_loss_max_rel"] <= 1e-6
    assert doc["resume_weights_max_abs"] <= 2 * lr * (4 - doc["resumed_from_step"])
    assert doc["mfu"] is None and doc["tokens_per_s"] is None
    assert {r["phase"] for r in doc["phases"]} == {"train", "validation", "eval", "save"}
    assert all(r["measured"] is None and r["why_not"] for r in doc["phases"])
    # a CPU rehearsal is not a measurement of MFU: the dry run does not read it
    cpu = compose(["model=1M", "train.gpu_name=cpu", f"paths.results={tmp_path}"])
    assert P.planned_mfu(cpu)[1].startswith("assumed")
    assert "resume: ok (from step 3" in out


def _records() -> list:
    """A plan's records as `experiments.memory.measure` returns them (no measurement here)."""
    from experiments import memory as MEM

    return [MEM.PhasePeak(ph, "none", 1, 1, G.RECIPE_ACCUM, 1, 256, "cuda", True, 10**6)
            for ph in MEM.PHASES]


def test_a_fresh_node_reads_the_shipped_plan(tmp_path, monkeypatch):
    """A plan shipped under measured/memory/plans/ (`--ship-plan`: keyed by the run's shape,
    not by torch's version or the code) is what a node with an empty cache and another torch
    reads: it measures nothing (there: measuring raises) and says where the plan came from."""
    from experiments import memory as MEM

    monkeypatch.setattr(MEM, "SHIPPED", tmp_path / "plans")
    monkeypatch.setattr(MEM, "measure", lambda *a, **k: _records())
    args, _ = G.recipe_args(R.load("paper-1.5B"), "H100-80GB", 1, 4, 85.5, extra=TINY)
    made = MEM.measure_cached(compose(args), world_size=1, shipped=MEM.SHIPPED, ship=True)[1]
    assert made.parent == tmp_path / "plans"
    cfg = compose([*args, f"paths.cache={tmp_path / 'fresh'}"])
    monkeypatch.setattr(MEM.torch, "__version__", "2.11.0+cu130")  # the node's torch

    def no(*a, **k):
        raise AssertionError("measured on a fresh node")

    monkeypatch.setattr(MEM, "measure", no)
    recs, src = G.plan_step(cfg, 1)
    assert src.startswith(f"shipped {made.name} (") and "the same code" in src, src
    assert recs == _records()
    assert not (tmp_path / "fresh").exists()


def test_a_failed_run_keeps_its_whole_stderr_in_a_file_the_json_names(tmp_path, monkeypatch,
                                                                       capsys):
    """The trainer's stderr goes whole to a file (was: its last 300 characters in the JSON);
    the JSON names the copy kept beside it."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nfor i in $(seq 1 400); do echo \"traceback line $i\" >&2; done\n"
                    "exit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(G.sys, "executable", str(fake))
    monkeypatch.setattr(G, "plan_step", lambda cfg, n: (_records(), "cached (0 s)"))
    monkeypatch.setenv("FTBENCH_RESULTS", str(tmp_path / "r"))  # the plan's cache
    rc = G.main(["--recipe", "paper-1.5B", "--cpu", "--steps", "4", "--results",
                 str(tmp_path / "r"), "--out", str(tmp_path / "out"), "--set", *TINY])
    assert rc == 1
    doc = json.loads(next((tmp_path / "out").glob("*.json")).read_text())
    assert doc["train"].startswith("exit 1: traceback line 400 (stderr: ")
    kept, = doc["stderr"]
    lines = Path(kept).read_text().splitlines()
    assert Path(kept).parent == tmp_path / "out" and len(lines) == 400
    assert lines[0] == "traceback line 1"
