"""Everything a run keeps under <run>/checkpoints and in <run>/metrics.jsonl: which checkpoint a
resume starts from, what it restores (`TrainState`), the metrics lines it keeps, when a step's
checkpoint is written, the rotation, the checkpoints kept for evaluation and final.pt, whose
presence marks the run finished. What the files are (a step checkpoint: each rank's DCP shards,
saved asynchronously over a gloo group of its own as torchtitan does, and rank 0's marker
written last): docs/RESULTS.md, `checkpoints/`.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from common.errors import UsageError
from common.io import atomic_write_text
from common.paths import RunDir
from model.checkpoint import (
    FORMAT,
    CheckpointError,
    atomic_torch_save,
    read_checkpoint,
    save_weights,
)

from . import parallel as par
from .config import TrainConfig
from .plan import RunPlan

EXPORT_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
"""logging.export_dtype's resolved values (config.export_dtype) as the dtype of the exports."""
SHARDS = ".dcp"
"""step_<N>.pt's shards live in the directory step_<N>.dcp beside it."""


def shard_dir(marker: Path) -> Path:
    return marker.with_suffix(SHARDS)


# ====================================================================== state
class TrainState:
    """What a checkpoint restores beyond the weights: the step, the optimizer, the LR schedule,
    the data position and every RNG. Stored under a checkpoint's `extra` (docs/RESULTS.md).
    `model` and `mode` (none|ddp|fsdp) say how the optimizer state is gathered and loaded."""

    def __init__(self, cfg: TrainConfig, p: RunPlan, run_id: str,
                 opt: torch.optim.Optimizer, sched: Any, model: torch.nn.Module,
                 mode: str = "none") -> None:
        self.cfg, self.plan, self.run_id = cfg, p, run_id
        self.opt, self.sched = opt, sched
        self.model, self.mode = model, mode
        self.step = 0
        self.val_done = False
        """The validation due at `step` finished before this state's checkpoint was written."""

    def meta(self) -> dict[str, Any]:
        """Everything but the weights and the optimizer state (those are in the shards)."""
        return {"step": self.step, "val_done": self.val_done,
                "scheduler": self.sched.state_dict(),
                "data": {"samples": self.step * self.cfg.train.batch_size,
                         "seed": self.cfg.train.seed},
                "rng": _rng_state(), "run_id": self.run_id,
                "tokens": self.plan.tokens_at(self.step), "flops": self.plan.flops_at(self.step)}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """`meta()` back; the weights and the optimizer state load from the shards
        (Checkpointer.resume)."""
        step = int(sd["step"])
        if sd["data"]["samples"] != step * self.cfg.train.batch_size:
            raise ValueError("data position does not match its step")
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


def truncate_metrics(path: Path, step: int, val_done: bool = False) -> None:
    """Keep what an uninterrupted run had written when the checkpoint at `step` was taken
    (the val line at `step` only when `val_done`)."""
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


def _quiet(msg: str, echo: bool = True) -> None:
    pass


def stager(cuda: bool) -> Any:
    """DCP's staging of a step checkpoint for every save of a run: host buffers allocated at
    the first save and reused (torch's DefaultStager), pinned on CUDA (55 vs 1.5 GB/s pageable
    on one H100, docs/gpu_check/). Staging completes before async_save returns (training then
    changes the weights); the write stays asynchronous. None where torch has no DefaultStager."""
    try:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    except ImportError:
        return None
    return DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False,
                                        use_async_staging=False, use_non_blocking_copy=cuda))


# ====================================================================== checkpointer
class Checkpointer:
    """The checkpoints and metrics file of one run directory `rd`. `main`: this process writes
    (rank 0); `world`: processes that meet at a barrier after each save; `storage_writer(dir)`:
    the DCP StorageWriter of a step's shards (default: the file system); `export_dtype`: the
    weights-only exports' dtype (None: as trained)."""

    def __init__(self, rd: Path, cfg: TrainConfig, p: RunPlan, *, main: bool = True,
                 world: int = 1, log: Callable[..., None] = _quiet,
                 tokenizer: dict[str, Any] | None = None,
                 storage_writer: Callable[[Path], Any] | None = None,
                 export_dtype: torch.dtype | None = None) -> None:
        self.rd, self.run = rd, RunDir(rd)  # every name under the run comes from RunDir
        self.ckdir = self.run.checkpoints_dir
        self.metrics_path = self.run.metrics_path
        self.final = self.run.final_checkpoint
        self.steps = p.steps
        self.every = cfg.logging.ckpt_every
        self.keep = cfg.logging.keep_checkpoints
        n = cfg.logging.keep_eval_checkpoints
        # n evenly spaced by tokens, the last one the final step (every step has the same
        # tokens, so even in steps is even in tokens)
        self.eval_steps = {math.ceil(k * p.steps / n) for k in range(1, n + 1)} if n else set()
        """Steps of logging.keep_eval_checkpoints=n, kept as eval_step_<N>.pt."""
        self.main, self.world, self.log = main, world, log
        self.tokenizer = tokenizer
        """The tokenizer reference written into every checkpoint (model.save_checkpoint)."""
        self.storage_writer = storage_writer
        self.export_dtype = export_dtype
        self._last_good: Path | None = None
        self._pending: Any = None  # the in-flight async save's future
        self._error: BaseException | None = None
        self._lock = threading.Lock()  # the writer thread's completion vs the main thread
        self._pg: Any = None
        self._stager: Any = None  # DCP's DefaultStager, made at the first save (`_staging`)

    @property
    def last_good(self) -> Path | None:
        """The newest complete step checkpoint: what a divergence or a preemption leaves.
        Reading it first completes a save in flight (`wait()`: every rank reads it)."""
        self.wait()
        return self._last_good

    def prepare(self, fresh: bool = False) -> None:
        """Create the checkpoint folder; `fresh` (train.force) first deletes every checkpoint
        and the metrics of an earlier run. Rank 0 only."""
        if not self.main:
            return
        if fresh:
            shutil.rmtree(self.ckdir, ignore_errors=True)
            self.metrics_path.unlink(missing_ok=True)
        self.ckdir.mkdir(parents=True, exist_ok=True)

    def newest(self) -> tuple[dict[str, Any], Path] | None:
        """(payload, path) of the newest complete step checkpoint whose state names its step;
        unreadable ones (cut by kill -9), markers whose shards are gone and single files from
        before sharded checkpoints (issue 26) are skipped with a log line."""
        for step, p in reversed(self.run.step_checkpoints()):
            try:
                payload = read_checkpoint(p)
            except CheckpointError as e:
                self.log(f"skipping unreadable checkpoint {p.name}: {e}")
                continue
            if "dcp" not in payload:
                self.log(f"skipping checkpoint {p.name}: not a sharded step checkpoint")
                continue
            if not (p.parent / payload["dcp"] / ".metadata").is_file():
                self.log(f"skipping checkpoint {p.name}: its shards {payload['dcp']} are gone")
                continue
            if payload.get("extra", {}).get("step") == step:
                return payload, p
        return None

    def resume(self, found: tuple[dict[str, Any], Path] | None, state: TrainState) -> None:
        """Restore the model's weights and `state` from `found` (any world size; after sharding
        and the optimizer) and cut metrics.jsonl back to it (nothing found: start afresh).
        Every rank calls it. UsageError: the checkpoint does not fit this run."""
        model = state.model
        if found is not None:
            payload, path = found
            try:
                par.load_training_state(model, state.opt, str(path.parent / payload["dcp"]))
                state.load_state_dict(payload["extra"])
            except (ValueError, RuntimeError, KeyError) as e:
                raise UsageError(f"{path}: {e}") from None
            if self.main:  # before the log line: a reader seeing it sees the cut file
                truncate_metrics(self.metrics_path, state.step, state.val_done)
            self.log(f"resumed from {path.name} (step {state.step}/{self.steps}"
                     + (", its validation done" if state.val_done else "") + ")",
                     echo=self.main)
            if not self.run.eval_checkpoint(state.step).exists():
                self.keep_for_eval(state.step, state)  # killed before its export
        elif self.main:
            self.metrics_path.unlink(missing_ok=True)
        if self.main:  # shards a kill -9 left without their marker: never complete
            for d in self.ckdir.glob(f"step_*{SHARDS}"):
                if not d.with_suffix(".pt").exists():
                    shutil.rmtree(d, ignore_errors=True)
        found_steps = self.run.step_checkpoints()
        self._last_good = found_steps[-1][1] if found_steps else None

    def due(self, step: int) -> bool:
        """A checkpoint is written at this step: every logging.ckpt_every, the last step, and
        the steps kept for evaluation."""
        return step % self.every == 0 or step == self.steps or step in self.eval_steps

    def maybe_save(self, step: int, state: TrainState, *, val_done: bool,
                   force: bool = False) -> Path | None:
        """Start step_<step>'s checkpoint when due (or `force`: a preemption, which waits for
        it); the marker's path, else None. Every rank calls it."""
        if not (force or self.due(step)):
            return None
        path = self.save(step, state, val_done=val_done)
        if force:
            self.wait()
        return path

    def save_final(self, state: TrainState) -> Path:
        """final.pt at the last step, its validation done: the run is finished. Waits for any
        step checkpoint in flight first."""
        return self.save(self.steps, state, self.final.name, val_done=True)

    def save(self, step: int, state: TrainState, name: str | None = None,
             val_done: bool = False) -> Path:
        """Start the checkpoint of `step` (written asynchronously), exported for
        evaluation when its step is kept; with `name`, that weights-only export instead."""
        model = state.model
        self.wait()  # one save in flight at a time
        state.step, state.val_done = step, val_done
        if name is not None:
            path = self.export(self.ckdir / name, state)
            if step in self.eval_steps:
                self.keep_for_eval(step, state, src=path)
            return path
        if step != self.steps:  # the last step's eval checkpoint is final.pt's
            self.keep_for_eval(step, state)
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        marker = self.run.step_checkpoint(step)
        d = shard_dir(marker)
        meta = state.meta()  # now: the step, the RNG and the schedule move on during the write
        config = getattr(model, "module", model).cfg.to_dict()
        done = threading.Event()
        # DDP: each rank stages and writes its share of the replicated state (no full host copy
        # on every rank); FSDP: each rank's shards
        share = ((dist.get_rank(), self.world)
                 if state.mode == "ddp" and self.world > 1 and dist.is_initialized() else None)
        sd = par.training_state(model, state.opt, share=share)
        kw: dict[str, Any] = {"checkpoint_id": str(d), "process_group": self._group()}
        if self.storage_writer is not None:
            kw["storage_writer"] = self.storage_writer(d)
        fut = dcp.async_save(sd, async_checkpointer_type=AsyncCheckpointerType.THREAD,
                             async_stager=self._staging(), **kw)
        self._pending = done
        fut.add_done_callback(lambda f: self._complete(f, step, marker, meta, config, done))
        return marker

    def _staging(self) -> Any:
        """This run's stager (`stager`), made at its first save and reused by every later one."""
        if self._stager is None:
            self._stager = stager(torch.cuda.is_available() and torch.cuda.is_initialized())
        return self._stager

    def close(self) -> None:
        """`wait()`, then free the staging buffers (every rank, when the run ends)."""
        try:
            self.wait()
        finally:
            if self._stager is not None:
                self._stager.close()
                self._stager = None

    def _group(self) -> Any:
        """A gloo group of its own for the writer thread's collectives (DCP's plan exchange),
        so they never interleave with training's on the default group (torchtitan's design)."""
        if self.world <= 1 or not dist.is_initialized():
            return None
        if self._pg is None:
            self._pg = dist.new_group(backend="gloo")
        return self._pg

    def _complete(self, fut: Any, step: int, marker: Path, meta: dict[str, Any],
                  config: dict[str, Any], done: threading.Event) -> None:
        """Every rank's shards and DCP's metadata are written (DCP's finish step gathers all
        ranks before the future resolves): rank 0 writes the marker, then rotates."""
        try:
            fut.result()
            if self.main:
                atomic_torch_save({"format": FORMAT, "config": config,
                                   "tokenizer": self.tokenizer, "extra": meta,
                                   "dcp": shard_dir(marker).name}, marker)
                for _, old in self.run.step_checkpoints()[:-self.keep]:
                    old.unlink(missing_ok=True)  # the marker first: then it no longer counts
                    shutil.rmtree(shard_dir(old), ignore_errors=True)
            with self._lock:
                self._last_good = marker
        except BaseException as e:  # re-raised on the main thread by wait()
            with self._lock:
                self._error = e
        finally:
            done.set()

    def wait(self) -> None:
        """Block until the checkpoint in flight is complete; raise what its writing raised.
        Every rank calls it."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.wait()  # set by _complete on the writer thread, after the marker
            if self.world > 1:
                dist.barrier()
        self._raise()

    def _raise(self) -> None:
        with self._lock:
            e, self._error = self._error, None
        if e is not None:
            raise RuntimeError(f"checkpoint write failed: {type(e).__name__}: {e}") from e

    def export(self, path: Path, state: TrainState) -> Path:
        """A weights-only single file at `path` (config, tokenizer, run identity, the training
        state without optimizer): gathered on rank 0, a collective under FSDP."""
        model = state.model
        weights = par.full_weights(model, state.mode, main=self.main)
        if self.main:
            save_weights(path, model, tokenizer=self.tokenizer, extra=state.meta(),
                         state_dict=weights, dtype=self.export_dtype)
        if self.world > 1:
            dist.barrier()
        return path

    def keep_for_eval(self, step: int, state: TrainState, src: Path | None = None) -> None:
        """eval_step_<N>.pt, outside the rotation: a hard link to `src` (a copy where links
        fail), else a weights-only export of the model as it is now. Every rank calls it."""
        if step not in self.eval_steps:
            return
        dst = self.run.eval_checkpoint(step)
        if src is None:
            self.export(dst, state)
            return
        if not self.main:
            return
        tmp = dst.with_name(f".{dst.name}.tmp")
        tmp.unlink(missing_ok=True)
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
