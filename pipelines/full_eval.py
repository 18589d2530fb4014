"""The full evaluation of one checkpoint, timed per benchmark (`make bench-eval`,
docs/BENCHMARKS.md, "How long a full evaluation takes").

Each benchmark runs as its own `python -m experiments.eval CKPT --tasks <t>` process (its wall
time its own), `--workers` at once, longest first. Output in --out: a folder per benchmark,
`full_eval.json` and `full_eval.md`; a benchmark with a successful result for the same
checkpoint and arguments is reused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from common import benchmarks
from common.errors import ArgParser, cli, positive_int
from common.io import atomic_write_json, atomic_write_text
from common.paths import results_root
from common.provenance import git_state, versions

REPO = Path(__file__).resolve().parents[1]
ORIGINAL = benchmarks.tasks(default=True)
"""The default set (the paper's benchmarks this suite runs): TASKS=original."""
EXTRA = benchmarks.tasks(default=False, offline_ready=True)
"""The other benchmarks with an offline copy: TASKS=all adds them."""
COST_MIN = {t: c for t in ORIGINAL + EXTRA if (c := benchmarks.benchmark(t).cost_min)}
"""Rough cost on the 16M preset (minutes on one 2-core machine thread), measured with this
command (the registry's `cost_min`, docs/BENCH.md). It orders the queue, longest first, and
weights the ETA; nothing else reads it."""


def task_list(spec: str) -> list[str]:
    if spec == "original":
        return list(ORIGINAL)
    if spec == "all":
        return list(ORIGINAL + EXTRA)
    return list(dict.fromkeys(t.strip() for t in spec.split(",") if t.strip()))


def _summary(task: str, d: Path) -> dict[str, Any]:
    """Status, primary metric and request count of a task's eval file (null when absent)."""
    files = [p for p in d.glob("*.json") if p.name != "done.json"]  # the one eval file
    f = files[0] if len(files) == 1 else None
    if f is None:
        return {"status": "no result file", "metric": None, "value": None, "requests": None,
                "model_s": None, "file": None}
    doc = json.loads(f.read_text())
    e = doc["tasks"].get(task, {})
    err = e.get("error")
    metric = e.get("primary")
    value = None if err or metric is None else e["metrics"].get(metric, {}).get("value")
    return {"status": f"error: {err}" if err else "ok", "metric": metric, "value": value,
            "n": e.get("n"), "requests": doc.get("requests"), "model_s": doc.get("elapsed_s"),
            "file": str(f)}


def reusable(d: Path, ident: str, data: str, extra: list[str]) -> dict[str, Any] | None:
    """A finished earlier result in d for the same checkpoint, data and arguments (a --limit run
    is never reused for a full one), else None."""
    done = d / "done.json"
    if not done.is_file():
        return None
    prev = json.loads(done.read_text())
    ok = prev.get("rc") == 0 and prev.get("checkpoint_identity") == ident and \
        prev.get("data") == data and prev.get("args") == extra
    return prev if ok else None


def run_task(task: str, ckpt: str, data: str, out: Path, threads: int, extra: list[str],
             ident: str) -> dict[str, Any]:
    d = out / task
    prev = reusable(d, ident, data, extra)
    if prev is not None:
        return prev | {"reused": True}
    d.mkdir(parents=True, exist_ok=True)
    # the eval resumes from its request cache: a rerun after a crash is then not a full run's
    # time, and is marked as such
    resumed = any((d / ".cache").glob("*")) if (d / ".cache").is_dir() else False
    done = d / "done.json"
    for old in d.glob("*.json"):  # a failed earlier attempt: its result is not this one's
        old.unlink()
    cmd = [sys.executable, "-m", "experiments.eval", ckpt, "--tasks", task, "--data", data,
           "--threads", str(threads), "--out-dir", str(d), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TQDM_MININTERVAL": "30"}
    t0 = time.time()
    with open(d / "eval.log", "w") as log:
        rc = subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                            check=False).returncode
    t1 = time.time()
    rec = {"task": task, "rc": rc, "wall_s": round(t1 - t0, 1), "start": t0, "end": t1,
           "checkpoint_identity": ident, "data": data, "args": extra, "command": cmd,
           "reused": False, "resumed_from_request_cache": resumed,
           "loadavg_end": list(os.getloadavg())} | _summary(task, d)
    if rc != 0 and rec["file"] is None:  # killed or crashed before writing: say how it ended
        rec["status"] = f"exit status {rc}, no result file (see {d / 'eval.log'})"
    atomic_write_json(done, rec)
    return rec


def render(doc: dict[str, Any]) -> str:
    import pandas as pd

    from analysis.render import fmt, md

    rows = [[r["task"] + (" (reused)" if r["reused"] else "")
             + (" (resumed: partial time)" if r.get("resumed_from_request_cache") else ""),
             r["status"], f"{r['metric']} = " + fmt(r["value"], ".4f", "null"),
             r.get("n"), r["requests"], f"{r['wall_s']:.0f}", r["model_s"]] for r in doc["tasks"]]
    t = doc["totals"]
    return "\n".join([
        f"Checkpoint `{doc['checkpoint']}`; command `{' '.join(doc['argv'])}`; "
        f"{doc['workers']} worker(s) x {doc['threads']} thread(s); git {doc['git_commit']}"
        f"{' (dirty)' if doc['git_dirty'] else ''}; load average at start "
        f"{'/'.join(f'{x:.1f}' for x in doc['loadavg_start'])}, at end "
        f"{'/'.join(f'{x:.1f}' for x in doc['loadavg_end'])}.", "",
        md(pd.DataFrame(rows, dtype=object, columns=["benchmark", "status", "primary metric", "n",
                                                      "requests", "wall s", "in-model s"])), "",
        f"Makespan {t['makespan_s'] / 60:.1f} min (first start to last end, {t['ran']} run, "
        f"{t['reused']} reused); sum of per-benchmark wall times {t['sum_wall_s'] / 60:.1f} min; "
        f"failed: {', '.join(t['failed']) or 'none'}."])


def _main(argv: list[str] | None) -> int:
    p = ArgParser(prog="python -m pipelines.full_eval", description=__doc__.split("\n\n")[0])
    p.add_argument("ckpt")
    p.add_argument("--data", required=True, help="offline benchmark dir")
    p.add_argument("--tasks", default="original", help="original | all | comma-separated")
    p.add_argument("--workers", type=positive_int, default=2)
    p.add_argument("--threads", type=positive_int, default=1)
    p.add_argument("--limit", type=positive_int)
    p.add_argument("--batch-size", type=positive_int)
    p.add_argument("--out")
    a = p.parse_args(argv)
    tasks = task_list(a.tasks)
    from experiments.eval.run import checkpoint_of, ckpt_identity, validate_args

    extra = ([f"--limit={a.limit}"] if a.limit else []) + (
        [f"--batch-size={a.batch_size}"] if a.batch_size else [])
    ck = checkpoint_of(a.ckpt)
    validate_args([a.ckpt, "--tasks", ",".join(tasks), "--data", a.data, *extra], ckpt=None)
    ident = ckpt_identity(ck)
    out = Path(a.out) if a.out else results_root() / "bench" / time.strftime(
        "full_eval-%Y%m%dT%H%M%SZ", time.gmtime())
    out.mkdir(parents=True, exist_ok=True)
    out = out.resolve()  # the per-benchmark processes run from the repository root
    order = sorted(tasks, key=lambda t: -COST_MIN.get(t, 5.0))
    data = str(Path(a.data).resolve())
    todo = [t for t in order if reusable(out / t, ident, data, extra) is None]
    total_w = sum(COST_MIN.get(t, 5.0) for t in todo)  # the ETA weighs only what will run
    load0, t0 = list(os.getloadavg()), time.time()
    recs: list[dict[str, Any]] = []
    print(f"{len(order)} benchmark(s), {a.workers} worker(s) x {a.threads} thread(s) -> {out}",
          flush=True)

    def one(t: str) -> dict[str, Any]:
        r = run_task(t, str(ck), data, out, a.threads, extra, ident)
        recs.append(r)
        done_w = sum(COST_MIN.get(x["task"], 5.0) for x in recs if not x["reused"])
        el = time.time() - t0
        eta = f"ETA {el * (total_w - done_w) / done_w / 60:.0f} min (weighted by the usual " \
            "cost)" if done_w else "ETA after the first benchmark that runs"
        print(f"[{len(recs)}/{len(order)}] {t}: {r['status']}, {r['wall_s']:.0f} s"
              f"{' (reused)' if r['reused'] else ''}; elapsed {el / 60:.1f} min, {eta}",
              flush=True)
        return r

    with ThreadPoolExecutor(a.workers) as pool:
        list(pool.map(one, order))
    by = {r["task"]: r for r in recs}
    ran = [by[t] for t in order if not by[t]["reused"]]
    commit, dirty = git_state(untracked=False)
    doc = {"schema": 1, "checkpoint": str(ck), "checkpoint_identity": ident, "argv": sys.argv,
           "data": data, "workers": a.workers, "threads": a.threads,
           "limit": a.limit, "git_commit": commit, "git_dirty": dirty,
           "versions": versions("torch", "lm_eval", "evalplus"), "cpu_count": os.cpu_count(),
           "loadavg_start": load0, "loadavg_end": list(os.getloadavg()),
           "tasks": [by[t] for t in order],
           "totals": {"makespan_s": (max(r["end"] for r in ran) - min(r["start"] for r in ran))
                      if ran else 0.0,
                      "sum_wall_s": sum(r["wall_s"] for r in by.values()), "ran": len(ran),
                      "reused": len(order) - len(ran),
                      "failed": [t for t in order if by[t]["rc"] != 0]}}
    atomic_write_json(out / "full_eval.json", doc)
    md = render(doc)
    atomic_write_text(out / "full_eval.md", md + "\n")
    print(md, flush=True)
    return 1 if doc["totals"]["failed"] else 0


def main(argv: list[str] | None = None) -> int:
    return cli("full-eval", lambda: _main(argv),
               "re-run the same command with the same --out: finished benchmarks are reused")


if __name__ == "__main__":
    raise SystemExit(main())
