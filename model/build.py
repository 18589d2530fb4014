"""Which architecture a config names (kept apart so checkpoint.py needs no model/__init__)."""

from __future__ import annotations

from .config import ModelConfig
from .free_transformer import FreeTransformer
from .transformer import Transformer


def build_model(cfg: ModelConfig) -> Transformer:
    """The baseline for latent_bits == 0, else the Free Transformer with H = latent_bits."""
    return FreeTransformer(cfg) if cfg.is_free else Transformer(cfg)
