"""Training entry point for both arms (one loop; `model.build_model` picks the architecture):
`train(cfg)` sets a run up and hands it to a `Trainer`, whose `train()` is the loop; the
`Checkpointer` (checkpointer.py) owns <run>/checkpoints and metrics.jsonl, plan.py the dry run
(sweeps/ plans runs without importing this module).

CLI: `python -m experiments.train key=value ...` or `make train OVERRIDES="..." [DRY=1]`.
Exit codes: 0 done (or already finished), 2 bad input or too little free space for the run's
checkpoints (`plan.start_refusal`; nothing written), 1 diverged (train.max_nonfinite_steps
non-finite steps in a row), 75 preempted by SIGTERM/SIGUSR1/SIGINT after a checkpoint (rerun
to resume). A run with final.pt is finished: train() returns at once unless train.force=true.
Determinism over layouts, no per-step host syncs, resume without repeated work: docs/DESIGN.md.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from common import arms
from common.errors import UsageError, cli
from common.gpus import no_silent_cpu
from common.io import LockHeld, flocked
from common.paths import FINAL_CHECKPOINT, RunDir
from common.provenance import git_state, versions
from experiments.corpus.tokenizer import tokenizer_ref, tokenizer_sha256
from model import build_model
from model.free_transformer import SequenceKeys

from . import parallel as par
from .checkpointer import EXPORT_DTYPES, Checkpointer, TrainState
from .config import (
    GENERATED_SOURCES,
    TrainConfig,
    compose,
    config_help,
    export_dtype,
    gpu_peak_tflops,
    trains_bf16,
)
from .plan import (
    RunPlan,
    chunked_loss,
    dry_parallel,
    dry_run,
    format_plan,
    plain,
    plan,
    run_dir,
    semantic,
    start_refusal,
    world,
)

EXIT_PREEMPTED = 75
LN2 = math.log(2.0)
VERSIONED = ("torch", "numpy", "tokenizers", "datasets", "hydra-core", "omegaconf",
             "freetransformer-bench")
"""Packages whose versions config.yaml records."""


class TrainingDiverged(RuntimeError):
    """K non-finite steps in a row; the message names the steps and the last good checkpoint."""


class Preempted(SystemExit):
    """SIGTERM/SIGUSR1 arrived: a checkpoint was written; rerun the same config to resume."""

    def __init__(self, step: int, checkpoint: Path) -> None:
        super().__init__(EXIT_PREEMPTED)
        self.step = step
        self.checkpoint = checkpoint


def peak_flops(device: torch.device, configured: float | None) -> float | None:
    """One device's peak FLOP/s: the configured figure, else a known GPU's, else None."""
    if configured:
        return configured * 1e12
    if device.type == "cuda":  # a known GPU's datasheet peak (config.GPU_PEAK_TFLOPS)
        peak, _ = gpu_peak_tflops(torch.cuda.get_device_name(device))
        return peak * 1e12 if peak else None
    return None


def process_group_backend(device: torch.device) -> str:
    """A CPU backend beside NCCL on GPUs: a collective on a CPU tensor has a backend too."""
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


def lr_factor(step: int, steps: int, warmup: int, min_ratio: float) -> float:
    """Linear warmup over `warmup` steps, then cosine from 1 to min_ratio at the last step."""
    if step < warmup:
        return (step + 1) / warmup
    span = max(1, steps - warmup)
    prog = min(1.0, (step - warmup) / span)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * prog))


class _Log:
    """train.log (append) + stdout on rank 0."""

    def __init__(self, path: Path | None) -> None:
        self.f = open(path, "a", encoding="utf-8") if path is not None else None

    def __call__(self, msg: str, echo: bool = True) -> None:
        stamp = datetime.now(timezone.utc).strftime("%H:%M:%S")
        if self.f is not None:
            self.f.write(f"[{stamp}] {msg}\n")
            self.f.flush()
        if echo:
            # through tqdm, so a line never lands in the middle of a live progress bar
            from tqdm import tqdm

            tqdm.write(msg, file=sys.stderr)

    def close(self) -> None:
        if self.f is not None:
            self.f.close()


def param_groups(model: torch.nn.Module, wd: float) -> list[dict[str, Any]]:
    """AdamW groups: weight decay `wd` on matrices, none on vectors (norms, zeta); a tied
    parameter once (Module.parameters() yields each parameter once)."""
    ps = list(model.parameters())
    return [{"params": [p for p in ps if p.dim() >= 2], "weight_decay": wd},
            {"params": [p for p in ps if p.dim() < 2], "weight_decay": 0.0}]


@torch.no_grad()
def evaluate(model: torch.nn.Module, corpus: Any, batch_size: int, kappa_bits: float,
             autocast: Any) -> dict[str, float]:
    """Validation on the fixed set. val_ce / val_bpb are honest: Z from the prior for the FT."""
    m = getattr(model, "module", model)
    was = m.training
    m.eval()
    free = arms.of_model(m.cfg.latent_bits).latent  # a Z to draw from the prior
    n_tok = 0
    nbytes = 0
    s_prior = s_post = s_kl = 0.0
    n_above = 0
    g = torch.Generator().manual_seed(12345)  # the same prior/posterior draws at every eval
    for x, y in corpus.val_batches(batch_size):
        x, y = x.to(m.device), y.to(m.device)
        k = y.numel()
        with autocast():
            # scores=True: the CE over chunks of tokens (model/readout.py), never the
            # (B, T, V) logits and their fp32 copy (34 GB at 16 x 4096 x 2^17)
            out = m(x, targets=y, z="prior" if free else None, generator=g, scores=True)
        s_prior += float(out.ce) * k
        nbytes += int(corpus.token_bytes[y.cpu()].sum())
        n_tok += k
        if free:
            with autocast():
                q = m(x, targets=y, z="posterior", generator=g, scores=True)
            s_post += float(q.ce) * k
            kl = q.kl_tokens.float()
            s_kl += float(kl.sum())
            n_above += int((kl > kappa_bits * LN2).sum())
    m.train(was)
    ce = s_prior / n_tok
    r = {"val_ce": ce, "val_bpb": s_prior / (LN2 * nbytes) if nbytes else None,
         "val_tokens": n_tok}
    if free:
        kl = s_kl / n_tok
        r.update({"val_ce_prior": ce, "val_ce_posterior": s_post / n_tok, "val_kl_nats": kl,
                  "val_kl_bits": kl / LN2, "val_elbo": s_post / n_tok + kl,
                  "frac_kl_above_kappa": n_above / n_tok})
    return r


# ====================================================================== setup
def _device(cfg: TrainConfig) -> torch.device:
    """train.device resolved; never the CPU in silence where GPUs are visible (common.gpus)."""
    d = cfg.train.device
    if d != "cpu":
        no_silent_cpu("train.device=cpu trains on the CPU anyway")
    if d == "cuda" or (d == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise UsageError("train.device=cuda but CUDA is not available; allowed: auto, cpu")
        return torch.device("cuda", device_index(int(os.environ.get("LOCAL_RANK", 0)),
                                                 torch.cuda.device_count()))
    return torch.device("cpu")


def device_index(local_rank: int, visible: int) -> int:
    """The CUDA ordinal of this process: LOCAL_RANK when it sees that many GPUs, 0 when it sees
    one (one GPU bound per task); any other count is ambiguous: UsageError, one line."""
    if 0 <= local_rank < visible:
        return local_rank
    if visible == 1:
        return 0
    raise UsageError(f"LOCAL_RANK={local_rank} but this process sees {visible} GPU(s) "
                      f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')});"
                      f" give each task all of its node's GPUs or exactly one")


def _corpus(cfg: TrainConfig, p: RunPlan | None = None) -> Any:
    from .data import build_corpus, check_epochs

    corpus = build_corpus(cfg.data, vocab_size=cfg.model.vocab_size, seq_len=cfg.train.seq_len,
                          seed=cfg.train.seed, cache_dir=cfg.paths.cache)
    if corpus.tokenizer.vocab_size != cfg.model.vocab_size:
        raise UsageError(f"model.vocab_size={cfg.model.vocab_size} but the tokenizer has "
                         f"{corpus.tokenizer.vocab_size} tokens (corpus too small for this "
                         f"vocabulary?); set model.vocab_size={corpus.tokenizer.vocab_size}")
    if p is not None and cfg.data.source not in GENERATED_SOURCES:  # passes: explicit
        ep = check_epochs(cfg.data, p.tokens // p.seq_len, p.seq_len,
                          corpus.info["train_tokens"])
        corpus.info.update(epochs=round(ep, 6), max_epochs=cfg.data.max_epochs)
    return corpus


@contextlib.contextmanager
def _signals_to_flag() -> Iterator[dict[str, Any]]:
    """Preemption (and Ctrl-C): the handler only sets a flag; the loop checks it after each
    optimizer step (and once before the first), writes a checkpoint there and raises Preempted."""
    stop: dict[str, Any] = {"sig": None}
    old = {}
    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):  # Ctrl-C checkpoints too
            old[s] = signal.signal(s, lambda sig, _f: stop.__setitem__("sig", sig))
    try:
        yield stop
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def _run_lock(rd: Path) -> Iterator[None]:
    """One trainer per run directory (a sweep relaunch must not race a live job); the kernel
    drops the flock when the holder dies, so kill -9 leaves no stale lock."""
    with ExitStack() as stack:
        try:
            stack.enter_context(flocked(RunDir(rd).lock_path, wait=False))
        except LockHeld:
            raise UsageError(f"run {rd.name} is being trained by another process "
                              f"({RunDir(rd).lock_path} is held)") from None
        yield


def _from_rank0(msg: str | None, n_world: int) -> str | None:
    """Rank 0's `msg` (a refusal, or None) on every rank (torch's object broadcast: over gloo,
    which the process group has on GPUs too)."""
    box = [msg]
    if n_world > 1:
        dist.broadcast_object_list(box, src=0)
    return box[0]


@contextlib.contextmanager
def _process_group(device: torch.device, n_world: int) -> Iterator[None]:
    if n_world > 1 and not dist.is_initialized():
        dist.init_process_group(process_group_backend(device))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:
        yield
    finally:
        if n_world > 1 and dist.is_initialized():
            dist.destroy_process_group()


# ====================================================================== train
class _Window:
    """Training throughput since the last train line; validation and checkpoints excluded."""

    def __init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        self.t, self.tokens = time.time(), 0

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        t_in = time.time()
        try:
            yield
        finally:
            self.t += time.time() - t_in

    def tokens_per_s(self) -> float:
        now = time.time()
        tps = self.tokens / max(now - self.t, 1e-9)
        self.t, self.tokens = now, 0
        return tps


class _DevicePeaks:
    """The CUDA caching allocator's peak of each phase on this rank (train steps, validation,
    saves: reset as a phase begins, read as it ends), which `make gpu-check RECIPE=..` sets
    beside experiments/memory.py's figures. Off CUDA it records nothing."""

    def __init__(self, device: torch.device) -> None:
        self.dev = device if device.type == "cuda" else None
        self.peaks: dict[str, dict[str, int]] = {}

    def note(self, phase: str) -> None:
        """Fold the peak since the last reset into `phase`'s, then reset."""
        if self.dev is None:
            return
        torch.cuda.synchronize(self.dev)
        old = self.peaks.get(phase, {"allocated": 0, "reserved": 0})
        self.peaks[phase] = {
            "allocated": max(old["allocated"], torch.cuda.max_memory_allocated(self.dev)),
            "reserved": max(old["reserved"], torch.cuda.max_memory_reserved(self.dev))}
        torch.cuda.reset_peak_memory_stats(self.dev)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Measure the block as phase `name` (the steps before it count as train)."""
        self.note("train")
        try:
            yield
        finally:
            self.note(name)

    def summary(self) -> dict[str, Any] | None:
        """{"cuda_peak_bytes": {phase: {allocated, reserved}}, "cuda_outside_torch_bytes":
        device memory torch's allocator does not hold}; None off CUDA."""
        if self.dev is None:
            return None
        free, total = torch.cuda.mem_get_info(self.dev)
        return {"cuda_peak_bytes": dict(self.peaks),
                "cuda_outside_torch_bytes": int(total - free
                                                - torch.cuda.memory_reserved(self.dev))}


class Trainer:
    """One training run on this process: model, optimizer and schedule (`state`), corpus and
    `checkpointer`; `train()` is the loop. Rank 0 writes; every rank computes."""

    def __init__(self, cfg: TrainConfig, p: RunPlan, corpus: Any, checkpointer: Checkpointer,
                 device: torch.device, rank: int, n_world: int, stop: dict[str, Any],
                 log: _Log) -> None:
        self.cfg, self.p, self.corpus, self.checkpointer = cfg, p, corpus, checkpointer
        self.device, self.rank, self.world, self.stop, self.log = device, rank, n_world, stop, log
        self.main = rank == 0
        self.mode = dry_parallel(cfg, p, torch.cuda.get_device_properties(device).total_memory
                                 if device.type == "cuda" else 0)  # the dry run's rule
        # parameters on the meta device (no rank builds the whole fp32 model in host memory),
        # materialised after sharding with today's init (par.materialize)
        self.model, init = par.build_on_meta(p.model, build_model)
        # the training CE over chunks of tokens where a micro-batch's logits exceed one chunk
        # (plan.chunked_loss): never the (mb, T, V) logits and their float32 copies at 2^17
        self.model.chunked_loss = chunked_loss(p.model, p.micro_batch_size, p.seq_len)
        # weights and state load in Checkpointer.resume, after sharding and the optimizer
        self.found = checkpointer.newest()
        if cfg.train.activation_checkpointing:
            par.checkpoint_blocks(self.model)
        if cfg.train.compile:  # per block, before DDP or FSDP2: their hooks stay eager
            par.compile_units(self.model)
        mesh = None
        if self.mode == "fsdp":  # in place: the optimizer sees the shards; HSDP across nodes
            mesh = par.shard(self.model, device, n_world, replicate=cfg.train.fsdp_replicas or None)
        torch.manual_seed(cfg.train.seed)  # the init of build_model(p.model) after this seed,
        par.materialize(self.model, init, device)  # one parameter at a time, FSDP: its shards
        log(f"parallel: {self.mode} over {n_world} process(es)"
            + (f" ({par.describe_mesh(mesh)})" if mesh is not None else "")
            + (", activation checkpointing" if cfg.train.activation_checkpointing else "")
            + (", chunked training loss" if self.model.chunked_loss else ""),
            echo=False)
        self.opt = torch.optim.AdamW(
            param_groups(self.model, cfg.optim.weight_decay), lr=cfg.optim.lr,
            betas=(cfg.optim.beta1, cfg.optim.beta2), eps=cfg.optim.eps,
            fused=device.type in ("cuda", "cpu"))  # fused kernels exist for CUDA and CPU
        sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: lr_factor(s, p.steps, p.warmup_steps, cfg.optim.min_lr_ratio))
        self.state = TrainState(cfg, p, checkpointer.rd.name, self.opt, sched, self.model,
                                self.mode)
        # bf16 autocast wherever torch has it (CUDA, and the CPU's own); auto = CUDA only
        self.use_bf16 = trains_bf16(cfg.train, device.type)
        self.metrics: Any = None
        self.window = _Window()
        self.device_peaks = _DevicePeaks(device)
        self.tracker: Any = None  # _Tracker on rank 0 (TensorBoard, maybe W&B / trackio)
        self.peak = peak_flops(device, cfg.logging.peak_tflops)
        # non-finite steps: (step, per-micro-batch flags, step flag) on the device until read
        self.pending: list[tuple[int, torch.Tensor, torch.Tensor]] = []
        self.bad_run: list[int] = []  # the current run of consecutive skipped steps
        self.nonfinite: list[list[Any]] = []  # [step, [micro-batch indices]] since the last line
        self.n_skipped = 0

    # ---------------------------------------------------------------- the loop
    def train(self) -> None:
        """Resume, then step -> maybe validate -> maybe checkpoint -> maybe preempt up to the
        budget; then the last validation, the final metrics line and final.pt."""
        cfg, p, ckpt = self.cfg, self.p, self.checkpointer
        found, self.found = self.found, None  # the weights are in the model already
        ckpt.resume(found, self.state)
        fwd = self.wrap()
        with ExitStack() as stack:
            if self.main:
                self.metrics = stack.enter_context(open(ckpt.metrics_path, "a",
                                                        encoding="utf-8"))
            bar = self.progress_bar(stack)
            if self.main:
                self.tracker = stack.enter_context(contextlib.closing(
                    _Tracker(ckpt.rd, cfg, self.p)))
            t0 = time.time()
            step = self.state.step
            ran_val = self.state.val_done
            if step < p.steps and self.val_due(step) and not ran_val:
                self.validate(step)  # step 0's, or one a preemption cut before its checkpoint
                ran_val = True
            if (sig := self.pending_signal()) is not None:  # during setup or that validation
                # the checkpoint records the finished validation: the next attempt trains
                ckpt.maybe_save(step, self.state, val_done=ran_val, force=True)
                self.preempt(sig, step)
            self.model.train()
            self.window.restart()
            while step < p.steps:
                last = self.train_step(fwd, step)  # device tensors: read on logging steps
                step += 1
                # log every log_every steps and at the last: a host sync per step would stall
                # the GPU, one per log_every is noise
                log_now = step % cfg.logging.log_every == 0 or step == p.steps
                # the skipped-step count lives on the device too: it is read where the loop
                # syncs anyway (logging, validation), so K bad steps stop the run that soon
                stop = (self.check_nonfinite() if log_now or self.val_due(step)
                        else None)  # K skipped steps in a row: diverged
                if log_now or stop is not None:
                    rec = self.read(last)  # the one host sync of these steps
                    tps = self.window.tokens_per_s()  # over the window: warm-up and pauses out
                    self.log_train(step, rec, tps, t0)  # metrics.jsonl + tracker, rank 0
                    if bar is not None:  # the bar shows only what was just read: no extra sync
                        loss = rec["loss"]
                        bar.set_postfix(loss="nan" if loss is None else f"{loss:.3f}",
                                        tok_s=f"{tps:,.0f}")
                if stop is not None:  # the line above says why; the exit code says diverged
                    raise TrainingDiverged(stop)
                if bar is not None:
                    bar.update(1)
                # every step, agreed by all ranks (one tiny all-reduce on gloo): SLURM's notice is
                # answered within a step, which sweeps/checks.py's grace check assumes
                sig = self.pending_signal()
                # validate before a checkpoint at the same step, so the checkpoint can say it
                # ran; a signal already pending skips it (the next attempt validates first)
                ran_val = sig is None and step < p.steps and self.val_due(step)
                if ran_val:  # every val_every steps: the honest (prior-Z) curve the report plots
                    self.validate(step)
                    sig = self.pending_signal()  # one that arrived during the validation
                if sig is not None:
                    self.check_nonfinite()  # skipped steps reach train.log before the exit
                # every ckpt_every steps (and the kept eval steps): the most work a crash or
                # a preemption can cost; the write is async, its time kept out of tokens/s
                # a preemption writes one whatever the step; the allocator's peak is read
                # only around a save that happens (two device syncs, not one every step)
                saving = sig is not None or ckpt.due(step)
                with self.window.paused(), (self.device_peaks.phase("save") if saving
                                            else contextlib.nullcontext()):
                    ckpt.maybe_save(step, self.state, val_done=ran_val, force=sig is not None)
                if sig is not None:  # exit 75 after the checkpoint: the launcher requeues
                    self.preempt(sig, step)
            self.validate(p.steps)  # truncation on resume removed any earlier val at this step
            wall = time.time() - t0
            # the final line's tokens and FLOPs are what the report's "equal tokens" and
            # "equal FLOPs" are checked on: written once, after the last validation
            self.emit({"kind": "final", "step": p.steps, "tokens": p.tokens_at(p.steps),
                       "flops": p.flops_at(p.steps), "wall_s": wall,
                       **(self.device_peaks.summary() or {})})  # CUDA: per-phase peaks
            ckpt.save_final(self.state)  # last: final.pt's presence marks the run finished
            self.log(f"finished {p.steps} steps in {wall:.1f}s -> {ckpt.final}", echo=self.main)

    # ---------------------------------------------------------------- its parts
    def wrap(self) -> torch.nn.Module:
        """The module the steps call: the model, DDP-wrapped under DDP. With train.compile its
        blocks were compiled one by one before DDP or sharding (__init__, par.compile_units)."""
        fwd: torch.nn.Module = self.model
        if self.mode == "ddp":
            fwd = par.ddp(fwd, self.device)
        if self.cfg.train.compile:  # inductor: CUDA, or a C++ compiler on the CPU
            self.log("compile: each block" + (" and the encoder block"
                                              if arms.of_model(self.p.model.latent_bits).latent
                                              else "") + ", before "
                     + {"ddp": "DDP", "fsdp": "sharding", "none": "training"}[self.mode]
                     + " (the data-parallel hooks outside the graphs)", echo=False)
        return fwd

    def progress_bar(self, stack: ExitStack) -> Any:
        """A tqdm bar on rank 0 with logging.progress, else None."""
        if not (self.main and self.cfg.logging.progress):
            return None
        from tqdm import tqdm

        return stack.enter_context(tqdm(total=self.p.steps, initial=self.state.step,
                                        unit="step", dynamic_ncols=True,
                                        desc=f"{self.p.arm} {self.checkpointer.rd.name}",
                                        file=sys.stderr))

    def autocast(self) -> Any:
        if self.use_bf16:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def emit(self, rec: dict[str, Any]) -> None:
        """One metrics.jsonl line (rank 0)."""
        if self.metrics is not None:
            from common.records import MetricsLine

            # the one place a metrics line is built (kind checked, order kept)
            self.metrics.write(json.dumps(MetricsLine.from_json(rec).to_json()) + "\n")
            self.metrics.flush()

    def validate(self, step: int) -> None:
        # train.compile: validation runs the blocks eager. Compiled, it would add a no-grad
        # graph per block variant (3 for the FT) at step 0, a graph per odd last-batch shape,
        # and bring the blocks' code object near dynamo's recompile limit (8); it is a small
        # share of a run's forwards (65,536 tokens per validation by default)
        eager = (torch.compiler.set_stance("force_eager") if self.cfg.train.compile
                 else contextlib.nullcontext())
        with self.window.paused(), self.device_peaks.phase("validation"), eager:
            if self.main or self.mode == "fsdp":  # under FSDP every rank takes part in gathers
                r = evaluate(self.model, self.corpus, self.cfg.logging.val_batch_size,
                             self.p.model.kappa_bits, self.autocast)
            if self.main:
                self.emit({"kind": "val", "step": step, "tokens": self.p.tokens_at(step),
                           "flops": self.p.flops_at(step), **r})
                if self.tracker is not None:
                    self.tracker.log({f"val/{k}": v for k, v in r.items()}, step)
                self.log(f"step {step}: val_ce {r['val_ce']:.4f} val_bpb {r['val_bpb']:.4f}"
                         + (f" (posterior ce {r['val_ce_posterior']:.4f}, kl "
                            f"{r['val_kl_bits']:.3f} bits)" if arms.arm(self.p.arm).latent else ""),
                         echo=False)
            if self.world > 1:
                dist.barrier()

    def val_due(self, step: int) -> bool:
        ve = self.cfg.logging.val_every
        return step == self.p.steps or step == 0 or (ve > 0 and step % ve == 0)

    def pending_signal(self) -> int | None:
        sig = self.stop["sig"]
        if self.world > 1:  # every rank stops at the same step: a CPU tensor, so the all-reduce
            # runs on the process group's CPU backend (gloo) and reading it never waits for the
            # GPU (a device flag read here was a host sync per step)
            flag = torch.tensor([0 if sig is None else int(sig)])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            sig = int(flag) or None
        return sig

    def preempt(self, sig: int, step: int) -> None:
        last = self.checkpointer.last_good
        assert last is not None
        self.log(f"signal {signal.Signals(sig).name} at step {step}: wrote "
                 f"{last.name}; exiting with code {EXIT_PREEMPTED} (rerun to resume)",
                 echo=self.main)
        raise Preempted(step, last)

    def train_step(self, fwd: torch.nn.Module, step: int) -> dict[str, torch.Tensor]:
        """One optimizer step (grad accumulation over micro-batches); the step's means as
        device tensors (no host sync). A non-finite loss or gradient norm skips the update:
        the fused AdamW's `found_inf` leaves weights, moments and its step count untouched."""
        cfg, p = self.cfg, self.p
        mb, accum = p.micro_batch_size, p.grad_accum
        dev = self.device
        sums = torch.zeros(3, dtype=torch.float64, device=dev)  # ce, kl, loss
        flags = torch.zeros(accum * self.world, device=dev)  # 1: that micro-batch non-finite
        bit_kl: torch.Tensor | None = None
        for a in range(accum):
            j = a * self.world + self.rank  # this micro-batch's index within the global batch
            x, y = self.corpus.train.get(step * cfg.train.batch_size + j * mb, mb)
            # a few KB of token ids: pinning them first was one more host copy for nothing
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            # latent draws keyed by (seed, step, sequence): the same whatever the layout
            keys = SequenceKeys.for_batch(cfg.train.seed, step, j * mb, mb, dev)
            # DDP/FSDP: reduce gradients only on the last micro-batch of the step
            with par.accumulate(fwd, self.mode, last=a == accum - 1):
                with self.autocast():
                    out = fwd(x, targets=y, generator=keys)
                    full = out.loss
                    loss = full / accum
                loss.backward()
            sums += torch.stack([out.ce.detach(), out.kl.detach(), full.detach()]).double()
            flags[j] = (~torch.isfinite(full.detach())).float()
            bk = getattr(self.model, "bit_kl", None)
            if bk is not None:
                bit_kl = bk.double() if bit_kl is None else bit_kl + bk.double()
        gn = par.as_tensor(torch.nn.utils.clip_grad_norm_(
            self.model.parameters(),
            cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else math.inf))
        bad = ((~torch.isfinite(gn)) | (flags.sum() > 0)).float().reshape(())
        if self.world > 1:  # every rank skips the same steps (a collective, not a host sync)
            dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        lr = self.opt.param_groups[0]["lr"]
        self.opt.found_inf = bad  # type: ignore[attr-defined]  # read by the fused AdamW
        self.opt.step()
        self.state.sched.step()  # the schedule follows the step count, skipped or not
        self.opt.zero_grad(set_to_none=True)
        self.pending.append((step, flags, bad))
        self.window.tokens += p.tokens_per_step
        r = {"sums": sums / accum, "grad_norm": gn.detach().double(),
             "lr": torch.tensor(lr, dtype=torch.float64)}
        if bit_kl is not None:
            r["bit_kl"] = bit_kl / accum
        return r

    def read(self, t: dict[str, torch.Tensor]) -> dict[str, Any]:
        """A step's device values as floats (None where non-finite), averaged over ranks."""
        vals = torch.cat([t["sums"], t.get("bit_kl", t["sums"][:0])])
        if self.world > 1:
            dist.all_reduce(vals)
            vals = vals / self.world
        v = vals.tolist()
        ce, kl, lossv = v[:3]
        rec: dict[str, Any] = {"ce": ce, "kl_nats": kl, "kl_bits": kl / LN2, "loss": lossv,
                               "lr": float(t["lr"]), "grad_norm": float(t["grad_norm"])}
        rec = {k: (x if math.isfinite(x) else None) for k, x in rec.items()}
        if "bit_kl" in t:
            rec["bit_kl_nats"] = [x if math.isfinite(x) else None for x in v[3:]]
        return rec

    def check_nonfinite(self) -> str | None:
        """Read the pending steps' non-finite flags (one collective + host sync) and record the
        skipped steps; the reason to stop after train.max_nonfinite_steps in a row, else None."""
        if not self.pending:
            return None
        steps = [s for s, _, _ in self.pending]
        flags = torch.stack([f for _, f, _ in self.pending])
        bad = torch.stack([b for _, _, b in self.pending])
        self.pending = []
        if self.world > 1:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        k = self.cfg.train.max_nonfinite_steps
        for s, f, b in zip(steps, flags.tolist(), bad.tolist(), strict=True):
            if not b:
                self.bad_run = []
                continue
            micro = [j for j, x in enumerate(f) if x]
            self.nonfinite.append([s + 1, micro])  # the step number a train line would carry
            self.n_skipped += 1
            self.bad_run.append(s + 1)
            self.log(f"step {s + 1}: non-finite loss or gradient (micro-batches "
                     f"{micro or 'none: gradient norm'}, sequences from "
                     f"{s * self.cfg.train.batch_size}); skipped, no update", echo=self.main)
            if len(self.bad_run) >= k:
                last = self.checkpointer.last_good
                return (f"{k} non-finite steps in a row (steps {self.bad_run[0]}-"
                        f"{self.bad_run[-1]}, all skipped without updating); stopped; last good "
                        f"checkpoint: {last if last else 'none'}")
        return None

    def log_train(self, step: int, rec: dict[str, Any], tps: float, t0: float) -> None:
        """The train line of metrics.jsonl and the tracker's scalars (rank 0)."""
        p = self.p
        extra: dict[str, Any] = {}
        if self.nonfinite:
            extra = {"nonfinite_steps": self.nonfinite, "skipped_steps": self.n_skipped}
            self.nonfinite = []
        line = {k: v for k, v in rec.items() if k != "bit_kl_nats"}
        self.emit({"kind": "train", "step": step, "tokens": p.tokens_at(step),
                   "flops": p.flops_at(step), **line, "tokens_per_s": tps,
                   "time": self.window.t - t0, **extra})
        if self.tracker is None:
            return
        sc: dict[str, float | None] = {f"train/{k}": v for k, v in line.items()}
        for h, v in enumerate(rec.get("bit_kl_nats", [])):
            sc[f"train/kl_bit/{h}"] = v
        sc["perf/tokens_per_s"] = tps
        if self.peak is not None:  # unknown peak: no MFU at all, never 0
            sc["perf/mfu"] = tps * p.flops_per_token / (self.peak * self.world)
        sc["perf/skipped_steps"] = float(self.n_skipped)
        if self.device.type == "cuda":
            sc["memory/peak_allocated_bytes"] = float(torch.cuda.max_memory_allocated(
                self.device))
            sc["memory/peak_reserved_bytes"] = float(torch.cuda.max_memory_reserved(
                self.device))
        else:
            from common.provenance import peak_rss_mb

            # VmHWM: this process's own peak (ru_maxrss would carry a sweep driver's RSS
            # across fork + exec)
            mb = peak_rss_mb()
            if mb is not None:
                sc["memory/peak_rss_bytes"] = float(mb * (1 << 20))
        self.tracker.log(sc, step)


class _Tracker:
    """TensorBoard event files under <run>/tb/ always (offline); W&B or trackio beside them when
    logging.tracker asks. Non-finite or missing values are not logged (never a fake 0)."""

    def __init__(self, rd: Path, cfg: TrainConfig, p: RunPlan) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.tb = SummaryWriter(str(RunDir(rd).tensorboard_dir))
        self.ext: Any = None
        if cfg.logging.tracker != "none":
            import importlib

            mod = importlib.import_module(cfg.logging.tracker)  # checked at setup: present
            self.ext = mod
            mod.init(project=cfg.logging.tracker_project, name=rd.name,
                     config={"run_id": rd.name, "arm": p.arm, **semantic(cfg)})

    def log(self, scalars: dict[str, Any], step: int) -> None:
        ok = {k: float(v) for k, v in scalars.items()
              if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
        for k, v in ok.items():
            self.tb.add_scalar(k, v, step)
        self.tb.flush()
        if self.ext is not None:
            self.ext.log(ok, step=step)

    def close(self) -> None:
        self.tb.close()
        if self.ext is not None:
            self.ext.finish()


def check_tracker(cfg: TrainConfig) -> None:
    """logging.tracker names an installed package, or UsageError (before anything is
    written)."""
    import importlib.util

    t = cfg.logging.tracker
    if t != "none" and importlib.util.find_spec(t) is None:
        raise UsageError(f"logging.tracker={t} but the {t} package is not installed; "
                          f"install it or set logging.tracker=none (TensorBoard is always on)")


def train(cfg: TrainConfig, argv: list[str] | None = None) -> Path:
    """Train `cfg` to its budget, resuming from the newest complete checkpoint; return the run
    dir. A finished run (final.pt present) returns at once unless train.force=true."""
    rank, n_world = world()
    main = rank == 0
    if cfg.train.dry_run:
        dry_run(cfg)  # plan.py: the plan and its estimates, nothing trained
        return run_dir(cfg)
    p = plan(cfg, n_world)
    rd = run_dir(cfg)
    device = _device(cfg)
    with ExitStack() as stack:
        stop = stack.enter_context(_signals_to_flag())
        if RunDir(rd).finished and not cfg.train.force:
            if main:
                print(f"run {rd.name} is finished ({RunDir(rd).final_checkpoint}); "
                      f"train.force=true retrains", file=sys.stderr)
            return rd
        check_tracker(cfg)
        stack.enter_context(_process_group(device, n_world))
        # room for the run's checkpoints, before anything is written (a corpus build included):
        # rank 0 decides, so every rank exits alike
        refusal = _from_rank0(start_refusal(cfg, p, rd) if main else None, n_world)
        if refusal is not None:
            raise UsageError(refusal)
        corpus = _corpus(cfg, p)  # everything that can fail on bad input: before the run dir exists
        if main:
            stack.enter_context(_run_lock(rd))  # creates the run dir

        # ---- setup
        log = stack.enter_context(contextlib.closing(_Log(RunDir(rd).log_path if main
                                                          else None)))
        export = export_dtype(cfg, device.type)  # of final.pt and eval_step_<N>.pt
        checkpointer = Checkpointer(
            rd, cfg, p, main=main, world=n_world, log=log,
            tokenizer=tokenizer_ref(corpus.tokenizer, corpus.tokenizer.name),
            export_dtype=EXPORT_DTYPES[export])
        checkpointer.prepare(fresh=cfg.train.force)
        if main and cfg.train.force:
            RunDir(rd).record_path.unlink(missing_ok=True)  # new provenance for the new run
        if n_world > 1:
            dist.barrier()
        log(f"argv: {' '.join(argv if argv is not None else sys.argv)}", echo=False)
        log(format_plan(cfg, p), echo=main)
        log(f"exports ({FINAL_CHECKPOINT}, eval_step_<N>.pt): {export} weights "
            f"(logging.export_dtype={cfg.logging.export_dtype})", echo=False)
        trainer = Trainer(cfg, p, corpus, checkpointer, device, rank, n_world, stop, log)
        if main:
            _write_config(cfg, p, corpus, rd, argv, trainer.mode, export)

        # ---- the loop
        try:
            trainer.train()
        except TrainingDiverged as e:
            log(str(e), echo=main)
            raise
        finally:  # an async checkpoint in flight completes before the process group goes
            checkpointer.close()
    return rd


def _write_config(cfg: TrainConfig, p: RunPlan, corpus: Any, rd: Path,
                  argv: list[str] | None, parallel: str = "none",
                  export: str | None = None) -> None:
    run = RunDir(rd)
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    if run.has_record:  # a resume keeps the first provenance; record the restart in the log only
        return
    from common.records import RunRecord

    commit, dirty = git_state()
    sem = semantic(cfg)
    doc = RunRecord(
        run_id=rd.name, arm=p.arm,
        model={**asdict(p.model), "preset": cfg.model.preset},
        data=sem["data"], optim=sem["optim"], train=plain(asdict(cfg.train)),
        accounting={"params": p.params, "flops_per_token": p.flops_per_token,
                    "flops_per_token_baseline_part": p.flops_per_token_baseline_part,
                    "flops_overhead": p.flops_per_token / p.flops_per_token_baseline_part - 1.0,
                    "steps": p.steps, "tokens": p.tokens, "flops": p.flops,
                    "budget_flops": p.budget_flops, "tokens_per_step": p.tokens_per_step,
                    "micro_batch_size": p.micro_batch_size, "grad_accum": p.grad_accum,
                    "world_size": p.world_size, "warmup_steps": p.warmup_steps,
                    "parallel": parallel},
        provenance={"git_commit": commit, "git_dirty": dirty,
                    "argv": list(argv if argv is not None else sys.argv), "created": created,
                    "versions": versions(*VERSIONED), "data_checksums": corpus.checksums,
                    "tokenizer_sha256": tokenizer_sha256(corpus.tokenizer),
                    # wall-clock is comparable only between runs with the same three
                    "host": socket.gethostname(), "threads": torch.get_num_threads(),
                    "launcher": os.environ.get("FTBENCH_LAUNCHER", "direct")},
        # export_dtype: logging.export_dtype resolved (the exports' dtype; auto is in logging)
        extra={"logging": plain(asdict(cfg.logging)), "export_dtype": export,
               "corpus": corpus.info})
    run.write_record(doc)


# ====================================================================== CLI
def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    return cli("train", lambda: _main(args),
               "re-run the same command to resume from its last checkpoint")


def _main(args: list[str]) -> int:
    if args and args[0] in ("-h", "--help"):  # the keys first, one usage line above them
        try:
            print(config_help(), flush=True)
        except BrokenPipeError:  # `make train HELP=1 | head`: the reader left, no traceback
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    cfg = compose(args)
    if not cfg.train.dry_run:  # every place a run writes, before any work: one line
        from common.io import unwritable

        for what, d in (("run", run_dir(cfg)), ("cache", Path(cfg.paths.cache))):
            if (why := unwritable(d)) is not None:
                raise UsageError(f"{what} directory {d}: {why}; set FTBENCH_RESULTS (and "
                                 "FTBENCH_CACHE) to a writable directory")
    try:
        train(cfg, argv=[sys.argv[0], *args])
    except TrainingDiverged as e:
        print(f"train: error: {e}", file=sys.stderr)
        return 1
    except Preempted as e:
        return int(e.code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
