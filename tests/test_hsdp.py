"""HSDP for multi-node FSDP2 (issue 45): a 2-D device mesh, replicate across nodes and shard
within a node, as torchtitan builds it (experiments/train/parallel.py: hsdp_shape, mesh_for,
shard, accumulate); automatic when the world spans several nodes of several processes each
(LOCAL_WORLD_SIZE < WORLD_SIZE), or an explicit number of replicas.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from trainrun import ROOT, SYNTH, env1, free_port, max_dw, rows, weights

import experiments.train.trainer as T
from experiments.train import parallel as par
from experiments.train.config import compose
from experiments.train.plan import run_dir
from model import ModelConfig, build_model

# 12 sequences a step: micro-batches of 1 at worlds 4 (accumulation 3) and 3 (accumulation 4)
ARGS = [*SYNTH, "model.latent_bits=4", "train.batch_size=12", f"train.tokens={6 * 12 * 65}",
        "logging.ckpt_every=3", "logging.val_every=3", "logging.keep_checkpoints=50"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("world,local,replicate,want", [
    (4, 2, None, (2, 2)),  # 2 nodes x 2: HSDP
    (64, 8, None, (8, 8)),
    (32, 8, None, (4, 8)),
    (8, 8, None, None),  # one node: 1-D FSDP
    (4, 1, None, None),  # one process per node: a shard group of one would hold everything
    (12, 8, None, None),  # nodes of unequal size: 1-D
    (8, 8, 2, (2, 4)),  # explicit: 2 replicas of 4 shards
    (64, 8, 1, None),  # explicit 1-D
    *((8, 8, bad, ValueError) for bad in (3, 0, True, 2.0)),  # refused
])
def test_the_mesh_shape_rule(world, local, replicate, want):
    if want is ValueError:
        with pytest.raises(ValueError, match="must be a positive integer that divides"):
            par.hsdp_shape(world, replicate, local=local)
    else:
        assert par.hsdp_shape(world, replicate, local=local) == want


def _tiny(latent_bits: int = 4) -> ModelConfig:
    return ModelConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128,
                       max_seq_len=32, tie_embeddings=False, latent_bits=latent_bits)


def test_a_fake_process_group_drives_hsdp_at_world_64(monkeypatch):
    """torchrun's variables for rank 13 of 64 processes, 8 per node (other worlds' mesh shapes:
    test_the_mesh_shape_rule): the trainer's setup (meta build, activation checkpointing,
    sharding, materialisation) builds the 2-D mesh, every parameter is a DTensor replicated over
    the nodes and sharded within one, a rank holds 1/8 of the weights (1/world under 1-D FSDP),
    and a step of micro-batches with the HSDP accumulation rule runs (the fake group's
    collectives move no data)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    world = 64
    dist.init_process_group("fake", store=FakeStore(), rank=13, world_size=world)
    try:
        held = {}
        for replicate in (None, 1):
            model, init = par.build_on_meta(_tiny())
            par.checkpoint_blocks(model)
            mesh = par.shard(model, torch.device("cpu"), world, replicate=replicate)
            torch.manual_seed(0)
            par.materialize(model, init, torch.device("cpu"))
            ps = list(model.parameters())
            assert all(isinstance(p, DTensor) and p.device_mesh is mesh for p in ps)
            if replicate is None:
                assert mesh.mesh_dim_names == ("dp_replicate", "dp_shard")
                assert tuple(mesh.shape) == (world // 8, 8)
                assert par.describe_mesh(mesh) == f"HSDP: {world // 8} replicas x 8 shards"
                assert all(p.placements == (Replicate(), Shard(0)) for p in ps)
            else:
                assert tuple(mesh.shape) == (world,) and par.describe_mesh(mesh) == \
                    f"FSDP over {world}"
                assert all(p.placements == (Shard(0),) for p in ps)
            held[replicate] = sum(p.to_local().numel() for p in ps)
            opt = torch.optim.AdamW(ps, lr=1e-3)
            x = torch.randint(0, 256, (2, 16))
            for a in range(3):
                with par.accumulate(model, "fsdp", last=a == 2):
                    model(x, targets=x, generator=torch.Generator().manual_seed(a)).loss.backward()
            opt.step()
        full = list(build_model(_tiny()).parameters())
        total = sum(p.numel() for p in full)
        row = sum(p[0].numel() for p in full)  # a rank's share of a tensor is within a row
        assert abs(held[None] - total / 8) <= row  # of 1/shards of it
        assert abs(held[1] - total / world) <= row
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------- CPU twins (gloo, slow)
PROBE = """\
import json, os, runpy, sys
from experiments.train import parallel as par

real = par.mesh_for


def mesh_for(*a, **k):  # the trainer's mesh, recorded by rank 0
    mesh = real(*a, **k)
    if os.environ["RANK"] == "0":
        with open(os.environ["MESH_OUT"], "w") as f:
            json.dump({"shape": list(mesh.shape), "names": list(mesh.mesh_dim_names)}, f)
    return mesh


par.mesh_for = mesh_for
sys.argv = ["experiments.train", *sys.argv[1:]]
runpy.run_module("experiments.train", run_name="__main__")
"""


def _close(a: Path, b: Path, tol: float) -> None:
    assert max_dw(weights(a), weights(b)) < tol
    la, lb = ([r["loss"] for r in rows(r, "train")] for r in (a, b))
    assert la == pytest.approx(lb, abs=tol)


@pytest.mark.slow
def test_two_agents_of_two_processes_train_hsdp_as_one_process_and_resume_at_world_3(
        tmp_path):
    """torchrun --nnodes 2 --nproc_per_node 2 twice (two "nodes" on localhost, c10d
    rendezvous), train.parallel=fsdp: the trainer builds the 2 x 2 HSDP mesh by itself; 6 steps
    equal one process (losses and final weights within 1e-5). Its step-3 checkpoint (written
    by the 4 ranks, replicated shards once) resumes at world 3, 1-D FSDP with uneven shares,
    and ends where one process does."""
    one = T.train(compose([*ARGS, f"paths.results={tmp_path / 'one'}"]))
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    port = free_port()
    hsdp = [*ARGS, "train.parallel=fsdp", "train.micro_batch_size=1",
            f"paths.results={tmp_path / 'hsdp'}"]
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(r),
         "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}",
         "--rdzv_id", f"hsdp-{port}", "--nproc_per_node", "2", str(probe), *hsdp],
        cwd=ROOT, env=env1(MESH_OUT=str(tmp_path / "mesh4.json")), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=300)[0] for p in agents]
    assert [p.returncode for p in agents] == [0, 0], "\n".join(o[-3000:] for o in outs)
    assert json.loads((tmp_path / "mesh4.json").read_text()) == {
        "shape": [2, 2], "names": ["dp_replicate", "dp_shard"]}
    four = tmp_path / "hsdp" / "runs" / one.name
    _close(one, four, 1e-5)

    # the step-3 checkpoint of the 4 ranks, resumed by 3 (64, 128 and 2048 rows: uneven)
    cfg = compose([*ARGS, f"paths.results={tmp_path / 'three'}"])
    run = run_dir(cfg)
    (run / "checkpoints").mkdir(parents=True)
    for name in ("metrics.jsonl", "config.yaml"):
        shutil.copy(four / name, run / name)
    shutil.copy(four / "checkpoints" / "step_3.pt", run / "checkpoints" / "step_3.pt")
    shutil.copytree(four / "checkpoints" / "step_3.dcp", run / "checkpoints" / "step_3.dcp")
    res = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "3",
         str(probe), *ARGS, "train.parallel=fsdp", "train.micro_batch_size=1",
         f"paths.results={tmp_path / 'three'}"],
        cwd=ROOT, env=env1(MESH_OUT=str(tmp_path / "mesh3.json")), capture_output=True, text=True,
        timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((tmp_path / "mesh3.json").read_text())["shape"] == [3]
    assert "resumed from step_3.pt" in (run / "train.log").read_text()
    _close(one, run, 1e-5)


WORKER = """\
import os, sys, torch, torch.distributed as dist
from experiments.train import parallel as par
from model import ModelConfig

bf16, out = sys.argv[1] == "bf16", sys.argv[2]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
cfg = ModelConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128,
                  max_seq_len=32, tie_embeddings=False, latent_bits=4)
model, init = par.build_on_meta(cfg)
par.shard(model, torch.device("cpu"), world, bf16=bf16)
torch.manual_seed(0)
par.materialize(model, init, torch.device("cpu"))
seen = set()  # the dtype the blocks compute in
model.blocks[0].register_forward_pre_hook(lambda m, a: seen.add(m.attn.wq.weight.dtype))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
g = torch.Generator().manual_seed(1)
data = torch.randint(0, 256, (3, 4, 16), generator=g)  # 3 steps of 4 sequences
per = 4 // world  # this rank's sequences, in micro-batches of 2
losses = []
for step in range(3):
    rows = data[step, rank * per:(rank + 1) * per]
    total = torch.zeros(())
    for a in range(0, per, 2):
        with par.accumulate(model, "fsdp", last=a + 2 >= per):
            x = rows[a:a + 2]
            out_ = model(x, targets=x, z=torch.zeros_like(x))  # pinned codes: any layout
            (out_.loss * 2 / per).backward()
            total += out_.loss.detach() * 2 / 4
    dist.all_reduce(total)
    losses.append(total.item())
    opt.step()
    opt.zero_grad()
w = par.full_weights(model, "fsdp", main=rank == 0)
if rank == 0:
    torch.save({"losses": losses, "weights": w, "dtype": str(seen.pop())}, out)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_fsdp2_with_bf16_mixed_precision_on_two_processes_trains_as_one(tmp_path):
    """parallel.shard(bf16=True), the GPU policy (bf16 parameters, all-gathers and compute,
    gradients reduced in fp32), on gloo: 2 processes and 1 process (the same micro-batches of 2
    sequences) give the same losses and weights to fp32 rounding, with fp32 master weights;
    the blocks computed in bf16."""
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    res = {}
    for world, prec in ((2, "bf16"), (1, "bf16")):
        out = tmp_path / f"{world}-{prec}.pt"
        r = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
             str(world), str(worker), prec, str(out)],
            cwd=ROOT, env=env1(), capture_output=True, text=True,
            timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        res[world, prec] = torch.load(out, weights_only=True)
    two, one = res[2, "bf16"], res[1, "bf16"]
    assert two["dtype"] == one["dtype"] == "torch.bfloat16"
    assert two["losses"] == pytest.approx(one["losses"], abs=1e-6)
    for k, v in one["weights"].items():
        assert v.dtype == torch.float32  # fp32 master weights
        torch.testing.assert_close(two["weights"][k], v, rtol=1e-5, atol=1e-6, msg=k)
