"""Issue 45, the model's side: which attention kernel each evaluation form gets and what the
fused (compiled) chunked cross-entropy saves, timed. One-off measurement, never imported.

    PYTHONPATH=$PWD python dev/gpu/issue45_kernels.py            # CUDA: the 1.5B shape
    PYTHONPATH=$PWD python dev/gpu/issue45_kernels.py --cpu      # CPU: a small shape, CE only

Attention (CUDA only): each form `model.layers.Attention._sdpa` now sends, at the 1.5B shape
(12 query / 2 KV heads, head_dim 128, bf16), run with only the flash and memory-efficient
kernels allowed (what an A100 or an older torch has: no cuDNN attention), against the form it
replaced (a bool mask with enable_gqa), time and peak extra memory, and its max difference
from the math kernel. Cross-entropy: `model.readout.linear_cross_entropy` forward + backward,
eager chunks vs compiled chunks, time, peak memory and the loss against the eager one.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from model import ModelConfig
from model.layers import Attention
from model.readout import linear_cross_entropy


def timed(fn, n: int, cuda: bool) -> tuple[float, float]:
    """(ms per call, peak extra GB) over n calls after one warm-up."""
    fn()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    if cuda:
        torch.cuda.synchronize()
    ms = (time.perf_counter() - t) / n * 1e3
    peak = (torch.cuda.max_memory_allocated() - base) / 1e9 if cuda else float("nan")
    return ms, peak


def attention(dev: str = "cuda", T: int = 4096) -> None:
    d = dict(device=dev, dtype=torch.bfloat16)
    att = Attention(ModelConfig(vocab_size=8, dim=1536, n_heads=12, n_kv_heads=2, ffn_dim=8,
                                max_seq_len=4096))
    B, cuda = 2, dev == "cuda"
    q = torch.randn(B, 12, T, 128, **d)
    k, v = torch.randn(B, 2, T, 128, **d), torch.randn(B, 2, T, 128, **d)
    plen = torch.tensor([T // 3, 3 * T // 4], device=dev)
    keys = torch.arange(T, device=dev)[None, :] < plen[:, None]  # (B, T)
    old_enc = (keys[:, None, :] | torch.eye(T, dtype=torch.bool, device=dev))[:, None]
    new_enc = keys[:, None, None, :].expand(B, 1, T, T)  # model.free_transformer._prefix_mask
    E = T // 8
    qe = q[:, :, -E:]
    old_ext = torch.ones(E, T, dtype=torch.bool, device=dev).tril(T - E)
    pad = torch.arange(T, device=dev)[None, :] >= torch.tensor([0, T // 6], device=dev)[:, None]
    causal = torch.ones(T, T, dtype=torch.bool, device=dev).tril()
    prefill = ((pad[:, None, :] & causal) | torch.eye(T, dtype=torch.bool, device=dev))[:, None]
    qd = q[:, :, -1:]
    dec = torch.zeros(B, 1, 1, T, **d).masked_fill(~pad[:, None, None, :], float("-inf"))
    cases = [  # (name, new call, old call, reference mask for the math kernel, q)
        (f"extend {E} on {T - E} cached", lambda: att._sdpa(qe, k, v, causal_lower_right(E, T),
                                                            False),
         lambda: F.scaled_dot_product_attention(qe, k, v, attn_mask=old_ext, enable_gqa=True),
         old_ext),
        ("FT prefix encoder", lambda: att._sdpa(q, k, v, new_enc, False),
         lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=old_enc, enable_gqa=True),
         new_enc),
        ("padded prefill", lambda: att._sdpa(q, k, v, prefill, False),
         lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=prefill, enable_gqa=True),
         prefill),
        ("padded decode step", lambda: att._sdpa(qd, k, v, dec, False),
         lambda: F.scaled_dot_product_attention(qd, k, v, attn_mask=dec, enable_gqa=True), dec),
    ]
    fused = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
    for name, new, old, ref_mask in cases:
        qq = qe if "extend" in name else qd if "decode" in name else q
        with sdpa_kernel(SDPBackend.MATH):
            ref = F.scaled_dot_product_attention(qq, k, v, attn_mask=ref_mask, enable_gqa=True)
        for label, fn in (("new", new), ("old", old)):
            for kernels, kname in ((fused, "flash/efficient only"), (None, "any kernel")):
                try:
                    with sdpa_kernel(kernels) if kernels else contextlib.nullcontext():
                        ms, gb = timed(fn, 10, cuda)
                        # the encoder: only the outputs that are kept (before every prefix)
                        n = T // 3 if "encoder" in name else None
                        err = (fn()[..., :n, :].float() - ref[..., :n, :].float()).abs().max()
                    print(f"attn {name:28s} {label} [{kname}]: {ms:.3f} ms, peak +{gb:.3f} GB, "
                          f"max |diff| vs math {err.item():.1e}", flush=True)
                except RuntimeError as e:
                    print(f"attn {name:28s} {label} [{kname}]: refused ({str(e)[:70]!r})",
                          flush=True)


def cross_entropy(cuda: bool, N: int, D: int, V: int, chunk_tokens: list[int]) -> None:
    dev = "cuda" if cuda else "cpu"
    g = torch.Generator(device=dev).manual_seed(0)
    h = (torch.randn(N, D, device=dev, generator=g) * 0.5).requires_grad_()
    w = (torch.randn(V, D, device=dev, generator=g) * 0.02).requires_grad_()
    t = torch.randint(0, V, (N,), device=dev, generator=g)
    ref = None
    for compiled in (False, True):
        for tok in chunk_tokens if compiled else chunk_tokens[:1]:
            budget = tok * V * 4

            def step(c: bool = compiled, b: int = budget) -> torch.Tensor:
                with torch.autocast(dev, dtype=torch.bfloat16):
                    loss = linear_cross_entropy(h, w, t, b, compiled=c)
                loss.backward()
                return loss.detach()

            t0 = time.perf_counter()
            loss = step()
            if cuda:
                torch.cuda.synchronize()
            first = time.perf_counter() - t0
            ms, gb = timed(step, 5 if cuda else 2, cuda)
            ref = loss if ref is None else ref
            kernels = ""
            if cuda:
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    step()
                    torch.cuda.synchronize()
                kernels = f", {sum(e.device_type.name == 'CUDA' for e in prof.events())} kernels"
            print(f"CE N={N} D={D} V={V} bf16 autocast, {'compiled' if compiled else 'eager'} "
                  f"chunks of {tok} tokens: {ms:.1f} ms fwd+bwd (first call {first:.1f} s), "
                  f"peak +{gb:.2f} GB{kernels}, loss {loss.item():.6f} "
                  f"(eager {ref.item():.6f})", flush=True)
            h.grad = w.grad = None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu", action="store_true", help="the CPU figures at a small shape")
    a = ap.parse_args()
    if a.cpu or not torch.cuda.is_available():
        torch.set_num_threads(1)
        cross_entropy(False, 1024, 128, 8192, [256])
        return
    print("torch", torch.__version__, torch.cuda.get_device_name(), flush=True)
    attention()
    cross_entropy(True, 8192, 1536, 1 << 17, [512, 1024])


if __name__ == "__main__":
    main()
