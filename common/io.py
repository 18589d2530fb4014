"""Files that are never half-written (temporary, fsync, rename), hashes, the one lock (flock),
and the one check that a place can be written before any work starts (`unwritable`).
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

from common.errors import UsageError


def umask() -> int:
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
    """`write(f)` fills a temporary file beside `path`, fsynced and renamed over it (no
    temporary left on failure); the file gets the mode `open()` would give it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o666 & ~umask()
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


def read_yaml_mapping(path: str | os.PathLike, error: type[Exception],
                      what: str = "settings") -> dict[str, Any]:
    """A YAML file whose top level is a mapping (an empty file is {}); else `error`, one line
    naming the file. The one reader of the suite's own config files (cluster, data configs)."""
    import yaml

    from common.text import one_line

    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as e:
        raise error(f"{path}: not valid YAML ({one_line(str(e))[:200]})") from None
    if not isinstance(raw, dict):
        raise error(f"{path}: expected a mapping of {what}")
    return raw


class LockHeld(RuntimeError):
    """Another process holds the lock."""


@contextlib.contextmanager
def flocked(path: str | os.PathLike, *, wait: bool = True) -> Iterator[Path]:
    """Hold an exclusive flock on `path` (created if absent): the suite's one lock. The kernel
    drops it when the holder dies, so a kill -9 leaves no stale lock. `wait=False` raises
    LockHeld at once. A file system that refuses flock (some NFS and Lustre mounts) is a
    UsageError naming the path: the results must live where locks work."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise LockHeld(str(path)) from None
        except OSError as e:
            raise UsageError(f"{path}: this file system refuses flock ({e.strerror}); put the "
                             "results on one that supports it") from None
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
    """None when `path` is, or can be made, a writable directory (file=True: a writable or
    creatable file); else why not. A real write test that leaves nothing (os.access asks about
    permission bits, which root passes everywhere)."""
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
