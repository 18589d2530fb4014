"""The trainer's disk check at start (issue 26): before anything is written, a run whose results
root lacks room for its checkpoints (the dry run's `disk_bytes` figure, less what a resume's
checkpoints already hold, plus an unbuilt corpus) is refused in one line, exit 2; rank 0
decides and every rank exits. The free space is a monkeypatched `plan.free_bytes`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from trainrun import SYNTH, free_port

import experiments.train.plan as P
import experiments.train.trainer as T
from common.errors import UsageError
from experiments.train.config import compose

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = [*SYNTH, "train.batch_size=4", "logging.val_every=0", "model.latent_bits=0",
        f"train.tokens={2 * 4 * 65}", "logging.keep_checkpoints=1",
        "logging.keep_eval_checkpoints=2"]


def need_bytes(cfg) -> int:
    """The run's checkpoints, counted independently: (keep + 1 in flight) full checkpoints
    (fp32 weights + two AdamW moments = 12 bytes a parameter) and the weights-only exports (the
    kept evaluation checkpoints, the last of them final.pt's hard link, or final.pt alone), fp32
    on this CPU (4 bytes a parameter)."""
    n = P.plan(cfg, 1).params["total"]
    lg = cfg.logging
    return (lg.keep_checkpoints + 1) * 12 * n + max(1, lg.keep_eval_checkpoints) * 4 * n


def free(monkeypatch, n: int) -> None:
    monkeypatch.setattr(P, "free_bytes", lambda path: n)


def test_one_byte_short_is_one_line_exit_2_nothing_written_and_exactly_enough_trains(
        tmp_path, monkeypatch, capsys):
    args = [*TINY, f"paths.results={tmp_path / 'res'}"]
    cfg = compose(args)
    free(monkeypatch, need_bytes(cfg) - 1)
    assert T.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("train: error: ")
    assert "free on its file system" in err and "checkpoints" in err
    assert not (tmp_path / "res").exists()  # no run dir, no cache, no lock
    free(monkeypatch, need_bytes(cfg))
    assert P.start_refusal(cfg, P.plan(cfg, 1), P.run_dir(cfg)) is None
    assert (T.train(cfg) / "checkpoints" / "final.pt").is_file()
    free(monkeypatch, 0)  # a finished run writes nothing: it returns, not refuses
    assert T.main(args) == 0
    assert "is finished" in capsys.readouterr().err


def test_a_resume_counts_what_its_checkpoints_hold(tmp_path, monkeypatch):
    cfg = compose([*TINY, f"paths.results={tmp_path}"])
    p, rd = P.plan(cfg, 1), P.run_dir(cfg)
    held = rd / "checkpoints" / "step_1.dcp" / "__0_0.distcp"
    held.parent.mkdir(parents=True)
    held.write_bytes(b"x" * 1000)  # a resume's checkpoints: already on disk
    need = need_bytes(cfg) - 1000
    free(monkeypatch, need)
    assert P.start_refusal(cfg, p, rd) is None
    free(monkeypatch, need - 1)
    assert "free on its file system" in P.start_refusal(cfg, p, rd)


def test_an_unbuilt_corpus_is_counted(tmp_path, monkeypatch):
    cfg = compose(["data=stdlib", "data.max_bytes=200000", "logging.keep_checkpoints=1",
                   f"paths.results={tmp_path}"])
    p = P.plan(cfg, 1)
    corpus = P.disk_bytes(cfg, p)["corpus"]
    assert corpus > 0
    free(monkeypatch, need_bytes(cfg) + corpus)
    assert P.start_refusal(cfg, p, P.run_dir(cfg)) is None
    free(monkeypatch, need_bytes(cfg) + corpus - 1)
    assert "and its corpus" in P.start_refusal(cfg, p, P.run_dir(cfg))


def _rank(rank: int, world: int, port: int, results: str, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import experiments.train.plan as P
    import experiments.train.trainer as T

    P.free_bytes = lambda path: 0 if rank == 0 else 1 << 60  # only rank 0 is short
    try:
        T.train(compose([*TINY, "train.device=cpu", f"paths.results={results}"]))
        msg = "trained"
    except UsageError as e:
        msg = f"refused: {e}"
    Path(out, f"rank{rank}").write_text(msg)


@pytest.mark.slow
def test_rank0_decides_and_every_rank_exits(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    mp.start_processes(_rank, args=(2, free_port(), str(tmp_path / "res"), str(out)),
                       nprocs=2, join=True, start_method="spawn")
    a, b = ((out / f"rank{r}").read_text() for r in (0, 1))
    assert a == b and a.startswith("refused: ") and "free on its file system" in a
    assert not (tmp_path / "res").exists()
