"""The config of a paper recipe's costliest cell (the Free Transformer at the grid's largest H)
at the recipe's micro-batch for a GPU type: what `make paper DRY=1` measures on fake tensors
(pipelines/paper.py) and what dev/recipe_memory.py measured into measured/memory/recipes.json.
It lives here, above sweeps/ (the recipes) and experiments/ (the measurement)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def cell_config(rec: Any, gpu: Any, overrides: Sequence[str] = (), gpus: int | None = None
                ) -> Any:
    """The TrainConfig of the recipe's costliest cell at its measured micro-batch for GPU type
    `gpu`, or at a `sweeps.recipe.MicroBatch` being measured (`overrides` win over the
    recipe's)."""
    from sweeps.backend import compose_overrides
    from sweeps.recipe import gpu_overrides, merge_overrides

    ov = [f"model.latent_bits={max(rec.grid.latent_bits)}",
          f"model.kappa_bits={float(rec.grid.kappa_bits[0])}", *overrides]
    if gpus:
        ov.append(f"train.plan_world_size={gpus}")
    base = (rec.training_overrides(gpu=gpu) if isinstance(gpu, str)
            else (*rec.training_overrides(), *gpu_overrides(gpu)))
    return compose_overrides(list(merge_overrides(base, ov)))
