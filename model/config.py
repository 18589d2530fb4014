"""Typed model configuration and size presets named by parameter count.

One dataclass serves both arms: `latent_bits == 0` is the baseline decoder, `latent_bits = H > 0`
is the Free Transformer with H latent bits per token (2^H codes). Everything else is shared, so
a sweep can vary only the architecture knobs (`latent_bits`, `kappa_bits`, `n_layers`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

MAX_LATENT_BITS = 20


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 4096
    """Size of the token vocabulary (must match the tokenizer)."""
    dim: int = 128
    """Residual stream width D."""
    n_layers: int = 4
    """Decoder blocks L. The Free Transformer injects Z after block L/2, so L must be even."""
    n_heads: int = 4
    """Query heads; must divide `dim`."""
    n_kv_heads: int = 2
    """Key/value heads for grouped-query attention; must divide `n_heads`."""
    ffn_dim: int = 384
    """Hidden width of the SwiGLU MLP."""
    max_seq_len: int = 256
    """Longest sequence (prompt + generation) the RoPE table covers."""
    rope_theta: float = 10000.0
    """RoPE base frequency."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    tie_embeddings: bool = True
    """Share the input embedding and the output readout."""
    latent_bits: int = 0
    """H: 0 is the baseline decoder; 1..20 is a Free Transformer with 2^H latent codes."""
    kappa_bits: float = 0.5
    """Free-bits threshold kappa in bits per token (the KL below it is not penalised)."""
    init_std: float = 0.02
    """Std of the normal initialisation of every weight matrix."""
    mapper_chunk_bytes: int = field(default=128 << 20, compare=False)
    """Memory budget of the binary-mapper backward's one (tokens x 2^H) temporary: it runs over
    chunks of budget // (2^H x element size) tokens (512 float32 tokens at H=16), the same on
    CPU and GPU. A memory knob only: the maths, config equality and the run-id ignore it."""
    mapper_bf16: bool = False
    """Run the binary-mapper backward's dominant matmul (dL/dG = grad_r @ W) with bfloat16
    inputs: about 2.3x faster, the bit-logit gradient then approximate (measured in
    tests/test_model.py, docs/BENCH.md). Off by default; part of the run-id when on."""

    z_cut: bool = False
    """The Z-cut control: a Free Transformer whose post-sampler output is multiplied by 0 before
    it enters block L/2's keys/values, so nothing of Z reaches the decoder while FLOPs,
    parameters and the encoder's KL gradient stay the same (separates "the latent helps" from
    "the extra block helps"). Needs latent_bits > 0; part of the run-id when on."""

    def __post_init__(self) -> None:
        def bad(name: str, allowed: str) -> None:
            raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r}: {allowed}")

        for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim",
                     "max_seq_len", "mapper_chunk_bytes"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                bad(name, "must be a positive integer")
        if self.dim % self.n_heads:
            bad("n_heads", f"must divide dim={self.dim}")
        if (self.dim // self.n_heads) % 2:
            bad("n_heads", f"dim/n_heads must be even for RoPE (dim={self.dim})")
        if self.n_heads % self.n_kv_heads:
            bad("n_kv_heads", f"must divide n_heads={self.n_heads}")
        for name in ("mapper_bf16", "z_cut"):
            if not isinstance(getattr(self, name), bool):
                bad(name, "must be true or false")
        if self.z_cut and self.latent_bits == 0:
            bad("z_cut", "needs a Free Transformer (latent_bits > 0): a baseline has no Z")
        if not isinstance(self.latent_bits, int) or not 0 <= self.latent_bits <= MAX_LATENT_BITS:
            bad("latent_bits", f"must be an integer in 0..{MAX_LATENT_BITS} (0 = baseline)")
        if self.latent_bits > 0 and self.n_layers % 2:
            bad("n_layers", "must be even for a Free Transformer (Z enters after block L/2)")
        if not (isinstance(self.kappa_bits, (int, float)) and math.isfinite(self.kappa_bits)
                and self.kappa_bits >= 0):
            bad("kappa_bits", "must be a finite number >= 0 (bits per token)")
        for name in ("rope_theta", "norm_eps", "init_std"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                bad(name, "must be a finite number > 0")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def is_free(self) -> bool:
        return self.latent_bits > 0

    @property
    def n_codes(self) -> int:
        return 1 << self.latent_bits

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"ModelConfig: unknown field(s) {unknown}; known: {sorted(known)}")
        return cls(**d)

    def replace(self, **kw: Any) -> ModelConfig:
        if kw.get("latent_bits") == 0:
            kw.setdefault("z_cut", False)  # the baseline of a Z-cut control has no Z to cut
        return replace(self, **kw)


# Presets are named by their baseline parameter count (checked by tests/test_model.py).
# "1.5B" and "8B" follow the paper (docs/DESIGN.md, "The model"). The paper does not give the
# 1.5B's MLP width; 8960 is the width of the published 28-layer/1536/12q/2kv shape it matches
# (Qwen2-1.5B).
PRESETS: dict[str, ModelConfig] = {
    "1M": ModelConfig(vocab_size=2048, dim=128, n_layers=4, n_heads=4, n_kv_heads=2,
                      ffn_dim=384, max_seq_len=256, tie_embeddings=True),
    "16M": ModelConfig(vocab_size=8192, dim=384, n_layers=6, n_heads=6, n_kv_heads=2,
                       ffn_dim=1024, max_seq_len=512, tie_embeddings=False),
    "1.5B": ModelConfig(vocab_size=1 << 17, dim=1536, n_layers=28, n_heads=12, n_kv_heads=2,
                        ffn_dim=8960, max_seq_len=4096, rope_theta=500000.0,
                        tie_embeddings=True, latent_bits=0),
    "8B": ModelConfig(vocab_size=128256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8,
                      ffn_dim=14336, max_seq_len=8192, rope_theta=500000.0,
                      tie_embeddings=False),
}


def get_preset(name: str, **overrides: Any) -> ModelConfig:
    """A preset by name, with field overrides (e.g. latent_bits=16, kappa_bits=0.5)."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; allowed: {sorted(PRESETS)}")
    return PRESETS[name].replace(**overrides)
