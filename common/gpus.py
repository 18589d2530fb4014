"""No silent CPU (issue 45): whether this host has NVIDIA GPUs that torch should use, and the one
line when torch cannot use them; the one rule of `make setup` (mk/venv.py), training,
evaluation, the synthetic experiment and gpu-check. Standard library only (torch is imported by
`torch_sees_none` alone), so mk/venv.py runs it before the venv exists.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

HIDDEN = ("", "-1", "NoDevFiles")
"""CUDA_VISIBLE_DEVICES values that hide the GPUs on purpose (NoDevFiles: SLURM's word)."""
# SLURM's GPU variables: indices (0 is a GPU) and counts (0, or type:0, is none)
SLURM_GPU_INDICES = ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS")
SLURM_GPU_COUNTS = ("SLURM_GPUS_ON_NODE", "SLURM_GPUS", "SLURM_GPUS_PER_NODE",
                    "SLURM_GPUS_PER_TASK")


def _nvidia_smi(*args: str) -> str:
    try:
        return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=60,
                              check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def gpus_expected() -> str | None:
    """Why this host should have GPUs for torch (None: it should not): nvidia-smi lists some, or
    CUDA_VISIBLE_DEVICES / SLURM's GPU variables name some. CUDA_VISIBLE_DEVICES set empty (or
    -1) hides them on purpose."""
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        return None if cvd.strip() in HIDDEN else f"CUDA_VISIBLE_DEVICES={cvd}"
    for v in (*SLURM_GPU_INDICES, *SLURM_GPU_COUNTS):
        val = os.environ.get(v, "").strip()
        if val and not (v in SLURM_GPU_COUNTS and val.rpartition(":")[2] == "0"):
            return f"{v}={val}"
    if shutil.which("nvidia-smi"):
        gpus = [ln for ln in _nvidia_smi("-L").splitlines() if ln.startswith("GPU ")]
        if gpus:
            return f"nvidia-smi lists {len(gpus)} GPU{'s' if len(gpus) > 1 else ''}"
    return None


def driver() -> str:
    """The NVIDIA driver's version and the newest CUDA it supports, as nvidia-smi prints them."""
    head = _nvidia_smi() if shutil.which("nvidia-smi") else ""
    ver = re.search(r"Driver Version:\s*(\S+)", head)
    cuda = re.search(r"CUDA Version:\s*(\S+)", head)
    if ver:
        return f"driver {ver.group(1)}" + (f", CUDA <= {cuda.group(1)}" if cuda else "")
    proc = Path("/proc/driver/nvidia/version")
    m = re.search(r"Kernel Module\s+(\S+)", proc.read_text()) if proc.is_file() else None
    return f"driver {m.group(1)}" if m else "no NVIDIA driver found"


def torch_sees_none(why: str, drv: str) -> str | None:
    """Inside the interpreter that will run: None when torch sees a GPU, else 'GPUs are visible
    (<why>; <driver>) but torch <version> (<its CUDA build>) sees none'."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own warning says the same at length
        import torch

        if torch.cuda.is_available() and torch.cuda.device_count():
            return None
    build = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    return f"GPUs are visible ({why}; {drv}) but torch {torch.__version__} ({build}) sees none"


def no_silent_cpu(fix: str) -> None:
    """UsageError (one line ending with `fix`) when GPUs are visible and torch cannot use them,
    so the caller would run on the CPU without a word; nothing when torch sees a GPU (cheap:
    nvidia-smi is not run) or the host has none."""
    import torch

    from common.errors import UsageError

    if torch.cuda.is_available() or (why := gpus_expected()) is None:
        return
    if (line := torch_sees_none(why, driver())) is not None:
        raise UsageError(f"{line}; {fix}")
