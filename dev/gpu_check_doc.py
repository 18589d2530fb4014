"""docs/gpu_check/README.md, the table of the `make gpu-check RECIPE=..` measurements committed
under measured/gpu_check/ (which the dry runs' MFU reads: experiments.train.plan.planned_mfu).
Run it after committing a measurement; tests/test_gpu_check_recipe.py fails while the table is
out of date.

    python -m dev.gpu_check_doc
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from analysis.render import DASH, fmt, md, num
from common import paths
from common.io import atomic_write_text
from experiments.train.plan import recipe_checks

DOC = Path(__file__).resolve().parents[1] / "docs" / "gpu_check" / "README.md"


def measurements_doc(folder: Path | None = None) -> str:
    """One row per recipe measurement in `folder` (measured/gpu_check/), oldest first; what a
    file does not hold is a dash, never 0."""
    rows = []
    for path, d in recipe_checks([folder or paths.MEASURED / paths.GPU_CHECK]):
        ph = {r["phase"]: r.get("measured_over_plan") for r in d.get("phases", [])}
        sl = d.get("layer_sliced")
        s = {k: DASH if d.get(k) is None else str(d[k]) for k in (
            "created", "recipe", "n_gpus", "gpu", "torch", "micro_batch_size", "grad_accum",
            "seq_len", "steps", "resume")}
        rows.append([path.name, s["created"], s["recipe"], s["n_gpus"], s["gpu"], s["torch"],
                     f"{s['micro_batch_size']} x {s['grad_accum']} x {s['seq_len']}",
                     f"{sl['layers']} of {sl['of']}" if sl else "all", s["steps"],
                     fmt(d.get("tokens_per_s"), ",.0f"), fmt(d.get("mfu"), ".1%"),
                     *(fmt(ph.get(k), ".2f") for k in ("train", "validation", "eval", "save")),
                     fmt(num(d.get("cuda_outside_torch_bytes")) / 1e9, ".2f"),
                     s["resume"], "yes" if d.get("passed") else "**no**"])
    cols = ["file", "created", "recipe", "GPUs", "GPU", "torch", "micro-batch x accum x tokens",
            "layers", "steps", "tokens/s", "MFU", "train", "validation", "eval", "save",
            "outside torch GB", "resume", "passed"]
    return "\n".join([
        "# `make gpu-check RECIPE=..` measurements", "",
        "Generated from measured/gpu_check/ by `python -m dev.gpu_check_doc` (run it after "
        "committing a recipe check on a GPU). The dry runs plan at the newest passed MFU on the "
        "planned GPU at the planned preset (experiments.train.plan.planned_mfu). Peaks: the CUDA "
        "allocator's (allocated) over the fake-tensor plan's (experiments/memory.py), per phase.",
        "", md(pd.DataFrame(rows, columns=cols))]) + "\n"


if __name__ == "__main__":
    atomic_write_text(DOC, measurements_doc())
    print(f"wrote {DOC}")
    sys.exit(0)
