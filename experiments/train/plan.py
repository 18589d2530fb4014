"""What a run is before any compute: its id, its directory and its `RunPlan` (arms, parameters,
FLOPs/token, budget, steps, batch), and the whole dry run (`dry_run`: the plan, memory, fit and
time estimates, the CPU rate measured here). Used by the trainer and by sweeps/ (no trainer
import)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import torch

import model as M
from common import arms
from common.errors import UsageError
from common.io import read_yaml_mapping
from common.kappa import kappa_label
from common.paths import FINAL_CHECKPOINT, RunDir, gpu_check_dirs
from common.text import one_line
from experiments.corpus.config import GENERATED_SOURCES
from model import ModelConfig, train_flops_per_token

from .config import NON_SEMANTIC_TRAIN_KEYS, TrainConfig, model_config


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
    # the micro-batch is a memory layout (latent draws are keyed per sequence): every value
    # hashes as the default's null, so default run-ids stay as they were
    d["train"]["micro_batch_size"] = None
    if d["train"].get("match_n_layers") is None:  # added later: old run-ids stay valid
        d["train"].pop("match_n_layers", None)
    d["model"].pop("preset", None)  # the fields say everything; a renamed preset is the same run
    d["model"].pop("mapper_chunk_bytes", None)  # a memory knob: same maths, same run
    for k in ("mapper_bf16", "z_cut"):  # added later: off, they leave old run-ids valid
        if not d["model"].get(k):
            d["model"].pop(k, None)
    if not d["model"].get("latent_bits"):  # a model without a latent has no mapper to round:
        d["model"].pop("mapper_bf16", None)  # the same training, the same run
    # data keys added with experiments/corpus: at their defaults they stay out (old run-ids stay
    # valid); max_epochs is a guard, never what is trained; shard_bytes does not change the stream
    for k, default in (("corpus", None), ("tokenizer", None),
                       ("tokenizer_sample_bytes", 1_000_000_000)):
        if d["data"].get(k) == default:
            d["data"].pop(k, None)
    d["data"].pop("max_epochs", None)
    d["data"].pop("shard_bytes", None)
    for src in d["data"].get("hf_sources") or []:
        src.pop("passes", None)  # a cap on the build, never what is trained (as request_of)
    return d


def run_id(cfg: TrainConfig) -> str:
    """First 12 hex chars of sha256 of the canonical JSON of model, data, optim, train."""
    canon = json.dumps(semantic(cfg), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()[:12]


def run_dir(cfg: TrainConfig) -> Path:
    """<paths.results>/runs/<run-id>: where this config's run writes (its RunDir's path)."""
    return RunDir.of(run_id(cfg), cfg.paths.results).path


def world() -> tuple[int, int]:
    """(rank, world size) from torchrun's environment."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


PLAN_ENV = ("FTBENCH_PLAN_NPROC", "FTBENCH_PLAN_NNODES")
"""What `make train DRY=1 NPROC=n NNODES=m` hands the dry run (processes per node, nodes)."""


def _count(name: str, value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise UsageError(f"{name}={value!r}: must be a positive integer")
    return n


def planning_world(cfg: TrainConfig) -> tuple[int, str]:
    """(world size, where it comes from) of the run the dry run plans: train.plan_world_size,
    else make's NPROC x NNODES, else torchrun's WORLD_SIZE, else the cluster file's, else 1."""
    if cfg.train.plan_world_size:
        return cfg.train.plan_world_size, "train.plan_world_size"
    nproc, nnodes = (os.environ.get(k, "") for k in PLAN_ENV)
    if nproc or nnodes:
        n = _count("NPROC", nproc or "1") * _count("NNODES", nnodes or "1")
        return n, f"NPROC={nproc or 1} x NNODES={nnodes or 1}"
    if "WORLD_SIZE" in os.environ:
        return _count("WORLD_SIZE", os.environ["WORLD_SIZE"]), "torchrun's WORLD_SIZE"
    site = cluster_site()
    if site is not None and site["gpus"]:
        return site["gpus"] * site["nodes"], (f"{site['file']}: {site['nodes']} node(s) x "
                                              f"{site['gpus']} GPU(s)")
    return 1, "one process (NPROC, NNODES, train.plan_world_size or a cluster file change it)"


GPUS_PER_NODE = 8
"""GPUs per node a plan assumes where nothing says (the recipes' and the paper's H100 nodes)."""


def planning_local(world: int) -> int:
    """Processes per node of a planned world of `world` (HSDP shards within a node): make's
    NPROC, else torchrun's LOCAL_WORLD_SIZE, else the cluster file's, else GPUS_PER_NODE."""
    n = os.environ.get(PLAN_ENV[0]) or os.environ.get("LOCAL_WORLD_SIZE")
    site = None if n else cluster_site()
    local = _count("NPROC", n) if n else (site or {}).get("gpus") or GPUS_PER_NODE
    return min(world, local)


def cluster_site() -> dict[str, Any] | None:
    """The cluster file's GPUs, nodes, results root and write bandwidth (None: no cluster
    file), with sweeps/cluster.py's rule (null or 0 = the default), which checks the rest."""

    path = Path(os.environ.get("FTBENCH_CLUSTER")
                or Path(__file__).resolve().parents[2] / "sweeps" / "cluster.yaml")
    if not path.is_file():
        return None
    raw = read_yaml_mapping(path, UsageError)
    site: dict[str, Any] = {"file": str(path), "results": raw.get("results")}
    for key, default, kind in (("gpus_per_node", 0, int), ("nodes", 1, int),
                               ("write_gbps", WRITE_GBPS, float)):
        v = raw.get(key)
        ok = v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
                           and (kind is float or float(v).is_integer()))
        if not ok:
            raise UsageError(f"{path}: {key} must be a non-negative "
                              f"{'integer' if kind is int else 'number'}, got {v!r}")
        site[key] = kind(v or default)
    site["gpus"] = site.pop("gpus_per_node")
    return site


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def batch_refusal(batch: int, micro: int | None, n_world: int) -> str:
    """One line: why `batch` sequences do not split over `n_world` processes of `micro` each,
    with the nearest batch and world sizes that do."""
    unit = (micro or 1) * n_world  # a valid batch is a multiple of this
    lo, hi = (batch // unit) * unit, -(-batch // unit) * unit
    sizes = " or ".join(f"train.batch_size={b}" for b in dict.fromkeys((lo, hi)) if b > 0)
    per = batch // (micro or 1)  # the world must divide this
    below = max((d for d in _divisors(per) if d <= n_world), default=1)
    above = min((d for d in _divisors(per) if d >= n_world), default=None)
    worlds = " or ".join(str(w) for w in dict.fromkeys((below, above)) if w is not None)
    what = (f"micro_batch_size {micro} x world {n_world} = {unit}" if micro
            else f"world {n_world} (one sequence per process at least)")
    return (f"train.batch_size={batch} does not split over {what}; nearest valid: {sizes}, "
            f"or a world size of {worlds}")


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
    """Arms, params, FLOPs/token, budget, steps and batch of `cfg` (UsageError if impossible)."""
    n_world = world()[1] if world_size is None else world_size
    mc = model_config(cfg.model)
    t = cfg.train
    T = t.seq_len
    kind = arms.of_model(mc.latent_bits)  # the model's own arm: what config.yaml records
    base = mc.replace(latent_bits=0)
    free: ModelConfig | None = mc
    if not kind.latent:  # the matching FT; none for an odd layer count (e.g. the L+1 control)
        # unless train.match_n_layers names the FT's layers (the L+1 control at the FT's FLOPs)
        ft_layers = t.match_n_layers or mc.n_layers
        free = None if ft_layers % 2 else mc.replace(latent_bits=t.match_latent_bits,
                                                     n_layers=ft_layers)
    fpt = train_flops_per_token(mc, T)
    fb = train_flops_per_token(base, T)
    ff = train_flops_per_token(free, T) if free is not None else None
    if n_world < 1:
        raise UsageError(f"world size {n_world}: must be at least 1")
    micro = t.micro_batch_size or t.batch_size // n_world
    if micro < 1 or t.batch_size % (micro * n_world):
        raise UsageError(batch_refusal(t.batch_size, t.micro_batch_size, n_world))
    accum = t.batch_size // (micro * n_world)
    if t.fsdp_replicas and n_world % t.fsdp_replicas:
        raise UsageError(f"train.fsdp_replicas={t.fsdp_replicas} must divide the world size "
                          f"{n_world} (0: automatic, HSDP across nodes)")
    tokens_per_step = t.batch_size * T
    if t.flops is not None:
        budget_flops = float(t.flops)
    elif t.compute_match == "flops" and not kind.latent:
        if ff is None:
            raise UsageError("train.compute_match=flops needs an even layer count for the "
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
        arm=kind.name,
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
        f"H={mc.latent_bits}, kappa={kappa_label(mc.kappa_bits)} bits"
        + (", Z cut from the decoder)" if mc.z_cut else ")"),
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


# ---------------------------------------------------------------- the dry run's estimates
PAPER_1P5B = {"preset": "1.5B", "tokens": 47e9, "gpus": 32, "hours": 12.0,
              "gpu": "H100", "peak_tflops": 989.0}
"""The paper's 1.5B runs: 47B tokens on 32 H100s in about 12 h (dense bf16 peak 989 TFLOP/s)."""
ADAMW_STATES = 2
"""exp_avg and exp_avg_sq, each the shape and dtype (fp32) of its parameter."""


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def chunked_loss(mc: ModelConfig, micro_batch_size: int, seq_len: int) -> bool:
    """Whether the training step computes its cross-entropy over chunks of tokens: when one
    micro-batch's float32 logits exceed `READOUT_CHUNK_BYTES`. Below that the unchunked
    `F.cross_entropy` stays (bit for bit the values from before the chunked loss)."""
    from model.readout import READOUT_CHUNK_BYTES

    return micro_batch_size * seq_len * mc.vocab_size * 4 > READOUT_CHUNK_BYTES


def hand_bytes(p: RunPlan, parallel: str, checkpointing: bool = False) -> float:
    """A hand estimate of one GPU process's memory (bf16 autocast): fp32 weights, gradients and
    AdamW state (sharded under FSDP, plus its gathered root and two blocks at bf16 with their
    fp32 gradients) and one micro-batch's activations (each block's input only under activation
    checkpointing). The memory model is experiments/memory.py's measurement; this stays only
    where none can run: the trainer's `auto_parallel` at start and gpu-check's layer slicing
    (a measurement per candidate would take minutes). It runs low at the paper's shapes."""
    from model.accounting import block_params
    from model.readout import READOUT_CHUNK_BYTES

    mc = p.model
    n = p.world_size if parallel == "fsdp" else 1
    total = M.param_count(mc)["total"]
    # FSDP2 shards every parameter on dim 0 and pads it to a multiple of the world size
    state = (4 + 4 + ADAMW_STATES * 4) * (total if n == 1 else _ceil_div(total, n))
    n_blocks = mc.n_layers + int(arms.of_model(mc.latent_bits).latent)  # the FT's encoder
    if parallel == "fsdp":
        state += (total - (n_blocks - 2) * block_params(mc)) * (2 + 4)
    D, F, kv = mc.dim, mc.ffn_dim, mc.n_kv_heads * mc.head_dim
    # per token and block: two fp32 RMSNorm inputs, then bf16 normed inputs, q, k, v, the
    # attention output and the SwiGLU's intermediates
    block = 2 * 4 * D + 2 * (4 * D + 2 * kv + 4 * F)
    readout = p.micro_batch_size * p.seq_len * (2 + 8) * mc.vocab_size  # logits, fp32, grad
    if chunked_loss(mc, p.micro_batch_size, p.seq_len):
        # one chunk's float32 logits, their exp and gradient, and the readout weight's float32
        # gradient, held from the forward to the backward (model/readout.py)
        readout = 2 * READOUT_CHUNK_BYTES + 4 * mc.vocab_size * mc.dim
    mapper = mc.mapper_chunk_bytes if n_blocks > mc.n_layers else 0  # the backward's dL/dG
    per_tok = n_blocks * 4 * D + block if checkpointing else n_blocks * block
    return state + p.micro_batch_size * p.seq_len * per_tok + readout + mapper


def gpu_time_estimate(p: RunPlan, n_gpus: int, peak_tflops: float, mfu: float) -> dict[str, Any]:
    """Wall time and GPU-hours of this plan's FLOPs on `n_gpus` at `mfu` of `peak_tflops`."""
    secs = p.flops / (n_gpus * peak_tflops * 1e12 * mfu)
    return {"seconds": secs, "gpu_hours": secs * n_gpus / 3600.0}


ASSUMED_MFU = 0.35
"""The MFU a GPU plan assumes when neither train.mfu nor a `make gpu-check RECIPE=..` measurement
on the planned GPU at the planned preset gives one (about what the paper's 1.5B run implies)."""


def recipe_checks(dirs: Iterable[Path]) -> Iterator[tuple[Path, dict[str, Any]]]:
    """(file, record) of each `make gpu-check RECIPE=..` record in `dirs`, by file name; other
    modes' and unreadable files are passed over (the one reader of these folders)."""
    for d in dirs:
        for path in sorted(d.glob("*.json")) if d.is_dir() else []:
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(doc, dict) and doc.get("mode") == "recipe":
                yield path, doc


def planned_mfu(cfg: TrainConfig) -> tuple[float, str]:
    """(MFU, where it comes from) for a GPU plan of `cfg`: train.mfu when set ("given"), else
    the newest passed `make gpu-check RECIPE=..` MFU (measured/gpu_check/ and
    <results>/gpu_check/) on a GPU whose name contains train.gpu_name at the planned preset,
    else ASSUMED_MFU ("assumed"). Other modes' and unreadable files are passed over."""
    t = cfg.train
    if t.mfu is not None:
        return t.mfu, "given (train.mfu)"
    ok = [(str(doc.get("created", "")), path, doc) for path, doc in
          recipe_checks(gpu_check_dirs(getattr(cfg.paths, "results", None)))
          if doc.get("passed") is True and doc.get("preset") == cfg.model.preset
          and t.gpu_name.lower() in str(doc.get("gpu", "")).lower()
          and isinstance(doc.get("mfu"), (int, float)) and 0.0 < doc["mfu"] <= 1.0]
    if not ok:
        return ASSUMED_MFU, (f"assumed: no make gpu-check RECIPE=.. measurement on {t.gpu_name} "
                             f"at preset {cfg.model.preset} (train.mfu sets one)")
    created, where, m = max(ok, key=lambda x: x[0])  # the newest (the first of equals)
    try:
        where = where.resolve().relative_to(Path(__file__).resolve().parents[2])
    except ValueError:
        pass
    sliced = " (layer-sliced model)" if m.get("layer_sliced") else ""
    return float(m["mfu"]), (f"measured by make gpu-check RECIPE={m.get('recipe')} on "
                             f"{m.get('n_gpus')} x {m.get('gpu')}{sliced}, {created}, {where}")


def paper_implied_mfu(seq_len: int | None = None) -> dict[str, Any]:
    """The MFU the paper's 1.5B baseline run implies: its training FLOPs (this module's count
    at the preset's context length) over 32 H100s x 12 h x the dense bf16 peak."""
    mc = M.PRESETS[PAPER_1P5B["preset"]]
    T = seq_len or mc.max_seq_len
    fpt = train_flops_per_token(mc, T).total
    flops = PAPER_1P5B["tokens"] * fpt
    avail = PAPER_1P5B["gpus"] * PAPER_1P5B["hours"] * 3600 * PAPER_1P5B["peak_tflops"] * 1e12
    six_n = 6 * M.param_count(mc)["total"]  # the usual 6N rule, attention not counted
    return {**PAPER_1P5B, "seq_len": T, "flops_per_token": fpt, "flops": flops,
            "mfu": flops / avail, "mfu_6n": PAPER_1P5B["tokens"] * six_n / avail}


def _gb(b: float) -> str:
    return f"{b / 1e9:.1f} GB"  # decimal, as GPU memory is quoted (H100: 80 GB)


def duration(s: float) -> str:
    """Seconds as the unit a reader takes in at a glance (s, min, h, days)."""
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 3 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"


def dry_parallel(cfg: TrainConfig, p: RunPlan, gpu_bytes: float | None = None) -> str:
    """The parallelism a run of this plan uses (the trainer's rule too): none on one process,
    train.parallel when given, else `auto_parallel` on GPUs of `gpu_bytes` (0: CPU, DDP)."""
    if p.world_size <= 1:
        return "none"
    if cfg.train.parallel != "auto":
        return str(cfg.train.parallel)
    if gpu_bytes == 0:
        return "ddp"
    return auto_parallel(p, gpu_bytes or cfg.train.gpu_memory_gb * 1e9,
                         cfg.train.activation_checkpointing)


def auto_parallel(p: RunPlan, gpu_bytes: float, checkpointing: bool = False) -> str:
    """`auto`'s choice for a world of p.world_size > 1 on GPUs of `gpu_bytes`: ddp when DDP's
    `hand_bytes`, activations included, fits FIT_FRACTION of a GPU, else fsdp."""
    from .parallel import FIT_FRACTION

    return "fsdp" if hand_bytes(p, "ddp", checkpointing) > FIT_FRACTION * gpu_bytes else "ddp"


WRITE_GBPS = 2.0
"""Aggregate write bandwidth (GB/s) the save-time estimate assumes unless the cluster file
states write_gbps: a parallel file system's share for one job, not a node's local disk."""


def checkpoint_bytes(p: RunPlan) -> dict[str, int]:
    """Bytes of one resumable checkpoint (fp32 weights + AdamW's two fp32 moments, whole or
    summed over FSDP's shards: the same total) and of the bf16 weights-only export."""
    n = p.params["total"]
    return {"full": 4 * n + ADAMW_STATES * 4 * n, "weights_fp32": 4 * n, "bf16_export": 2 * n}


def format_estimate(cfg: TrainConfig, p: RunPlan, parallel: str,
                    cpu_rate: tuple[float, str] | None = None) -> str:
    """The dry run's parallelism, memory, wall-time and GPU-hour lines (CPU: at `cpu_rate` =
    (tokens/s, its source)). Memory is measured (experiments/memory.py), not estimated here."""
    t = cfg.train
    lines = []
    if p.world_size > 1:
        line = f"parallel    {parallel} over {p.world_size} GPU(s)"
        if t.parallel == "auto":
            from .parallel import FIT_FRACTION

            need = hand_bytes(p, "ddp", t.activation_checkpointing)
            line += (f" (auto: by the hand estimate the trainer's rule uses at start, DDP "
                     f"would hold {_gb(need)} per GPU, "
                     f"{'over' if parallel == 'fsdp' else 'within'} {FIT_FRACTION:.0%} of "
                     f"{t.gpu_memory_gb:g} GB)")
        lines.append(line)
    lines.append("memory      measured per phase on fake tensors (experiments/memory.py) by "
                 "`make train DRY=1 OVERRIDES=<the run's>`, not by this plan")
    mfu, mfu_src = planned_mfu(cfg)
    g = gpu_time_estimate(p, p.world_size, t.gpu_peak_tflops, mfu)
    paper = paper_implied_mfu()
    lines.append(
        f"GPU time    {duration(g['seconds'])} on {p.world_size} GPU(s), "
        f"{g['gpu_hours']:.3g} GPU-hours, at MFU {mfu:.0%} of {t.gpu_peak_tflops:g} TFLOP/s "
        f"(train.gpu_peak_tflops); MFU {mfu_src}")
    lines.append(
        f"            beside it, the paper's 1.5B run (47B tokens, 32 H100 x 12 h) implies MFU "
        f"{paper['mfu_6n']:.0%} at 6N FLOPs/token, {paper['mfu']:.0%} with attention over "
        f"the full {paper['seq_len']}-token context ({paper['flops_per_token']:.3g} "
        f"FLOPs/token, this suite's count)")
    lines += checkpoint_lines(cfg, p)
    if cpu_rate is not None:
        tps, src = cpu_rate
        lines.append(f"CPU time    {duration(p.tokens / tps)} on this machine at "
                     f"{tps:,.0f} tokens/s ({src})")
    return "\n".join(lines)


def disk_bytes(cfg: TrainConfig, p: RunPlan, device_type: str | None = None
               ) -> dict[str, int]:
    """What a run of this plan writes under the results root at most: the rotated step
    checkpoints plus the one being written, the weights-only exports at the dtype the trainer
    writes on `device_type`, and the corpus when it is not built yet (a lower bound). The
    cluster check (sweeps/checks.py) sums the same per cell."""
    from .config import export_dtype

    ck = checkpoint_bytes(p)
    lg = cfg.logging
    dev = device_type or ("cpu" if str(cfg.train.device) == "cpu" else "cuda")
    export = ck["bf16_export"] if export_dtype(cfg, dev) == "bf16" else ck["weights_fp32"]
    runs = (lg.keep_checkpoints + 1) * ck["full"] + max(1, lg.keep_eval_checkpoints) * export
    corpus = 0
    if cfg.data.source not in GENERATED_SOURCES and not cfg.data.corpus:
        width = 2 if p.model.vocab_size <= 1 << 16 else 4
        corpus = int(p.tokens * width / max(1.0, float(cfg.data.max_epochs or 1)))
    return {"run": runs, "corpus": corpus, "total": runs + corpus}


def checkpoint_lines(cfg: TrainConfig, p: RunPlan) -> list[str]:
    """The dry run's checkpoint size, save time and disk lines."""
    ck = checkpoint_bytes(p)
    site = cluster_site()
    gbps = site["write_gbps"] if site else WRITE_GBPS
    src = f"write_gbps of {site['file']}" if site else "WRITE_GBPS; write_gbps in cluster.yaml"
    d = disk_bytes(cfg, p)
    root = (site or {}).get("results") or cfg.paths.results
    short = space_refusal(root, d["total"])
    return [
        f"checkpoint  {_gb(ck['full'])} each (fp32 weights {_gb(ck['weights_fp32'])} + AdamW "
        f"{_gb(ck['full'] - ck['weights_fp32'])}); bf16 weights-only export "
        f"{_gb(ck['bf16_export'])}; save ~{duration(ck['full'] / (gbps * 1e9))} at "
        f"{gbps:g} GB/s ({src})",
        f"disk        {_gb(d['total'])} under the results root: {cfg.logging.keep_checkpoints}+1 "
        f"step checkpoints (rotated, in flight), {max(1, cfg.logging.keep_eval_checkpoints)} "
        f"weights-only export(s) (kept for evaluation, the last {FINAL_CHECKPOINT})"
        + (f", the corpus {_gb(d['corpus'])}" if d["corpus"] else ""),
        f"            {'SHORT: ' + short if short else f'{root}: enough free space'}",
    ]


def _existing(path: str | os.PathLike) -> Path:
    """`path`, or its nearest existing ancestor (where its file system's figures are read)."""
    probe = Path(path).absolute()
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    return probe


def free_bytes(path: str | os.PathLike) -> int:
    """Free bytes on the file system of `path` (or of its nearest existing ancestor)."""
    import shutil

    return shutil.disk_usage(_existing(path)).free


def space_refusal(root: str | os.PathLike, need: int,
                  what: str = "the plan needs {need} (checkpoints, export, corpus)") -> str | None:
    """One line when the file system of `root` (or its nearest existing ancestor) has less
    free space than `need` bytes, else None. `what` says what needs it ({need}: the bytes)."""
    free = free_bytes(root)
    if free >= need:
        return None
    return (f"{root}: {_gb(free)} free on its file system, {what.format(need=_gb(need))}; "
            f"free space or set the results root elsewhere")


def start_refusal(cfg: TrainConfig, p: RunPlan, rd: Path) -> str | None:
    """The trainer's disk check before it writes anything (one line, or None): `disk_bytes`'
    run part less what its checkpoints already hold (a resume), plus an unbuilt corpus,
    against the results root's (and the cache's) file system."""
    from .data import built_manifest

    on_gpu = str(cfg.train.device) != "cpu" and torch.cuda.is_available()  # where it will run
    d = disk_bytes(cfg, p, "cuda" if on_gpu else "cpu")
    ck = RunDir(rd).checkpoints_dir
    held = sum(f.stat().st_size for f in ck.rglob("*") if f.is_file()) if ck.is_dir() else 0
    run = max(0, d["run"] - held)
    corpus = d["corpus"]
    if corpus:
        try:
            if built_manifest(cfg.data, cfg.model.vocab_size, cfg.paths.cache) is not None:
                corpus = 0
        except UsageError:
            corpus = 0  # a broken corpus: the trainer's corpus step says why, in one line
    root, cache = cfg.paths.results, cfg.paths.cache
    ckpts = ("checkpoints (logging.keep_checkpoints and keep_eval_checkpoints, the final "
             "export)")
    if corpus and _existing(root).stat().st_dev != _existing(cache).stat().st_dev:
        return (space_refusal(root, run, "this run still writes up to {need} of " + ckpts)
                or space_refusal(cache, corpus, "this run's corpus, built there, needs {need}"))
    return space_refusal(root, run + corpus, "this run still writes up to {need} of " + ckpts
                         + (" and its corpus" if corpus else ""))


# ---------------------------------------------------------------- the dry run
MEASURE_MAX_PARAMS = 100_000_000
"""The dry run times training steps on this CPU only for models up to this size."""


def cpu_throughput(cfg: TrainConfig, p: RunPlan, n: int = 3) -> tuple[float, str] | None:
    """This machine's training tokens/s: train.cpu_tokens_per_s, else measured over `n` steps
    (after a warm-up) on random tokens at the configured micro-batch on this process's threads."""
    if cfg.train.cpu_tokens_per_s:
        return cfg.train.cpu_tokens_per_s, "stated, train.cpu_tokens_per_s"
    if p.params["total"] > MEASURE_MAX_PARAMS:
        return None
    torch.manual_seed(0)
    model = M.build_model(p.model).train()
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


def epochs_line(cfg: TrainConfig, p: RunPlan) -> str:
    """The dry run's passes over the corpus (refused beyond data.max_epochs when it is built)."""
    from .data import built_manifest, check_epochs

    if cfg.data.source in GENERATED_SOURCES:
        return f"epochs      n/a ({cfg.data.source}: every sample is drawn fresh)"
    try:
        man = built_manifest(cfg.data, cfg.model.vocab_size, cfg.paths.cache)
        if man is None:
            # not built: the shipped corpora's text bounds their tokens (experiments.corpus
            # .budget), so a run that must read them too often is refused here already
            from experiments.corpus.budget import bound_refusal, check_budget

            line, refusal = bound_refusal(cfg.data, p.tokens // p.seq_len, p.seq_len)
            if cfg.data.source == "hf":  # each source's passes from its known size
                chk = check_budget(cfg.data, p.tokens)
                line, refusal = "\n".join([line, *chk.lines]), chk.refusal
            if refusal is not None:
                raise UsageError(refusal)
            return line
        n = man["tokens"]["train"]
        ep = check_epochs(cfg.data, p.tokens // p.seq_len, p.seq_len, n)
    except UsageError as e:
        raise UsageError(one_line(str(e))) from None
    return (f"epochs      {ep:.4g} passes over the corpus ({n:,} training tokens; "
            f"data.max_epochs={cfg.data.max_epochs:g})")


def dry_run(cfg: TrainConfig) -> None:
    """train.dry_run=true: print the plan and the estimates (rank 0), train nothing, at
    `planning_world`'s world."""
    rank = world()[0]
    n_world, source = planning_world(cfg)
    p = plan(cfg, n_world)
    if rank == 0:
        epochs = epochs_line(cfg, p)  # a refusal (too many passes) before anything is printed
        print(format_plan(cfg, p), flush=True)
        print(f"world       {n_world} GPU(s)/process(es), from {source}", flush=True)
        print(epochs, flush=True)
        on_cpu = cfg.train.device == "cpu" or (cfg.train.device == "auto"
                                               and not torch.cuda.is_available())
        rate = cpu_throughput(cfg, p) if on_cpu else None
        print(format_estimate(cfg, p, dry_parallel(cfg, p), rate), flush=True)
        if on_cpu and rate is None:
            print(f"CPU time    null: the model has more than {MEASURE_MAX_PARAMS:,} parameters "
                  "to time here; state train.cpu_tokens_per_s", flush=True)
