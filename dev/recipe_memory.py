"""The paper recipes' measured memory per phase and GPU type: measured/memory/recipes.json (the
micro-batch sweeps/recipe.py trains with) and docs/RECIPES.md's generated block.

    python -m dev.recipe_memory [--gpus H100-80GB,...] [--recipes paper-1.5B,...]
        measures (experiments/memory.py, fake tensors, cached under paths.cache/memory), writes
        measured/memory/recipes.json (the records) and the block of docs/RECIPES.md between its
        markers from them; run it again when tests/test_recipe_memory.py says a recipe changed
    python -m dev.recipe_memory --check
        exit 1 when the block is not what `block` writes from measured/memory/recipes.json

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
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "RECIPES.md"
RECORDS = ROOT / "measured" / "memory" / "recipes.json"
BEGIN = "<!-- memory:begin (python -m dev.recipe_memory; do not edit by hand) -->"
END = "<!-- memory:end -->"
PAPER_RECIPES = ("paper-1.5B", "paper-8B", "paper-8B-1T")
DEFAULT_GPUS = ("H100-80GB",)


def measure_recipes(recipes: Sequence[str], gpus: Sequence[str]) -> list[dict[str, Any]]:
    """One entry per (recipe, GPU type): `experiments.memory.fit` from the whole per-GPU batch
    down (the largest micro-batch whose measured training, validation and save peaks fit
    USABLE_FRACTION of the GPU, then each with activation checkpointing), with every try and
    the measured phases of the choice; the parallelism is the auto rule on the state
    (DDP_BYTES_PER_PARAM of the costliest arm)."""
    from experiments.memory import fit
    from experiments.train.parallel import DDP_BYTES_PER_PARAM, FIT_FRACTION
    from experiments.train.plan import plan
    from sweeps.recipe import GPU_TYPES, MicroBatch, load

    out = []
    for name in recipes:
        rec = load(name)
        per_gpu = rec.train.batch_size // rec.train.gpus
        for gpu in gpus:
            mb = MicroBatch(gpu, GPU_TYPES[gpu], "ddp", per_gpu, 1, False, 0.0)
            params = plan(rec.cell_config(mb), rec.train.gpus).params["total"]
            par = "none" if rec.train.gpus == 1 else (
                "fsdp" if DDP_BYTES_PER_PARAM * params > FIT_FRACTION * mb.memory_gb * 1e9
                else "ddp")
            cfg = rec.cell_config(replace(mb, parallel=par))
            f = fit(cfg, world=rec.train.gpus, cache=Path(cfg.paths.cache))
            print(f"recipe_memory: {name} {gpu}: {f.line()}", file=sys.stderr, flush=True)
            entry: dict[str, Any] = {
                "recipe": name, "gpu": gpu, "memory_gb": GPU_TYPES[gpu],
                "recipe_key": rec.memory_key(), "basis": "measured",
                "fits": f.micro_batch_size is not None,
                "tries": [{"micro_batch_size": m, "activation_checkpointing": ck,
                           "measured_gb": b / 1e9} for m, ck, b in f.tries]}
            if f.micro_batch_size is not None:
                entry.update(parallel=f.records[0].parallel, micro_batch_size=f.micro_batch_size,
                             grad_accum=f.records[0].grad_accum,
                             activation_checkpointing=f.activation_checkpointing,
                             measured_gb=f.tries[-1][2] / 1e9,
                             phases=[r.to_json() for r in f.records])
            out.append(entry)
    return out


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
    ap.add_argument("--recipes", default=",".join(PAPER_RECIPES))
    ap.add_argument("--gpus", default=",".join(DEFAULT_GPUS))
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args(argv)
    if a.check:
        entries = json.loads(RECORDS.read_text(encoding="utf-8"))
        if block(entries) not in DOC.read_text(encoding="utf-8"):
            print(f"{DOC}: the memory block is out of date: python -m dev.recipe_memory",
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
    new = measure_recipes(recipes, gpus)
    done = {(e["recipe"], e["gpu"]) for e in new}  # the other records stay as they are
    entries = [e for e in json.loads(RECORDS.read_text(encoding="utf-8"))
               if (e["recipe"], e["gpu"]) not in done] + new
    from common.io import atomic_write_text

    RECORDS.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(RECORDS, json.dumps(entries, indent=1) + "\n")
    atomic_write_text(DOC, replace_block(DOC.read_text(encoding="utf-8"), block(entries)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
