"""Training entry point for both arms (one loop; `model.build_model` picks the architecture).

Public API (used by sweeps/ and experiments/synthetic.py):

    compose(overrides: list[str]) -> TrainConfig    # hydra compose over experiments/config.py
    run_id(cfg: TrainConfig) -> str                  # 12 hex chars (docs/RESULTS.md)
    run_dir(cfg: TrainConfig) -> Path                # <paths.results>/runs/<run-id>
    plan(cfg: TrainConfig) -> dict                   # params, FLOPs/token, steps, batch; no compute
    train(cfg: TrainConfig) -> Path                  # train / resume / return if finished
    ConfigError(ValueError)                          # bad input, one line naming allowed values
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
so a resumed run, and a DDP run with the same global batch, reproduce an uninterrupted
single-process run. DDP: `torchrun --nproc_per_node N -m experiments.train ...` (gloo on CPU).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import yaml

import model as M
from model import ModelConfig, build_model, save_checkpoint, train_flops_per_token
from model.checkpoint import atomic_write_text

from .config import (
    DATA_SOURCES,
    GROUPS,
    NON_SEMANTIC_TRAIN_KEYS,
    TrainConfig,
    model_config,
    register,
)
from .tokenizer import tokenizer_ref, tokenizer_sha256

EXIT_PREEMPTED = 75
LN2 = math.log(2.0)
CONF_DIR = Path(__file__).resolve().parent / "conf"


class ConfigError(ValueError):
    """Bad input: one line naming the problem and the allowed values."""


class TrainingDiverged(RuntimeError):
    """A non-finite loss or gradient; the message names the step and the last good checkpoint."""


class Preempted(SystemExit):
    """SIGTERM/SIGUSR1 arrived: a checkpoint was written; rerun the same config to resume."""

    def __init__(self, step: int, checkpoint: Path) -> None:
        super().__init__(EXIT_PREEMPTED)
        self.step = step
        self.checkpoint = checkpoint


# ====================================================================== config
def _one_line(msg: str) -> str:
    return re.sub(r"\s+", " ", str(msg)).strip()


def _check_override(ov: str) -> None:
    """Reject unknown groups, options and keys with the allowed values (hydra's own messages
    span several lines and do not always list them)."""
    if "=" not in ov:
        raise ConfigError(f"override {ov!r} is not key=value")
    key, value = ov.split("=", 1)
    key = key.lstrip("+~")
    if ov.startswith(("+", "~")):
        raise ConfigError(f"override {ov!r}: adding or deleting keys is not allowed; "
                          f"allowed sections: {sorted(GROUPS)}")
    parts = key.split(".")
    if parts[0] not in GROUPS:
        raise ConfigError(f"unknown config section {parts[0]!r} in {ov!r}; allowed: "
                          f"{sorted(GROUPS)}")
    if len(parts) == 1:
        if parts[0] == "model" and value not in M.PRESETS:
            raise ConfigError(f"unknown model preset {value!r}; allowed: {list(M.PRESETS)}")
        if parts[0] == "data" and value not in DATA_SOURCES:
            raise ConfigError(f"unknown data source {value!r}; allowed: "
                              f"{list(DATA_SOURCES)}")
        if parts[0] not in ("model", "data"):
            raise ConfigError(f"{parts[0]!r} is a section; set its keys, e.g. "
                              f"{parts[0]}.<key>=...; allowed keys: "
                              f"{sorted(GROUPS[parts[0]].__dataclass_fields__)}")
        return
    fields = GROUPS[parts[0]].__dataclass_fields__
    if parts[1] not in fields or len(parts) > 2:
        raise ConfigError(f"unknown key {key!r}; allowed keys in {parts[0]}: {sorted(fields)}")


def compose(overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """Compose the typed config from experiments/conf + overrides; ConfigError on bad input.

    Also applies what the data source implies (synthetic: vocab_size = len(ALPHABET),
    seq_len = task length - 1), so the returned config is the resolved one the run-id hashes.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from hydra.initialize import get_gh_backup, restore_gh_from_backup
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    overrides = [str(o) for o in overrides]
    for ov in overrides:
        _check_override(ov)
    register()
    # Callers may live inside their own hydra app: compose in a clean GlobalHydra, then restore.
    backup = get_gh_backup()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            node = hydra_compose(config_name="train", overrides=overrides)
        cfg = OmegaConf.to_object(node)
    except (HydraException, OmegaConfBaseException) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        cause = e.__cause__  # hydra wraps the omegaconf error that names the type
        if cause is not None and str(cause):
            msg += ": " + str(cause).splitlines()[0]
        m = re.search(r"full_key: (\S+)", str(e))
        raise ConfigError(_one_line(msg + (f" (key {m.group(1)})" if m and m.group(1) not in msg
                                           else ""))) from None
    except ValueError as e:  # __post_init__ of a section
        raise ConfigError(_one_line(str(e))) from None
    finally:
        restore_gh_from_backup(backup)
    assert isinstance(cfg, TrainConfig)
    if cfg.data.source == "synthetic":
        from . import synthetic_data as sd

        cfg.model.vocab_size = len(sd.ALPHABET)
        cfg.train.seq_len = sd.SEQ_LEN - 1
    try:
        mc = model_config(cfg.model)
    except ValueError as e:
        raise ConfigError(_one_line(str(e))) from None
    if cfg.train.seq_len > mc.max_seq_len:
        raise ConfigError(f"train.seq_len={cfg.train.seq_len} exceeds model.max_seq_len="
                          f"{mc.max_seq_len}; lower train.seq_len or raise model.max_seq_len")
    return cfg


def _semantic(cfg: TrainConfig) -> dict[str, Any]:
    d = {k: asdict(getattr(cfg, k)) for k in ("model", "data", "optim", "train")}
    for k in NON_SEMANTIC_TRAIN_KEYS:
        d["train"].pop(k, None)
    if d["train"].get("match_n_layers") is None:  # added later: old run-ids stay valid
        d["train"].pop("match_n_layers", None)
    d["model"].pop("preset", None)  # the fields say everything; a renamed preset is the same run
    d["model"].pop("mapper_chunk_elems", None)  # a memory knob: same maths, same run
    return d


def run_id(cfg: TrainConfig) -> str:
    """First 12 hex chars of sha256 of the canonical JSON of model, data, optim, train."""
    import hashlib

    canon = json.dumps(_semantic(cfg), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()[:12]


def run_dir(cfg: TrainConfig) -> Path:
    return Path(cfg.paths.results) / "runs" / run_id(cfg)


# ====================================================================== plan
def _world() -> tuple[int, int]:
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def plan(cfg: TrainConfig, world_size: int | None = None) -> dict[str, Any]:
    """Everything decided before compute: arms, params, FLOPs/token, budget, steps, batch."""
    world = _world()[1] if world_size is None else world_size
    mc = model_config(cfg.model)
    t = cfg.train
    T = t.seq_len
    base = mc.replace(latent_bits=0)
    free: ModelConfig | None = mc
    if not mc.is_free:  # the matching FT; none for an odd layer count (e.g. the L+1 control)
        # unless train.match_n_layers names the FT's layers (the L+1 control at the FT's FLOPs)
        ft_layers = t.match_n_layers or mc.n_layers
        free = None if ft_layers % 2 else mc.replace(latent_bits=t.match_latent_bits,
                                                     n_layers=ft_layers)
    fpt = train_flops_per_token(mc, T)
    fb = train_flops_per_token(base, T)
    ff = train_flops_per_token(free, T) if free is not None else None
    micro = t.micro_batch_size or t.batch_size // world
    if t.batch_size % (micro * world):
        raise ConfigError(f"train.batch_size={t.batch_size} must be a multiple of "
                          f"micro_batch_size x world_size = {micro} x {world}")
    accum = t.batch_size // (micro * world)
    tokens_per_step = t.batch_size * T
    if t.flops is not None:
        budget_flops = float(t.flops)
    elif t.compute_match == "flops" and not mc.is_free:
        if ff is None:
            raise ConfigError("train.compute_match=flops needs an even layer count for the "
                              "matching FT (model.n_layers, or train.match_n_layers)")
        # the FLOPs the matching FT really trains for: its whole steps on the token budget
        ft_steps = max(1, math.ceil(t.tokens / tokens_per_step - 1e-9))
        budget_flops = ft_steps * tokens_per_step * ff.total
    else:
        budget_flops = float(t.tokens) * fpt.total
    steps = max(1, math.ceil(budget_flops / (fpt.total * tokens_per_step) - 1e-9))
    warm = cfg.optim.warmup_steps
    warmup = max(1, round(0.05 * steps)) if warm is None else min(warm, steps)
    return {
        "arm": "free" if mc.is_free else "baseline",
        "model": mc, "seq_len": T,
        "params": M.param_count(mc),
        "params_baseline": M.param_count(base)["total"],
        "params_free": M.param_count(free)["total"] if free is not None else None,
        "free_latent_bits": free.latent_bits if free is not None else None,
        "flops_per_token": fpt.total,
        "flops_per_token_baseline_part": fpt.baseline_part,
        "flops_per_token_baseline": fb.total,
        "flops_per_token_free": ff.total if ff is not None else None,
        "flops_overhead": (ff.total / fb.total - 1.0) if ff is not None else None,
        "paper_overhead": 1.0 / mc.n_layers,
        # the paper's 1/L counts the extra block only; readout, mapper and attention are extra
        "encoder_block_overhead": (ff.encoder_block / fb.total) if ff is not None else None,
        "budget_flops": budget_flops,
        "steps": steps, "warmup_steps": warmup,
        "tokens_per_step": tokens_per_step, "tokens": steps * tokens_per_step,
        "flops": steps * tokens_per_step * fpt.total,
        "batch_size": t.batch_size, "micro_batch_size": micro, "grad_accum": accum,
        "world_size": world,
    }


def format_plan(cfg: TrainConfig, p: dict[str, Any]) -> str:
    mc: ModelConfig = p["model"]
    lines = [
        f"run-id      {run_id(cfg)}  ({p['arm']}, preset {cfg.model.preset}, "
        f"H={mc.latent_bits}, kappa={mc.kappa_bits} bits)",
        f"data        {cfg.data.source}, seq_len {p['seq_len']}, vocab {mc.vocab_size}",
        f"params      {p['params']['total']:,} (non-embedding {p['params']['non_embedding']:,}); "
        f"baseline {p['params_baseline']:,}"
        + (f", free(H={p['free_latent_bits']}) {p['params_free']:,}" if p["params_free"] else ""),
        f"FLOPs/token this run {p['flops_per_token']:.4g}; "
        f"baseline {p['flops_per_token_baseline']:.4g}"
        + (f", free(H={p['free_latent_bits']}) {p['flops_per_token_free']:.4g}"
           if p["flops_per_token_free"] else ""),
    ]
    if p["flops_overhead"] is not None:
        lines.append(f"FT overhead {100 * p['flops_overhead']:.2f}% of the baseline's FLOPs; "
                     f"encoder block alone {100 * p['encoder_block_overhead']:.2f}% "
                     f"(paper's 1/L = {100 * p['paper_overhead']:.2f}%)")
    lines += [
        f"budget      {p['budget_flops']:.4g} FLOPs (compute_match={cfg.train.compute_match})",
        f"tokens      {p['tokens']:,} = {p['steps']:,} steps x {p['tokens_per_step']:,} tokens",
        f"FLOPs       {p['flops']:.4g}",
        f"batch       {p['batch_size']} sequences = micro {p['micro_batch_size']} x accum "
        f"{p['grad_accum']} x world {p['world_size']}; warmup {p['warmup_steps']} steps",
    ]
    return "\n".join(lines)


# ====================================================================== helpers
def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for pkg in ("torch", "numpy", "tokenizers", "datasets", "hydra-core", "omegaconf",
                "freetransformer-bench"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[pkg] = metadata.version(pkg)
    return out


def _git() -> tuple[str | None, bool | None]:
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                                text=True, timeout=10).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "status", "--porcelain"], cwd=root,
                                    capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return None, None
    return commit, dirty


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
            print(msg, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.f is not None:
            self.f.close()


def _checkpoints(ckdir: Path) -> list[tuple[int, Path]]:
    out = []
    for p in ckdir.glob("step_*.pt"):
        m = re.fullmatch(r"step_(\d+)\.pt", p.name)
        if m:
            out.append((int(m.group(1)), p))
    return sorted(out)


def _newest_checkpoint(ckdir: Path, log: _Log) -> tuple[dict, Path] | None:
    from model.checkpoint import CheckpointError, read_checkpoint

    for step, p in reversed(_checkpoints(ckdir)):
        try:
            payload = read_checkpoint(p)
        except CheckpointError as e:
            log(f"skipping unreadable checkpoint {p.name}: {e}")
            continue
        if payload.get("extra", {}).get("step") == step:
            return payload, p
    return None


def _truncate_metrics(path: Path, step: int) -> None:
    """Keep what an uninterrupted run had written when its checkpoint at `step` was taken:
    train lines up to `step`, val lines before it (val at `step` runs after the checkpoint)."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by kill -9
        if (r.get("kind") == "train" and r["step"] <= step) or (
                r.get("kind") == "val" and r["step"] < step):
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


# ====================================================================== train
def _device(cfg: TrainConfig) -> torch.device:
    d = cfg.train.device
    if d == "cuda" or (d == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ConfigError("train.device=cuda but CUDA is not available; allowed: auto, cpu")
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def train(cfg: TrainConfig, argv: list[str] | None = None) -> Path:
    """Train `cfg` to its budget, resuming from the newest complete checkpoint; return the run
    dir. A finished run (final.pt present) returns at once unless train.force=true."""
    rank, world = _world()
    p = plan(cfg, world)
    if cfg.train.dry_run:
        if rank == 0:
            print(format_plan(cfg, p), flush=True)
        return run_dir(cfg)
    device = _device(cfg)
    if cfg.train.precision == "bf16" and device.type != "cuda":
        raise ConfigError("train.precision=bf16 needs CUDA; allowed on CPU: auto, fp32")
    # Preemption (and Ctrl-C): the handler only sets a flag; the loop checks it after each
    # optimizer step (and once before the first), writes a checkpoint there and raises
    # Preempted (exit 75).
    stop: dict[str, Any] = {"sig": None}
    old = {}
    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):  # Ctrl-C checkpoints too
            old[s] = signal.signal(s, lambda sig, _f: stop.__setitem__("sig", sig))
    try:
        return _train_or_skip(cfg, p, device, rank, world, argv, stop)
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _train_or_skip(cfg: TrainConfig, p: dict[str, Any], device: torch.device, rank: int,
                   world: int, argv: list[str] | None, stop: dict[str, Any]) -> Path:
    rd = run_dir(cfg)
    ckdir = rd / "checkpoints"
    if (ckdir / "final.pt").exists() and not cfg.train.force:
        if rank == 0:
            print(f"run {rd.name} is finished ({ckdir / 'final.pt'}); train.force=true retrains",
                  file=sys.stderr)
        return rd

    # Everything that can fail on bad input happens before the run directory exists.
    from .data import DataError, build_corpus

    try:
        corpus = build_corpus(cfg.data, vocab_size=cfg.model.vocab_size, seq_len=cfg.train.seq_len,
                              seed=cfg.train.seed, cache_dir=cfg.paths.cache)
    except DataError as e:
        raise ConfigError(_one_line(str(e))) from None
    if corpus.tokenizer.vocab_size != cfg.model.vocab_size:
        raise ConfigError(f"model.vocab_size={cfg.model.vocab_size} but the tokenizer has "
                          f"{corpus.tokenizer.vocab_size} tokens (corpus too small for this "
                          f"vocabulary?); set model.vocab_size={corpus.tokenizer.vocab_size}")

    lock = _lock(rd) if rank == 0 else None
    ddp = world > 1
    if ddp and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:
        return _train(cfg, p, corpus, rd, device, rank, world, argv, stop)
    finally:
        if ddp and dist.is_initialized():
            dist.destroy_process_group()
        if lock is not None:
            lock.close()  # releases the flock


def _lock(rd: Path) -> Any:
    """One trainer per run directory (a sweep relaunch must not race a live job). flock is
    dropped by the kernel when the holder dies, so kill -9 leaves no stale lock."""
    import fcntl

    rd.mkdir(parents=True, exist_ok=True)
    f = open(rd / ".lock", "w")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise ConfigError(f"run {rd.name} is being trained by another process "
                          f"({rd / '.lock'} is held)") from None
    return f


def _train(cfg: TrainConfig, p: dict[str, Any], corpus: Any, rd: Path, device: torch.device,
           rank: int, world: int, argv: list[str] | None, stop: dict[str, Any]) -> Path:
    main = rank == 0
    ckdir = rd / "checkpoints"
    metrics_path = rd / "metrics.jsonl"
    if main:
        if cfg.train.force and rd.exists():
            shutil.rmtree(ckdir, ignore_errors=True)
            metrics_path.unlink(missing_ok=True)
            (rd / "config.yaml").unlink(missing_ok=True)  # new provenance for the new run
        ckdir.mkdir(parents=True, exist_ok=True)
    if world > 1:
        dist.barrier()
    log = _Log(rd / "train.log" if main else None)
    log(f"argv: {' '.join(argv if argv is not None else sys.argv)}", echo=False)
    log(format_plan(cfg, p), echo=main)

    mc: ModelConfig = p["model"]
    tok_ref = tokenizer_ref(corpus.tokenizer, corpus.tokenizer.name)
    if main:
        _write_config(cfg, p, corpus, rd, argv)

    torch.manual_seed(cfg.train.seed)
    model = build_model(mc).to(device)
    opt = torch.optim.AdamW(_param_groups(model, cfg.optim.weight_decay), lr=cfg.optim.lr,
                            betas=(cfg.optim.beta1, cfg.optim.beta2), eps=cfg.optim.eps,
                            # fused kernels exist for CUDA and CPU (5x faster step on CPU)
                            fused=device.type in ("cuda", "cpu"))
    steps, warmup = p["steps"], p["warmup_steps"]
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, steps, warmup, cfg.optim.min_lr_ratio))

    start = 0
    found = _newest_checkpoint(ckdir, log)
    if found is not None:
        payload, path = found
        model.load_state_dict(payload["model"])
        ex = payload["extra"]
        opt.load_state_dict(ex["optimizer"])
        sched.load_state_dict(ex["scheduler"])
        _set_rng_state(ex["rng"])
        start = int(ex["step"])
        if ex["data"]["samples"] != start * cfg.train.batch_size:
            raise ConfigError(f"{path}: data position does not match its step")
        log(f"resumed from {path.name} (step {start}/{steps})", echo=main)
        if main:
            _truncate_metrics(metrics_path, start)
    elif main:
        metrics_path.unlink(missing_ok=True)

    use_bf16 = device.type == "cuda" and cfg.train.precision in ("auto", "bf16")

    def autocast():
        if use_bf16:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    fwd = model
    if cfg.train.compile:
        if device.type == "cuda":
            fwd = torch.compile(model)
        else:
            log("train.compile=true ignored on CPU", echo=main)
    if world > 1:
        fwd = torch.nn.parallel.DistributedDataParallel(
            fwd, device_ids=[device.index] if device.type == "cuda" else None)

    metrics = open(metrics_path, "a", encoding="utf-8") if main else None

    def emit(rec: dict[str, Any]) -> None:
        if metrics is not None:
            metrics.write(json.dumps(rec) + "\n")
            metrics.flush()

    clock = {"t": time.time(), "tok": 0}  # the tokens/s window; val and checkpoints excluded

    def save(step: int, name: str | None = None) -> Path:
        t_in = time.time()
        path = ckdir / (name or f"step_{step}.pt")
        if main:
            extra = {"step": step, "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                     "data": {"samples": step * cfg.train.batch_size, "seed": cfg.train.seed},
                     "rng": _rng_state(), "run_id": rd.name,
                     "tokens": step * p["tokens_per_step"],
                     "flops": step * p["tokens_per_step"] * p["flops_per_token"]}
            save_checkpoint(path, model, tokenizer=tok_ref, extra=extra)
            if name is None:
                for _, old in _checkpoints(ckdir)[:-cfg.logging.keep_checkpoints]:
                    old.unlink(missing_ok=True)
        if world > 1:
            dist.barrier()
        clock["t"] += time.time() - t_in
        return path

    def validate(step: int) -> None:
        t_in = time.time()
        if main:
            r = evaluate(model, corpus, cfg.logging.val_batch_size, mc.kappa_bits, autocast)
            emit({"kind": "val", "step": step, "tokens": step * p["tokens_per_step"],
                  "flops": step * p["tokens_per_step"] * p["flops_per_token"], **r})
            log(f"step {step}: val_ce {r['val_ce']:.4f} val_bpb {r['val_bpb']:.4f}"
                + (f" (posterior ce {r['val_ce_posterior']:.4f}, kl {r['val_kl_bits']:.3f} "
                   f"bits)" if mc.is_free else ""), echo=False)
        if world > 1:
            dist.barrier()
        clock["t"] += time.time() - t_in

    def val_due(step: int) -> bool:
        ve = cfg.logging.val_every
        return step == steps or step == 0 or (ve > 0 and step % ve == 0)

    def pending_signal() -> int | None:
        sig = stop["sig"]
        if world > 1:  # every rank stops at the same step
            flag = torch.tensor([0 if sig is None else int(sig)])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            sig = int(flag) or None
        return sig

    def preempt(sig: int, step: int) -> None:
        log(f"signal {signal.Signals(sig).name} at step {step}: wrote {last_good.name}; "
            f"exiting with code {EXIT_PREEMPTED} (rerun to resume)", echo=main)
        raise Preempted(step, last_good)

    mb, accum = p["micro_batch_size"], p["grad_accum"]
    n_micro = accum * world
    t0 = time.time()
    bar = None
    if main and cfg.logging.progress:
        from tqdm import tqdm

        bar = tqdm(total=steps, initial=start, unit="step", dynamic_ncols=True,
                   desc=f"{p['arm']} {rd.name}", file=sys.stderr)
    last_good = _checkpoints(ckdir)[-1][1] if _checkpoints(ckdir) else None
    try:
        if start == 0 and val_due(0):
            validate(0)
        elif start > 0 and start < steps and val_due(start):
            validate(start)  # the val that followed this checkpoint in the first attempt
        if (sig := pending_signal()) is not None:  # arrived during setup
            last_good = save(start)
            preempt(sig, start)
        model.train()
        clock["t"], clock["tok"] = time.time(), 0
        step = start
        while step < steps:
            ce_sum = kl_sum = loss_sum = 0.0
            for a in range(accum):
                j = a * world + rank  # this micro-batch's index within the global batch
                x, y = corpus.train.get(step * cfg.train.batch_size + j * mb, mb)
                x, y = x.to(device), y.to(device)
                # DDP: all-reduce gradients only on the last micro-batch of the step
                last = a == accum - 1
                sync = fwd.no_sync() if world > 1 and not last else contextlib.nullcontext()
                with sync:
                    with autocast():
                        out = fwd(x, targets=y, generator=_z_generator(cfg.train.seed, step, j))
                        loss = out.loss / accum
                    loss.backward()
                ce_sum += out.ce.detach().item()
                kl_sum += out.kl.detach().item()
                loss_sum += out.loss.detach().item()
            vals = torch.tensor([ce_sum, kl_sum, loss_sum], dtype=torch.float64)
            if world > 1:
                dist.all_reduce(vals)
            ce, kl, lossv = (vals / n_micro).tolist()
            gn = torch.nn.utils.clip_grad_norm_(
                model.parameters(), cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else math.inf)
            gnv = float(gn)
            if not (math.isfinite(lossv) and math.isfinite(gnv)):
                what = "loss" if not math.isfinite(lossv) else "gradient norm"
                raise TrainingDiverged(
                    f"non-finite {what} ({lossv if what == 'loss' else gnv}) at step {step + 1}; "
                    f"stopped without updating; last good checkpoint: "
                    f"{last_good if last_good else 'none'}")
            lr = opt.param_groups[0]["lr"]
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            clock["tok"] += p["tokens_per_step"]
            if step % cfg.logging.log_every == 0 or step == steps:
                now = time.time()
                tps = clock["tok"] / max(now - clock["t"], 1e-9)
                clock["t"], clock["tok"] = now, 0
                emit({"kind": "train", "step": step, "tokens": step * p["tokens_per_step"],
                      "flops": step * p["tokens_per_step"] * p["flops_per_token"],
                      "ce": ce, "kl_nats": kl, "kl_bits": kl / LN2, "loss": lossv, "lr": lr,
                      "grad_norm": gnv, "tokens_per_s": tps, "time": now - t0})
                if bar is not None:
                    bar.set_postfix(loss=f"{lossv:.3f}", tok_s=f"{tps:,.0f}")
            if bar is not None:
                bar.update(1)
            sig = pending_signal()
            if step % cfg.logging.ckpt_every == 0 or step == steps or sig is not None:
                last_good = save(step)
            if sig is not None:
                preempt(sig, step)
            if step < steps and val_due(step):
                validate(step)
        validate(steps)  # truncation on resume removed any earlier val line at this step
        wall = time.time() - t0
        emit({"kind": "final", "step": steps, "tokens": steps * p["tokens_per_step"],
              "flops": steps * p["tokens_per_step"] * p["flops_per_token"], "wall_s": wall})
        save(steps, "final.pt")
        log(f"finished {steps} steps in {wall:.1f}s -> {ckdir / 'final.pt'}", echo=main)
    except TrainingDiverged as e:
        log(str(e), echo=main)
        raise
    finally:
        if bar is not None:
            bar.close()
        if metrics is not None:
            metrics.close()
        log.close()
    return rd


def _write_config(cfg: TrainConfig, p: dict[str, Any], corpus: Any, rd: Path,
                  argv: list[str] | None) -> None:
    path = rd / "config.yaml"
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    if path.exists():  # a resume keeps the first provenance; record the restart in the log only
        return
    commit, dirty = _git()
    sem = _semantic(cfg)
    doc = {
        "run_id": rd.name, "arm": p["arm"],
        "model": {**asdict(p["model"]), "preset": cfg.model.preset},
        "data": sem["data"], "optim": sem["optim"], "train": asdict(cfg.train),
        "logging": asdict(cfg.logging),
        "accounting": {"params": p["params"], "flops_per_token": p["flops_per_token"],
                       "flops_per_token_baseline_part": p["flops_per_token_baseline_part"],
                       "flops_overhead": (p["flops_per_token"] / p["flops_per_token_baseline_part"]
                                          - 1.0),
                       "steps": p["steps"], "tokens": p["tokens"], "flops": p["flops"],
                       "budget_flops": p["budget_flops"], "tokens_per_step": p["tokens_per_step"],
                       "micro_batch_size": p["micro_batch_size"], "grad_accum": p["grad_accum"],
                       "world_size": p["world_size"], "warmup_steps": p["warmup_steps"]},
        "corpus": corpus.info,
        "provenance": {"git_commit": commit, "git_dirty": dirty,
                       "argv": list(argv if argv is not None else sys.argv), "created": created,
                       "versions": _versions(), "data_checksums": corpus.checksums,
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
