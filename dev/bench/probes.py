"""Two one-off measurements behind docs/BENCH.md's hand-run tables (issue 18), 1 thread.

    python -m dev.bench.probes mapper-bf16   # bf16 mapper: gradient error and time
    python -m dev.bench.probes decode-batch  # decode ms/step and tokens/s by batch size
    python -m dev.bench.probes step-split    # where a 16M training step's time goes

mapper-bf16: the bit-logit gradient of `latent_embedding` in float32 and with bf16 dL/dG inputs,
against the paper's dense formula in float64 (logits ~ N(0, 4), W ~ N(0, 0.02^2), D=384): the
relative error over all tokens, the smallest per-token cosine, and the backward time (median
of 3). decode-batch: greedy KV-cache generation of the 16M baseline (untrained weights, no stop
sequences, 64 new tokens, prompts of 7-28 tokens), one timed call per batch size after a warm-up.
step-split: forward, backward, grad clip, fused AdamW and zero_grad of one 16M step (B=8, T=256)
for the baseline and the Free Transformer at H=16 (median of 3 after a warm-up).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from model import build_model, get_preset
from model.free_transformer import latent_embedding, sample_codes


def dense_latent(o: torch.Tensor, w: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """(Y + G - G.detach()) @ W^T with G over all 2^H codes, materialised."""
    H = o.shape[-1]
    d = torch.arange(1 << H)
    bits = ((d[:, None] >> torch.arange(H)) & 1).bool()
    p = torch.sigmoid(o)
    G = torch.where(bits[None], p[:, None, :], 1 - p[:, None, :]).prod(-1)
    return (F.one_hot(codes, 1 << H).to(G.dtype) + G - G.detach()) @ w.t()


def mapper_bf16(cases: list[tuple[int, int]]) -> None:
    print("| H | N | float32 rel. error | bf16 rel. error | bf16 min per-token cosine | "
          "float32 ms | bf16 ms |\n|---|---|---|---|---|---|---|")
    for H, N in cases:
        torch.manual_seed(0)
        o, w = torch.randn(N, H) * 2, torch.randn(384, 1 << H) * 0.02
        g = torch.randn(N, 384) * 1e-3
        codes = sample_codes(o)
        o64 = o.double().requires_grad_()
        (dense_latent(o64, w.double(), codes) * g.double()).sum().backward()
        ref = o64.grad
        row = []
        for bf16 in (False, True):
            ts, grad = [], None
            for _ in range(3):
                oo = o.clone().requires_grad_()
                out = latent_embedding(oo, w, codes, bf16=bf16)
                t = time.perf_counter()
                (out * g).sum().backward()
                ts.append(time.perf_counter() - t)
                grad = oo.grad.double()
            assert grad is not None
            rel = float((grad - ref).norm() / ref.norm())
            cos = float(F.cosine_similarity(grad, ref, dim=1).min())
            row.append((rel, cos, statistics.median(ts) * 1e3))
        (r32, _, t32), (r16, c16, t16) = row
        print(f"| {H} | {N} | {r32:.1e} | {r16:.1e} | {c16:.5f} | {t32:.0f} | {t16:.0f} |")


@torch.no_grad()
def decode_batch(batches: list[int], new: int = 64) -> None:
    m = build_model(get_preset("16M")).eval()
    g = torch.Generator().manual_seed(5)
    print("| batch | ms per step | tokens/s |\n|---|---|---|")
    for B in batches:
        lens = torch.randint(7, 29, (B,), generator=g).tolist()
        rows = [torch.randint(1, m.cfg.vocab_size, (n,), generator=g).tolist() for n in lens]
        m.generate(rows, 4)
        t = time.perf_counter()
        m.generate(rows, new)
        dt = time.perf_counter() - t
        print(f"| {B} | {dt / new * 1e3:.1f} | {B * new / dt:.0f} |")


def step_split(bits: tuple[int, ...] = (0, 16), reps: int = 3) -> None:
    from experiments.train.trainer import param_groups

    print("| H | forward s | backward s | clip s | AdamW s | zero_grad s | step s |\n"
          "|---|---|---|---|---|---|---|")
    for H in bits:
        torch.manual_seed(0)
        m = build_model(get_preset("16M", latent_bits=H)).train()
        opt = torch.optim.AdamW(param_groups(m, 0.1), lr=1e-4, fused=True)
        x = torch.randint(0, m.cfg.vocab_size, (8, 256))
        y = torch.randint(0, m.cfg.vocab_size, (8, 256))

        def step(m: torch.nn.Module = m, opt: torch.optim.Optimizer = opt,
                 x: torch.Tensor = x, y: torch.Tensor = y) -> list[float]:
            t = [time.perf_counter()]
            loss = m(x, targets=y).loss
            t.append(time.perf_counter())
            loss.backward()
            t.append(time.perf_counter())
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            t.append(time.perf_counter())
            opt.step()
            t.append(time.perf_counter())
            opt.zero_grad(set_to_none=True)
            t.append(time.perf_counter())
            return [b - a for a, b in zip(t, t[1:], strict=False)]

        step()
        med = [statistics.median(c) for c in zip(*(step() for _ in range(reps)), strict=True)]
        print(f"| {H} | " + " | ".join(f"{v:.3f}" for v in med) + f" | {sum(med):.3f} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dev.bench.probes",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("probe", choices=["mapper-bf16", "decode-batch", "step-split"])
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    if a.probe == "mapper-bf16":
        mapper_bf16([(8, 2048), (12, 1024), (16, 256)])
    elif a.probe == "decode-batch":
        decode_batch([1, 2, 4, 8, 16, 32, 64])
    else:
        step_split()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
