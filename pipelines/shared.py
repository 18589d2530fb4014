"""What the one-command pipelines (`make study`, `make paper`) share: the environment their jobs
run in, the sweep stage through sweeps' front door, the report stage through analysis' entry
point, a small state file beside the sweep, and the fingerprint of the inputs a report reads (so
an unchanged sweep is not re-reported)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from common.errors import UsageError, cli
from common.io import atomic_write_text
from common.paths import RunDir, SweepDir
from sweeps import api

ROOT = Path(__file__).resolve().parents[1]
OFFLINE_ENV = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


@contextlib.contextmanager
def environment(extra: dict[str, str] | None = None) -> Iterator[None]:
    """This process's environment while a stage runs in it, so the jobs it submits (each
    inherits it) run as they did when the stage was a process of its own: `extra`, this
    checkout first on the path, one torch thread unless the user set OMP_NUM_THREADS (the jobs
    run side by side, one per core); put back afterwards."""
    before = dict(os.environ)
    os.environ.update({**(extra or {}), "PYTHONPATH": str(ROOT),
                       "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                       "HYDRA_FULL_ERROR": os.environ.get("HYDRA_FULL_ERROR", "0")})
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)


def cells(name: str) -> list[api.ManifestCell]:
    """The sweep's cells ([] before its first run)."""
    m = api.load(name)
    return list(m.cells) if m is not None else []


def sweep(req: api.SweepRequest, *, dry: bool = False,
          on_event: Callable[[api.Event], None] = api.ignore_event) -> int:
    """The sweep stage in this process, through the front door and the one error path (`cli`),
    printing what `make sweep` prints: the dry run, or the plan's lines and the final status
    table. Its exit status: 0 done (or submitted), 1 a cell or evaluation not done, 2 refused
    before anything ran, 130 interrupted."""

    def body() -> int:
        if dry:
            print(api.dry_run(req), flush=True)
            return 0
        done = api.run(req, log=lambda s: print(s, flush=True), on_event=on_event)
        print(api.table(done.manifest), flush=True)
        return 0 if done.ok else 1

    return cli("sweep", body)


def report(name: str, n_boot: int = 2000) -> bool:
    """The report stage: analysis' entry point in this process; prints the report's path as
    `make report` does, or its one error line. True when written (Ctrl-C goes on up to the
    pipeline's own handler)."""
    from analysis.report import build_report, preflight
    from common.text import one_line

    try:
        preflight(name, None, n_boot)
        path = build_report(name, None, None, n_boot)
    except UsageError as e:
        print(f"report: error: {one_line(e)}", file=sys.stderr, flush=True)
        return False
    print(f"report: {path.resolve()}", flush=True)
    return True


ALLOW_DIRTY_ENV = "FTBENCH_ALLOW_DIRTY"
"""Set to 1 (or pass a pipeline's --allow-dirty) to train from a working tree with uncommitted
changes to tracked source anyway: the runs then record git_dirty (config.yaml provenance) and
the diff's hash is printed and kept in the sweep's dirty.json, so every affected cell is marked."""
SOURCE_EXCLUDE = ("docs",)
"""Tracked paths that are not source: regenerated documents never make a tree dirty."""


def dirty_source_diff() -> str | None:
    """The sha256 (12 hex digits) of `git diff HEAD` over tracked source (docs/ excluded) when
    it is not empty; None for a clean tree (or outside git: nothing to compare with)."""
    import subprocess

    spec = ["--", ".", *(f":(exclude){x}" for x in SOURCE_EXCLUDE)]
    try:
        out = subprocess.run(["git", "diff", "HEAD", "--binary", *spec], cwd=ROOT,
                             capture_output=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return hashlib.sha256(out).hexdigest()[:12] if out.strip() else None


def refuse_dirty(what: str, allow: bool = False, name: str | None = None,
                 run_ids: list[str] | None = None, exit_code: int | None = None) -> str | None:
    """Before training: refuse (UsageError) when tracked source has uncommitted changes. `allow`
    (or FTBENCH_ALLOW_DIRTY=1) trains anyway: the diff's hash is returned, printed and appended
    with `run_ids` to <sweep>/dirty.json. None when clean. `exit_code`: exit with it instead."""
    h = dirty_source_diff()
    if h is None:
        return None
    allow = allow or os.environ.get(ALLOW_DIRTY_ENV, "").strip().lower() in ("1", "true", "yes")
    if not allow:
        msg = (f"{what}: the working tree has uncommitted changes to tracked source (diff "
               f"{h}); commit them first, or pass --allow-dirty ({ALLOW_DIRTY_ENV}=1) to train "
               "anyway with every affected cell marked")
        if exit_code is not None:  # a caller without its own error path
            print(f"{what}: error: {msg}", file=sys.stderr, flush=True)
            raise SystemExit(exit_code)
        raise UsageError(msg)
    print(f"{what}: WARNING: training from uncommitted changes (diff {h}); the cells are "
          "marked", file=sys.stderr, flush=True)
    if name is not None:
        p = SweepDir.of(name).path / "dirty.json"
        try:
            rows = json.loads(p.read_text(encoding="utf-8")) if p.is_file() else []
        except json.JSONDecodeError:
            rows = []
        rows.append({"diff_sha256": h, "run_ids": sorted(run_ids or [])})
        atomic_write_text(p, json.dumps(rows, indent=1) + "\n")
    return h


def _state_path(name: str, file: str) -> Path:
    return SweepDir.of(name).path / file


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
    m = api.load(name)
    cs = list(m.cells) if m is not None else []
    h.update(json.dumps([(c.run_id, c.state, c.eval.state if c.eval is not None else None)
                         for c in cs]).encode())
    for c in cs:
        rd = RunDir.of(str(c.run_id))
        for p in sorted([rd.metrics_path, *rd.eval_files("*.json")] if rd.exists() else []):
            if p.is_file():
                st = p.stat()
                h.update(f"{p.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    h.update(str(m is not None).encode())
    return h.hexdigest()[:16]
