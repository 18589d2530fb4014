"""What every result file records about where it came from: git state and package versions."""

from __future__ import annotations

import contextlib
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
