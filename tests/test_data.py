"""experiments/train/data.py: sources, the deterministic split, packing and the seeded order."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from common.errors import UsageError
from experiments.corpus.sources import load_documents, stdlib_files, stdlib_root
from experiments.train.config import DataConfig, HFSource
from experiments.train.data import PackedData, SyntheticData, build_corpus
from experiments.train.synthetic_data import ALPHABET, SEQ_LEN


def _words(rng: random.Random, n: int) -> str:
    return " ".join("".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randint(2, 7)))
                    for _ in range(n))


def _write_corpus(root):
    (root / "a").mkdir(parents=True)
    rng = random.Random(0)
    for i in range(12):
        (root / "a" / f"doc{i:02d}.txt").write_text(f"document number {i}\n" + _words(rng, 150))
    with open(root / "b.jsonl", "w") as f:
        for i in range(30):
            f.write(json.dumps({"body": f"record {i}: " + "lorem ipsum " * 20, "id": i}) + "\n")
    (root / "c.json").write_text(json.dumps([{"body": "from a json list " * 10}] * 3))


def test_stdlib_split_is_by_file_and_deterministic():
    tr, va, sums = load_documents(DataConfig(source="stdlib"))
    tk, vk = {k for k, _ in tr}, {k for k, _ in va}
    root = stdlib_root()
    every = {str(p.relative_to(root)) for p in stdlib_files() if p.stat().st_size}  # no reads
    assert not tk & vk and tk | vk == every and len(every) > 500
    assert not any(k.startswith("site-packages") for k in every)
    assert 0.02 < len(vk) / (len(tk) + len(vk)) < 0.09  # val_fraction 0.05, by a hash of the path
    # a capped corpus is a fixed subset, split by the same rule, the same on every call
    capped = DataConfig(source="stdlib", max_bytes=200_000)
    tr3, va3, sums3 = load_documents(capped)
    tr4, va4, sums4 = load_documents(capped)
    assert (tr3, va3, sums3) == (tr4, va4, sums4) and sums3 != sums
    assert {k for k, _ in va3} <= vk | {min(k for k, _ in va3)}
    assert {k for k, _ in tr3} <= tk | vk
    assert 200_000 <= sum(len(t.encode()) for _, t in tr3 + va3) < 200_000 + 2_000_000


def test_files_source_txt_jsonl_json(tmp_path):
    _write_corpus(tmp_path)
    dcfg = DataConfig(source="files", paths=[str(tmp_path / "a/*.txt"), str(tmp_path / "*.json*")],
                      text_field="body", val_fraction=0.2)
    tr, va, sums = load_documents(dcfg)
    assert len(tr) + len(va) == 12 + 30 + 3
    assert set(sums) == {str(p) for p in sorted(tmp_path.rglob("*.*"))}
    assert all(len(v) == 64 for v in sums.values())
    assert any(k.endswith("b.jsonl:0") for k, _ in tr + va)
    with pytest.raises(UsageError, match="no string field 'text'"):
        load_documents(DataConfig(source="files", paths=[str(tmp_path / "b.jsonl")]))
    with pytest.raises(UsageError, match="no file matches"):
        load_documents(DataConfig(source="files", paths=[str(tmp_path / "nope/*.txt")]))


def test_hf_streaming_mixture_on_local_files(tmp_path):
    """data=hf through the real `datasets` streaming code, with the json and text builders."""
    _write_corpus(tmp_path)
    srcs = [HFSource(path="json", data_files=[str(tmp_path / "b.jsonl")], field="body",
                     weight=3.0),
            HFSource(path="text", data_files=[str(tmp_path / "a" / "doc00.txt")], weight=1.0)]
    # null cap: the stream ends when a source finishes its pass (a byte cap the sources cannot
    # fill stops the build naming the source: tests/test_corpus_budget.py)
    dcfg = DataConfig(source="hf", hf_sources=srcs, val_fraction=0.2, hf_max_bytes=None)
    tr, va, sums = load_documents(dcfg)
    texts = [t for _, t in tr + va]
    assert any(t.startswith("record") for t in texts)
    assert any(t.startswith("document") for t in texts)
    assert list(sums) == ["hf:json//train@3+text//train@1"]
    assert load_documents(dcfg)[2] == sums  # same stream, same checksum
    capped = DataConfig(source="hf", hf_sources=srcs[:1], hf_max_bytes=1000, val_fraction=0.2)
    tr2, va2, _ = load_documents(capped)
    assert 1000 <= sum(len(t) for _, t in tr2 + va2) < 1000 + 300
    bad = DataConfig(source="hf", hf_sources=[HFSource(path="json",
                                                        data_files=[str(tmp_path / "x.jsonl")])])
    with pytest.raises(UsageError, match="cannot stream 'json'"):
        load_documents(bad)


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
