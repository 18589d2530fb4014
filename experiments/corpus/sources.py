"""Document sources: (key, text) documents from the stdlib, local files or HF datasets, without
torch. A document goes to validation iff a hash of its key falls under `val_fraction`, so the
split depends on no listing order, seed or worker count. build.scan walks them (the one walker).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import sysconfig
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.errors import UsageError

if TYPE_CHECKING:  # the config imports torch through model/; workers do not need it
    from experiments.corpus.config import DataConfig


Doc = tuple[str, str]  # (key, text)


def corpus_checksum_update(h: Any, text: str) -> None:
    """One document into a running `corpus_checksum` (length-prefixed, so boundaries count)."""
    b = text.encode("utf-8", errors="surrogatepass")
    h.update(len(b).to_bytes(8, "little"))
    h.update(b)


def key_hash(key: str) -> float:
    """A document's position in [0, 1): the split and the capped subset are decided by it."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2.0**64


def is_val(key: str, val_fraction: float) -> bool:
    return key_hash(key) < val_fraction


# ---------------------------------------------------------------- stdlib
def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files() -> list[Path]:
    """The interpreter's standard-library .py files (no site-packages), sorted."""
    root = stdlib_root()
    files = []
    for d, dirs, names in os.walk(root):
        # pruned, not filtered: site-packages holds most of the tree (a full walk took seconds)
        dirs[:] = [x for x in dirs if x not in ("site-packages", "dist-packages")]
        files += [Path(d) / n for n in names if n.endswith(".py")]
    files.sort()
    if not files:
        raise UsageError(f"data=stdlib: no .py files under {root}")
    return files


def read_stdlib(rel: str) -> str:
    return (stdlib_root() / rel).read_text(encoding="utf-8", errors="replace")


def stdlib_docs(max_bytes: int | None = None) -> list[Doc]:
    """The running interpreter's own standard-library .py files (no site-packages); with
    max_bytes, only the capped subset's."""
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
def expand_globs(patterns: list[str]) -> list[Path]:
    out: list[Path] = []
    for pat in patterns:
        hits = sorted(glob.glob(os.path.expanduser(pat), recursive=True))
        hits = [h for h in hits if os.path.isfile(h)]
        if not hits:
            raise UsageError(f"data.paths: no file matches {pat!r}")
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
        raise UsageError(f"{where}: no string field {text_field!r} (set data.text_field)")

    if p.suffix == ".jsonl":
        with open(p, encoding="utf-8") as f:
            for i, line in enumerate(f):
                if line.strip():
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise UsageError(f"{p}:{i + 1}: invalid JSON ({e.msg})") from None
                    yield f"{p}:{i}", text_of(rec, f"{p}:{i + 1}")
    elif p.suffix == ".json":
        try:
            recs = json.loads(p.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise UsageError(f"{p}: invalid JSON ({e.msg})") from None
        if not isinstance(recs, list):
            raise UsageError(f"{p}: expected a JSON list of records")
        for i, r in enumerate(recs):
            yield f"{p}:{i}", text_of(r, f"{p}[{i}]")
    elif p.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(p)
        except Exception as e:  # pyarrow raises ArrowInvalid, OSError, ...
            raise UsageError(f"{p}: not a readable parquet file ({type(e).__name__})") from None
        if text_field not in pf.schema_arrow.names:
            raise UsageError(f"{p}: no column {text_field!r} (columns: "
                            f"{pf.schema_arrow.names[:8]}; set data.text_field)")
        i = 0
        for batch in pf.iter_batches(columns=[text_field], batch_size=1024):
            for t in batch.column(0).to_pylist():
                if not isinstance(t, str):
                    raise UsageError(f"{p}: row {i}: {text_field!r} is not a string")
                yield f"{p}:{i}", t
                i += 1
    else:
        yield str(p), p.read_text(encoding="utf-8", errors="replace")


# ---------------------------------------------------------------- HF datasets
def hf_name(dcfg: DataConfig) -> str:
    return "hf:" + "+".join(f"{s.path}/{s.name or ''}/{s.split}@{s.weight:g}"
                            for s in dcfg.hf_sources)


def open_hf_source(s: Any) -> Any:
    """One source of the mixture as a `datasets` streaming dataset of one column, `__text`
    (a fresh stream: a new pass starts here). Tests replace this with local files."""
    try:
        import datasets
    except ImportError as e:  # pragma: no cover - datasets is a dependency
        raise UsageError(f"data=hf needs the `datasets` package: {e}") from None
    try:
        ds = datasets.load_dataset(s.path, s.name, split=s.split, streaming=True,
                                   data_files=s.data_files)
    except Exception as e:  # datasets raises many types (missing, offline, auth)
        raise UsageError(f"data.hf_sources: cannot stream {s.path!r} "
                        f"(name={s.name!r}, split={s.split!r}): "
                        f"{type(e).__name__}: {str(e).splitlines()[0][:200]}") from None
    # one column, so that every source reads the same way whatever its field is called
    return ds.map(lambda ex, f=s.field: {"__text": ex[f]}).select_columns(["__text"])


def source_label(s: Any) -> str:
    return f"{s.path}" + (f" ({s.name})" if s.name else "")


class HFMixture:
    """The `hf` stream: the sources interleaved by text bytes, with explicit passes, resumable.
    Not `datasets.interleave_datasets`, which samples documents (not bytes) and either ends at
    the first exhausted source or oversamples without bound. The next document comes from the
    unfinished source whose bytes so far over its weight are smallest; a source repeats while it
    has passes left, then ends the mixture (data.hf_max_bytes null) or stops it with a
    UsageError; `state()` resumes it. A document's key is its index within its source's pass."""

    def __init__(self, dcfg: DataConfig, state: dict[str, Any] | None = None,
                 open_source: Any = None) -> None:
        self.dcfg = dcfg
        self.sources = list(dcfg.hf_sources)
        self.open_source = open_source or open_hf_source
        total = sum(s.weight for s in self.sources)
        self.shares = [s.weight / total for s in self.sources]
        self.st: dict[str, Any] = state or {
            "records": 0, "bytes": 0,
            "sources": [{"pass": 0, "index": 0, "bytes": 0, "documents": 0,
                         "pass_documents": [], "done": False, "stream": None}
                        for _ in self.sources]}
        self._streams: list[Any] = [None] * len(self.sources)
        self._iters: list[Any] = [None] * len(self.sources)

    def state(self) -> dict[str, Any]:
        """The position after the last document yielded (JSON): per source its pass, index,
        bytes, documents and the `datasets` stream state."""
        for k, ds in enumerate(self._streams):
            if ds is not None and hasattr(ds, "state_dict"):
                self.st["sources"][k]["stream"] = ds.state_dict()
        return json.loads(json.dumps(self.st))

    def summary(self) -> list[dict[str, Any]]:
        """Per source: what the stream took from it (the manifest's `mixture`)."""
        out = []
        for s, share, ss in zip(self.sources, self.shares, self.st["sources"], strict=True):
            full = ss["pass_documents"]
            passes = (len(full) + ss["index"] / full[0]) if full else None
            out.append({"path": s.path, "name": s.name, "split": s.split, "weight": s.weight,
                        "share": share, "passes_allowed": s.passes, "documents": ss["documents"],
                        "bytes": ss["bytes"], "passes_completed": len(full),
                        "pass_documents": full,
                        "passes": passes,
                        "passes_note": None if full else "under one pass (the source's size "
                        "is known only after a whole pass)"})
        return out

    def _open(self, k: int) -> None:
        ds = self.open_source(self.sources[k])
        saved = self.st["sources"][k]["stream"]
        if saved is not None:
            if hasattr(ds, "load_state_dict"):
                ds.load_state_dict(saved)
            else:  # a stream without resumable state: skip what the pass already gave
                ds = ds.skip(self.st["sources"][k]["index"])
        self._streams[k], self._iters[k] = ds, iter(ds)

    def _next_of(self, k: int) -> str | None:
        """The next text of source k (a new pass when its stream ends and passes are left);
        None when it has finished its passes."""
        ss, s = self.st["sources"][k], self.sources[k]
        while True:
            if self._iters[k] is None:
                self._open(k)
            try:
                ex = next(self._iters[k])
            except StopIteration:
                if ss["index"] == 0:
                    raise UsageError(f"data.hf_sources: {source_label(s)} holds no document"
                                    ) from None
                ss["pass_documents"].append(ss["index"])
                ss["pass"] += 1
                ss["index"] = 0
                ss["stream"] = None
                self._streams[k] = self._iters[k] = None
                if ss["pass"] >= s.passes:
                    ss["done"] = True
                    return None
                continue
            except KeyError as e:  # the field is missing from a record
                raise UsageError(f"data.hf_sources: a record of {source_label(s)} has no field "
                                f"{e.args[0]!r} (set field: in its hf_sources entry)") from None
            except UsageError:
                raise
            except Exception as e:  # a file that cannot be read mid-stream, the network
                raise UsageError(f"data=hf: {source_label(s)}, pass {ss['pass'] + 1}, record "
                                f"{ss['index']}: {type(e).__name__}: "
                                f"{str(e).splitlines()[0][:200] if str(e) else ''} (what was "
                                "streamed is kept: re-run the same command to continue)"
                                ) from None
            text = ex["__text"]
            if not isinstance(text, str):
                raise UsageError(f"data=hf: {source_label(s)} record {ss['index']} has a "
                                "non-string text field")
            return text

    def __iter__(self) -> Iterator[Doc]:
        cap = self.dcfg.hf_max_bytes
        multi = len(self.sources) > 1
        srcs = self.st["sources"]
        while cap is None or self.st["bytes"] < cap:
            live = [k for k in range(len(self.sources)) if not srcs[k]["done"]]
            if len(live) < len(self.sources):
                k = next(k for k in range(len(self.sources)) if srcs[k]["done"])
                if cap is None:
                    return  # null: the first source to finish its passes ends the stream
                s, ss = self.sources[k], srcs[k]
                raise UsageError(
                    f"data.hf_sources: {source_label(s)} ran out after {ss['pass']} pass(es) "
                    f"({ss['documents']:,} documents, {ss['bytes']:,} bytes) at "
                    f"{self.st['bytes']:,} of data.hf_max_bytes={cap:,}; give it passes: "
                    f"{ss['pass'] + 1} or more (experiments/corpus/budget.py SOURCE_SIZES "
                    "holds the sizes the plan used), or lower its weight or hf_max_bytes; what "
                    "was streamed is kept")
            k = min(live, key=lambda k: (srcs[k]["bytes"] / self.shares[k], k))
            text = self._next_of(k)
            if text is None:
                continue
            ss = srcs[k]
            key = f"hf:{k}:{ss['index']}" if multi else f"hf:{ss['index']}"
            nb = len(text.encode("utf-8"))
            ss["index"] += 1
            ss["documents"] += 1
            ss["bytes"] += nb
            self.st["bytes"] += nb
            self.st["records"] += 1
            yield key, text


# ---------------------------------------------------------------- the capped subset
def capped(docs: Iterable[Doc], max_bytes: int) -> list[Doc]:
    """data.max_bytes: a pseudo-random but fixed subset, the non-empty documents in hash order
    until the cap, sorted by key."""
    kept, n = [], 0
    for d in sorted((d for d in docs if d[1]), key=lambda d: key_hash("subset:" + d[0])):
        if n >= max_bytes:
            break
        kept.append(d)
        n += len(d[1].encode("utf-8"))
    return sorted(kept)
