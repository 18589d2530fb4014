"""Training data: documents -> tokenizer -> packed sequences with a deterministic order.

Design choices:
- every source yields (key, text) documents; a document goes to validation iff a hash of its key
  falls under `val_fraction`, so the split is by file (stdlib, text files) or by record (jsonl,
  hf) and does not depend on listing order or on the seed;
- the BPE is trained on the training documents only, at exactly `model.vocab_size`;
- documents are tokenized, each followed by eos, concatenated, and cut into chunks of seq_len + 1
  tokens with stride seq_len (targets continue across chunk boundaries; no padding, no waste);
- sample g of the training stream is chunk perm_e[g mod n], e = g // n, with perm_e a permutation
  seeded by (seed, e): the order is fixed by the seed, and a resume needs only the sample counter;
- the validation set is the first `val_tokens` of the held-out stream: fixed for every run on the
  same corpus and tokenizer (it does not depend on the seed);
- tokenized corpora are cached under paths.cache, keyed by content (corpus checksum, tokenizer).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import random
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from common.io import atomic_write, sha256_file

from .config import DataConfig
from .tokenizer import BPETokenizer, CharTokenizer, TextTokenizer, corpus_checksum, train_bpe


class DataError(ValueError):
    """A data source that cannot be read (missing file, bad record, empty split)."""


Doc = tuple[str, str]  # (key, text)


def _key_hash(key: str) -> float:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2.0**64


# ---------------------------------------------------------------- sources
def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_docs(max_bytes: int | None = None) -> list[Doc]:
    """The running interpreter's own standard-library .py files (no site-packages).

    With max_bytes, only the files of the capped subset (see `load_documents`) are read."""
    root = stdlib_root()
    files = sorted(p for p in root.rglob("*.py")
                   if not {"site-packages", "dist-packages"} & set(p.relative_to(root).parts))
    if not files:
        raise DataError(f"data=stdlib: no .py files under {root}")
    if max_bytes is not None:
        files = sorted(files, key=lambda p: _key_hash("subset:" + str(p.relative_to(root))))
    docs, n = [], 0
    for p in files:
        if max_bytes is not None and n >= max_bytes:
            break
        text = p.read_text(encoding="utf-8", errors="replace")
        docs.append((str(p.relative_to(root)), text))
        n += len(text.encode("utf-8"))
    return sorted(docs)


def expand_globs(patterns: list[str]) -> list[Path]:
    out: list[Path] = []
    for pat in patterns:
        hits = sorted(glob.glob(os.path.expanduser(pat), recursive=True))
        hits = [h for h in hits if os.path.isfile(h)]
        if not hits:
            raise DataError(f"data.paths: no file matches {pat!r}")
        out.extend(Path(h) for h in hits)
    return sorted(set(out))


def file_docs(paths: list[Path], text_field: str) -> list[Doc]:
    """.jsonl: one object per line; .json: a list of objects or strings; else the whole file."""
    docs: list[Doc] = []

    def text_of(rec: object, where: str) -> str:
        if isinstance(rec, str):
            return rec
        if isinstance(rec, dict) and isinstance(rec.get(text_field), str):
            return rec[text_field]
        raise DataError(f"{where}: no string field {text_field!r} (set data.text_field)")

    for p in paths:
        if p.suffix == ".jsonl":
            with open(p, encoding="utf-8") as f:
                for i, line in enumerate(f):
                    if line.strip():
                        try:
                            rec = json.loads(line)
                        except json.JSONDecodeError as e:
                            raise DataError(f"{p}:{i + 1}: invalid JSON ({e.msg})") from None
                        docs.append((f"{p}:{i}", text_of(rec, f"{p}:{i + 1}")))
        elif p.suffix == ".json":
            try:
                recs = json.loads(p.read_text(encoding="utf-8"))
            except json.JSONDecodeError as e:
                raise DataError(f"{p}: invalid JSON ({e.msg})") from None
            if not isinstance(recs, list):
                raise DataError(f"{p}: expected a JSON list of records")
            docs.extend((f"{p}:{i}", text_of(r, f"{p}[{i}]")) for i, r in enumerate(recs))
        else:
            docs.append((str(p), p.read_text(encoding="utf-8", errors="replace")))
    return docs


def hf_docs(dcfg: DataConfig) -> tuple[list[Doc], dict[str, str]]:
    """Stream a weighted mixture with `datasets` until `hf_max_bytes` of text."""
    try:
        import datasets
    except ImportError as e:  # pragma: no cover - datasets is a dependency
        raise DataError(f"data=hf needs the `datasets` package: {e}") from None
    streams = []
    for s in dcfg.hf_sources:
        try:
            ds = datasets.load_dataset(s.path, s.name, split=s.split, streaming=True,
                                       data_files=s.data_files)
        except Exception as e:  # datasets raises many types (missing, offline, auth)
            raise DataError(f"data.hf_sources: cannot stream {s.path!r} "
                            f"(name={s.name!r}, split={s.split!r}): "
                            f"{type(e).__name__}: {str(e).splitlines()[0][:200]}") from None
        field_ = s.field
        # one common schema, so sources with different columns can be interleaved
        ds = ds.map(lambda ex, f=field_: {"__text": ex[f]}, remove_columns=None)
        ds = ds.select_columns(["__text"])
        streams.append(ds)
    total = sum(s.weight for s in dcfg.hf_sources)
    probs = [s.weight / total for s in dcfg.hf_sources]
    # The mixture's order is fixed (seed 0), independent of the training seed, so every seed
    # trains on the same corpus and only the order of chunks differs.
    mix = streams[0] if len(streams) == 1 else datasets.interleave_datasets(
        streams, probabilities=probs, seed=0, stopping_strategy="first_exhausted")
    docs: list[Doc] = []
    nbytes = 0
    for i, ex in enumerate(mix):
        text = ex["__text"]
        if not isinstance(text, str):
            raise DataError(f"data=hf: record {i} has a non-string text field")
        docs.append((f"hf:{i}", text))
        nbytes += len(text.encode("utf-8"))
        if nbytes >= dcfg.hf_max_bytes:
            break
    name = "hf:" + "+".join(f"{s.path}/{s.name or ''}/{s.split}@{s.weight:g}"
                            for s in dcfg.hf_sources)
    return docs, {name: corpus_checksum(t for _, t in docs)}


def load_documents(dcfg: DataConfig) -> tuple[list[Doc], list[Doc], dict[str, str]]:
    """(train docs, val docs, data checksums) of a text source."""
    if dcfg.source == "stdlib":
        docs = stdlib_docs(dcfg.max_bytes)  # the same subset as the cap below, fewer reads
        checksums = {f"stdlib:{stdlib_root()}": corpus_checksum(k + "\0" + t for k, t in docs)}
    elif dcfg.source == "files":
        paths = expand_globs(dcfg.paths)
        docs = file_docs(paths, dcfg.text_field)
        checksums = {str(p): sha256_file(p) for p in paths}
    elif dcfg.source == "hf":
        docs, checksums = hf_docs(dcfg)
    else:
        raise DataError(f"load_documents: {dcfg.source!r} is not a text source")
    docs = [d for d in docs if d[1]]
    if dcfg.max_bytes is not None:
        # a pseudo-random but fixed subset: documents in hash order until the cap
        kept, n = [], 0
        for d in sorted(docs, key=lambda d: _key_hash("subset:" + d[0])):
            if n >= dcfg.max_bytes:
                break
            kept.append(d)
            n += len(d[1].encode("utf-8"))
        docs = sorted(kept)
    val = [d for d in docs if _key_hash(d[0]) < dcfg.val_fraction]
    if not val and len(docs) > 1:  # tiny corpora: still hold out one document
        val = [min(docs, key=lambda d: _key_hash(d[0]))]
    vkeys = {k for k, _ in val}
    train = [d for d in docs if d[0] not in vkeys]
    if not train or not val:
        raise DataError(f"data={dcfg.source}: {len(docs)} document(s); need at least one for "
                        "training and one for validation")
    return train, val, checksums


# ---------------------------------------------------------------- datasets
class PackedData:
    """Chunks of seq_len + 1 tokens of one token stream, read in a seeded per-epoch order."""

    def __init__(self, tokens: np.ndarray, seq_len: int, seed: int) -> None:
        self.tokens = tokens
        self.seq_len = seq_len
        self.seed = seed
        self.n = (len(tokens) - 1) // seq_len
        if self.n < 1:
            raise DataError(f"training stream has {len(tokens)} tokens; need > seq_len={seq_len}")
        self._perm: tuple[int, np.ndarray] | None = None

    def _order(self, epoch: int) -> np.ndarray:
        if self._perm is None or self._perm[0] != epoch:
            self._perm = (epoch, np.random.default_rng([self.seed, epoch]).permutation(self.n))
        return self._perm[1]

    def chunk(self, i: int) -> np.ndarray:
        return self.tokens[i * self.seq_len: i * self.seq_len + self.seq_len + 1]

    def get(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples start .. start+count-1 of the seeded infinite stream -> x, y (count, T)."""
        rows = [self.chunk(int(self._order(g // self.n)[g % self.n]))
                for g in range(start, start + count)]
        a = torch.from_numpy(np.stack(rows).astype(np.int64))
        return a[:, :-1], a[:, 1:]


class SyntheticData:
    """The paper's §4.1 sequences: sample g is drawn from its own seeded RNG (random access)."""

    def __init__(self, seed: int, split: str) -> None:
        from experiments import synthetic_data as sd

        self.sd = sd
        self.seed = seed
        self.split = split
        self.seq_len = sd.SEQ_LEN - 1
        self.n = None

    def example(self, g: int) -> list[int]:
        text, _ = self.sd.make_example(random.Random(f"synthetic:{self.split}:{self.seed}:{g}"))
        return self.sd.encode(text)

    def get(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        a = torch.tensor([self.example(g) for g in range(start, start + count)],
                         dtype=torch.long)
        return a[:, :-1], a[:, 1:]


@dataclass
class Corpus:
    tokenizer: TextTokenizer
    train: PackedData | SyntheticData
    val_x: torch.Tensor  # (N, T) fixed validation inputs
    val_y: torch.Tensor  # (N, T) targets
    token_bytes: torch.Tensor  # (V,) UTF-8 bytes per token id, for bits per byte
    checksums: dict[str, str] = field(default_factory=dict)
    info: dict[str, int] = field(default_factory=dict)

    def val_batches(self, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for s in range(0, len(self.val_x), batch_size):
            yield self.val_x[s:s + batch_size], self.val_y[s:s + batch_size]


def _stream(tok: TextTokenizer, docs: list[Doc], batch: int = 64) -> np.ndarray:
    eos = tok.eos_id
    dtype = np.uint16 if tok.vocab_size <= 1 << 16 else np.int32
    parts = []
    # batches: tokenizers' Encoding objects (offsets, strings) cost ~100x the ids they hold
    for s in range(0, len(docs), batch):
        for seq in tok.encode_batch([t for _, t in docs[s:s + batch]]):
            parts.append(np.asarray(seq, dtype=dtype))
            parts.append(np.asarray([eos], dtype=dtype))
    return np.concatenate(parts)


def build_corpus(dcfg: DataConfig, *, vocab_size: int, seq_len: int, seed: int,
                 cache_dir: str | os.PathLike) -> Corpus:
    """Everything training needs from the data section (tokenizer, train stream, fixed val)."""
    if dcfg.source == "synthetic":
        from experiments import synthetic_data as sd

        tok = CharTokenizer(sd.ALPHABET, name="synthetic")
        train = SyntheticData(seed, "train")
        val = SyntheticData(0, "val")  # the same validation set for every seed
        n_val = max(1, dcfg.val_tokens // val.seq_len)
        vx, vy = val.get(0, n_val)
        src = Path(sd.__file__).read_bytes()
        return Corpus(tok, train, vx, vy, torch.tensor(tok.token_bytes()),
                      {"synthetic_data.py": hashlib.sha256(src).hexdigest()},
                      {"val_sequences": n_val})
    train_docs, val_docs, checksums = load_documents(dcfg)
    tok = BPETokenizer(train_bpe([t for _, t in train_docs], vocab_size, cache_dir=cache_dir),
                       name=f"bpe{vocab_size}-{dcfg.source}")
    key = hashlib.sha256(json.dumps([sorted(checksums.items()), tok.tok.to_str(),
                                     dcfg.val_fraction, dcfg.max_bytes]).encode()).hexdigest()[:16]
    cpath = Path(cache_dir) / "corpora" / f"{dcfg.source}-{key}.npz"
    if cpath.is_file():
        z = np.load(cpath)
        tr, va = z["train"], z["val"]
    else:
        tr, va = _stream(tok, train_docs), _stream(tok, val_docs)
        atomic_write(cpath, lambda f: np.savez(f, train=tr, val=va))
    n_val = min(dcfg.val_tokens, len(va) - 1) // seq_len
    if n_val < 1:
        raise DataError(f"validation split has {len(va)} tokens; need more than "
                        f"seq_len={seq_len} (raise data.val_fraction or use more data)")
    v = torch.from_numpy(va[: n_val * seq_len + 1].astype(np.int64))
    vx = v[:-1].view(n_val, seq_len)
    vy = v[1:].reshape(n_val, seq_len)
    info = {"train_docs": len(train_docs), "val_docs": len(val_docs),
            "train_tokens": int(len(tr)), "val_tokens_available": int(len(va)),
            "val_sequences": n_val}
    return Corpus(tok, PackedData(tr, seq_len, seed), vx, vy,
                  torch.tensor(tok.token_bytes(), dtype=torch.long), checksums, info)
