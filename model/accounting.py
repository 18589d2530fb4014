"""Analytic parameter and training-FLOPs counts for both arms (docs/DESIGN.md, "Equal compute").

Convention (`torch.utils.flop_counter.FlopCounterMode`'s, so the count is tested against it):
matmul FLOPs only, 2 per multiply-add; attention over the full T x T score matrix, as the SDPA
kernels compute it; a backward costs twice its forward. The Free Transformer's post-sampler is a
gather in the forward and a scatter-add in the backward (no matmul); its binary mapper's
backward is dense over the 2^H codes (`train_flops_per_token`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import ModelConfig


@dataclass(frozen=True)
class FlopsBreakdown:
    """Training FLOPs per token (forward + backward), by component."""

    blocks: float
    readout: float
    encoder_block: float
    enc_readout: float
    mapper_backward: float

    @property
    def baseline_part(self) -> float:
        return self.blocks + self.readout

    @property
    def latent_part(self) -> float:
        return self.encoder_block + self.enc_readout + self.mapper_backward

    @property
    def total(self) -> float:
        return self.baseline_part + self.latent_part

    @property
    def overhead(self) -> float:
        """Extra FLOPs of the Free Transformer as a fraction of the shared part."""
        return self.latent_part / self.baseline_part


def block_params(cfg: ModelConfig) -> int:
    D, hd = cfg.dim, cfg.head_dim
    attn = D * cfg.n_heads * hd * 2 + D * cfg.n_kv_heads * hd * 2
    mlp = 3 * D * cfg.ffn_dim
    return attn + mlp + 2 * D  # + the two RMSNorm gains


def latent_params(cfg: ModelConfig) -> int:
    """Parameters the Free Transformer adds: encoder block, zeta, norm, readout, post-sampler."""
    if not cfg.is_free:
        return 0
    D, H = cfg.dim, cfg.latent_bits
    return block_params(cfg) + D + D + D * H + (1 << H) * D


def param_count(cfg: ModelConfig) -> dict[str, int]:
    emb = cfg.vocab_size * cfg.dim
    readout = 0 if cfg.tie_embeddings else cfg.vocab_size * cfg.dim
    blocks = cfg.n_layers * block_params(cfg)
    baseline = emb + readout + blocks + cfg.dim  # + final norm
    extra = latent_params(cfg)
    return {"embedding": emb, "readout": readout, "blocks": blocks, "baseline": baseline,
            "latent": extra, "total": baseline + extra,
            "non_embedding": baseline + extra - emb}


def _block_fwd_flops(cfg: ModelConfig, seq_len: int) -> float:
    D, hd = cfg.dim, cfg.head_dim
    linear = 2 * D * (2 * cfg.n_heads * hd + 2 * cfg.n_kv_heads * hd) + 2 * 3 * D * cfg.ffn_dim
    attn = 4 * seq_len * cfg.n_heads * hd  # QK^T and AV over T keys
    return linear + attn


def train_flops_per_token(cfg: ModelConfig, seq_len: int) -> FlopsBreakdown:
    """Training FLOPs per token at sequence length `seq_len`."""
    blk = 3 * _block_fwd_flops(cfg, seq_len)
    readout = 3 * 2 * cfg.dim * cfg.vocab_size
    if not cfg.is_free:
        return FlopsBreakdown(cfg.n_layers * blk, readout, 0.0, 0.0, 0.0)
    H, C, D = cfg.latent_bits, cfg.n_codes, cfg.dim
    # backward: dL/dG = g @ W^T (2·D·C), then G = G_hi (x) G_lo applied as two batched
    # mat-vecs over that buffer (4·C) plus the per-half tables (never a tokens x 2^H G)
    lo, hi = H // 2, H - H // 2
    mapper = 2 * D * C + 4 * C + 2 * ((1 << lo) * (lo + 1) + (1 << hi) * (hi + 1))
    return FlopsBreakdown(cfg.n_layers * blk, readout, blk, 3 * 2 * D * H, float(mapper))
