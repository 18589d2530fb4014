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

    python -m pipelines.gpu_check [--preset 16M] [--steps 30] [--tol 0.05] [--results DIR]
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
from common.paths import RunDir, results_root, runs_dir

PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "GH200": 989.0, "A100": 312.0, "L40S": 362.0,
                    "A10G": 70.0, "L4": 121.0, "B200": 2250.0}
"""Dense bf16 peak per GPU (vendor datasheets, SXM where there are variants), by name part."""


def peak_tflops(name: str) -> tuple[float | None, str]:
    for key, v in PEAK_BF16_TFLOPS.items():
        if key in name:
            return v, f"datasheet dense bf16 peak of {key}"
    return None, f"unknown GPU {name!r}: no bf16 peak in pipelines/gpu_check.py"


def _losses(run: Path) -> list[float]:
    rows = RunDir(run).metrics_json()
    return [r["loss"] for r in rows if r["kind"] == "train"]


def _tokens_per_s(run: Path) -> float | None:
    rows = RunDir(run).metrics_json()
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


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train_nodes(args: list[str], results: Path, nodes: int, per_node: int,
                 env: dict[str, str] | None = None, gpus: bool = False
                 ) -> tuple[Path | None, str]:
    """`nodes` torchrun agents of `per_node` processes on this host, meeting through the c10d
    rendezvous at 127.0.0.1 (what `make train NNODES=.. NODE_RANK=.. MASTER_ADDR=..` runs on
    each node), as a stand-in for several nodes when only one is here."""
    from experiments.train.config import compose
    from experiments.train.plan import run_dir

    port = _free_port()
    env = {**os.environ, **(env or {})}
    procs = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--node_rank",
         str(r), "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}",
         "--rdzv_id", f"gpu-check-{port}", "--nproc_per_node", str(per_node),
         "-m", "experiments.train", *args, f"paths.results={results}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        # on GPUs each simulated node sees its own per_node devices, as a real node would
        env={**env, "CUDA_VISIBLE_DEVICES": ",".join(
            str(r * per_node + i) for i in range(per_node))} if gpus else env)
        for r in range(nodes)]
    errs = [p.communicate()[1] for p in procs]
    bad = [(p.returncode, e) for p, e in zip(procs, errs, strict=True) if p.returncode]
    if bad:
        tail = (bad[0][1].strip().splitlines() or ["no output"])[-1]
        return None, f"exit {bad[0][0]}: {tail[:300]}"
    return run_dir(compose([*args, f"paths.results={results}"])), "ok"


def _max_rel(a: list[float], b: list[float]) -> float:
    if len(a) != len(b):
        return float("inf")
    return max(abs(x - y) / max(abs(x), 1e-12) for x, y in zip(a, b, strict=True))


def _weights(run: Path) -> dict[str, torch.Tensor] | None:
    """The final weights of a run (the trainer's final checkpoint), None if absent."""
    final = RunDir(run).final_checkpoint
    if not final.is_file():
        return None
    state = torch.load(final, map_location="cpu", weights_only=True)
    return state.get("model", state)


def _resume_round_trip(args: list[str], results: Path, ref: Path, run: Any) -> dict[str, Any]:
    """The sharded checkpoint round trip, kept generic over the checkpoint format: after a
    finished run, drop its final checkpoint and every step checkpoint but the oldest kept one,
    rerun the same command (the trainer resumes from what is left) and compare the resumed
    run's final weights and losses with the uninterrupted reference."""
    import shutil

    from experiments.train.checkpointer import shard_dir

    d = run(args, results)[0]
    if d is None:
        return {"resume": "failed: the first run did not finish"}
    rd = RunDir(d)
    steps = rd.step_checkpoints()
    if len(steps) < 2:
        return {"resume": f"skipped: {len(steps)} step checkpoint(s) kept, need 2"}
    # as if the run had stopped right after its oldest kept checkpoint: every later step
    # checkpoint (its marker and its shards), every later export and the final one go
    first = steps[0][0]
    for _, p in steps[1:]:
        shutil.rmtree(shard_dir(p), ignore_errors=True)
        p.unlink()
    for step, p in rd.eval_checkpoints():
        if step > first:
            p.unlink()
    rd.final_checkpoint.unlink(missing_ok=True)
    d2, why = run([a for a in args if a != "train.force=true"], results)  # resume, not redo
    if d2 is None:
        return {"resume": why}
    a, b = _weights(ref), _weights(d2)
    out: dict[str, Any] = {"resume": "ok", "resumed_from_step": steps[0][0],
                           "resume_loss_max_rel": _max_rel(_losses(ref)[-1:], _losses(d2)[-1:])}
    if a is not None and b is not None:
        out["resume_weights_max_abs"] = max((a[k].float() - b[k].float()).abs().max().item()
                                            for k in a)
    return out


def _bf16_export(run: Path) -> dict[str, Any]:
    """The bf16 weights-only export, where the trainer writes one: every tensor bf16 and equal
    to the final weights rounded to bf16."""
    found = [p for p in run.rglob("*") if p.is_file() and "export" in p.name]
    if not found:
        return {"bf16_export": "skipped: this trainer wrote no export file"}
    w = _weights(run)
    try:
        e = torch.load(found[0], map_location="cpu", weights_only=True)
    except Exception as ex:  # noqa: BLE001 - a format this check cannot read: say so
        return {"bf16_export": f"skipped: {found[0].name} unreadable here ({type(ex).__name__})"}
    e = e.get("model", e) if isinstance(e, dict) else e
    ok = w is not None and all(
        v.dtype == torch.bfloat16 and torch.equal(v, w[k].to(torch.bfloat16))
        for k, v in e.items() if k in w)
    return {"bf16_export": "ok" if ok else f"failed: {found[0].name} differs from bf16(final)"}


def topology(base: list[str], work: Path, per_node: int, tol: float,
             env: dict[str, str] | None = None, gpus: bool = False) -> dict[str, Any]:
    """DDP and FSDP on 1 node (per_node processes) and on 2 nodes (two c10d agents of
    per_node // 2 or 1 process on this host), each against one process; the sharded
    checkpoint round trip under FSDP over 2 nodes; the bf16 export."""
    one, why = _train_nodes(base, work / "one", 1, 1, env, gpus)
    out: dict[str, Any] = {"one_process": why}
    ok = one is not None
    half = max(1, per_node // 2)
    for mode in ("ddp", "fsdp"):
        for nodes, per in ((1, per_node), (2, half)):
            key = f"{mode}_{nodes}node"
            run, w = _train_nodes([*base, f"train.parallel={mode}"], work / key, nodes, per, env,
                                  gpus)
            out[key] = w
            if run is not None and one is not None:
                d = _max_rel(_losses(one), _losses(run))
                out[f"{key}_vs_1proc_max_rel"] = d
                ok &= d <= tol
            ok &= w == "ok"
    rt = _resume_round_trip(
        [*base, "train.parallel=fsdp", "logging.ckpt_every=1", "logging.keep_checkpoints=3"],
        work / "resume", one, lambda a, r: _train_nodes(a, r, 2, half, env, gpus)) \
        if one is not None else {"resume": "skipped: no reference run"}
    out.update(rt)
    ok &= rt["resume"] == "ok" and rt.get("resume_weights_max_abs", 0.0) <= 1e-4
    if one is not None:
        out.update(_bf16_export(one))
        ok &= not str(out["bf16_export"]).startswith("failed")
    out["passed"] = bool(ok)
    return out


def cpu_main(results: str | None, steps: int, tol: float) -> int:
    """GPU_CHECK_CPU=1: the multi-process and multi-node code paths on this CPU (gloo), at the
    1M preset: DDP and FSDP on 1 and 2 simulated nodes against one process, the resume round
    trip, the bf16 export. No speed figures (a CPU says nothing about a GPU's)."""
    root = results_root(results)
    work = runs_dir(root / "gpu_check_cpu")
    base = ["data=synthetic", "model=1M", "model.dim=64", "model.ffn_dim=128", "model.n_layers=2",
            "model.latent_bits=4", "train.batch_size=8", "train.micro_batch_size=2",
            "train.seq_len=64", f"train.tokens={steps * 8 * 64}", "data.val_tokens=256",
            "logging.progress=false", "logging.log_every=1", "logging.val_every=0",
            "optim.warmup_steps=1", "train.force=true", "train.device=cpu"]
    t0 = time.time()
    doc = topology(base, work, 2, tol, env={"OMP_NUM_THREADS": "1"})
    doc.update(created=datetime.now(timezone.utc).isoformat(timespec="seconds"), mode="cpu",
               torch=torch.__version__, steps=steps, tolerance=tol, wall_s=time.time() - t0,
               host=os.uname().nodename)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = root / "gpu_check" / f"cpu-{stamp}.json"
    atomic_write_text(path, json.dumps(doc, indent=2) + "\n")
    for k, v in doc.items():
        if isinstance(v, str) and k not in ("created", "mode", "torch", "host"):
            print(f"{k:16s} {v}")
    print(f"{'passed' if doc['passed'] else 'FAILED'}; wrote {path}")
    return 0 if doc["passed"] else 1


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
    ap.add_argument("--cpu", action="store_true",
                    help="reduced mode on CPU (GPU_CHECK_CPU=1): DDP/FSDP on 1 and 2 simulated "
                         "nodes, resume round trip, bf16 export; gloo, preset 1M")
    a = ap.parse_args(argv)
    if a.cpu:
        return cpu_main(a.results, min(a.steps, 4), a.tol)
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
    topo: dict[str, Any] = {"passed": True, "skipped": f"{n} GPU visible, 2 needed"}
    if n >= 2:  # 1 and 2 (simulated) nodes, fp32 so the comparison is against one process
        topo = topology([*base, "model.latent_bits=16", f"train.micro_batch_size={batch // n}",
                         "train.precision=fp32", "logging.ckpt_every=10"],
                        root / "gpu_check" / "topology", n - n % 2, a.tol, gpus=True)
        ok &= topo["passed"]
    kern = _flash_and_mapper(a.preset, 8, seq)
    ok &= all(kern.get(f"flash_{arm}") == "ok" for arm in ("baseline", "free"))
    doc = {"created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "gpu": name, "n_gpus": n, "peak_bf16_tflops": peak, "peak_source": peak_src,
           "torch": torch.__version__, "cuda": torch.version.cuda, "preset": a.preset,
           "steps": a.steps, "seq_len": seq, "global_batch": batch, "tolerance": a.tol,
           "arms": checks, "kernels": kern, "topology": topo, "passed": ok,
           "wall_s": time.time() - t0,
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
