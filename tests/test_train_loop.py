"""Issue 26, the training loop: a process group with a backend for every device, training that
does not depend on the layout (world size, micro-batch, DDP/FSDP, activation checkpointing),
TensorBoard scalars, the latent draws keyed per sequence, and the GPU-only paths on this CPU
(bf16 autocast). Multi-process runs use torchrun with gloo on CPU; FSDP's kill -9 and resume:
tests/test_checkpoint_sharded.py."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from trainrun import ROOT, SYNTH, env1, max_dw, torchrun, weights
from trainrun import rows as lines

import experiments.train.trainer as T
from experiments.train.config import compose, model_config
from experiments.train.plan import plan, run_id
from model.free_transformer import SequenceKeys, sample_codes

BASE = [*SYNTH, "train.batch_size=8"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ---------------------------------------------------------------- the process group
def test_a_cuda_process_group_has_a_cpu_backend(monkeypatch):
    """Was `init_process_group("nccl")` on CUDA while the loop all-reduced CPU tensors: NCCL
    has no CPU backend, so the first multi-GPU run died after the step-0 validation."""
    seen: list = []
    monkeypatch.setattr(T.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(T.dist, "init_process_group", lambda backend=None, **k: seen.append(
        backend))
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
    with T._process_group(torch.device("cuda", 0), 2):
        monkeypatch.setattr(T.dist, "is_initialized", lambda: False)  # nothing to destroy
    assert seen == ["cpu:gloo,cuda:nccl"]  # every device type the loop's tensors can be on
    assert T.process_group_backend(torch.device("cpu")) == "gloo"


# ---------------------------------------------------------------- latent draws
def test_sequence_keys_draw_per_sequence_whatever_the_batch():
    """Sequence i's uniforms are the same in a batch of 8, a micro-batch of 2 and alone; they
    change with the seed and the step; and they look uniform."""
    cpu = torch.device("cpu")
    full = SequenceKeys.for_batch(3, 7, 0, 8, cpu).rand((8, 5, 4), cpu)
    for first, n in ((0, 2), (2, 2), (6, 2), (5, 1)):
        part = SequenceKeys.for_batch(3, 7, first, n, cpu).rand((n, 5, 4), cpu)
        assert torch.equal(part, full[first:first + n])
    assert not torch.equal(SequenceKeys.for_batch(3, 8, 0, 8, cpu).rand((8, 5, 4), cpu), full)
    assert not torch.equal(SequenceKeys.for_batch(4, 7, 0, 8, cpu).rand((8, 5, 4), cpu), full)
    big = SequenceKeys.for_batch(0, 0, 0, 16, cpu).rand((16, 256, 16), cpu)
    assert big.min() >= 0 and big.max() < 1
    assert abs(big.mean().item() - 0.5) < 0.01 and abs(big.std().item() - 12 ** -0.5) < 0.01
    # bits with logit 0 are fair coins; each bit of the code independently
    codes = sample_codes(torch.zeros(16, 256, 16), SequenceKeys.for_batch(0, 0, 0, 16, cpu))
    bits = (codes[..., None] >> torch.arange(16)) & 1
    assert (bits.float().mean((0, 1)) - 0.5).abs().max() < 0.03


def test_micro_batch_size_is_not_part_of_the_run_id():
    """Latent draws keyed per sequence make the micro-batch a memory layout: every value has
    the default's run-id (the default's id unchanged: tests/test_golden_plans.py)."""
    ids = {run_id(compose([*BASE, *extra])) for extra in
           ([], ["train.micro_batch_size=1"], ["train.micro_batch_size=4"],
            ["train.activation_checkpointing=true"], ["train.parallel=fsdp"])}
    assert len(ids) == 1
    assert run_id(compose([*BASE, "train.batch_size=4"])) not in ids


FT = [*BASE, "model.latent_bits=4", f"train.tokens={3 * 8 * 65}"]
"""The FT on one process, 3 steps of micro-batch 8: the run the fast tests below compare with."""


@pytest.fixture(scope="module")
def ft_run(tmp_path_factory, one_torch_thread) -> Path:
    """FT's run, once per module; logging.peak_tflops (not in the run-id) for the MFU scalar."""
    out = tmp_path_factory.mktemp("ft-run")
    return T.train(compose([*FT, "logging.peak_tflops=0.5", f"paths.results={out}"]))


def test_one_process_any_micro_batch_trains_the_same(tmp_path, ft_run):
    """The FT on one process: micro-batch 8 (no accumulation) == micro-batch 2 (4 x accum)."""
    a = ft_run
    b = T.train(compose([*FT, "train.micro_batch_size=2", f"paths.results={tmp_path / 'b'}"]))
    assert a.name == b.name
    assert max_dw(weights(a), weights(b)) < 1e-4
    la, lb = lines(a, "train"), lines(b, "train")
    assert [r["loss"] for r in la] == pytest.approx([r["loss"] for r in lb], abs=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("latent_bits", [0, 4], ids=["baseline", "free-activation-checkpointing"])
def test_one_process_default_micro_batch_equals_two_fsdp_and_two_ddp(tmp_path, latent_bits):
    """Issue 26: 1 process with the default micro-batch (8, no accumulation) vs 2 FSDP
    processes (micro-batch 2, accumulation 2; the FT with activation checkpointing) and 2 DDP
    processes (micro-batch 1, accumulation 4): the same training, within 1e-5 max |dw| for
    FSDP and 1e-4 for DDP. Was 0.014 apart for the FT (its latent draws were keyed by
    micro-batch)."""
    args = [*BASE, f"model.latent_bits={latent_bits}", f"train.tokens={3 * 8 * 65}"]
    one = compose([*args, f"paths.results={tmp_path / 'one'}"])
    assert plan(one, world_size=1).grad_accum == 1
    r1 = T.train(one)
    w1 = weights(r1)
    torch.manual_seed(one.train.seed)
    init = T.build_model(model_config(one.model)).state_dict()
    for mode, micro, tol, ac in (("fsdp", 2, 1e-5, bool(latent_bits)), ("ddp", 1, 1e-4, False)):
        res = subprocess.run(
            torchrun(2, *args, f"train.parallel={mode}", f"train.micro_batch_size={micro}",
                     f"train.activation_checkpointing={str(ac).lower()}",
                     f"paths.results={tmp_path / mode}"),
            cwd=ROOT, env=env1(), capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        r2 = tmp_path / mode / "runs" / r1.name  # micro-batch and world not in the run-id
        w2 = weights(r2)  # gathered on rank 0: the same file as one process writes
        assert not any(isinstance(v, torch.distributed.tensor.DTensor) for v in w2.values())
        assert max_dw(w1, w2) < tol, mode
        l1, l2 = lines(r1, "train"), lines(r2, "train")
        for k in ("loss", "ce", "kl_nats", "grad_norm"):
            assert [r[k] for r in l1] == pytest.approx([r[k] for r in l2], abs=tol), (mode, k)
        v1, v2 = lines(r1, "val"), lines(r2, "val")
        assert [r["step"] for r in v1] == [r["step"] for r in v2] == [0, 3]
        assert [r["val_ce"] for r in v1] == pytest.approx([r["val_ce"] for r in v2], abs=tol)
        acc = yaml.safe_load((r2 / "config.yaml").read_text())["accounting"]
        assert (acc["world_size"], acc["grad_accum"], acc["parallel"]) == (
            2, 8 // (2 * micro), mode)
        assert ("activation checkpointing" in (r2 / "train.log").read_text()) == ac
        for k in ("post_sampler.weight", "encoder.attn.wq.weight", "enc_readout.weight", "zeta"):
            if latent_bits:  # the FT's own modules went through FSDP or DDP and were trained
                assert not torch.equal(w2[k], init[k]), (mode, k)


# ---------------------------------------------------------------- tracking
def test_tensorboard_event_files_hold_the_scalars(tmp_path, ft_run):
    """TensorBoard under <run>/tb/, read back with EventAccumulator: loss, CE, KL in nats and
    bits, each bit's KL (summing to the KL), lr, grad norm, tokens/s, MFU from the plan's
    FLOPs/token and the configured peak, peak memory; on CPU without a peak figure no MFU."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    H = 4
    ea = EventAccumulator(str(ft_run / "tb"))
    ea.Reload()
    tags = set(ea.Tags()["scalars"])
    want = {"train/loss", "train/ce", "train/kl_nats", "train/kl_bits", "train/lr",
            "train/grad_norm", "perf/tokens_per_s", "perf/mfu", "memory/peak_rss_bytes",
            "val/val_ce", "val/val_kl_bits", *(f"train/kl_bit/{h}" for h in range(H))}
    assert want <= tags, want - tags
    ml = lines(ft_run, "train")
    fpt = plan(compose(FT), world_size=1).flops_per_token
    for k, mk in (("train/loss", "loss"), ("train/kl_nats", "kl_nats"),
                  ("train/kl_bits", "kl_bits"), ("train/grad_norm", "grad_norm"),
                  ("perf/tokens_per_s", "tokens_per_s")):
        ev = ea.Scalars(k)
        assert [e.step for e in ev] == [r["step"] for r in ml] == [1, 2, 3]
        assert [e.value for e in ev] == pytest.approx([r[mk] for r in ml], rel=1e-5)
    for i, r in enumerate(ml):
        bits = sum(ea.Scalars(f"train/kl_bit/{h}")[i].value for h in range(H))
        assert bits == pytest.approx(r["kl_nats"], rel=1e-4)
        assert r["kl_bits"] == pytest.approx(r["kl_nats"] / math.log(2))
        mfu = ea.Scalars("perf/mfu")[i].value
        assert mfu == pytest.approx(r["tokens_per_s"] * fpt / 0.5e12, rel=1e-5)
    assert all(e.value > 0 for e in ea.Scalars("memory/peak_rss_bytes"))

    # a baseline without a peak figure: no MFU (absent, never 0) and no per-bit KL
    run_b = T.train(compose([*BASE, "model.latent_bits=0", f"train.tokens={2 * 8 * 65}",
                             f"paths.results={tmp_path / 'b'}"]))
    eb = EventAccumulator(str(run_b / "tb"))
    eb.Reload()
    tb = set(eb.Tags()["scalars"])
    assert "perf/mfu" not in tb and "train/loss" in tb
    assert not any(t.startswith("train/kl_bit/") for t in tb)


# ---------------------------------------------------------------- GPU-only paths on this CPU
def test_bf16_autocast_on_cpu_trains_close_to_fp32(tmp_path, ft_run):
    """train.precision=bf16 (was refused: "needs CUDA") trains the FT, whose decoder is the
    baseline's plus the encoder and the mapper, with a finite loss close to fp32's
    (train.compile=true: tests/test_compile.py)."""
    bf16 = T.train(compose([*FT, "train.precision=bf16", f"paths.results={tmp_path}"]))
    a, b = ([r["loss"] for r in lines(r, "train")] for r in (ft_run, bf16))
    assert len(a) == len(b) == 3 and all(math.isfinite(x) for x in b)
    assert a != b  # bf16 really ran: the matmuls round differently
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 0.05 * max(a)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: make gpu-check runs")
def test_gpu_check_without_a_gpu_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    from pipelines import gpu_check

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpu_check.main(["--results", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "no CUDA device visible" in err
    assert not (tmp_path / "gpu_check").exists()  # nothing written


# ---------------------------------------------------------------- host syncs
def test_a_step_that_does_not_log_reads_no_tensor_on_the_host(tmp_path, monkeypatch):
    """Issue 45: no host sync per step. Every read of a tensor's value on the host (item,
    float, int, bool: aten._local_scalar_dense; tolist) during a real run, by the step it
    belongs to and the function that asked: steps that neither log nor validate nor save read
    nothing but the latent keys' hash of plain ints (SequenceKeys.for_batch, CPU tensors by
    construction). On CUDA each such read would wait for the GPU (dev/gpu/second_contact.sh
    confirms it there with torch.cuda.set_sync_debug_mode)."""
    import traceback

    from torch.utils._python_dispatch import TorchDispatchMode

    reads: list[tuple[int, str]] = []
    now = {"step": 0}

    def where() -> str:
        frames = [f for f in traceback.extract_stack()
                  if f.filename.startswith(str(ROOT))
                  and not any(d in f.filename for d in ("/tests/", "/.venv/"))]
        return f"{Path(frames[-1].filename).name}:{frames[-1].name}" if frames else "?"

    class Reads(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:
                reads.append((now["step"], where()))
            return func(*args, **(kwargs or {}))

    real_step, real_tolist = T.Trainer.train_step, torch.Tensor.tolist

    def step(self, fwd, s):
        now["step"] = s + 1  # the loop's bookkeeping after it belongs to step s + 1
        return real_step(self, fwd, s)

    def tolist(t):
        reads.append((now["step"], where()))
        return real_tolist(t)

    monkeypatch.setattr(T.Trainer, "train_step", step)
    monkeypatch.setattr(torch.Tensor, "tolist", tolist)
    cfg = compose([*BASE, "model.latent_bits=4", f"train.tokens={6 * 8 * 65}",
                   "logging.log_every=3", "logging.val_every=0", "logging.ckpt_every=100",
                   f"paths.results={tmp_path}"])
    with Reads():
        T.train(cfg)
    quiet = {s for s in range(1, 7)} - {3, 6}  # 3 logs; 6 logs, validates and saves
    hosts = {w for s, w in reads if s in quiet}
    assert hosts == {"free_transformer.py:_mix_int"}, hosts
    assert {w for s, w in reads if s == 3} - hosts  # the logging step does read (the probe works)
