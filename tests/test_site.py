"""Site differences: the one lock (flock; a file system without it is refused in one line), and
the GPU binding of a process that sees one GPU or all of its node's."""

from __future__ import annotations

import errno

import pytest

from common import io as cio
from common.errors import UsageError
from experiments.train.trainer import device_index


def test_flock_is_exclusive_and_a_file_system_without_it_is_one_line(tmp_path, monkeypatch):
    lock = tmp_path / "m.lock"
    with cio.flocked(lock, wait=False):
        with pytest.raises(cio.LockHeld):
            with cio.flocked(lock, wait=False):
                pass
    with cio.flocked(lock, wait=False):  # released: free again
        pass

    def no_flock(*_a):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(cio.fcntl, "flock", no_flock)
    with pytest.raises(UsageError, match="m.lock: this file system refuses flock"):
        with cio.flocked(lock):
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
