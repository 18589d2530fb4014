"""Data-parallel evaluation speed-up: the same requests scored by 1 process and by N gloo
processes (`lm_adapter.DataParallel`), wall time of each and the ratio, with the machine's load.

    python -m dev.bench.dp_bench CKPT [--procs 2] [--n 64] [--window 128]

Requests: n loglikelihood pairs (4 continuations per context, as a multiple-choice task),
n/4 rolling strings and n/4 generations of 16 tokens, cut from the offline smoke data's text so
nothing downloads. Each process runs one torch thread. Prints one Markdown table row.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import socket
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

SMOKE = Path(__file__).resolve().parents[2] / "experiments" / "eval" / "smoke_data"


class _Req:
    def __init__(self, *args: object) -> None:
        self.args = args


def requests(n: int) -> dict[str, list]:
    """Deterministic requests from the smoke data's ARC questions (text only)."""
    texts = []
    for f in sorted(SMOKE.rglob("*.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            texts.append(json.dumps(json.loads(line))[:400])
    texts = (texts * (1 + 4 * n // max(1, len(texts))))[:max(4, n)]
    pairs = [(t[:200], " " + t[200 + 20 * j:220 + 20 * j]) for t in texts[:n // 4 or 1]
             for j in range(4)]
    return {"pairs": pairs, "rolling": texts[:max(1, n // 4)],
            "gen": [(t[:160], {"until": ["\n\n"], "max_gen_toks": 16})
                    for t in texts[:max(1, n // 4)]]}


def _work(lm, reqs: dict[str, list]) -> list:
    out = [lm.loglikelihood_pairs(reqs["pairs"], disable_tqdm=True)]
    out.append(lm.loglikelihood_rolling([_Req(s) for s in reqs["rolling"]], disable_tqdm=True))
    out.append(lm.generate_until([_Req(c, g) for c, g in reqs["gen"]], disable_tqdm=True))
    return out


def _rank(rank: int, world: int, port: int, ckpt: str, window: int, n: int, out: str) -> None:
    import torch.distributed as dist

    from experiments.eval.lm_adapter import DataParallel, FTBenchLM

    torch.set_num_threads(1)
    dp = None
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world)
        dp = DataParallel(rank, world)
    lm = FTBenchLM(checkpoint=ckpt, max_length=window, batch_size=8, progress=False,
                   data_parallel=dp)
    reqs = requests(n)
    if dp is not None:
        dist.barrier()
    if rank > 0:
        lm.serve()
    else:
        t0 = time.perf_counter()
        try:
            res = _work(lm, reqs)
        finally:
            lm.stop_workers()
        Path(out).write_bytes(pickle.dumps((time.perf_counter() - t0, res)))
    if dp is not None:
        dist.destroy_process_group()


def run(ckpt: str, world: int, window: int, n: int) -> tuple[float, list]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        out = str(Path(d) / "res.pkl")
        mp.start_processes(_rank, args=(world, port, ckpt, window, n, out), nprocs=world,
                           join=True, start_method="spawn")
        return pickle.loads(Path(out).read_bytes())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dev.bench.dp_bench")
    ap.add_argument("ckpt")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--window", type=int, default=128)
    a = ap.parse_args(argv)
    load0 = os.getloadavg()
    t1, r1 = run(a.ckpt, 1, a.window, a.n)
    tn, rn = run(a.ckpt, a.procs, a.window, a.n)
    load1 = os.getloadavg()
    print(f"| {a.n} pairs + {a.n // 4} rolling + {a.n // 4} generations, window {a.window} "
          f"| {t1:.1f} s | {tn:.1f} s ({a.procs} procs) | {t1 / tn:.2f}x "
          f"| {'identical' if r1 == rn else 'DIFFERENT'} "
          f"| {os.cpu_count()} cores, load {load0[0]:.1f} -> {load1[0]:.1f} |")
    return 0 if r1 == rn else 1


if __name__ == "__main__":
    raise SystemExit(main())
