"""The bench's measuring kit: sizes, interleaved paired timing, peak memory, machine facts."""

from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from common.provenance import git_commit, versions

SCHEMA = "ftbench-bench-v1"
ALL_SECTIONS = ("train", "free", "mapper", "generate", "generate_batch", "eval", "save")
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Size:
    """Everything the size knob changes."""

    preset: str
    overrides: dict[str, Any]
    batch: int
    seq_len: int
    reps: int
    warmup: int
    overhead_bits: tuple[int, ...]
    xt_bits: tuple[int, ...]
    mapper_bits: tuple[int, ...]
    mapper_tokens: tuple[int, ...]
    mapper_dim: int
    matmul_n: int
    gen_prompt: int
    gen_new: int
    eval_requests: int
    gen_batch: int


SIZES: dict[str, Size] = {
    "full": Size(preset="16M", overrides={}, batch=8, seq_len=256, reps=5, warmup=2,
                 overhead_bits=(8, 12, 16), xt_bits=(8, 16), mapper_bits=(8, 12, 16),
                 mapper_tokens=(256, 1024, 4096), mapper_dim=256, matmul_n=2048,
                 gen_prompt=32, gen_new=256, eval_requests=200, gen_batch=16),
    "tiny": Size(preset="1M", overrides={"vocab_size": 512, "dim": 64, "ffn_dim": 128},
                 batch=2, seq_len=32, reps=5, warmup=1, overhead_bits=(4, 8),
                 xt_bits=(4,), mapper_bits=(4, 6), mapper_tokens=(32, 128), mapper_dim=16,
                 matmul_n=128, gen_prompt=4, gen_new=8, eval_requests=8, gen_batch=8),
}


# ---------------------------------------------------------------------------- timing helpers
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def summary(xs: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs),
            "values": list(xs)}


def paired_ratio(num: list[float], den: list[float]) -> dict[str, Any]:
    """Per-rep ratios num[i] / den[i] (measured in the same rep), summarised."""
    return summary([a / b for a, b in zip(num, den, strict=True)])


def interleaved(fns: dict[str, Callable[[], object]], reps: int, warmup: int,
                device: torch.device) -> dict[str, list[float]]:
    """Seconds per call of each fn, run in turn each rep (the order rotates every rep)."""
    names = list(fns)
    for _ in range(warmup):
        for n in names:
            fns[n]()
            sync(device)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(reps):
        k = r % len(names)
        gc.collect()  # once per round, not per call: a full collection is slow with torch loaded
        for n in names[k:] + names[:k]:
            sync(device)
            t0 = time.perf_counter()
            fns[n]()
            sync(device)
            times[n].append(time.perf_counter() - t0)
    return times


def peak_alloc_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes held by torch's allocator during fn(), above what was held before it. CUDA:
    max_memory_allocated; CPU: the peak running sum of torch.profiler's `[memory]` events."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - base)
    from torch.profiler import ProfilerActivity, profile

    # kineto prints two "USDT ... profiler_start/stop" lines per call on stderr (read at its
    # first use); the bench calls this hundreds of times. A user's own setting wins.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    mem = [e for e in events if e.get("name") == "[memory]"
           and e.get("args", {}).get("Device Type", 0) == 0]
    mem.sort(key=lambda e: (e["ts"], e["args"].get("Ev Idx", 0)))
    cur = peak = 0
    for e in mem:
        cur += int(e["args"]["Bytes"])
        peak = max(peak, cur)
    return peak


# ---------------------------------------------------------------------------- machine
def matmul_fn(n: int, device: torch.device) -> tuple[Callable[[], object], float]:
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    return (lambda: torch.mm(a, b)), 2.0 * n ** 3


def machine_info(device: torch.device) -> dict[str, Any]:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info: dict[str, Any] = {
        "torch": torch.__version__, "python": platform.python_version(),
        "platform": platform.platform(), "cpu": cpu, "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads(),
        "device": str(device), "mkldnn": torch.backends.mkldnn.is_available(),
        "loadavg_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    info.update({k: v for k, v in versions("transformers", "x_transformers", "lm_eval").items()
                 if k != "python"})  # None: not installed (optional packages)
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    info["git_commit"] = git_commit()
    return info


@dataclass
class Ctx:
    size: Size
    device: torch.device
    notes: list[str] = field(default_factory=list)
