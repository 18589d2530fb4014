"""What the one-command pipelines (`make study`, `make paper`) share: the environment of the
commands they run, a sweep's manifest, a small state file beside it, and the fingerprint of the
inputs a report reads (so an unchanged sweep is not re-reported)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from common.io import atomic_write_text
from common.paths import results_root, runs_dir, sweeps_dir

ROOT = Path(__file__).resolve().parents[1]
OFFLINE_ENV = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


def env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The commands' environment: this checkout first on the path, one torch thread unless the
    user set OMP_NUM_THREADS (the jobs run side by side, one per core)."""
    return {**os.environ, **(extra or {}), "PYTHONPATH": str(ROOT),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}


def read_manifest(name: str) -> dict:
    """The sweep's manifest ({'cells': []} before it exists)."""
    p = sweeps_dir(results_root()) / name / "manifest.json"
    return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else {"cells": []}


def _state_path(name: str, file: str) -> Path:
    return sweeps_dir(results_root()) / name / file


def load_state(name: str, file: str) -> dict:
    p = _state_path(name, file)
    try:
        return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else {}
    except json.JSONDecodeError:
        return {}  # a torn state file only costs redoing cheap checks


def save_state(name: str, file: str, state: dict) -> None:
    atomic_write_text(_state_path(name, file), json.dumps(state, indent=1, sort_keys=True) + "\n")


def inputs_fingerprint(name: str) -> str:
    """A hash of what the report reads: the manifest's cells and every run's eval/metrics files
    (name, size, mtime)."""
    h = hashlib.sha256()
    m = sweeps_dir(results_root()) / name / "manifest.json"
    cells = read_manifest(name)["cells"]
    h.update(json.dumps([(c.get("run_id"), c.get("state"), (c.get("eval") or {}).get("state"))
                         for c in cells]).encode())
    for c in cells:
        d = runs_dir(results_root()) / str(c.get("run_id"))
        for p in sorted([d / "metrics.jsonl", *sorted((d / "eval").glob("*.json"))]
                        if d.is_dir() else []):
            if p.is_file():
                st = p.stat()
                h.update(f"{p.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    h.update(str(m.is_file()).encode())
    return h.hexdigest()[:16]
