"""Fixtures shared by the test files (pytest finds them here; nothing imports this file)."""

from __future__ import annotations

import ast
import functools
import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "shared" / "benchmarks"
"""The offline benchmark files (pinned by their README's sha256 table)."""


def pytest_configure(config: pytest.Config) -> None:
    # `make test` runs the fast tier under pytest-xdist, one worker per core: a worker that also
    # used every core for torch's intra-op threads (and let its subprocesses do the same) would
    # oversubscribe the CPU, and OpenMP's spinning threads slow down badly when oversubscribed
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)
        os.environ.setdefault("OMP_NUM_THREADS", "1")


SLOW_TIMEOUT_S = 600
"""A slow test's limit unless it names its own (@pytest.mark.timeout beside it); the fast
tier's is pyproject's `timeout`."""
SERIAL = {
    # worlds of gloo processes, local job arrays, kill-and-resume or contending processes, and
    # wall clocks (timing, the sandbox's limits): beside another test on 2 cores they slow
    # down or lose their timing
    "test_e2e.py", "test_slurm.py", "test_study.py", "test_sweep_points.py", "test_train.py",
    "test_train_loop.py", "test_hsdp.py", "test_compile.py", "test_checkpoint_sharded.py",
    "test_start_space.py", "test_gpu_check_cpu.py",
    "test_gpu_check_recipe.py", "test_eval_parallel.py", "test_full_eval.py", "test_corpus.py",
    "test_site.py", "test_sandbox_timing.py", "test_sandbox_canonical.py",
}
"""Test files whose slow tests `make test-all` runs after the rest, alone (marker `serial`)."""


@pytest.hookimpl(tryfirst=True)  # before -m selects on the markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("slow") is None:
            continue
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))
        if item.path.name in SERIAL:
            item.add_marker(pytest.mark.serial)


@pytest.fixture(scope="session")
def bench_dir() -> Path:
    return BENCH


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread while a module runs: on a shared, oversubscribed CPU this is several
    times faster than torch's default. Restored afterwards, so other test files are unaffected.
    A module opts in with `pytestmark = pytest.mark.usefixtures("one_torch_thread")`."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _corpus() -> list[str]:
    """A few stdlib sources plus benchmark-like text, so the BPE has real merges."""
    files = sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "[a-c]*.py")))[:12]
    texts = [Path(f).read_text(encoding="utf-8", errors="replace") for f in files]
    texts.append("Question: What is 2 + 3?\nAnswer: 2 + 3 = 5\n#### 5\n" * 20)
    return texts


def _toy_checkpoint(path: Path, free: bool = False, seed: int = 0, vocab: int = 600,
                    preset: str = "1M", **over: object) -> Path:
    from experiments.corpus.tokenizer import tokenizer_ref, train_bpe
    from model import build_model, get_preset, save_checkpoint

    # train_bpe caches by corpus checksum, so every test shares one trained tokenizer
    tok = train_bpe(_corpus(), vocab, cache_dir=Path(tempfile.gettempdir()) / "ftbench-test-tok")
    torch.manual_seed(seed)
    cfg = get_preset(preset, vocab_size=tok.get_vocab_size(), latent_bits=8 if free else 0,
                     **over)
    m = build_model(cfg)
    if free:  # make Z matter: a strong post-sampler so a leak would show
        with torch.no_grad():
            m.post_sampler.weight.normal_(0, 1.0)
            m.enc_readout.weight.normal_(0, 1.0)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_checkpoint(path, m, tokenizer=tokenizer_ref(tok, "toy-bpe"))
    return path


@pytest.fixture(scope="session")
def toy_checkpoint() -> Callable[..., Path]:
    """`toy_checkpoint(path, free=False, seed=0, vocab=600, preset="1M", **config)`: a tiny
    untrained checkpoint with a real BPE tokenizer, for the evaluation tests."""
    return _toy_checkpoint


PACKAGES = ("common", "model", "experiments", "sweeps", "pipelines", "analysis")
"""The source packages (what the layout checks read; tests/ and dev/ are not among them)."""


def source_files(root: Path) -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))]


def plant(tmp: Path, files: dict[str, str]) -> Path:
    """A planted source tree (relative path -> text) for a layout check's adversary."""
    for rel, text in files.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_text(text)
    return tmp


@functools.cache
def _walk(text: str) -> tuple[ast.AST, ...]:
    return tuple(ast.walk(ast.parse(text)))


def nodes(path: Path) -> tuple[ast.AST, ...]:
    """Every syntax node of a source file, the module first: parsed and walked once per content
    and process (tests/test_imports.py and tests/test_bans.py read each package file often)."""
    return _walk(path.read_text(encoding="utf-8"))


def can_mount_ro(tmp: Path) -> bool:
    """Whether a read-only bind mount works here (root, unshare): the honest way to make a
    directory unwritable for root, whom chmod does not stop."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    d = tmp / "probe"
    d.mkdir()
    r = subprocess.run(["unshare", "-m", "sh", "-c",
                        f"mount --bind -o ro {d} {d} && ! touch {d}/x 2>/dev/null"],
                       capture_output=True)
    return r.returncode == 0 and not (d / "x").exists()
