"""`make bench`: training, generation, mapper and evaluation speed, side by side (issue 8).

Every comparison runs its contenders in the same process, interleaved rep by rep (the order
rotates each rep), after warm-up; each figure is the median of the reps with min and max, and a
ratio is the median of the per-rep paired ratios, so drift on a shared machine cancels.

Sections (``--sections``, default all):
- ``train``:    our baseline vs HF ``LlamaForCausalLM`` (identical config); our Free Transformer
                vs x-transformers' ``FreeTransformer`` (closest config; mismatches listed in the
                output); fwd + bwd + AdamW step. Also the CPU analogue of MFU: model FLOPs/s
                (``model.train_flops_per_token``) over a dense fp32 matmul's FLOP/s, measured in
                the same interleaved loop.
- ``overhead``: step time of our Free Transformer / our baseline at several H, beside the
                analytic FLOPs ratio and the paper's 1/L.
- ``mapper``:   ``latent_embedding`` vs the dense ``(one_hot + G - G.detach()) @ W.T``: time of
                forward+backward and peak memory (see ``peak_alloc_bytes``).
- ``generate``: tokens/s with the KV cache vs recomputing the full forward each step, and vs HF
                ``generate`` on the exported baseline (``experiments.hf_export``).
- ``eval``:     multiple-choice loglikelihood requests/s of our lm-eval adapter
                (``experiments.lm_adapter``) vs lm-eval's ``hf`` backend on the exported baseline.

Output: ``$FTBENCH_RESULTS/bench/<timestamp>.json`` (default results root ``results/``) and a
Markdown table (``docs/BENCH.md`` for the full size, beside the JSON otherwise).

    python -m experiments.bench                 # full size (the README's figures)
    python -m experiments.bench --size tiny     # seconds; what the test runs
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import model as ftmodel
from model.free_transformer import code_bits, latent_embedding, sample_codes

SCHEMA = "ftbench-bench-v1"
ALL_SECTIONS = ("train", "free", "mapper", "generate", "eval")
REPO = Path(__file__).resolve().parents[1]

# Dense fp32 peak TFLOP/s (no tensor cores) for MFU on CUDA; override with --gpu-peak-tflops.
GPU_FP32_PEAK_TFLOPS = {"H100": 67.0, "A100": 19.5, "L40S": 91.6, "A10": 31.2, "V100": 15.7,
                        "T4": 8.1, "RTX 4090": 82.6, "RTX 3090": 35.6}


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


SIZES: dict[str, Size] = {
    # B=8, T=256 on the 16M preset is the setting of ../shared/NOTES.md.
    "full": Size(preset="16M", overrides={}, batch=8, seq_len=256, reps=5, warmup=2,
                 overhead_bits=(8, 12, 16), xt_bits=(8, 16), mapper_bits=(8, 12, 16),
                 mapper_tokens=(256, 1024, 4096), mapper_dim=256, matmul_n=2048,
                 gen_prompt=32, gen_new=256, eval_requests=200),
    "tiny": Size(preset="1M", overrides={"vocab_size": 512, "dim": 64, "ffn_dim": 128},
                 batch=2, seq_len=32, reps=5, warmup=1, overhead_bits=(4, 8),
                 xt_bits=(4,), mapper_bits=(4, 6), mapper_tokens=(32, 128), mapper_dim=16,
                 matmul_n=128, gen_prompt=4, gen_new=8, eval_requests=8),
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
        gc.collect()  # once per round: a full collection costs ~0.1 s with torch loaded
        for n in names[k:] + names[:k]:
            sync(device)
            t0 = time.perf_counter()
            fns[n]()
            sync(device)
            times[n].append(time.perf_counter() - t0)
    return times


def peak_alloc_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes held by torch's allocator during fn(), above what was held before it.

    CUDA: torch.cuda.max_memory_allocated. CPU (tracemalloc does not see torch): every
    allocation and free torch makes is a ``[memory]`` event of torch.profiler with
    ``profile_memory=True``; the peak of their running sum, in event order, is the peak.
    Tensors that existed before the call (inputs, weights) are not counted; outputs and
    gradients created by the call are.
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - base)
    from torch.profiler import ProfilerActivity, profile

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
    for mod in ("transformers", "x_transformers", "lm_eval"):
        try:
            m = importlib.import_module(mod)
            info[mod] = getattr(m, "__version__", None)
        except Exception:  # noqa: BLE001 - optional packages
            info[mod] = None
    if info["x_transformers"] is None:
        try:
            from importlib.metadata import version

            info["x_transformers"] = version("x-transformers")
        except Exception:  # noqa: BLE001
            pass
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    try:
        info["git_commit"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
            check=False).stdout.strip() or None
    except OSError:
        info["git_commit"] = None
    return info


def gpu_peak_flops(device: torch.device, override_tflops: float | None) -> float | None:
    if device.type != "cuda":
        return None
    if override_tflops:
        return override_tflops * 1e12
    name = torch.cuda.get_device_name(device)
    for key, tf in GPU_FP32_PEAK_TFLOPS.items():
        if key in name:
            return tf * 1e12
    return None


# ---------------------------------------------------------------------------- models
def our_config(size: Size, **kw: Any) -> ftmodel.ModelConfig:
    return ftmodel.get_preset(size.preset, **{**size.overrides, **kw})


def hf_llama(cfg: ftmodel.ModelConfig) -> torch.nn.Module:
    """HF LlamaForCausalLM with exactly our baseline's shape (sdpa attention)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    hc = LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.dim,
                     intermediate_size=cfg.ffn_dim, num_hidden_layers=cfg.n_layers,
                     num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
                     max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm_eps,
                     rope_theta=cfg.rope_theta, tie_word_embeddings=cfg.tie_embeddings,
                     attention_bias=False, mlp_bias=False, hidden_act="silu",
                     initializer_range=cfg.init_std)
    return LlamaForCausalLM._from_config(hc, attn_implementation="sdpa")


XT_MISMATCHES = [
    "x-transformers' SwiGLU input projection has a bias (its GLU ignores ff_no_bias): "
    "+2*ffn_dim parameters per block",
    "x-transformers adds the latent condition to the already-normalised key/value input of the "
    "first tail block; ours normalises x + r (same FLOPs up to one RMSNorm)",
    "x-transformers' forward takes T+1 tokens and trains on T (we pass T+1 so both train on T)",
    "x-transformers' binary mapper materialises the (tokens x 2^H) one-hot and G and runs the "
    "post-sampler as a dense 2^H -> D matmul; ours gathers in the forward and chunks the "
    "backward (this is the point of the comparison, not a config mismatch)",
    "x-transformers' RMSNorm is F.normalize(x) * sqrt(d) * g (no epsilon inside the root); "
    "same cost class, not bit-identical to ours",
    "x-transformers' RoPE base is fixed at 10000 (equal to our preset's rope_theta); its "
    "rotary_emb_dim is set to the full head dim (its default rotates half)",
]


def xt_free_transformer(cfg: ftmodel.ModelConfig) -> torch.nn.Module:
    """x-transformers' FreeTransformer at the config closest to ours."""
    from x_transformers.free_transformer import FreeTransformer as XFT

    half = cfg.n_layers // 2
    return XFT(num_tokens=cfg.vocab_size, dim=cfg.dim, dec_head_depth=half,
               dec_tail_depth=cfg.n_layers - half, max_seq_len=cfg.max_seq_len + 1,
               enc_depth=1, attn_dim_head=cfg.head_dim, heads=cfg.n_heads,
               latent_bits=cfg.latent_bits, kl_loss_threshold=cfg.kappa_bits * math.log(2),
               attn_kv_heads=cfg.n_kv_heads, ff_glu=True, ff_swish=True,
               ff_mult=cfg.ffn_dim / cfg.dim, ff_no_bias=True, attn_flash=True,
               rotary_emb_dim=cfg.head_dim)  # its RoPE base is fixed at 10000 (= ours)


def n_params(m: torch.nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in m.parameters()}.values())


def make_optimizer(m: torch.nn.Module) -> torch.optim.Optimizer:
    # The same AdamW (default implementation choice) for every contender.
    return torch.optim.AdamW(m.parameters(), lr=3e-4, weight_decay=0.1, betas=(0.9, 0.95))


def train_step_fn(kind: str, m: torch.nn.Module, tokens: torch.Tensor) -> Callable[[], float]:
    """One fwd + bwd + AdamW step; ``tokens`` is (B, T+1)."""
    opt = make_optimizer(m)
    m.train()
    inp, tgt = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def step() -> float:
        if kind == "ours":
            loss = m(inp, targets=tgt).loss
        elif kind == "hf":
            loss = m(input_ids=inp, labels=inp).loss  # HF shifts the labels itself
        elif kind == "xt":
            loss = m(tokens)  # x-transformers splits (B, T+1) into inputs and labels
        else:
            raise ValueError(kind)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


# ---------------------------------------------------------------------------- sections
@dataclass
class Ctx:
    size: Size
    device: torch.device
    gpu_peak: float | None
    notes: list[str] = field(default_factory=list)


def _tokens(ctx: Ctx, vocab: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (ctx.size.batch, ctx.size.seq_len + 1), generator=g).to(
        ctx.device)


def _train_entry(times: list[float], tokens_per_step: int, flops_per_token: float | None,
                 matmul_flops_s: float, params: int, gpu_peak: float | None) -> dict[str, Any]:
    med = statistics.median(times)
    tps = tokens_per_step / med
    e: dict[str, Any] = {"step_s": summary(times), "tokens_per_s": tps, "params": params,
                         "tokens_per_step": tokens_per_step}
    if flops_per_token is not None:
        e["flops_per_token"] = flops_per_token
        e["model_flops_s"] = flops_per_token * tps
        e["frac_of_matmul"] = e["model_flops_s"] / matmul_flops_s
        if gpu_peak:
            e["mfu_gpu_peak"] = e["model_flops_s"] / gpu_peak
    return e


def section_train(ctx: Ctx) -> dict[str, Any]:
    s, dev = ctx.size, ctx.device
    torch.manual_seed(0)
    cfg = our_config(s)
    T = s.seq_len
    tok = _tokens(ctx, cfg.vocab_size)
    out: dict[str, Any] = {"batch": s.batch, "seq_len": T, "config": cfg.to_dict()}

    # --- group 1: baseline vs HF LlamaForCausalLM (+ the matmul reference)
    ours = ftmodel.build_model(cfg).to(dev)
    hf = copy_to_hf(ours).to(dev)  # same shape, same starting weights
    with torch.no_grad():
        ours.eval()
        hf.eval()
        parity = float((ours(tok[:1, :-1]).logits - hf(input_ids=tok[:1, :-1]).logits)
                       .abs().max())
    mm, mm_flops = matmul_fn(s.matmul_n, dev)
    if n_params(ours) != n_params(hf):
        ctx.notes.append(f"param count differs: ours {n_params(ours)} vs HF {n_params(hf)}")
    times = interleaved({"ours": train_step_fn("ours", ours, tok),
                         "hf": train_step_fn("hf", hf, tok), "matmul": mm},
                        s.reps, s.warmup, dev)
    mm_fs = mm_flops / statistics.median(times["matmul"])
    fpt = ftmodel.train_flops_per_token(cfg, T).total
    out["baseline_vs_hf"] = {
        "matmul": {"n": s.matmul_n, "s": summary(times["matmul"]), "flops_s": mm_fs},
        "ours": _train_entry(times["ours"], s.batch * T, fpt, mm_fs, n_params(ours),
                             ctx.gpu_peak),
        "hf": _train_entry(times["hf"], s.batch * T, fpt, mm_fs, n_params(hf), ctx.gpu_peak),
        "speedup_ours_over_hf": paired_ratio(times["hf"], times["ours"]),
        "hf_attn_implementation": hf.config._attn_implementation,
        "hf_logits_max_abs_diff_same_weights": parity,
    }
    del ours, hf
    gc.collect()

    return out


def section_free(ctx: Ctx) -> dict[str, Any]:
    """Our baseline, our FT at each H, x-transformers' FT at xt_bits: one interleaved loop.

    Gives the FT overhead (step-time ratio FT/baseline, beside the analytic FLOPs ratio and 1/L)
    and our FT vs x-transformers' at equal H.
    """
    s, dev = ctx.size, ctx.device
    cfg = our_config(s)
    T = s.seq_len
    tok = _tokens(ctx, cfg.vocab_size, seed=1)
    mm, mm_flops = matmul_fn(s.matmul_n, dev)
    fns: dict[str, Callable[[], object]] = {"matmul": mm}
    params: dict[str, int] = {}
    torch.manual_seed(0)
    m = ftmodel.build_model(cfg).to(dev)
    params["baseline"] = n_params(m)
    fns["baseline"] = train_step_fn("ours", m, tok)
    for H in s.overhead_bits:
        torch.manual_seed(0)
        m = ftmodel.build_model(cfg.replace(latent_bits=H)).to(dev)
        params[f"H{H}"] = n_params(m)
        fns[f"H{H}"] = train_step_fn("ours", m, tok)
    xt_error = None
    try:
        for H in s.xt_bits:
            torch.manual_seed(0)
            m = xt_free_transformer(cfg.replace(latent_bits=H)).to(dev)
            params[f"xt_H{H}"] = n_params(m)
            fns[f"xt_H{H}"] = train_step_fn("xt", m, tok)
    except ImportError as e:
        xt_error = f"x-transformers not importable: {e}"
    del m
    times = interleaved(fns, s.reps, s.warmup, dev)
    mm_fs = mm_flops / statistics.median(times["matmul"])
    base_flops = ftmodel.train_flops_per_token(cfg, T).total
    ntok = s.batch * T
    ov: dict[str, Any] = {
        "n_layers": cfg.n_layers, "paper_overhead": 1.0 / cfg.n_layers, "batch": s.batch,
        "seq_len": T,
        "matmul": {"n": s.matmul_n, "s": summary(times["matmul"]), "flops_s": mm_fs},
        "baseline": _train_entry(times["baseline"], ntok, base_flops, mm_fs,
                                 params["baseline"], ctx.gpu_peak),
        "bits": {}}
    for H in s.overhead_bits:
        fb = ftmodel.train_flops_per_token(cfg.replace(latent_bits=H), T)
        ov["bits"][f"H{H}"] = {
            "H": H, **_train_entry(times[f"H{H}"], ntok, fb.total, mm_fs, params[f"H{H}"],
                                   ctx.gpu_peak),
            "step_ratio": paired_ratio(times[f"H{H}"], times["baseline"]),
            "analytic_flops_ratio": fb.total / base_flops,
            "mapper_backward_share": fb.mapper_backward / fb.total,
            "flops_breakdown": asdict(fb),
        }
    # the same ratios analytically at the paper's presets, for scale
    ov["analytic_at_paper_presets"] = {
        name: {f"H{H}": ftmodel.train_flops_per_token(
            ftmodel.get_preset(name, latent_bits=H), 4096).total
            / ftmodel.train_flops_per_token(ftmodel.get_preset(name), 4096).total
            for H in (8, 16)} | {"1/L": 1.0 / ftmodel.get_preset(name).n_layers}
        for name in ("1.5B", "8B")}
    xt: dict[str, Any] = {"mismatches": XT_MISMATCHES}
    if xt_error:
        xt = {"skipped": xt_error}
    else:
        for H in s.xt_bits:
            k = f"H{H}"
            xt[k] = {"ours": ov["bits"][k] if k in ov["bits"] else None,
                     "xt": _train_entry(times[f"xt_{k}"], ntok, None, mm_fs,
                                        params[f"xt_{k}"], ctx.gpu_peak),
                     "speedup_ours_over_xt": paired_ratio(times[f"xt_{k}"], times[k])}
    return {"overhead": ov, "ft_vs_xtransformers": xt}


def dense_mapper(o: torch.Tensor, w: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """The paper's formula, materialised: (one_hot(codes) + G - G.detach()) @ W.T."""
    H = o.shape[-1]
    bits = code_bits(H, o.device)
    log_g = F.logsigmoid(o) @ bits.t() + F.logsigmoid(-o) @ (1.0 - bits).t()
    G = log_g.exp()
    Y = F.one_hot(codes, 1 << H).to(o.dtype)
    return (Y + G - G.detach()) @ w.t()


def section_mapper(ctx: Ctx) -> dict[str, Any]:
    s, dev = ctx.size, ctx.device
    D = s.mapper_dim
    rows = []
    for H in s.mapper_bits:
        for N in s.mapper_tokens:
            g = torch.Generator().manual_seed(H * 7919 + N)
            o = torch.randn(N, H, generator=g).to(dev).requires_grad_(True)
            w = (0.02 * torch.randn(D, 1 << H, generator=g)).to(dev).requires_grad_(True)
            codes = sample_codes(o.detach(), g)
            up = torch.randn(N, D, generator=g).to(dev)

            def run(f: Callable[..., torch.Tensor], o=o, w=w, codes=codes, up=up
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
                o.grad = w.grad = None
                y = f(o, w, codes)
                y.backward(up)
                return y.detach(), o.grad, w.grad

            ours = lambda run=run: run(latent_embedding)
            dense = lambda run=run: run(dense_mapper)
            ya, ga, wa = ours()
            yb, gb, wb = dense()
            err = {"value": float((ya - yb).abs().max()),
                   "grad_logits_rel": float((ga - gb).abs().max() / gb.abs().max().clamp_min(
                       1e-30)),
                   "grad_weight": float((wa - wb).abs().max())}
            del ya, ga, wa, yb, gb, wb
            o.grad = w.grad = None
            mem_ours = peak_alloc_bytes(ours, dev)
            o.grad = w.grad = None
            mem_dense = peak_alloc_bytes(dense, dev)
            o.grad = w.grad = None
            times = interleaved({"ours": ours, "dense": dense}, s.reps, 1, dev)
            o.grad = w.grad = None
            rows.append({
                "H": H, "tokens": N, "dim": D,
                "ours_s": summary(times["ours"]), "dense_s": summary(times["dense"]),
                "speedup": paired_ratio(times["dense"], times["ours"]),
                "ours_peak_bytes": mem_ours, "dense_peak_bytes": mem_dense,
                "memory_ratio": mem_ours / max(mem_dense, 1),
                "weight_grad_bytes": 4 * D * (1 << H),
                "max_abs_err": err,
            })
            del o, w, codes, up
            gc.collect()
    return {"method": "peak of the running sum of torch allocator events (torch.profiler "
                      "profile_memory) during forward+backward; includes the output and the "
                      "gradients it creates (W.grad is D*2^H*4 bytes in both)", "rows": rows}


@torch.no_grad()
def recompute_generate(m: torch.nn.Module, prompt: torch.Tensor, n: int) -> torch.Tensor:
    """Greedy decoding with no cache: a full forward over the whole sequence every step."""
    seq = prompt
    for _ in range(n):
        nxt = m(seq).logits[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], dim=1)
    return seq[:, prompt.shape[1]:]


def _try_import(name: str) -> Any | None:
    try:
        return importlib.import_module(name)
    except Exception:  # noqa: BLE001 - written by another issue; may be absent or broken
        return None


def copy_to_hf(m: torch.nn.Module) -> torch.nn.Module:
    """Our baseline's weights copied into ``hf_llama(cfg)`` (both use rotate-half RoPE).

    The bench's own fallback when experiments/hf_export.py is absent; the results say which.
    """
    hf = hf_llama(m.cfg)
    sd = {"model.embed_tokens.weight": m.tok_emb.weight, "model.norm.weight": m.norm.weight,
          "lm_head.weight": m.output.weight}
    names = {"attn.wq": "self_attn.q_proj", "attn.wk": "self_attn.k_proj",
             "attn.wv": "self_attn.v_proj", "attn.wo": "self_attn.o_proj",
             "mlp.w1": "mlp.gate_proj", "mlp.w3": "mlp.up_proj", "mlp.w2": "mlp.down_proj",
             "attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}
    for i, blk in enumerate(m.blocks):
        mods = dict(blk.named_modules())
        for ours, theirs in names.items():
            sd[f"model.layers.{i}.{theirs}.weight"] = mods[ours].weight
    missing, unexpected = hf.load_state_dict({k: v.detach().clone() for k, v in sd.items()},
                                             strict=False)
    missing = [k for k in missing if "rotary" not in k]
    if missing or unexpected:
        raise RuntimeError(f"weight copy to HF: missing {missing}, unexpected {unexpected}")
    return hf


@dataclass
class Exported:
    """Our baseline, its tokenizer, and the HF LlamaForCausalLM it exports to."""

    ours: torch.nn.Module
    tok: Any  # tokenizers.Tokenizer
    texts: list[str]
    hf: torch.nn.Module
    hf_dir: Path | None  # a from_pretrained directory (None for the in-memory fallback)
    how: str


def exported_baseline(ctx: Ctx, workdir: Path) -> Exported:
    """Build our baseline with a BPE tokenizer, save it, export it with experiments.hf_export
    (the path a user takes) and load the export with ``from_pretrained`` (sdpa).

    Falls back to ``copy_to_hf`` (labelled in the results) if hf_export is absent or fails.
    """
    from experiments.tokenizer import tokenizer_ref

    cfg = our_config(ctx.size)
    tok, texts = bench_tokenizer(cfg.vocab_size, 8 if ctx.size.preset == "1M" else 60)
    if tok.get_vocab_size() > cfg.vocab_size:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} > {cfg.vocab_size} ids")
    torch.manual_seed(0)
    ours = ftmodel.build_model(cfg).to(ctx.device).eval()
    hx = _try_import("experiments.hf_export")
    if hx is not None and hasattr(hx, "export"):
        try:
            from transformers import LlamaForCausalLM

            ck = ftmodel.save_checkpoint(workdir / "ckpt.pt", ours,
                                         tokenizer=tokenizer_ref(tok, "bench-bpe"))
            out = Path(hx.export(ck, workdir / "hf"))
            hf = LlamaForCausalLM.from_pretrained(out, attn_implementation="sdpa",
                                                  dtype=torch.float32)
            return Exported(ours, tok, texts, hf.to(ctx.device).eval(), out,
                            "experiments.hf_export.export + LlamaForCausalLM.from_pretrained")
        except Exception as e:  # noqa: BLE001 - written by another issue
            ctx.notes.append(f"experiments.hf_export failed ({type(e).__name__}: {e}); "
                             "used the bench's own weight copy")
    return Exported(ours, tok, texts, copy_to_hf(ours).to(ctx.device).eval(), None,
                    "experiments.bench.copy_to_hf (hf_export unavailable)")


def section_generate(ctx: Ctx) -> dict[str, Any]:
    s, dev = ctx.size, ctx.device
    cfg = our_config(s)
    work = tempfile.TemporaryDirectory(prefix="ftbench-gen-")
    exp = exported_baseline(ctx, Path(work.name))
    base = exp.ours
    torch.manual_seed(0)
    Hg = max(s.overhead_bits)
    ft = ftmodel.build_model(cfg.replace(latent_bits=Hg)).to(dev).eval()
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, cfg.vocab_size, (1, s.gen_prompt), generator=g).to(dev)
    n = s.gen_new
    out: dict[str, Any] = {"batch": 1, "prompt_len": s.gen_prompt, "new_tokens": n,
                           "decoding": "greedy"}
    fns: dict[str, Callable[[], object]] = {
        "kv_cache": lambda: base.generate(prompt, n),
        "recompute": lambda: recompute_generate(base, prompt, n),
        f"ft_H{Hg}_kv_cache": lambda: ft.generate(prompt, n, z="prior"),
    }
    kv_tokens = base.generate(prompt, n).tokens[0]
    re_tokens = recompute_generate(base, prompt, n)[0].tolist()
    out["kv_equals_recompute"] = kv_tokens == re_tokens
    try:
        hf = exp.hf
        out["hf_export"] = exp.how
        hf.generation_config.eos_token_id = None
        hf.generation_config.pad_token_id = 0
        mask = torch.ones_like(prompt)

        def hf_gen() -> torch.Tensor:
            return hf.generate(prompt, attention_mask=mask, max_new_tokens=n,
                               min_new_tokens=n, do_sample=False, use_cache=True)

        fns["hf_generate"] = hf_gen
        hf_tokens = hf_gen()[0, s.gen_prompt:].tolist()
        agree = sum(int(a == b) for a, b in zip(hf_tokens, kv_tokens, strict=False))
        out["hf_token_agreement"] = agree / max(1, len(kv_tokens))
    except Exception as e:  # noqa: BLE001
        out["hf"] = {"skipped": f"export failed: {type(e).__name__}: {e}"}
    times = interleaved(fns, s.reps, 1, dev)
    work.cleanup()
    for k, v in times.items():
        out[k] = {"s": summary(v), "tokens_per_s": n / statistics.median(v)}
    out["kv_speedup_over_recompute"] = paired_ratio(times["recompute"], times["kv_cache"])
    if "hf_generate" in times:
        out["kv_speedup_over_hf"] = paired_ratio(times["hf_generate"], times["kv_cache"])
    return out


def bench_tokenizer(vocab_size: int, n_files: int) -> Any:
    """A byte-level BPE (experiments.tokenizer.train_bpe, cached) on stdlib sources."""
    import sysconfig

    from experiments.tokenizer import train_bpe

    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:n_files]
    texts = [f.read_text(encoding="utf-8", errors="ignore") for f in files]
    return train_bpe(texts, vocab_size), texts


def mc_requests(texts: list[str], n_requests: int, seed: int = 0) -> list[Any]:
    """4-choice loglikelihood requests (lm-eval Instances) cut from real text."""
    import random

    from lm_eval.api.instance import Instance

    rng = random.Random(seed)
    body = [t for t in texts if len(t) > 2000]
    reqs = []
    for i in range(max(1, n_requests // 4)):
        t = rng.choice(body)
        a = rng.randrange(0, len(t) - 800)
        ctx = t[a:a + rng.randrange(150, 400)]
        for j in range(4):
            b = rng.randrange(0, len(t) - 100)
            cont = t[b:b + rng.randrange(10, 60)]
            reqs.append(Instance(request_type="loglikelihood", doc={"i": i}, idx=j,
                                 arguments=(ctx, " " + cont.strip() or "x")))
    return reqs


def section_eval(ctx: Ctx) -> dict[str, Any]:
    """MC loglikelihood requests/s: experiments.lm_adapter vs lm-eval's hf backend."""
    la = _try_import("experiments.lm_adapter")
    if la is None:
        return {"skipped": "experiments/lm_adapter.py not available"}
    from lm_eval.models.huggingface import HFLM
    from transformers import PreTrainedTokenizerFast

    from experiments.tokenizer import EOS, BPETokenizer

    s, dev = ctx.size, ctx.device
    cfg = our_config(s)
    work = tempfile.TemporaryDirectory(prefix="ftbench-eval-")
    exp = exported_baseline(ctx, Path(work.name))
    tok, texts, how = exp.tok, exp.texts, exp.how
    bs = 16
    ours = la.FTBenchLM(model=exp.ours, tokenizer=BPETokenizer(tok), batch_size=bs,
                        device=str(dev), progress=False)
    if exp.hf_dir is not None:  # lm-eval's hf backend loads the export as a user would
        theirs = HFLM(pretrained=str(exp.hf_dir), batch_size=bs, device=str(dev),
                      dtype="float32", max_length=cfg.max_seq_len)
    else:
        hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS)
        theirs = HFLM(pretrained=exp.hf, tokenizer=hf_tok, batch_size=bs, device=str(dev),
                      max_length=cfg.max_seq_len)
    reqs = mc_requests(texts, s.eval_requests)
    a = [x[0] for x in ours.loglikelihood(reqs, disable_tqdm=True)]
    b = [x[0] for x in theirs.loglikelihood(reqs, disable_tqdm=True)]
    times = interleaved({"ours": lambda: ours.loglikelihood(reqs, disable_tqdm=True),
                         "hf": lambda: theirs.loglikelihood(reqs, disable_tqdm=True)},
                        s.reps, 1, dev)
    n = len(reqs)
    work.cleanup()
    return {
        "hf_attn_implementation": getattr(theirs.model.config, "_attn_implementation", None),
        "requests": n, "batch_size": bs, "hf_export": how,
        "tokens_per_request_mean": statistics.mean(
            len(tok.encode(r.args[0] + r.args[1]).ids) for r in reqs),
        "max_abs_loglik_diff": max(abs(x - y) for x, y in zip(a, b, strict=True)),
        "ours": {"s": summary(times["ours"]), "requests_per_s": n / statistics.median(
            times["ours"])},
        "hf": {"s": summary(times["hf"]), "requests_per_s": n / statistics.median(
            times["hf"])},
        "speedup_ours_over_hf": paired_ratio(times["hf"], times["ours"]),
    }


SECTIONS: dict[str, Callable[[Ctx], dict[str, Any]]] = {
    "train": section_train, "free": section_free, "mapper": section_mapper,
    "generate": section_generate, "eval": section_eval,
}


# ---------------------------------------------------------------------------- targets + report
def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    sec = res["sections"]
    t: list[dict[str, Any]] = []

    def add(name: str, goal: str, value: float | None, met: bool | None) -> None:
        t.append({"target": name, "goal": goal, "measured": value, "met": met})

    tr = sec.get("train", {}).get("baseline_vs_hf")
    if tr:
        v = tr["speedup_ours_over_hf"]["median"]
        add("baseline training throughput vs HF", ">= 1.2x", v, v >= 1.2)
    ov = sec.get("free", {}).get("overhead", {})
    if ov.get("bits"):
        h = min(ov["bits"].values(), key=lambda r: r["H"])
        v = h["step_ratio"]["median"] - 1.0
        goal = ov["paper_overhead"] + 0.02
        add(f"FT/baseline step-time overhead at H={h['H']}",
            f"<= 1/L + 2% = {goal:.3f}", v, v <= goal)
    mp = sec.get("mapper", {}).get("rows")
    if mp:
        r = max(mp, key=lambda r: (r["H"], r["tokens"]))
        add(f"mapper peak memory ours/dense at H={r['H']}, {r['tokens']} tokens", "<= 0.1",
            r["memory_ratio"], r["memory_ratio"] <= 0.1)
    gen = sec.get("generate", {})
    if "kv_speedup_over_recompute" in gen:
        v = gen["kv_speedup_over_recompute"]["median"]
        add(f"KV cache vs recompute at {gen['new_tokens']} new tokens", ">= 5x", v, v >= 5)
    ev = sec.get("eval", {})
    if "speedup_ours_over_hf" in ev:
        v = ev["speedup_ours_over_hf"]["median"]
        add("MC eval requests/s ours vs lm-eval hf", ">= 1x", v, v >= 1.0)
    else:
        add("MC eval requests/s ours vs lm-eval hf", ">= 1x", None, None)
    return t


def _med(d: dict[str, Any]) -> str:
    return f"{d['median']:.3f} [{d['min']:.3f}, {d['max']:.3f}]"


def _x(d: dict[str, Any]) -> str:
    return f"{d['median']:.2f}x [{d['min']:.2f}, {d['max']:.2f}]"


def _mb(b: float) -> str:
    return f"{b / 2**20:.1f}"


def _load(la: list[float] | None) -> str:
    return "n/a" if not la else "/".join(f"{x:.1f}" for x in la)


def render_markdown(res: dict[str, Any]) -> str:
    m, st, sec = res["machine"], res["settings"], res["sections"]
    srcs = res.get("section_sources") or {}
    reps = (f"at least {min(v['reps'] for v in srcs.values())} (see Provenance)" if srcs
            else str(st["reps"]))
    L = [f"# Benchmarks (`make bench`, size `{st['size']}`)", "",
         f"Generated by `{res['command']}` into `{res['json_path']}`. "
         "Every figure is the median of "
         f"{reps} reps after warm-up, with [min, max]; contenders of one table ran "
         "interleaved in one process, and ratios are medians of per-rep paired ratios.", "",
         f"Machine{' (last run)' if srcs else ''}: {m['cpu']}, {m['threads']} torch threads "
         f"({m['cpu_count']} CPUs), "
         f"torch {m['torch']}, transformers {m.get('transformers')}, x-transformers "
         f"{m.get('x_transformers')}, lm-eval {m.get('lm_eval')}, device {m['device']}, "
         f"load average (1/5/15 min) at start {_load(m.get('loadavg_start'))}, at end "
         f"{_load(m.get('loadavg_end'))}. On a shared machine absolute times drift with the "
         "load; the ratios, measured pairwise within each rep, are the figures to compare.", ""]
    tg = res.get("targets", [])
    if tg:
        L += ["## Targets", "", "| target | goal | measured | met |", "|---|---|---|---|"]
        for t in tg:
            v = "not measured" if t["measured"] is None else f"{t['measured']:.3f}"
            met = "n/a" if t["met"] is None else ("yes" if t["met"] else "**no**")
            L.append(f"| {t['target']} | {t['goal']} | {v} | {met} |")
        L.append("")
    tr = sec.get("train")
    if tr:
        b = tr["baseline_vs_hf"]
        L += ["## Training step (fwd + bwd + AdamW)", "",
              f"B={tr['batch']}, T={tr['seq_len']}, preset `{st['preset']}`, fp32. "
              "Model FLOPs from `model.train_flops_per_token`; 'of matmul' = model FLOP/s over "
              f"a {b['matmul']['n']}^3 fp32 matmul measured in the same loop "
              f"({b['matmul']['flops_s'] / 1e9:.1f} GFLOP/s): the CPU analogue of MFU. "
              "HF gets our baseline's weights; max |logit difference| = "
              f"{b['hf_logits_max_abs_diff_same_weights']:.1e}, so the configs are identical.",
              "",
              "| contender | params | step s | tokens/s | model GFLOP/s | of matmul | "
              "speedup of ours |", "|---|---|---|---|---|---|---|"]
        for name, key in (("ours baseline", "ours"), ("HF LlamaForCausalLM (sdpa)", "hf")):
            e = b[key]
            sp = _x(b["speedup_ours_over_hf"]) if key == "hf" else ""
            L.append(f"| {name} | {e['params']:,} | {_med(e['step_s'])} | "
                     f"{e['tokens_per_s']:.0f} | {e['model_flops_s'] / 1e9:.1f} | "
                     f"{e['frac_of_matmul']:.0%} | {sp} |")
        L.append("")
    fr = sec.get("free")
    if fr:
        ov = fr["overhead"]
        bl = ov["baseline"]
        L += ["## Free Transformer overhead (step time FT / our baseline)", "",
              f"B={ov['batch']}, T={ov['seq_len']}, fwd + bwd + AdamW, all contenders of this "
              f"and the next table interleaved in one loop. Paper: one extra block, "
              f"1/L = {ov['paper_overhead']:.3f} at L={ov['n_layers']}. The analytic ratio "
              "(`model.train_flops_per_token`) counts the encoder block, its readout and the "
              "mapper's backward, which is dense over the 2^H codes (2·D·2^H FLOPs per token "
              "for dL/dG alone).", "",
              "| contender | params | step s | tokens/s | measured ratio | analytic FLOPs "
              "ratio | 1 + 1/L | mapper bwd share of FLOPs | of matmul |",
              "|---|---|---|---|---|---|---|---|---|",
              f"| baseline | {bl['params']:,} | {_med(bl['step_s'])} | {bl['tokens_per_s']:.0f} "
              f"| 1 | 1 | | | {bl['frac_of_matmul']:.0%} |"]
        for r in ov["bits"].values():
            L.append(f"| FT H={r['H']} | {r['params']:,} | {_med(r['step_s'])} | "
                     f"{r['tokens_per_s']:.0f} | {_x(r['step_ratio'])} | "
                     f"{r['analytic_flops_ratio']:.3f} | {1 + ov['paper_overhead']:.3f} | "
                     f"{r['mapper_backward_share']:.1%} | {r['frac_of_matmul']:.0%} |")
        pp = ov.get("analytic_at_paper_presets", {})
        if pp:
            L += ["", "Analytic FLOPs ratio at the paper's presets (T=4096): " + "; ".join(
                f"{n}: H=8 {v['H8']:.3f}, H=16 {v['H16']:.3f} (1 + 1/L = {1 + v['1/L']:.3f})"
                for n, v in pp.items()) + "."]
        L.append("")
        xt = fr["ft_vs_xtransformers"]
        L += ["## Our Free Transformer vs x-transformers' FreeTransformer", ""]
        if "skipped" in xt:
            L += [f"Skipped: {xt['skipped']}", ""]
        else:
            L += ["| H | ours params | x-t params | ours step s | x-t step s | ours tokens/s | "
                  "x-t tokens/s | speedup of ours |", "|---|---|---|---|---|---|---|---|"]
            for k, r in xt.items():
                if not k.startswith("H"):
                    continue
                e, x = r["ours"], r["xt"]
                L.append(f"| {k[1:]} | {e['params']:,} | {x['params']:,} | {_med(e['step_s'])} "
                         f"| {_med(x['step_s'])} | {e['tokens_per_s']:.0f} | "
                         f"{x['tokens_per_s']:.0f} | {_x(r['speedup_ours_over_xt'])} |")
            L += ["", "Mismatches with x-transformers we could not remove:", ""]
            L += [f"- {m}" for m in xt["mismatches"]]
            L.append("")
    mp = sec.get("mapper")
    if mp:
        L += ["## Binary mapper: `latent_embedding` vs dense `(one_hot + G - G.detach()) @ W.T`",
              "", f"Forward + backward, D={mp['rows'][0]['dim']}. Memory: {mp['method']}.", "",
              "| H | tokens | ours s | dense s | speedup | ours peak MiB | dense peak MiB | "
              "ours/dense memory | W.grad MiB |", "|---|---|---|---|---|---|---|---|---|"]
        for r in mp["rows"]:
            L.append(f"| {r['H']} | {r['tokens']} | {_med(r['ours_s'])} | {_med(r['dense_s'])} "
                     f"| {_x(r['speedup'])} | {_mb(r['ours_peak_bytes'])} | "
                     f"{_mb(r['dense_peak_bytes'])} | {r['memory_ratio']:.3f} | "
                     f"{_mb(r['weight_grad_bytes'])} |")
        L.append("")
    gen = sec.get("generate")
    if gen:
        L += ["## Generation", "",
              f"Batch 1, prompt {gen['prompt_len']} tokens, {gen['new_tokens']} new tokens, "
              f"greedy. KV-cache output equals recompute output: {gen['kv_equals_recompute']}.",
              "", "| contender | s | tokens/s |", "|---|---|---|"]
        for k, v in gen.items():
            if isinstance(v, dict) and "tokens_per_s" in v:
                L.append(f"| {k} | {_med(v['s'])} | {v['tokens_per_s']:.1f} |")
        L += ["", f"KV cache over recompute: {_x(gen['kv_speedup_over_recompute'])}."]
        if "hf_export" in gen:
            L.append(f"HF model from {gen['hf_export']}.")
        if "kv_speedup_over_hf" in gen:
            L.append(f"KV cache (ours) over HF `generate`: {_x(gen['kv_speedup_over_hf'])}; "
                     f"greedy tokens agreeing with HF: {gen['hf_token_agreement']:.0%}.")
        elif "hf" in gen:
            L.append(f"HF generate: {gen['hf']['skipped']}.")
        L.append("")
    ev = sec.get("eval")
    if ev:
        L += ["## Evaluation (multiple-choice loglikelihood requests/s)", ""]
        if "skipped" in ev:
            L.append(f"Not measured: {ev['skipped']}.")
        else:
            L += ["| contender | s | requests/s |", "|---|---|---|"]
            for k in ("ours", "hf"):
                L.append(f"| {k} | {_med(ev[k]['s'])} | {ev[k]['requests_per_s']:.1f} |")
            L += ["", f"Ours over lm-eval `hf`: {_x(ev['speedup_ours_over_hf'])}. "
                  f"{ev['requests']} requests (4-choice items cut from stdlib text, "
                  f"{ev['tokens_per_request_mean']:.0f} tokens each on average), batch size "
                  f"{ev['batch_size']} for both, HF model from {ev['hf_export']}; max "
                  f"|loglikelihood difference| {ev['max_abs_loglik_diff']:.1e}."]
        L.append("")
    if res.get("section_sources"):
        L += ["## Provenance", "", "Combined from separate runs (same machine, same settings); "
              "each section's figures come from one run:", "",
              "| section | run | command | threads | reps | load average start / end |",
              "|---|---|---|---|---|---|"]
        for k, v in res["section_sources"].items():
            la = "/".join(f"{x[0]:.1f}" if x else "?" for x in (v["loadavg_start"],
                                                                 v["loadavg_end"]))
            L.append(f"| {k} | `{v['json']}` | `{v['command']}` | {v['threads']} | {v['reps']} "
                     f"| {la} |")
        L.append("")
    if res.get("errors"):
        L += ["## Errors", ""] + [f"- `{k}`: {v.splitlines()[-1]}" for k, v in
                                  res["errors"].items()] + [""]
    if res.get("notes"):
        L += ["## Notes", ""] + [f"- {n}" for n in res["notes"]] + [""]
    return "\n".join(L)


# ---------------------------------------------------------------------------- main
def results_root() -> Path:
    return Path(os.environ.get("FTBENCH_RESULTS", "results"))


def run(size_name: str, sections: list[str], threads: int | None, device: str | None,
        gpu_peak_tflops: float | None, md_path: str | None, command: str,
        reps: int | None = None, warmup: int | None = None) -> dict[str, Any]:
    if threads:
        torch.set_num_threads(threads)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    size = SIZES[size_name]
    if reps is not None or warmup is not None:
        size = Size(**{**asdict(size), "reps": reps if reps is not None else size.reps,
                       "warmup": warmup if warmup is not None else size.warmup})
    if size.reps < 5:
        raise ValueError(f"reps={size.reps}: every figure is a median of at least 5 reps")
    ctx = Ctx(size=size, device=dev, gpu_peak=gpu_peak_flops(dev, gpu_peak_tflops))
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out_dir = results_root() / "bench"
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{stamp}.json"
    res: dict[str, Any] = {
        "schema": SCHEMA, "created": created, "command": command,
        "json_path": str(json_path), "machine": machine_info(dev),
        "settings": {**asdict(size), "size": size_name, "sections": sections},
        "sections": {}, "errors": {}, "section_wall_s": {}, "notes": ctx.notes,
    }
    md = Path(md_path) if md_path else (REPO / "docs" / "BENCH.md" if size_name == "full"
                                        else json_path.with_suffix(".md"))
    res["markdown_path"] = str(md)
    res["section_cpu_s"] = {}
    for name in sections:
        t0, c0 = time.perf_counter(), time.process_time()
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        try:
            res["sections"][name] = SECTIONS[name](ctx)
        except Exception:  # noqa: BLE001 - one broken section must not lose the others
            res["errors"][name] = traceback.format_exc()
            print(res["errors"][name], file=sys.stderr)
        res["section_wall_s"][name] = time.perf_counter() - t0
        res["section_cpu_s"][name] = time.process_time() - c0
        gc.collect()
        _write(res, json_path, md)  # after every section: a long run keeps what it measured
    res["machine"]["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    _write(res, json_path, md)
    print(f"[bench] wrote {json_path} and {md}", file=sys.stderr)
    return res


def _write(res: dict[str, Any], json_path: Path, md: Path) -> None:
    res["targets"] = targets(res)
    tmp = json_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(res, indent=1))
    tmp.replace(json_path)
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text(render_markdown(res))


def combine(paths: list[str], md_path: str | None) -> dict[str, Any]:
    """Merge the sections of several runs (later files win) into one JSON + Markdown.

    For a long run finished in pieces: each section keeps the file, machine state and command
    it came from in ``section_sources``, so no figure loses its provenance.
    """
    runs = [json.loads(Path(p).read_text()) for p in paths]
    for r, p in zip(runs, paths, strict=True):
        if r.get("schema") != SCHEMA:
            raise ValueError(f"{p}: schema {r.get('schema')!r}, expected {SCHEMA!r}")
    sizes = {r["settings"]["size"] for r in runs}
    if len(sizes) > 1:
        raise ValueError(f"cannot combine runs of different sizes: {sorted(sizes)}")
    res = json.loads(json.dumps(runs[-1]))
    res["sections"], res["errors"], res["section_sources"] = {}, {}, {}
    for r, p in zip(runs, paths, strict=True):
        for name, sec in r["sections"].items():
            res["sections"][name] = sec
            res["errors"].pop(name, None)
            res["section_sources"][name] = {
                "json": p, "command": r["command"], "created": r["created"],
                "loadavg_start": r["machine"].get("loadavg_start"),
                "loadavg_end": r["machine"].get("loadavg_end"),
                "threads": r["machine"]["threads"], "reps": r["settings"]["reps"],
                "wall_s": r.get("section_wall_s", {}).get(name)}
        for name, err in r.get("errors", {}).items():
            if name not in res["sections"]:
                res["errors"][name] = err
    res["combined_from"] = list(paths)
    res["sections"] = {k: res["sections"][k] for k in ALL_SECTIONS if k in res["sections"]}
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    json_path = results_root() / "bench" / f"{stamp}.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    res["json_path"] = str(json_path)
    res["command"] = "python -m experiments.bench --combine " + " ".join(paths)
    md = Path(md_path) if md_path else REPO / "docs" / "BENCH.md"
    res["markdown_path"] = str(md)
    _write(res, json_path, md)
    print(f"[bench] wrote {json_path} and {md}", file=sys.stderr)
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=sorted(SIZES), default=os.environ.get("BENCH_SIZE", "full"))
    p.add_argument("--sections", default=",".join(ALL_SECTIONS),
                   help=f"comma-separated subset of {','.join(ALL_SECTIONS)}")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--gpu-peak-tflops", type=float, default=None,
                   help="GPU peak for MFU when the device name is not in the built-in table")
    p.add_argument("--reps", type=int, default=None, help="timed reps (>= 5)")
    p.add_argument("--warmup", type=int, default=None, help="untimed warm-up reps")
    p.add_argument("--md", default=None, help="Markdown output (default: docs/BENCH.md for "
                                              "--size full, else beside the JSON)")
    p.add_argument("--combine", nargs="+", default=None, metavar="JSON",
                   help="merge the sections of earlier runs (later files win) and render")
    a = p.parse_args(argv)
    if a.combine:
        combine(a.combine, a.md)
        return 0
    sections = [s for s in a.sections.split(",") if s]
    bad = [s for s in sections if s not in SECTIONS]
    if bad:
        p.error(f"unknown sections {bad}; allowed: {list(SECTIONS)}")
    command = "python -m experiments.bench " + " ".join(argv if argv is not None else sys.argv[1:])
    res = run(a.size, sections, a.threads, a.device, a.gpu_peak_tflops, a.md, command.strip(),
              a.reps, a.warmup)
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
