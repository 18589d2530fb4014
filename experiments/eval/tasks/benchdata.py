"""Offline benchmark data: where it is (`BENCH_DATA=`, `--data`, else $FTBENCH_DATA; else the
stock datasets load online) and whether it is the bytes the directory pins (docs/BENCHMARKS.md,
"Checksums"). MMLU's validation copies are pinned under their own key (`mmlu_validation`), so
the `mmlu` task's checksums and spec ids do not depend on them. `verify()` names every missing
or altered file in one line.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from common import benchmarks
from common.errors import UsageError
from common.io import sha256_file

ENV_VAR = "FTBENCH_DATA"

# tasks whose needed files are every line of one sums file (MMLU's csvs; data pinned under a
# key of its own, such as MMLU's validation copies)
TASK_SUMS = {**{b.task: b.offline_sums for b in benchmarks.BENCHMARKS
                if b.task and b.offline_sums}, **benchmarks.EXTRA_DATA}
# sha256sum files -> the prefix that makes their paths relative to the data dir: a task's own
# sums file lists paths relative to its folder; the top-level one and the extra data's list
# paths relative to the data dir
SUMS = {"SHA256SUMS": "",
        **{f: f.rpartition("/")[0] + "/" for b in benchmarks.BENCHMARKS
           if b.task and (f := b.offline_sums)},
        **dict.fromkeys(benchmarks.EXTRA_DATA.values(), "")}
_ROW = re.compile(r"^\|\s*([^|]+?)\s*\|.*?`([0-9a-f]{64})`")



@dataclass
class DataCheck:
    root: Path
    checksums: dict[str, str] = field(default_factory=dict)  # rel path -> sha256 (verified)
    missing: list[str] = field(default_factory=list)
    altered: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.missing and not self.altered

    def line(self) -> str:
        """One line naming what is wrong (or that all is well)."""
        if self.ok:
            return f"benchmark data {self.root}: {len(self.checksums)} files verified"
        parts = []
        if self.missing:
            parts.append("missing: " + ", ".join(self.missing))
        if self.altered:
            parts.append("altered (sha256 differs): " + ", ".join(self.altered))
        return f"benchmark data {self.root}: " + "; ".join(parts)


def data_dir(explicit: str | os.PathLike | None = None) -> Path | None:
    """The offline data directory: the argument, else $FTBENCH_DATA, else None (online)."""
    d = explicit or os.environ.get(ENV_VAR) or None
    return Path(d).resolve() if d else None


def _sums_file(root: Path, sums_rel: str) -> dict[str, str]:
    """rel path (to root) -> sha256 from one `sha256sum` file ({} if it is absent)."""
    sums = root / sums_rel
    pins: dict[str, str] = {}
    if sums.is_file():
        for line in sums.read_text(encoding="utf-8").splitlines():
            if line.strip():
                digest, rel = line.split(maxsplit=1)
                pins[SUMS[sums_rel] + rel.strip().lstrip("*")] = digest
    return pins


def pinned_checksums(root: Path) -> dict[str, str]:
    """rel path -> sha256 from README.md's table and the SHA256SUMS files."""
    pins: dict[str, str] = {}
    readme = root / "README.md"
    if readme.is_file():
        for line in readme.read_text(encoding="utf-8").splitlines():
            m = _ROW.match(line)
            if m and " " not in m.group(1) and not m.group(1).endswith("/"):
                pins[m.group(1)] = m.group(2)
    for sums_rel in SUMS:
        pins.update(_sums_file(root, sums_rel))
    return pins


def needed_files(root: Path, tasks: list[str]) -> list[str]:
    """The files (relative to root) the tasks read: each row's `offline` files, or every line
    of its sums file (an absent sums file is itself the missing file)."""
    out: list[str] = []
    for t in tasks:
        row = benchmarks.find(t)  # <task>_gold_bpb reads its task's files
        t = row.task if row is not None and row.task else t
        if t in TASK_SUMS:
            pins = _sums_file(root, TASK_SUMS[t])
            # an absent checksum file is itself the missing file
            out += sorted(pins) if pins else [TASK_SUMS[t]]
        elif row is not None:
            out += list(row.offline)
    return list(dict.fromkeys(out))


def verify(root: str | os.PathLike, tasks: list[str]) -> DataCheck:
    """Check that every file the tasks need exists and matches its pinned sha256."""
    root = Path(root).resolve()
    pins = pinned_checksums(root)
    chk = DataCheck(root=root)
    if not root.is_dir():
        chk.missing.append(str(root))
        return chk
    for rel in needed_files(root, tasks):
        p = root / rel
        if not p.is_file():
            chk.missing.append(rel)
            continue
        digest = sha256_file(p)
        if rel not in pins:
            chk.altered.append(f"{rel} (no pinned checksum)")
        elif digest != pins[rel]:
            chk.altered.append(rel)
        else:
            chk.checksums[rel] = digest
    return chk


def require(root: str | os.PathLike, tasks: list[str]) -> DataCheck:
    """verify() or raise UsageError with the one-line summary."""
    chk = verify(root, tasks)
    if not chk.ok:
        raise UsageError(chk.line())
    return chk
