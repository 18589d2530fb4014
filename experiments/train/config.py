"""The typed config tree of training (hydra structured configs) and `compose()`.

Sections: model, data, optim, train, logging (+ paths). Every default lives in the dataclasses
here; `conf/train.yaml` only picks the model preset and the data source. A misspelled key or a
wrongly typed value fails at compose time, `__post_init__` names the allowed values, and the
model group's options are registered from `model.PRESETS`. The run-id hashes model, data, optim
and train, minus `NON_SEMANTIC_TRAIN_KEYS`.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore

from common.errors import UsageError
from common.text import one_line
from experiments.corpus.config import (  # noqa: F401 - the data section's home; re-exported
    DATA_SOURCES,
    GENERATED_SOURCES,
    Choice,
    DataConfig,
    DataSource,
    HFSource,
    check_positive,
)
from model import PRESETS, ModelConfig

CONF_DIR = Path(__file__).resolve().parent / "conf"


# each choice's members are its values (Choice: str enums, listed by OmegaConf on a bad value;
# `_check_override` refuses a bad one first, naming them)
Precision = Choice("Precision", "auto fp32 bf16", module=__name__)
Device = Choice("Device", "auto cpu cuda", module=__name__)
ComputeMatch = Choice("ComputeMatch", "none flops", module=__name__)
Parallel = Choice("Parallel", "auto ddp fsdp", module=__name__)
ExportDtype = Choice("ExportDtype", "auto bf16 fp32", module=__name__)
PRECISIONS = tuple(Precision)
# how the same maths is laid out over processes and memory, and what the dry run assumes:
# not part of the run-id
NON_SEMANTIC_TRAIN_KEYS = ("force", "dry_run", "device", "compile", "parallel",
                           "fsdp_replicas", "activation_checkpointing", "gpu_memory_gb",
                           "gpu_peak_tflops", "mfu", "gpu_name", "cpu_tokens_per_s",
                           "plan_world_size", "max_nonfinite_steps")
TRACKERS = ("none", "wandb", "trackio")
GPU_PEAK_TFLOPS: dict[str, float] = {
    "GH200": 989.0, "H200": 989.0, "H100": 989.0, "B200": 2250.0, "A100": 312.0, "L40S": 362.0,
    "L4": 121.0, "A10G": 70.0}
"""Dense bf16 peak TFLOP/s per GPU by a part of its device name (vendor datasheets, SXM where
there are variants; first match wins, so L40S is tried before L4): the MFU denominator of the
trainer and `make gpu-check`, and the planned peak of a recipe's GPU type."""


def gpu_peak_tflops(name: str) -> tuple[float | None, str]:
    """(dense bf16 peak TFLOP/s, where it comes from) of a GPU by its device or type name;
    (None, why) for one not in GPU_PEAK_TFLOPS (no MFU then, never 0)."""
    for key, v in GPU_PEAK_TFLOPS.items():
        if key.lower() in name.lower():
            return v, f"datasheet dense bf16 peak of {key}"
    return None, f"unknown GPU {name!r}: no bf16 peak in experiments/train/config.py"


AMOUNT_KEYS = ("train.tokens", "train.flops")
"""Keys that take a count with a suffix: 20k, 2M, 1.5G/1.5B, 1e6 (as sweeps' TOKENS does)."""
_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9, "t": 10**12, "p": 10**15}


def parse_amount(text: str | float | int | None, var: str) -> float | None:
    """'2e6', '500k', '3M', '1.5G' -> a positive number; '', 'null' or None -> None.
    ValueError naming `var` otherwise."""
    if text is None or (isinstance(text, str) and text.strip().lower() in ("", "null", "none")):
        return None
    s = str(text).strip().lower().replace("_", "")
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)([kmgbtp]?)", s)
    if not m:
        raise ValueError(f"{var}={text!r} is not a positive number (e.g. 2e6, 500k, 3M)")
    v = float(m.group(1)) * _SUFFIX[m.group(2)]
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{var}={text!r} must be > 0")
    return v


def _section(obj: Any) -> str:
    return {"DataConfig": "data", "OptimConfig": "optim", "LoopConfig": "train",
            "LoggingConfig": "logging", "HFSource": "data.hf_sources[]",
            "PathsConfig": "paths"}.get(type(obj).__name__, type(obj).__name__)


def _positive(obj: Any, *names: str, allow_zero: bool = False,
              allow_none: bool = False) -> None:
    check_positive(obj, *names, section=_section(obj), allow_zero=allow_zero,
                   allow_none=allow_none)


# ---------------------------------------------------------------- model
def _model_section() -> type:
    """ModelConfig's fields (same names, types, defaults) plus `preset`, as a mutable dataclass."""
    hints = typing.get_type_hints(ModelConfig)
    specs: list[tuple[str, Any, Any]] = [("preset", str, field(default="1M"))]
    for f in dataclasses.fields(ModelConfig):
        specs.append((f.name, hints[f.name], field(default=f.default)))
    ns = {"__doc__": "model.ModelConfig's fields + `preset` (the name it started from)."}
    return dataclasses.make_dataclass("ModelSection", specs, namespace=ns)


ModelSection = _model_section()


def model_config(section: Any) -> ModelConfig:
    """The frozen model.ModelConfig of a model section (ValueError on a bad value)."""
    d = {f.name: getattr(section, f.name) for f in dataclasses.fields(ModelConfig)}
    return ModelConfig(**d)


# ---------------------------------------------------------------- optim
@dataclass
class OptimConfig:
    lr: float = 1e-3
    """Peak learning rate (AdamW)."""
    min_lr_ratio: float = 0.1
    """Cosine decays to lr * min_lr_ratio at the last step."""
    warmup_steps: int | None = None
    """Linear warmup; None = 5% of the steps (at least 1)."""
    weight_decay: float = 0.1
    """Decoupled weight decay on matrices and embeddings (not on norms or zeta)."""
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    """Clip the global grad norm to this; 0 = no clipping."""

    def __post_init__(self) -> None:
        _positive(self, "lr", "eps")
        _positive(self, "weight_decay", "grad_clip", "min_lr_ratio", allow_zero=True)
        _positive(self, "warmup_steps", allow_zero=True, allow_none=True)
        for b in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, b) < 1.0:
                raise ValueError(f"optim.{b}={getattr(self, b)!r}: must be in [0, 1)")
        if self.min_lr_ratio > 1:
            raise ValueError(f"optim.min_lr_ratio={self.min_lr_ratio!r}: must be in [0, 1]")


# ---------------------------------------------------------------- train
@dataclass
class LoopConfig:
    seed: int = 0
    """Seeds the initialisation, the data order and every latent sample."""
    seq_len: int = 256
    """Tokens per training sequence (synthetic: forced to the task's length - 1)."""
    batch_size: int = 16
    """GLOBAL batch in sequences per optimizer step, whatever the number of processes."""
    micro_batch_size: int | None = None
    """Sequences per forward pass per process; grad accumulation = batch / (micro * world).
    None = batch_size / world (no accumulation)."""
    tokens: float | None = 2_000_000
    """Budget in training tokens (ignored when `flops` is set); a float so `5e6` works."""
    flops: float | None = None
    """Budget in training FLOPs (analytic, model.train_flops_per_token); wins over tokens."""
    compute_match: ComputeMatch = ComputeMatch.none
    """none | flops: a baseline trains for the FLOPs the matching Free Transformer (same config,
    latent_bits = match_latent_bits) spends on the budget."""
    match_latent_bits: int = 16
    """H of the Free Transformer a compute-matched baseline is matched to."""
    match_n_layers: int | None = None
    """Layers of the Free Transformer a compute-matched baseline is matched to (None: this
    model's own). Left out of the run-id while None."""
    device: Device = Device.auto
    """auto | cpu | cuda."""
    precision: Precision = Precision.auto
    """auto (bf16 autocast on CUDA, fp32 on CPU) | fp32 | bf16 (autocast to bfloat16 on
    whatever device trains: CUDA, or the CPU's own bf16 autocast)."""
    compile: bool = False
    """torch.compile each block and the encoder block, before DDP or FSDP2 (inductor; on CPU it
    needs a C++ compiler and about a minute cold); validation runs them eager."""
    parallel: Parallel = Parallel.auto
    """With several processes (torchrun): ddp | fsdp (FSDP2, one shard unit per block and for
    the encoder block) | auto (fsdp when DDP's 16 bytes per parameter exceed 80% of a GPU's
    memory, else ddp)."""
    fsdp_replicas: int = 0
    """FSDP across nodes: 0 = automatic (HSDP when the job spans several nodes of several GPUs);
    r >= 1 = r replica groups of world / r processes each (1 = 1-D FSDP)."""
    activation_checkpointing: bool = False
    """Recompute each block's activations in the backward (less memory, ~1/3 more compute)."""
    gpu_memory_gb: float = 80.0
    """Dry run: the memory of one GPU the per-GPU estimate is checked against (H100: 80)."""
    gpu_peak_tflops: float = 989.0
    """Dry run: one GPU's dense bf16 peak in TFLOP/s (H100 SXM: 989) for the wall-time estimate."""
    mfu: float | None = None
    """Dry run: the MFU of the GPU wall-time estimate; None = the newest `make gpu-check
    RECIPE=..` measurement on a train.gpu_name GPU at this preset, else ASSUMED_MFU."""
    gpu_name: str = "H100"
    """Dry run: the GPU planned for, as a part of its device name (H100, A100, H200): which
    `make gpu-check` measurements give train.mfu."""
    plan_world_size: int | None = None
    """Dry run: plan for this many GPUs/processes (e.g. 32) instead of this launch's world."""
    cpu_tokens_per_s: float | None = None
    """Dry run on CPU: a stated training throughput for this machine; None = measure a few
    steps of this model (models up to 100M parameters)."""
    max_nonfinite_steps: int = 3
    """A step whose loss or gradient norm is NaN/Inf is skipped and recorded; this many in a row
    stop the run (exit 1), at the first logging or validation step after the K-th."""
    force: bool = False
    """Retrain a finished run from scratch."""
    dry_run: bool = False
    """Print the plan (params, FLOPs, tokens, steps, batch) and exit before any compute."""

    def __post_init__(self) -> None:
        _positive(self, "seq_len", "batch_size")
        _positive(self, "micro_batch_size", "tokens", "flops", allow_none=True)
        _positive(self, "match_latent_bits")
        _positive(self, "match_n_layers", allow_none=True)
        _positive(self, "gpu_memory_gb", "gpu_peak_tflops")
        _positive(self, "cpu_tokens_per_s", "plan_world_size", allow_none=True)
        _positive(self, "max_nonfinite_steps")
        _positive(self, "fsdp_replicas", allow_zero=True)
        if self.mfu is not None and not 0.0 < self.mfu <= 1.0:
            raise ValueError(f"train.mfu={self.mfu!r}: must be in (0, 1]")
        if self.tokens is None and self.flops is None:
            raise ValueError("train.tokens and train.flops are both null: set one budget")
        if self.micro_batch_size is not None and self.batch_size % self.micro_batch_size:
            raise ValueError(f"train.micro_batch_size={self.micro_batch_size} must divide "
                             f"train.batch_size={self.batch_size}")


@dataclass
class LoggingConfig:
    log_every: int = 10
    """Write a train line to metrics.jsonl every this many steps (and at the last)."""
    val_every: int = 200
    """Validate every this many steps (and at the end); 0 = only at the end."""
    val_batch_size: int = 16
    ckpt_every: int = 200
    """Checkpoint every this many steps (and at the end)."""
    keep_checkpoints: int = 2
    """step_<N>.pt files kept (the newest ones)."""
    keep_eval_checkpoints: int = 0
    """Also keep n checkpoints evenly spaced by tokens, as eval_step_<N>.pt (N = ceil(k x steps
    / n), k = 1..n; the last is the final weights), outside the rotation, so a sweep can
    evaluate each; 0 = none."""
    export_dtype: ExportDtype = ExportDtype.auto
    """The dtype of the weights-only exports (final.pt, eval_step_<N>.pt) that evaluation and
    HF export read: auto (bf16 when training autocasts to bf16, i.e. on CUDA by default; fp32
    otherwise) | bf16 (half the file) | fp32. Step checkpoints stay fp32 (a resume is exact)."""
    progress: bool = True
    """tqdm progress bar with tokens/s and ETA."""
    tracker: str = "none"
    """none | wandb | trackio: also log the scalars there (optional packages). TensorBoard
    event files are always written under <run>/tb/ (offline)."""
    tracker_project: str = "freetransformer-bench"
    """The W&B / trackio project."""
    peak_tflops: float | None = None
    """One device's peak TFLOP/s for the MFU scalar; None = known GPUs' dense bf16 peak (H100:
    989), else no MFU (never 0)."""

    def __post_init__(self) -> None:
        _positive(self, "log_every", "ckpt_every", "val_batch_size", "keep_checkpoints")
        _positive(self, "val_every", "keep_eval_checkpoints", allow_zero=True)
        _positive(self, "peak_tflops", allow_none=True)
        if self.tracker not in TRACKERS:
            raise ValueError(f"logging.tracker={self.tracker!r}: allowed values "
                             f"{list(TRACKERS)}")


@dataclass
class PathsConfig:
    results: str = "${oc.env:FTBENCH_RESULTS,results}"
    """Results root; runs go to <results>/runs/<run-id>/."""
    cache: str = "${oc.env:FTBENCH_CACHE,${paths.results}/cache}"
    """Tokenizers and tokenized corpora, keyed by content."""


@dataclass
class TrainConfig:
    model: ModelSection = field(default_factory=lambda: ModelSection())  # type: ignore[valid-type]
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: LoopConfig = field(default_factory=LoopConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)


def trains_bf16(train: LoopConfig, device_type: str) -> bool:
    """bf16 autocast wherever torch has it (CUDA, and the CPU's own): train.precision=bf16,
    or auto on CUDA."""
    return train.precision == "bf16" or (train.precision == "auto" and device_type == "cuda")


def export_dtype(cfg: TrainConfig, device_type: str) -> str:
    """logging.export_dtype resolved for a run on `device_type`: "bf16" or "fp32" (auto: bf16
    when the run trains in bf16)."""
    d = str(cfg.logging.export_dtype)
    if d == "auto":
        return "bf16" if trains_bf16(cfg.train, device_type) else "fp32"
    return d


GROUPS: dict[str, type] = {"model": ModelSection, "data": DataConfig, "optim": OptimConfig,
                           "train": LoopConfig, "logging": LoggingConfig, "paths": PathsConfig}


def register() -> None:
    """Register the schema and the model presets with hydra's ConfigStore (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    for name, preset in PRESETS.items():
        cs.store(group="model", name=name, node=ModelSection(preset=name, **preset.to_dict()))


# ---------------------------------------------------------------- compose


def _check_override(ov: str) -> None:
    """Reject unknown groups, options and keys with the allowed values (hydra's own messages
    span several lines and do not always list them)."""
    if "=" not in ov:
        raise UsageError(f"override {ov!r} is not key=value")
    key, value = ov.split("=", 1)
    key = key.lstrip("+~")
    if ov.startswith(("+", "~")):
        raise UsageError(f"override {ov!r}: adding or deleting keys is not allowed; "
                          f"allowed sections: {sorted(GROUPS)}")
    parts = key.split(".")
    if parts[0] not in GROUPS:
        raise UsageError(f"unknown config section {parts[0]!r} in {ov!r}; allowed: "
                          f"{sorted(GROUPS)}")
    if len(parts) == 1:
        if parts[0] == "model" and value not in PRESETS:
            raise UsageError(f"unknown model preset {value!r}; allowed: {list(PRESETS)}")
        if parts[0] == "data" and value not in DATA_SOURCES:
            raise UsageError(f"unknown data source {value!r}; allowed: "
                              f"{[str(s) for s in DATA_SOURCES]}")
        if parts[0] not in ("model", "data"):
            raise UsageError(f"{parts[0]!r} is a section; set its keys, e.g. "
                              f"{parts[0]}.<key>=...; allowed keys: "
                              f"{sorted(GROUPS[parts[0]].__dataclass_fields__)}")
        return
    fields = GROUPS[parts[0]].__dataclass_fields__
    if parts[1] not in fields or len(parts) > 2:
        raise UsageError(f"unknown key {key!r}; allowed keys in {parts[0]}: {sorted(fields)}")
    kind = typing.get_type_hints(GROUPS[parts[0]]).get(parts[1])
    if isinstance(kind, type) and issubclass(kind, Choice) and value not in set(kind):
        raise UsageError(f"{key}={value!r}: allowed values {[str(v) for v in kind]}")


def _amount(ov: str) -> str:
    """`train.tokens=20k` -> `train.tokens=20000.0`: the same suffixes as sweeps' TOKENS."""
    key, eq, value = ov.partition("=")
    if not eq or key not in AMOUNT_KEYS:
        return ov
    try:
        v = parse_amount(value, key)
    except ValueError as e:
        raise UsageError(str(e)) from None
    return f"{key}={'null' if v is None else repr(v)}"


def compose(overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """Compose the typed config from experiments/train/conf + overrides (UsageError on bad
    input), with what the data source implies resolved (the config the run-id hashes)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from hydra.initialize import get_gh_backup, restore_gh_from_backup
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    overrides = [_amount(str(o)) for o in overrides]
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
        raise UsageError(one_line(msg + (f" (key {m.group(1)})" if m and m.group(1) not in msg
                                           else ""))) from None
    except ValueError as e:  # __post_init__ of a section
        raise UsageError(one_line(str(e))) from None
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
        raise UsageError(one_line(str(e))) from None
    if cfg.train.seq_len > mc.max_seq_len:
        raise UsageError(f"train.seq_len={cfg.train.seq_len} exceeds model.max_seq_len="
                          f"{mc.max_seq_len}; lower train.seq_len or raise model.max_seq_len")
    return cfg


# ---------------------------------------------------------------- help
def _attribute_docs(cls: type) -> dict[str, str]:
    """The docstrings under a dataclass's fields (the string literal after `name: type = ...`),
    read from its source with ast; fields without one are absent."""
    import ast
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for a, b in zip(body, body[1:], strict=False):
        if (isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name)
                and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)
                and isinstance(b.value.value, str)):
            docs[a.target.id] = one_line(b.value.value)
    return docs


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return "(required)"


def config_help() -> str:
    """Every config key with its default and docstring, generated from the dataclasses (the
    model section's docs are model.ModelConfig's)."""
    lines = ["usage: make train OVERRIDES=\"key=value ...\" [DRY=1] (python -m experiments.train "
             "key=value ...); the config keys, defaults in brackets:",
             f"Model presets: model={'|'.join(PRESETS)}; data sources: data="
             f"{'|'.join(str(s) for s in DATA_SOURCES)}. train.tokens and train.flops take "
             "suffixes: 20k, 2M, 1.5G, 1e6.", ""]
    for section, cls in GROUPS.items():
        docs = _attribute_docs(ModelConfig if cls is ModelSection else cls)
        if cls is ModelSection:
            docs["preset"] = "The preset the section started from (model=<preset>)."
        lines.append(f"[{section}]")
        for f in dataclasses.fields(cls):
            d = _default(f)
            d = str(d) if isinstance(d, Enum) else d
            lines.append(f"  {section}.{f.name} [{d!r}]")
            if docs.get(f.name):
                lines.append(f"      {docs[f.name]}")
        lines.append("")
    return "\n".join(lines)
