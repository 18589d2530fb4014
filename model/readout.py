"""The readout (D -> V logits) and what is computed from it, over chunks of tokens.

At the paper's shape (vocabulary 2^17, context 4096) one row of logits is 2^29 numbers; every
quantity here is per token, so the readout runs over chunks whose float32 (tokens x V) buffer
fits `chunk_bytes` (a memory knob: values equal the unchunked ones to float rounding).
`linear_cross_entropy` is a custom autograd function because torch's own
`F.linear_cross_entropy` (torch 2.13) returns the loss in the input dtype (8 bits of mantissa
under bf16 autocast); like Liger's, it computes both inputs' gradients in the forward, chunk by
chunk, so nothing is recomputed and the backward only scales them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

IGNORE_INDEX = -100
"""Targets with this value are not scored (torch's `cross_entropy` default)."""

READOUT_CHUNK_BYTES = 256 << 20
"""Default budget of the one float32 (tokens x V) buffer of a readout chunk (512 tokens at
V = 2^17); scoring holds about 1-1.5x this per chunk, the chunked training loss 1.5-2x."""


@dataclass
class TokenScores:
    """Per-token scores of targets under the model's next-token distribution."""

    logprob: torch.Tensor
    """(..., T) log p(target) in nats, float32 (float64 for a float64 model); 0 where the target
    is -100, so sums over positions count only scored tokens. With mixture: (k, ..., T), one row
    per draw."""
    greedy: torch.Tensor
    """(..., T) bool: the target is the argmax of the distribution (the first maximal index, as
    `argmax`); True where the target is -100, so `.all()` over positions counts only scored
    tokens. With mixture: the argmax of the mean of the k draws' probabilities."""


def float_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype log-softmax and cross-entropy run in: at least float32."""
    return torch.promote_types(dtype, torch.float32)


def chunk_tokens(chunk_bytes: int, vocab_size: int, dtype: torch.dtype, rows: int = 1) -> int:
    """Tokens per chunk such that a float (rows x tokens x V) buffer takes at most chunk_bytes
    (at least one token)."""
    item = float_dtype(dtype).itemsize
    return max(1, chunk_bytes // (rows * vocab_size * item))


def _check_chunk_bytes(chunk_bytes: int) -> None:
    if not isinstance(chunk_bytes, int) or isinstance(chunk_bytes, bool) or chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes={chunk_bytes!r} must be a positive integer (bytes)")


@torch.no_grad()
def score_readout(readout: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor,
                  targets: torch.Tensor, vocab_size: int, chunk_bytes: int = READOUT_CHUNK_BYTES,
                  mixture: bool = False) -> TokenScores:
    """Score targets from the readout's input over chunks of tokens; no (tokens x V) tensor
    exists for more than one chunk. readout: the D -> V map, called as the unchunked path calls
    it (autocast applies the same way); it must return a new tensor. hidden (..., D); targets
    (...) long, -100 = not scored; mixture: hidden (k, ..., D), k draws sharing the targets.
    Log-probabilities equal `log_softmax(logits.float())` at the target to float rounding."""
    _check_chunk_bytes(chunk_bytes)
    lead = hidden.shape[1:-1] if mixture else hidden.shape[:-1]
    if tuple(targets.shape) != tuple(lead):
        raise ValueError(f"targets have shape {tuple(targets.shape)}, expected {tuple(lead)} "
                         f"for hidden of shape {tuple(hidden.shape)}"
                         + (" (mixture: k draws first)" if mixture else ""))
    D = hidden.shape[-1]
    k = hidden.shape[0] if mixture else 1
    h = hidden.reshape(k, -1, D)  # (k, N, D)
    tgt = targets.reshape(-1).to(hidden.device)
    N = tgt.numel()
    keep = tgt != IGNORE_INDEX
    idx = tgt.clamp(min=0)[None, :, None]  # a gather index for every position
    logprob: torch.Tensor | None = None  # (k, N), made at the first chunk in its dtype
    greedy = torch.ones(N, dtype=torch.bool, device=hidden.device)
    step = chunk_tokens(chunk_bytes, vocab_size, hidden.dtype, k)
    for s in range(0, N, step):
        e = min(N, s + step)
        logits = readout(h[:, s:e])  # (k, n, V)
        lf = logits.to(float_dtype(logits.dtype))  # at least float32, as `.float()` was
        del logits
        if logprob is None:
            logprob = torch.zeros(k, N, dtype=lf.dtype, device=lf.device)
        picked = lf.gather(-1, idx[:, s:e].expand(k, -1, 1)).squeeze(-1)
        mx, best = lf.max(-1)  # max(-1).indices: the first maximal index, as argmax
        # log-sum-exp in place (one pass fewer than log_softmax + argmax; nothing else reads
        # the chunk's logits): lf becomes exp(logit - max)
        lse = mx + lf.sub_(mx[..., None]).exp_().sum(-1).log()
        logprob[:, s:e] = picked - lse
        if mixture:  # the argmax of the draws' mean probability exp(logit - lse)
            best = lf.mul_((mx - lse).exp()[..., None]).mean(0).argmax(-1)
        else:
            best = best[0]
        greedy[s:e] = best == tgt[s:e]
        del lf
    if logprob is None:  # no position at all
        logprob = torch.zeros(k, 0, dtype=float_dtype(hidden.dtype), device=hidden.device)
    logprob = logprob.masked_fill(~keep[None], 0.0)
    greedy = greedy | ~keep
    shape = (k, *lead) if mixture else tuple(lead)
    return TokenScores(logprob=logprob.reshape(shape), greedy=greedy.reshape(lead))


def _compute_dtype(h: torch.Tensor, w: torch.Tensor) -> torch.dtype:
    """The dtype `F.linear(h, w)` computes in here: autocast's where it is on (it leaves float64
    alone), else the inputs' promoted dtype."""
    dev = h.device.type
    if (torch.is_autocast_enabled(dev) and h.dtype != torch.float64
            and w.dtype != torch.float64):
        return torch.get_autocast_dtype(dev)
    return torch.promote_types(h.dtype, w.dtype)


def _chunk_loss(hc: torch.Tensor, wc: torch.Tensor, tgt: torch.Tensor, kc: torch.Tensor,
                scale: torch.Tensor, fdt: torch.dtype, need_grad: bool
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One chunk of `_ChunkedLinearCE`: hc (n, D), wc (V, D) in the compute dtype -> (the
    chunk's summed loss in fdt, dL/dlogits or None). Eager everywhere but CUDA, where
    `compiled_chunk_loss` fuses what follows the matmul."""
    lf = torch.mm(hc, wc.t()).to(fdt)
    picked = lf.gather(1, tgt[:, None]).squeeze(1)
    mx = lf.amax(-1, keepdim=True)
    p = lf.sub_(mx).exp_()  # exp(logit - max), in place
    se = p.sum(-1)
    lse = mx.squeeze(1) + se.log()
    loss = torch.where(kc, lse - picked, 0.0).sum()
    if not need_grad:
        return loss, None
    # dL/dlogits = (softmax - one_hot(target)) / n on scored rows, 0 elsewhere
    p.div_(se[:, None])
    p.scatter_add_(1, tgt[:, None], torch.full((hc.shape[0], 1), -1.0, dtype=fdt,
                                               device=hc.device))
    p.mul_((kc.to(fdt) * scale)[:, None])
    return loss, p.to(hc.dtype)


@functools.cache
def compiled_chunk_loss() -> Callable[..., tuple[torch.Tensor, torch.Tensor | None]]:
    """`_chunk_loss` compiled (inductor, one graph per chunk length and grad mode): the bf16
    logits read three times and the gradient written once instead of about 8 passes over the
    float32 logits; values equal the eager chunk's to float rounding."""
    return torch.compile(_chunk_loss, dynamic=False, fullgraph=True)


class _ChunkedLinearCE(torch.autograd.Function):
    """mean_{t: target != -100} [logsumexp(h_t W^T) - (h_t W^T)[target_t]] over chunks. The
    forward computes each chunk's logits once and, when a gradient is wanted, its share of dL/dh
    and dL/dW; the backward scales them by the upstream scalar. Matmuls run in the dtype
    autocast would give `F.linear`, the softmax in float32 or float64."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, step: int,
                cdt: torch.dtype, compiled: bool = False) -> torch.Tensor:
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dev = h.device
        fdt = float_dtype(cdt)
        N = h.shape[0]
        chunk = compiled_chunk_loss() if compiled else _chunk_loss
        with torch.autocast(dev.type, enabled=False):
            keep = targets != IGNORE_INDEX
            # 1/n as a tensor (no host sync); n = 0 gives nan, as F.cross_entropy's mean does
            scale = 1.0 / keep.sum().to(fdt)
            tgt = targets.clamp(min=0)
            wc = w.to(cdt)
            total = torch.zeros((), dtype=fdt, device=dev)
            gh = torch.empty_like(h) if need_h else None
            gw = torch.zeros(w.shape, dtype=float_dtype(w.dtype), device=dev) if need_w else None
            for s in range(0, N, step):
                e = min(N, s + step)
                hc = h[s:e].to(cdt)
                loss, dl = chunk(hc, wc, tgt[s:e], keep[s:e], scale, fdt, need_h or need_w)
                total += loss
                if dl is not None:
                    if need_h:
                        gh[s:e] = torch.mm(dl, wc).to(h.dtype)
                    if need_w:
                        if gw.dtype == cdt:
                            # in place through out=: FlopCounterMode counts it (not addmm_)
                            torch.addmm(gw, dl.t(), hc, out=gw)
                        else:  # the chunk's product in the compute dtype, summed in float32
                            gw.add_(torch.mm(dl.t(), hc))
                del dl
        ctx.grads = (gh, gw.to(w.dtype) if gw is not None else None)
        return total * scale

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        if ctx.grads is None:
            raise RuntimeError("the chunked cross-entropy's backward runs once (its gradients "
                               "are computed in the forward and released by the backward)")
        gh, gw = ctx.grads
        ctx.grads = None
        # in place: the buffers were made for this backward and nothing else holds them
        if gh is not None:
            gh.mul_(g.to(gh.dtype))
        if gw is not None:
            gw.mul_(g.to(gw.dtype))
        return gh, gw, None, None, None, None


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         chunk_bytes: int = READOUT_CHUNK_BYTES,
                         compiled: bool = False) -> torch.Tensor:
    """Mean cross-entropy in nats of `F.linear(h, weight)` against targets != -100, without the
    (N x V) logits: equal to `F.cross_entropy(F.linear(h, weight).float(), targets)` to float
    rounding, in value and gradients. h (N, D), weight (V, D), targets (N,) long; the loss is
    float32 (float64 for float64 inputs). compiled: `compiled_chunk_loss` per chunk."""
    _check_chunk_bytes(chunk_bytes)
    if h.dim() != 2 or weight.dim() != 2 or h.shape[1] != weight.shape[1]:
        raise ValueError(f"h (N, D) and weight (V, D) expected, got {tuple(h.shape)} and "
                         f"{tuple(weight.shape)}")
    if targets.shape != h.shape[:1]:
        raise ValueError(f"targets must have shape {(h.shape[0],)}, got {tuple(targets.shape)}")
    cdt = _compute_dtype(h, weight)
    step = chunk_tokens(chunk_bytes, weight.shape[0], cdt)
    return _ChunkedLinearCE.apply(h, weight, targets, step, cdt, compiled)
