"""Site differences: the lock that works without flock (two processes contend, one wins; a dead
holder's lock is taken over; a live one on another host is not), flock's fallback, and the GPU
binding of a process that sees one GPU or all of its node's."""

from __future__ import annotations

import errno
import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common import io as cio
from common.errors import UsageError
from experiments.train.trainer import device_index


def _contend(path: str, hold_s: float, out: str, start: float) -> None:
    while time.time() < start:  # both processes reach O_EXCL at the same moment
        pass
    try:
        with cio.excl_locked(path, wait=False):
            Path(out).write_text("won")
            time.sleep(hold_s)
    except cio.LockHeld as e:
        Path(out).write_text(f"held: {e}")


@pytest.mark.slow  # multi-process or end to end: the CI tier (make test-all)
@pytest.mark.parametrize("dead_holder", [False, True])
def test_two_processes_contend_and_exactly_one_wins(tmp_path, dead_holder):
    """Two processes reach O_EXCL at once, on a free lock or on a dead holder's: one wins."""
    lock = tmp_path / "run.lock"
    if dead_holder:
        lock.write_text(json.dumps({"host": socket.gethostname(), "pid": _dead_pid(),
                                    "nonce": "d"}))
    start = time.time() + 0.5
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_contend, args=(str(lock), 1.5, str(tmp_path / f"o{i}"), start))
             for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    outs = sorted((tmp_path / f"o{i}").read_text() for i in range(2))
    assert outs[1] == "won" and outs[0].startswith("held:"), outs
    assert "held by pid" in outs[0]
    assert not lock.exists()  # the winner removed it on exit


def test_waiting_contender_gets_the_lock_after_release(tmp_path):
    lock = tmp_path / "l"
    with cio.excl_locked(lock):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
        with pytest.raises(cio.LockHeld):
            with cio.excl_locked(lock, wait=False):
                pass
    with cio.excl_locked(lock, wait=False):  # released: free again
        pass


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_the_stale_lock_of_a_dead_pid_is_taken_over(tmp_path):
    lock = tmp_path / "l"
    dead = _dead_pid()
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": dead, "nonce": "x"}))
    with cio.excl_locked(lock, wait=False):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert not lock.exists() and not Path(f"{lock}.break").exists()


def test_a_live_holder_and_another_hosts_lock_are_not_stale(tmp_path):
    lock = tmp_path / "l"
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getppid(), "nonce": "a"}))
    with pytest.raises(cio.LockHeld):
        with cio.excl_locked(lock, wait=False):
            pass
    # another host's pid cannot be asked: held, unless older than stale_after_s
    lock.write_text(json.dumps({"host": "elsewhere.invalid", "pid": 1, "nonce": "b"}))
    with pytest.raises(cio.LockHeld):
        with cio.excl_locked(lock, wait=False):
            pass
    old = time.time() - 3600
    os.utime(lock, (old, old))
    with cio.excl_locked(lock, wait=False, stale_after_s=600):
        pass
    # an owner file left empty by a creator that died right after O_EXCL
    lock.write_text("")
    with pytest.raises(cio.LockHeld):
        with cio.excl_locked(lock, wait=False):
            pass
    os.utime(lock, (old, old))
    with cio.excl_locked(lock, wait=False):
        pass


def test_release_never_removes_a_lock_someone_else_took_over(tmp_path):
    lock = tmp_path / "l"
    with cio.excl_locked(lock):
        lock.write_text(json.dumps({"host": "other", "pid": 1, "nonce": "z"}))
    assert lock.exists()


def test_flocked_falls_back_to_the_owner_file_where_flock_is_refused(tmp_path, monkeypatch):
    def no_flock(*_a):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(cio.fcntl, "flock", no_flock)
    lock = tmp_path / "m.lock"
    with cio.flocked(lock, wait=False):
        assert json.loads(cio.owner_path(lock).read_text())["pid"] == os.getpid()
        with pytest.raises(cio.LockHeld):
            with cio.flocked(lock, wait=False):
                pass
    assert not cio.owner_path(lock).exists()


def test_ftbench_lock_excl_forces_the_owner_file_and_bad_values_are_refused(tmp_path,
                                                                            monkeypatch):
    monkeypatch.setenv(cio.LOCK_ENV, "excl")
    with cio.flocked(tmp_path / "a", wait=False):
        assert cio.owner_path(tmp_path / "a").exists()
    monkeypatch.setenv(cio.LOCK_ENV, "nope")
    with pytest.raises(ValueError, match="FTBENCH_LOCK"):
        with cio.flocked(tmp_path / "b"):
            pass


@pytest.mark.parametrize(("local_rank", "visible", "want"), [
    (0, 8, 0), (5, 8, 5), (7, 8, 7),   # torchrun / a task that sees its whole node
    (0, 1, 0), (3, 1, 0), (7, 1, 0),   # one GPU bound per task: cuda:LOCAL_RANK is invalid
])
def test_device_index_with_a_faked_device_count(local_rank, visible, want):
    assert device_index(local_rank, visible) == want


def test_device_index_refuses_an_ambiguous_count_in_one_line():
    with pytest.raises(UsageError, match=r"LOCAL_RANK=3 but this process sees 2 GPU"):
        device_index(3, 2)


def test_the_trainers_device_uses_the_binding(monkeypatch):
    import experiments.train.trainer as T
    from experiments.train.config import compose

    monkeypatch.setattr(T.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(T.torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert T._device(compose(["model=1M", "train.device=cuda"])) == T.torch.device("cuda", 0)
    monkeypatch.setattr(T.torch.cuda, "device_count", lambda: 4)
    assert T._device(compose(["model=1M", "train.device=cuda"])) == T.torch.device("cuda", 3)
