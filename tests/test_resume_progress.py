# tests/test_resume_progress.py
"""A resume never repeats the work its checkpoint already covers, and a job that makes no
progress across requeues stops with one clear reason (fast; the real SLURM run is in
tests/test_slurm.py)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
import torch
from submitit.helpers import DelayedSubmission
from trainrun import SYNTH, rows, weights

import experiments.train.trainer as T
from experiments.train.config import compose
from experiments.train.plan import plan, run_dir
from sweeps import job as J

TINY = [*SYNTH, "model.latent_bits=4", "train.batch_size=8", "logging.val_every=2",
        f"train.tokens={4 * 8 * 64}"]  # 4 steps (seq_len 64)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # one thread: bitwise-equal runs



@pytest.mark.parametrize("at_step", [0, 2])
def test_a_signal_during_validation_checkpoints_it_and_the_resume_does_not_repeat_it(
        tmp_path, monkeypatch, at_step):
    """The reported defect: preempted during the validation at step 0 (or at a later val step),
    every resume re-ran that validation, so a short slot never got to train."""
    real = T.evaluate
    calls: list[int] = []

    def evaluate(model, *a, **k):
        calls.append(1)
        if len(calls) == (1 if at_step == 0 else 2):  # the preemption arrives mid-validation
            os.kill(os.getpid(), signal.SIGTERM)
        return real(model, *a, **k)

    monkeypatch.setattr(T, "evaluate", evaluate)
    cfg = compose([*TINY, f"paths.results={tmp_path / 'cut'}"])
    assert plan(cfg).steps == 4
    with pytest.raises(T.Preempted) as e:
        T.train(cfg)
    assert e.value.step == at_step and e.value.checkpoint.name == f"step_{at_step}.pt"
    assert e.value.code == T.EXIT_PREEMPTED == 75  # main's exit code: the launcher requeues
    n_first = len(calls)
    T.train(cfg)  # the resume
    run = run_dir(cfg)
    log = (run / "train.log").read_text()
    assert f"resumed from step_{at_step}.pt" in log
    assert log.count(f"step {at_step}: val_ce") == 1  # validated once, in the first attempt
    assert len(calls) - n_first == (2 if at_step == 0 else 1)  # resume: steps 2 and 4 / 4
    assert [r["step"] for r in rows(run, "val")] == [0, 2, 4]

    monkeypatch.setattr(T, "evaluate", real)
    ref = T.train(compose([*TINY, f"paths.results={tmp_path / 'ref'}"]))
    a, b = weights(ref), weights(run)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert rows(run, wall=False) == rows(ref, wall=False)


def _job(tmp_path: Path, stalls: int = 0) -> J.CellJob:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True, exist_ok=True)
    (run / "train.log").write_text("[00:00:01] resumed from step_3.pt (step 3/10)\n")
    # a child that just sleeps: checkpoint() SIGTERMs it
    return J.CellJob("c", [sys.executable, "-c", "import time; time.sleep(60)"],
                     run_dir=str(run), stalls=stalls)


def _attempt(job: J.CellJob, new_step: int | None) -> object:
    import subprocess
    import time

    job._started, job._step0 = time.monotonic(), job.latest_step()
    job._proc = subprocess.Popen(job.argv)
    if new_step is not None:
        (Path(job.run_dir) / "checkpoints" / f"step_{new_step}.pt").write_bytes(b"x")
    return job.checkpoint()


def test_a_requeue_without_progress_twice_fails_with_one_reason(tmp_path):
    job = _job(tmp_path, stalls=1)  # one stall already
    (Path(job.run_dir) / "checkpoints" / "step_3.pt").write_bytes(b"x")
    d1 = _attempt(job, new_step=5)  # progress: requeue, count reset
    assert isinstance(d1, DelayedSubmission) and d1.function.stalls == 0
    d2 = _attempt(d1.function, new_step=None)  # no new checkpoint: first stall, still requeued
    assert isinstance(d2, DelayedSubmission) and d2.function.stalls == 1
    with pytest.raises(J.CellFailed) as e:  # second stall in a row: stop
        _attempt(d2.function, new_step=None)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("no progress in 2 attempts in a row: the slot of")
    assert "still at step 5" in msg and "resumed from step_3.pt" in msg
    assert "interrupted" not in msg  # the manifest would read it as a resumable interruption
