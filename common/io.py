"""Files that are never half-written, hashes, locks, and the one check that a place can be
written before any work starts (`unwritable`).

A write goes to a temporary file in the target's directory, is fsynced, then renamed over the
target, so a reader (or a restart after kill -9) sees the old file or the new one, never half.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO


def _umask() -> int:
    """The process umask, read without changing it where Linux allows (os.umask can only be
    read by setting it, which races with other threads creating files)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> Path:
    """`write(f)` fills a temporary file beside `path`, which is fsynced and renamed over it.
    Readers see the old file or the new one, never half; a failure leaves no temporary behind.

    The file gets the mode `open()` would give it: an existing file's mode is kept, a new file
    gets 0666 minus the umask (mkstemp alone makes 0600, unreadable to a shared group)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def atomic_write_json(path: str | os.PathLike, obj: Any, **kw: Any) -> Path:
    kw.setdefault("indent", 1)
    return atomic_write_text(path, json.dumps(obj, **kw) + "\n")


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


class LockHeld(RuntimeError):
    """Another process holds the lock."""


@contextlib.contextmanager
def flocked(path: str | os.PathLike, *, wait: bool = True) -> Iterator[Path]:
    """Hold an exclusive flock on `path` (created if absent). The kernel drops it when the
    holder dies, so a kill -9 leaves no stale lock. `wait=False` raises LockHeld at once."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise LockHeld(str(path)) from None
        try:
            yield path
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@dataclass(frozen=True)
class Unwritable:
    """Why a path cannot be written: `blocker` (the path, or its nearest existing ancestor) and
    what is wrong with it ("is a file", "is a directory", "is not writable (<strerror>)")."""

    blocker: Path
    reason: str

    def __str__(self) -> str:
        return f"{self.blocker} {self.reason}"


def unwritable(path: str | os.PathLike, *, file: bool = False) -> Unwritable | None:
    """None when `path` is, or can be made, a writable directory (file=True: a file that can be
    written, or created in such a directory); else why not. Creates nothing that stays.

    The test is a real write: a temporary file made and removed in the nearest existing
    directory (an existing file is opened for appending, nothing written). os.access asks about
    permission bits, and root passes those everywhere, /proc and chmod 0555 included."""
    p = Path(path).absolute()
    if file:
        if p.is_dir():
            return Unwritable(p, "is a directory")
        if p.exists():
            try:  # O_NONBLOCK: a FIFO without a reader fails at once instead of blocking
                os.close(os.open(p, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK))
            except OSError as e:
                return Unwritable(p, f"is not writable ({e.strerror})")
        p = p.parent
    probe = p
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        return Unwritable(probe, "is a file")
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as e:
        return Unwritable(probe, f"is not writable ({e.strerror})")
    return None
