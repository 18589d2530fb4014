"""What every result file records about where it came from: git state, package versions, and the
machine's load and memory (a wall time means something only at a known load)."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def git_state(*, untracked: bool = True) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the checkout the code runs from; (None, None) outside git.
    `untracked=False`: only changes to tracked files make it dirty."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                                text=True, timeout=10).stdout.strip() or None
        flags = [] if untracked else ["--untracked-files=no"]
        dirty = bool(subprocess.run(["git", "status", "--porcelain", *flags], cwd=REPO,
                                    capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return None, None
    return commit, (dirty if commit else None)


def git_commit() -> str | None:
    return git_state()[0]


def versions(*packages: str) -> dict[str, str | None]:
    """Python's version and each named distribution's (None when not installed)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for pkg in packages:
        out[pkg] = None
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[pkg] = metadata.version(pkg.replace("_", "-"))
    return out


def loadavg() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, rounded; None where the platform has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def peak_rss_mb() -> float | None:
    """This process's peak resident memory so far (MB; None without /proc): VmHWM, not
    ru_maxrss, which Linux carries across fork + exec from a large parent."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None
