"""Files that are never half-written (temporary, fsync, rename), hashes, locks (flock, or an
O_EXCL owner file where a file system has no flock), and the one check that a place can be
written before any work starts (`unwritable`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import socket
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO


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


NO_FLOCK_ERRNOS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
"""flock's answers on file systems that do not support it (some NFS and Lustre mounts)."""
LOCK_ENV = "FTBENCH_LOCK"
"""`excl` makes every lock an O_EXCL owner file (for a site whose flock is node-local, so it
would seem to work while excluding nothing across nodes); unset or `flock`: flock, falling back
to the owner file where the file system refuses flock."""


@contextlib.contextmanager
def flocked(path: str | os.PathLike, *, wait: bool = True) -> Iterator[Path]:
    """Hold an exclusive flock on `path` (created if absent). The kernel drops it when the
    holder dies, so a kill -9 leaves no stale lock. `wait=False` raises LockHeld at once.
    Where the file system has no flock (or FTBENCH_LOCK=excl), the lock is `excl_locked` on
    `<path>.owner` instead."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = os.environ.get(LOCK_ENV, "flock")
    if mode not in ("flock", "excl"):
        raise ValueError(f"{LOCK_ENV}={mode!r}: allowed values flock, excl")
    if mode == "excl":
        with excl_locked(owner_path(path), wait=wait):
            yield path
        return
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise LockHeld(str(path)) from None
        except OSError as e:
            if e.errno not in NO_FLOCK_ERRNOS:
                raise
            f.close()
            with excl_locked(owner_path(path), wait=wait):
                yield path
            return
        try:
            yield path
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


EMPTY_OWNER_STALE_S = 30.0
"""An owner file still empty after this long was left by a process that died creating it."""


def owner_path(path: str | os.PathLike) -> Path:
    """The owner file that stands for the flock on `path` where there is no flock."""
    return Path(f"{path}.owner")


def _owner_text() -> str:
    return json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                       "nonce": os.urandom(8).hex()})


def _read_owner(path: Path) -> dict[str, Any] | None:
    """The owner record of a lock file; None when it is gone; {} when it cannot be parsed
    (being written: its creator writes it right after O_EXCL creation)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        rec = json.loads(text)
    except ValueError:
        return {}
    return rec if isinstance(rec, dict) else {}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def lock_stale(rec: dict[str, Any] | None, mtime: float | None,
               stale_after_s: float | None) -> bool:
    """Whether an owner record names a holder that is gone: a dead pid on this host; on another
    host (whose pids cannot be asked) only a file older than `stale_after_s` (None: never)."""
    import time

    if rec is None:
        return False
    if not rec:  # unreadable: its creator died between creating and writing it
        return mtime is not None and time.time() - mtime > EMPTY_OWNER_STALE_S
    if rec.get("host") == socket.gethostname() and isinstance(rec.get("pid"), int):
        return not _pid_alive(rec["pid"])
    if stale_after_s is None or mtime is None:
        return False
    return time.time() - mtime > stale_after_s


@contextlib.contextmanager
def excl_locked(path: str | os.PathLike, *, wait: bool = True, poll_s: float = 0.05,
                stale_after_s: float | None = None) -> Iterator[Path]:
    """An exclusive lock without flock: `path` created with O_CREAT|O_EXCL holding this
    process's host, pid and a nonce; removed on exit. A dead holder's lock (pid gone on this
    host, or older than `stale_after_s` on another) is taken over under a second O_EXCL file
    (`<path>.break`), so two contenders never both take it. `wait=False`: LockHeld at once."""
    import time

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mine = _owner_text()
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            if _break_stale(path, stale_after_s):
                continue
            if not wait:
                rec = _read_owner(path) or {}
                raise LockHeld(f"{path} (held by pid {rec.get('pid', '?')} on "
                               f"{rec.get('host', '?')})") from None
            time.sleep(poll_s)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(mine)
            f.flush()
            os.fsync(f.fileno())
        break
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            if path.read_text() == mine:  # never remove a lock someone else took over
                path.unlink()


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return None


def _break_stale(path: Path, stale_after_s: float | None) -> bool:
    """Remove `path` if its holder is gone; True when it was removed (or vanished)."""
    rec = _read_owner(path)
    if rec is None:
        return True  # released meanwhile
    if not lock_stale(rec, _mtime(path), stale_after_s):
        return False
    brk = Path(f"{path}.break")
    try:
        fd = os.open(brk, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        # another breaker is at work; one that died leaves its file behind: clear it when its
        # pid is gone (a breaker holds it for two reads and an unlink)
        b = _read_owner(brk)
        if b and lock_stale(b, _mtime(brk), stale_after_s):
            brk.unlink(missing_ok=True)
        return False
    try:
        with os.fdopen(fd, "w") as f:
            f.write(_owner_text())
        again = _read_owner(path)
        if again is None:
            return True
        if again == rec:  # the same dead holder: nobody else can have replaced it
            path.unlink(missing_ok=True)
            return True
        return False
    finally:
        brk.unlink(missing_ok=True)


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
