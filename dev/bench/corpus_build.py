"""The corpus build and the loader, measured (issue 25; docs/BENCH.md, last section).

python -m dev.bench.corpus_build --dir <scratch> [--sizes 50,400] [--workers 1,2]
    [--tput-mb 24] [--reps 2]

On generated offline text (parquet, Zipf-distributed words, fixed seed) and one BPE trained once on
a slice of it (given to every build as data.tokenizer, so the tokenizer's training is not timed):
1. throughput at each worker count, the contenders interleaved rep by rep (order rotating), and
   each rep's ratio to pure tokenization reported (drift on a shared machine cancels), in wall
   time and in CPU seconds of all processes (what a loaded machine disturbs least):
   - `pure`: HF tokenizers' own `encode_batch` on the same documents, already in memory, the
     same worker count (processes), timed from the first encode to the last;
   - `ours`: experiments.corpus.build, whole (scan + workers + writes + hashes + manifest) and
     its units phase alone;
   - `datatrove`: datatrove 0.10's JsonlReader + DocumentTokenizer on the same files and
     tokenizer, LocalPipelineExecutor with one task per file, the same worker count;
2. peak RSS of a build (largest process) and of a training rank (opens the corpus, reads 300
   micro-batches of 8 x 2048 tokens at the seeded order) at each size;
3. the loader's tokens/s (PackedData.get, 8 x 2048), with the numpy permutation and with the
   Feistel order, against what the paper's 1.5B run needs per GPU (47B tokens, 32 GPUs, 12 h).
Prints a Markdown report and writes it to <dir>/report.md. Timings mean something only on a quiet
machine or as ratios of interleaved contenders; the report states the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
FILE_MB = 4  # one parquet file (one unit of ours, one task of datatrove's)


def generate(d: Path, mb: int, seed: int = 0) -> list[Path]:
    """`mb` MB of documents of Zipf-distributed pseudo-words, in parquet files of FILE_MB MB of
    text (parquet: datatrove's JsonlReader needs orjson, which the project does not install)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlucmfwypvbgkjqxz"))
    words = ["".join(rng.choice(letters, rng.integers(1, 10))) for _ in range(30_000)]
    files = []
    for f in range((mb + FILE_MB - 1) // FILE_MB):
        p = d / f"part-{f:04d}.parquet"
        files.append(p)
        if p.is_file():
            continue
        target = min(FILE_MB, mb - f * FILE_MB) * 1_000_000
        out, n = [], 0
        while n < target:
            k = int(rng.integers(50, 1500))
            ids = np.minimum(rng.zipf(1.3, k), len(words)) - 1
            text = " ".join(words[i] for i in ids)
            text = text.replace(" e ", ". ").replace(" t ", ",\n")
            out.append(text)
            n += len(text.encode())
        tmp = p.with_suffix(".tmp")
        pq.write_table(pa.table({"text": out}), tmp)
        tmp.rename(p)
    return files


def _texts(p: Path) -> list[str]:
    import pyarrow.parquet as pq

    return pq.read_table(p, columns=["text"]).column(0).to_pylist()


def _pure_worker(args: tuple[str, list[str], bool]) -> float:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(args[0])
    encode = tok.encode_batch_fast if args[2] else tok.encode_batch
    texts = [t for p in args[1] for t in _texts(Path(p))]
    t0 = time.perf_counter()
    for s in range(0, len(texts), 256):
        encode(texts[s:s + 256])
    return time.perf_counter() - t0


def pure(tok: Path, files: list[Path], workers: int, fast: bool = False) -> float:
    """Seconds of encode_batch (or encode_batch_fast: no offsets) alone: the slowest worker's,
    documents preloaded, ids never read out."""
    import multiprocessing as mp

    shares = [[str(f) for f in files[i::workers]] for i in range(workers)]
    with mp.get_context("spawn").Pool(workers) as pool:
        r = max(pool.map(_pure_worker, [(str(tok), s, fast) for s in shares]))
        pool.close()
        pool.join()  # reaped, so their CPU time is counted
        return r


def ours(tok: Path, src: Path, out: Path, workers: int) -> tuple[float, float]:
    from experiments.corpus.build import PLAN, build
    from experiments.corpus.config import DataConfig

    shutil.rmtree(out, ignore_errors=True)
    dcfg = DataConfig(source="files", paths=[str(src / "*.parquet")], tokenizer=str(tok),
                      shard_bytes=FILE_MB * 1_000_000 - 1)
    t0 = time.perf_counter()
    build(dcfg, out, vocab_size=None, workers=workers)
    total = time.perf_counter() - t0
    scan = json.loads((out / PLAN).read_text())["scan"]["seconds"]
    return total, total - scan


def datatrove(tok: Path, src: Path, out: Path, workers: int, n_files: int) -> float:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.readers import ParquetReader
    from datatrove.pipeline.tokens import DocumentTokenizer

    shutil.rmtree(out, ignore_errors=True)
    ex = LocalPipelineExecutor(
        pipeline=[ParquetReader(str(src), glob_pattern="*.parquet"),
                  DocumentTokenizer(str(out / "tok"), tokenizer_name_or_path=str(tok),
                                    eos_token="<|endoftext|>", shuffle_documents=False,
                                    batch_size=256)],
        tasks=n_files, workers=workers, logging_dir=str(out / "logs"), skip_completed=False)
    t0 = time.perf_counter()
    ex.run()
    return time.perf_counter() - t0


_RSS_TRAIN = """
import resource, sys, time
import numpy as np
from experiments.train.config import DataConfig
from experiments.train.data import build_corpus
c = build_corpus(DataConfig(corpus=sys.argv[1], val_tokens=65536), vocab_size=0, seq_len=2048,
                 seed=0, cache_dir=sys.argv[1])
pd = c.train
for i in range(300):
    pd.get(i * 8, 8)
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
st = dict(l.split(":", 1) for l in open("/proc/self/status") if l.startswith("Rss"))
anon, mapped = (int(st[k].split()[0]) for k in ("RssAnon", "RssFile"))
def rate(order_fn):
    pd.order = order_fn
    t0 = time.perf_counter(); n = 0
    while time.perf_counter() - t0 < 3:
        pd.get(n * 8 + 7919, 8); n += 1
    return n * 8 * 2048 / (time.perf_counter() - t0)
from experiments.corpus.shards import EpochOrder, feistel_index
perm = rate(EpochOrder(pd.n, 0))
feis = rate(lambda e, k: feistel_index(k, pd.n, 0, e))
print(rss, anon, mapped, perm, feis, pd.n)
"""


def _child_rss(cmd: list[str]) -> tuple[int, str]:
    """(peak RSS in kB of the largest process the command ran, its stdout)."""
    wrapper = ("import resource, subprocess, sys\n"
               "r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
               "assert r.returncode == 0, r.stderr[-2000:]\n"
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
               "print(r.stdout, end='')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", wrapper, *cmd], env=env, capture_output=True,
                       text=True, check=True)
    first, _, rest = r.stdout.partition("\n")
    return int(first), rest


def _cpu() -> float:
    """CPU seconds of this process and of every child it has waited for (workers included)."""
    import resource

    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def steady(tok: Path, files: list[Path], d: Path, reps: int) -> dict[str, list[float]]:
    """CPU seconds per MB of text, one process, start-up excluded (tokenizer loaded, imports
    done): what remains at scale, where the fixed costs vanish. Interleaved, order rotating."""
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.readers import ParquetReader
    from datatrove.pipeline.tokens import DocumentTokenizer
    from tokenizers import Tokenizer

    from experiments.corpus.build import build_unit, scan
    from experiments.corpus.config import DataConfig

    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    t = Tokenizer.from_file(str(tok))
    texts = [x for f in files for x in _texts(f)]
    mb = sum(len(x.encode()) for x in texts) / 1e6
    out = d / "steady"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    shutil.copy(tok, out / "tokenizer.json")
    dcfg = DataConfig(source="files", paths=[str(f) for f in files], tokenizer=str(tok))

    def run(c: str) -> None:
        if c == "encode_batch":
            for s in range(0, len(texts), 256):
                t.encode_batch(texts[s:s + 256])
        elif c == "encode_batch_fast":
            for s in range(0, len(texts), 256):
                t.encode_batch_fast(texts[s:s + 256])
        elif c == "ours: units (read, encode, write, sha256)":
            for i, f in enumerate(files):
                (out / "units" / f"unit-{i:05d}.json").unlink(missing_ok=True)
                build_unit(str(out), {"index": i, "kind": "file", "items": [str(f)],
                                      "bytes": 0}, "text", 0.05, [], "<u2")
        elif c == "ours: scan (read, checksums, split)":
            scan(dcfg, out, sample_cap=None)
        else:
            shutil.rmtree(out / "dt", ignore_errors=True)
            LocalPipelineExecutor(
                pipeline=[ParquetReader(str(files[0].parent), glob_pattern="*.parquet"),
                          DocumentTokenizer(str(out / "dt"), tokenizer_name_or_path=str(tok),
                                            eos_token="<|endoftext|>", shuffle_documents=False,
                                            batch_size=256)],
                tasks=1, workers=1, logging_dir=str(out / "dt-logs"),
                skip_completed=False).run()

    names = ["encode_batch", "encode_batch_fast", "ours: units (read, encode, write, sha256)",
             "ours: scan (read, checksums, split)", "datatrove: reader + DocumentTokenizer"]
    run(names[2])  # warm-up: imports, caches
    res: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(reps):
        for c in names[rep % len(names):] + names[:rep % len(names)]:
            c0 = time.process_time()
            run(c)
            res[c].append((time.process_time() - c0) / mb)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--sizes", default="50,400")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--tput-mb", type=int, default=24)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--steady-only", action="store_true",
                    help="only the one-process CPU-per-MB comparison (skips 1 and 2)")
    a = ap.parse_args(argv)
    d = Path(a.dir)
    sizes = [int(s) for s in a.sizes.split(",")]
    workers = [int(w) for w in a.workers.split(",")]
    lines = [f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"]
    say = lambda s: (print(s, flush=True), lines.append(s))

    # the tokenizer: trained once, given to every build
    tput_files = generate(d / f"text-{a.tput_mb}", a.tput_mb)
    tok = d / f"bpe{a.vocab}.json"
    if not tok.is_file():
        from experiments.corpus.tokenizer import train_bpe

        sample = _texts(tput_files[0])
        train_bpe(sample, a.vocab, cache_dir=d / "cache").save(str(tok))

    # 1. throughput, interleaved
    steady_reps = a.reps + 2
    if a.steady_only:
        a.reps, workers = 0, []
    mb = sum(len(t.encode()) for f in tput_files for t in _texts(f)) / 1e6
    say(f"\n### Throughput on {mb:.0f} MB of text ({len(tput_files)} parquet files), "
        f"vocab {a.vocab}")
    res: dict[tuple[str, int], list[float]] = {}
    cpu: dict[tuple[str, int], list[float]] = {}
    for rep in range(a.reps):
        for w in workers:
            order = ["pure", "pure-fast", "ours", "datatrove"]
            order = order[rep % 4:] + order[:rep % 4]
            for c in order:
                c0 = _cpu()
                if c.startswith("pure"):
                    res.setdefault((c, w), []).append(pure(tok, tput_files, w, c == "pure-fast"))
                elif c == "ours":
                    tot, units = ours(tok, d / f"text-{a.tput_mb}", d / "out-ours", w)
                    res.setdefault(("ours", w), []).append(tot)
                    res.setdefault(("ours-units", w), []).append(units)
                else:
                    res.setdefault(("datatrove", w), []).append(
                        datatrove(tok, d / f"text-{a.tput_mb}", d / "out-dt", w,
                                  len(tput_files)))
                cpu.setdefault((c, w), []).append(_cpu() - c0)
            say(f"rep {rep} w={w}: " + ", ".join(f"{k[0]} {v[-1]:.1f}s" for k, v in res.items()
                                                 if k[1] == w)
                + "; CPU " + ", ".join(f"{k[0]} {v[-1]:.1f}s" for k, v in cpu.items()
                                       if k[1] == w))
    say("\n| workers | contender | MB/s (all workers) | MB/s per worker | wall / pure "
        "tokenization | CPU s (all processes) | CPU / pure's CPU |")
    say("|---|---|---|---|---|---|---|")
    for w in workers:
        for c in ("pure", "pure-fast", "ours", "ours-units", "datatrove"):
            ts = res[(c, w)]
            ratio = statistics.median(t / p for t, p in zip(ts, res[("pure", w)], strict=True))
            med = statistics.median(ts)
            cs = cpu.get((c, w)) if not (c == "datatrove" and w > 1) else None
            cr = (statistics.median(x / p for x, p in zip(cs, cpu[("pure", w)], strict=True))
                  if cs else None)
            say(f"| {w} | {c} | {mb / med:.2f} | {mb / med / w:.2f} | {ratio:.3f} | "
                + (f"{statistics.median(cs):.1f} | {cr:.3f} |" if cs else "n/a | |"))
    say("pure's CPU includes reading the parquet files into memory (not its wall time); ours "
        "and datatrove's include their process start-up. n/a: ours-units is part of ours; "
        "datatrove's worker pool is not reaped, so its children's CPU is not counted.")

    # 1b. steady state, CPU per MB, one process
    res_s = steady(tok, tput_files, d, steady_reps)
    base = res_s["encode_batch"]
    say(f"\n### CPU seconds per MB of text, one process, start-up excluded ({steady_reps} reps, "
        "interleaved)\n")
    say("| step | CPU s / MB (median) | / encode_batch (median of per-rep ratios) |")
    say("|---|---|---|")
    for c, v in res_s.items():
        r = statistics.median(x / b for x, b in zip(v, base, strict=True))
        say(f"| {c} | {statistics.median(v):.3f} | {r:.3f} |")
    if a.steady_only:
        (d / "report.md").write_text("\n".join(lines) + "\n")
        return 0

    # 2. peak RSS of the build and of a training rank; 3. loader tokens/s
    say("\n| text | build peak RSS (largest process) | training rank peak RSS | its anonymous "
        "RSS | its file-backed RSS (shard pages read, reclaimable) | loader tokens/s "
        "(permutation / Feistel) | chunks |")
    say("|---|---|---|---|---|---|---|")
    for s in sizes:
        src = d / f"text-{s}"
        generate(src, s)
        out = d / f"corpus-{s}"
        shutil.rmtree(out, ignore_errors=True)
        brss, _ = _child_rss([sys.executable, "-m", "experiments.corpus", "--data", "files",
                              "--out", str(out), "--workers", str(max(workers)), "--quiet",
                              f"paths=[{src}/*.parquet]", f"tokenizer={tok}",
                              f"shard_bytes={FILE_MB * 1_000_000 - 1}"])
        trss, o = _child_rss([sys.executable, "-c", _RSS_TRAIN, str(out)])
        _, anon, mapped, perm, feis, n = o.split()
        say(f"| {s} MB | {brss / 1024:.0f} MB | {trss / 1024:.0f} MB | {int(anon) / 1024:.0f} MB "
            f"| {int(mapped) / 1024:.0f} MB | {float(perm):,.0f} / {float(feis):,.0f} | "
            f"{int(n):,} |")
    need = 47e9 / (32 * 12 * 3600)
    say(f"\nThe paper's 1.5B run needs {need:,.0f} tokens/s per GPU (47B tokens, 32 GPUs, 12 h).")
    say(f"load average at end: {os.getloadavg()[0]:.1f}")
    (d / "report.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
