"""`make gpu-check`: a smoke test of about 5 minutes for a first GPU node.

On whatever GPUs are visible it trains both arms (baseline, Free Transformer H=16) for a few
steps through experiments/train/trainer.py:
- fp32 (reference) and bf16 autocast + torch.compile, one GPU; the bf16 loss must stay within
  `--tol` (relative) of fp32 at every step;
- flash SDPA: a bf16 forward + backward of each arm under `sdpa_kernel(FLASH_ATTENTION)` only
  (fails if the flash kernel cannot run);
- DDP and FSDP over all visible GPUs (torchrun, nccl), bf16 + compile; their losses against the
  one-GPU bf16 run;
- tokens/s (the trainer's metrics) and MFU against the GPU's dense bf16 peak (a table by device
  name; null with a reason for an unknown GPU), and the binary mapper's share of the Free
  Transformer's step time (CUDA events, the mapper's forward + backward alone vs a whole step).

Writes <results>/gpu_check/<UTC timestamp>.json (`make bench` can cite it) and prints a summary.
Exit codes: 0 all checks passed, 1 a check failed, 2 no CUDA device visible (one line).

    python -m experiments.gpu_check [--preset 16M] [--steps 30] [--tol 0.05] [--results DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from common.io import atomic_write_text
from common.paths import results_root, runs_dir

PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "GH200": 989.0, "A100": 312.0, "L40S": 362.0,
                    "A10G": 70.0, "L4": 121.0, "B200": 2250.0}
"""Dense bf16 peak per GPU (vendor datasheets, SXM where there are variants), by name part."""


def peak_tflops(name: str) -> tuple[float | None, str]:
    for key, v in PEAK_BF16_TFLOPS.items():
        if key in name:
            return v, f"datasheet dense bf16 peak of {key}"
    return None, f"unknown GPU {name!r}: no bf16 peak in experiments/gpu_check.py"


def _losses(run: Path) -> list[float]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r["kind"] == "train"]


def _tokens_per_s(run: Path) -> float | None:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    tps = [r["tokens_per_s"] for r in rows if r["kind"] == "train"][3:]  # past compilation
    return sorted(tps)[len(tps) // 2] if tps else None


def _train(args: list[str], results: Path, nproc: int = 1) -> tuple[Path | None, str]:
    from experiments.train.config import compose
    from experiments.train.plan import run_dir

    cmd = [sys.executable, "-m", "experiments.train", *args, f"paths.results={results}"]
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", str(nproc), *cmd[1:]]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"exit {r.returncode}: {tail[:300]}"
    return run_dir(compose([*args, f"paths.results={results}"])), "ok"


def _timed_ms(fn: Any, n: int = 5) -> float:
    fn()  # warm-up
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / n


def _mapper_share(m: torch.nn.Module, x: torch.Tensor, h: int, n: int = 5) -> dict[str, Any]:
    """The binary mapper's forward + backward alone vs a whole bf16 training forward +
    backward of the Free Transformer, each the mean of `n` timed calls after a warm-up."""
    from model.free_transformer import latent_embedding

    def step() -> None:
        with torch.autocast("cuda", torch.bfloat16):
            m(x, targets=x).loss.backward()

    logits = torch.randn(x.numel(), h, device=x.device, requires_grad=True)
    codes = torch.randint(0, 1 << h, (x.numel(),), device=x.device)
    w = m.post_sampler.weight

    def mapper(bf16: bool = False) -> None:
        latent_embedding(logits, w, codes, m.cfg.mapper_chunk_bytes, bf16).sum().backward()

    t_step, t_map = _timed_ms(step, n), _timed_ms(mapper, n)
    t_bf16 = _timed_ms(lambda: mapper(True), n)  # model.mapper_bf16=true
    return {"step_ms": t_step, "mapper_ms": t_map, "mapper_share": t_map / t_step, "mapper_n": n,
            "mapper_bf16_ms": t_bf16}


def _flash_and_mapper(preset: str, micro: int, seq: int) -> dict[str, Any]:
    """Flash SDPA forward + backward of both arms in bf16, and the mapper's share of a step."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from model import build_model, get_preset

    out: dict[str, Any] = {}
    dev = torch.device("cuda")
    for arm, h in (("baseline", 0), ("free", 16)):
        m = build_model(get_preset(preset, latent_bits=h)).to(dev)
        x = torch.randint(0, m.cfg.vocab_size, (micro, seq), device=dev)
        try:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.autocast("cuda",
                                                                         torch.bfloat16):
                m(x, targets=x).loss.backward()
            out[f"flash_{arm}"] = "ok"
        except RuntimeError as e:
            out[f"flash_{arm}"] = f"failed: {str(e).splitlines()[0][:200]}"
        if h:
            out.update(_mapper_share(m, x, h))
        del m
        torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="16M")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--tol", type=float, default=0.05,
                    help="largest relative difference of a bf16 step's loss from fp32's")
    ap.add_argument("--results", default=None)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print("error: no CUDA device visible (make gpu-check needs a GPU node)", file=sys.stderr)
        return 2
    n = torch.cuda.device_count()
    name = torch.cuda.get_device_name(0)
    peak, peak_src = peak_tflops(name)
    root = results_root(a.results)
    work = runs_dir(root / "gpu_check")
    seq, batch = 256, 8 * n
    base = [f"model={a.preset}", f"train.seq_len={seq}", f"train.batch_size={batch}",
            f"train.tokens={a.steps * batch * seq}", "logging.progress=false",
            "logging.log_every=1", "logging.val_every=0", "data.val_tokens=4096",
            "train.force=true"]
    from experiments.train.config import compose
    from experiments.train.plan import plan

    t0 = time.time()
    checks: list[dict[str, Any]] = []
    ok = True
    for arm, h in (("baseline", 0), ("free", 16)):
        args = [*base, f"model.latent_bits={h}", f"train.micro_batch_size={batch // n}"]
        fpt = plan(compose(args), 1).flops_per_token
        ref, why = _train([*args, "train.precision=fp32"], work)
        one, why1 = _train([*args, "train.precision=bf16", "train.compile=true"], work)
        row: dict[str, Any] = {"arm": arm, "latent_bits": h, "fp32": why, "bf16_compile": why1}
        if ref and one:
            a32, a16 = _losses(ref), _losses(one)
            rel = max(abs(x - y) / abs(x) for x, y in zip(a32, a16, strict=True))
            row["bf16_vs_fp32_max_rel"] = rel
            row["bf16_within_tol"] = rel <= a.tol
            tps = _tokens_per_s(one)
            row["tokens_per_s_1gpu"] = tps
            row["mfu_1gpu"] = tps * fpt / (peak * 1e12) if tps and peak else None
        for mode in ("ddp", "fsdp"):
            if n < 2:
                row[mode] = f"skipped: {n} GPU visible"
                continue
            run, w = _train([*args, "train.precision=bf16", "train.compile=true",
                             f"train.parallel={mode}"], root / "gpu_check" / mode, nproc=n)
            row[mode] = w
            if run and one:
                d = max(abs(x - y) / abs(x)
                        for x, y in zip(_losses(one), _losses(run), strict=True))
                row[f"{mode}_vs_1gpu_max_rel"] = d
                tps = _tokens_per_s(run)
                row[f"tokens_per_s_{mode}"] = tps
                row[f"mfu_{mode}"] = tps * fpt / (n * peak * 1e12) if tps and peak else None
        ok &= all(v in ("ok",) or not isinstance(v, str) or v.startswith("skipped")
                  for k, v in row.items() if k in ("fp32", "bf16_compile", "ddp", "fsdp"))
        ok &= bool(row.get("bf16_within_tol"))
        checks.append(row)
    kern = _flash_and_mapper(a.preset, 8, seq)
    ok &= all(kern.get(f"flash_{arm}") == "ok" for arm in ("baseline", "free"))
    doc = {"created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "gpu": name, "n_gpus": n, "peak_bf16_tflops": peak, "peak_source": peak_src,
           "torch": torch.__version__, "cuda": torch.version.cuda, "preset": a.preset,
           "steps": a.steps, "seq_len": seq, "global_batch": batch, "tolerance": a.tol,
           "arms": checks, "kernels": kern, "passed": ok, "wall_s": time.time() - t0,
           "host": os.uname().nodename}
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = root / "gpu_check" / f"{stamp}.json"
    atomic_write_text(path, json.dumps(doc, indent=2) + "\n")
    for row in checks:
        print(f"{row['arm']:8s} bf16/fp32 max rel {row.get('bf16_vs_fp32_max_rel')}, "
              f"tokens/s {row.get('tokens_per_s_1gpu')}, MFU {row.get('mfu_1gpu')}, "
              f"ddp {row.get('ddp')}, fsdp {row.get('fsdp')}")
    print(f"mapper share of the FT step: {kern.get('mapper_share')}; flash: "
          f"{kern.get('flash_baseline')}/{kern.get('flash_free')}")
    print(f"{'passed' if ok else 'FAILED'}; wrote {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
