"""Plans that know the cluster (issue 26): the world size from make's NPROC x NNODES, torchrun
or the cluster file; the 1.5B and 8B dry runs on 1, 32 and 256 GPUs; a batch that does not split
refused in one line with values checked here to be valid; `auto` counting activations;
checkpoint bytes against a meta-device build; the free-space check."""

from __future__ import annotations

import random

import pytest
import torch

import experiments.train.trainer as T
from common.errors import UsageError
from experiments.train import plan as P
from experiments.train.config import compose
from model import build_model


@pytest.fixture(autouse=True)
def _no_site(monkeypatch, tmp_path):
    """No launch environment, no cluster file and no committed gpu-check measurement (the MFU
    is the assumed one) unless a test sets one."""
    from common import paths

    for k in (*P.PLAN_ENV, "WORLD_SIZE", "RANK"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("FTBENCH_CLUSTER", str(tmp_path / "no-cluster.yaml"))
    monkeypatch.setattr(paths, "MEASURED", tmp_path / "no-measured")


BIG = ["train.seq_len=4096", "train.batch_size=256", "train.micro_batch_size=1",
       "train.tokens=47e9",
       "data.max_epochs=2000"]  # plans a paper shape, not the stdlib corpus (1.49e3 passes)


# each preset at 32 GPUs, and each world once: 1 and 256 GPUs ask nothing of the preset that
# 32 does not (the parallel mode is checked against auto_parallel at each)
@pytest.mark.parametrize("preset, n", [("1.5B", 1), ("1.5B", 32), ("8B", 32), ("8B", 256)])
def test_the_dry_run_of_the_paper_presets_plans_1_32_and_256_gpus(preset, n, tmp_path, capsys):
    rc = T.main([f"model={preset}", *BIG, f"train.plan_world_size={n}",
                 f"paths.results={tmp_path}", "train.dry_run=true"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    out = cap.out
    assert "Traceback" not in out + cap.err and not (tmp_path / "runs").exists()
    assert f"world       {n} GPU(s)" in out
    assert f"x world {n}; warmup" in out and f"accum {256 // n} x" in out
    assert f"on {n} GPU(s)," in out  # GPU time on the actual GPU count
    assert "checkpoint  " in out and "bf16 weights-only export" in out and "GB/s" in out
    assert "disk        " in out
    mode = "none" if n == 1 else P.auto_parallel(
        P.plan(compose([f"model={preset}", *BIG]), n), 80e9)
    assert (f"parallel    {mode} over {n} GPU(s) (auto: by the hand estimate" in out) == (n > 1)
    assert "memory      measured per phase on fake tensors" in out  # make train DRY=1's
    # GPU-hours do not depend on the GPU count; the wall time does
    p = P.plan(compose([f"model={preset}", *BIG]), n)
    g = P.gpu_time_estimate(p, n, 989.0, P.ASSUMED_MFU)
    assert f"{g['gpu_hours']:.3g} GPU-hours, at MFU 35% of 989 TFLOP/s" in out
    assert "implies MFU 31% at 6N FLOPs/token" in out
    assert "CPU time    null:" in out  # too large to time here, and nothing stated


def test_nproc_and_nnodes_from_make_and_the_cluster_file_set_the_world(monkeypatch, tmp_path,
                                                                      capsys):
    args = ["model=1.5B", *BIG, f"paths.results={tmp_path}", "train.dry_run=true"]
    monkeypatch.setenv("FTBENCH_PLAN_NPROC", "8")
    monkeypatch.setenv("FTBENCH_PLAN_NNODES", "4")
    assert T.main(args) == 0
    out = capsys.readouterr().out
    assert "world       32 GPU(s)/process(es), from NPROC=8 x NNODES=4" in out
    assert "on 32 GPU(s)," in out
    monkeypatch.setenv("FTBENCH_PLAN_NNODES", "four")
    assert T.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "NNODES='four': must be a positive integer" in err
    for k in P.PLAN_ENV:
        monkeypatch.delenv(k)
    cl = tmp_path / "cluster.yaml"
    cl.write_text("partition: gpu\ngpus_per_node: 8\nnodes: 2\nwrite_gbps: 0.5\n"
                  f"results: {tmp_path}\n")
    monkeypatch.setenv("FTBENCH_CLUSTER", str(cl))
    assert T.main(args) == 0
    out = capsys.readouterr().out
    assert f"world       16 GPU(s)/process(es), from {cl}: 2 node(s) x 8 GPU(s)" in out
    # 1.5B: 12 bytes per parameter at 0.5 GB/s
    n = P.plan(compose(["model=1.5B", *BIG]), 16).params["total"]
    assert f"save ~{P.duration(12 * n / 0.5e9)} at 0.5 GB/s (write_gbps of {cl})" in out
    cl.write_text("partition: gpu\nwrite_gbps: fast\n")
    assert T.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "write_gbps" in err


@pytest.mark.parametrize(("batch", "micro", "world"), [
    (16, None, 32), (64, 1, 256), (256, 2, 24), (16, None, 7), (100, 5, 3), (1, None, 2)])
def test_a_batch_that_does_not_split_is_one_line_with_valid_nearest_values(
        batch, micro, world, tmp_path, capsys):
    args = ["model=1M", f"train.batch_size={batch}", f"train.plan_world_size={world}",
            f"paths.results={tmp_path}", "train.dry_run=true"]
    if micro:
        args.append(f"train.micro_batch_size={micro}")
    assert T.main(args) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.count("\n") == 1 and "Traceback" not in cap.err
    assert f"train.batch_size={batch} does not split over" in cap.err
    _suggestions_are_valid(cap.err, batch, micro, world)


def _suggestions_are_valid(msg: str, batch: int, micro: int | None, world: int) -> None:
    """Every suggested batch size splits over `world`, every suggested world size splits
    `batch`, checked by plan() itself; and none nearer is skipped (brute force)."""
    import re

    tail = msg.split("nearest valid: ")[1]
    sizes = [int(x) for x in re.findall(r"train\.batch_size=(\d+)", tail)]
    worlds = [int(x) for x in re.findall(r"\d+", tail.split("world size of ")[1])]
    cfg = compose(["model=1M", f"train.batch_size={batch}"]
                  + ([f"train.micro_batch_size={micro}"] if micro else []))

    def ok(b: int, w: int) -> bool:
        if micro and b % micro:
            return False
        cfg.train.batch_size = b  # plan() decides; the config's own checks are not the question
        try:
            P.plan(cfg, w)
        except UsageError:
            return False
        return True

    assert sizes and worlds
    assert all(ok(b, world) for b in sizes) and all(ok(batch, w) for w in worlds)
    unit = (micro or 1) * world  # any multiple of it is valid: the nearest lie within one unit
    valid_b = [b for b in range(1, batch + unit + 1) if ok(b, world)]
    below = [b for b in valid_b if b < batch]
    above = [b for b in valid_b if b > batch]
    assert set(sizes) == {*(below[-1:]), *(above[:1])}
    valid_w = [w for w in range(1, 2 * max(batch, world) + 1) if ok(batch, w)]
    assert set(worlds) == {max(w for w in valid_w if w <= world),
                           *[w for w in valid_w if w >= world][:1]}


@pytest.mark.slow  # end to end, 6-15 s: the slow tier (CI runs it)
def test_random_worlds_never_trace_back():
    rng = random.Random(0)
    for _ in range(200):
        batch, world = rng.randint(1, 512), rng.randint(1, 1024)
        micro = rng.choice([None, *[d for d in (1, 2, 4, 8) if batch % d == 0]])
        cfg = compose(["model=1M", f"train.batch_size={batch}"]
                      + ([f"train.micro_batch_size={micro}"] if micro else []))
        try:
            p = P.plan(cfg, world)
        except UsageError as e:
            assert "\n" not in str(e) and "nearest valid" in str(e)
            continue
        assert p.micro_batch_size * p.grad_accum * world == batch


def test_auto_picks_fsdp_when_ddp_plus_activations_do_not_fit():
    """1.5B at seq 4096: DDP's state (16 bytes/param, ~24 GB) fits an 80 GB GPU, but with a
    micro-batch of 4 the activations do not; the old rule (state only) chose DDP."""
    cfg = compose(["model=1.5B", "train.seq_len=4096", "train.batch_size=256",
                   "train.micro_batch_size=4"])
    p = P.plan(cfg, 8)
    state = 16 * p.params["total"]
    assert state < 0.8 * 80e9  # the state-only rule would pick DDP
    assert P.hand_bytes(p, "ddp") > 0.8 * 80e9
    assert P.dry_parallel(cfg, p) == "fsdp"
    # with activation checkpointing DDP fits again
    ck = compose(["model=1.5B", "train.seq_len=4096", "train.batch_size=256",
                  "train.micro_batch_size=4", "train.activation_checkpointing=true"])
    assert P.dry_parallel(ck, P.plan(ck, 8)) == "ddp"
    small = compose(["model=1.5B", "train.seq_len=4096", "train.batch_size=256",
                     "train.micro_batch_size=1"])
    assert P.dry_parallel(small, P.plan(small, 8)) == "ddp"


def test_checkpoint_bytes_equal_a_meta_build_of_the_8b_free_transformer():
    cfg = compose(["model=8B", "model.latent_bits=16"])
    p = P.plan(cfg, 1)
    with torch.device("meta"):
        m = build_model(p.model)
    n = sum(x.numel() for x in m.parameters())
    ck = P.checkpoint_bytes(p)
    assert ck["weights_fp32"] == 4 * n
    assert ck["full"] == 4 * n + 2 * 4 * n  # fp32 weights + AdamW's two fp32 moments
    assert ck["bf16_export"] == sum(x.numel() * torch.finfo(torch.bfloat16).bits // 8
                                    for x in m.parameters())


def test_the_free_space_check_is_one_line_when_short(tmp_path):
    assert P.space_refusal(tmp_path, 1) is None
    msg = P.space_refusal(tmp_path / "not" / "yet", 10**18)  # nearest existing ancestor
    assert msg is not None and "\n" not in msg and "free on its file system" in msg
    cfg = compose(["model=1M", "logging.keep_checkpoints=3"])
    p = P.plan(cfg, 1)
    d = P.disk_bytes(cfg, p)
    # 3 rotated + 1 in flight, and one weights-only export (final.pt; bf16: auto on a GPU)
    assert d["run"] == (3 + 1) * P.checkpoint_bytes(p)["full"] + 2 * p.params["total"]
    cpu = P.disk_bytes(compose(["model=1M", "logging.keep_checkpoints=3",
                                "logging.keep_eval_checkpoints=5", "train.device=cpu"]), p)
    assert cpu["run"] == 4 * P.checkpoint_bytes(p)["full"] + 5 * 4 * p.params["total"]
    assert d["total"] == d["run"] + d["corpus"]


def test_a_slurm_sweep_checks_the_scratch_root_before_submitting(monkeypatch, tmp_path):
    from common.errors import UsageError
    from sweeps import backend
    from sweeps import driver as L
    from sweeps import plan as SP
    from sweeps.cluster import ClusterConfig
    from sweeps.grid import SweepSpec

    monkeypatch.setenv("FTBENCH_RESULTS", str(tmp_path / "res"))
    p = SP.plan(SweepSpec.from_text(kappa="1", h="4", seeds="0", tokens="1k"))
    L._check_scratch(p, ClusterConfig(partition="p"))  # tiny cells: room enough
    L._check_scratch(p, ClusterConfig(partition="p", results=str(tmp_path / "res")))
    with pytest.raises(UsageError, match=r"results=/scratch/x but this sweep writes under "
                                         r".*; run it with FTBENCH_RESULTS=/scratch/x$"):
        L._check_scratch(p, ClusterConfig(partition="p", results="/scratch/x"))
    need = [backend.run_disk(c.cfg, True) for c in p.cells]
    assert all(n and n > 0 for n in need)
    monkeypatch.setattr(backend, "run_disk", lambda cfg, gpus: 10**18)
    from sweeps.checks import disk  # the free space: the pre-submission checks' (api.run)

    d = disk(p, ClusterConfig(partition="p"))
    assert not d.ok and "free on its file system, the plan needs" in d.line
