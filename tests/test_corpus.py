"""experiments/corpus and experiments/train/data.py: the scan and its split, the build (sources
-> tokenizer -> shards), its determinism across worker counts and kill -9, bad input, the
memory-mapped stream, packing and the seeded order."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from common.errors import UsageError
from experiments.corpus import sources as S
from experiments.corpus.build import MANIFEST, build, dtype_for, scan, verify
from experiments.corpus.shards import (
    PERM_MAX,
    EpochOrder,
    TokenStream,
    feistel_index,
    open_manifest,
    split_stream,
)
from experiments.train.config import DataConfig
from experiments.train.data import PackedData, SyntheticData, build_corpus
from experiments.train.synthetic_data import ALPHABET, SEQ_LEN

ROOT = Path(__file__).resolve().parent.parent


def _words(rng: random.Random, n: int) -> str:
    return " ".join("".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randint(2, 7)))
                    for _ in range(n))


def _write_files(root: Path, n_txt: int = 24, n_jsonl: int = 3) -> None:
    """Text, jsonl, json and parquet files: several units at shard_bytes=4000."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(0)
    (root / "txt").mkdir(parents=True)
    for i in range(n_txt):
        (root / "txt" / f"d{i:02d}.txt").write_text(f"text file {i} é\n" + _words(rng, 200))
    for j in range(n_jsonl):
        with open(root / f"r{j}.jsonl", "w") as f:
            for i in range(40):
                f.write(json.dumps({"text": f"record {j}.{i} " + _words(rng, 30), "n": i}) + "\n")
    # a .json file: a list of records or plain strings
    (root / "c.json").write_text(json.dumps([{"text": "a json record " + _words(rng, 30)},
                                             "a json string " + _words(rng, 30)]))
    pq.write_table(pa.table({"text": [f"parquet row {i} " + _words(rng, 40) for i in range(50)],
                             "id": list(range(50))}), root / "p.parquet")


def _files_cfg(root: Path, **kw) -> DataConfig:
    return DataConfig(source="files", paths=[str(root / "txt/*.txt"), str(root / "*.jsonl"),
                                             str(root / "*.json"), str(root / "*.parquet")],
                      shard_bytes=4000, val_fraction=0.1, **kw)


def source_docs(dcfg: DataConfig) -> tuple[list[S.Doc], list[S.Doc], dict[str, str]]:
    """(train, val, checksums) of a text source, walked here in memory apart from build.scan:
    the oracle the streaming build must equal."""
    h = hashlib.sha256()
    if dcfg.source == "files":
        paths = S.expand_globs(dcfg.paths)
        docs = [d for p in paths for d in S.iter_file_docs(p, dcfg.text_field)]
        sums = {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}
    else:  # stdlib
        docs = S.stdlib_docs(dcfg.max_bytes)
        for k, t in docs:
            S.corpus_checksum_update(h, k + "\0" + t)
        sums = {f"stdlib:{S.stdlib_root()}": h.hexdigest()}
    docs = [d for d in docs if d[1]]
    if dcfg.max_bytes is not None:
        docs = S.capped(docs, dcfg.max_bytes)
    val = [d for d in docs if S.is_val(d[0], dcfg.val_fraction)]
    val = val or [min(docs, key=lambda d: S.key_hash(d[0]))]  # tiny corpora: one held out
    return [d for d in docs if d not in val], val, sums


def _files_args(root: Path) -> list[str]:
    """_files_cfg on the corpus command line."""
    return ["--data", "files", "--vocab-size", "300", "--quiet",
            f"paths=[{root}/txt/*.txt,{root}/*.jsonl,{root}/*.json,{root}/*.parquet]",
            "shard_bytes=4000", "val_fraction=0.1"]


def _shard_bytes(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.glob("*.bin"))}


@pytest.fixture(scope="module")
def files_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("src")
    _write_files(root)
    return root


def _no_network(mp: pytest.MonkeyPatch) -> None:
    """The offline sources (files, stdlib) never open a socket."""
    def refuse(*a, **k):
        raise AssertionError("the offline path opened a network connection")

    mp.setattr(socket.socket, "connect", refuse)
    mp.setattr(socket, "create_connection", refuse)


@pytest.fixture(scope="module")
def built(files_root, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("built") / "c"
    with pytest.MonkeyPatch.context() as mp:
        _no_network(mp)
        build(_files_cfg(files_root), out, vocab_size=300, workers=1,
              cache_dir=tmp_path_factory.mktemp("cache"))
    return out


def test_shards_hold_the_documents_in_order_with_eos_and_the_manifest_is_true(files_root, built):
    """Independent: source_docs' split, the tokenizer's own encode, hashlib over the files."""
    from tokenizers import Tokenizer

    man = open_manifest(built)
    tok = Tokenizer.from_file(str(built / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    tr, va, sums = source_docs(_files_cfg(files_root))
    assert man["source"]["checksums"] == sums
    assert man["documents"] == {"train": len(tr), "val": len(va)}
    assert man["dtype"] == "<u2" and len(man["shards"]) > 8  # several units
    # the split is the hash rule's (source_docs'), with no document forced into validation
    assert man["split"]["val_fraction"] == 0.1 and man["split"]["forced_val"] == []
    for split, docs in (("train", tr), ("val", va)):
        want = np.concatenate([np.asarray(tok.encode(t).ids + [eos], dtype=np.uint16)
                               for _, t in docs])
        got = np.asarray(split_stream(built, man, split))
        assert np.array_equal(got, want), split
        assert man["tokens"][split] == len(want)
    for s in man["shards"]:
        data = (built / s["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == s["sha256"]
        assert len(data) == 2 * s["tokens"]
    assert man["tokenizer"]["sha256"] == hashlib.sha256(
        (built / "tokenizer.json").read_bytes()).hexdigest()
    assert verify(built) == []
    assert not (built / "text").exists() and not list(built.glob(".*.tmp"))
    # the same request again: the manifest is returned, nothing rebuilt
    mtime = (built / MANIFEST).stat().st_mtime_ns
    assert build(_files_cfg(files_root), built, vocab_size=300) == man
    assert (built / MANIFEST).stat().st_mtime_ns == mtime
    with pytest.raises(UsageError, match="holds another corpus"):
        build(_files_cfg(files_root), built, vocab_size=280)


@pytest.mark.slow  # multi-process or end to end: the CI tier (make test-all)
def test_one_and_four_workers_and_a_kill9_resume_give_identical_shards(files_root, built,
                                                                       tmp_path):
    ref = _shard_bytes(built)
    man = open_manifest(built)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    args = _files_args(files_root)
    four = tmp_path / "four"
    r = subprocess.run([sys.executable, "-m", "experiments.corpus", "--out", str(four),
                        "--workers", "4", *args], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert _shard_bytes(four) == ref and open_manifest(four) == man

    # kill -9 in the middle of the units (each unit slowed down so the kill lands mid-build)
    killed = tmp_path / "killed"
    slow = ("import sys, time; import experiments.corpus.build as B; f = B.build_unit\n"
            "def slow(*a, **k):\n    r = f(*a, **k); time.sleep(0.3); return r\n"
            "B.build_unit = slow\nfrom experiments.corpus.__main__ import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    p = subprocess.Popen([sys.executable, "-c", slow, "--out", str(killed), "--workers", "1",
                          *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while len(list((killed / "units").glob("unit-*.json"))) < 3 and time.time() < deadline:
        assert p.poll() is None, p.stderr.read().decode()[-2000:]
        time.sleep(0.02)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert not (killed / MANIFEST).exists()
    done = {q.name: q.stat().st_mtime_ns for q in (killed / "units").glob("unit-*.json")}
    assert 3 <= len(done) < len(man["shards"]) // 2
    shard_times = {q.name: q.stat().st_mtime_ns for q in killed.glob("*.bin")}
    (killed / ".train-00099.bin.123.tmp").write_bytes(b"junk")  # what a killed unit leaves
    r = subprocess.run([sys.executable, "-m", "experiments.corpus", "--out", str(killed),
                        "--workers", "2", *args], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert _shard_bytes(killed) == ref and open_manifest(killed) == man
    for name, t in done.items():  # finished units were not redone
        assert (killed / "units" / name).stat().st_mtime_ns == t
        u = int(name[5:10])
        assert (killed / f"train-{u:05d}.bin").stat().st_mtime_ns == shard_times[
            f"train-{u:05d}.bin"]
    assert not list(killed.glob(".*.tmp"))


def test_a_given_tokenizer_and_uint32_shards(files_root, tmp_path):
    """A tokenizer.json the user gives is used as is; > 2^16 tokens are stored as uint32."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {"<|endoftext|>": 0, **{c: i + 1 for i, c in enumerate(sorted(alphabet))}}
    base = len(vocab)
    vocab.update({f"pad{i}": base + i for i in range(70_000 - base)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(str(tmp_path / "big.json"))
    assert dtype_for(65_536) == np.dtype("<u2") and dtype_for(65_537) == np.dtype("<u4")
    dcfg = DataConfig(source="files", paths=[str(files_root / "r1.jsonl")], val_fraction=0.2,
                      tokenizer=str(tmp_path / "big.json"))
    man = build(dcfg, tmp_path / "c", vocab_size=None)
    assert man["dtype"] == "<u4" and man["tokenizer"]["vocab_size"] == 70_000
    assert man["tokenizer"]["given"] == str(tmp_path / "big.json")
    tr, _, _ = source_docs(dcfg)
    first = tr[0][1]
    got = np.asarray(split_stream(tmp_path / "c", man, "train"))[: len(first.encode()) + 1]
    assert got.dtype == np.dtype("<u4") and int(got[-1]) == 0  # one byte per token, then eos
    assert Tokenizer.from_file(str(tmp_path / "c" / "tokenizer.json")).decode(
        got[:-1].tolist()) == first


@pytest.mark.parametrize("n", [1, 2, 3, 1000, 4097, PERM_MAX + 12345])
def test_the_order_is_a_seeded_bijection_at_any_size(n):
    k = np.arange(n if n <= 200_000 else 20_000)  # beyond: a prefix, still distinct
    a = feistel_index(k, n, seed=1, epoch=0)
    assert a.min() >= 0 and a.max() < n and len(np.unique(a)) == len(a)
    if n <= 200_000:
        assert np.array_equal(np.sort(a), np.arange(n))  # every chunk once per epoch
    if n > 100:
        assert not np.array_equal(a, feistel_index(k, n, seed=2, epoch=0))
        assert not np.array_equal(a, feistel_index(k, n, seed=1, epoch=1))
        assert np.array_equal(a, feistel_index(k, n, seed=1, epoch=0))
    o = EpochOrder(n, seed=5)
    if n <= PERM_MAX:  # the permutation training always used: existing runs keep their stream
        want = np.random.default_rng([5, 3]).permutation(n)[k[:50]]
        assert np.array_equal(o(3, k[:50]), want)
    else:
        assert np.array_equal(o(3, k[:50]), feistel_index(k[:50], n, seed=5, epoch=3))


def test_training_corpus_goes_through_the_build_and_epochs_are_checked(files_root, tmp_path):
    from experiments.train.data import check_epochs

    dcfg = _files_cfg(files_root, val_tokens=64)
    c = build_corpus(dcfg, vocab_size=300, seq_len=16, seed=0, cache_dir=tmp_path)
    (d,) = [p.parent for p in (tmp_path / "corpora").glob("*/corpus.json")]
    assert c.info["dir"] == str(d) and isinstance(c.train.tokens, TokenStream)
    # a prebuilt corpus named by data.corpus is opened, never built; the same stream
    c2 = build_corpus(DataConfig(corpus=str(d), val_tokens=64), vocab_size=300, seq_len=16,
                      seed=1, cache_dir=tmp_path / "other")
    assert not torch.equal(c.train.get(0, 9)[0], c2.train.get(0, 9)[0])  # the seed's order
    assert torch.equal(c.train.get(0, 9)[0], build_corpus(
        DataConfig(corpus=str(d), val_tokens=64), vocab_size=300, seq_len=16, seed=0,
        cache_dir=tmp_path / "other").train.get(0, 9)[0])
    assert not (tmp_path / "other").exists()
    # the validation rows are fixed whatever the seed: the first val tokens, shifted by one
    assert torch.equal(c.val_x, c2.val_x) and c.val_x.shape == (4, 16)
    assert torch.equal(c.val_x[:, 1:], c.val_y[:, :-1])
    eos = c.tokenizer.eos_id
    stream = np.asarray(c.train.tokens)  # the memory-mapped shards, read whole
    assert int((stream == eos).sum()) == c.info["train_docs"] and stream[-1] == eos
    assert c.token_bytes[eos] == 0 and int(c.token_bytes.sum()) > 300
    with pytest.raises(UsageError, match="no corpus.json"):
        build_corpus(DataConfig(corpus=str(tmp_path / "none")), vocab_size=300, seq_len=16,
                     seed=0, cache_dir=tmp_path)
    n = c.train.n
    assert check_epochs(dcfg, n, 16, c.info["train_tokens"]) == 1.0
    assert check_epochs(dcfg, n // 4, 16, c.info["train_tokens"]) == pytest.approx((n // 4) / n)
    with pytest.raises(UsageError, match=rf"{n + 1} .*passes|passes over the corpus"):
        check_epochs(dcfg, n + 1, 16, c.info["train_tokens"])
    assert check_epochs(DataConfig(max_epochs=2.5), int(2.5 * n), 16,
                        c.info["train_tokens"]) == pytest.approx(int(2.5 * n) / n)


@pytest.mark.slow  # submitit's local executor: a process per unit; make corpus's fast test below
def test_the_slurm_launcher_path_gives_the_same_shards(files_root, built, tmp_path, monkeypatch):
    """LAUNCHER=slurm's code path (`make corpus LAUNCHER=slurm`: the units as one submitit job
    array through the one launcher, with the cluster file's corpus settings), run by submitit's
    local executor here; the lead runs it on the SLURM test cluster (ci/slurm). The shipped
    example cluster file goes through the schema: handed to submitit as it is, a cluster file
    crashed the build with "Unknown executor 'max' in parameter 'max_num_timeout'" (issue 37)."""
    import submitit

    from pipelines.corpus import main as make_corpus

    real, asked = submitit.AutoExecutor, []

    def local(folder, cluster=None, **kw):  # every parameter checked by AutoExecutor, run here
        asked.append(cluster)
        return real(folder, cluster="local", **kw)

    monkeypatch.setattr(submitit, "AutoExecutor", local)
    example = Path(__file__).resolve().parents[1] / "sweeps" / "cluster.example.yaml"
    assert make_corpus(["--launcher", "slurm", "--cluster", str(example), "--workers", "3",
                        "--out", str(tmp_path / "s"), *_files_args(files_root)]) == 0
    assert asked == ["slurm"]  # one job array
    assert open_manifest(tmp_path / "s") == open_manifest(built)
    assert _shard_bytes(tmp_path / "s") == _shard_bytes(built)
    assert list((tmp_path / "s" / "slurm").iterdir())  # submitit's job folder
    with pytest.raises(NameError, match="Unknown executor 'max'"):  # the raw file, as before
        real(tmp_path / "raw", cluster="local").update_parameters(partition="ci",
                                                                   max_num_timeout=3)


def test_make_corpus_takes_the_launcher(files_root, tmp_path):
    """`python -m pipelines.corpus` (make corpus): experiments.corpus's command with --launcher
    and --cluster (a bad cluster file: test_refusals' table)."""
    from pipelines.corpus import main as make_corpus

    assert make_corpus(["--data", "files", f"paths=[{files_root}/r0.jsonl]", "--vocab-size",
                        "300", "--quiet", "--out", str(tmp_path / "a"), "--workers", "2"]) == 0
    assert open_manifest(tmp_path / "a")["documents"]["train"] > 0


def test_the_stdlib_stream_is_the_in_memory_paths(tmp_path, monkeypatch):
    """Existing results stay comparable: tokenizer, train order and val rows equal what the
    in-memory path computed (BPE on the training documents, each tokenized + eos, concatenated,
    PackedData over the array); offline, no socket opened."""
    from experiments.corpus.tokenizer import train_bpe

    _no_network(monkeypatch)
    dcfg = DataConfig(source="stdlib", max_bytes=60_000, val_tokens=512)
    c = build_corpus(dcfg, vocab_size=300, seq_len=32, seed=3, cache_dir=tmp_path / "a")
    tr, va, sums = source_docs(dcfg)
    assert c.info["val_docs"] == len(va) == 1  # a tiny corpus still holds one document out
    tok = train_bpe([t for _, t in tr], 300, cache_dir=tmp_path / "b")
    assert c.tokenizer.tok.to_str() == tok.to_str() and c.checksums == sums
    eos = tok.token_to_id("<|endoftext|>")

    def stream(docs):
        return np.concatenate([np.asarray(tok.encode(t).ids + [eos], dtype=np.uint16)
                               for _, t in docs])

    old = PackedData(stream(tr), 32, seed=3)
    assert old.n == c.train.n
    for start in (0, 5, old.n - 3, 2 * old.n + 7):  # across epochs too
        assert torch.equal(old.get(start, 4)[0], c.train.get(start, 4)[0])
    v = torch.from_numpy(stream(va)[: 16 * 32 + 1].astype(np.int64))
    assert torch.equal(c.val_x, v[:-1].view(16, 32)) and torch.equal(c.val_y, v[1:].view(16, 32))


def test_stdlib_scan_is_by_file_and_deterministic(tmp_path):
    s = scan(DataConfig(source="stdlib"), tmp_path / "all", sample_cap=None)
    every = [p for p in S.stdlib_files() if p.stat().st_size]  # a document per non-empty file
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
