"""What a run is before any compute: its id, its directory and its `RunPlan` (arms, parameters,
FLOPs/token, budget, steps, batch). Used by the trainer and by sweeps/ (no trainer import)."""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import model as M
from model import ModelConfig, train_flops_per_token

from .config import NON_SEMANTIC_TRAIN_KEYS, ConfigError, TrainConfig, model_config


def plain(obj: Any) -> Any:
    """`obj` with every Enum replaced by its value (yaml writes plain strings only)."""
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [plain(v) for v in obj]
    return obj


def semantic(cfg: TrainConfig) -> dict[str, Any]:
    """The sections that decide what is trained (the run-id hashes exactly these)."""
    d = {k: plain(asdict(getattr(cfg, k))) for k in ("model", "data", "optim", "train")}
    for k in NON_SEMANTIC_TRAIN_KEYS:
        d["train"].pop(k, None)
    if d["train"].get("match_n_layers") is None:  # added later: old run-ids stay valid
        d["train"].pop("match_n_layers", None)
    d["model"].pop("preset", None)  # the fields say everything; a renamed preset is the same run
    d["model"].pop("mapper_chunk_elems", None)  # a memory knob: same maths, same run
    return d


def run_id(cfg: TrainConfig) -> str:
    """First 12 hex chars of sha256 of the canonical JSON of model, data, optim, train."""
    canon = json.dumps(semantic(cfg), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()[:12]


def run_dir(cfg: TrainConfig) -> Path:
    return Path(cfg.paths.results) / "runs" / run_id(cfg)


def world() -> tuple[int, int]:
    """(rank, world size) from torchrun's environment."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


@dataclass(frozen=True)
class RunPlan:
    """Everything decided before compute."""

    arm: str
    model: ModelConfig
    seq_len: int
    params: dict[str, int]
    params_baseline: int
    params_free: int | None
    free_latent_bits: int | None
    flops_per_token: float
    flops_per_token_baseline_part: float
    flops_per_token_baseline: float
    flops_per_token_free: float | None
    flops_overhead: float | None
    paper_overhead: float
    encoder_block_overhead: float | None
    """The paper's 1/L counts the extra block only; readout, mapper and attention are extra."""
    budget_flops: float
    steps: int
    warmup_steps: int
    tokens_per_step: int
    tokens: int
    flops: float
    batch_size: int
    micro_batch_size: int
    grad_accum: int
    world_size: int

    def tokens_at(self, step: int) -> int:
        return step * self.tokens_per_step

    def flops_at(self, step: int) -> float:
        return step * self.tokens_per_step * self.flops_per_token


def plan(cfg: TrainConfig, world_size: int | None = None) -> RunPlan:
    """Arms, params, FLOPs/token, budget, steps and batch of `cfg` (ConfigError if impossible)."""
    n_world = world()[1] if world_size is None else world_size
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
    micro = t.micro_batch_size or t.batch_size // n_world
    if t.batch_size % (micro * n_world):
        raise ConfigError(f"train.batch_size={t.batch_size} must be a multiple of "
                          f"micro_batch_size x world_size = {micro} x {n_world}")
    accum = t.batch_size // (micro * n_world)
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
    return RunPlan(
        arm="free" if mc.is_free else "baseline",
        model=mc, seq_len=T,
        params=M.param_count(mc),
        params_baseline=M.param_count(base)["total"],
        params_free=M.param_count(free)["total"] if free is not None else None,
        free_latent_bits=free.latent_bits if free is not None else None,
        flops_per_token=fpt.total,
        flops_per_token_baseline_part=fpt.baseline_part,
        flops_per_token_baseline=fb.total,
        flops_per_token_free=ff.total if ff is not None else None,
        flops_overhead=(ff.total / fb.total - 1.0) if ff is not None else None,
        paper_overhead=1.0 / mc.n_layers,
        encoder_block_overhead=(ff.encoder_block / fb.total) if ff is not None else None,
        budget_flops=budget_flops,
        steps=steps, warmup_steps=warmup,
        tokens_per_step=tokens_per_step, tokens=steps * tokens_per_step,
        flops=steps * tokens_per_step * fpt.total,
        batch_size=t.batch_size, micro_batch_size=micro, grad_accum=accum,
        world_size=n_world,
    )


def format_plan(cfg: TrainConfig, p: RunPlan) -> str:
    mc = p.model
    lines = [
        f"run-id      {run_id(cfg)}  ({p.arm}, preset {cfg.model.preset}, "
        f"H={mc.latent_bits}, kappa={mc.kappa_bits} bits)",
        f"data        {cfg.data.source}, seq_len {p.seq_len}, vocab {mc.vocab_size}",
        f"params      {p.params['total']:,} (non-embedding {p.params['non_embedding']:,}); "
        f"baseline {p.params_baseline:,}"
        + (f", free(H={p.free_latent_bits}) {p.params_free:,}" if p.params_free else ""),
        f"FLOPs/token this run {p.flops_per_token:.4g}; "
        f"baseline {p.flops_per_token_baseline:.4g}"
        + (f", free(H={p.free_latent_bits}) {p.flops_per_token_free:.4g}"
           if p.flops_per_token_free else ""),
    ]
    if p.flops_overhead is not None:
        lines.append(f"FT overhead {100 * p.flops_overhead:.2f}% of the baseline's FLOPs; "
                     f"encoder block alone {100 * p.encoder_block_overhead:.2f}% "
                     f"(paper's 1/L = {100 * p.paper_overhead:.2f}%)")
    lines += [
        f"budget      {p.budget_flops:.4g} FLOPs (compute_match={cfg.train.compute_match})",
        f"tokens      {p.tokens:,} = {p.steps:,} steps x {p.tokens_per_step:,} tokens",
        f"FLOPs       {p.flops:.4g}",
        f"batch       {p.batch_size} sequences = micro {p.micro_batch_size} x accum "
        f"{p.grad_accum} x world {p.world_size}; warmup {p.warmup_steps} steps",
    ]
    return "\n".join(lines)
