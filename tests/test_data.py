"""experiments/train/data.py: sources, the deterministic split, packing and the seeded order."""

from __future__ import annotations

import numpy as np
import torch

from experiments.corpus.build import scan
from experiments.corpus.sources import stdlib_files
from experiments.train.config import DataConfig
from experiments.train.data import PackedData, SyntheticData, build_corpus
from experiments.train.synthetic_data import ALPHABET, SEQ_LEN


def test_stdlib_scan_is_by_file_and_deterministic(tmp_path):
    s = scan(DataConfig(source="stdlib"), tmp_path / "all", sample_cap=None)
    every = [p for p in stdlib_files() if p.stat().st_size]  # a document per non-empty file
    assert s.documents == len(every) > 500 and not s.forced_val
    assert 0.02 < s.val_documents / s.documents < 0.09  # val_fraction 0.05, by a hash of the path
    # a capped corpus is a fixed subset, split by the same rule, the same on every scan
    capped = DataConfig(source="stdlib", max_bytes=200_000)
    a, b = (scan(capped, tmp_path / d, sample_cap=None) for d in "ab")
    assert (a.checksums, a.documents, a.val_documents) == (b.checksums, b.documents,
                                                           b.val_documents)
    assert a.checksums != s.checksums and 200_000 <= a.bytes < 200_000 + 2_000_000


def test_packed_data_order_is_a_seeded_permutation_per_epoch():
    toks = np.arange(1001, dtype=np.uint16)
    pd = PackedData(toks, seq_len=10, seed=3)
    assert pd.n == 100
    x, y = pd.get(0, 100)
    assert torch.equal(x[:, 1:], y[:, :-1])  # y is x shifted by one
    starts = sorted(int(r[0]) for r in x)
    assert starts == list(range(0, 1000, 10))  # one epoch visits every chunk once
    x2, _ = pd.get(100, 100)
    assert sorted(int(r[0]) for r in x2) == starts and not torch.equal(x, x2)  # new order
    again = PackedData(toks, seq_len=10, seed=3)
    assert torch.equal(again.get(37, 5)[0], x[37:42])  # random access = resume by position
    other = PackedData(toks, seq_len=10, seed=4)
    assert not torch.equal(other.get(0, 100)[0], x)


def test_synthetic_data_random_access():
    d = SyntheticData(seed=0, split="train")
    x, y = d.get(5, 3)
    assert x.shape == (3, SEQ_LEN - 1) and int(x.max()) < len(ALPHABET)
    assert torch.equal(d.get(6, 1)[0], x[1:2])
    assert not torch.equal(SyntheticData(seed=1, split="train").get(5, 3)[0], x)
    c = build_corpus(DataConfig(source="synthetic", val_tokens=650), vocab_size=29,
                     seq_len=SEQ_LEN - 1, seed=0, cache_dir="unused")
    assert c.val_x.shape == (10, SEQ_LEN - 1) and c.tokenizer.vocab_size == 29
