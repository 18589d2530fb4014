"""Measured per-GPU peak memory of every phase of a run, at the real shape, without the hardware
(`measure`: one PhasePeak per phase; `make train DRY=1` prints them, `main`).

As torchtitan's scripts/estimate/estimation.py: a fake process group of the planned world size,
FakeTensors, and torch's own trackers (`torch.distributed._tools`: FSDPMemTracker under FSDP2,
MemTracker otherwise) counting what rank 0 allocates while each phase runs the trainer's and the
evaluator's own code (train: `Trainer.train_step` with AdamW's moments allocated; validation:
`trainer.evaluate`; eval: `FTBenchLM.loglikelihood_pairs` on one fp32 whole model; save:
`parallel.training_state` and `parallel.full_weights`). device_type "cuda" models a GPU run's
dtypes (bf16 autocast, FSDP2's bf16 all-gathers). Not seen: the CUDA context and NCCL's buffers
(about 1-3 GB per GPU), allocator fragmentation and kernels' workspaces (`make gpu-check`
measures them). A step's peak does not change after its second micro-batch, so
`accum_measured` (default 3: first, one middle, last) runs only those.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from common.errors import cli
from experiments.train import parallel as par
from experiments.train.config import TrainConfig, compose, export_dtype, trains_bf16
from experiments.train.plan import (
    RunPlan,
    chunked_loss,
    dry_parallel,
    plan,
    planning_local,
    planning_world,
)

PHASES = ("train", "validation", "eval", "save")
GB = 1e9  # decimal, as GPU memory is quoted (H100: 80 GB)


@dataclass(frozen=True)
class PhasePeak:
    """The measured peak of one phase on one process (rank 0) of the planned world."""

    phase: str
    """train | validation | eval | save."""
    parallel: str
    """none | ddp | fsdp (eval: none, one whole model per GPU)."""
    world_size: int
    micro_batch_size: int
    grad_accum: int
    """The plan's micro-batches per step (`accum_measured` of them were run)."""
    rows: int
    """Sequences in the phase's batch (train: the micro-batch; save: 0)."""
    seq_len: int
    device_type: str
    """What was modelled: "cuda" (a GPU's dtypes on fake tensors) or "cpu"."""
    bf16: bool
    """bf16 autocast (and FSDP2's bf16 all-gathers) modelled."""
    peak_bytes: int
    """Peak of the tracked device memory of this process during the phase."""
    by_kind: dict[str, int] = field(default_factory=dict)
    """The tracker's categories at that peak (parameters, gradients, optimizer state, ...)."""
    resident_bytes: int = 0
    """Of the tracked memory, what was held when the phase began (weights, AdamW state, DDP's
    buckets; evaluation: the weights)."""
    host_bytes: int | None = None
    """Host memory the phase adds on this process (save: the DCP staging copy and, on rank 0,
    the weights-only export); None where the phase holds nothing on the host."""
    arm: str = ""
    params: int = 0
    accum_measured: int = 0
    fsdp_reduce_every: bool | None = None
    """FSDP2 only: gradients reduce-scattered after every micro-batch (False: last only)."""
    seconds: float = 0.0
    """CPU time this phase's measurement took here (process time: what a busy machine's wall
    clock would inflate)."""
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------- fake world and trackers
@contextlib.contextmanager
def fake_world(world: int) -> Iterator[None]:
    """A default process group of `world` ranks, this process rank 0, over torch's fake backend
    (collectives return at once with tensors of the right shapes). Refuses to replace a real
    process group."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("memory.measure needs its own (fake) process group; call it outside "
                           "a distributed run")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


class _Scalars(TorchDispatchMode):
    """A fake tensor has no value: `float(t)`, `int(t)`, `bool(t)` and `.tolist()` (which the
    phases' bookkeeping calls) read 0 of the tensor's type. Only the memory is measured."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # DTensor first: its local ops come back through here
        if func is torch.ops.aten._local_scalar_dense.default:
            t = args[0]
            return False if t.dtype == torch.bool else (0.0 if t.is_floating_point() else 0)
        return func(*args, **(kwargs or {}))


def _trackers() -> tuple[type, type]:
    """MemTracker and FSDPMemTracker that allow the root module to run again in one tracked
    region (micro-batches, the FT's two validation passes): the module-wise statistics of the
    previous call are dropped (only the peak is read here); torch's raise otherwise."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed._tools.mod_tracker import ModTracker
    from torch.utils._pytree import tree_map_only

    class Mods(ModTracker):
        def _fw_pre_hook(self, mod: torch.nn.Module, input: Any) -> None:
            if not torch.is_grad_enabled():
                # no backward follows: hide requires_grad from the inputs, or torch's hook fails
                # on a no_grad view of a parameter (the FT's zeta.expand), "Expected gradient
                # function to be set"; the storages are the same
                input = tree_map_only(torch.Tensor, lambda t: t.detach(), input)
            super()._fw_pre_hook(mod, input)

    class Mem(MemTracker):
        def __init__(self) -> None:
            super().__init__()
            self._mod_tracker = Mods()

        def _pre_fw_hook(self, module: torch.nn.Module, inputs: Any) -> None:
            name = self._mod_tracker.get_known_fqn(module)
            if (module in self.memory_tracking and not self._mod_tracker.is_bw
                    and self._mod_tracker.parents - {name} == {"Global"}):
                self.reset_mod_stats()
            super()._pre_fw_hook(module, inputs)

    class FSDPMem(FSDPMemTracker):
        def __init__(self, mod: torch.nn.Module, optm: Any = None) -> None:
            super().__init__(mod, optm)
            self._mod_tracker = Mods()

        def _fsdp_state_pre_forward(self, fsdp_mod: Any, orig: Any) -> Any:
            inner = super()._fsdp_state_pre_forward(fsdp_mod, orig)

            def wrapped(*args: Any, **kwargs: Any) -> Any:
                if (fsdp_mod is self._root_mod and fsdp_mod in self.memory_tracking
                        and not self._mod_tracker.is_bw):
                    self.reset_mod_stats()
                return inner(*args, **kwargs)

            return wrapped

    return Mem, FSDPMem


def _peak(tracker: Any) -> tuple[int, dict[str, int]]:
    """(total, by category) of the tracker's peak on the one device it saw."""
    snap = tracker.get_tracker_snapshot("peak")
    if not snap:
        return 0, {}
    dev = max(snap, key=lambda d: snap[d]["Total"])
    kinds = {(k.value if hasattr(k, "value") else str(k)): int(v) for k, v in snap[dev].items()
             if k != "Total" and v}
    return int(snap[dev]["Total"]), kinds


def _current(tracker: Any) -> int:
    snap = tracker.get_tracker_snapshot("current")
    return int(sum(s["Total"] for s in snap.values()))


def _storage(t: torch.Tensor) -> int:
    """A storage's identity (its C++ object: a fake tensor's data pointer is 0 for all)."""
    return int(t.untyped_storage()._cdata)


def _nbytes(x: Any) -> int:
    """Bytes of the tensors in a (nested) state dict, each storage once (a DTensor: its local
    shard, what this rank holds)."""
    seen: set[tuple[int, int]] = set()
    total = 0

    def walk(v: Any) -> None:
        nonlocal total
        if isinstance(v, DTensor):
            v = v.to_local()
        if isinstance(v, torch.Tensor):
            key = (_storage(v), v.storage_offset())
            if key not in seen:
                seen.add(key)
                total += v.numel() * v.element_size()
        elif isinstance(v, dict):
            for w in v.values():
                walk(w)
        elif isinstance(v, (list, tuple)):
            for w in v:
                walk(w)

    walk(x)
    return total


# ---------------------------------------------------------------- stand-ins for the data
class _Batches:
    """The training data's `get(start, n)` and the validation set's `val_batches(bs)`: fresh
    (n, T) int64 tensors each call, as the real loaders hand over."""

    def __init__(self, vocab: int, seq_len: int, val_rows: int, on_batch: Any = None) -> None:
        self.vocab, self.T, self.val_rows = vocab, seq_len, val_rows
        self.token_bytes = torch.ones(vocab, dtype=torch.int64)
        self.train = self
        self.on_batch = on_batch

    def get(self, start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randint(0, self.vocab, (n, self.T))
        return x, torch.randint(0, self.vocab, (n, self.T))

    def val_batches(self, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        yield self.get(0, min(batch_size, self.val_rows))


class _DDPLayout(torch.nn.Module):
    """DistributedDataParallel(gradient_as_bucket_view=True)'s memory on one rank, for fake
    tensors (DDP's constructor reads parameter data, which a fake tensor has not): the gradient
    buckets allocated when wrapping, each gradient made a view of its bucket as it arrives."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module
        params = [q for q in module.parameters() if q.requires_grad]
        self.bucket = torch.empty(sum(q.numel() for q in params), dtype=params[0].dtype)
        views: dict[int, torch.Tensor] = {}
        off = 0
        for q in params:
            views[id(q)] = self.bucket[off:off + q.numel()].view_as(q)
            off += q.numel()

        def into_bucket(q: torch.Tensor) -> None:
            v = views[id(q)]
            if q.grad is not v:
                v.copy_(q.grad)
                q.grad = v

        for q in params:
            q.register_post_accumulate_grad_hook(into_bucket)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        yield  # the gradients accumulate in their buckets either way


def _autocast(bf16: bool) -> Any:
    # the CPU's bf16 autocast stands in for CUDA's on fake CPU tensors: both run matmuls and
    # attention in bf16; the model itself casts the norms' statistics and the loss to fp32
    return (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext


# ---------------------------------------------------------------- the phases
@dataclass
class _Run:
    """One process of a run, set up the trainer's way: what every phase runs on."""

    cfg: TrainConfig
    p: RunPlan
    mode: str
    bf16: bool
    device_type: str
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    sched: Any
    fwd: torch.nn.Module
    data: _Batches


def _setup(cfg: TrainConfig, p: RunPlan, mode: str, bf16: bool, device_type: str,
           mesh: Any = None, tracker_for: Any = None) -> tuple[_Run, Any]:
    """Build the model, its optimizer (AdamW's moments allocated) and the module the steps call,
    as the trainer does; `tracker_for(model, opt)` makes the tracker (None: none)."""
    from experiments.train.trainer import lr_factor, param_groups

    dev = torch.device("cpu")
    model, init = par.build_on_meta(p.model)
    model.chunked_loss = chunked_loss(p.model, p.micro_batch_size, p.seq_len)  # the trainer's
    if cfg.train.activation_checkpointing:
        par.checkpoint_blocks(model)
    if mode == "fsdp":
        par.shard(model, dev, p.world_size, mesh=mesh, bf16=device_type == "cuda")
    torch.manual_seed(cfg.train.seed)
    par.materialize(model, init, dev)
    opt = torch.optim.AdamW(param_groups(model, cfg.optim.weight_decay), lr=cfg.optim.lr,
                            betas=(cfg.optim.beta1, cfg.optim.beta2), eps=cfg.optim.eps,
                            fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, p.steps, p.warmup_steps, cfg.optim.min_lr_ratio))
    tracker = tracker_for(model, opt) if tracker_for is not None else None
    with tracker if tracker is not None else contextlib.nullcontext():
        for q in model.parameters():  # AdamW's moments: zero gradients, one update
            q.grad = torch.zeros_like(q)
        opt.step()
        opt.zero_grad(set_to_none=True)
        fwd = _DDPLayout(model) if mode == "ddp" else model  # par.ddp's memory layout
    data = _Batches(p.model.vocab_size, p.seq_len, cfg.logging.val_batch_size)
    return _Run(cfg, p, mode, bf16, device_type, model, opt, sched, fwd, data), tracker


def _train(r: _Run, accum: int) -> None:
    """`Trainer.train_step` itself, on `accum` micro-batches of the plan's size."""
    from experiments.train.trainer import Trainer

    host = SimpleNamespace(cfg=r.cfg, p=dataclasses.replace(r.p, grad_accum=accum),
                           device=torch.device("cpu"), world=r.p.world_size, rank=0,
                           corpus=r.data, model=r.model, opt=r.opt, mode=r.mode,
                           state=SimpleNamespace(sched=r.sched), pending=[],
                           window=SimpleNamespace(tokens=0), autocast=_autocast(r.bf16))
    Trainer.train_step(host, r.fwd, 1)  # type: ignore[arg-type]


def _validation(r: _Run) -> None:
    """`trainer.evaluate` itself, on one batch of logging.val_batch_size rows."""
    from experiments.train.trainer import evaluate

    evaluate(r.model, r.data, r.cfg.logging.val_batch_size, r.p.model.kappa_bits,
             _autocast(r.bf16))


def _save(r: _Run) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """What the Checkpointer takes on rank 0: the DCP state it stages (`training_state`, its
    share under DDP) and the weights-only export (`full_weights`)."""
    share = (0, r.p.world_size) if r.mode == "ddp" else None
    return (par.training_state(r.model, r.opt, share=share),
            par.full_weights(r.model, r.mode, main=True))


def _eval_lm(p: RunPlan, bf16: bool, rows: int, device: str = "cpu"
             ) -> tuple[Any, list[tuple[str, str]]]:
    """The evaluator on the model as evaluation loads it (fp32, whole) and one loglikelihood
    batch at the trained window: a context of T/2 tokens and `rows` distinct continuations."""
    from experiments.corpus.tokenizer import CharTokenizer
    from experiments.eval.lm_adapter import FTBenchLM
    from experiments.train.data import random_alphabet

    model, init = par.build_on_meta(p.model)
    par.materialize(model, init, torch.device(device))
    # data=random's tokenizer, one token per character: the texts are the token counts asked for
    abc = random_alphabet(p.model.vocab_size)
    lm = FTBenchLM(model=model, tokenizer=CharTokenizer(abc), batch_size=rows, device=device,
                   precision="bf16" if bf16 else "fp32", max_length=p.seq_len, progress=False)
    T = p.seq_len
    ctx = "".join(abc[i % 26] for i in range(T // 2))
    pairs = [(ctx, abc[(26 + r) % len(abc)] + abc[1] * (T - T // 2 - 1))  # distinct
             for r in range(rows)]
    return lm, pairs


def _training_phases(cfg: TrainConfig, p: RunPlan, mode: str, bf16: bool, device_type: str,
                     phases: Sequence[str], accum_measured: int | None,
                     fsdp_reduce_every: bool) -> list[PhasePeak]:
    from torch._subclasses.fake_tensor import FakeTensorMode

    dev = torch.device("cpu")
    accum = p.grad_accum if accum_measured is None else min(p.grad_accum, accum_measured)
    # the mesh the run will use (HSDP across nodes shards over a node only), outside fake mode
    mesh = par.mesh_for(dev, p.world_size, cfg.train.fsdp_replicas or None,
                        planning_local(p.world_size)) if mode == "fsdp" else None
    Mem, FSDPMem = _trackers()

    def tracker_for(model: torch.nn.Module, opt: torch.optim.Optimizer) -> Any:
        if mode == "fsdp":
            return FSDPMem(model, opt)
        t = Mem()
        t.track_external(model)
        return t

    base = {"parallel": mode, "world_size": p.world_size, "micro_batch_size": p.micro_batch_size,
            "grad_accum": p.grad_accum, "seq_len": p.seq_len, "device_type": device_type,
            "bf16": bf16, "arm": p.arm, "params": p.params["total"], "accum_measured": accum,
            "fsdp_reduce_every": fsdp_reduce_every if mode == "fsdp" else None}
    out: list[PhasePeak] = []
    old_every = par.FSDP_REDUCE_EVERY_MICRO_BATCH
    par.FSDP_REDUCE_EVERY_MICRO_BATCH = fsdp_reduce_every
    try:
        with FakeTensorMode():
            t0 = time.process_time()
            r, tracker = _setup(cfg, p, mode, bf16, device_type, mesh, tracker_for)
            setup_s = time.process_time() - t0

            def run(phase: str, rows: int, fn: Any, note: str, extra_s: float = 0.0) -> Any:
                t0 = time.process_time()
                resident = _current(tracker)
                with tracker, _Scalars():
                    res = fn()
                peak, kinds = _peak(tracker)
                out.append(PhasePeak(phase, rows=rows, peak_bytes=peak, by_kind=kinds,
                                     resident_bytes=resident, note=note,
                                     seconds=time.process_time() - t0 + extra_s, **base))
                return res

            if "train" in phases:
                run("train", p.micro_batch_size, lambda: _train(r, accum),
                    f"{accum} of {p.grad_accum} micro-batches run"
                    + (f"; {par.describe_mesh(mesh)}" if mesh is not None else ""), setup_s)
            if "validation" in phases:
                run("validation", cfg.logging.val_batch_size, lambda: _validation(r),
                    "one batch of logging.val_batch_size rows; under DDP rank 0 alone "
                    "validates")
            if "save" in phases:
                sd, weights = run("save", 0, lambda: _save(r), "")
                out[-1] = _save_record(cfg, r, out[-1], sd, weights)
    finally:
        par.FSDP_REDUCE_EVERY_MICRO_BATCH = old_every
    return out


def _save_record(cfg: TrainConfig, r: _Run, rec: PhasePeak, sd: dict[str, Any],
                 weights: dict[str, torch.Tensor]) -> PhasePeak:
    """The save's device peak and host bytes from what `_save` returned."""
    params = {_storage(q) for q in r.model.state_dict().values()
              if isinstance(q, torch.Tensor) and not isinstance(q, DTensor)}
    # The export's all-gathered tensors go to the host one by one (cpu_offload); on fake CPU
    # tensors that move is a no-op and they pile up in the tracked total: take them out, less
    # the largest one (on the GPU when it is copied).
    gathered = [v for v in weights.values()
                if isinstance(v, torch.Tensor) and _storage(v) not in params]
    held = _nbytes(gathered)
    largest = max((v.numel() * v.element_size() for v in gathered), default=0)
    device_peak = max(rec.resident_bytes, rec.peak_bytes - held + largest)
    staged = _nbytes(sd)  # DCP's async save copies each of these to host memory
    # on a GPU every exported tensor is a host copy; a CPU run's export aliases its weights
    export = _nbytes(weights) if r.device_type == "cuda" else held
    out_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[export_dtype(cfg, r.device_type)]
    cast = 0 if out_dtype == torch.float32 else _nbytes(
        [v for v in weights.values() if v.is_floating_point()]) // 2  # save_weights' bf16 copy
    share = {"ddp": "share", "fsdp": "shards"}.get(r.mode, "state")
    # Checkpointer.save exports first (eval steps), then stages the DCP state, held until its
    # write completes: the host peak is the larger of the two
    return dataclasses.replace(
        rec, peak_bytes=device_peak, host_bytes=max(staged, export + cast),
        note=f"host: DCP staging {_size(staged)} (this rank's {share}) + export on rank 0 "
             f"{_size(export)}" + (f" + its bf16 copy {_size(cast)}" if cast else ""))


def _eval_phase(cfg: TrainConfig, p: RunPlan, bf16: bool, device_type: str,
                rows: int) -> PhasePeak:
    from torch._subclasses.fake_tensor import FakeTensorMode

    t0 = time.process_time()
    Mem, _ = _trackers()
    with FakeTensorMode():
        lm, pairs = _eval_lm(p, bf16, rows)
        tracker = Mem()
        tracker.track_external(lm.model)
        resident = _current(tracker)
        with tracker, _Scalars():
            lm.loglikelihood_pairs(pairs, disable_tqdm=True)
        peak, kinds = _peak(tracker)
    T = p.seq_len
    return PhasePeak("eval", parallel="none", world_size=1, micro_batch_size=p.micro_batch_size,
                     grad_accum=p.grad_accum, rows=rows, seq_len=T, device_type=device_type,
                     bf16=bf16, peak_bytes=peak, by_kind=kinds, resident_bytes=resident,
                     arm=p.arm, params=p.params["total"], seconds=time.process_time() - t0,
                     note=f"fp32 weights; context {T // 2} + {rows} continuations of "
                          f"{T - T // 2} tokens, one batch")


def measure_eval_on_device(cfg: TrainConfig, device: str = "cuda", *, eval_rows: int = 16
                           ) -> dict[str, int]:
    """`measure`'s evaluation phase run for real on a CUDA device: the allocator's peaks
    {"allocated", "reserved"} (weights included), set beside the fake-tensor figure (a CPU
    run: dev/memory.py's measure_real)."""
    p = plan(cfg, 1)
    lm, pairs = _eval_lm(p, trains_bf16(cfg.train, "cuda"), eval_rows, device)
    dev = torch.device(device)
    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    lm.loglikelihood_pairs(pairs, disable_tqdm=True)
    torch.cuda.synchronize(dev)
    out = {"allocated": int(torch.cuda.max_memory_allocated(dev)),
           "reserved": int(torch.cuda.max_memory_reserved(dev))}
    del lm
    torch.cuda.empty_cache()
    return out


# ---------------------------------------------------------------- public entry
def measure(cfg: TrainConfig, *, world_size: int | None = None, parallel: str | None = None,
            device_type: str = "cuda", phases: Sequence[str] = PHASES, eval_rows: int = 16,
            accum_measured: int | None = 3, fsdp_reduce_every: bool | None = None
            ) -> list[PhasePeak]:
    """The peak memory of each phase in `phases` on one process of the run `cfg` plans, at
    `world_size` (default `planning_world`) and `parallel` (default `dry_parallel`);
    device_type "cuda" models a GPU run; eval_rows: the evaluation batch's continuations;
    accum_measured: micro-batches run (None: all); fsdp_reduce_every overrides the trainer's
    setting. The callers pass known values (dev/memory.py's command line checks its own)."""
    world = world_size or planning_world(cfg)[0]
    p = plan(cfg, world)
    mode = "none" if world <= 1 else parallel or dry_parallel(cfg, p)
    bf16 = trains_bf16(cfg.train, device_type)
    every = par.FSDP_REDUCE_EVERY_MICRO_BATCH if fsdp_reduce_every is None else fsdp_reduce_every
    out: list[PhasePeak] = []
    trained = [x for x in phases if x != "eval"]
    if trained:
        with fake_world(world):
            out += _training_phases(cfg, p, mode, bf16, device_type, trained, accum_measured,
                                    every)
    if "eval" in phases:
        out.append(_eval_phase(cfg, p, bf16, device_type, eval_rows))
    order = {x: i for i, x in enumerate(PHASES)}
    return sorted(out, key=lambda r: order[r.phase])


def _size(b: float) -> str:
    return f"{b / GB:.1f} GB" if b >= 0.1 * GB else f"{b / 1e6:.1f} MB"


def format_table(records: Sequence[PhasePeak], capacity_bytes: float | None = None) -> str:
    """The measured peaks as a text table, each beside `capacity_bytes` (a GPU's memory)."""
    head = (f"{'phase':<11}{'parallel':<9}{'world':>6}  {'batch':<22}{'peak/GPU':>10}"
            + (f"{'of GPU':>9}" if capacity_bytes else "") + f"{'host/proc':>11}  note")
    lines = [head]
    for r in records:
        batch = (f"{r.rows} x {r.seq_len}" + (f", accum {r.grad_accum}" if r.phase == "train"
                                              else "")) if r.rows else "-"
        fit = ""
        if capacity_bytes:
            frac = r.peak_bytes / capacity_bytes
            fit = f"{frac:>8.0%}" + ("!" if frac > 1 else " ")
        host = f"{_size(r.host_bytes):>11}" if r.host_bytes is not None else f"{'-':>11}"
        sync = ("" if r.fsdp_reduce_every is None or r.phase != "train" else
                f"; reduce-scatter {'every micro-batch' if r.fsdp_reduce_every else 'last only'}")
        lines.append(f"{r.phase:<11}{r.parallel:<9}{r.world_size:>6}  {batch:<22}"
                     f"{_size(r.peak_bytes):>10}{fit}{host}  {r.note}{sync}")
    return "\n".join(lines)


# ---------------------------------------------------------------- the dry run
MEASURED_CODE = ("model", "experiments/train", "experiments/memory.py",
                 "experiments/eval/lm_adapter.py")
"""The code the phases run: a change in any of it invalidates the cached measurements."""
ROOT = Path(__file__).resolve().parents[1]


def code_hash() -> str:
    h = hashlib.sha256()
    for rel in MEASURED_CODE:
        path = ROOT / rel
        for f in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def measure_key(cfg: TrainConfig, world: int, mode: str, device_type: str, eval_rows: int,
                accum_measured: int | None, *, exact: bool = True) -> str:
    """Everything the measured figures depend on (model, every phase's batch, world and mesh,
    precision, checkpointing, export dtype, FSDP2's reduce-scatter rule), and with `exact` the
    torch version and the code the phases run; exact=False is a shipped plan's key (SHIPPED)."""
    p = plan(cfg, world)
    mesh = (par.hsdp_shape(world, cfg.train.fsdp_replicas or None, planning_local(world))
            if mode == "fsdp" else None)
    key = {"model": dataclasses.asdict(p.model), "world": world, "parallel": mode, "mesh": mesh,
           "micro_batch_size": p.micro_batch_size, "grad_accum": p.grad_accum,
           "seq_len": p.seq_len, "val_batch_size": cfg.logging.val_batch_size,
           "val_rows": cfg.data.val_tokens, "precision": str(cfg.train.precision),
           "checkpointing": cfg.train.activation_checkpointing, "device_type": device_type,
           "export": export_dtype(cfg, device_type), "eval_rows": eval_rows,
           "accum_measured": accum_measured, "fsdp_every": par.FSDP_REDUCE_EVERY_MICRO_BATCH}
    if exact:
        key.update(torch=torch.__version__, code=code_hash())
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]


SHIPPED = ROOT / "measured" / "memory" / "plans"
"""Fake-tensor plans shipped with the repository, by shape (`measure_key(exact=False)`), which
`make gpu-check RECIPE=..` reads on a fresh node (`pipelines.gpu_check --ship-plan` writes one)."""


def _read(path: Path) -> list[PhasePeak] | None:
    try:
        return [PhasePeak(**r) for r in json.loads(path.read_text())["records"]]
    except (OSError, ValueError, TypeError, KeyError):
        return None  # unreadable (or an older list-only cache file): measured again, rewritten


def measure_cached(cfg: TrainConfig, *, world_size: int | None = None, device_type: str = "cuda",
                   eval_rows: int = 16, accum_measured: int | None = 3,
                   cache: Path | None = None, shipped: Path | None = None, ship: bool = False
                   ) -> tuple[list[PhasePeak], Path | None]:
    """`measure` of every phase, read from `cache/memory/<key>.json` when that exact measurement
    was made before, else from `shipped/<shape key>.json`, else measured and cached: (records,
    the file read or written). `ship`: measured anew and written under `shipped` by its shape
    key (`--ship-plan`). Each file holds the torch version and code hash that made it."""
    world = world_size or planning_world(cfg)[0]
    p = plan(cfg, world)
    mode = "none" if world <= 1 else dry_parallel(cfg, p)
    args = (cfg, world, mode, device_type, eval_rows, accum_measured)
    path = None if cache is None else cache / "memory" / f"{measure_key(*args)}.json"
    shape = None if shipped is None else shipped / f"{measure_key(*args, exact=False)}.json"
    for f in () if ship else (path, shape):
        if f is not None and f.is_file() and (recs := _read(f)) is not None:
            return recs, f
    recs = measure(cfg, world_size=world, parallel=mode, device_type=device_type,
                   eval_rows=eval_rows, accum_measured=accum_measured)
    out = shape if ship else path
    if out is not None:
        from common.io import atomic_write_text

        out.parent.mkdir(parents=True, exist_ok=True)
        doc = {"torch": torch.__version__, "code": code_hash(),
               "records": [r.to_json() for r in recs]}
        atomic_write_text(out, json.dumps(doc, indent=1) + "\n")
    return recs, out


USABLE_FRACTION = 0.9
"""Share of a GPU's memory the measured training, validation and save peaks may fill: what the
trackers do not see (CUDA context, NCCL, fragmentation: 0.8 GB on one H100) stays free."""
FIT_PHASES = ("train", "validation", "save")
"""The phases a training micro-batch must fit (evaluation's batch is the evaluator's own)."""


@dataclass(frozen=True)
class Fit:
    """`fit`'s verdict: the micro-batch and activation checkpointing chosen (None: nothing fits),
    the records of the choice (else of the last try), every try and the bytes allowed."""

    micro_batch_size: int | None
    activation_checkpointing: bool
    records: list[PhasePeak]
    tries: list[tuple[int, bool, int]]
    """(micro-batch, activation checkpointing, worst of FIT_PHASES' peaks in bytes)."""
    allowed: float

    def overrides(self) -> list[str]:
        return [f"train.micro_batch_size={self.micro_batch_size}",
                f"train.activation_checkpointing={str(self.activation_checkpointing).lower()}"]

    def line(self) -> str:
        """The verdict in one line: every try with its worst peak against what is allowed."""
        r = self.records[0]
        tried = ", ".join(f"{m}{' with act. ckpt' if ck else ''} {_size(b)}"
                          for m, ck, b in self.tries)
        head = (f"{r.parallel} over {r.world_size} GPU(s): micro-batch (worst of "
                f"{'/'.join(FIT_PHASES)} peaks, fake tensors) {tried}; {_size(self.allowed)} "
                f"allowed ({USABLE_FRACTION:.0%} of train.gpu_memory_gb)")
        if self.micro_batch_size is None:
            return head + ": nothing fits"
        return (head + f": micro-batch {self.micro_batch_size} x accum {r.grad_accum}"
                + (", activation checkpointing" if self.activation_checkpointing else ""))


def fit(cfg: TrainConfig, *, world: int | None = None, cache: Path | None = None) -> Fit:
    """The micro-batch and activation checkpointing for `cfg`'s run at `world`, chosen by
    measurement: cfg's own when its training, validation and save peaks fit USABLE_FRACTION of
    train.gpu_memory_gb, else the next smaller micro-batch dividing the per-GPU batch, then each
    with activation checkpointing (recomputation costs more than a smaller micro-batch)."""
    world = world or planning_world(cfg)[0]
    p = plan(cfg, world)
    allowed = USABLE_FRACTION * cfg.train.gpu_memory_gb * GB
    per_gpu, ck0 = p.batch_size // world, bool(cfg.train.activation_checkpointing)
    sizes = [m for m in range(p.micro_batch_size, 0, -1) if per_gpu % m == 0]
    tries: list[tuple[int, bool, int]] = []
    recs: list[PhasePeak] = []
    for m, ck in [(m, ck0) for m in sizes] + ([(m, True) for m in sizes] if not ck0 else []):
        c = dataclasses.replace(cfg, train=dataclasses.replace(
            cfg.train, micro_batch_size=m, activation_checkpointing=ck))
        recs, _ = measure_cached(c, world_size=world, device_type=dry_device_type(c),
                                 cache=cache)
        worst = max(r.peak_bytes for r in recs if r.phase in FIT_PHASES)
        tries.append((m, ck, worst))
        if worst <= allowed:
            return Fit(m, ck, recs, tries, allowed)
    return Fit(None, ck0, recs, tries, allowed)


def dry_device_type(cfg: TrainConfig) -> str:
    """What a dry run models: a CPU run where train.device is cpu, else a GPU run (the plan's
    GPUs of train.gpu_memory_gb, whatever this machine has)."""
    return "cpu" if str(cfg.train.device) == "cpu" else "cuda"


def dry_text(cfg: TrainConfig, *, world_size: int | None = None, cache: Path | None = None,
             label: str = "") -> str:
    """The dry run's memory section: the measured per-process peak of every phase beside the
    GPU's capacity (train.gpu_memory_gb), and which phases do not fit."""
    world, source = (world_size, "given") if world_size else planning_world(cfg)
    device_type = dry_device_type(cfg)
    t0 = time.time()
    recs, path = measure_cached(cfg, world_size=world, device_type=device_type, cache=cache)
    took = time.time() - t0
    cuda = device_type == "cuda"
    cap = cfg.train.gpu_memory_gb * GB if cuda else None
    r0 = recs[0]
    how = (f"read from {path}" if path is not None and took < 0.5 * sum(r.seconds for r in recs)
           else f"measured in {sum(r.seconds for r in recs):.0f} s of CPU"
           + (f", cached in {path}" if path is not None else ""))
    lines = [f"memory{(' ' + label) if label else ''}: measured peak per "
             f"{'GPU' if cuda else 'process'} on fake tensors (experiments/memory.py: torch's "
             f"MemTracker/FSDPMemTracker, a fake process group of {world}; {how})",
             f"  {cfg.model.preset} {r0.arm} ({r0.params:,} params), "
             f"{'GPU run modelled' if cuda else 'CPU run'}{', bf16' if r0.bf16 else ', fp32'}"
             + (f"; capacity {cfg.train.gpu_memory_gb:g} GB (train.gpu_memory_gb)" if cuda
                else ""),
             *("  " + ln for ln in format_table(recs, cap).splitlines())]
    if cap:
        over = [f"{r.phase} ({_size(r.peak_bytes)})" for r in recs if r.peak_bytes > cap]
        lines.append("  fits the GPU: " + ("every phase" if not over else
                                          "NO: " + ", ".join(over) + f" over {_size(cap)}"))
        lines.append("  not tracked: the CUDA context and NCCL buffers (about 1-3 GB), the "
                     "allocator's fragmentation, kernels' workspaces (make gpu-check measures "
                     "them)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """`make train DRY=1` (its `--dry-run`, the only mode): the trainer's dry run (its plan),
    then `dry_text` of the same config (cached under paths.cache/memory); every other argument
    is a trainer override (experiments.train does not import this module). Measuring chosen
    phases, parallelisms and FSDP syncs: python -m dev.memory."""
    args = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--dry-run"]
    return cli("python -m experiments.memory", lambda: _dry_main(args))


def _dry_main(overrides: list[str]) -> int:
    from experiments.train.trainer import main as train_main

    overrides = [o for o in overrides if not o.startswith("train.dry_run=")]
    rc = train_main([*overrides, "train.dry_run=true"])
    if rc != 0 or overrides[:1] in (["-h"], ["--help"]):  # its refusal, or its help
        return rc
    cfg = compose(overrides)
    if dist.is_initialized() and dist.get_rank() != 0:
        return 0
    print(dry_text(cfg, cache=Path(cfg.paths.cache)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
