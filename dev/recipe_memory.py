"""docs/RECIPES.md's generated block: the paper recipes' measured memory per phase and GPU type,
from measured/memory/recipes.json (which `python -m sweeps.recipe measure <recipe> --gpus ...`
writes; run it again when tests/test_recipe_memory.py says a recipe changed).

    python -m dev.recipe_memory            writes the block between its markers
    python -m dev.recipe_memory --check    exit 1 when the block is not what `block` writes

Each figure is the per-GPU peak of one phase of the recipe's costliest cell (the Free
Transformer at the grid's largest H) at the recipe's micro-batch for that GPU type
(`Recipe.micro_batches`, `training_overrides(gpu=...)`), on rank 0 of the recipe's planned world
(the config: sweeps.recipe.Recipe.cell_config).
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
RECORDS = ROOT / "measured" / "memory" / "recipes.json"
BEGIN = "<!-- memory:begin (python -m dev.recipe_memory; do not edit by hand) -->"
END = "<!-- memory:end -->"


def block(entries: Sequence[dict[str, Any]]) -> str:
    """The markdown block (between the markers) from the records."""
    rows = [BEGIN, "",
            "| recipe | GPU | parallel x world | micro-batch (measured) | train | validation | "
            "eval | save | host at save |", "|---|---|---|---|---|---|---|---|---|"]
    for e in entries:
        if not e.get("fits", True):
            tried = "; ".join(
                f"{t['micro_batch_size']}{' ckpt' if t['activation_checkpointing'] else ''}: "
                f"{t['measured_gb']:.1f} GB" for t in e.get("tries", []))
            rows.append(f"| {e['recipe']} | {e['gpu']} | {e.get('parallel', '-')} | does not "
                        f"fit ({tried}) | - | - | - | - | - |")
            continue
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
                    f"{cell('eval')} | {cell('save')} | {host} |")
    gpus = sorted({e["gpu"] for e in entries})
    rows += ["", f"Measured per GPU (rank 0; percentages of the GPU's memory) on fake tensors by "
             "`experiments/memory.py` (torch's MemTracker / FSDPMemTracker under a fake process "
             "group of the recipe's world), for the H=16 Free Transformer at the largest "
             "micro-batch whose measured train, validation and save peaks fit 90% of the GPU, "
             "tried from the whole per-GPU batch down (`Recipe.micro_batches` trains with it); "
             "GPU types "
             f"measured: {', '.join(gpus)}. Train: a step of 3 micro-batches (the peak does not "
             "grow after the second) with AdamW's state allocated; validation: one batch of "
             "logging.val_batch_size rows; eval: one loglikelihood batch of 16 continuations at "
             "the trained window, fp32 weights, one whole model per GPU (the evaluator's batch, "
             "not the micro-batch's: over 100% it does not fit, and the evaluation needs a "
             "smaller --batch-size or a larger GPU); save: the DCP staging "
             "and the weights-only export (host at save: what rank 0 adds in host memory). Not "
             "tracked: the CUDA context and NCCL buffers (about 1-3 GB), the allocator's "
             "fragmentation, kernels' workspaces: `make gpu-check` measures them on a GPU. "
             "Records: measured/memory/recipes.json.", "", END]
    return "\n".join(rows)


def replace_block(doc: str, new: str) -> str:
    if BEGIN in doc and END in doc:
        head, rest = doc.split(BEGIN, 1)
        return head + new + rest.split(END, 1)[1]
    anchor = "## Keys the recipes need that the trainer does not have"
    section = "## Measured memory per phase\n\n" + new + "\n\n"
    return doc.replace(anchor, section + anchor, 1) if anchor in doc else doc + "\n" + section


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dev.recipe_memory", description=__doc__)
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args(argv)
    entries = json.loads(RECORDS.read_text(encoding="utf-8"))
    if a.check:
        if block(entries) not in DOC.read_text(encoding="utf-8"):
            print(f"{DOC}: the memory block is out of date: python -m dev.recipe_memory",
                  file=sys.stderr)
            return 1
        return 0
    from common.io import atomic_write_text

    atomic_write_text(DOC, replace_block(DOC.read_text(encoding="utf-8"), block(entries)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
