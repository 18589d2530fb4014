"""`python -m experiments.bench`: run the sections, write the JSON and the Markdown table, or
merge earlier runs (`--combine`). See experiments/bench/__init__.py for the sections."""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn

import torch

from common.io import atomic_write_json, atomic_write_text, unwritable
from common.paths import results_root
from experiments.train.plan import duration

from .harness import ALL_SECTIONS, REPO, SCHEMA, SIZES, Ctx, Size, gpu_peak_flops, machine_info
from .report import render_markdown, targets
from .sections import SECTIONS


def run(size_name: str, sections: list[str], threads: int | None, device: str | None,
        gpu_peak_tflops: float | None, md_path: str | None, command: str,
        reps: int | None = None, warmup: int | None = None) -> dict[str, Any]:
    if threads:
        torch.set_num_threads(threads)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    size = SIZES[size_name]
    if reps is not None or warmup is not None:
        size = Size(**{**asdict(size), "reps": reps if reps is not None else size.reps,
                       "warmup": warmup if warmup is not None else size.warmup})
    if size.reps < 5:
        raise ValueError(f"reps={size.reps}: every figure is a median of at least 5 reps")
    ctx = Ctx(size=size, device=dev, gpu_peak=gpu_peak_flops(dev, gpu_peak_tflops))
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out_dir = results_root() / "bench"
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{stamp}.json"
    res: dict[str, Any] = {
        "schema": SCHEMA, "created": created, "command": command,
        "json_path": str(json_path), "machine": machine_info(dev),
        "settings": {**asdict(size), "size": size_name, "sections": sections},
        "sections": {}, "errors": {}, "section_wall_s": {}, "notes": ctx.notes,
    }
    md = Path(md_path) if md_path else (REPO / "docs" / "BENCH.md" if size_name == "full"
                                        else json_path.with_suffix(".md"))
    res["markdown_path"] = str(md)
    res["section_cpu_s"] = {}
    before = _earlier_section_times(out_dir, size_name, json_path, sections)
    for i, name in enumerate(sections):
        t0, c0 = time.perf_counter(), time.process_time()
        print(f"[bench] {i + 1}/{len(sections)} {name} ...{_eta(before, sections[i:])}",
              file=sys.stderr, flush=True)
        try:
            res["sections"][name] = SECTIONS[name](ctx)
        except Exception:  # noqa: BLE001 - one broken section must not lose the others
            res["errors"][name] = traceback.format_exc()
            print(res["errors"][name], file=sys.stderr)
        res["section_wall_s"][name] = time.perf_counter() - t0
        print(f"[bench] {name} took {res['section_wall_s'][name]:.0f} s", file=sys.stderr,
              flush=True)
        res["section_cpu_s"][name] = time.process_time() - c0
        gc.collect()
        _write(res, json_path, md)  # after every section: a long run keeps what it measured
    res["machine"]["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    _write(res, json_path, md)
    print(f"[bench] wrote {json_path} and {md}", file=sys.stderr)
    return res


def _earlier_section_times(out_dir: Path, size_name: str, skip: Path,
                           wanted: list[str]) -> dict[str, float]:
    """Each wanted section's wall time in the newest earlier run of this size that timed it
    without error (the ETA's basis). Reads newest first and stops once every one is found."""
    times: dict[str, float] = {}
    for path in sorted(out_dir.glob("*.json"), reverse=True):
        if set(wanted) <= set(times):
            break
        if path == skip:
            continue
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict) or doc.get("settings", {}).get("size") != size_name:
            continue
        for name, wall in (doc.get("section_wall_s") or {}).items():
            if (name in wanted and name not in (doc.get("errors") or {})
                    and isinstance(wall, int | float)):
                times.setdefault(name, float(wall))
    return times


def _eta(before: dict[str, float], remaining: list[str]) -> str:
    """' (about <time> left, by earlier runs)' when every remaining section was timed before;
    nothing rather than a partial sum."""
    if not remaining or any(n not in before for n in remaining):
        return ""
    return f" (about {duration(sum(before[n] for n in remaining))} left, by earlier runs)"


# Measurements run by hand (the real training loop, the full evaluation) sit below this line in
# the Markdown; a regenerated table keeps them.
HAND_RUN_MARKER = "<!-- hand-run measurements below: kept when the bench rewrites this file -->"


def _write(res: dict[str, Any], json_path: Path, md: Path) -> None:
    res["targets"] = targets(res)
    atomic_write_json(json_path, res)
    tail = ""
    if md.is_file():
        old = md.read_text()
        if HAND_RUN_MARKER in old:
            tail = "\n" + old[old.index(HAND_RUN_MARKER):]
    atomic_write_text(md, render_markdown(res) + tail)


def combine(paths: list[str], md_path: str | None) -> dict[str, Any]:
    """Merge the sections of several runs (later files win) into one JSON + Markdown.

    For a long run finished in pieces: each section keeps the file, machine state and command
    it came from in ``section_sources``, so no figure loses its provenance.
    """
    runs = [json.loads(Path(p).read_text()) for p in paths]
    for r, p in zip(runs, paths, strict=True):
        if r.get("schema") != SCHEMA:
            raise ValueError(f"{p}: schema {r.get('schema')!r}, expected {SCHEMA!r}")
    sizes = {r["settings"]["size"] for r in runs}
    if len(sizes) > 1:
        raise ValueError(f"cannot combine runs of different sizes: {sorted(sizes)}")
    res = json.loads(json.dumps(runs[-1]))
    res["sections"], res["errors"], res["section_sources"] = {}, {}, {}
    for r, p in zip(runs, paths, strict=True):
        for name, sec in r["sections"].items():
            res["sections"][name] = sec
            res["errors"].pop(name, None)
            res["section_sources"][name] = {
                "json": p, "command": r["command"], "created": r["created"],
                "loadavg_start": r["machine"].get("loadavg_start"),
                "loadavg_end": r["machine"].get("loadavg_end"),
                "threads": r["machine"]["threads"], "reps": r["settings"]["reps"],
                "wall_s": r.get("section_wall_s", {}).get(name)}
        for name, err in r.get("errors", {}).items():
            if name not in res["sections"]:
                res["errors"][name] = err
    res["combined_from"] = list(paths)
    res["sections"] = {k: res["sections"][k] for k in ALL_SECTIONS if k in res["sections"]}
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    json_path = results_root() / "bench" / f"{stamp}.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    res["json_path"] = str(json_path)
    res["command"] = "python -m experiments.bench --combine " + " ".join(paths)
    md = Path(md_path) if md_path else REPO / "docs" / "BENCH.md"
    res["markdown_path"] = str(md)
    _write(res, json_path, md)
    print(f"[bench] wrote {json_path} and {md}", file=sys.stderr)
    return res


class _Parser(argparse.ArgumentParser):
    """Bad input: one line on stderr and exit 2 (argparse's usage block would make it many)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    p = _Parser(prog="python -m experiments.bench", description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=sorted(SIZES), default=os.environ.get("BENCH_SIZE", "full"))
    p.add_argument("--sections", default=",".join(ALL_SECTIONS),
                   help=f"comma-separated subset of {','.join(ALL_SECTIONS)}")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--gpu-peak-tflops", type=float, default=None,
                   help="GPU peak for MFU when the device name is not in the built-in table")
    p.add_argument("--reps", type=int, default=None, help="timed reps (>= 5)")
    p.add_argument("--warmup", type=int, default=None, help="untimed warm-up reps")
    p.add_argument("--md", default=None, help="Markdown output (default: docs/BENCH.md for "
                                              "--size full, else beside the JSON)")
    p.add_argument("--combine", nargs="+", default=None, metavar="JSON",
                   help="merge the sections of earlier runs (later files win) and render")
    a = p.parse_args(argv)
    if a.combine:
        combine(a.combine, a.md)
        return 0
    sections = [s for s in a.sections.split(",") if s]
    bad = [s for s in sections if s not in SECTIONS]
    if bad or not sections:
        p.error(f"--sections {a.sections!r}: unknown section(s) {bad}; allowed: "
                f"{','.join(SECTIONS)}")
    if a.reps is not None and a.reps < 5:
        p.error(f"--reps {a.reps}: every figure is a median of at least 5 reps")
    if a.warmup is not None and a.warmup < 0:
        p.error(f"--warmup {a.warmup}: must be >= 0")
    if a.threads is not None and a.threads < 1:
        p.error(f"--threads {a.threads}: must be >= 1")
    if a.size not in SIZES:  # argparse does not check a default (BENCH_SIZE) against choices
        p.error(f"--size {a.size!r} (BENCH_SIZE): allowed: {', '.join(sorted(SIZES))}")
    out_dir = results_root() / "bench"
    why = unwritable(out_dir)
    if why is not None:
        p.error(f"results dir {out_dir} cannot be written: {why}")
    if a.md and (why := unwritable(Path(a.md).parent)) is not None:
        p.error(f"--md {a.md} cannot be written: {why}")
    command = "python -m experiments.bench " + " ".join(argv if argv is not None else sys.argv[1:])
    res = run(a.size, sections, a.threads, a.device, a.gpu_peak_tflops, a.md, command.strip(),
              a.reps, a.warmup)
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
