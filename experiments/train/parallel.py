# experiments/train/parallel.py
"""Data parallelism for experiments/train/trainer.py: none (one process), DDP, or FSDP2.

    resolve(mode, world, device, n_params) -> "none" | "ddp" | "fsdp"
    checkpoint_blocks(model)        activation checkpointing per block (train.activation_...)
    shard(model, device, world)     FSDP2 in place (before the optimizer is built)
    ddp(fwd, device)                DistributedDataParallel
    accumulate(fwd, mode, last)     context: gradient sync only on a step's last micro-batch
    gather_state(model, opt, mode)  -> (model state or None, optimizer state, format); collective
                                    under FSDP: every rank calls it, rank 0 writes the result
    load_optimizer(model, opt, state, fmt, mode)   (both: the old single-file checkpoints)
    training_state(model, opt)      {"model", "optim"} for torch.distributed.checkpoint (sharded)
    load_training_state(model, opt, path)   any world size's DCP directory; every rank calls it
    full_weights(model, mode)       full weights on CPU for the weights-only export (collective)
    load_full_weights(model, weights, mode)
    as_float(x)                     a gradient norm (maybe a DTensor) as a Python float
    as_tensor(x)                    the same as a plain tensor on its device (no host sync)
    compile_units(model)            torch.compile each block in place (FSDP: before sharding)

Compile order (train.compile): DDP wraps first and torch.compile wraps the DDP module, so the
compiled graph is split at DDP's buckets and gradient all-reduces overlap the backward; under
FSDP each block is compiled before `shard` and FSDP2's hooks stay outside the graphs.

FSDP is FSDP2 (`torch.distributed.fsdp.fully_shard`): one unit per transformer block, one for the
Free Transformer's encoder block, and the root unit for the rest (embeddings, readout, zeta, the
encoder readout and the post-sampler). The post-sampler stays in the root unit on purpose: the
Free Transformer reads `post_sampler.weight` directly (the binary mapper's custom autograd
function gathers its columns) instead of calling the Linear, so a unit of its own would never be
unsharded by a forward hook. The root unit is unsharded for the whole forward, so the mapper sees
a full (D, 2^H) tensor; its parameters, gradients and AdamW state are still sharded at rest.

Step checkpoints are sharded with torch.distributed.checkpoint (DCP): each rank writes its own
shards of the weights and AdamW state (`training_state`), and DCP reshards on load, so a resume
runs at any world size (`load_training_state`). Only the weights-only export (eval steps and
final.pt) is gathered on rank 0 (`full_weights`). Old single-file checkpoints stored the
optimizer state keyed by parameter name ("fqn") under FSDP, by index ("ids") otherwise; either
still loads under either mode (`gather_state`/`load_optimizer`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

MODES = ("auto", "ddp", "fsdp")
DDP_BYTES_PER_PARAM = 16
"""fp32 weights + gradients + AdamW's two moments: what DDP keeps on every GPU."""
FIT_FRACTION = 0.8
"""auto picks FSDP when DDP's weights and optimizer state alone exceed this share of a GPU."""


def resolve(mode: str, world: int, device: torch.device, n_params: int) -> str:
    """The parallelism actually used. One process: none. auto: DDP unless its per-GPU state
    (16 bytes per parameter) exceeds 80% of the GPU's memory; on CPU auto is DDP."""
    if mode not in MODES:
        raise ValueError(f"train.parallel={mode!r}: allowed values {list(MODES)}")
    if world <= 1:
        return "none"
    if mode != "auto":
        return mode
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        if DDP_BYTES_PER_PARAM * n_params > FIT_FRACTION * total:
            return "fsdp"
    return "ddp"


def _units(model: nn.Module) -> list[nn.Module]:
    """The modules sharded as units of their own: each block, and the FT's encoder block."""
    units = list(getattr(model, "blocks", []))
    enc = getattr(model, "encoder", None)
    if isinstance(enc, nn.Module):
        units.append(enc)
    return units


def checkpoint_blocks(model: nn.Module) -> None:
    """Activation checkpointing per block (the encoder block too): recompute in backward.
    The composable form keeps parameter names, so checkpoints do not change."""
    from torch.distributed._composable import checkpoint

    for m in _units(model):
        checkpoint(m)


def shard(model: nn.Module, device: torch.device, world: int) -> None:
    """FSDP2 in place: a unit per block and for the encoder block, the root for the rest.
    The parameters become sharded DTensors: build the optimizer after this call."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (world,))
    # bf16 compute and all-gathers on GPUs, gradients reduced in fp32; CPU stays fp32
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if device.type == "cuda" else MixedPrecisionPolicy())
    for m in _units(model):
        fully_shard(m, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)


def ddp(fwd: nn.Module, device: torch.device) -> nn.Module:
    """DDP whose reduction buckets are the gradients themselves (no second copy: the dry
    run's memory estimate counts 4 bytes of gradient per parameter)."""
    return nn.parallel.DistributedDataParallel(
        fwd, device_ids=[device.index] if device.type == "cuda" else None,
        gradient_as_bucket_view=True)


@contextlib.contextmanager
def accumulate(fwd: nn.Module, mode: str, last: bool) -> Iterator[None]:
    """Reduce gradients across processes only on the last micro-batch of a step."""
    if mode == "ddp" and not last:
        with fwd.no_sync():  # type: ignore[operator]
            yield
    elif mode == "fsdp":
        fwd.set_requires_gradient_sync(last)  # type: ignore[operator]
        yield
    else:
        yield


def compile_units(model: nn.Module) -> None:
    """torch.compile each sharding unit in place (`Module.compile`: names unchanged)."""
    for m in _units(model):
        m.compile()


def as_tensor(x: torch.Tensor) -> torch.Tensor:
    """A gradient norm (maybe a DTensor) as a plain tensor on its device, no host sync."""
    full = getattr(x, "full_tensor", None)
    return full() if callable(full) else x


def as_float(x: torch.Tensor) -> float:
    full = getattr(x, "full_tensor", None)  # a DTensor (FSDP's clip_grad_norm_)
    return float(full() if callable(full) else x)


# ---------------------------------------------------------------- checkpoints
def _named_ids(model: nn.Module, opt: torch.optim.Optimizer) -> list[list[str]]:
    """Per parameter group, the names of its parameters in the optimizer's order."""
    name = {id(p): n for n, p in model.named_parameters()}
    return [[name[id(p)] for p in g["params"]] for g in opt.param_groups]


def _ids_to_fqn(state: dict[str, Any], names: list[list[str]]) -> dict[str, Any]:
    by_id = {i: n for g, ns in zip(state["param_groups"], names, strict=True)
             for i, n in zip(g["params"], ns, strict=True)}
    return {"state": {by_id[i]: v for i, v in state["state"].items()},
            "param_groups": [{**g, "params": [by_id[i] for i in g["params"]]}
                             for g in state["param_groups"]]}


def _fqn_to_ids(state: dict[str, Any], names: list[list[str]]) -> dict[str, Any]:
    ids: dict[str, int] = {}
    for ns in names:
        for n in ns:
            ids[n] = len(ids)
    return {"state": {ids[n]: v for n, v in state["state"].items()},
            "param_groups": [{**g, "params": [ids[n] for n in g["params"]]}
                             for g in state["param_groups"]]}


def gather_state(model: nn.Module, opt: torch.optim.Optimizer, mode: str
                 ) -> tuple[dict[str, Any] | None, dict[str, Any], str]:
    """(model state dict, or None to take model.state_dict(); optimizer state; its format).
    Under FSDP this all-gathers: call it on every rank."""
    if mode != "fsdp":
        return None, opt.state_dict(), "ids"
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    msd = get_model_state_dict(model, options=full)
    osd = get_optimizer_state_dict(model, opt, options=full)
    return msd, osd, "fqn"


def load_optimizer(model: nn.Module, opt: torch.optim.Optimizer, state: dict[str, Any],
                   fmt: str, mode: str) -> None:
    """Load a checkpoint's optimizer state whatever mode and world size wrote it."""
    names = _named_ids(model, opt)
    if mode != "fsdp":
        opt.load_state_dict(_fqn_to_ids(state, names) if fmt == "fqn" else state)
        return
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_optimizer_state_dict,
    )

    fqn = state if fmt == "fqn" else _ids_to_fqn(state, names)
    set_optimizer_state_dict(model, opt, fqn, options=StateDictOptions(full_state_dict=True))


# ---------------------------------------------------------------- sharded checkpoints (DCP)
def training_state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """{"model", "optim"} keyed by parameter name, as torch.distributed.checkpoint saves it:
    each rank holds only its shards under FSDP (DTensors), the full tensors otherwise (DCP
    writes a replicated tensor once). Not a collective."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if not opt.state:  # before the first step: get_state_dict would run a zero-lr AdamW step
        return {"model": get_model_state_dict(model)}  # to make a state, moving `step` to 1
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd}


def load_training_state(model: nn.Module, opt: torch.optim.Optimizer, path: str,
                        process_group: Any = None) -> None:
    """Load a DCP checkpoint directory written at any world size into this process' model and
    optimizer (DCP reads only the slices this rank holds). Every rank calls it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    saved = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    if not any(k.startswith("optim.") for k in saved):  # saved before the first step
        msd = {"model": get_model_state_dict(model)}
        dcp.load(msd, checkpoint_id=path, process_group=process_group)
        set_model_state_dict(model, msd["model"])
        return
    sd = training_state(model, opt)
    if "optim" not in sd:  # this optimizer is fresh: let DCP build its state to load into
        from torch.distributed.checkpoint.state_dict import get_state_dict

        sd = dict(zip(("model", "optim"), get_state_dict(model, opt), strict=True))
    dcp.load(sd, checkpoint_id=path, process_group=process_group)
    set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])


def full_weights(model: nn.Module, mode: str) -> dict[str, torch.Tensor]:
    """The full model weights on CPU (what a weights-only export holds): an all-gather under
    FSDP, so every rank calls it; the optimizer state is not touched."""
    if mode != "fsdp":
        m = getattr(model, "module", model)
        return {k: v.detach().cpu() for k, v in m.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_weights(model: nn.Module, weights: dict[str, torch.Tensor], mode: str) -> None:
    """Load full (unsharded) weights, e.g. an old single-file checkpoint's, into a model that
    may already be sharded. Every rank calls it with the same `weights`."""
    if mode != "fsdp":
        getattr(model, "module", model).load_state_dict(weights)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True))
