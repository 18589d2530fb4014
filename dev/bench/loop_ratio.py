"""FT/baseline step time through the real training loop (issue 18), 1 thread.

    python -m dev.bench.loop_ratio [--reps 5] [--bits 8,12,16,16+bf16] [--work DIR]
        [--ft-overrides "model.mapper_bf16=true"]

Each rep runs the baseline, then every H, as `python -m experiments.train` (16M, T=256, batch 8,
10 steps, a 2048-token validation set); a run's step time is the median of 2048 / tokens_per_s
over steps 3-10 of its metrics.jsonl. The ratio of a rep is FT over the baseline of the same rep;
runs go to a scratch results root that is removed after each run. `--ft-overrides` applies to
the Free Transformer runs only (e.g. the bf16 mapper).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from common.paths import RunDir, cache_dir, runs_dir

REPO = Path(__file__).resolve().parents[2]
TOKENS_PER_STEP = 8 * 256


def step_s(bits: int, root: Path, env: dict[str, str], extra: tuple[str, ...] = ()) -> float:
    """Median seconds per step of steps 3-10 of one training run at H=bits (0 = baseline)."""
    cmd = [sys.executable, "-m", "experiments.train", "model=16M", f"model.latent_bits={bits}",
           "train.seq_len=256", "train.batch_size=8", "train.tokens=20480",
           "logging.log_every=1", "logging.val_every=0",
           "data.val_tokens=2048",  # the untimed step-0 and final validations: kept short
           *extra]
    shutil.rmtree(root, ignore_errors=True)
    try:
        p = subprocess.run(cmd, cwd=REPO, env={**env, "FTBENCH_RESULTS": str(root)},
                           capture_output=True, text=True, check=False)
        if p.returncode:
            raise RuntimeError(f"H={bits} exited {p.returncode}: {p.stderr[-500:]}")
        (run,) = [r for p in runs_dir(root).iterdir() if (r := RunDir(p)).has_metrics]
        recs = run.metrics_json()
        return statistics.median(TOKENS_PER_STEP / r["tokens_per_s"] for r in recs
                                 if r.get("kind") == "train" and 3 <= r["step"] <= 10)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dev.bench.loop_ratio")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--bits", default="8,12,16")
    p.add_argument("--work", default="/tmp/ftbench-loop-ratio")
    p.add_argument("--ft-overrides", default="", help="space-separated, Free Transformer runs only")
    a = p.parse_args(argv)
    # "16+bf16": H=16 with the bf16 mapper, paired in the same rep as the plain H=16
    bits = ["0"] + [b.strip() for b in a.bits.split(",")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "FTBENCH_CACHE": str(cache_dir())}  # the tokenized corpus is shared, not rebuilt
    res: dict[str, list[float]] = {h: [] for h in bits}
    for r in range(a.reps):
        for h in bits:
            extra = tuple(a.ft_overrides.split()) if h != "0" else ()
            if h.endswith("+bf16"):
                extra += ("model.mapper_bf16=true",)
            res[h].append(step_s(int(h.split("+")[0]), Path(a.work) / f"r{r}_h{h}", env, extra))
            print(f"rep {r} H={h} step {res[h][-1] * 1e3:.0f} ms, load {os.getloadavg()}",
                  flush=True)
    for h in bits[1:]:
        ratios = [x / y for x, y in zip(res[h], res["0"], strict=True)]
        print(f"H={h}: ratios {[round(x, 3) for x in ratios]}, "
              f"median {statistics.median(ratios):.3f} (n={len(ratios)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
