"""Document sources: (key, text) documents from the stdlib, local files or HF datasets.

Moved here from experiments/train/data.py (which re-exports them) so that corpus build workers
read documents without importing torch. The rules are unchanged:
- every source yields (key, text) documents; a document goes to validation iff a hash of its key
  falls under `val_fraction` (by file for stdlib and text files, by record for jsonl/parquet/hf),
  so the split does not depend on listing order, on the seed or on the number of workers;
- `load_documents` materialises a corpus (small or capped corpora); the `iter_*` readers stream.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.io import sha256_file

if TYPE_CHECKING:  # the config imports torch through model/; workers do not need it
    from experiments.corpus.config import DataConfig


class DataError(ValueError):
    """A data source that cannot be read (missing file, bad record, empty split)."""


Doc = tuple[str, str]  # (key, text)


def corpus_checksum_update(h: Any, text: str) -> None:
    """One document into a running `corpus_checksum` (length-prefixed, so boundaries count)."""
    b = text.encode("utf-8", errors="surrogatepass")
    h.update(len(b).to_bytes(8, "little"))
    h.update(b)


def key_hash(key: str) -> float:
    """A document's position in [0, 1): the split and the capped subset are decided by it."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2.0**64


_key_hash = key_hash  # the old private name


def is_val(key: str, val_fraction: float) -> bool:
    return key_hash(key) < val_fraction


# ---------------------------------------------------------------- stdlib
def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files() -> list[Path]:
    """The interpreter's standard-library .py files (no site-packages), sorted."""
    root = stdlib_root()
    files = sorted(p for p in root.rglob("*.py")
                   if not {"site-packages", "dist-packages"} & set(p.relative_to(root).parts))
    if not files:
        raise DataError(f"data=stdlib: no .py files under {root}")
    return files


def read_stdlib(rel: str) -> str:
    return (stdlib_root() / rel).read_text(encoding="utf-8", errors="replace")


def stdlib_docs(max_bytes: int | None = None) -> list[Doc]:
    """The running interpreter's own standard-library .py files (no site-packages).

    With max_bytes, only the files of the capped subset (see `load_documents`) are read."""
    root = stdlib_root()
    files = stdlib_files()
    if max_bytes is not None:
        files = sorted(files, key=lambda p: key_hash("subset:" + str(p.relative_to(root))))
    docs, n = [], 0
    for p in files:
        if max_bytes is not None and n >= max_bytes:
            break
        text = p.read_text(encoding="utf-8", errors="replace")
        docs.append((str(p.relative_to(root)), text))
        n += len(text.encode("utf-8"))
    return sorted(docs)


# ---------------------------------------------------------------- local files
FILE_SUFFIXES = (".txt", ".jsonl", ".json", ".parquet")


def expand_globs(patterns: list[str]) -> list[Path]:
    out: list[Path] = []
    for pat in patterns:
        hits = sorted(glob.glob(os.path.expanduser(pat), recursive=True))
        hits = [h for h in hits if os.path.isfile(h)]
        if not hits:
            raise DataError(f"data.paths: no file matches {pat!r}")
        out.extend(Path(h) for h in hits)
    return sorted(set(out))


def iter_file_docs(p: Path, text_field: str) -> Iterator[Doc]:
    """.jsonl: one object per line; .json: a list of objects or strings; .parquet: one row per
    document (column `text_field`); else the whole file is one document."""

    def text_of(rec: object, where: str) -> str:
        if isinstance(rec, str):
            return rec
        if isinstance(rec, dict) and isinstance(rec.get(text_field), str):
            return rec[text_field]
        raise DataError(f"{where}: no string field {text_field!r} (set data.text_field)")

    if p.suffix == ".jsonl":
        with open(p, encoding="utf-8") as f:
            for i, line in enumerate(f):
                if line.strip():
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise DataError(f"{p}:{i + 1}: invalid JSON ({e.msg})") from None
                    yield f"{p}:{i}", text_of(rec, f"{p}:{i + 1}")
    elif p.suffix == ".json":
        try:
            recs = json.loads(p.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise DataError(f"{p}: invalid JSON ({e.msg})") from None
        if not isinstance(recs, list):
            raise DataError(f"{p}: expected a JSON list of records")
        for i, r in enumerate(recs):
            yield f"{p}:{i}", text_of(r, f"{p}[{i}]")
    elif p.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(p)
        except Exception as e:  # pyarrow raises ArrowInvalid, OSError, ...
            raise DataError(f"{p}: not a readable parquet file ({type(e).__name__})") from None
        if text_field not in pf.schema_arrow.names:
            raise DataError(f"{p}: no column {text_field!r} (columns: "
                            f"{pf.schema_arrow.names[:8]}; set data.text_field)")
        i = 0
        for batch in pf.iter_batches(columns=[text_field], batch_size=1024):
            for t in batch.column(0).to_pylist():
                if not isinstance(t, str):
                    raise DataError(f"{p}: row {i}: {text_field!r} is not a string")
                yield f"{p}:{i}", t
                i += 1
    else:
        yield str(p), p.read_text(encoding="utf-8", errors="replace")


def file_docs(paths: list[Path], text_field: str) -> list[Doc]:
    return [d for p in paths for d in iter_file_docs(p, text_field)]


# ---------------------------------------------------------------- HF datasets
def hf_name(dcfg: DataConfig) -> str:
    return "hf:" + "+".join(f"{s.path}/{s.name or ''}/{s.split}@{s.weight:g}"
                            for s in dcfg.hf_sources)


def iter_hf_docs(dcfg: DataConfig) -> Iterator[Doc]:
    """Stream a weighted mixture with `datasets` until `hf_max_bytes` of text (None: until the
    first source is exhausted)."""
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
        streams.append((s, ds))
    total = sum(s.weight for s in dcfg.hf_sources)
    probs = [s.weight / total for s in dcfg.hf_sources]
    # The mixture's order is fixed (seed 0), independent of the training seed, so every seed
    # trains on the same corpus and only the order of chunks differs.
    mix = streams[0][1] if len(streams) == 1 else datasets.interleave_datasets(
        [d for _, d in streams], probabilities=probs, seed=0, stopping_strategy="first_exhausted")
    nbytes = 0
    it = iter(mix)
    i = 0
    while True:
        try:
            ex = next(it)
        except StopIteration:
            return
        except KeyError as e:  # the field is missing from a record
            raise DataError(f"data.hf_sources: a record has no field {e.args[0]!r} "
                            "(set field: in its hf_sources entry)") from None
        except Exception as e:  # a file that cannot be read mid-stream
            raise DataError(f"data=hf: record {i}: {type(e).__name__}: "
                            f"{str(e).splitlines()[0][:200] if str(e) else ''}") from None
        text = ex["__text"]
        if not isinstance(text, str):
            raise DataError(f"data=hf: record {i} has a non-string text field")
        yield f"hf:{i}", text
        nbytes += len(text.encode("utf-8"))
        i += 1
        if dcfg.hf_max_bytes is not None and nbytes >= dcfg.hf_max_bytes:
            return


def hf_docs(dcfg: DataConfig) -> tuple[list[Doc], dict[str, str]]:
    docs = list(iter_hf_docs(dcfg))
    h = hashlib.sha256()
    for _, t in docs:
        corpus_checksum_update(h, t)
    return docs, {hf_name(dcfg): h.hexdigest()}


# ---------------------------------------------------------------- materialised (small corpora)
def load_documents(dcfg: DataConfig) -> tuple[list[Doc], list[Doc], dict[str, str]]:
    """(train docs, val docs, data checksums) of a text source, held in memory."""
    if dcfg.source == "stdlib":
        docs = stdlib_docs(dcfg.max_bytes)  # the same subset as the cap below, fewer reads
        h = hashlib.sha256()
        for k, t in docs:
            corpus_checksum_update(h, k + "\0" + t)
        checksums = {f"stdlib:{stdlib_root()}": h.hexdigest()}
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
        for d in sorted(docs, key=lambda d: key_hash("subset:" + d[0])):
            if n >= dcfg.max_bytes:
                break
            kept.append(d)
            n += len(d[1].encode("utf-8"))
        docs = sorted(kept)
    val = [d for d in docs if is_val(d[0], dcfg.val_fraction)]
    if not val and len(docs) > 1:  # tiny corpora: still hold out one document
        val = [min(docs, key=lambda d: key_hash(d[0]))]
    vkeys = {k for k, _ in val}
    train = [d for d in docs if d[0] not in vkeys]
    if not train or not val:
        raise DataError(f"data={dcfg.source}: {len(docs)} document(s); need at least one for "
                        "training and one for validation")
    return train, val, checksums
