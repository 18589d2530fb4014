"""What the chunked readout costs or saves: a training step (forward + backward, the loss
unchunked vs `chunked_loss`) and a validation forward (unchunked CE vs `scores=True`), for one
model shape, in time and in peak memory.

    python -m dev.bench.readout_chunk --preset 1M --vocab 131072 --seq 1024 --micro 1
    python -m dev.bench.readout_chunk --preset 16M --seq 512 --micro 8

Memory, two ways: torch's MemTracker on fake tensors (the allocator's view of this process's
tensors; nothing is allocated, so it is independent of the machine's load), and the real peak:
on CUDA `torch.cuda.max_memory_allocated`, on CPU the peak RSS of a fresh process per case (each
case runs in its own subprocess, so one case's peak does not hide another's). Time: the median
of --reps steps after --warmup, in the same process, as wall seconds and as this process's CPU
seconds (with --threads 1 on a CPU, the CPU seconds hardly depend on other processes' load; the
wall seconds do: compare them only on an otherwise idle machine).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

import torch

from model import build_model, get_preset

CASES = ("train", "train-chunked", "val", "val-scores")


def _model(args: argparse.Namespace, device: torch.device) -> torch.nn.Module:
    over: dict[str, Any] = {"max_seq_len": max(args.seq, get_preset(args.preset).max_seq_len)}
    if args.vocab:
        over["vocab_size"] = args.vocab
    if args.latent_bits:
        over["latent_bits"] = args.latent_bits
    with device:  # built in place (a fake model cannot be moved)
        m = build_model(get_preset(args.preset, **over))
    m.readout_chunk_bytes = args.chunk_mib << 20
    return m


def _step(m: torch.nn.Module, case: str, x: torch.Tensor, autocast: Any) -> None:
    if case.startswith("train"):
        m.train()
        m.chunked_loss = case == "train-chunked"
        with autocast():
            out = m(x, targets=x)
        out.loss.backward()
        m.zero_grad(set_to_none=True)
    else:
        m.eval()
        with torch.no_grad(), autocast():
            m(x, targets=x, scores=case == "val-scores",
              z="prior" if m.cfg.is_free else None)


def _autocast(device: torch.device, bf16: bool) -> Any:
    return lambda: torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)


def tracked_peak(args: argparse.Namespace, case: str) -> int:
    """MemTracker's peak (bytes) of one step, on fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    dev = torch.device(args.device)
    with FakeTensorMode():
        m = _model(args, dev)
        rows = args.micro if case.startswith("train") else args.val_rows
        x = torch.randint(0, m.cfg.vocab_size, (rows, args.seq), device=dev)
        mt = MemTracker()
        mt.track_external(m, x)
        with mt:
            _step(m, case, x, _autocast(dev, args.bf16))
        return max(s["Total"] for s in mt.get_tracker_snapshot("peak").values())


def measure(args: argparse.Namespace, case: str) -> dict[str, Any]:
    """Time and real peak memory of one case, in this process."""
    dev = torch.device(args.device)
    torch.manual_seed(0)
    m = _model(args, dev)
    rows = args.micro if case.startswith("train") else args.val_rows
    x = torch.randint(0, m.cfg.vocab_size, (rows, args.seq), device=dev)
    ac = _autocast(dev, args.bf16)
    times, cpu = [], []
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    for i in range(args.warmup + args.reps):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0, c0 = time.perf_counter(), time.process_time()
        _step(m, case, x, ac)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    peak = (torch.cuda.max_memory_allocated(dev) if dev.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    return {"case": case, "median_s": statistics.median(times),
            "median_cpu_s": statistics.median(cpu), "n": len(times),
            "peak_bytes": peak, "peak_kind": "cuda max_memory_allocated" if dev.type == "cuda"
            else "process peak RSS", "tokens": rows * args.seq}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="1M")
    ap.add_argument("--vocab", type=int, default=0, help="vocabulary (0: the preset's)")
    ap.add_argument("--latent-bits", type=int, default=0)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--micro", type=int, default=1, help="training rows per step")
    ap.add_argument("--val-rows", type=int, default=16, help="validation rows per forward")
    ap.add_argument("--chunk-mib", type=int, default=256, help="readout_chunk_bytes in MiB")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (as the GPU recipes)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--no-time", action="store_true", help="tracked memory only")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a child process: measure one case
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.one:
        print(json.dumps(measure(args, args.one)))
        return 0
    cases = [c for c in args.cases.split(",") if c]
    bad = [c for c in cases if c not in CASES]
    if bad:
        print(f"--cases: unknown {bad}; allowed: {list(CASES)}", file=sys.stderr)
        return 2
    for case in cases:
        row: dict[str, Any] = {"case": case, "tracked_peak_mib": tracked_peak(args, case) >> 20}
        if not args.no_time:
            child = [sys.executable, "-m", "dev.bench.readout_chunk", "--one", case,
                     *(argv if argv is not None else sys.argv[1:])]
            r = subprocess.run(child, capture_output=True, text=True, check=True)
            got = json.loads(r.stdout.strip().splitlines()[-1])
            row.update({"median_s": round(got["median_s"], 4),
                        "median_cpu_s": round(got["median_cpu_s"], 4), "n": got["n"],
                        "real_peak_mib": got["peak_bytes"] >> 20,
                        "real_peak_kind": got["peak_kind"]})
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
