"""Training data: a built corpus (experiments/corpus) read as packed sequences in a seeded order.
Without `data.corpus`, build_corpus builds the data section's corpus under <paths.cache>/corpora/
behind a lock (every later rank only opens it). The training stream is cut into chunks of
seq_len + 1 tokens with stride seq_len (no padding); sample g is chunk order_e[g mod n] with
order_e seeded by (seed, g // n), so a resume needs only the sample counter. The validation set
is the first `val_tokens` of the held-out stream (independent of the seed); a run may not read
its corpus more than `data.max_epochs` times (`check_epochs`).
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.errors import UsageError
from common.io import flocked, sha256_file
from experiments.corpus.build import TOKENIZER, build, read_manifest, request_of
from experiments.corpus.config import GENERATED_SOURCES, DataConfig
from experiments.corpus.shards import EpochOrder, TokenStream, open_manifest, split_stream
from experiments.corpus.sources import expand_globs, stdlib_root
from experiments.corpus.tokenizer import BPETokenizer, CharTokenizer, TextTokenizer


# ---------------------------------------------------------------- datasets
class PackedData:
    """Chunks of seq_len + 1 tokens of one token stream (an array or a memory-mapped
    TokenStream), read in a seeded per-epoch order."""

    def __init__(self, tokens: np.ndarray | TokenStream, seq_len: int, seed: int) -> None:
        self.tokens = tokens
        self.seq_len = seq_len
        self.seed = seed
        self.n = (len(tokens) - 1) // seq_len
        if self.n < 1:
            raise UsageError(f"training stream has {len(tokens)} tokens; need > seq_len={seq_len}")
        self.order = EpochOrder(self.n, seed)

    def index(self, g: int) -> int:
        """The chunk that sample g of the stream reads."""
        return int(self.order(g // self.n, np.asarray([g % self.n]))[0])

    def chunk(self, i: int) -> np.ndarray:
        return self.tokens[i * self.seq_len: i * self.seq_len + self.seq_len + 1]

    def get(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples start .. start+count-1 of the seeded infinite stream -> x, y (count, T)."""
        rows = [self.chunk(self.index(g)) for g in range(start, start + count)]
        a = torch.from_numpy(np.stack(rows).astype(np.int64))
        return a[:, :-1], a[:, 1:]


class SyntheticData:
    """The paper's §4.1 sequences: sample g is drawn from its own seeded RNG (random access)."""

    def __init__(self, seed: int, split: str) -> None:
        from . import synthetic_data as sd

        self.sd = sd
        self.seed = seed
        self.split = split
        self.seq_len = sd.SEQ_LEN - 1

    def example(self, g: int) -> list[int]:
        text, _ = self.sd.make_example(random.Random(f"synthetic:{self.split}:{self.seed}:{g}"))
        return self.sd.encode(text)

    def get(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        a = torch.tensor([self.example(g) for g in range(start, start + count)],
                         dtype=torch.long)
        return a[:, :-1], a[:, 1:]


class RandomTokens:
    """Uniform random tokens, sample g of a split drawn from its own seeded generator (a resume
    reads what the uninterrupted run would): for measuring memory and speed (`make gpu-check
    RECIPE=..`)."""

    def __init__(self, vocab_size: int, seq_len: int, seed: int, split: str) -> None:
        self.vocab, self.seq_len, self.seed, self.split = vocab_size, seq_len, seed, split
        self.salt = {"train": 0, "val": 1}[split]

    def get(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        # numpy's SeedSequence takes the whole (seed, split, sample) key; torch's CPU generator
        # keeps only 32 bits of a seed, so keys that differ above them would draw alike
        rows = [np.random.default_rng((self.seed, self.salt, i)).integers(
            0, self.vocab, self.seq_len + 1) for i in range(start, start + count)]
        a = torch.from_numpy(np.stack(rows).astype(np.int64))
        return a[:, :-1], a[:, 1:]


def random_alphabet(vocab_size: int) -> str:
    """`vocab_size` distinct characters, one per token id (code points from U+0100, surrogates
    skipped so every one has a UTF-8 spelling): the tokenizer of data=random."""
    out, c = [], 0x100
    while len(out) < vocab_size:
        if not 0xD800 <= c <= 0xDFFF:
            out.append(chr(c))
        c += 1
    return "".join(out)


@dataclass
class Corpus:
    tokenizer: TextTokenizer
    train: PackedData | SyntheticData | RandomTokens
    val_x: torch.Tensor  # (N, T) fixed validation inputs
    val_y: torch.Tensor  # (N, T) targets
    token_bytes: torch.Tensor  # (V,) UTF-8 bytes per token id, for bits per byte
    checksums: dict[str, str] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def val_batches(self, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for s in range(0, len(self.val_x), batch_size):
            yield self.val_x[s:s + batch_size], self.val_y[s:s + batch_size]


def _fingerprint(dcfg: DataConfig) -> list[Any]:
    """What on disk the cache key must follow (a local file edited is another corpus)."""
    if dcfg.source == "stdlib":
        return [str(stdlib_root()), sys.version]
    if dcfg.source == "files":
        return [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in expand_globs(dcfg.paths)]
    return []  # hf: the request names the stream


def corpus_dir(dcfg: DataConfig, vocab_size: int, cache_dir: str | os.PathLike) -> Path:
    """data.corpus, else <cache>/corpora/<source>-<key of the data section, vocabulary, files>."""
    if dcfg.corpus:
        return Path(dcfg.corpus).expanduser()
    key = hashlib.sha256(json.dumps([request_of(dcfg, vocab_size), _fingerprint(dcfg)],
                                    sort_keys=True, default=str).encode()).hexdigest()[:16]
    return Path(cache_dir) / "corpora" / f"{dcfg.source}-{key}"


def built_manifest(dcfg: DataConfig, vocab_size: int, cache_dir: str | os.PathLike
                   ) -> dict[str, Any] | None:
    """The corpus' manifest if it is built already (for the dry run), else None."""
    if dcfg.source in GENERATED_SOURCES:
        return None
    if dcfg.corpus:  # named: it must exist
        return open_manifest(corpus_dir(dcfg, vocab_size, cache_dir))
    return read_manifest(corpus_dir(dcfg, vocab_size, cache_dir))


def check_epochs(dcfg: DataConfig, samples_asked: int, seq_len: int, train_tokens: int) -> float:
    """Passes over the corpus a run asks for; UsageError (one line) beyond data.max_epochs."""
    n = max(0, (train_tokens - 1) // seq_len)  # chunks (samples) in one pass
    if n < 1:
        raise UsageError(f"training stream has {train_tokens} tokens; need > seq_len={seq_len}")
    epochs = samples_asked / n
    if epochs > dcfg.max_epochs + 1e-9:
        raise UsageError(f"train.tokens asks for {samples_asked * seq_len:,} tokens = "
                        f"{epochs:.3g} passes over the corpus ({train_tokens:,} training tokens, "
                        f"{n:,} sequences of {seq_len}); data.max_epochs={dcfg.max_epochs:g}: "
                        "use a larger corpus, fewer tokens, or raise data.max_epochs")
    return epochs


def val_sequences(available: int, val_tokens: int, seq_len: int) -> int:
    """Rows of the fixed validation set: the first `val_tokens` of a held-out stream of
    `available` tokens, cut into rows of seq_len (+ one target token); UsageError if none."""
    n_val = min(val_tokens, available - 1) // seq_len
    if n_val < 1:
        raise UsageError(f"validation split has {available} tokens; need more than "
                        f"seq_len={seq_len} (raise data.val_fraction or use more data)")
    return n_val


def val_rows(va: np.ndarray | TokenStream, n: int, seq_len: int
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """The first `n` validation rows of the held-out stream `va`: x (n, seq_len) and its
    next-token targets y, reading only their tokens."""
    v = torch.from_numpy(np.asarray(va[0:n * seq_len + 1]).astype(np.int64))
    return v[:-1].view(n, seq_len), v[1:].reshape(n, seq_len)


def open_val_rows(d: str | os.PathLike, val_tokens: int, seq_len: int,
                  max_rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """A built corpus' fixed validation rows (the first `max_rows`, None: all), read from its
    val shards, with its manifest; UsageError (one line) if `d` is not one or too small."""
    man = open_manifest(d)
    va = split_stream(d, man, "val")
    n_val = val_sequences(len(va), val_tokens, seq_len)
    n = n_val if max_rows is None else min(n_val, max_rows)
    vx, vy = val_rows(va, n, seq_len)
    return vx, vy, {**man, "val_sequences": n_val, "val_tokens_available": len(va)}


def build_corpus(dcfg: DataConfig, *, vocab_size: int, seq_len: int, seed: int,
                 cache_dir: str | os.PathLike) -> Corpus:
    """Everything training needs from the data section (tokenizer, train stream, fixed val)."""
    if dcfg.source == "synthetic":
        from . import synthetic_data as sd

        tok = CharTokenizer(sd.ALPHABET, name="synthetic")
        train = SyntheticData(seed, "train")
        val = SyntheticData(0, "val")  # the same validation set for every seed
        n_val = max(1, dcfg.val_tokens // val.seq_len)
        vx, vy = val.get(0, n_val)
        src = Path(sd.__file__).read_bytes()
        return Corpus(tok, train, vx, vy, torch.tensor(tok.token_bytes()),
                      {"synthetic_data.py": hashlib.sha256(src).hexdigest()},
                      {"val_sequences": n_val})
    if dcfg.source == "random":
        tok = CharTokenizer(random_alphabet(vocab_size), name=f"random{vocab_size}")
        rt = RandomTokens(vocab_size, seq_len, seed, "train")
        n_val = max(1, dcfg.val_tokens // seq_len)
        vx, vy = RandomTokens(vocab_size, seq_len, 0, "val").get(0, n_val)
        return Corpus(tok, rt, vx, vy, torch.tensor(tok.token_bytes()), {},
                      {"val_sequences": n_val, "random_tokens": vocab_size})
    d = corpus_dir(dcfg, vocab_size, cache_dir)
    if dcfg.corpus:  # built by `make corpus`: only opened, never built here
        man = open_manifest(d)
    else:
        # one builder; the other ranks (and concurrent runs) wait, then open what it wrote
        with flocked(d.parent / f"{d.name}.lock"):
            man = build(dcfg, d, vocab_size=vocab_size, cache_dir=cache_dir)
    from tokenizers import Tokenizer

    tok = BPETokenizer(Tokenizer.from_file(str(d / TOKENIZER)),
                       name=f"bpe{man['tokenizer']['vocab_size']}-corpus:{d.name}" if dcfg.corpus
                       else f"bpe{vocab_size}-{dcfg.source}")
    tr, va = split_stream(d, man, "train"), split_stream(d, man, "val")
    n_val = val_sequences(len(va), dcfg.val_tokens, seq_len)
    vx, vy = val_rows(va, n_val, seq_len)
    info = {"train_docs": man["documents"]["train"], "val_docs": man["documents"]["val"],
            "train_tokens": len(tr), "val_tokens_available": len(va), "val_sequences": n_val,
            "dir": str(d), "manifest_sha256": sha256_file(d / "corpus.json"),
            "tokenizer_sha256": man["tokenizer"]["sha256"]}
    return Corpus(tok, PackedData(tr, seq_len, seed), vx, vy,
                  torch.tensor(tok.token_bytes(), dtype=torch.long),
                  dict(man["source"]["checksums"]), info)
