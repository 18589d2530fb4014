"""`make gpu-check`: a smoke test of about 5 minutes for a first GPU node.

Both arms (baseline, Free Transformer H=16) train a few steps through the trainer: fp32 against
bf16 + torch.compile on one GPU (relative loss difference within `--tol` at every step), a bf16
forward + backward under the flash SDPA kernel alone, DDP and FSDP on 1 and 2 (simulated) nodes
against one process with the sharded resume (`topology`, the CPU twin's too), tokens/s and MFU
on one GPU (null with a reason for an unknown GPU), and the binary
mapper's share of the Free Transformer's step time. Writes <results>/gpu_check/<stamp>.json.
Exit codes: 0 all checks passed, 1 a check failed, 2 no CUDA device visible (one line).

With --recipe (`make gpu-check RECIPE=paper-1.5B`, `recipe_main`): the recipe's real shape
(docs/RECIPES.md "Confirming it on the GPUs"): steps with validations, a checkpoint and a resume,
each phase's allocator peak beside the fake-tensor plan (experiments/memory.py), tokens/s and
MFU -> measured/gpu_check/, which the dry runs' MFU reads (plan.planned_mfu); its table,
docs/gpu_check/README.md, is `python -m dev.gpu_check_doc`'s.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from common import arms
from common.errors import UsageError, cli
from common.gpus import no_silent_cpu
from common.io import atomic_write_text
from common.paths import GPU_CHECK, MEASURED, RunDir, results_root, runs_dir
from experiments import memory as MEM
from experiments.train import plan as P
from experiments.train.config import compose, gpu_peak_tflops


def gpus() -> int:
    """The GPUs torch sees; UsageError (one line) where it sees none (common.gpus: GPUs that
    are visible but unusable are named with the driver and torch's CUDA build)."""
    no_silent_cpu("GPU_CHECK_CPU=1 rehearses it on the CPU")
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        raise UsageError("no CUDA device visible (make gpu-check needs a GPU node; "
                         "GPU_CHECK_CPU=1 rehearses it on CPU)")
    return torch.cuda.device_count()


def _losses(run: Path) -> list[float]:
    rows = RunDir(run).metrics_json()
    return [r["loss"] for r in rows if r["kind"] == "train"]


ARMS_H = ((arms.BASELINE.name, 0), (arms.FREE.name, 16))
"""The two main arms and the H each trains at here (their names key the kernel checks)."""
WARM_STEPS = 3
"""Train lines left out of tokens/s: compilation and the allocator's first steps."""


def _tokens_per_s(run: Path) -> tuple[float | None, int]:
    """(tokens/s over the steady state, its steps): every train line past WARM_STEPS, its
    tokens over its time summed (each line's window excludes validation and checkpoints)."""
    rows = [r for r in RunDir(run).metrics_json() if r["kind"] == "train"]
    prev = [0, *(r["tokens"] for r in rows)]
    win = [(r["tokens"] - t, r["tokens_per_s"]) for r, t in zip(rows, prev, strict=False)
           ][WARM_STEPS:]
    secs = sum(n / tps for n, tps in win if tps)
    return (sum(n for n, _ in win) / secs if secs else None), len(win)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(args: list[str], results: Path, nproc: int = 1, nodes: int = 1,
           env: dict[str, str] | None = None, gpus: bool = False) -> tuple[Path | None, str]:
    """`python -m experiments.train` on `nproc` processes (torchrun), or as `nodes` torchrun
    agents of `nproc` each meeting at a c10d rendezvous on 127.0.0.1 (a stand-in for several
    nodes; on GPUs each agent sees its own devices). A failure names the file holding its
    stderr: (run dir or None, "ok" or "exit N: <its last line> (stderr: <file>)")."""
    import tempfile

    results.mkdir(parents=True, exist_ok=True)
    train = ["-m", "experiments.train", *args, f"paths.results={results}"]
    port = _free_port()
    run = [sys.executable, "-m", "torch.distributed.run"]
    cmds = ([[sys.executable, *train]] if nodes == 1 and nproc == 1 else
            [[*run, "--standalone", "--nproc_per_node", str(nproc), *train]] if nodes == 1 else
            [[*run, "--nnodes", str(nodes), "--node_rank", str(r), "--rdzv_backend", "c10d",
              "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", f"gpu-check-{port}",
              "--nproc_per_node", str(nproc), *train] for r in range(nodes)])
    base = {**os.environ, **(env or {})}
    procs = []
    for r, cmd in enumerate(cmds):
        fd, err = tempfile.mkstemp(prefix="train-", suffix=".stderr.txt", dir=results)
        gpu_env = {"CUDA_VISIBLE_DEVICES": ",".join(str(r * nproc + i) for i in range(nproc))}
        procs.append((subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=fd,
                                       env={**base, **gpu_env} if gpus and nodes > 1 else base),
                      Path(err)))
        os.close(fd)
    for p, err in procs:
        if p.wait():
            tail = (err.read_text(errors="replace").strip().splitlines() or ["no output"])[-1]
            return None, f"exit {p.returncode}: {tail[:300]} (stderr: {err})"
    return P.run_dir(compose([*args, f"paths.results={results}"])), "ok"


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


def _resume(args: list[str], results: Path, ref: Path, run: Any, tol: float
            ) -> dict[str, Any]:
    """Resume the finished run `ref` from its oldest kept step checkpoint (later ones removed)
    and compare the resumed steps' losses and final weights with the uninterrupted run's."""
    from experiments.train.checkpointer import shard_dir

    rd = RunDir(ref)
    steps = rd.step_checkpoints()
    if len(steps) < 2:
        return {"resume": f"failed: the reference run kept {len(steps)} step checkpoint(s), "
                          "need 2 (one inside the run)"}
    ref_losses = {r["step"]: r["loss"] for r in rd.metrics_json() if r["kind"] == "train"}
    ref_w = _weights(ref)
    kept = steps[0][0]
    for _, p in steps[1:]:
        shutil.rmtree(shard_dir(p), ignore_errors=True)
        p.unlink()
    for step, p in rd.eval_checkpoints():
        if step > kept:
            p.unlink()
    rd.final_checkpoint.unlink(missing_ok=True)
    t0 = time.time()
    d2, why = run([a for a in args if a != "train.force=true"], results)  # resume, not redo
    if d2 is None:
        return {"resume": why}
    new = {r["step"]: r["loss"] for r in RunDir(d2).metrics_json()
           if r["kind"] == "train" and r["step"] > kept}
    common = sorted(set(new) & set(ref_losses))
    out: dict[str, Any] = {"resumed_from_step": kept, "resumed_steps": len(common),
                           "resume_wall_s": time.time() - t0}
    if not common:
        out["resume"] = "failed: the resumed run logged no step after its checkpoint"
        return out
    rel = max(abs(new[s] - ref_losses[s]) / max(abs(ref_losses[s]), 1e-12) for s in common)
    out["resume_loss_max_rel"] = rel
    w = _weights(d2)
    if ref_w is not None and w is not None:
        out["resume_weights_max_abs"] = max((ref_w[k].float() - w[k].float()).abs().max().item()
                                            for k in ref_w)
    out["resume"] = "ok" if rel <= tol else f"failed: resumed losses differ by {rel:.3g} > {tol}"
    return out


def topology(base: list[str], work: Path, per_node: int, tol: float,
             env: dict[str, str] | None = None, gpus: bool = False) -> dict[str, Any]:
    """DDP and FSDP on 1 node and on 2 (two c10d agents on this host), each against one process;
    the sharded checkpoint round trip under FSDP over 2 nodes."""
    one, why = _train(base, work / "one", 1, 1, env, gpus)
    out: dict[str, Any] = {"one_process": why}
    ok = one is not None
    half = max(1, per_node // 2)
    for mode in ("ddp", "fsdp"):
        for nodes, per in ((1, per_node), (2, half)):
            key = f"{mode}_{nodes}node"
            run, w = _train([*base, f"train.parallel={mode}"], work / key, per, nodes, env, gpus)
            out[key] = w
            if run is not None and one is not None:
                d = _max_rel(_losses(one), _losses(run))
                out[f"{key}_vs_1proc_max_rel"] = d
                ok &= d <= tol
            ok &= w == "ok"
    ck = [*base, "train.parallel=fsdp", "logging.ckpt_every=1", "logging.keep_checkpoints=3"]
    nodes2 = functools.partial(_train, nproc=half, nodes=2, env=env, gpus=gpus)
    ref = nodes2(ck, work / "resume")[0]
    rt = (_resume(ck, work / "resume", ref, nodes2, tol) if ref is not None
          else {"resume": "failed: the run to resume did not finish"})
    out.update(rt)
    ok &= rt["resume"] == "ok" and rt.get("resume_weights_max_abs", 0.0) <= 1e-4
    out["passed"] = bool(ok)
    return out


def cpu_main(results: str | None, steps: int, tol: float) -> int:
    """GPU_CHECK_CPU=1: the multi-process and multi-node code paths on this CPU (gloo, preset
    1M): DDP and FSDP on 1 and 2 simulated nodes against one process, the resume round trip."""
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
    for arm, h in ARMS_H:
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


# ---------------------------------------------------------------- RECIPE=..: the real shape
RECIPE_ACCUM = 4
"""Micro-batches per step in the recipe check: the recipe's micro-batch per GPU, accumulated 4
times (the reduce-scatter per micro-batch and the accumulation both run) rather than the whole
global batch; tokens/s and MFU are taken over the steps past WARM_STEPS."""
SLICE_FIT = 0.75
"""A layer-sliced model must fit this share of the GPU by the hand estimate (up to 15% low
against the measurement at these presets; measuring each candidate layer count would take
minutes); the sliced model's own phases are then measured and printed."""
BUDGET_S = 600.0
"""gpu-check RECIPE=.. is planned to end within this (`time_plan`); a plan over it is refused."""
FIRST_CONTACT = {"startup_s": 5.0, "build_s_per_gparam": 16.3, "compile_s": 20.0,
                 "d2h_gbps": 55.0, "write_gbps": 2.0, "read_gbps": 1.3, "pageable_gbps": 1.5}
"""What one H100 node gave at the first contact (dev/gpu/results/20261128T014226Z-h100-*)."""


def _gpu_type(name: str, total_bytes: int) -> tuple[str, str]:
    """(key of sweeps.recipe.GPU_TYPES whose micro-batch the check uses, why) for a device."""
    from sweeps.recipe import GPU_TYPES

    gb = total_bytes / 1e9
    named = [k for k in GPU_TYPES if k.split("-")[0].lower() in name.lower()]
    pool = named or list(GPU_TYPES)
    key = min(pool, key=lambda k: abs(GPU_TYPES[k] - gb))
    why = ("by name and memory" if named else
           f"{name!r} is not a recipe GPU type: the nearest in memory")
    return key, f"{key} ({why}, {gb:.0f} GB on the device)"


def recipe_args(recipe: Any, gpu_type: str, n: int, steps: int, capacity_gb: float,
                extra: list[str] | None = None, disk_free: float | None = None,
                device_type: str = "cuda") -> tuple[list[str], dict[str, Any]]:
    """The trainer's overrides for the recipe check: the recipe's costliest arm (largest H,
    first kappa), vocabulary, context, precision, parallelism, activation checkpointing and
    micro-batch per GPU for `gpu_type`; data=random; RECIPE_ACCUM micro-batches per step on `n`
    processes; validations at `steps` // 2 and `steps`, step checkpoints at `steps` // 2 + 1
    (resumed from) and the last. A model whose state does not fit SLICE_FIT of `capacity_gb`
    (hand estimate) or whose run needs more than `disk_free` (plan.disk_bytes) keeps its
    widths and loses layers until both fit ("layer_sliced")."""
    from sweeps.recipe import merge_overrides

    base = [o for o in recipe.training_overrides(gpu=gpu_type)
            if not (o.startswith("data=") or o.startswith("data."))]
    mb = int(next(o for o in base if o.startswith("train.micro_batch_size=")).split("=")[1])
    h, kappa = max(recipe.grid.latent_bits), float(recipe.grid.kappa_bits[0])
    half = max(1, steps // 2)
    batch = mb * n * RECIPE_ACCUM
    ov = [f"model.latent_bits={h}", f"model.kappa_bits={kappa:g}", "data=random",
          f"train.batch_size={batch}",
          f"train.plan_world_size={n}", f"optim.warmup_steps={half}", "logging.log_every=1",
          f"logging.val_every={half}", f"logging.ckpt_every={half + 1}",
          # one step checkpoint inside the run, resumed from (the trainer also writes the last)
          "logging.keep_checkpoints=2", "logging.keep_eval_checkpoints=0",
          "logging.progress=false", "train.force=true", f"train.gpu_memory_gb={capacity_gb:g}"]
    args = list(merge_overrides(base, [*ov, *(extra or [])]))
    cfg = compose(args)
    vb, T = cfg.logging.val_batch_size, cfg.train.seq_len  # `extra` may change either
    args = list(merge_overrides(args, [f"data.val_tokens={vb * T}",
                                       f"train.tokens={steps * batch * T}"]))
    cfg = compose(args)
    L = cfg.model.n_layers
    sliced = None
    mode = "none" if n == 1 else str(cfg.train.parallel)

    @functools.cache
    def need(layers: int) -> tuple[float, float]:
        """(per-GPU memory by the hand estimate, the run's disk by the trainer's rule)"""
        # the composed config with fewer layers (a hydra compose per candidate took ~1 s)
        c = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, n_layers=layers))
        rp = P.plan(c, n)
        return (P.hand_bytes(rp, mode, c.train.activation_checkpointing),
                P.disk_bytes(c, rp, device_type)["run"])

    def fits(layers: int) -> bool:
        mem, disk = need(layers)
        return (mem <= SLICE_FIT * capacity_gb * 1e9
                and (disk_free is None or disk <= disk_free))

    if not fits(L):
        k = L - 2
        while k > 2 and not fits(k):
            k -= 2
        mem, disk = need(L)
        if not fits(k):
            m2, d2 = need(k)
            raise ValueError(
                f"even {k} of the model's {L} layers need ~{m2 / 1e9:.0f} GB per GPU and "
                f"~{d2 / 1e9:.0f} GB of checkpoints; {SLICE_FIT:.0%} of {capacity_gb:g} GB and "
                + (f"{disk_free / 1e9:.0f} GB free disk" if disk_free is not None else "")
                + " are allowed: free disk under the results root (FTBENCH_RESULTS) or use "
                  "more GPUs")
        args.append(f"model.n_layers={k}")
        sliced = {"layers": k, "of": L, "why": (
            f"the {L}-layer model needs ~{mem / 1e9:.0f} GB per GPU on {n} GPU(s) (hand "
            f"estimate; {SLICE_FIT:.0%} of {capacity_gb:g} GB allowed) and ~{disk / 1e9:.0f} GB "
            f"of checkpoints (" + (f"{disk_free / 1e9:.0f} GB free" if disk_free is not None
                                   else "disk not checked")
            + f"): {k} of its {L} layers at the same widths")}
    shape = {"micro_batch_size": mb, "grad_accum": RECIPE_ACCUM, "global_batch": batch,
             "seq_len": cfg.train.seq_len, "vocab_size": cfg.model.vocab_size,
             "latent_bits": h, "kappa_bits": kappa, "precision": str(cfg.train.precision),
             "compile": bool(cfg.train.compile), "parallel": mode,
             "activation_checkpointing": bool(cfg.train.activation_checkpointing),
             "val_batch_size": vb, "steps": steps, "layer_sliced": sliced}
    return args, shape


def time_plan(cfg: Any, n: int, peak_tflops: float | None, planned: bool) -> dict[str, float]:
    """Seconds per phase of the recipe check of `cfg` on `n` GPUs, from the plan's FLOPs at the
    planned MFU and FIRST_CONTACT; `planned`: the fake-tensor plan is shipped or cached."""
    fc, p = FIRST_CONTACT, P.plan(cfg, n)
    mfu = P.planned_mfu(cfg)[0]
    rate = n * (peak_tflops or 989.0) * 1e12 * mfu  # model FLOP/s of the n GPUs
    step = p.tokens_per_step * p.flops_per_token / rate
    val = cfg.data.val_tokens * p.flops_per_token / 3 / rate * 2  # prior (and posterior) passes
    ck = P.checkpoint_bytes(p)
    gb = 1e9
    start = fc["startup_s"] + fc["build_s_per_gparam"] * p.params["total"] / gb + fc["compile_s"]
    save = ck["full"] / n / gb * (1 / fc["d2h_gbps"] + 1 / fc["write_gbps"])
    export = ck["weights_fp32"] / gb / fc["pageable_gbps"] + ck["bf16_export"] / gb / fc[
        "write_gbps"]
    k = max(1, p.steps // 2) + 1  # the step checkpoint resumed from (and the last step's)
    out = {"plan": 0.0 if planned else 60.0 * p.params["total"] / gb,  # ~1 min of CPU per 1e9
           "train": start + p.steps * step + 3 * val + 2 * save + export,
           "eval": fc["build_s_per_gparam"] * p.params["total"] / gb + val,
           "resume": start + ck["full"] / gb / fc["read_gbps"] + (p.steps - k) * step + val
           + export}
    out["total"] = sum(out.values())
    return out


def _phase_table(plan_recs: list[Any], measured: dict[str, dict[str, int] | None],
                 cap_bytes: float | None) -> list[dict[str, Any]]:
    """One row per phase: the plan's fake-tensor peak beside the allocator's measured peak."""
    rows = []
    for r in plan_recs:
        m = measured.get(r.phase)
        row: dict[str, Any] = {"phase": r.phase, "plan_bytes": r.peak_bytes,
                               "plan_parallel": r.parallel, "plan_note": r.note}
        if m is None:
            row["measured"] = None
            row["why_not"] = ("no CUDA allocator on this device" if cap_bytes is None
                              else "the phase did not run")
        else:
            row.update(measured_allocated=m["allocated"], measured_reserved=m["reserved"],
                       measured_over_plan=m["allocated"] / r.peak_bytes if r.peak_bytes
                       else None)
            if cap_bytes:
                row["reserved_of_gpu"] = m["reserved"] / cap_bytes
        rows.append(row)
    return rows


def plan_step(cfg: Any, n: int) -> tuple[list[Any], str]:
    """The fake-tensor plan of the check's run on `n` GPUs: cached, else shipped, else measured
    here. (records, where they come from)."""
    t0 = time.time()
    recs, path = MEM.measure_cached(cfg, world_size=n, device_type="cuda",
                                    cache=Path(cfg.paths.cache), shipped=MEM.SHIPPED)
    took = f"{time.time() - t0:.0f} s"
    if path is not None and path.parent == MEM.SHIPPED:
        made = json.loads(path.read_text())
        return recs, (f"shipped {path.name} ({took}; measured with torch {made['torch']}, "
                      + ("the same code)" if made["code"] == MEM.code_hash() else
                         "older code: --ship-plan measures it again)"))
    fresh = path is None or path.stat().st_mtime >= t0
    return recs, f"{'measured' if fresh else 'cached'} ({took})"


def recipe_main(recipe_name: str, steps: int, tol: float, results: str | None,
                out: str | None, cpu: bool = False, extra: list[str] | None = None,
                nproc: int = 1, ship: bool = False) -> int:
    """`make gpu-check RECIPE=<name>`: the recipe's real shape on the GPUs present (`cpu`: the
    same flow on `nproc` gloo processes, no peaks or speeds). `ship`: only measure its plan."""
    from sweeps.recipe import load

    t_start = time.time()
    try:
        rec = load(recipe_name)
    except UsageError as e:
        raise UsageError(f"RECIPE={recipe_name}: {e}") from None
    gpu = not (cpu or ship)
    n = gpus() if gpu else nproc
    name = torch.cuda.get_device_name(0) if gpu else "cpu"
    total = torch.cuda.get_device_properties(0).total_memory if gpu else int(80e9)
    gtype, gwhy = _gpu_type(name, total) if gpu else ("H100-80GB", "H100-80GB (CPU rehearsal)")
    cap = total if gpu else None
    try:
        root = results_root(results)
        root.mkdir(parents=True, exist_ok=True)
        # a shipped plan is for the node's disk, not this host's
        args, shape = recipe_args(rec, gtype, n, steps, total / 1e9,
                                  [*(extra or []), *(["train.device=cpu"] if cpu else [])],
                                  disk_free=None if ship else P.free_bytes(root),
                                  device_type="cpu" if cpu else "cuda")
        cfg = compose(args)
    except (UsageError, ValueError) as e:
        raise UsageError(f"RECIPE={recipe_name}: {e}") from None
    if ship:  # the plan one H100 node reads (shipped): measured here, minutes of CPU
        print(f"wrote {MEM.measure_cached(cfg, world_size=n, shipped=MEM.SHIPPED, ship=True)[1]}")
        return 0
    work = root / "gpu_check" / f"recipe-{rec.name}"  # a results root of its own
    peak, peak_src = gpu_peak_tflops(name) if gpu else gpu_peak_tflops(gtype)

    def say(msg: str) -> None:
        print(f"[gpu-check {time.time() - t_start:5.0f} s] {msg}", flush=True)

    say(f"{rec.name} on {n} x {name} as {gwhy}: micro-batch {shape['micro_batch_size']} x "
        f"{shape['seq_len']} tokens x {RECIPE_ACCUM} accumulated, vocabulary "
        f"{shape['vocab_size']:,}, {shape['precision']}, compile {shape['compile']}, "
        f"{shape['parallel']}" + (f"; LAYER-SLICED: {shape['layer_sliced']['why']}"
                                  if shape["layer_sliced"] else ""))
    p = P.plan(cfg, n)
    plan_recs, plan_src = plan_step(cfg, n)
    say(f"the plan's per-phase peaks on fake tensors (experiments/memory.py): {plan_src}")
    budget = time_plan(cfg, n, peak, True)
    say("time plan on the GPU(s): " + ", ".join(f"{k} {v:.0f} s" for k, v in budget.items())
        + f" (BUDGET_S {BUDGET_S:.0f})")
    if gpu and budget["total"] > BUDGET_S:
        raise UsageError(f"RECIPE={recipe_name}: the check would take ~{budget['total']:.0f} s "
                         f"on {n} x {name} (over {BUDGET_S:.0f} s); give fewer --steps")
    say(f"training {steps} steps (validation at {steps // 2} and {steps}, a checkpoint at "
        f"{steps // 2 + 1}) ...")
    t0 = time.time()
    ref, why = _train(args, work, nproc=n)
    doc: dict[str, Any] = {
        "mode": "recipe", "recipe": rec.name, "preset": cfg.model.preset,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "gpu": name, "gpu_type": gtype, "n_gpus": n, "device": "cuda" if gpu else "cpu",
        "capacity_bytes": cap, "torch": torch.__version__, "cuda": torch.version.cuda,
        "host": os.uname().nodename, "params": p.params["total"],
        "flops_per_token": p.flops_per_token, "tolerance": tol, "plan_source": plan_src,
        "time_plan_s": budget, "train": why, "train_wall_s": time.time() - t0, **shape,
        "overrides": args}
    ok = ref is not None
    measured: dict[str, dict[str, int] | None] = {}
    if ref is not None:
        rows = RunDir(ref).metrics_json()
        doc["val_steps"] = [r["step"] for r in rows if r["kind"] == "val"]
        ok &= len(doc["val_steps"]) >= 2
        fin = next((r for r in reversed(rows) if r.get("kind") == "final"), {})
        measured.update(fin.get("cuda_peak_bytes") or {})
        doc["cuda_outside_torch_bytes"] = fin.get("cuda_outside_torch_bytes")
        tps, window = _tokens_per_s(ref)
        doc.update(tokens_per_s=tps if gpu else None, peak_bf16_tflops=peak if gpu else None,
                   peak_source=peak_src if gpu else "CPU: no speed figures",
                   mfu=(tps * p.flops_per_token / (n * peak * 1e12)
                        if gpu and tps and peak else None),
                   mfu_window={"steps": window, "micro_batches": window * RECIPE_ACCUM},
                   mfu_basis=f"tokens over time of the train lines past the first {WARM_STEPS} "
                             "(validation and checkpoints excluded) x the plan's FLOPs per "
                             "token / (GPUs x dense bf16 peak)")
        if gpu:
            say("the evaluation batch on the GPU (experiments.memory.measure_eval_on_device) ...")
            t1 = time.time()
            try:
                measured["eval"] = MEM.measure_eval_on_device(cfg, "cuda")
            except torch.cuda.OutOfMemoryError as e:
                doc["eval_error"] = f"out of memory: {str(e).splitlines()[0][:200]}"
                ok = False
            doc["eval_wall_s"] = time.time() - t1
        say("resume from the kept checkpoint ...")
        doc.update(_resume(args, work, ref, functools.partial(_train, nproc=n), tol))
        ok &= doc.get("resume") == "ok"
    doc["stderr"] = sorted(str(f) for f in work.glob("*.stderr.txt")
                           if f"(stderr: {f})" in f"{why} {doc.get('resume')}")
    doc["phases"] = _phase_table(plan_recs, measured if gpu else {}, cap)
    if cap:
        over = [r["phase"] for r in doc["phases"] if (r.get("measured_reserved") or 0) > cap]
        doc["fits"] = not over
        ok &= not over
    doc["passed"] = bool(ok)
    doc["wall_s"] = time.time() - t_start
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    tag = name.split()[1].lower() if gpu and len(name.split()) > 1 else ("gpu" if gpu else "cpu")
    where = Path(out) if out else (MEASURED / GPU_CHECK if gpu else root / GPU_CHECK)
    path = where / f"{stamp}-{tag}-{rec.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    for i, f in enumerate(doc["stderr"]):  # a failed run's whole stderr, kept beside the JSON
        doc["stderr"][i] = str(shutil.copy(f, path.with_suffix(f".stderr{i}.txt")))
    atomic_write_text(path, json.dumps(doc, indent=2) + "\n")
    print(_recipe_summary(doc))
    print(f"{'passed' if ok else 'FAILED'} in {doc['wall_s']:.0f} s; wrote {path}"
          + ("; its table: python -m dev.gpu_check_doc" if where == MEASURED / GPU_CHECK else ""))
    return 0 if ok else 1


def _recipe_summary(doc: dict[str, Any]) -> str:
    import pandas as pd

    from analysis.render import fmt, md, num

    gb = lambda k, r: fmt(num(r.get(k)) / 1e9, ".1f")  # noqa: E731
    table = md(pd.DataFrame(
        [[r["phase"], gb("plan_bytes", r), gb("measured_allocated", r),
          gb("measured_reserved", r), fmt(r.get("measured_over_plan"), ".2f"),
          "" if "measured_allocated" in r else f"not measured: {r.get('why_not')}"]
         for r in doc["phases"]],
        columns=["phase", "plan (fake) GB", "allocated GB", "reserved GB", "meas/plan", "note"]))
    lines = [table]
    if doc.get("cuda_outside_torch_bytes") is not None:
        lines.append(f"outside torch's allocator (CUDA context, NCCL, workspaces): "
                     f"{doc['cuda_outside_torch_bytes'] / 1e9:.1f} GB")
    if doc.get("tokens_per_s") is not None:
        mfu = doc.get("mfu")
        lines.append(f"tokens/s {doc['tokens_per_s']:,.0f} on {doc['n_gpus']} GPU(s); MFU "
                     + (f"{mfu:.1%}" if mfu is not None else f"unknown ({doc['peak_source']})"))
    lines.append(f"resume: {doc.get('resume')} (from step {doc.get('resumed_from_step')}, "
                 f"loss max rel {doc.get('resume_loss_max_rel')}, weights max abs "
                 f"{doc.get('resume_weights_max_abs')})")
    if doc.get("layer_sliced"):
        lines.append(f"layer-sliced: {doc['layer_sliced']['why']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return cli("python -m pipelines.gpu_check", lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="16M")
    ap.add_argument("--recipe", default=None,
                    help="a recipe (sweeps/recipes/): its real shape for --steps (default 20) "
                         "steps with a validation, a checkpoint and a resume; per-phase memory "
                         "beside the plan's, tokens/s, MFU -> measured/gpu_check/")
    ap.add_argument("--out", default=None, help="with --recipe: where the JSON goes")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="with --recipe: trainer overrides over the recipe's (a rehearsal "
                         "at a smaller width, say)")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--tol", type=float, default=0.05,
                    help="largest relative difference of a bf16 step's loss from fp32's")
    ap.add_argument("--results", default=None)
    ap.add_argument("--cpu", action="store_true",
                    help="reduced mode on CPU (GPU_CHECK_CPU=1): DDP/FSDP on 1 and 2 simulated "
                         "nodes, resume round trip; gloo, preset 1M")
    ap.add_argument("--nproc", type=int, default=1,
                    help="with --recipe --cpu: gloo processes (the multi-GPU path: DDP or FSDP "
                         "as train.parallel says)")
    ap.add_argument("--ship-plan", action="store_true",
                    help="with --recipe: measure the plan one H100 reads (measured/memory/plans/)")
    a = ap.parse_args(argv)
    if a.recipe:
        return recipe_main(a.recipe, a.steps or 20, a.tol, a.results, a.out, a.cpu, a.set,
                           a.nproc, a.ship_plan)
    a.steps = a.steps or 30
    if a.cpu:
        return cpu_main(a.results, min(a.steps, 4), a.tol)
    n = gpus()
    name = torch.cuda.get_device_name(0)
    peak, peak_src = gpu_peak_tflops(name)
    root = results_root(a.results)
    work = runs_dir(root / "gpu_check")
    seq, batch = 256, 8 * n
    base = [f"model={a.preset}", f"train.seq_len={seq}", f"train.batch_size={batch}",
            f"train.tokens={a.steps * batch * seq}", "logging.progress=false",
            "logging.log_every=1", "logging.val_every=0", "data.val_tokens=4096",
            "train.force=true"]
    t0 = time.time()
    checks: list[dict[str, Any]] = []
    ok = True
    for arm, h in ARMS_H:
        args = [*base, f"model.latent_bits={h}", f"train.micro_batch_size={batch // n}"]
        fpt = P.plan(compose(args), 1).flops_per_token
        ref, why = _train([*args, "train.precision=fp32"], work)
        one, why1 = _train([*args, "train.precision=bf16", "train.compile=true"], work)
        row: dict[str, Any] = {"arm": arm, "latent_bits": h, "fp32": why, "bf16_compile": why1}
        if ref and one:
            rel = _max_rel(_losses(ref), _losses(one))
            row["bf16_vs_fp32_max_rel"] = rel
            row["bf16_within_tol"] = rel <= a.tol
            tps = _tokens_per_s(one)[0]
            row["tokens_per_s_1gpu"] = tps
            row["mfu_1gpu"] = tps * fpt / (peak * 1e12) if tps and peak else None
        ok &= why == why1 == "ok" and bool(row.get("bf16_within_tol"))
        checks.append(row)
    topo: dict[str, Any] = {"passed": True, "skipped": f"{n} GPU visible, 2 needed"}
    if n >= 2:  # 1 and 2 (simulated) nodes, fp32 so the comparison is against one process
        topo = topology([*base, "model.latent_bits=16", f"train.micro_batch_size={batch // n}",
                         "train.precision=fp32", "logging.ckpt_every=10"],
                        root / "gpu_check" / "topology", n - n % 2, a.tol, gpus=True)
        ok &= topo["passed"]
    kern = _flash_and_mapper(a.preset, 8, seq)
    ok &= all(kern.get(f"flash_{arm}") == "ok" for arm, _ in ARMS_H)
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
              f"tokens/s {row.get('tokens_per_s_1gpu')}, MFU {row.get('mfu_1gpu')}")
    print(f"topology (DDP and FSDP on 1 and 2 nodes vs one process, FSDP resume): "
          f"{'passed' if topo['passed'] else 'FAILED'}")
    print(f"mapper share of the FT step: {kern.get('mapper_share')}; flash: "
          f"{'/'.join(str(kern.get(f'flash_{arm}')) for arm, _ in ARMS_H)}")
    print(f"{'passed' if ok else 'FAILED'}; wrote {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
