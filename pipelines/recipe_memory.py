"""The paper recipes' measured memory per phase and GPU type: docs/RECIPES.md's generated block.

    python -m pipelines.recipe_memory [--gpus H100-80GB,...] [--recipes paper-1.5B,...]
        measures (experiments/memory.py, fake tensors, cached under paths.cache/memory), writes
        docs/memory/recipes.json (the records) and the block of docs/RECIPES.md between its
        markers from them
    python -m pipelines.recipe_memory --check
        exit 1 when the block is not what `block` writes from docs/memory/recipes.json

Each figure is the per-GPU peak of one phase of the recipe's costliest cell (the Free
Transformer at the grid's largest H) at the recipe's micro-batch for that GPU type
(`Recipe.micro_batches`, `training_overrides(gpu=...)`), on rank 0 of the recipe's planned world.
It lives here, above sweeps/ (the recipes) and experiments/ (the measurement).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "RECIPES.md"
RECORDS = ROOT / "docs" / "memory" / "recipes.json"
BEGIN = "<!-- memory:begin (python -m pipelines.recipe_memory; do not edit by hand) -->"
END = "<!-- memory:end -->"
PAPER_RECIPES = ("paper-1.5B", "paper-8B", "paper-8B-1T")
DEFAULT_GPUS = ("H100-80GB",)


def cell_config(rec: Any, gpu: str, overrides: Sequence[str] = (), gpus: int | None = None
                ) -> Any:
    """The TrainConfig of the recipe's costliest cell at its micro-batch for GPU type `gpu`."""
    from sweeps.backend import compose_overrides

    ov = [*rec.training_overrides(gpu=gpu), f"model.latent_bits={max(rec.grid.latent_bits)}",
          f"model.kappa_bits={float(rec.grid.kappa_bits[0])}", *overrides]
    if gpus:
        ov.append(f"train.plan_world_size={gpus}")
    return compose_overrides(ov)


def measure_recipes(recipes: Sequence[str], gpus: Sequence[str]) -> list[dict[str, Any]]:
    """One entry per (recipe, GPU type): its micro-batch and the measured phases."""
    from experiments.memory import measure_cached
    from sweeps.recipe import load

    out = []
    for name in recipes:
        rec = load(name)
        table = rec.micro_batches()
        for gpu in gpus:
            mb = table[gpu]
            cfg = cell_config(rec, gpu)
            recs, _ = measure_cached(cfg, device_type="cuda", cache=Path(cfg.paths.cache))
            out.append({"recipe": name, "gpu": gpu, "memory_gb": mb.memory_gb,
                        "parallel": mb.parallel, "micro_batch_size": mb.micro_batch_size,
                        "grad_accum": mb.grad_accum,
                        "activation_checkpointing": mb.activation_checkpointing,
                        "estimate_gb": mb.estimate_gb,
                        "phases": [r.to_json() for r in recs]})
    return out


def block(entries: Sequence[dict[str, Any]]) -> str:
    """The markdown block (between the markers) from the records."""
    rows = [BEGIN, "",
            "| recipe | GPU | parallel x world | micro-batch | train | validation | eval | "
            "save | host at save | hand estimate (train) |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for e in entries:
        ph = {p["phase"]: p for p in e["phases"]}

        def cell(phase: str, ph: dict[str, Any] = ph, cap: float = e["memory_gb"] * 1e9) -> str:
            p = ph.get(phase)
            if p is None:
                return "not measured"
            return f"{p['peak_bytes'] / 1e9:.1f} GB ({p['peak_bytes'] / cap:.0%})"

        tr = ph.get("train", {})
        save = ph.get("save", {})
        host = f"{save['host_bytes'] / 1e9:.1f} GB" if save.get("host_bytes") else "-"
        ck = ", act. ckpt" if e["activation_checkpointing"] else ""
        rows.append(f"| {e['recipe']} | {e['gpu']} | {tr.get('parallel', '-')} x "
                    f"{tr.get('world_size', '-')} | {e['micro_batch_size']} x accum "
                    f"{e['grad_accum']}{ck} | {cell('train')} | {cell('validation')} | "
                    f"{cell('eval')} | {cell('save')} | {host} | {e['estimate_gb']:.1f} GB |")
    gpus = sorted({e["gpu"] for e in entries})
    rows += ["", f"Measured per GPU (rank 0; percentages of the GPU's memory) on fake tensors by "
             "`experiments/memory.py` (torch's MemTracker / FSDPMemTracker under a fake process "
             "group of the recipe's world), for the H=16 Free Transformer at the micro-batch "
             "`Recipe.micro_batches` picks from the hand estimate (last column); GPU types "
             f"measured: {', '.join(gpus)}. Train: a step of 3 micro-batches (the peak does not "
             "grow after the second) with AdamW's state allocated; validation: one batch of "
             "logging.val_batch_size rows; eval: one loglikelihood batch of 16 continuations at "
             "the trained window, fp32 weights, one whole model per GPU; save: the DCP staging "
             "and the weights-only export (host at save: what rank 0 adds in host memory). Not "
             "tracked: the CUDA context and NCCL buffers (about 1-3 GB), the allocator's "
             "fragmentation, kernels' workspaces: `make gpu-check` measures them on a GPU. "
             "Records: docs/memory/recipes.json.", "", END]
    return "\n".join(rows)


def replace_block(doc: str, new: str) -> str:
    if BEGIN in doc and END in doc:
        head, rest = doc.split(BEGIN, 1)
        return head + new + rest.split(END, 1)[1]
    anchor = "## Keys the recipes need that the trainer does not have"
    section = "## Measured memory per phase\n\n" + new + "\n\n"
    return doc.replace(anchor, section + anchor, 1) if anchor in doc else doc + "\n" + section


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipelines.recipe_memory", description=__doc__)
    ap.add_argument("--recipes", default=",".join(PAPER_RECIPES))
    ap.add_argument("--gpus", default=",".join(DEFAULT_GPUS))
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args(argv)
    if a.check:
        entries = json.loads(RECORDS.read_text(encoding="utf-8"))
        if block(entries) not in DOC.read_text(encoding="utf-8"):
            print(f"{DOC}: the memory block is out of date: python -m pipelines.recipe_memory",
                  file=sys.stderr)
            return 1
        return 0
    from sweeps.recipe import GPU_TYPES, known

    recipes = [x for x in a.recipes.split(",") if x]
    gpus = [x for x in a.gpus.split(",") if x]
    bad = [g for g in gpus if g not in GPU_TYPES] + [r for r in recipes if r not in known()]
    if bad:
        print(f"recipe_memory: unknown {bad}; GPU types {list(GPU_TYPES)}, recipes {known()}",
              file=sys.stderr)
        return 2
    entries = measure_recipes(recipes, gpus)
    from common.io import atomic_write_text

    RECORDS.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(RECORDS, json.dumps(entries, indent=1) + "\n")
    atomic_write_text(DOC, replace_block(DOC.read_text(encoding="utf-8"), block(entries)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
