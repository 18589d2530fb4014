"""Reading a built corpus: memory-mapped shards and a seeded order that needs no corpus in memory.

- `TokenStream`: the concatenation of a split's shards, sliced like an array (`s[a:b]`), each
  shard an `np.memmap` (the OS pages in what is read; a rank's memory does not grow with the
  corpus).
- `epoch_order(seed, epoch, n)`: sample g of epoch e reads chunk order[g mod n]. Up to
  `PERM_MAX` chunks this is numpy's `default_rng([seed, epoch]).permutation(n)` (what training
  always used, so existing runs keep their stream), held as int32; above, a keyed Feistel
  bijection on [0, n) evaluated per index (cycle-walking), O(1) memory at any corpus size.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from .build import MANIFEST
from .sources import DataError

PERM_MAX = 1 << 22  # chunks; 16 MB of int32 per rank at most


class TokenStream:
    """A split's shards as one read-only token sequence."""

    def __init__(self, root: str | os.PathLike, shards: list[dict[str, Any]], dtype: str) -> None:
        self.dtype = np.dtype(dtype)
        self.maps: list[np.memmap] = []
        starts = [0]
        for s in shards:
            if s["tokens"] == 0:
                continue  # np.memmap cannot map an empty file
            p = Path(root) / s["file"]
            if not p.is_file() or p.stat().st_size != s["tokens"] * self.dtype.itemsize:
                raise DataError(f"{p}: missing or not {s['tokens']} tokens as the manifest says "
                                "(rebuild the corpus)")
            self.maps.append(np.memmap(p, dtype=self.dtype, mode="r"))
            starts.append(starts[-1] + s["tokens"])
        self.starts = np.asarray(starts, dtype=np.int64)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, sl: slice) -> np.ndarray:
        if not isinstance(sl, slice) or sl.step not in (None, 1):
            raise TypeError("TokenStream supports contiguous slices only")
        a, b, _ = sl.indices(len(self))
        if b <= a:
            return np.empty(0, dtype=self.dtype)
        i = int(np.searchsorted(self.starts, a, side="right")) - 1
        parts = []
        while a < b:
            s0 = int(self.starts[i])
            e = min(b, int(self.starts[i + 1]))
            parts.append(np.asarray(self.maps[i][a - s0:e - s0]))
            a = e
            i += 1
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:  # small corpora, tests
        a = self[0:len(self)]
        return a if dtype is None else a.astype(dtype)


# ---------------------------------------------------------------- order
_M64 = (1 << 64) - 1


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
        raise DataError(f"{root}: no {MANIFEST} (not a built corpus; build it with "
                        "`make corpus` / python -m experiments.corpus)")
    return json.loads(p.read_text())


def split_stream(root: str | os.PathLike, man: dict[str, Any], split: str) -> TokenStream:
    return TokenStream(root, [s for s in man["shards"] if s["split"] == split], man["dtype"])
