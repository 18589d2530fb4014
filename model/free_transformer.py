"""The Free Transformer (Fleuret 2025, arXiv 2510.17558, Algorithm 2; docs/DESIGN.md, "The
model"): a `Transformer` that overrides the trunk's key/value hook of block L/2 (`_kv_input`:
`block(x, kv_in=x + r)`), Z nowhere else. z="posterior" (training's default) samples H bits per
token from the non-causal encoder, z="prior" gives every token its own uniform code;
`prefix_len` is the honest scoring protocol: the encoder sees only the tokens before it, every
later position gets a prior code. The binary mapper (`latent_embedding`) gathers one
post-sampler column per token and applies the exact gradient over chunks of tokens.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .layers import Block, RMSNorm
from .transformer import LowerHalf, Transformer, _Ctx

LN2 = math.log(2.0)


def _f32(x: torch.Tensor) -> torch.Tensor:
    """At least float32 (bf16 under autocast is too coarse for the KL and G)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def kl_per_bit(bit_logits: torch.Tensor) -> torch.Tensor:
    """(..., H) bit logits -> (..., H) KL(Bernoulli(sigmoid(o_h)) || Bernoulli(1/2)) in nats."""
    o = _f32(bit_logits)
    p = torch.sigmoid(o)
    # -H_b(p) = p log p + (1-p) log(1-p), with stable log-sigmoids
    return LN2 + p * F.logsigmoid(o) + (1.0 - p) * F.logsigmoid(-o)


def kl_to_uniform(bit_logits: torch.Tensor) -> torch.Tensor:
    """(..., H) bit logits -> (...) KL(q || uniform over 2^H codes) in nats."""
    return kl_per_bit(bit_logits).sum(-1)


def free_bits_penalty(kl: torch.Tensor, kappa_bits: float) -> torch.Tensor:
    """(B, T) KL in nats -> mean over tokens of max(0, KL_t - kappa), kappa = kappa_bits ln 2."""
    return (kl - kappa_bits * LN2).clamp(min=0.0).mean()


_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (lowbias32-style) on int64 tensors holding values < 2^32. The
    multipliers are < 2^31, so no product overflows int64: the same bits on every device."""
    x = x & _M32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x2C1B3C6D) & _M32
    return x ^ (x >> 16)


def _mix_int(x: int) -> int:
    return int(_mix32(torch.tensor(x & _M32, dtype=torch.int64)))


class SequenceKeys:
    """Counter-based latent draws keyed per sequence, a drop-in for `generator=` in training.

    Row b of a batch draws element c of its (T, H) block (c = t * H + h) as
    hash(key_b, c): a sequence's Z depends only on its key, so it is the same whatever
    micro-batch, process or world size the sequence lands in, and it is computed on the model's
    device with no host round-trip. `for_batch(seed, step, first, n, device)` keys the global
    batch's sequences first..first+n-1 of optimizer step `step`."""

    def __init__(self, keys: torch.Tensor) -> None:
        self.keys = keys  # (B,) int64 in [0, 2^32)

    @classmethod
    def for_batch(cls, seed: int, step: int, first: int, n: int,
                  device: torch.device) -> SequenceKeys:
        base = _mix_int(_mix_int(_mix_int(seed) ^ (seed >> 32)) ^ step) ^ _mix_int(step >> 32)
        i = torch.arange(first, first + n, dtype=torch.int64, device=device)
        return cls(_mix32(_mix32(i & _M32 ^ base) ^ (i >> 32)))

    def bits32(self, shape: tuple[int, ...], device: torch.device,
               stream: int = 0) -> torch.Tensor:
        """(B, ...) int64 hashes in [0, 2^32); `stream` separates independent uses."""
        B = shape[0]
        if self.keys.shape != (B,):
            raise ValueError(f"SequenceKeys hold {tuple(self.keys.shape)} keys for a batch of {B}")
        n = math.prod(shape[1:])
        c = torch.arange(n, dtype=torch.int64, device=device) * 2 + stream
        k = self.keys.to(device)[:, None]
        return _mix32(_mix32(c[None, :] ^ k) + k).reshape(shape)

    def rand(self, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
        """Uniforms in [0, 1) with 24 bits, float32."""
        return (self.bits32(shape, device) >> 8).float() * (1.0 / (1 << 24))


def _rand(shape: tuple[int, ...], generator: torch.Generator | SequenceKeys | None,
          device: torch.device) -> torch.Tensor:
    if isinstance(generator, SequenceKeys):
        return generator.rand(shape, device)
    gdev = generator.device if generator is not None else device
    return torch.rand(shape, generator=generator, device=gdev).to(device)


def sample_codes(bit_logits: torch.Tensor,
                 generator: torch.Generator | SequenceKeys | None = None) -> torch.Tensor:
    """Sample H independent bits with P(B_h = 1) = sigmoid(o_h); code = sum_h 2^h bit_h."""
    H = bit_logits.shape[-1]
    u = _rand(tuple(bit_logits.shape), generator, bit_logits.device)
    bits = (u < torch.sigmoid(bit_logits.detach().float())).long()
    weights = 1 << torch.arange(H, device=bit_logits.device)
    return (bits * weights).sum(-1)


def uniform_codes(shape: tuple[int, ...], n_bits: int,
                  generator: torch.Generator | SequenceKeys | None,
                  device: torch.device) -> torch.Tensor:
    """Codes from the uniform prior, one per position."""
    if isinstance(generator, SequenceKeys):
        if n_bits > 32:
            raise ValueError("SequenceKeys draw codes of at most 32 bits")
        return generator.bits32(shape, device, stream=1) & ((1 << n_bits) - 1)
    gdev = generator.device if generator is not None else device
    return torch.randint(0, 1 << n_bits, shape, generator=generator, device=gdev).to(device)


def code_bits(n_bits: int, device: torch.device | None = None) -> torch.Tensor:
    """(2^H, H) float matrix: row d holds the bits of d, bit h = (d >> h) & 1."""
    d = torch.arange(1 << n_bits, device=device)
    return ((d[:, None] >> torch.arange(n_bits, device=device)) & 1).float()


def _kron_probs(p: torch.Tensor) -> torch.Tensor:
    """(n, k) bit probabilities -> (n, 2^k) with G[t, d] = prod_h P(B_th = b_h(d)), built bit
    by bit as a Kronecker product (no exp)."""
    n, k = p.shape
    G = torch.empty(n, 1 << k, dtype=p.dtype, device=p.device)
    G[:, :1] = 1.0
    m = 1
    for h in range(k):
        torch.mul(G[:, :m], p[:, h:h + 1], out=G[:, m:2 * m])
        G[:, :m].mul_(1.0 - p[:, h:h + 1])
        m *= 2
    return G


def mapper_chunk_tokens(chunk_bytes: int, latent_bits: int, element_size: int) -> int:
    """Tokens per chunk of the mapper backward: its (tokens x 2^H) temporary fits the budget."""
    return max(1, chunk_bytes // ((1 << latent_bits) * element_size))


class _LatentEmbedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, bit_logits: torch.Tensor, weight: torch.Tensor, codes: torch.Tensor,
                chunk_bytes: int, bf16: bool = False) -> torch.Tensor:
        # bit_logits (N, H), weight (D, C), codes (N,) -> (N, D) = weight[:, codes].T
        ctx.save_for_backward(bit_logits, weight, codes)
        ctx.chunk_bytes = chunk_bytes
        ctx.bf16 = bf16
        return weight.index_select(1, codes).t()

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        bit_logits, weight, codes = ctx.saved_tensors
        grad_logits = grad_w = None
        if ctx.needs_input_grad[1]:
            # d/dW of M @ W^T with M's value Y (one-hot): scatter the rows into their columns.
            grad_w = torch.zeros_like(weight)
            grad_w.index_add_(1, codes, grad_out.t().to(weight.dtype))
        if ctx.needs_input_grad[0]:
            o = _f32(bit_logits)
            N, H = o.shape
            # G = G_hi (x) G_lo over the high and low halves of the bits, so with A = dL/dG * G,
            # sum_d A[t,d] b_h(d) for a low bit h is sum_lo G_lo b_h(lo) sum_hi G_hi dL/dG[hi,lo]:
            # two batched mat-vecs over dL/dG replace building G (2^H per token) and its product.
            lo = H // 2
            hi = H - lo
            ones_col = torch.ones(1, 1, dtype=o.dtype, device=o.device)
            bits_lo = torch.cat([code_bits(lo, o.device).to(o.dtype),
                                 ones_col.expand(1 << lo, 1)], 1)  # [bits | 1]
            bits_hi = torch.cat([code_bits(hi, o.device).to(o.dtype),
                                 ones_col.expand(1 << hi, 1)], 1)
            p = torch.sigmoid(o)
            # dL/dG's inputs in bf16 (mapper_bf16): the one dense matmul, ~2.3x faster with bf16
            # units; its product is accumulated in float32 and read back as float32
            mm_dtype = torch.bfloat16 if ctx.bf16 else o.dtype
            w = weight.to(mm_dtype)
            g = grad_out.to(mm_dtype)
            grad_logits = torch.empty_like(o)
            step = mapper_chunk_tokens(ctx.chunk_bytes, H, o.element_size())
            buf = torch.empty(min(step, N), 1 << H, dtype=o.dtype, device=o.device)
            for s in range(0, N, step):
                e = min(N, s + step)
                dG = buf[: e - s]
                if ctx.bf16:
                    dG.copy_(torch.matmul(g[s:e], w))
                else:
                    torch.matmul(g[s:e], w, out=dG)  # dL/dG = grad_r @ W
                dG3 = dG.view(e - s, 1 << hi, 1 << lo)
                g_lo, g_hi = _kron_probs(p[s:e, :lo]), _kron_probs(p[s:e, lo:])
                u = torch.bmm(g_hi[:, None, :], dG3).squeeze(1)  # (n, 2^lo): summed over hi
                v = torch.bmm(dG3, g_lo[:, :, None]).squeeze(2)  # (n, 2^hi): summed over lo
                # dG[t,d]/do_th = G[t,d] (b_h(d) - p_th); the last column is sum_d A[t,d]
                r_lo = (u * g_lo) @ bits_lo
                r_hi = (v * g_hi) @ bits_hi
                grad_logits[s:e, :lo] = r_lo[:, :lo] - p[s:e, :lo] * r_lo[:, lo:]
                grad_logits[s:e, lo:] = r_hi[:, :hi] - p[s:e, lo:] * r_hi[:, hi:]
            grad_logits = grad_logits.to(bit_logits.dtype)
        return grad_logits, grad_w, None, None, None


def latent_embedding(bit_logits: torch.Tensor, weight: torch.Tensor, codes: torch.Tensor,
                     chunk_bytes: int = 128 << 20, bf16: bool = False) -> torch.Tensor:
    """The binary mapper followed by the post-sampler, without the (tokens x 2^H) one-hot.

    bit_logits (..., H), weight (D, 2^H) (the post-sampler's Linear weight), codes (...) long.
    Value: weight[:, codes].T, shape (..., D). Gradient: that of
    (one_hot(codes) + G - G.detach()) @ weight.T with G[d] = prod_h P(B_h = bit_h(d)), computed
    over chunks of tokens whose (tokens x 2^H) dL/dG temporary takes at most `chunk_bytes`.
    bf16: dL/dG = grad_r @ W from bfloat16 inputs (approximate; ModelConfig.mapper_bf16).
    """
    lead = codes.shape
    H = bit_logits.shape[-1]
    if weight.shape[1] != 1 << H:
        raise ValueError(f"weight has {weight.shape[1]} columns, expected 2^{H}")
    out = _LatentEmbedding.apply(bit_logits.reshape(-1, H), weight, codes.reshape(-1),
                                 chunk_bytes, bf16)
    return out.reshape(*lead, weight.shape[0])


class FreeTransformer(Transformer):
    def __init__(self, cfg: ModelConfig) -> None:
        if not cfg.is_free:
            raise ValueError("FreeTransformer needs latent_bits >= 1")
        # The shared part is built and initialised first, exactly as the baseline's, so with the
        # same seed both arms start from the same block weights.
        super().__init__(cfg)
        self.zeta = nn.Parameter(torch.zeros(cfg.dim))  # the encoder's learned query
        self.encoder = Block(cfg, causal=False)
        self.enc_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.enc_readout = nn.Linear(cfg.dim, cfg.latent_bits, bias=False)
        self.post_sampler = nn.Linear(cfg.n_codes, cfg.dim, bias=False)  # weight (D, 2^H)
        self.bit_kl: torch.Tensor | None = None  # (H,) mean KL per bit of the last posterior pass
        self._init_latent_modules()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if hasattr(self, "zeta"):
            self._init_latent_modules()

    def _init_latent_modules(self) -> None:
        std = self.cfg.init_std
        nn.init.normal_(self.zeta, mean=0.0, std=std)
        for m in (self.encoder, self.enc_readout, self.post_sampler):
            for p in m.parameters():
                if p.dim() >= 2:
                    nn.init.normal_(p, mean=0.0, std=std)
                else:
                    nn.init.ones_(p)  # RMSNorm gains

    @property
    def inject_at(self) -> int:
        """0-based index of the block whose keys/values receive Z (block L/2+1 of the paper)."""
        return self.split_at

    def forward_lower(self, tokens: torch.Tensor) -> LowerHalf:
        """Block L/2's output and the encoder's bit logits (B, T, H), the encoder seeing every
        position. Codes for `forward_upper`: `sample_codes(bit_logits, g)` (what
        `forward(z="posterior", generator=g)` uses), or `uniform_codes` (the prior)."""
        low = super().forward_lower(tokens)
        low.bit_logits = self.encode(low.hidden, _Ctx(rope=self._rope(None, tokens.shape[1])))
        return low

    def _check_codes(self, codes: torch.Tensor | None) -> None:
        if not isinstance(codes, torch.Tensor):
            raise ValueError("the upper half needs pinned codes, a (B, T) LongTensor in "
                             f"[0, 2^{self.cfg.latent_bits}), got {type(codes).__name__}")

    def encode(self, x: torch.Tensor, ctx: _Ctx) -> torch.Tensor:
        """Block-L/2 output (B, T, D) -> bit logits (B, T, H); non-causal over ctx.enc_mask."""
        B, T, D = x.shape
        q = self.zeta.to(x.dtype).expand(B, T, D)
        y = self.encoder(q, ctx.rope, kv_in=x, mask=ctx.enc_mask)
        return self.enc_readout(self.enc_norm(y))

    def _kv_input(self, i: int, x: torch.Tensor, ctx: _Ctx) -> torch.Tensor | None:
        if i != self.inject_at:
            return None
        B, T, _ = x.shape
        H = self.cfg.latent_bits
        z = ctx.z
        if z is None:
            z = "posterior" if self.training else "prior"
        w = self.post_sampler.weight
        if isinstance(z, torch.Tensor):
            if z.shape != (B, T):
                raise ValueError(f"pinned codes must have shape {(B, T)}, got {tuple(z.shape)}")
            if z.dtype != torch.long or bool(((z < 0) | (z >= 1 << H)).any()):
                raise ValueError(f"pinned codes must be int64 in [0, 2^{H})")
            codes = z.to(x.device)
            r = F.embedding(codes, w.t())
        elif z == "prior" and ctx.prefix_len is None:
            codes = uniform_codes((B, T), H, ctx.generator, x.device)
            r = F.embedding(codes, w.t())
        elif z in ("posterior", "prior"):
            if ctx.cache is not None and ctx.cache[i].len > 0:
                # the non-causal encoder would miss the cached positions' keys
                raise ValueError("the encoder runs only from an empty KV cache")
            enc_ctx = ctx
            if ctx.prefix_len is not None:
                if z != "prior":
                    raise ValueError("prefix_len goes with z='prior' (the scoring protocol)")
                enc_ctx = _Ctx(rope=ctx.rope, generator=ctx.generator,
                               enc_mask=_prefix_mask(ctx.prefix_len.to(x.device), T))
            bit_logits = self.encode(x, enc_ctx)
            codes = sample_codes(bit_logits, ctx.generator)
            if ctx.prefix_len is not None:
                # positions from prefix_len on are scored: their Z comes from the prior
                plen = ctx.prefix_len.to(x.device)
                after = torch.arange(T, device=x.device)[None, :] >= plen[:, None]
                codes = torch.where(after, uniform_codes((B, T), H, ctx.generator, x.device),
                                    codes)
                r = F.embedding(codes, w.t())
            else:
                per_bit = kl_per_bit(bit_logits)
                ctx.kl_tokens = per_bit.sum(-1)
                # the mean KL of each bit, for the trainer's tracking (read on logging steps)
                self.bit_kl = per_bit.detach().reshape(-1, H).mean(0)
                r = latent_embedding(bit_logits, w, codes, self.cfg.mapper_chunk_bytes,
                                     self.cfg.mapper_bf16)
        else:
            raise ValueError(f"z must be None, 'prior', 'posterior' or a LongTensor, got {z!r}")
        ctx.codes = codes
        if self.cfg.z_cut:
            # the Z-cut control: everything above ran (encoder, KL, mapper, post-sampler), and the
            # product with 0 keeps the mapper's backward in the graph (same FLOPs) while no value
            # or gradient of Z reaches the decoder
            r = r * 0.0
        return x + r.to(x.dtype)

    def _latent_penalty(self, ctx: _Ctx) -> torch.Tensor:
        if ctx.kl_tokens is None:
            return torch.zeros((), device=self.device)
        return free_bits_penalty(ctx.kl_tokens, self.cfg.kappa_bits)

    def _gen_codes(self, z: object, B: int, P: int, max_new: int) -> tuple[object, object]:
        if isinstance(z, torch.Tensor):
            if z.shape == (B, max_new):
                return None, z
            if z.shape == (B, P + max_new):
                return z[:, :P], z[:, P:]
            raise ValueError(f"z codes must be (B, max_new_tokens)={(B, max_new)} or "
                             f"(B, P + max_new_tokens)={(B, P + max_new)}, got {tuple(z.shape)}")
        if z != "prior":
            raise ValueError(f"generation takes z='prior' or pinned codes, got {z!r}")
        return None, None


def _prefix_mask(prefix_len: torch.Tensor, T: int) -> torch.Tensor:
    """(B, 1, T, T) bool, the same row for every query (a key-padding mask, expanded without a
    copy, so attention folds the query heads instead of meeting GQA with a mask): every query
    sees the keys before prefix_len, which is all an encoder output that is kept reads. Outputs
    at and after prefix_len are replaced by prior codes; a row with prefix_len 0 sees key 0
    only so that its (replaced) outputs stay finite."""
    k = torch.arange(T, device=prefix_len.device)
    m = k[None, :] < prefix_len.clamp(min=1)[:, None]  # (B, T)
    return m[:, None, None, :].expand(-1, 1, T, T)
