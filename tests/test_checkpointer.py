"""experiments/train/checkpointer.py on its own (no training loop): which checkpoints a run keeps,
what a resume restores and cuts back, and when a run counts as finished. Expected file names and
steps are written out by hand here, not derived from the code under test."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
import torch

from common.errors import UsageError
from common.paths import RunDir
from experiments.train.checkpointer import Checkpointer, TrainState, finished, truncate_metrics
from experiments.train.config import compose
from experiments.train.plan import plan, run_dir
from experiments.train.trainer import lr_factor, param_groups
from model import build_model

# 10 steps of 8 x 32 tokens; a small model so a checkpoint is written in milliseconds
TINY = ["model=1M", "model.vocab_size=512", "model.dim=32", "model.ffn_dim=64",
        "model.n_layers=2", "train.seq_len=32", "train.batch_size=8", "train.tokens=2560",
        "optim.warmup_steps=2"]


def setup(tmp_path: Path, *extra: str, main: bool = True,
          logged: list[str] | None = None) -> tuple[Checkpointer, TrainState]:
    cfg = compose([*TINY, f"paths.results={tmp_path}", *extra])
    p = plan(cfg, 1)
    assert p.steps == 10
    rd = run_dir(cfg)
    torch.manual_seed(0)
    model = build_model(p.model)
    opt = torch.optim.AdamW(param_groups(model, 0.1), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, p.steps, p.warmup_steps, cfg.optim.min_lr_ratio))
    log = (lambda msg, echo=True: logged.append(msg)) if logged is not None else None
    ck = Checkpointer(rd, cfg, p, main=main, tokenizer={"kind": "test"},
                      **({"log": log} if log else {}))
    ck.prepare()
    return ck, TrainState(cfg, p, rd.name, opt, sched, model)


def step_once(state: TrainState) -> None:
    """One real optimizer step, so the optimizer and the schedule have state to restore."""
    x = torch.randint(0, 512, (2, 32))
    state.model(x, targets=x).loss.backward()
    state.opt.step()
    state.sched.step()
    state.opt.zero_grad(set_to_none=True)


def names(ck: Checkpointer) -> list[str]:
    return sorted(p.name for p in ck.ckdir.iterdir())


def test_rotation_keeps_the_newest_and_the_eval_steps_and_final(tmp_path):
    # keep_eval_checkpoints=3 over 10 steps: ceil(10/3)=4, ceil(20/3)=7, 10
    ck, state = setup(tmp_path, "logging.ckpt_every=1", "logging.keep_checkpoints=2",
                      "logging.keep_eval_checkpoints=3")
    (ck.ckdir / "notes.txt").write_text("not a checkpoint")
    (ck.ckdir / "step_3.pt.tmp").write_text("a temporary")
    assert ck.eval_steps == {4, 7, 10}
    for step in range(1, 11):
        assert ck.maybe_save(step, state, val_done=False) == ck.ckdir / f"step_{step}.pt"
        ck.wait()  # asynchronous: complete (its marker written) once wait() returns
        assert ck.last_good == ck.ckdir / f"step_{step}.pt"
    assert not ck.finished and not finished(ck.rd)
    # the evaluators' reader takes the newest step by number, never a temporary or an eval link
    assert RunDir(ck.rd).checkpoint() == ck.ckdir / "step_10.pt"
    # each step checkpoint is its marker + its directory of shards; rotation drops both
    assert names(ck) == sorted(["step_9.pt", "step_10.pt", "step_9.dcp", "step_10.dcp",
                                "eval_step_4.pt", "eval_step_7.pt",
                                "notes.txt", "step_3.pt.tmp"])
    # the last step's eval checkpoint is final.pt's, with its validation done
    assert ck.save_final(state) == tmp_path / "runs" / ck.rd.name / "checkpoints" / "final.pt"
    assert ck.finished and finished(ck.rd)
    assert "eval_step_10.pt" in names(ck) and "final.pt" in names(ck)
    assert ck.last_good == ck.ckdir / "step_10.pt"  # final.pt is no resume point
    for n, want in [("eval_step_4.pt", 4), ("eval_step_7.pt", 7), ("eval_step_10.pt", 10),
                    ("final.pt", 10)]:
        extra = torch.load(ck.ckdir / n, weights_only=True)["extra"]
        assert extra["step"] == want and extra["data"]["samples"] == want * 8
    assert torch.load(ck.ckdir / "final.pt", weights_only=True)["extra"]["val_done"] is True
    assert os.path.samefile(ck.ckdir / "eval_step_10.pt", ck.ckdir / "final.pt")


def test_maybe_save_writes_only_when_due_or_forced(tmp_path):
    # ckpt_every=3 -> 3, 6, 9; the last step 10; eval steps (n=4) ceil(2.5)=3, 5, ceil(7.5)=8, 10
    ck, state = setup(tmp_path, "logging.ckpt_every=3", "logging.keep_checkpoints=100",
                      "logging.keep_eval_checkpoints=4")
    written = [s for s in range(1, 11) if ck.maybe_save(s, state, val_done=False) is not None]
    assert written == [3, 5, 6, 8, 9, 10]
    assert ck.maybe_save(1, state, val_done=True, force=True) == ck.ckdir / "step_1.pt"
    assert ck.last_good == ck.ckdir / "step_1.pt"  # a preemption's checkpoint is the resume point
    assert sorted(n for n in names(ck) if n.startswith("eval_")) == [
        "eval_step_3.pt", "eval_step_5.pt", "eval_step_8.pt"]


def test_resume_restores_the_state_and_cuts_the_metrics_back(tmp_path):
    ck, state = setup(tmp_path, "logging.keep_checkpoints=5")
    for _ in range(3):
        step_once(state)
    lines = [{"kind": "val", "step": 0}, *({"kind": "train", "step": s} for s in range(1, 7)),
             {"kind": "val", "step": 3}, {"kind": "val", "step": 6},
             {"kind": "final", "step": 10}]
    text = "".join(json.dumps(r) + "\n" for r in lines) + '{"kind": "train", "st'  # cut by -9
    ck.metrics_path.write_text(text)
    ck.maybe_save(3, state, val_done=False, force=True)
    opt_before = copy.deepcopy(state.opt.state_dict())  # live tensors otherwise
    for _ in range(2):
        step_once(state)  # the state moves on past the checkpoint

    logged: list[str] = []
    ck2, fresh = setup(tmp_path, "logging.keep_checkpoints=5", logged=logged)
    found = ck2.newest()
    assert found is not None and found[1] == ck2.ckdir / "step_3.pt"
    ck2.resume(found, fresh)
    assert fresh.step == 3 and fresh.val_done is False
    assert fresh.sched.last_epoch == 3
    got = fresh.opt.state_dict()["state"]
    assert got.keys() == opt_before["state"].keys()
    assert all(torch.equal(got[k]["exp_avg"], opt_before["state"][k]["exp_avg"]) for k in got)
    kept = [json.loads(x) for x in ck2.metrics_path.read_text().splitlines()]
    assert kept == [{"kind": "val", "step": 0}, *({"kind": "train", "step": s} for s in (1, 2, 3))]
    assert logged == ["resumed from step_3.pt (step 3/10)"]
    assert ck2.last_good == ck2.ckdir / "step_3.pt"


@pytest.mark.parametrize("val_done", [False, True])
def test_truncation_keeps_the_checkpoints_validation_only_when_it_ran(tmp_path, val_done):
    path = tmp_path / "metrics.jsonl"
    rows = [{"kind": "train", "step": 4}, {"kind": "val", "step": 4},
            {"kind": "train", "step": 5}, {"kind": "val", "step": 2}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    truncate_metrics(path, 4, val_done)
    want = [rows[0], *([rows[1]] if val_done else []), rows[3]]
    assert [json.loads(x) for x in path.read_text().splitlines()] == want
    truncate_metrics(tmp_path / "absent.jsonl", 4)  # nothing to cut: nothing created
    assert not (tmp_path / "absent.jsonl").exists()


def test_newest_skips_unreadable_and_misnamed_checkpoints(tmp_path):
    logged: list[str] = []
    ck, state = setup(tmp_path, "logging.keep_checkpoints=5", logged=logged)
    ck.maybe_save(2, state, val_done=True, force=True)
    (ck.ckdir / "step_4.pt").write_bytes((ck.ckdir / "step_2.pt").read_bytes()[:100])  # kill -9
    (ck.ckdir / "step_3.pt").write_bytes((ck.ckdir / "step_2.pt").read_bytes())  # says step 2
    found = ck.newest()
    assert found is not None and found[1].name == "step_2.pt"
    assert found[0]["extra"]["step"] == 2 and found[0]["extra"]["val_done"] is True
    assert len(logged) == 1 and logged[0].startswith("skipping unreadable checkpoint step_4.pt")


def test_resume_without_checkpoint_starts_the_metrics_afresh(tmp_path):
    ck, state = setup(tmp_path)
    ck.metrics_path.write_text('{"kind": "train", "step": 1}\n')
    assert ck.newest() is None
    ck.resume(None, state)
    assert not ck.metrics_path.exists() and ck.last_good is None and state.step == 0


def test_resume_links_the_eval_checkpoint_a_kill_left_unlinked(tmp_path):
    ck, state = setup(tmp_path, "logging.keep_eval_checkpoints=2")  # steps 5 and 10
    ck.maybe_save(5, state, val_done=False, force=True)
    (ck.ckdir / "eval_step_5.pt").unlink()
    ck2, fresh = setup(tmp_path, "logging.keep_eval_checkpoints=2")
    ck2.resume(ck2.newest(), fresh)
    # re-exported from the resumed model: weights only, equal to what step 5 saved
    ev = torch.load(ck2.ckdir / "eval_step_5.pt", weights_only=True)
    assert ev["extra"]["step"] == 5 and "optimizer" not in ev["extra"]
    want = state.model.state_dict()
    assert ev["model"].keys() == want.keys()
    assert all(torch.equal(ev["model"][k], want[k]) for k in want)


def test_a_state_from_another_data_position_is_bad_input(tmp_path):
    ck, state = setup(tmp_path)
    ck.maybe_save(2, state, val_done=False, force=True)
    found = ck.newest()
    assert found is not None
    found[0]["extra"]["data"]["samples"] = 999
    with pytest.raises(UsageError, match=r"step_2\.pt: data position does not match"):
        ck.resume(found, state)


def test_prepare_fresh_clears_an_earlier_run_and_other_ranks_write_nothing(tmp_path):
    ck, state = setup(tmp_path, "logging.keep_eval_checkpoints=1")
    ck.maybe_save(10, state, val_done=True)
    ck.save_final(state)
    ck.metrics_path.write_text("{}\n")
    other = Checkpointer(ck.rd, state.cfg, state.plan, main=False)
    other.prepare(fresh=True)  # not rank 0: leaves everything
    assert other.finished and ck.metrics_path.exists()
    assert other.maybe_save(4, state, val_done=False, force=True) == ck.ckdir / "step_4.pt"
    assert not (ck.ckdir / "step_4.pt").exists()
    ck.prepare(fresh=True)
    assert not ck.finished and names(ck) == [] and not ck.metrics_path.exists()
