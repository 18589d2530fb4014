"""Pre-submission checks: what a sweep asks of the cluster against what the cluster file (or the
submitting host) gives, each one line naming the values and what to change. The dry run prints
them; `sweeps.api.run` refuses to submit when one fails (nothing is written or submitted).
The cluster file is the source of the world size (`world_refusal`). Without a cluster file
only the files check runs, against this host's limits (a local run opens the same shards).
"""

from __future__ import annotations

import math
import os
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import UsageError

from . import backend
from .cluster import ClusterConfig
from .job import GRACE_MARGIN_S, grace_for
from .plan import Plan, PlannedCell

PROCESS_FILES = 256
"""Open files a training rank holds besides the corpus (interpreter, libraries, logs, NCCL's
sockets): an allowance, not a measurement (a CPU torch process held 6 here, a CUDA rank holds
more)."""
PROCESS_MAPS = 4096
"""Memory maps a training rank holds besides the corpus: an allowance about 10x the 356 maps a
CPU torch process held here (CUDA's and NCCL's libraries add more, unmeasured here)."""
MAX_NODES = 4096
"""How far the 'nodes that would fit' search looks."""


@dataclass(frozen=True)
class Check:
    """One pre-submission check: its name, whether it passed, its one line."""

    name: str
    ok: bool
    line: str


def _gb(b: float) -> str:
    return f"{b / 1e12:.3g} TB" if b >= 1e12 else f"{b / 1e9:.4g} GB"


def largest_config(p: Plan) -> Any:
    """The training config of the plan's largest model per token (by FLOPs per token, then
    FLOPs): what the memory check and `make paper`'s micro-batch choice measure. Not the
    costliest by FLOPs: under one FLOPs budget the arms tie and the first cell (a baseline)
    would stand for a Free Transformer with more parameters."""
    return max(p.cells, key=lambda c: (c.flops_per_token, c.flops)).cfg


def _splits(cfg: Any, world: int) -> bool:
    return backend.batch_refusal(cfg, world) is None


def world_refusal(p: Plan, cluster: ClusterConfig, file: str) -> str | None:
    """One line when the cluster file's tasks (nodes x GPUs per node) do not split the global
    batch of the plan's cells, naming the nearest node counts and batch sizes that do."""
    if not p.cells:
        return None
    cfg = p.costliest.cfg
    n = cluster.tasks
    why = backend.batch_refusal(cfg, n)
    if why is None:
        return None
    nodes, g = int(cluster.or_default("nodes")), max(1, int(cluster.or_default("gpus_per_node")))
    below = next((k for k in range(nodes - 1, 0, -1) if _splits(cfg, k * g)), None)
    above = next((k for k in range(nodes + 1, MAX_NODES) if _splits(cfg, k * g)), None)
    near = " or ".join(f"nodes={k} ({k * g} GPUs)" for k in (below, above) if k)
    return (f"world: {file} gives {nodes} node(s) x {g} GPU(s) = {n} ranks, the world every "
            f"cell trains on, and {why}" + (f"; nearest valid in the cluster file: {near}"
                                            if near else ""))


def _time(p: Plan, cluster: ClusterConfig, todo: list[PlannedCell]) -> Check:
    rate = backend.gpu_rate(p.costliest.cfg)
    t_h = int(cluster.or_default("timeout_min")) / 60
    req = int(cluster.or_default("max_num_timeout"))
    allowed = t_h * (req + 1)
    if rate is None or not todo:
        why = "every cell is trained" if not todo else "no FLOP rate (not the trainer's config)"
        return Check("time", True, f"time: not checked, {why} (limit {allowed:.4g} h per cell)")
    n = cluster.tasks
    big = max(todo, key=lambda c: c.flops)
    hours = big.flops / (rate[0] * n) / 3600
    head = (f"time: cell {big.cell.name} needs ~{hours:,.4g} h on {n} GPU(s) (at MFU x "
            f"train.gpu_peak_tflops = {rate[0] / 1e12:.4g} TFLOP/s per GPU; MFU {rate[3]}), and "
            f"timeout_min="
            f"{int(cluster.or_default('timeout_min'))} x (max_num_timeout={req} + 1) allows "
            f"{allowed:,.4g} h")
    if hours <= allowed:
        return Check("time", True, head + " (each requeue also costs a start-up and the steps "
                                          "since the last checkpoint)")
    cfg = big.cfg
    nodes, g = int(cluster.or_default("nodes")), max(1, int(cluster.or_default("gpus_per_node")))
    fit = next((k for k in range(nodes + 1, MAX_NODES)
                if hours * n / (k * g) <= allowed and _splits(cfg, k * g)), None)
    more = math.ceil(hours / t_h) - 1
    alt = [f"nodes={fit} ({fit * g} GPUs, ~{hours * n / (fit * g):,.4g} h)" if fit else None,
           f"max_num_timeout={more}"]
    return Check("time", False, head + "; it fits with " + " or ".join(a for a in alt if a)
                 + " in the cluster file (each requeue also costs a start-up and the steps "
                   "since the last checkpoint: leave a margin)")


def _signal(p: Plan, cluster: ClusterConfig) -> Check:
    ck = backend.checkpoint_sizes(p.costliest.cfg, True)
    lead = int(cluster.or_default("signal_delay_s"))
    grace = grace_for(lead)
    gbps = float(cluster.write_gbps or 2.0)
    save = ck["full"] / (gbps * 1e9)
    head = (f"signal: USR2 {lead} s before the time limit leaves the trainer {grace:.0f} s to "
            f"checkpoint (the lead less {GRACE_MARGIN_S:.0f} s for the requeue); the planned save "
            f"of {_gb(ck['full'])} takes ~{save:.0f} s at write_gbps={gbps:g}")
    if save <= grace:
        return Check("signal", True, head)
    need = 60 * math.ceil((2 * save + GRACE_MARGIN_S) / 60)  # twice the planned save: margin
    return Check("signal", False, head + f"; set signal_delay_s={need} in the cluster file (or "
                                         "write_gbps to what the file system really gives)")


def memory(p: Plan, cluster: ClusterConfig) -> Check:
    """The largest cell's per-GPU peaks of training, validation and save, measured on fake
    tensors at its planned world with the mesh it will use (experiments/memory.py, cached),
    against train.gpu_memory_gb less a margin; failing, what fits instead (the same search
    `make paper` runs to choose it)."""
    cfg = largest_config(p)
    if not int(cluster.or_default("gpus_per_node")) or str(cfg.train.device) == "cpu":
        return Check("memory", True, "memory: not checked (a CPU job)")
    f = backend.memory_fit(cfg)
    own = f.tries[0][:2] == (f.micro_batch_size, f.activation_checkpointing)
    if own:
        return Check("memory", True, f"memory: {f.line()}")
    fix = (f"; OVERRIDES=\"{' '.join(f.overrides())}\" fits (make paper chooses it itself)"
           if f.micro_batch_size else "; more nodes in the cluster file, or a larger GPU")
    return Check("memory", False, f"memory: {f.line()}{fix}")


def host_limits() -> tuple[int | None, int | None]:
    """(open files, memory maps) a process of this host may hold: `ulimit -n` (the soft limit)
    and vm.max_map_count (read, never written); None where unreadable."""
    try:
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        nofile = None if nofile == resource.RLIM_INFINITY else int(nofile)
    except (ValueError, OSError):
        nofile = None
    try:
        maps: int | None = int(Path("/proc/sys/vm/max_map_count").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        maps = None
    return nofile, maps


def files(p: Plan, cluster: ClusterConfig | None, file: str | None) -> Check:
    """The corpus shards a rank keeps open (one file and one memory map each; at most the
    shard reader's LRU bound, experiments/corpus/shards.py's MAX_OPEN_SHARDS)
    against the compute nodes' limits (the cluster file's nofile / max_map_count) or this
    host's."""
    corpus = backend.corpus_of(p.costliest.cfg) if p.cells else None
    if corpus is None or corpus["shards"] is None:
        why = "no corpus" if corpus is None else corpus["source"]
        return Check("files", True, f"files: shards per rank not counted ({why})")
    host_nofile, host_maps = host_limits()
    nofile = (cluster.nofile if cluster is not None else None) or host_nofile
    maps = (cluster.max_map_count if cluster is not None else None) or host_maps
    where = (lambda key, v: f"{key}={v:,} ({file})" if cluster is not None
             and getattr(cluster, key) else f"this host's {v:,}")
    total = corpus["shards"]
    n = min(total, corpus.get("open_bound") or total)  # a rank keeps at most the LRU's bound open
    want_f, want_m = n + PROCESS_FILES, n + PROCESS_MAPS
    bad = []
    if nofile is not None and want_f > nofile:
        bad.append(f"open files {want_f:,} > {where('nofile', nofile)} (`ulimit -n`)")
    if maps is not None and want_m > maps:
        bad.append(f"memory maps {want_m:,} > {where('max_map_count', maps)} "
                   "(vm.max_map_count)")
    head = (f"files: each rank keeps at most {n:,} of {total:,} corpus shards open "
            f"({corpus['source']}) + about "
            f"{PROCESS_FILES} files and {PROCESS_MAPS} maps of its own")
    if not bad:
        lim = (f"; limits {nofile or 'unknown'} open files, {maps or 'unknown'} maps")
        return Check("files", True, head + lim)
    return Check("files", False, head + ": " + ", ".join(bad) + "; raise the limit on the "
                 "compute nodes (`ulimit -n` in the cluster file's setup; vm.max_map_count is "
                 "the administrator's), say what they are (nofile, max_map_count in the cluster "
                 "file), or build the corpus with larger shards (data.shard_bytes)")


def disk_need(p: Plan, gpus: bool = True) -> dict[str, Any]:
    """Bytes the cells still to run write under the results root at most, with the corpus
    counted once (every cell reads the same one): per cell the rotated step checkpoints and the
    one being written (full: weights and AdamW), and the weights-only exports (the kept
    evaluation checkpoints, of which the last is final.pt's hard link, or final.pt alone)."""
    todo = p.todo
    cells, corpora = 0, {}
    for c in todo:
        cfg = c.cfg
        cells += backend.run_disk(cfg, gpus)
        corpus = backend.corpus_of(cfg)
        if corpus is not None and not corpus["built"]:
            corpora[str(corpus["dir"])] = corpus["bytes"]
    return {"cells": cells, "n": len(todo), "corpus": sum(corpora.values()),
            "total": cells + sum(corpora.values())}


def disk(p: Plan, cluster: ClusterConfig) -> Check:
    """The cells still to run with the corpus counted once (`disk_need`: counted per cell, a
    6-cell 8B sweep asked for 12.8 TB where 3.6 TB is needed) against the free space under the
    cluster file's results root (or the sweep's)."""
    d = disk_need(p, gpus=int(cluster.or_default("gpus_per_node")) > 0)
    root = cluster.results or str(p.results)
    head = (f"disk: {d['n']} cell(s) to run write at most {_gb(d['cells'])} (rotated and "
            f"in-flight checkpoints, weights-only exports) + the corpus once "
            f"{_gb(d['corpus']) if d['corpus'] else '(built)'} = {_gb(d['total'])} under {root}")
    why = backend.space_refusal(os.path.expandvars(os.path.expanduser(root)), d["total"]) \
        if d["total"] else None
    if why is None:
        return Check("disk", True, head)
    return Check("disk", False, head + f"; {why}")


def checks(p: Plan, cluster: ClusterConfig | None, file: str | None = None) -> list[Check]:
    """Every check that applies: with a cluster file, time, signal, files and disk; without
    one, files against this host."""
    if not p.cells:
        return []
    if cluster is None:
        return [files(p, None, None)]
    return [_time(p, cluster, p.todo), _signal(p, cluster), memory(p, cluster),
            files(p, cluster, file), disk(p, cluster)]


def text(cs: list[Check]) -> list[str]:
    """The dry run's lines: each check, FAILS marked (a submission would be refused)."""
    if not cs:
        return []
    return ["pre-submission checks (a failing one refuses to submit):",
            *(f"  {'ok   ' if c.ok else 'FAILS'} {c.line}" for c in cs)]


def refuse(cs: list[Check]) -> None:
    """UsageError with the first failing check's line (the dry run shows them all)."""
    bad = [c for c in cs if not c.ok]
    if bad:
        more = f" (and {len(bad) - 1} more: DRY=1 lists them)" if len(bad) > 1 else ""
        raise UsageError(bad[0].line + more)
