"""source -> tokenizer -> shards, once, in parallel, resumable (docs/DATA.md, "What `make
corpus` does"). The corpus is cut into units fixed by the source alone, never by the number of
workers; unit u becomes `train-NNNNN.bin` and `val-NNNNN.bin`. Phases: `scan` (bad input found
before any shard exists), the tokenizer, the units (each unit's record written after its
shards, so a killed build resumes with the same bytes), and `corpus.json` written atomically
last: its presence means the corpus is complete.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from common.errors import UsageError
from common.io import (
    atomic_write,
    atomic_write_json,
    atomic_write_text,
    flocked,
    sha256_file,
    unwritable,
)

from .sources import (
    Doc,
    HFMixture,
    capped,
    corpus_checksum_update,
    expand_globs,
    hf_name,
    is_val,
    iter_file_docs,
    key_hash,
    read_stdlib,
    stdlib_docs,
    stdlib_files,
    stdlib_root,
)

if TYPE_CHECKING:
    from experiments.corpus.config import DataConfig

FORMAT = 1  # bump when the shard layout or the recipe changes
MANIFEST = "corpus.json"
PLAN = "plan.json"
TOKENIZER = "tokenizer.json"
LOCK = ".build.lock"
SCAN_STATE = "text/scan.json"
MIXTURE_RULE = "by text bytes, explicit passes (HFMixture, v1)"
"""In the request of every multi-source hf corpus: their order is HFMixture's, not the
document-sampling interleave of earlier builds (so an old build is never taken for a new one)."""
SPLIT_RULE = ("a document is held out iff sha256(key)[:8] / 2^64 < val_fraction; when no document "
              "is, the one of lowest hash is (tiny corpora)")
_ENCODE_BATCH_BYTES = 1 << 20  # text per encode_batch call: amortises the call, bounds memory


def dtype_for(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def request_of(dcfg: DataConfig, vocab_size: int | None) -> dict[str, Any]:
    """What decides the corpus' bytes (the plan of an existing build must match it)."""
    d = {k: v for k, v in json.loads(json.dumps(asdict(dcfg))).items()  # choices as strings
         if k not in ("corpus", "max_epochs", "val_tokens")}
    for src in d.get("hf_sources") or []:
        # a cap on the passes decides only whether the build completes, not its bytes: a
        # re-run with more passes continues the same corpus
        src.pop("passes", None)
    if len(d.get("hf_sources") or []) > 1:
        d["mixture"] = MIXTURE_RULE  # the documents' order of a mixture (HFMixture)
    tok = d.pop("tokenizer", None)
    if tok and not Path(tok).expanduser().is_file():
        raise UsageError(f"data.tokenizer={tok!r}: no such file")
    tok = tok and str(Path(tok).expanduser())
    return {"format": FORMAT, "data": d,
            "tokenizer": {"file_sha256": sha256_file(tok), "path": str(tok)} if tok
            else {"train_vocab_size": vocab_size}}


# ---------------------------------------------------------------- units
@dataclass(frozen=True)
class Unit:
    index: int
    kind: str  # "stdlib" (paths relative to the stdlib root) | "file" | "part" (in the build dir)
    items: tuple[str, ...]
    bytes: int


def unit_docs(out: Path, unit: Unit, text_field: str) -> Iterator[Doc]:
    if unit.kind == "stdlib":
        for rel in unit.items:
            yield rel, read_stdlib(rel)
    elif unit.kind == "file":
        for p in unit.items:
            yield from iter_file_docs(Path(p), text_field)
    else:
        for p in unit.items:
            with open(out / p, encoding="utf-8") as f:
                for line in f:
                    r = json.loads(line)
                    yield r["k"], r["t"]


def _group(items: list[tuple[str, int]], kind: str, shard_bytes: int) -> list[Unit]:
    units: list[Unit] = []
    cur: list[str] = []
    n = 0
    for name, size in items:
        cur.append(name)
        n += size
        if n >= shard_bytes:
            units.append(Unit(len(units), kind, tuple(cur), n))
            cur, n = [], 0
    if cur:
        units.append(Unit(len(units), kind, tuple(cur), n))
    return units


# ---------------------------------------------------------------- scan
@dataclass
class Scan:
    units: list[Unit]
    checksums: dict[str, str]
    documents: int = 0
    val_documents: int = 0
    bytes: int = 0
    forced_val: list[str] = field(default_factory=list)
    sample: list[str] = field(default_factory=list)  # the tokenizer's training texts, in order
    sample_bytes: int = 0
    sample_documents: int = 0
    mixture: list[dict[str, Any]] | None = None  # hf: what the stream took from each source


class _Sample:
    """The training documents of lowest sample hash, up to `cap` bytes, kept in stream order."""

    def __init__(self, cap: int | None) -> None:
        self.cap = cap
        self.heap: list[tuple[float, int, str, str]] = []  # (-hash, position, key, text)
        self.bytes = 0
        self.evicted = False
        self.keys: set[str] = set()  # a source's second pass repeats keys: sample each once

    def add(self, pos: int, key: str, text: str) -> None:
        if self.cap is None or key in self.keys:
            return
        self.keys.add(key)
        heapq.heappush(self.heap, (-key_hash("tokenizer-sample:" + key), pos, key, text))
        self.bytes += len(text.encode("utf-8"))
        while self.bytes > self.cap and len(self.heap) > 1:
            _, _, k, t = heapq.heappop(self.heap)
            self.keys.discard(k)  # evicted: a repeat has the same hash, so it is evicted too
            self.bytes -= len(t.encode("utf-8"))
            self.evicted = True

    def texts(self, drop: set[str]) -> list[str]:
        return [t for _, _, k, t in sorted(self.heap, key=lambda e: e[1]) if k not in drop]


def scan(dcfg: DataConfig, out: Path, *, sample_cap: int | None, progress: bool = False,
         request: dict[str, Any] | None = None) -> Scan:
    """Phase 1 (see the module docstring). Raises UsageError on bad input. A hub stream is
    resumable: after each text part it records its position (`text/scan.json`); a re-run reads
    the kept parts back and continues the stream (docs/DATA.md, "Scan")."""
    text_parts = dcfg.source == "hf" or dcfg.max_bytes is not None
    checksums: dict[str, str] = {}
    mixture: HFMixture | None = None
    kept: list[Unit] = []
    units: list[Unit] = []
    if dcfg.source == "stdlib" and dcfg.max_bytes is not None:
        docs: Iterator[Doc] = iter(stdlib_docs(dcfg.max_bytes))  # reads only the subset's files
    elif dcfg.source == "stdlib":
        root = stdlib_root()
        # sorted by the key string, not by Path's part order
        files = sorted((str(p.relative_to(root)), p.stat().st_size) for p in stdlib_files())
        units = _group(files, "stdlib", dcfg.shard_bytes)
        docs = (d for u in units for d in unit_docs(out, u, dcfg.text_field))
    elif dcfg.source == "files":
        paths = expand_globs(dcfg.paths)
        units = _group([(str(p), p.stat().st_size) for p in paths], "file", dcfg.shard_bytes)
        docs = (d for u in units for d in unit_docs(out, u, dcfg.text_field))
        checksums = {str(p): sha256_file(p) for p in paths}
    elif dcfg.source == "hf" and dcfg.max_bytes is not None:
        docs = iter(HFMixture(dcfg))  # until hf_max_bytes, or a source's last pass
    elif dcfg.source == "hf":
        saved = read_scan_state(out)
        if saved is not None and saved["request"] != request:
            raise UsageError(f"{out} holds an unfinished scan of another corpus; give a new "
                             "output directory (or delete it)")
        if saved is not None:
            kept = [Unit(**u) for u in saved["units"]]
        mixture = HFMixture(dcfg, state=saved and saved["mixture"])
        docs = iter(mixture)
    else:
        raise UsageError(f"corpus: {dcfg.source!r} is not a text source")
    if text_parts:
        units = list(kept)  # the documents go to text parts in the build directory

    h = hashlib.sha256()  # stdlib and hf: over the documents in stream order
    sample = _Sample(sample_cap)
    s = Scan(units, checksums)
    min_key: tuple[float, str] | None = None
    part: list[str] = []
    part_bytes = 0
    bar = _bar(progress, None, "scan")

    def flush_part() -> None:
        nonlocal part, part_bytes
        rel = f"text/part-{len(units):05d}.jsonl"
        body = "".join(part).encode("utf-8")
        atomic_write(out / rel, lambda f: f.write(body))
        units.append(Unit(len(units), "part", (rel,), part_bytes))
        part, part_bytes = [], 0
        if mixture is not None:  # the position after this part: where a re-run continues
            atomic_write_json(out / SCAN_STATE, {"request": request,
                                                 "units": [asdict(u) for u in units],
                                                 "mixture": mixture.state()})

    def take(pos: int, key: str, text: str) -> int:
        """One document into the checksum, the counts, the split and the sample."""
        nonlocal min_key
        if not text:
            return 0
        nb = len(text.encode("utf-8"))
        s.documents += 1
        s.bytes += nb
        kh = key_hash(key)
        if min_key is None or (kh, key) < min_key:
            min_key = (kh, key)
        if kh < dcfg.val_fraction:
            s.val_documents += 1
        else:
            sample.add(pos, key, text)
        if bar is not None:
            bar.update(nb)
        return nb

    def summed(docs: Iterable[Doc]) -> Iterator[Doc]:
        """The documents, each into the stdlib's or the hub's checksum (empty ones too)."""
        for key, text in docs:
            if dcfg.source == "stdlib":
                corpus_checksum_update(h, key + "\0" + text)
            elif dcfg.source == "hf":
                corpus_checksum_update(h, text)
            yield key, text

    docs = summed(docs)
    if dcfg.max_bytes is not None:  # a capped subset: small by construction, in memory
        docs = iter(capped(docs, dcfg.max_bytes))
    pos = 0
    for u in kept:  # a resumed hub scan: what it streamed before, read back from disk
        for key, text in summed(unit_docs(out, u, dcfg.text_field)):
            take(pos, key, text)
            pos += 1
    for key, text in docs:
        nb = take(pos, key, text)
        pos += 1
        # hf parts keep empty documents too, so a resumed scan reads back every document
        if text_parts and (text or mixture is not None):
            part.append(json.dumps({"k": key, "t": text}, ensure_ascii=False) + "\n")
            part_bytes += nb
            if part_bytes >= dcfg.shard_bytes:
                flush_part()
    if bar is not None:
        bar.close()
    if text_parts and part:
        flush_part()
    if dcfg.source == "stdlib":
        s.checksums = {f"stdlib:{stdlib_root()}": h.hexdigest()}
    elif dcfg.source == "hf":
        s.checksums = {hf_name(dcfg): h.hexdigest()}
    if mixture is not None:
        s.mixture = mixture.summary()
    if s.documents == 0:
        raise UsageError(f"data={dcfg.source}: the source holds no (non-empty) document")
    if s.val_documents == 0 and s.documents > 1 and min_key is not None:
        s.forced_val = [min_key[1]]  # tiny corpora: still hold out one document
        s.val_documents = 1
    if s.val_documents == 0 or s.documents - s.val_documents == 0:
        raise UsageError(f"data={dcfg.source}: {s.documents} document(s); need at least one for "
                        "training and one for validation")
    s.sample = sample.texts(set(s.forced_val))
    s.sample_documents = len(s.sample)
    s.sample_bytes = sum(len(t.encode("utf-8")) for t in s.sample)
    return s


def read_scan_state(out: Path) -> dict[str, Any] | None:
    """The position a failed hub scan reached (`text/scan.json`), None when there is none."""
    p = out / SCAN_STATE
    return json.loads(p.read_text()) if p.is_file() else None


# ---------------------------------------------------------------- tokenizer
def make_tokenizer(dcfg: DataConfig, vocab_size: int | None, sample: list[str],
                   cache_dir: str | os.PathLike | None) -> tuple[str, int, dict[str, Any]]:
    """(tokenizer JSON, its vocabulary size, how it was made). Given by data.tokenizer, else a
    byte-level BPE trained on the sample (cached by the sample's checksum and the size, as
    train_bpe always did)."""
    from tokenizers import Tokenizer

    from .tokenizer import EOS, train_bpe

    if dcfg.tokenizer:
        p = Path(dcfg.tokenizer).expanduser()
        try:
            tok = Tokenizer.from_file(str(p))
        except Exception as e:  # tokenizers raises a bare Exception on a bad file
            raise UsageError(f"data.tokenizer={str(p)!r}: not a tokenizers JSON file "
                            f"({str(e).splitlines()[0][:120] if str(e) else type(e).__name__})"
                            ) from None
        if tok.token_to_id(EOS) is None:
            raise UsageError(f"data.tokenizer={str(p)!r}: has no {EOS} token (used as eos)")
        how = {"given": str(p), "given_sha256": sha256_file(p)}
    else:
        if vocab_size is None:
            raise UsageError("corpus: give a vocabulary size (--vocab-size) or data.tokenizer")
        try:
            tok = train_bpe(sample, vocab_size, cache_dir=cache_dir)
        except ValueError as e:
            raise UsageError(str(e)) from None
        how = {"trained": "byte-level BPE", "vocab_size_asked": vocab_size,
               "sample_documents": len(sample),
               "sample_bytes": sum(len(t.encode("utf-8")) for t in sample),
               "sample_cap_bytes": dcfg.tokenizer_sample_bytes,
               "sample_rule": "training documents of lowest sha256('tokenizer-sample:'+key) up "
                              "to the cap, in stream order"}
    return tok.to_str(), tok.get_vocab_size(with_added_tokens=True), how


# ---------------------------------------------------------------- units -> shards
def _load_tok(path: Path) -> Any:
    st = path.stat()  # a rebuilt directory may hold another tokenizer under the same path
    return _tok_at(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=1)  # a worker tokenizes every unit with the one tokenizer
def _tok_at(path: str, mtime_ns: int, size: int) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)


def _record_path(out: Path, u: int) -> Path:
    return out / "units" / f"unit-{u:05d}.json"


def unit_record_ok(out: Path, rec: dict[str, Any], itemsize: int) -> bool:
    for sp in ("train", "val"):
        p = out / rec[sp]["file"]
        if not p.is_file() or p.stat().st_size != rec[sp]["tokens"] * itemsize:
            return False
    return True


def build_unit(out: str, unit: dict[str, Any], text_field: str, val_fraction: float,
               forced_val: list[str], dtype: str) -> dict[str, Any]:
    """Tokenize one unit into its two shards; return its record (written last). Picklable, so
    it runs in a worker process or a SLURM task alike; a unit already done is returned as is."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one worker = one core
    outp = Path(out)
    u = Unit(unit["index"], unit["kind"], tuple(unit["items"]), unit["bytes"])
    dt = np.dtype(dtype)
    rp = _record_path(outp, u.index)
    if rp.is_file():
        rec = json.loads(rp.read_text())
        if unit_record_ok(outp, rec, dt.itemsize):
            return rec
    tok = _load_tok(outp / TOKENIZER)
    from .tokenizer import EOS

    eos = np.asarray([tok.token_to_id(EOS)], dtype=dt)
    forced = set(forced_val)
    files = {sp: outp / f"{sp}-{u.index:05d}.bin" for sp in ("train", "val")}
    tmps = {sp: files[sp].with_name(f".{files[sp].name}.{os.getpid()}.tmp") for sp in files}
    fh = {sp: open(tmps[sp], "wb") for sp in files}
    hs = {sp: hashlib.sha256() for sp in files}
    ntok = dict.fromkeys(files, 0)
    ndoc = dict.fromkeys(files, 0)
    nbytes = 0
    try:
        batch: list[tuple[str, str]] = []
        bb = 0

        # encode_batch_fast (tokenizers >= 0.20): the same ids without computing offsets
        encode = getattr(tok, "encode_batch_fast", tok.encode_batch)

        def flush() -> None:
            encs = encode([t for _, t in batch])
            for (k, _), e in zip(batch, encs, strict=True):
                sp = "val" if (k in forced or is_val(k, val_fraction)) else "train"
                ids = np.asarray(e.ids, dtype=dt)  # e.ids builds a new list on every access
                b = ids.tobytes() + eos.tobytes()
                fh[sp].write(b)
                hs[sp].update(b)
                ntok[sp] += len(ids) + 1
                ndoc[sp] += 1
            batch.clear()

        for k, t in unit_docs(outp, u, text_field):
            if not t:
                continue
            batch.append((k, t))
            n = len(t.encode("utf-8"))
            bb += n
            nbytes += n
            if bb >= _ENCODE_BATCH_BYTES:
                flush()
                bb = 0
        if batch:
            flush()
        for sp in files:
            fh[sp].flush()
            os.fsync(fh[sp].fileno())
            fh[sp].close()
            os.replace(tmps[sp], files[sp])
    finally:
        for sp in files:
            fh[sp].close()
            tmps[sp].unlink(missing_ok=True)
    rec = {"unit": u.index, "bytes": nbytes,
           **{sp: {"file": files[sp].name, "tokens": ntok[sp], "documents": ndoc[sp],
                   "sha256": hs[sp].hexdigest()} for sp in files}}
    atomic_write_json(rp, rec)
    return rec


# ---------------------------------------------------------------- the build
def _bar(progress: bool, total: int | None, desc: str) -> Any:
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1000, desc=desc,
                dynamic_ncols=True, file=sys.stderr)


def read_manifest(out: str | os.PathLike) -> dict[str, Any] | None:
    p = Path(out) / MANIFEST
    return json.loads(p.read_text()) if p.is_file() else None


class UnitRunner(Protocol):
    """Runs the tokenizing units somewhere else (sweeps.launcher's launchers: a local process
    pool, or a SLURM job array): `fn(*args)` for each argument tuple, results as they come."""

    def map(self, fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]], *,
            parallelism: int | None = None) -> Iterable[Any]: ...


def build(dcfg: DataConfig, out: str | os.PathLike, *, vocab_size: int | None,
          workers: int = 1, progress: bool = False,
          cache_dir: str | os.PathLike | None = None,
          runner: UnitRunner | None = None) -> dict[str, Any]:
    """Build (or finish, or return) the corpus in `out`; return its manifest. Units run through
    `runner` when given, else on `workers` processes. UsageError on bad input."""
    outp = Path(out).expanduser().resolve()
    req = request_of(dcfg, vocab_size)
    man = read_manifest(outp)
    if man is not None:
        if man["request"] != req:
            raise UsageError(f"{outp} holds another corpus (built from a different request); "
                            "give a new output directory")
        return man
    if (bad := unwritable(outp)) is not None:
        raise UsageError(f"corpus output {str(outp)!r}: {bad}")
    created = not outp.exists()
    outp.mkdir(parents=True, exist_ok=True)
    try:
        with flocked(outp / LOCK):  # one builder per directory; a killed one leaves no lock
            return _build_locked(dcfg, outp, req, vocab_size=vocab_size, workers=workers,
                                 progress=progress, cache_dir=cache_dir, runner=runner)
    except UsageError:
        # bad input: leave nothing behind; a hub scan that failed midway keeps what it
        # streamed (a re-run continues it)
        if created and not (outp / PLAN).exists() and not (outp / SCAN_STATE).exists():
            shutil.rmtree(outp, ignore_errors=True)
        raise


def _build_locked(dcfg: DataConfig, outp: Path, req: dict[str, Any], *, vocab_size: int | None,
                  workers: int, progress: bool, cache_dir: str | os.PathLike | None,
                  runner: UnitRunner | None) -> dict[str, Any]:
    man = read_manifest(outp)
    if man is not None:  # another builder finished it while we waited
        return man
    for tmp in outp.glob(".*.tmp"):  # left by a killed build (ours: the lock is held)
        tmp.unlink(missing_ok=True)
    plan_path = outp / PLAN
    plan = json.loads(plan_path.read_text()) if plan_path.is_file() else None
    if plan is not None and plan["request"] != req:
        raise UsageError(f"{outp} holds an unfinished build of another corpus; give a new "
                        "output directory (or delete it)")
    if plan is None:
        # an empty directory, or a scan killed before its plan: start the scan again
        other = [p.name for p in outp.iterdir() if p.name not in (LOCK, "text")]
        if other:
            raise UsageError(f"{outp} is not empty and holds no corpus build ({other[0]}, ...); "
                            "give a new or empty output directory")
        if read_scan_state(outp) is None:  # no hub scan to continue: start afresh
            shutil.rmtree(outp / "text", ignore_errors=True)
        t0 = time.time()
        try:
            s = scan(dcfg, outp, progress=progress, request=req,
                     sample_cap=None if dcfg.tokenizer else dcfg.tokenizer_sample_bytes)
            tok_json, vocab, how = make_tokenizer(dcfg, vocab_size, s.sample, cache_dir)
        except BaseException:
            if read_scan_state(outp) is None:  # nothing half-written
                shutil.rmtree(outp / "text", ignore_errors=True)
            raise
        atomic_write_text(outp / TOKENIZER, tok_json)
        plan = {"request": req, "units": [asdict(u) for u in s.units],
                "checksums": s.checksums, "forced_val": s.forced_val,
                "scan": {"documents": s.documents, "val_documents": s.val_documents,
                         "bytes": s.bytes, "seconds": round(time.time() - t0, 3)},
                "tokenizer": {"file": TOKENIZER,
                              "sha256": hashlib.sha256(tok_json.encode()).hexdigest(),
                              "vocab_size": vocab, **how},
                "dtype": dtype_for(vocab).str}
        if s.mixture is not None:
            plan["mixture"] = s.mixture
        atomic_write_json(plan_path, plan)
    recs = run_units(outp, plan, dcfg.text_field, dcfg.val_fraction, workers=workers,
                     progress=progress, runner=runner)
    man = manifest_of(dcfg, plan, recs)
    atomic_write_json(outp / MANIFEST, man)
    # the parts (and the scan's position) go only now that the build is complete
    shutil.rmtree(outp / "text", ignore_errors=True)
    return man


def run_units(out: Path, plan: dict[str, Any], text_field: str, val_fraction: float, *,
              workers: int, progress: bool,
              runner: UnitRunner | None = None) -> list[dict[str, Any]]:
    units = plan["units"]
    itemsize = np.dtype(plan["dtype"]).itemsize
    recs: dict[int, dict[str, Any]] = {}
    for u in units:
        rp = _record_path(out, u["index"])
        if rp.is_file():
            rec = json.loads(rp.read_text())
            if unit_record_ok(out, rec, itemsize):
                recs[u["index"]] = rec
    todo = [u for u in units if u["index"] not in recs]
    args = (text_field, val_fraction, plan["forced_val"], plan["dtype"])
    bar = _bar(progress, sum(u["bytes"] for u in todo), f"tokenize ({len(recs)} of "
               f"{len(units)} units done before)")
    docs = toks = 0

    def done(rec: dict[str, Any]) -> None:
        nonlocal docs, toks
        recs[rec["unit"]] = rec
        if bar is not None:
            docs += rec["train"]["documents"] + rec["val"]["documents"]
            toks += rec["train"]["tokens"] + rec["val"]["tokens"]
            bar.set_postfix(docs=f"{docs:,}", tokens=f"{toks:,}", refresh=False)
            bar.update(rec["bytes"])

    if runner is not None and todo:  # a launcher's: every unit is one job of its own
        for rec in runner.map(build_unit, [(str(out), u, *args) for u in todo],
                              parallelism=workers):
            done(rec)
    elif workers > 1 and len(todo) > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        # spawn: the parent may hold tokenizers' thread pool or torch threads (fork is unsafe)
        with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as ex:
            futs = [ex.submit(build_unit, str(out), u, *args) for u in todo]
            for f in as_completed(futs):
                done(f.result())
    else:
        for u in todo:
            done(build_unit(str(out), u, *args))
    if bar is not None:
        bar.close()
    return [recs[u["index"]] for u in units]


def manifest_of(dcfg: DataConfig, plan: dict[str, Any], recs: list[dict[str, Any]]
                ) -> dict[str, Any]:
    shards = [{"split": sp, **r[sp]} for sp in ("train", "val") for r in recs]
    tot = {sp: sum(r[sp]["tokens"] for r in recs) for sp in ("train", "val")}
    ndoc = {sp: sum(r[sp]["documents"] for r in recs) for sp in ("train", "val")}
    source = {"data": plan["request"]["data"], "checksums": plan["checksums"]}
    if plan.get("mixture") is not None:  # hf: per source, its bytes, documents and passes
        source["mixture"] = plan["mixture"]
    return {"format": FORMAT, "request": plan["request"], "source": source,
            "tokenizer": plan["tokenizer"],
            "split": {"rule": SPLIT_RULE, "val_fraction": dcfg.val_fraction,
                      "forced_val": plan["forced_val"]},
            "dtype": plan["dtype"], "documents": ndoc, "tokens": tot,
            "bytes": sum(r["bytes"] for r in recs), "shards": shards}


def verify(out: str | os.PathLike) -> list[str]:
    """The shards whose sha256 differs from the manifest's (empty: the corpus is intact)."""
    man = read_manifest(out)
    if man is None:
        return [f"{out}: no {MANIFEST}"]
    return [s["file"] for s in man["shards"]
            if not (Path(out) / s["file"]).is_file()
            or sha256_file(Path(out) / s["file"]) != s["sha256"]]
