"""Architectures only: the baseline decoder and the Free Transformer (no training or eval code)."""

from .accounting import FlopsBreakdown, param_count, train_flops_per_token
from .build import build_model
from .checkpoint import CheckpointError, LoadedCheckpoint, load_checkpoint, save_checkpoint
from .config import PRESETS, ModelConfig, get_preset
from .free_transformer import FreeTransformer
from .readout import READOUT_CHUNK_BYTES, TokenScores, linear_cross_entropy
from .transformer import Generation, LowerHalf, ModelOutput, Transformer, count_parameters

__all__ = [
    "PRESETS", "READOUT_CHUNK_BYTES", "CheckpointError", "FlopsBreakdown", "FreeTransformer",
    "Generation", "LoadedCheckpoint", "LowerHalf", "ModelConfig", "ModelOutput", "TokenScores",
    "Transformer", "build_model", "count_parameters", "get_preset", "linear_cross_entropy",
    "load_checkpoint", "param_count", "save_checkpoint", "train_flops_per_token",
]
