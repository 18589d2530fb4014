"""Building blocks of the Llama-style decoder, shared by both arms: pre-norm RMSNorm, RoPE in
the rotate-half convention (HF `LlamaForCausalLM`'s, so a baseline exports by copying weights),
SwiGLU, grouped-query attention through `F.scaled_dot_product_attention`, no biases.

A mask tensor never meets grouped-query attention (`Attention._sdpa`): CUDA's flash kernel takes
no mask and the memory-efficient one no grouped heads, leaving only the math kernel. A causal
step on a filled KV cache takes `causal_lower_right`; a mask the same for every query folds each
group's query heads into the query axis; any other mask attends to expanded KV heads.
A block takes separate query and key/value inputs, `block(x, kv_in)`: the Free Transformer
feeds `x + r` to the keys/values of block L/2+1 only. The KV cache holds keys after RoPE.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.bias import CausalBias, causal_lower_right

from .config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # float32 statistics, as HF Llama does, so bf16 autocast does not change the norm.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope_table(head_dim: int, max_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (max_len, head_dim), rotate-half layout [f_0..f_{d/2-1}, f_0..]."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    ang = torch.outer(torch.arange(max_len, dtype=torch.float64), inv)  # (T, hd/2)
    ang = torch.cat([ang, ang], dim=-1)  # (T, hd)
    return ang.cos().float(), ang.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, T, nh, hd); cos/sin broadcastable to (B, T, 1, hd)."""
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rot * sin).to(x.dtype)


class KVCache:
    """Preallocated keys/values for one attention layer: (B, n_kv, S, hd)."""

    def __init__(self, batch: int, n_kv: int, max_len: int, head_dim: int,
                 device: torch.device, dtype: torch.dtype) -> None:
        self.k = torch.zeros(batch, n_kv, max_len, head_dim, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.len = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = k.shape[2]
        if self.len + t > self.k.shape[2]:
            raise ValueError(f"KV cache overflow: {self.len}+{t} > {self.k.shape[2]}")
        self.k[:, :, self.len:self.len + t] = k
        self.v[:, :, self.len:self.len + t] = v
        self.len += t
        return self.k[:, :, :self.len], self.v[:, :, :self.len]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, causal: bool = True) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.causal = causal
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * self.hd, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * self.hd, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(cfg.n_heads * self.hd, cfg.dim, bias=False)

    def forward(self, xq: torch.Tensor, xkv: torch.Tensor, rope: tuple,
                mask: torch.Tensor | None = None, cache: KVCache | None = None) -> torch.Tensor:
        B, Tq, _ = xq.shape
        Tk = xkv.shape[1]
        q = self.wq(xq).view(B, Tq, self.n_heads, self.hd)
        k = self.wk(xkv).view(B, Tk, self.n_kv, self.hd)
        v = self.wv(xkv).view(B, Tk, self.n_kv, self.hd)
        q = apply_rope(q, *rope).transpose(1, 2)  # (B, nh, Tq, hd)
        k = apply_rope(k, *rope).transpose(1, 2)  # (B, nkv, Tk, hd): xkv at xq's positions
        v = v.transpose(1, 2)
        s0 = 0
        if cache is not None:
            s0 = cache.len
            k, v = cache.append(k, v)
        # With no mask, causal: from an empty cache, is_causal; a multi-token step on a filled
        # cache holds the last Tq positions, so causal aligned to the lower right (CUDA's flash
        # kernel applies it itself, with grouped heads); one query after s0 keys sees them all.
        is_causal = self.causal and mask is None and s0 == 0 and Tq > 1
        if self.causal and mask is None and s0 > 0 and Tq > 1:
            mask = _lower_right(Tq, s0 + Tq)
        return self.wo(self._sdpa(q, k, v, mask, is_causal).transpose(1, 2)
                       .reshape(B, Tq, self.n_heads * self.hd))

    def _sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              mask: torch.Tensor | None, is_causal: bool) -> torch.Tensor:
        """q (B, nh, Tq, hd), k/v (B, nkv, S, hd) -> (B, nh, Tq, hd), in a form CUDA's fused
        kernels take: a mask tensor never goes with grouped heads (module docstring)."""
        g = self.n_heads // self.n_kv
        dev = q.device.type
        if isinstance(mask, CausalBias) and torch.is_autocast_enabled(dev):
            # a CausalBias takes the call before autocast would cast q, k, v (and refuses a
            # float32 KV cache beside bf16 queries): cast them as autocast would
            q, k, v = (t.to(torch.get_autocast_dtype(dev)) for t in (q, k, v))
        if mask is None or isinstance(mask, CausalBias) or g == 1:
            # enable_gqa: KV heads are shared by groups of query heads without copying them
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                                  enable_gqa=g > 1)
        B, _, Tq, hd = q.shape
        if mask.shape[-2] == 1 or mask.stride(-2) == 0:
            # every query sees the same keys: query head h = j * g + i reads KV head j, so the
            # g heads of group j become g * Tq queries of KV head j (one copy of q, none of K/V)
            y = F.scaled_dot_product_attention(q.reshape(B, self.n_kv, g * Tq, hd), k, v,
                                               attn_mask=mask[..., :1, :])
            return y.view(B, self.n_heads, Tq, hd)
        return F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1),
                                              v.repeat_interleave(g, 1), attn_mask=mask)


def _lower_right(tq: int, s: int) -> torch.Tensor:
    """`causal_lower_right(tq, s)`, made outside any dispatch mode: a CausalBias is a tensor
    subclass (without data) that a mode (experiments/memory.py's fake tensors and memory
    tracker) cannot construct; the attention call itself still runs under the modes."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        return causal_lower_right(tq, s)


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)  # gate
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)  # up
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """Pre-norm block: x + attn(norm(x), norm(kv_in)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig, causal: bool = True) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg, causal=causal)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x: torch.Tensor, rope: tuple, kv_in: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, cache: KVCache | None = None) -> torch.Tensor:
        hq = self.attn_norm(x)
        hkv = hq if kv_in is None else self.attn_norm(kv_in)
        a = self.attn(hq, hkv, rope, mask, cache)
        x = x + a
        return x + self.mlp(self.mlp_norm(x))
