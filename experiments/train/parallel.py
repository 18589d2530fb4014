# experiments/train/parallel.py
"""Data parallelism for experiments/train/trainer.py: none (one process), DDP, or FSDP2 (HSDP
across nodes), and the sharded step checkpoints (DCP) that resume at any world size.

Compile (train.compile), one path for every parallelism, as torchtitan does: each block and the
encoder block is compiled in place before DDP wraps or FSDP2 shards the model, so the hooks stay
outside the graphs and overlap the backward (tests/test_compile.py). The post-sampler stays in
FSDP2's root unit on purpose: the binary mapper reads `post_sampler.weight` directly, so a unit
of its own would never be unsharded by a forward hook.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

DDP_BYTES_PER_PARAM = 16
"""fp32 weights + gradients + AdamW's two moments: what DDP keeps on every GPU."""
FIT_FRACTION = 0.8
"""auto picks FSDP when DDP's per-GPU memory (plan.auto_parallel) exceeds this share of a GPU."""


# ---------------------------------------------------------------- meta build, materialised
_INIT_OPS = {"normal_", "uniform_", "fill_", "zero_", "random_", "bernoulli_", "exponential_",
             "cauchy_", "log_normal_", "geometric_"}
"""In-place ops that overwrite a whole tensor without reading it: a parameter's value is its
last one, and replaying each on a fresh tensor of the same shape draws from the CPU generator
exactly as the original construction did."""


@dataclass
class InitRecipe:
    """What `build_on_meta` saw the constructor do to its parameters, in order: each value as
    made and each whole-tensor init op after it; the parameters' names; the buffers."""

    ops: list[tuple[Any, torch.Tensor, tuple[Any, ...], dict[str, Any], torch.Tensor | None]]
    """(op or None, meta parameter, args, kwargs, constructed value when op is None)."""
    names: dict[int, list[str]]
    """id(meta parameter) -> its names in the model (several for a tied parameter)."""
    buffers: dict[str, torch.Tensor]
    """The buffers' values as built (RoPE tables): to_empty does not keep them."""


class _RecordInit(TorchDispatchMode):
    """Records whole-tensor init ops on meta tensors; refuses any other in-place op on one (the
    replay would not know its value) and any init op on a real tensor (it would draw from the
    generator now, out of the replay's order)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[Any, torch.Tensor, tuple[Any, ...], dict[str, Any],
                             torch.Tensor | None]] = []

    def value(self, target: torch.Tensor, value: torch.Tensor) -> None:
        self.ops.append((None, target, (), {}, value))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        target = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if target is not None and name.endswith("_") and not name.startswith("_"):
            meta = target.device.type == "meta"  # (a fake tensor's own device, not is_meta)
            if name not in _INIT_OPS and meta:
                raise NotImplementedError(f"build_on_meta: {name} on a parameter cannot be "
                                          "replayed (only whole-tensor init ops can)")
            if name in _INIT_OPS:
                if not meta:
                    raise NotImplementedError(f"build_on_meta: {name} on a real tensor during "
                                              "construction would draw out of the replay's order")
                # a whole overwrite: the constructed value it replaces is never read (dropped
                # now, so at most one constructed tensor is held at a time)
                self.ops = [o for o in self.ops if not (o[0] is None and o[1] is target)]
                self.ops.append((func, target, tuple(args[1:]), dict(kwargs), None))
        return func(*args, **kwargs)


def build_on_meta(cfg: Any, build: Any = None) -> tuple[nn.Module, InitRecipe]:
    """`model.build_model(cfg)` with every parameter on the meta device and buffers real, and
    the recipe `materialize` replays (torch has no deferred init that keeps the CPU generator's
    order). Checkpointing, compile and fully_shard work on the meta model before `materialize`."""
    if build is None:
        from model import build_model as build

    register = nn.Module.register_parameter
    rec = _RecordInit()

    def to_meta(mod: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            value = param.detach()
            param = nn.Parameter(value.to("meta"), requires_grad=param.requires_grad)
            rec.value(param, value)  # its value unless a whole-tensor init op follows
        register(mod, name, param)

    from torch._guards import active_fake_mode

    # no constructor may draw from the CPU generator outside the recorded ops (under a
    # FakeTensorMode, as experiments/memory.py builds, nothing draws: no check)
    rng = torch.get_rng_state() if active_fake_mode() is None else None
    nn.Module.register_parameter = to_meta  # type: ignore[method-assign]
    try:
        with rec:
            model = build(cfg)
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]
    if rng is not None and not torch.equal(rng, torch.get_rng_state()):
        raise NotImplementedError("build_on_meta: the constructor drew from the CPU generator "
                                  "outside the recorded init ops")
    names: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(n)
    live = {id(p) for p in model.parameters()}
    # the values of parameters no longer in the model (a Linear's readout replaced by the tied
    # embedding) are never needed: only ops draw from the generator
    ops = [o for o in rec.ops if o[0] is not None or id(o[1]) in live]
    missing = live - {id(t) for _, t, _, _, _ in ops}
    if missing:  # a parameter made on the meta device by the constructor itself
        raise NotImplementedError(f"build_on_meta: {len(missing)} parameter(s) have no value "
                                  "or init op to replay")
    bufs = {n: b.detach().clone() for n, b in model.named_buffers()}
    return model, InitRecipe(ops, names, bufs)


def materialize(model: nn.Module, recipe: InitRecipe, device: torch.device) -> None:
    """Allocate the meta model's parameters (FSDP2: this rank's shards) and buffers on `device`
    and replay `recipe` on the CPU generator in order, one full parameter on the host at a time;
    an op whose parameter is overwritten later or was dropped (a tied readout) is replayed on a
    scratch tensor for its draws only."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    last: dict[int, int] = {id(t): i for i, (_, t, _, _, _) in enumerate(recipe.ops)}
    if any(isinstance(q, DTensor) for q in model.parameters()):
        model.to_empty(device=device)  # FSDP2 allocates its padded shards (and keeps ties)
    else:  # what to_empty does, one Parameter per meta parameter: a tied one stays tied
        new: dict[int, nn.Parameter] = {}
        for mod in model.modules():
            for n, q in list(mod.named_parameters(recurse=False)):
                if id(q) not in new:
                    new[id(q)] = nn.Parameter(torch.empty_like(q, device=device),
                                              requires_grad=q.requires_grad)
                setattr(mod, n, new[id(q)])
    with torch.no_grad():
        for n, b in recipe.buffers.items():
            mod_name, _, attr = n.rpartition(".")
            setattr(model.get_submodule(mod_name), attr, b.to(device, copy=True))
        for i, (func, t, args, kwargs, value) in enumerate(recipe.ops):
            if func is None:
                full = value
            else:
                full = torch.empty(t.shape, dtype=t.dtype)  # on the CPU: its generator, its draws
                func(full, *args, **kwargs)
            group = recipe.names.get(id(t))
            if last[id(t)] != i or group is None:
                continue  # overwritten later, or no longer in the model: its draws only
            p = model.get_parameter(group[0])
            if isinstance(p, DTensor):  # this rank's shard of the full value, no collective
                p.copy_(distribute_tensor(full, p.device_mesh, p.placements,
                                          src_data_rank=None))
            else:
                p.copy_(full)
            del full


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


def hsdp_shape(world: int, replicate: int | None = None,
               local: int | None = None) -> tuple[int, int] | None:
    """(replicas, shards) of the 2-D HSDP mesh, or None for 1-D FSDP over the world.
    replicate=None: automatic, HSDP when the world spans several nodes (`local` below it and
    dividing it) of several processes each; replicate=r: r groups of world/r processes."""
    if replicate is None:
        if local is None:
            local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        if 1 < local < world and world % local == 0:
            return world // local, local
        return None
    if (not isinstance(replicate, int) or isinstance(replicate, bool) or replicate < 1
            or world % replicate):
        raise ValueError(f"HSDP replicas={replicate!r} must be a positive integer that divides "
                         f"the world size {world}")
    return None if replicate == 1 else (replicate, world // replicate)


def mesh_for(device: torch.device, world: int, replicate: int | None = None,
             local: int | None = None) -> Any:
    """The data-parallel DeviceMesh of `world` processes: 1-D ("dp_shard"), or 2-D
    ("dp_replicate", "dp_shard") for HSDP; `local`: processes per node where torchrun does not
    say. Built outside any FakeTensorMode."""
    from torch.distributed.device_mesh import init_device_mesh

    shape = hsdp_shape(world, replicate, local)
    if shape is None:
        return init_device_mesh(device.type, (world,), mesh_dim_names=("dp_shard",))
    return init_device_mesh(device.type, shape, mesh_dim_names=("dp_replicate", "dp_shard"))


def shard(model: nn.Module, device: torch.device, world: int, *, mesh: Any = None,
          bf16: bool | None = None, replicate: int | None = None) -> Any:
    """FSDP2 in place: a unit per block and for the encoder block, the root for the rest (build
    the optimizer after it). `mesh` default `mesh_for(...)`; `bf16`: bf16 all-gathers with fp32
    gradient reduction (default: on CUDA). Returns the mesh."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = mesh_for(device, world, replicate) if mesh is None else mesh
    if bf16 is None:
        bf16 = device.type == "cuda"
    # bf16 compute and all-gathers on GPUs, gradients reduced in fp32; CPU stays fp32
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if bf16 else MixedPrecisionPolicy())
    for m in _units(model):
        fully_shard(m, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return mesh


def describe_mesh(mesh: Any) -> str:
    """'HSDP: 2 replicas x 4 shards' for a 2-D mesh, 'FSDP over 8' for a 1-D one (a log line)."""
    if mesh.ndim == 2:
        return f"HSDP: {mesh.shape[0]} replicas x {mesh.shape[1]} shards"
    return f"FSDP over {mesh.size()}"


def ddp(fwd: nn.Module, device: torch.device) -> nn.Module:
    """DDP whose reduction buckets are the gradients themselves (no second copy: the dry
    run's memory estimate counts 4 bytes of gradient per parameter)."""
    return nn.parallel.DistributedDataParallel(
        fwd, device_ids=[device.index] if device.type == "cuda" else None,
        gradient_as_bucket_view=True)


FSDP_REDUCE_EVERY_MICRO_BATCH = True
"""FSDP2 reduce-scatters the gradients after every micro-batch (torchtitan's way), so a rank
holds only its gradient shard between micro-batches; False keeps every unsharded fp32 gradient
for the whole step (+4 bytes per parameter per GPU, 30 GB at 8B: `python -m dev.memory
model=8B ... --fsdp-sync both`)."""


@contextlib.contextmanager
def accumulate(fwd: nn.Module, mode: str, last: bool) -> Iterator[None]:
    """DDP: all-reduce on a step's last micro-batch only. FSDP: reduce-scatter after every
    micro-batch (FSDP_REDUCE_EVERY_MICRO_BATCH); under HSDP the all-reduce across replicas runs
    on the last micro-batch only."""
    if mode == "ddp" and not last:
        with fwd.no_sync():  # type: ignore[operator]
            yield
    elif mode == "fsdp":
        sync = last or FSDP_REDUCE_EVERY_MICRO_BATCH
        fwd.set_requires_gradient_sync(sync)  # type: ignore[operator]
        if sync and not last:  # (1-D FSDP has no all-reduce: the call changes nothing there)
            fwd.set_requires_all_reduce(False)  # type: ignore[operator]
        yield
    else:
        yield


def compile_units(model: nn.Module) -> None:
    """torch.compile each block and the encoder block in place (names unchanged), and on CUDA
    the chunked loss's per-chunk work; call it before `ddp` or `shard`."""
    for m in _units(model):
        m.compile()
    if hasattr(model, "compile_loss"):
        model.compile_loss = True


def as_tensor(x: torch.Tensor) -> torch.Tensor:
    """A gradient norm (maybe a DTensor) as a plain tensor on its device, no host sync."""
    full = getattr(x, "full_tensor", None)
    return full() if callable(full) else x


# ---------------------------------------------------------------- sharded checkpoints (DCP)
def training_state(model: nn.Module, opt: torch.optim.Optimizer,
                   share: tuple[int, int] | None = None) -> dict[str, Any]:
    """{"model", "optim"} keyed by parameter name for torch.distributed.checkpoint: this rank's
    shards under FSDP, full tensors otherwise; not a collective. `share=(rank, world)` (DDP
    saves): only the parameters this rank owns (`owned_names`), so each writes 1/world."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if not opt.state:  # before the first step: get_state_dict would run a zero-lr AdamW step
        sd: dict[str, Any] = {"model": get_model_state_dict(model)}  # to make a state
    else:
        msd, osd = get_state_dict(model, opt)
        sd = {"model": msd, "optim": osd}
    if share is None:
        return sd
    def nbytes(v: Any) -> int:
        if isinstance(v, torch.Tensor):
            return v.numel() * v.element_size()
        return sum(map(nbytes, v.values())) if isinstance(v, dict) else 0

    optim = sd.get("optim", {}).get("state", {})
    # a parameter's weight and its AdamW moments go to one rank: weigh them together
    own = owned_names({k: nbytes(v) + nbytes(optim.get(k, {})) for k, v in sd["model"].items()},
                      *share)
    sd["model"] = {k: v for k, v in sd["model"].items() if k in own}
    if "optim" in sd:
        sd["optim"] = {**sd["optim"],
                       "state": {k: v for k, v in sd["optim"]["state"].items() if k in own}}
    return sd


def owned_names(sizes: dict[str, int], rank: int, world: int) -> set[str]:
    """The names (of a state dict, with their bytes) that `rank` of `world` saves under DDP,
    balanced by bytes (largest first to the lightest rank), the same on every rank."""
    load = [0] * world
    own: set[str] = set()
    for k, size in sorted(sizes.items(), key=lambda x: (-x[1], x[0])):
        r = min(range(world), key=lambda i: (load[i], i))
        load[r] += size
        if r == rank:
            own.add(k)
    return own


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


def full_weights(model: nn.Module, mode: str, main: bool = True) -> dict[str, torch.Tensor]:
    """The full model weights on CPU on the writing rank (`main`), {} on the others: an
    all-gather under FSDP (every rank calls it); otherwise only `main` copies."""
    if mode != "fsdp":
        if not main:
            return {}
        m = getattr(model, "module", model)
        return {k: v.detach().cpu() for k, v in m.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
