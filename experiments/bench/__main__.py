"""`python -m experiments.bench`: run the sections, write the JSON and the Markdown table. See
experiments/bench/__init__.py for the sections."""

from __future__ import annotations

import gc
import json
import os
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from common.errors import ArgParser, cli, positive_int
from common.io import atomic_write_json, atomic_write_text, unwritable
from common.paths import results_root
from experiments.train.plan import duration

from .harness import ALL_SECTIONS, REPO, SCHEMA, SIZES, Ctx, Size, machine_info
from .report import render_markdown, targets
from .sections import SECTIONS


def run(size_name: str, sections: list[str], threads: int | None, device: str | None,
        md_path: str | None, command: str, reps: int | None = None,
        warmup: int | None = None) -> dict[str, Any]:
    if threads:
        torch.set_num_threads(threads)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    size = SIZES[size_name]
    if reps is not None or warmup is not None:
        size = Size(**{**asdict(size), "reps": reps if reps is not None else size.reps,
                       "warmup": warmup if warmup is not None else size.warmup})
    ctx = Ctx(size=size, device=dev)
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


def main(argv: list[str] | None = None) -> int:
    return cli("python -m experiments.bench", lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    p = ArgParser(prog="python -m experiments.bench", description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=sorted(SIZES), default=os.environ.get("BENCH_SIZE", "full"))
    p.add_argument("--sections", default=",".join(ALL_SECTIONS),
                   help=f"comma-separated subset of {','.join(ALL_SECTIONS)}")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch threads (default: torch's)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--reps", type=int, default=None, help="timed reps (>= 5)")
    p.add_argument("--warmup", type=int, default=None, help="untimed warm-up reps")
    p.add_argument("--md", default=None, help="Markdown output (default: docs/BENCH.md for "
                                              "--size full, else beside the JSON)")
    a = p.parse_args(argv)
    sections = [s for s in a.sections.split(",") if s]
    bad = [s for s in sections if s not in SECTIONS]
    if bad or not sections:
        p.error(f"--sections {a.sections!r}: unknown section(s) {bad}; allowed: "
                f"{','.join(SECTIONS)}")
    if a.reps is not None and a.reps < 5:
        p.error(f"--reps {a.reps}: every figure is a median of at least 5 reps")
    if a.warmup is not None and a.warmup < 0:
        p.error(f"--warmup {a.warmup}: must be >= 0")
    if a.size not in SIZES:  # argparse does not check a default (BENCH_SIZE) against choices
        p.error(f"--size {a.size!r} (BENCH_SIZE): allowed: {', '.join(sorted(SIZES))}")
    out_dir = results_root() / "bench"
    why = unwritable(out_dir)
    if why is not None:
        p.error(f"results dir {out_dir} cannot be written: {why}")
    if a.md and (why := unwritable(Path(a.md).parent)) is not None:
        p.error(f"--md {a.md} cannot be written: {why}")
    command = "python -m experiments.bench " + " ".join(argv if argv is not None else sys.argv[1:])
    res = run(a.size, sections, a.threads, a.device, a.md, command.strip(), a.reps, a.warmup)
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
