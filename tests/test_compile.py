"""train.compile (issue 36): each transformer block and the Free Transformer's encoder block is
compiled in place (parallel.compile_units) before DDP wraps or FSDP2 shards the model. Inductor
on a CPU needs a C++ compiler and about a minute per cold compile: the compiling tests are
slow-tier and share one inductor cache per session.
"""

from __future__ import annotations

import os
import subprocess

import pytest
import torch
from fake import tiny
from trainrun import ROOT, SYNTH, env1, max_dw, rows, torchrun, weights

import experiments.train.trainer as T
from experiments.train import parallel as par
from experiments.train.config import compose
from model import build_model

TINY = [*SYNTH, "train.batch_size=4", "logging.val_every=2"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # one thread: reproducible runs


@pytest.fixture
def inductor_cache(tmp_path_factory, monkeypatch) -> None:
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or str(
        tmp_path_factory.getbasetemp() / "inductor-cache")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", cache)


@pytest.mark.parametrize("latent_bits", [0, 4], ids=["baseline", "free"])
def test_compiling_the_blocks_keeps_every_name(latent_bits):
    """Module.compile wraps the call in place: the state dict (what checkpoints, DCP and the
    weights-only export key on) has the eager model's names, with activation checkpointing
    too; every block and the encoder block is compiled, nothing else."""
    torch.manual_seed(0)
    eager = build_model(tiny(latent_bits=latent_bits))
    torch.manual_seed(0)
    comp = build_model(tiny(latent_bits=latent_bits))
    par.checkpoint_blocks(comp)
    par.compile_units(comp)
    assert list(comp.state_dict()) == list(eager.state_dict())
    assert [n for n, _ in comp.named_parameters()] == [n for n, _ in eager.named_parameters()]
    compiled = {n for n, m in comp.named_modules() if m._compiled_call_impl is not None}
    want = {f"blocks.{i}" for i in range(4)} | ({"encoder"} if latent_bits else set())
    assert compiled == want
    comp.load_state_dict(eager.state_dict())  # loads both ways
    eager.load_state_dict(comp.state_dict())


@pytest.mark.slow
@pytest.mark.parametrize("mode,before", [("ddp", "DDP"), ("fsdp", "sharding")])
def test_ddp_and_fsdp_with_compiled_blocks_train_as_one_eager_process(tmp_path, inductor_cache,
                                                                      mode, before):
    """2 DDP or FSDP2 processes (micro-batch 2, accumulation 2), each block and the encoder
    block compiled before DDP wraps or FSDP2 shards the model (its hooks stay outside the
    graphs; was torch.compile of the DDP-wrapped model), vs one eager process: the same losses
    (FSDP measured 1.8e-7 apart) and final weights within 1e-3."""
    args = [*TINY, "train.batch_size=8", "model.latent_bits=4", f"train.tokens={3 * 8 * 65}"]
    one = T.train(compose([*args, f"paths.results={tmp_path / 'one'}"]))
    res = subprocess.run(
        torchrun(2, *args, f"train.parallel={mode}", "train.micro_batch_size=2",
                 "train.compile=true", f"paths.results={tmp_path / 'c'}"),
        cwd=ROOT, env=env1(), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    two = tmp_path / "c" / "runs" / one.name
    log = (two / "train.log").read_text()
    assert f"parallel: {mode}" in log
    assert f"compile: each block and the encoder block, before {before}" in log
    a, b = rows(one, "train"), rows(two, "train")
    assert [r["loss"] for r in b] == pytest.approx([r["loss"] for r in a], rel=1e-4, abs=1e-4)
    wa, wb = weights(one), weights(two)
    assert list(wa) == list(wb) and max_dw(wa, wb) < 1e-3


@pytest.fixture
def one_gloo_process():
    """A gloo process group of one in this process (DDP and FSDP2 need a group; at world 1
    their hooks are the code that runs at any world, the collectives aside)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
@pytest.mark.parametrize("ac", [False, True], ids=["", "act-ckpt"])
def test_graph_count_and_no_graph_break_under_ddp_and_fsdp2(monkeypatch, one_gloo_process,
                                                           mode, ac):
    """The trainer's order (meta build, activation checkpointing, compile_units, DDP or FSDP2,
    materialise) for the Free Transformer, two accumulated micro-batches and a validation
    forward: three graphs for training (the plain block, the block whose keys/values get Z,
    the encoder block), two more without gradient for validation (the plain and the Z
    block: the encoder does not run under the prior), and no graph break, under DDP and FSDP2,
    with and without activation checkpointing. AOTAutograd without inductor (aot_eager): the
    graphs and breaks are dynamo's and AOT's, and a minute of C++ compiles is spared."""
    from torch._dynamo.utils import counters

    real = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile",
                        lambda self, *a, **k: real(self, *a, **{"backend": "aot_eager", **k}))
    torch._dynamo.reset()
    counters.clear()
    model, init = par.build_on_meta(tiny(latent_bits=4))
    if ac:
        par.checkpoint_blocks(model)
    par.compile_units(model)
    if mode == "fsdp":
        par.shard(model, torch.device("cpu"), 1)
    torch.manual_seed(0)
    par.materialize(model, init, torch.device("cpu"))
    fwd = par.ddp(model, torch.device("cpu")) if mode == "ddp" else model
    x = torch.randint(0, 97, (2, 16))
    for a in range(2):
        with par.accumulate(fwd, mode, last=a == 1):
            fwd(x, targets=x, generator=torch.Generator().manual_seed(a)).loss.backward()
    assert counters["stats"]["unique_graphs"] == 3, dict(counters["stats"])
    with torch.no_grad():
        fwd.eval()(x, targets=x)
    assert counters["stats"]["unique_graphs"] == 5, dict(counters["stats"])
    assert not counters["graph_break"], dict(counters["graph_break"])
