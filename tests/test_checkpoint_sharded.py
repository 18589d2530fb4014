"""experiments/train/checkpointer.py: which checkpoints a run keeps (names and steps written out
by hand), what a resume restores and cuts back, when a run counts as finished. Sharded,
asynchronous checkpoints (issue 26): a save in flight while training goes on writes
the state of its step, not a later one; a checkpoint counts only with its marker; evaluation's
loader reads the weights-only export and the training checkpoint alike; kill -9 under FSDP on
2 processes then a resume on 1, on 2 (bitwise), and the reverse ends where an uninterrupted run
does.
Expected values are computed here independently (snapshots of the live state, direct forward
passes), not read back through the code under test."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch
from torch.distributed.checkpoint import FileSystemWriter
from trainrun import ROOT, SYNTH, env1, rows, torchrun, weights

from common.errors import UsageError
from common.paths import RunDir
from experiments.train.checkpointer import Checkpointer, TrainState, truncate_metrics
from experiments.train.config import compose
from experiments.train.plan import plan, run_dir
from experiments.train.trainer import lr_factor, param_groups
from model import build_model, load_checkpoint
from model.checkpoint import CheckpointError, save_weights

TINY = ["model=1M", "model.vocab_size=512", "model.dim=32", "model.ffn_dim=64",
        "model.n_layers=2", "model.latent_bits=4", "train.seq_len=32", "train.batch_size=8",
        "train.tokens=2560", "optim.warmup_steps=2", "logging.ckpt_every=2"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def setup(tmp_path: Path, *extra: str, logged: list[str] | None = None,
          **kw) -> tuple[Checkpointer, TrainState]:
    """10 steps of 8 x 32 tokens (a small model: a checkpoint in milliseconds); `logged`
    collects the log lines, `kw` goes to the Checkpointer."""
    cfg = compose([*TINY, f"paths.results={tmp_path}", *extra])
    p = plan(cfg, 1)
    assert p.steps == 10
    if logged is not None:
        kw["log"] = lambda msg, echo=True: logged.append(msg)
    torch.manual_seed(0)
    model = build_model(p.model)
    opt = torch.optim.AdamW(param_groups(model, 0.1), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, p.steps, p.warmup_steps, cfg.optim.min_lr_ratio))
    ck = Checkpointer(run_dir(cfg), cfg, p, tokenizer={"kind": "test"}, **kw)
    ck.prepare()
    return ck, TrainState(cfg, p, ck.rd.name, opt, sched, model)


def step_once(state: TrainState, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 512, (2, 32), generator=g)
    state.model(x, targets=x, generator=g).loss.backward()
    state.opt.step()
    state.sched.step()
    state.opt.zero_grad(set_to_none=True)


def snapshot(state: TrainState) -> tuple[dict, dict]:
    return (copy.deepcopy(state.model.state_dict()), copy.deepcopy(state.opt.state_dict()))


def assert_state_equals(state: TrainState, want: tuple[dict, dict]) -> None:
    w, o = want
    got = state.model.state_dict()
    assert got.keys() == w.keys() and all(torch.equal(got[k], w[k]) for k in w)
    go = state.opt.state_dict()["state"]
    assert go.keys() == o["state"].keys()
    for i in go:
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(torch.as_tensor(go[i][k]), torch.as_tensor(o["state"][i][k])), k


class GatedWriter(FileSystemWriter):
    """A storage whose writes block until `gate` opens: a save held in flight."""

    def __init__(self, path: Path, gate: threading.Event, started: threading.Event) -> None:
        super().__init__(str(path))
        self.gate, self.started = gate, started

    def write_data(self, plan, planner):  # noqa: ANN001, ANN201 - torch's signature
        self.started.set()
        assert self.gate.wait(60), "the test never released the write"
        return super().write_data(plan, planner)


def test_training_goes_on_while_a_save_is_in_flight_and_the_save_holds_its_step(tmp_path):
    gate, started = threading.Event(), threading.Event()
    ck, state = setup(tmp_path, "logging.keep_checkpoints=5",
                      storage_writer=lambda d: GatedWriter(d, gate, started))
    step_once(state, 1)
    want = snapshot(state)
    marker = ck.maybe_save(2, state, val_done=True)
    assert marker == ck.ckdir / "step_2.pt"
    assert started.wait(60)
    for s in range(3):  # the loop goes on: weights and AdamW moments change under the save
        step_once(state, 10 + s)
    assert not marker.exists()  # still in flight: not a checkpoint yet
    assert ck.newest() is None
    gate.set()
    ck.wait()
    assert marker.exists() and ck.last_good == marker

    ck2, fresh = setup(tmp_path, "logging.keep_checkpoints=5")
    found = ck2.newest()
    assert found is not None and found[1].name == "step_2.pt"
    ck2.resume(found, fresh)
    assert fresh.step == 2 and fresh.val_done is True and fresh.sched.last_epoch == 1
    assert_state_equals(fresh, want)  # the step-2 state (a snapshot), not the one trained after it


def test_a_failed_write_is_raised_and_leaves_no_checkpoint(tmp_path):
    class Broken(FileSystemWriter):
        def write_data(self, plan, planner):  # noqa: ANN001, ANN201
            raise OSError("disk full")

    ck, state = setup(tmp_path, storage_writer=lambda d: Broken(str(d)))
    ck.maybe_save(2, state, val_done=False)
    with pytest.raises(RuntimeError, match="checkpoint write failed"):
        ck.wait()
    assert not (ck.ckdir / "step_2.pt").exists() and ck.newest() is None


def test_shards_without_their_marker_do_not_count_and_are_cleared(tmp_path):
    ck, state = setup(tmp_path, "logging.keep_checkpoints=5")
    ck.maybe_save(2, state, val_done=False, force=True)
    step_once(state)
    ck.maybe_save(4, state, val_done=False, force=True)
    (ck.ckdir / "step_4.pt").unlink()  # a kill -9 before the marker: shards only
    logged: list[str] = []
    ck2, fresh = setup(tmp_path, "logging.keep_checkpoints=5",
                       logged=logged)
    found = ck2.newest()
    assert found is not None and found[1].name == "step_2.pt"
    ck2.resume(found, fresh)
    assert not (ck.ckdir / "step_4.dcp").exists() and (ck.ckdir / "step_2.dcp").is_dir()
    # and a marker whose shards are gone is skipped with a line
    ck2.maybe_save(4, fresh, val_done=False, force=True)
    import shutil

    shutil.rmtree(ck.ckdir / "step_4.dcp")
    assert ck2.newest()[1].name == "step_2.pt"  # type: ignore[index]
    assert any("step_4.pt" in m and "shards" in m for m in logged)
    with pytest.raises(CheckpointError, match="shard directory"):
        load_checkpoint(ck.ckdir / "step_4.pt")


def test_export_holds_weights_only_and_bf16_halves_it_and_load_weights_reads_both(tmp_path):
    """A bf16 export: weights only, half the size, cast back to the fp32 model on load.
    Evaluation's one loader (model.checkpoint.load_weights) takes it and a sharded step
    checkpoint's marker (weights from its .dcp shards), as load_checkpoint does (found at the
    merge of the two branches: it refused markers as 'no model weights')."""
    from model.checkpoint import load_weights

    ck, state = setup(tmp_path)
    step_once(state)
    state.step = 1
    full = save_weights(tmp_path / "a.pt", state.model, extra={"step": 1})
    half = save_weights(tmp_path / "b.pt", state.model, extra={"step": 1},
                        dtype=torch.bfloat16)
    raw = torch.load(half, weights_only=True)
    assert {v.dtype for v in raw["model"].values()} == {torch.bfloat16}
    assert "optimizer" not in raw["extra"] and raw["extra"]["weights_only"] is True
    assert half.stat().st_size < 0.6 * full.stat().st_size  # tied weights stay stored once
    tied = [k for k in raw["model"] if k.endswith("emb.weight") or k == "readout.weight"]
    if state.model.cfg.tie_embeddings and len(tied) == 2:
        a, b = (raw["model"][k] for k in tied)
        assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    want = state.model.state_dict()
    for got in (load_checkpoint(half).model.state_dict(), load_weights(half).model.state_dict()):
        assert all(got[k].dtype == torch.float32 for k in got)
        assert all(torch.equal(got[k], want[k].to(torch.bfloat16).float()) for k in want)
    ck.maybe_save(1, state, val_done=False, force=True)
    ck.wait()
    marker = ck.ckdir / "step_1.pt"
    want = load_checkpoint(marker).model.state_dict()
    loaded = load_weights(marker)
    got = loaded.model.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert loaded.tokenizer == {"kind": "test"}  # what evaluation tokenizes with


def names(ck: Checkpointer) -> list[str]:
    return sorted(p.name for p in ck.ckdir.iterdir())


# ------------------------------------------------------------ which checkpoints, what a resume cuts
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
    assert not ck.run.finished
    # the evaluators' reader takes the newest step by number, never a temporary or an eval link
    assert RunDir(ck.rd).checkpoint() == ck.ckdir / "step_10.pt"
    # each step checkpoint is its marker + its directory of shards; rotation drops both
    assert names(ck) == sorted(["step_9.pt", "step_10.pt", "step_9.dcp", "step_10.dcp",
                                "eval_step_4.pt", "eval_step_7.pt",
                                "notes.txt", "step_3.pt.tmp"])
    # the last step's eval checkpoint is final.pt's, with its validation done
    assert ck.save_final(state) == tmp_path / "runs" / ck.rd.name / "checkpoints" / "final.pt"
    assert ck.run.finished
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
    assert other.run.finished and ck.metrics_path.exists()
    assert other.maybe_save(4, state, val_done=False, force=True) == ck.ckdir / "step_4.pt"
    assert not (ck.ckdir / "step_4.pt").exists()
    ck.prepare(fresh=True)
    assert not ck.run.finished and names(ck) == [] and not ck.metrics_path.exists()


# ------------------------------------------------------------ kill -9 across world sizes
BASE = [*SYNTH, "model.latent_bits=4", "train.batch_size=8", "train.micro_batch_size=2",
        f"train.tokens={9 * 8 * 65}", "logging.ckpt_every=3", "logging.val_every=6",
        "logging.keep_checkpoints=50", "train.parallel=fsdp"]


def _kill9_after_step3(n: int, args: list[str], ck: Path) -> None:
    p = subprocess.Popen(torchrun(n, *args), cwd=ROOT, env=env1(), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    t0 = time.time()
    while not (ck / "step_3.pt").exists():
        assert p.poll() is None and time.time() - t0 < 240, "no checkpoint at step 3"
        time.sleep(0.02)
    procs = psutil.Process(p.pid).children(recursive=True)
    for c in procs:
        c.send_signal(signal.SIGKILL)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=60)
    psutil.wait_procs(procs, timeout=30)
    assert not (ck / "final.pt").exists()


@pytest.mark.slow
@pytest.mark.parametrize("before,after", [(2, 1), (1, 2), (2, 2)],
                         ids=["fsdp2-to-1", "1-to-fsdp2", "fsdp2-to-2"])
def test_kill9_then_resume_equals_an_uninterrupted_run(tmp_path, before, after):
    """The global batch is the same at every world size, so the runs are the same run up to
    float summation order (1e-5, as tests/test_train_loop.py holds FSDP against one process);
    at the same world size the resumed run is the uninterrupted one bitwise."""
    ref = subprocess.run(torchrun(after, *BASE, f"paths.results={tmp_path / 'ref'}"), cwd=ROOT,
                         env=env1(), capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr[-3000:]
    args = [*BASE, f"paths.results={tmp_path / 'cut'}"]
    run = run_dir(compose(args))
    ck = run / "checkpoints"
    _kill9_after_step3(before, args, ck)
    res = subprocess.run(torchrun(after, *args), cwd=ROOT, env=env1(), capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resumed from step_" in (run / "train.log").read_text()
    ref_run = tmp_path / "ref" / "runs" / run.name
    a, b = weights(ref_run), weights(run)
    assert a.keys() == b.keys()
    if before == after:
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert rows(run, wall=False) == rows(ref_run, wall=False)
    else:
        assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    # each rank of the 2-process run wrote its own shard file
    if before == 2:
        assert len(list((ck / "step_3.dcp").glob("*.distcp"))) == 2


def test_a_checkpoint_before_the_first_step_leaves_the_optimizer_untouched(tmp_path):
    """DCP's get_state_dict makes an empty AdamW state by a zero-lr step (its `step` becomes
    1); a preemption's step-0 checkpoint must neither do that nor resume into it."""
    ck, state = setup(tmp_path)
    ck.maybe_save(0, state, val_done=True, force=True)
    assert not state.opt.state  # untouched: the first real step is still AdamW's step 1
    ck2, fresh = setup(tmp_path)
    ck2.resume(ck2.newest(), fresh)
    assert fresh.step == 0 and not fresh.opt.state
    want = state.model.state_dict()
    assert all(torch.equal(v, want[k]) for k, v in fresh.model.state_dict().items())
