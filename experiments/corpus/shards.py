"""Reading a built corpus: memory-mapped shards and a seeded order that needs no corpus in memory.
`TokenStream` concatenates a split's shards (at most `MAX_OPEN_SHARDS` mapped per process);
`epoch_order`: numpy's `default_rng([seed, epoch]).permutation(n)` up to `PERM_MAX` chunks (so
existing runs keep their stream), above it a keyed Feistel bijection evaluated per index.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from common.errors import UsageError

from .build import MANIFEST

PERM_MAX = 1 << 22  # chunks; 16 MB of int32 per rank at most


MAX_OPEN_SHARDS = 64
"""The most shards one process holds memory-mapped at once: a 1T-token corpus has tens of
thousands, past the common 1024 open files and vm.max_map_count; a sample reads one or two
neighbouring shards, so a small LRU serves a random order."""


@functools.lru_cache(maxsize=MAX_OPEN_SHARDS)  # one bound for every stream of the process
def open_map(key: str, path: str, dtype: np.dtype) -> np.memmap:
    """A shard's read-only map from the process's LRU of open maps: the least recently used is
    dropped first (its last reference: unmapped and closed then). `key` holds the path, inode
    and mtime, so a rebuilt corpus is never read through a stale map."""
    return np.memmap(path, dtype=dtype, mode="r")


class TokenStream:
    """A split's shards as one read-only token sequence. Shards are opened on first read and
    kept in the process's LRU of open maps (`MAX_OPEN_SHARDS`); their sizes are checked here
    against the manifest, without opening them."""

    def __init__(self, root: str | os.PathLike, shards: list[dict[str, Any]], dtype: str) -> None:
        self.dtype = np.dtype(dtype)
        self.paths: list[tuple[str, str]] = []  # (cache key, path)
        starts = [0]
        for s in shards:
            if s["tokens"] == 0:
                continue  # np.memmap cannot map an empty file
            p = Path(root) / s["file"]
            st = p.stat() if p.is_file() else None
            if st is None or st.st_size != s["tokens"] * self.dtype.itemsize:
                raise UsageError(f"{p}: missing or not {s['tokens']} tokens as the manifest says "
                                "(rebuild the corpus)")
            self.paths.append((f"{p}:{st.st_ino}:{st.st_mtime_ns}", str(p)))
            starts.append(starts[-1] + s["tokens"])
        self.starts = np.asarray(starts, dtype=np.int64)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, sl: slice) -> np.ndarray:
        """Tokens a..b as a new array (a copy: no view keeps a shard's map open)."""
        if not isinstance(sl, slice) or sl.step not in (None, 1):
            raise TypeError("TokenStream supports contiguous slices only")
        a, b, _ = sl.indices(len(self))
        if b <= a:
            return np.empty(0, dtype=self.dtype)
        i = int(np.searchsorted(self.starts, a, side="right")) - 1
        out = np.empty(b - a, dtype=self.dtype)
        o = 0
        while a < b:
            s0 = int(self.starts[i])
            e = min(b, int(self.starts[i + 1]))
            out[o:o + e - a] = open_map(*self.paths[i], self.dtype)[a - s0:e - s0]
            o += e - a
            a = e
            i += 1
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:  # small corpora, tests
        a = self[0:len(self)]
        return a if dtype is None else a.astype(dtype)


# ---------------------------------------------------------------- order
def _mix(x: np.ndarray, key: int) -> np.ndarray:
    """splitmix64 finaliser of x ^ key (uint64, wrapping)."""
    z = (x ^ np.uint64(key)) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def feistel_index(i: np.ndarray, n: int, seed: int, epoch: int, rounds: int = 6) -> np.ndarray:
    """A seeded bijection of [0, n) applied to i (4-round+ balanced Feistel on the smallest even
    bit width covering n, cycle-walking back into range)."""
    half = max(1, ((max(n - 1, 1)).bit_length() + 1) // 2)
    mask = np.uint64((1 << half) - 1)
    ss = np.random.SeedSequence([seed, epoch, 0xFEED])
    keys = [int(k) for k in ss.generate_state(rounds, dtype=np.uint64)]
    x = np.asarray(i, dtype=np.uint64).copy()

    def perm(v: np.ndarray) -> np.ndarray:
        left, right = v >> np.uint64(half), v & mask
        with np.errstate(over="ignore"):
            for k in keys:
                left, right = right, left ^ (_mix(right, k) & mask)
        return (left << np.uint64(half)) | right

    todo = np.ones(x.shape, dtype=bool)
    while todo.any():
        x[todo] = perm(x[todo])
        todo = x >= np.uint64(n)
    return x.astype(np.int64)


class EpochOrder:
    """order(epoch)[k] for k in an array, one epoch cached (the small-corpus permutation)."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed = n, seed
        self._perm: tuple[int, np.ndarray] | None = None

    def __call__(self, epoch: int, k: np.ndarray) -> np.ndarray:
        if self.n > PERM_MAX:
            return feistel_index(k, self.n, self.seed, epoch)
        if self._perm is None or self._perm[0] != epoch:
            p = np.random.default_rng([self.seed, epoch]).permutation(self.n).astype(np.int32)
            self._perm = (epoch, p)
        return self._perm[1][k].astype(np.int64)


def open_manifest(root: str | os.PathLike) -> dict[str, Any]:
    p = Path(root) / MANIFEST
    if not p.is_file():
        raise UsageError(f"{root}: no {MANIFEST} (not a built corpus; build it with "
                        "`make corpus` / python -m experiments.corpus)")
    return json.loads(p.read_text())


def split_stream(root: str | os.PathLike, man: dict[str, Any], split: str) -> TokenStream:
    return TokenStream(root, [s for s in man["shards"] if s["split"] == split], man["dtype"])
