"""gaps.csv and verdicts.csv of committed synthetic folders, recomputed from their committed
samples (issue 38 added the intervals to folders made before it; `--names ... --out` writes them
since). Each `DIR/samples/<name>.samples.jsonl.gz` is checked against the sha256 aggregate.json
names; every folder is computed before any file is written.

    python dev/synthetic_intervals.py measured/synthetic/cpu [more dirs] [--n-perm 9999]
"""

import argparse
import gzip
import hashlib
import json
import sys
from pathlib import Path

import pandas as pd

from analysis import synthetic as SY
from common.errors import UsageError, cli


def committed_runs(d: Path) -> dict[str, SY.Run]:
    meta = json.loads((d / "aggregate.json").read_text(encoding="utf-8"))
    out = {}
    for src in meta["sources"]:
        if src.get("status") != "measured":
            continue
        gz = d / "samples" / f"{src['name']}.samples.jsonl.gz"
        if not gz.is_file():
            raise UsageError(f"{gz}: not committed, so the gaps of {src['name']} cannot be "
                             "recomputed here; commit the run's samples.jsonl gzipped there")
        raw = gzip.decompress(gz.read_bytes())
        if hashlib.sha256(raw).hexdigest() != src["sha256"]:
            raise UsageError(f"{gz}: sha256 differs from aggregate.json's for {src['name']}")
        out[src["name"]] = SY.read_run(raw.decode("utf-8").splitlines())
    return out


def body(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python dev/synthetic_intervals.py")
    p.add_argument("dirs", nargs="+", metavar="DIR")
    p.add_argument("--n-perm", type=int, default=SY.N_PERM)
    a = p.parse_args(argv)
    if a.n_perm < 1:
        raise UsageError(f"--n-perm {a.n_perm}: must be >= 1")
    for d in map(Path, a.dirs):
        if not (d / "aggregate.json").is_file():
            raise UsageError(f"{d}: no aggregate.json; give a folder written by --names --out")
    gaps = {d: pd.DataFrame([r for n, run in committed_runs(Path(d)).items()
                             for r in SY.gap_rows(n, run, a.n_perm)], columns=SY.GAP_COLUMNS)
            for d in a.dirs}
    for d, g in gaps.items():
        for f in SY.write_gaps(g, Path(d)).values():
            print(f"wrote {f}")
    return 0


if __name__ == "__main__":
    sys.exit(cli("synthetic_intervals", lambda: body(sys.argv[1:])))
