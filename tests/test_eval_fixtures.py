"""Tiny checkpoints for the evaluation tests (no tests here; imported by tests/test_eval*.py)."""

from __future__ import annotations

import glob
import os
import tempfile
from pathlib import Path

import pytest
import torch

from experiments.tokenizer import tokenizer_ref, train_bpe
from model import build_model, get_preset, save_checkpoint

BENCH = Path(__file__).resolve().parents[2] / "shared" / "benchmarks"


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """One intra-op thread while a module runs: on a shared, oversubscribed CPU this is several
    times faster than torch's default (measured 0.6 s vs 2.3 s per 16x256 forward of the 1M
    model at load 9 on 2 cores). Restored afterwards, so other test files are unaffected."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def corpus() -> list[str]:
    """A few stdlib sources plus benchmark-like text, so the BPE has real merges."""
    files = sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "[a-c]*.py")))[:12]
    texts = [Path(f).read_text(encoding="utf-8", errors="replace") for f in files]
    texts.append("Question: What is 2 + 3?\nAnswer: 2 + 3 = 5\n#### 5\n" * 20)
    return texts


def toy_checkpoint(path: Path, free: bool = False, seed: int = 0, vocab: int = 600,
                   preset: str = "1M", **over: object) -> Path:
    # train_bpe caches by corpus checksum, so every test shares one trained tokenizer
    tok = train_bpe(corpus(), vocab, cache_dir=Path(tempfile.gettempdir()) / "ftbench-test-tok")
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
