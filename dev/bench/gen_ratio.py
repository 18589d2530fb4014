"""Batched generation, ours over HF `generate`, on a shared machine (issue 27).

    python -m dev.bench.gen_ratio [--threads 1] [--reps 5] [--warmup 1]
    PYTHONPATH=<other checkout> python <this file> ...   # the same workload on other code

Runs the bench's `generate_batch` section (16M baseline, batch 16, prompts of 8-32 tokens
left-padded, up to 256 new tokens, greedy, token stop sequences) with its contenders interleaved
rep by rep in this process, and prints one JSON line: the paired ratios HF / ours, both
contenders' seconds, the rows equal to HF's, the load average at start and end, and which
checkout's `model` ran. Run checkouts in alternating processes to compare them in one window.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dev.bench.gen_ratio")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds before the reps")
    p.add_argument("--table", default="", help="print a Markdown table of the JSON lines in "
                   "this file (earlier runs' output) instead of running")
    a = p.parse_args(argv)
    if a.table:
        try:
            print(table(Path(a.table)))
        except (OSError, ValueError, KeyError) as e:
            print(f"gen_ratio: --table {a.table}: {e}", file=sys.stderr)
            return 2
        return 0
    if a.threads < 1 or a.reps < 1 or a.warmup < 0:
        print("gen_ratio: --threads and --reps must be >= 1, --warmup >= 0", file=sys.stderr)
        return 2
    torch.set_num_threads(a.threads)
    import model
    from experiments.bench.harness import SIZES, Ctx
    from experiments.bench.sections import section_generate_batch

    size = replace(SIZES["full"], reps=a.reps, warmup=a.warmup)
    ctx = Ctx(size=size, device=torch.device("cpu"))
    load0, t0 = os.getloadavg(), time.time()
    out = section_generate_batch(ctx)
    code = Path(model.__file__).resolve().parents[1]
    rev = subprocess.run(["git", "-C", str(code), "rev-parse", "HEAD"], capture_output=True,
                         text=True, check=False).stdout.strip() or None
    print(json.dumps({
        "code": str(code), "commit": rev, "threads": a.threads,
        "torch": torch.__version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_start": load0, "load_end": os.getloadavg(), "wall_s": time.time() - t0,
        "ratio_hf_over_ours": out["speedup_ours_over_hf"], "ours_s": out["ours"]["s"],
        "hf_s": out["hf_generate"]["s"], "hf_rows_equal": out["hf_rows_equal"],
        "rows": out["batch"], "new_tokens_kept": out["new_tokens_kept"]}))
    return 0


def table(path: Path) -> str:
    """The runs of a JSON-lines file of this script's output as Markdown rows (for BENCH.md)."""
    rows = ["| code (commit) | created (UTC) | threads | n | HF / ours, median [min, max] | "
            "ours s (median) | HF s (median) | rows equal to HF | load at start -> end |",
            "|---|---|---|---|---|---|---|---|---|"]
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        d = json.loads(line)
        r = d["ratio_hf_over_ours"]
        rows.append(f"| {(d['commit'] or '?')[:7]} | {d['created']} | {d['threads']} | "
                    f"{r.get('n', '?')} | {r['median']:.2f} [{r['min']:.2f}, {r['max']:.2f}] | "
                    f"{d['ours_s']['median']:.2f} | {d['hf_s']['median']:.2f} | "
                    f"{d['hf_rows_equal']}/{d['rows']} | "
                    f"{d['load_start'][0]:.1f} -> {d['load_end'][0]:.1f} |")
    return "\n".join(rows)


if __name__ == "__main__":
    raise SystemExit(main())
