"""Everything a run keeps under <run>/checkpoints and in <run>/metrics.jsonl: which checkpoint a
resume starts from, what it restores (`TrainState`), the metrics lines it keeps, when a step's
checkpoint is written, the rotation (logging.keep_checkpoints), the checkpoints kept for
evaluation (logging.keep_eval_checkpoints: eval_step_<N>.pt) and final.pt, whose presence marks
the run finished. File names come from common/paths.py.

    Checkpointer(rd, cfg, plan, main=, world=, log=)
        .finished / .prepare(fresh) / .newest() / .resume(found, state)
        .maybe_save(step, state, val_done=, force=) / .save_final(state) / .last_good
    TrainState(cfg, plan, run_id, opt, sched, model=, mode=)   step, val_done, state_dict()

Rank 0 writes; under FSDP every rank takes part in gathering the state (a collective).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from common.io import atomic_write_text
from common.paths import (
    FINAL_CHECKPOINT,
    checkpoint_dir,
    checkpoint_name,
    eval_checkpoint_name,
    final_checkpoint,
    step_checkpoints,
)
from model import save_checkpoint
from model.checkpoint import CheckpointError, read_checkpoint

from . import parallel as par
from .config import ConfigError, TrainConfig
from .plan import RunPlan

METRICS = "metrics.jsonl"


def finished(rd: Path) -> bool:
    """A run with final.pt is finished (train() returns at once unless train.force=true)."""
    return final_checkpoint(rd).exists()


# ====================================================================== state
class TrainState:
    """What a checkpoint restores beyond the weights: the step, the optimizer, the LR schedule,
    the data position and every RNG. Stored under a checkpoint's `extra` (docs/RESULTS.md).
    `model` and `mode` (none|ddp|fsdp) say how the optimizer state is gathered and loaded."""

    def __init__(self, cfg: TrainConfig, p: RunPlan, run_id: str,
                 opt: torch.optim.Optimizer, sched: Any, model: torch.nn.Module | None = None,
                 mode: str = "none") -> None:
        self.cfg, self.plan, self.run_id = cfg, p, run_id
        self.opt, self.sched = opt, sched
        self.model, self.mode = model, mode
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


def truncate_metrics(path: Path, step: int, val_done: bool = False) -> None:
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


def _quiet(msg: str, echo: bool = True) -> None:
    pass


# ====================================================================== checkpointer
class Checkpointer:
    """The checkpoints and metrics file of one run directory `rd` (see the module docstring).

    `main`: this process writes (rank 0); `world`: processes that meet at a barrier after each
    save; `log(msg, echo=...)`: where a skipped unreadable checkpoint and a resume are told."""

    def __init__(self, rd: Path, cfg: TrainConfig, p: RunPlan, *, main: bool = True,
                 world: int = 1, log: Callable[..., None] = _quiet,
                 tokenizer: dict[str, Any] | None = None) -> None:
        self.rd, self.ckdir = rd, checkpoint_dir(rd)
        self.metrics_path = rd / METRICS
        self.final = self.ckdir / FINAL_CHECKPOINT
        self.steps = p.steps
        self.every = cfg.logging.ckpt_every
        self.keep = cfg.logging.keep_checkpoints
        n = cfg.logging.keep_eval_checkpoints
        # n evenly spaced by tokens, the last one the final step (every step has the same
        # tokens, so even in steps is even in tokens)
        self._eval_steps = {math.ceil(k * p.steps / n) for k in range(1, n + 1)} if n else set()
        self.main, self.world, self.log = main, world, log
        self.tokenizer = tokenizer
        """The tokenizer reference written into every checkpoint (model.save_checkpoint)."""
        self.last_good: Path | None = None
        """The newest step checkpoint: what a divergence or a preemption leaves to resume from."""

    @property
    def finished(self) -> bool:
        return finished(self.rd)

    def prepare(self, fresh: bool = False) -> None:
        """Create the checkpoint folder; `fresh` (train.force) first deletes every checkpoint
        and the metrics of an earlier run. Rank 0 only."""
        if not self.main:
            return
        if fresh:
            shutil.rmtree(self.ckdir, ignore_errors=True)
            self.metrics_path.unlink(missing_ok=True)
        self.ckdir.mkdir(parents=True, exist_ok=True)

    def eval_steps(self) -> set[int]:
        """Steps of logging.keep_eval_checkpoints=n, kept as eval_step_<N>.pt."""
        return set(self._eval_steps)

    def newest(self) -> tuple[dict[str, Any], Path] | None:
        """(payload, path) of the newest readable step checkpoint whose state names its step;
        unreadable ones (cut by kill -9) are skipped with a log line."""
        for step, p in reversed(step_checkpoints(self.ckdir)):
            try:
                payload = read_checkpoint(p)
            except CheckpointError as e:
                self.log(f"skipping unreadable checkpoint {p.name}: {e}")
                continue
            if payload.get("extra", {}).get("step") == step:
                return payload, p
        return None

    def resume(self, found: tuple[dict[str, Any], Path] | None, state: TrainState) -> None:
        """Restore `state` from `found` (`newest()`; the caller loaded its weights before any
        sharding) and cut metrics.jsonl back to that checkpoint; with nothing found, start
        the metrics afresh. ConfigError: the checkpoint's state does not fit this run."""
        if found is not None:
            payload, path = found
            try:
                state.load_state_dict(payload["extra"], state.model, state.mode)
            except ValueError as e:
                raise ConfigError(f"{path}: {e}") from None
            self.log(f"resumed from {path.name} (step {state.step}/{self.steps}"
                     + (", its validation done" if state.val_done else "") + ")",
                     echo=self.main)
            if self.main:
                truncate_metrics(self.metrics_path, state.step, state.val_done)
                if not (self.ckdir / eval_checkpoint_name(state.step)).exists():
                    self.keep_for_eval(state.step, path)  # killed before its link
        elif self.main:
            self.metrics_path.unlink(missing_ok=True)
        found_steps = step_checkpoints(self.ckdir)
        self.last_good = found_steps[-1][1] if found_steps else None

    def due(self, step: int) -> bool:
        """A checkpoint is written at this step: every logging.ckpt_every, the last step, and
        the steps kept for evaluation."""
        return step % self.every == 0 or step == self.steps or step in self._eval_steps

    def maybe_save(self, step: int, state: TrainState, *, val_done: bool,
                   force: bool = False) -> Path | None:
        """Write step_<step>.pt when due (or `force`: a preemption); `val_done`: the validation
        due at `step` has run. Returns the path written, else None. Every rank calls it."""
        if not (force or self.due(step)):
            return None
        self.last_good = self.save(step, state, val_done=val_done)
        return self.last_good

    def save_final(self, state: TrainState) -> Path:
        """final.pt at the last step, its validation done: the run is finished."""
        return self.save(self.steps, state, FINAL_CHECKPOINT, val_done=True)

    def save(self, step: int, state: TrainState, name: str | None = None,
             val_done: bool = False) -> Path:
        """Write the checkpoint of `step` (step_<step>.pt unless `name`), link it for evaluation
        when its step is kept, and drop step checkpoints beyond logging.keep_checkpoints."""
        path = self.ckdir / (name or checkpoint_name(step))
        # FSDP: gathering the full state is a collective, so every rank takes part
        model = state.model
        assert model is not None, "TrainState without a model cannot be saved"
        weights, optim, optim_format = par.gather_state(model, state.opt, state.mode)
        if self.main:
            state.step, state.val_done = step, val_done
            save_checkpoint(path, model, tokenizer=self.tokenizer,
                            extra=state.state_dict(optim, optim_format), state_dict=weights)
            if name is not None or step != self.steps:  # the last step's is final.pt's
                self.keep_for_eval(step, path)
            if name is None:
                for _, old in step_checkpoints(self.ckdir)[:-self.keep]:
                    old.unlink(missing_ok=True)
        if self.world > 1:
            dist.barrier()
        return path

    def keep_for_eval(self, step: int, path: Path) -> None:
        """eval_step_<N>.pt: a hard link (a copy where links fail) outside the rotation."""
        if not self.main or step not in self._eval_steps:
            return
        dst = self.ckdir / eval_checkpoint_name(step)
        tmp = dst.with_name(f".{dst.name}.tmp")
        tmp.unlink(missing_ok=True)
        try:
            os.link(path, tmp)
        except OSError:
            shutil.copyfile(path, tmp)
        os.replace(tmp, dst)
