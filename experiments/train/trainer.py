"""Training entry point for both arms (one loop; `model.build_model` picks the architecture).

The config (`experiments.train.config.compose`, `ConfigError`) and the plan
(`experiments.train.plan`: `RunPlan`, `run_id`, `run_dir`) live apart, so sweeps/ plans runs
without importing this module.

    train(cfg: TrainConfig) -> Path                  # train / resume / return if finished
    Preempted(SystemExit)                            # SIGTERM/USR1/INT: checkpoint, code 75
    TrainingDiverged(RuntimeError)                   # NaN/Inf loss; the last good checkpoint stays

CLI: `python -m experiments.train key=value ...` or `make train ARGS="..." [DRY=1]`, e.g.
    model=16M model.latent_bits=16 model.kappa_bits=0.5 train.tokens=5e6 train.seed=1
Exit codes: 0 done (or already finished), 2 bad input (nothing written), 1 diverged (NaN/Inf),
75 preempted by SIGTERM/SIGUSR1/SIGINT after writing a checkpoint (EX_TEMPFAIL: rerun to resume).

Run directory <paths.results>/runs/<run-id>/ (paths.results = $FTBENCH_RESULTS or results/):
config.yaml, metrics.jsonl, train.log (starts with argv), checkpoints/step_<N>.pt and final.pt.
A run with final.pt is finished: train() returns at once unless train.force=true.

Determinism: the initialisation, the data order and the latent samples are functions of
train.seed (each micro-batch draws its Z from a generator seeded by (seed, step, micro-batch)),
so a resumed run, and a DDP or FSDP run with the same global batch, reproduce an uninterrupted
single-process run. Several processes: `torchrun --nproc_per_node N -m experiments.train ...`
(gloo on CPU, nccl on GPUs) with train.parallel=ddp|fsdp|auto (experiments/train/parallel.py).

Resume never repeats finished work: a validation due at a checkpoint's step runs before that
checkpoint is written, and the checkpoint records it (`val_done`), so a job preempted again and
again in a short slot still advances.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
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

import numpy as np
import torch
import torch.distributed as dist
import yaml

from common.io import LockHeld, atomic_write_text, flocked
from common.paths import checkpoint_name, step_checkpoints
from common.provenance import git_state, versions
from model import build_model, save_checkpoint
from model.checkpoint import CheckpointError, read_checkpoint

from . import parallel as par
from .config import ConfigError, TrainConfig, compose, config_help, one_line
from .plan import (
    RunPlan,
    dry_parallel,
    format_estimate,
    format_plan,
    plain,
    plan,
    run_dir,
    semantic,
    world,
)
from .tokenizer import tokenizer_ref, tokenizer_sha256

EXIT_PREEMPTED = 75
LN2 = math.log(2.0)
VERSIONED = ("torch", "numpy", "tokenizers", "datasets", "hydra-core", "omegaconf",
             "freetransformer-bench")
"""Packages whose versions config.yaml records."""


class TrainingDiverged(RuntimeError):
    """A non-finite loss or gradient; the message names the step and the last good checkpoint."""


class Preempted(SystemExit):
    """SIGTERM/SIGUSR1 arrived: a checkpoint was written; rerun the same config to resume."""

    def __init__(self, step: int, checkpoint: Path) -> None:
        super().__init__(EXIT_PREEMPTED)
        self.step = step
        self.checkpoint = checkpoint


# ====================================================================== state
class TrainState:
    """What a checkpoint restores beyond the weights: the step, the optimizer, the LR schedule,
    the data position and every RNG. Stored under a checkpoint's `extra` (docs/RESULTS.md)."""

    def __init__(self, cfg: TrainConfig, p: RunPlan, run_id: str,
                 opt: torch.optim.Optimizer, sched: Any) -> None:
        self.cfg, self.plan, self.run_id = cfg, p, run_id
        self.opt, self.sched = opt, sched
        self.step = 0
        self.val_done = False
        """The validation due at `step` finished before this state's checkpoint was written."""

    def state_dict(self, optimizer: dict[str, Any] | None = None,
                   optimizer_format: str = "ids") -> dict[str, Any]:
        """`optimizer`: a state gathered elsewhere (FSDP: keyed by parameter name, "fqn")."""
        return {"step": self.step, "val_done": self.val_done,
                "optimizer": self.opt.state_dict() if optimizer is None else optimizer,
                "optimizer_format": optimizer_format,
                "scheduler": self.sched.state_dict(),
                "data": {"samples": self.step * self.cfg.train.batch_size,
                         "seed": self.cfg.train.seed},
                "rng": _rng_state(), "run_id": self.run_id,
                "tokens": self.plan.tokens_at(self.step), "flops": self.plan.flops_at(self.step)}

    def load_state_dict(self, sd: dict[str, Any], model: torch.nn.Module | None = None,
                        mode: str = "none") -> None:
        step = int(sd["step"])
        if sd["data"]["samples"] != step * self.cfg.train.batch_size:
            raise ValueError("data position does not match its step")
        if model is None:
            self.opt.load_state_dict(sd["optimizer"])
        else:  # whatever mode and world size wrote it
            par.load_optimizer(model, self.opt, sd["optimizer"],
                               sd.get("optimizer_format", "ids"), mode)
        self.sched.load_state_dict(sd["scheduler"])
        _set_rng_state(sd["rng"])
        self.step = step
        self.val_done = bool(sd.get("val_done", False))


def _rng_state() -> dict[str, Any]:
    # torch.load(weights_only=True) takes tensors and plain containers only: numpy's and
    # python's states are stored as lists of ints.
    npst = np.random.get_state()
    pyst = random.getstate()
    return {"torch": torch.get_rng_state(),
            "numpy": [npst[0], npst[1].tolist(), int(npst[2]), int(npst[3]), float(npst[4])],
            "python": [pyst[0], list(pyst[1]), pyst[2]],
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def _set_rng_state(st: dict[str, Any]) -> None:
    torch.set_rng_state(st["torch"])
    n = st["numpy"]
    np.random.set_state((n[0], np.asarray(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    p = st["python"]
    random.setstate((p[0], tuple(p[1]), p[2]))
    if st.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def _z_generator(seed: int, step: int, micro: int) -> torch.Generator:
    """Latent samples of micro-batch `micro` of step `step`: independent of process layout."""
    return torch.Generator().manual_seed((seed * 1_000_003 + step) * 4099 + micro)


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


def _newest_checkpoint(ckdir: Path, log: _Log) -> tuple[dict, Path] | None:
    for step, p in reversed(step_checkpoints(ckdir)):
        try:
            payload = read_checkpoint(p)
        except CheckpointError as e:
            log(f"skipping unreadable checkpoint {p.name}: {e}")
            continue
        if payload.get("extra", {}).get("step") == step:
            return payload, p
    return None


def _truncate_metrics(path: Path, step: int, val_done: bool = False) -> None:
    """Keep what an uninterrupted run had written when its checkpoint at `step` was taken:
    train lines up to `step`, val lines before it, and the val line at `step` when the
    checkpoint says that validation had finished before it was written (`val_done`)."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by kill -9
        if (r.get("kind") == "train" and r["step"] <= step) or (
                r.get("kind") == "val" and (r["step"] < step or (val_done and r["step"] == step))):
            keep.append(line)
    atomic_write_text(path, "".join(x + "\n" for x in keep))


def _param_groups(model: torch.nn.Module, wd: float) -> list[dict[str, Any]]:
    decay, no_decay = [], []
    seen: set[int] = set()
    for p in model.parameters():
        if id(p) in seen or not p.requires_grad:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else no_decay).append(p)  # norms and zeta are not decayed
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


@torch.no_grad()
def evaluate(model: torch.nn.Module, corpus: Any, batch_size: int, kappa_bits: float,
             autocast: Any) -> dict[str, float]:
    """Validation on the fixed set. val_ce / val_bpb are honest: Z from the prior for the FT."""
    m = getattr(model, "module", model)
    was = m.training
    m.eval()
    free = m.cfg.is_free
    n_tok = 0
    nbytes = 0
    s_prior = s_post = s_kl = 0.0
    n_above = 0
    g = torch.Generator().manual_seed(12345)  # the same prior/posterior draws at every eval
    for x, y in corpus.val_batches(batch_size):
        x, y = x.to(m.device), y.to(m.device)
        k = y.numel()
        with autocast():
            out = m(x, targets=y, z="prior" if free else None, generator=g)
        s_prior += float(out.ce) * k
        nbytes += int(corpus.token_bytes[y.cpu()].sum())
        n_tok += k
        if free:
            with autocast():
                q = m(x, targets=y, z="posterior", generator=g)
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
    d = cfg.train.device
    if d == "cuda" or (d == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ConfigError("train.device=cuda but CUDA is not available; allowed: auto, cpu")
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def _corpus(cfg: TrainConfig, p: RunPlan | None = None) -> Any:
    from .data import DataError, build_corpus, check_epochs

    try:
        corpus = build_corpus(cfg.data, vocab_size=cfg.model.vocab_size, seq_len=cfg.train.seq_len,
                              seed=cfg.train.seed, cache_dir=cfg.paths.cache)
    except DataError as e:
        raise ConfigError(one_line(str(e))) from None
    if corpus.tokenizer.vocab_size != cfg.model.vocab_size:
        raise ConfigError(f"model.vocab_size={cfg.model.vocab_size} but the tokenizer has "
                          f"{corpus.tokenizer.vocab_size} tokens (corpus too small for this "
                          f"vocabulary?); set model.vocab_size={corpus.tokenizer.vocab_size}")
    if p is not None and cfg.data.source != "synthetic":  # passes over the corpus: explicit
        try:
            ep = check_epochs(cfg.data, p.tokens // p.seq_len, p.seq_len,
                              corpus.info["train_tokens"])
        except DataError as e:
            raise ConfigError(one_line(str(e))) from None
        corpus.info.update(epochs=round(ep, 6), max_epochs=cfg.data.max_epochs)
    return corpus


def _epochs_line(cfg: TrainConfig, p: RunPlan) -> str:
    """The dry run's passes over the corpus (refused beyond data.max_epochs when it is built)."""
    from .data import DataError, built_manifest, check_epochs

    if cfg.data.source == "synthetic":
        return "epochs      n/a (synthetic: every sample is drawn fresh)"
    try:
        man = built_manifest(cfg.data, cfg.model.vocab_size, cfg.paths.cache)
        if man is None:
            return ("epochs      unknown until the corpus is built (make corpus, or the run's "
                    "start); checked then against data.max_epochs")
        n = man["tokens"]["train"]
        ep = check_epochs(cfg.data, p.tokens // p.seq_len, p.seq_len, n)
    except DataError as e:
        raise ConfigError(one_line(str(e))) from None
    return (f"epochs      {ep:.4g} passes over the corpus ({n:,} training tokens; "
            f"data.max_epochs={cfg.data.max_epochs:g})")


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
            stack.enter_context(flocked(rd / ".lock", wait=False))
        except LockHeld:
            raise ConfigError(f"run {rd.name} is being trained by another process "
                              f"({rd / '.lock'} is held)") from None
        yield


@contextlib.contextmanager
def _process_group(device: torch.device, n_world: int) -> Iterator[None]:
    if n_world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:
        yield
    finally:
        if n_world > 1 and dist.is_initialized():
            dist.destroy_process_group()


# ====================================================================== train
class _Loop:
    """The pieces of one training run the loop in `train()` calls: a step, a validation, a
    checkpoint, a metrics line. Rank 0 writes; every rank computes."""

    def __init__(self, cfg: TrainConfig, p: RunPlan, corpus: Any, rd: Path,
                 device: torch.device, rank: int, n_world: int, stop: dict[str, Any],
                 log: _Log) -> None:
        self.cfg, self.p, self.corpus, self.rd = cfg, p, corpus, rd
        self.device, self.rank, self.world, self.stop, self.log = device, rank, n_world, stop, log
        self.main = rank == 0
        self.ckdir = rd / "checkpoints"
        self.tok_ref = tokenizer_ref(corpus.tokenizer, corpus.tokenizer.name)
        self.mode = par.resolve(str(cfg.train.parallel), n_world, device, p.params["total"])
        torch.manual_seed(cfg.train.seed)
        self.model = build_model(p.model).to(device)
        # full weights load before any sharding; the rest of the state after the optimizer
        self.found = _newest_checkpoint(self.ckdir, log)
        if self.found is not None:
            self.model.load_state_dict(self.found[0]["model"])
        if cfg.train.activation_checkpointing:
            par.checkpoint_blocks(self.model)
        if self.mode == "fsdp":
            par.shard(self.model, device, n_world)  # in place: the optimizer sees the shards
        log(f"parallel: {self.mode} over {n_world} process(es)"
            + (", activation checkpointing" if cfg.train.activation_checkpointing else ""),
            echo=False)
        self.opt = torch.optim.AdamW(
            _param_groups(self.model, cfg.optim.weight_decay), lr=cfg.optim.lr,
            betas=(cfg.optim.beta1, cfg.optim.beta2), eps=cfg.optim.eps,
            fused=device.type in ("cuda", "cpu"))  # fused kernels exist for CUDA and CPU
        sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: lr_factor(s, p.steps, p.warmup_steps, cfg.optim.min_lr_ratio))
        self.state = TrainState(cfg, p, rd.name, self.opt, sched)
        # bf16 autocast wherever torch has it (CUDA, and the CPU's own); auto = CUDA only
        self.use_bf16 = cfg.train.precision == "bf16" or (
            cfg.train.precision == "auto" and device.type == "cuda")
        self.metrics: Any = None
        self.last_good: Path | None = None
        self.t_window, self.tok_window = time.time(), 0  # tokens/s; val and checkpoints excluded

    def autocast(self) -> Any:
        if self.use_bf16:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def resume(self) -> None:
        metrics_path = self.rd / "metrics.jsonl"
        found, self.found = self.found, None  # the weights are in the model already
        if found is not None:
            payload, path = found
            try:
                self.state.load_state_dict(payload["extra"], self.model, self.mode)
            except ValueError as e:
                raise ConfigError(f"{path}: {e}") from None
            self.log(f"resumed from {path.name} (step {self.state.step}/{self.p.steps}"
                     + (", its validation done" if self.state.val_done else "") + ")",
                     echo=self.main)
            if self.main:
                _truncate_metrics(metrics_path, self.state.step, self.state.val_done)
                if not (self.ckdir / f"eval_step_{self.state.step}.pt").exists():
                    self.keep_for_eval(self.state.step, path)  # killed before its link
        elif self.main:
            metrics_path.unlink(missing_ok=True)
        found_steps = step_checkpoints(self.ckdir)
        self.last_good = found_steps[-1][1] if found_steps else None

    def wrap(self) -> torch.nn.Module:
        fwd: torch.nn.Module = self.model
        if self.cfg.train.compile:  # inductor: CUDA, or C++ on the CPU
            fwd = torch.compile(self.model)  # type: ignore[assignment]
        if self.mode == "ddp":
            fwd = par.ddp(fwd, self.device)
        return fwd

    def emit(self, rec: dict[str, Any]) -> None:
        if self.metrics is not None:
            self.metrics.write(json.dumps(rec) + "\n")
            self.metrics.flush()

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def eval_steps(self) -> set[int]:
        """Steps of logging.keep_eval_checkpoints=n: n evenly spaced by tokens, the last one
        the final step (every step has the same tokens, so even in steps is even in tokens)."""
        n = self.cfg.logging.keep_eval_checkpoints
        return {math.ceil(k * self.p.steps / n) for k in range(1, n + 1)} if n else set()

    def keep_for_eval(self, step: int, path: Path) -> None:
        """eval_step_<N>.pt: a hard link (a copy where links fail) outside the rotation."""
        if not self.main or step not in self.eval_steps():
            return
        dst = self.ckdir / f"eval_step_{step}.pt"
        tmp = dst.with_name(f".{dst.name}.tmp")
        tmp.unlink(missing_ok=True)
        try:
            os.link(path, tmp)
        except OSError:
            shutil.copyfile(path, tmp)
        os.replace(tmp, dst)

    def save(self, step: int, name: str | None = None, val_done: bool = False) -> Path:
        t_in = time.time()
        path = self.ckdir / (name or checkpoint_name(step))
        # FSDP: gathering the full state is a collective, so every rank takes part
        weights, optim, optim_format = par.gather_state(self.model, self.opt, self.mode)
        if self.main:
            self.state.step, self.state.val_done = step, val_done
            save_checkpoint(path, self.model, tokenizer=self.tok_ref,
                            extra=self.state.state_dict(optim, optim_format), state_dict=weights)
            if name is not None or step != self.p.steps:  # the last step's is final.pt's
                self.keep_for_eval(step, path)
            if name is None:
                for _, old in step_checkpoints(self.ckdir)[:-self.cfg.logging.keep_checkpoints]:
                    old.unlink(missing_ok=True)
        self.barrier()
        self.t_window += time.time() - t_in
        return path

    def validate(self, step: int) -> None:
        t_in = time.time()
        if self.main or self.mode == "fsdp":  # under FSDP every rank takes part in all-gathers
            r = evaluate(self.model, self.corpus, self.cfg.logging.val_batch_size,
                         self.p.model.kappa_bits, self.autocast)
        if self.main:
            self.emit({"kind": "val", "step": step, "tokens": self.p.tokens_at(step),
                       "flops": self.p.flops_at(step), **r})
            self.log(f"step {step}: val_ce {r['val_ce']:.4f} val_bpb {r['val_bpb']:.4f}"
                     + (f" (posterior ce {r['val_ce_posterior']:.4f}, kl "
                        f"{r['val_kl_bits']:.3f} bits)" if self.p.model.is_free else ""),
                     echo=False)
        self.barrier()
        self.t_window += time.time() - t_in

    def val_due(self, step: int) -> bool:
        ve = self.cfg.logging.val_every
        return step == self.p.steps or step == 0 or (ve > 0 and step % ve == 0)

    def pending_signal(self) -> int | None:
        sig = self.stop["sig"]
        if self.world > 1:  # every rank stops at the same step
            flag = torch.tensor([0 if sig is None else int(sig)])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            sig = int(flag) or None
        return sig

    def preempt(self, sig: int, step: int) -> None:
        assert self.last_good is not None
        self.log(f"signal {signal.Signals(sig).name} at step {step}: wrote "
                 f"{self.last_good.name}; exiting with code {EXIT_PREEMPTED} (rerun to resume)",
                 echo=self.main)
        raise Preempted(step, self.last_good)

    def train_step(self, fwd: torch.nn.Module, step: int) -> dict[str, float]:
        """One optimizer step (grad accumulation over micro-batches); the step's means."""
        cfg, p = self.cfg, self.p
        mb, accum = p.micro_batch_size, p.grad_accum
        ce_sum = kl_sum = loss_sum = 0.0
        for a in range(accum):
            j = a * self.world + self.rank  # this micro-batch's index within the global batch
            x, y = self.corpus.train.get(step * cfg.train.batch_size + j * mb, mb)
            x, y = x.to(self.device), y.to(self.device)
            # DDP/FSDP: reduce gradients only on the last micro-batch of the step
            with par.accumulate(fwd, self.mode, last=a == accum - 1):
                with self.autocast():
                    out = fwd(x, targets=y, generator=_z_generator(cfg.train.seed, step, j))
                    loss = out.loss / accum
                loss.backward()
            ce_sum += out.ce.detach().item()
            kl_sum += out.kl.detach().item()
            loss_sum += out.loss.detach().item()
        vals = torch.tensor([ce_sum, kl_sum, loss_sum], dtype=torch.float64)
        if self.world > 1:
            dist.all_reduce(vals)
        ce, kl, lossv = (vals / (accum * self.world)).tolist()
        gn = torch.nn.utils.clip_grad_norm_(
            self.model.parameters(),
            cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else math.inf)
        gnv = par.as_float(gn)  # a DTensor under FSDP
        if not (math.isfinite(lossv) and math.isfinite(gnv)):
            what = "loss" if not math.isfinite(lossv) else "gradient norm"
            raise TrainingDiverged(
                f"non-finite {what} ({lossv if what == 'loss' else gnv}) at step {step + 1}; "
                f"stopped without updating; last good checkpoint: "
                f"{self.last_good if self.last_good else 'none'}")
        lr = self.opt.param_groups[0]["lr"]
        self.opt.step()
        self.state.sched.step()
        self.opt.zero_grad(set_to_none=True)
        self.tok_window += p.tokens_per_step
        return {"ce": ce, "kl_nats": kl, "kl_bits": kl / LN2, "loss": lossv, "lr": lr,
                "grad_norm": gnv}

    def window_tokens_per_s(self) -> float:
        now = time.time()
        tps = self.tok_window / max(now - self.t_window, 1e-9)
        self.t_window, self.tok_window = now, 0
        return tps


def train(cfg: TrainConfig, argv: list[str] | None = None) -> Path:
    """Train `cfg` to its budget, resuming from the newest complete checkpoint; return the run
    dir. A finished run (final.pt present) returns at once unless train.force=true."""
    rank, n_world = world()
    main = rank == 0
    if cfg.train.dry_run and cfg.train.plan_world_size:
        n_world = cfg.train.plan_world_size
    p = plan(cfg, n_world)
    rd = run_dir(cfg)
    if cfg.train.dry_run:
        if main:
            print(format_plan(cfg, p), flush=True)
            print(_epochs_line(cfg, p), flush=True)
            print(_dry_estimate(cfg, p), flush=True)
        return rd
    device = _device(cfg)
    ckdir = rd / "checkpoints"
    with ExitStack() as stack:
        stop = stack.enter_context(_signals_to_flag())
        if (ckdir / "final.pt").exists() and not cfg.train.force:
            if main:
                print(f"run {rd.name} is finished ({ckdir / 'final.pt'}); train.force=true "
                      f"retrains", file=sys.stderr)
            return rd
        corpus = _corpus(cfg, p)  # everything that can fail on bad input: before the run dir exists
        if main:
            stack.enter_context(_run_lock(rd))
        stack.enter_context(_process_group(device, n_world))

        # ---- setup
        metrics_path = rd / "metrics.jsonl"
        if main:
            if cfg.train.force and rd.exists():
                shutil.rmtree(ckdir, ignore_errors=True)
                metrics_path.unlink(missing_ok=True)
                (rd / "config.yaml").unlink(missing_ok=True)  # new provenance for the new run
            ckdir.mkdir(parents=True, exist_ok=True)
        if n_world > 1:
            dist.barrier()
        log = stack.enter_context(contextlib.closing(_Log(rd / "train.log" if main else None)))
        log(f"argv: {' '.join(argv if argv is not None else sys.argv)}", echo=False)
        log(format_plan(cfg, p), echo=main)
        loop = _Loop(cfg, p, corpus, rd, device, rank, n_world, stop, log)
        if main:
            _write_config(cfg, p, corpus, rd, argv, loop.mode)

        # ---- resume
        loop.resume()
        fwd = loop.wrap()
        if main:
            loop.metrics = stack.enter_context(open(metrics_path, "a", encoding="utf-8"))
        bar = None
        if main and cfg.logging.progress:
            from tqdm import tqdm

            bar = stack.enter_context(tqdm(total=p.steps, initial=loop.state.step, unit="step",
                                           dynamic_ncols=True, desc=f"{p.arm} {rd.name}",
                                           file=sys.stderr))

        # ---- loop
        t0 = time.time()
        step = loop.state.step
        try:
            ran_val = loop.state.val_done
            if step < p.steps and loop.val_due(step) and not ran_val:
                loop.validate(step)  # step 0's, or one a preemption cut before its checkpoint
                ran_val = True
            if (sig := loop.pending_signal()) is not None:  # during setup or that validation
                # the checkpoint records the finished validation: the next attempt trains
                loop.last_good = loop.save(step, val_done=ran_val)
                loop.preempt(sig, step)
            loop.model.train()
            loop.t_window, loop.tok_window = time.time(), 0
            while step < p.steps:
                rec = loop.train_step(fwd, step)
                step += 1
                if step % cfg.logging.log_every == 0 or step == p.steps:
                    tps = loop.window_tokens_per_s()
                    loop.emit({"kind": "train", "step": step, "tokens": p.tokens_at(step),
                               "flops": p.flops_at(step), **rec, "tokens_per_s": tps,
                               "time": loop.t_window - t0})
                    if bar is not None:
                        bar.set_postfix(loss=f"{rec['loss']:.3f}", tok_s=f"{tps:,.0f}")
                if bar is not None:
                    bar.update(1)
                sig = loop.pending_signal()
                # validate before a checkpoint at the same step, so the checkpoint can say it
                # ran; a signal already pending skips it (the next attempt validates first)
                ran_val = sig is None and step < p.steps and loop.val_due(step)
                if ran_val:
                    loop.validate(step)
                    sig = loop.pending_signal()  # one that arrived during the validation
                if (step % cfg.logging.ckpt_every == 0 or step == p.steps or sig is not None
                        or step in loop.eval_steps()):
                    loop.last_good = loop.save(step, val_done=ran_val)
                if sig is not None:
                    loop.preempt(sig, step)
            loop.validate(p.steps)  # truncation on resume removed any earlier val at this step
            wall = time.time() - t0
            loop.emit({"kind": "final", "step": p.steps, "tokens": p.tokens_at(p.steps),
                       "flops": p.flops_at(p.steps), "wall_s": wall})
            loop.save(p.steps, "final.pt", val_done=True)
            log(f"finished {p.steps} steps in {wall:.1f}s -> {ckdir / 'final.pt'}", echo=main)
        except TrainingDiverged as e:
            log(str(e), echo=main)
            raise
    return rd


MEASURE_MAX_PARAMS = 100_000_000
"""The dry run times training steps on this CPU only for models up to this size."""


def _cpu_rate(cfg: TrainConfig, p: RunPlan, n: int = 3) -> tuple[float, str] | None:
    """This machine's training tokens/s: the stated train.cpu_tokens_per_s, else measured
    over `n` optimizer steps (after one warm-up) of this model on random tokens at the
    configured micro-batch and accumulation, with this process's threads."""
    if cfg.train.cpu_tokens_per_s:
        return cfg.train.cpu_tokens_per_s, "stated, train.cpu_tokens_per_s"
    if p.params["total"] > MEASURE_MAX_PARAMS:
        return None
    torch.manual_seed(0)
    model = build_model(p.model).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, p.model.vocab_size, (p.micro_batch_size, p.seq_len), generator=g)
    bf16 = cfg.train.precision == "bf16"

    def step() -> None:
        for _ in range(p.grad_accum):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = model(x, targets=x, generator=g).loss
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    dt = time.perf_counter() - t0
    # one process's share of a step: a world of CPU processes shares these cores
    tokens = n * p.grad_accum * p.micro_batch_size * p.seq_len
    return tokens / (dt * p.world_size), (f"measured: {n} steps of this model after a warm-up, "
                                          f"{torch.get_num_threads()} threads, "
                                          f"{'bf16' if bf16 else 'fp32'}")


def _dry_estimate(cfg: TrainConfig, p: RunPlan) -> str:
    mode = dry_parallel(cfg, p)
    if cfg.train.device == "cpu" or (cfg.train.device == "auto" and not torch.cuda.is_available()):
        cpu = _cpu_rate(cfg, p)
        if cpu is None:
            return (format_estimate(cfg, p, mode) + "\nCPU time    null: the model has more "
                    f"than {MEASURE_MAX_PARAMS:,} parameters to time here; state "
                    "train.cpu_tokens_per_s")
        return format_estimate(cfg, p, mode, cpu)
    return format_estimate(cfg, p, mode)


def _write_config(cfg: TrainConfig, p: RunPlan, corpus: Any, rd: Path,
                  argv: list[str] | None, parallel: str = "none") -> None:
    path = rd / "config.yaml"
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    if path.exists():  # a resume keeps the first provenance; record the restart in the log only
        return
    commit, dirty = git_state()
    sem = semantic(cfg)
    doc = {
        "run_id": rd.name, "arm": p.arm,
        "model": {**asdict(p.model), "preset": cfg.model.preset},
        "data": sem["data"], "optim": sem["optim"], "train": plain(asdict(cfg.train)),
        "logging": asdict(cfg.logging),
        "accounting": {"params": p.params, "flops_per_token": p.flops_per_token,
                       "flops_per_token_baseline_part": p.flops_per_token_baseline_part,
                       "flops_overhead": p.flops_per_token / p.flops_per_token_baseline_part - 1.0,
                       "steps": p.steps, "tokens": p.tokens, "flops": p.flops,
                       "budget_flops": p.budget_flops, "tokens_per_step": p.tokens_per_step,
                       "micro_batch_size": p.micro_batch_size, "grad_accum": p.grad_accum,
                       "world_size": p.world_size, "warmup_steps": p.warmup_steps,
                       "parallel": parallel},
        "corpus": corpus.info,
        "provenance": {"git_commit": commit, "git_dirty": dirty,
                       "argv": list(argv if argv is not None else sys.argv), "created": created,
                       "versions": versions(*VERSIONED), "data_checksums": corpus.checksums,
                       "tokenizer_sha256": tokenizer_sha256(corpus.tokenizer),
                       # wall-clock is comparable only between runs with the same three
                       "host": socket.gethostname(), "threads": torch.get_num_threads(),
                       "launcher": os.environ.get("FTBENCH_LAUNCHER", "direct")},
    }
    atomic_write_text(path, yaml.safe_dump(doc, sort_keys=False))


# ====================================================================== CLI
def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args and args[0] in ("-h", "--help"):
            print(__doc__)
            print(config_help())
            return 0
        cfg = compose(args)
        train(cfg, argv=[sys.argv[0], *args])
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except TrainingDiverged as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except Preempted as e:
        return int(e.code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
