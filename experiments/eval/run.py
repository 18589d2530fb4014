"""`make eval CKPT=...`: score a checkpoint on GSM8K, MMLU, ARC-E/C, CSQA (lm-eval) and
HumanEval+, MBPP+ (evalplus), plus gold-answer bits per byte, offline or online.

- the model is wrapped natively for lm-eval (`lm_adapter.FTBenchLM`) and the stock tasks run as
  they are; offline, their YAMLs point at local files checked against pinned sha256 sums;
- the Z modes and what Z saw per request type (`protocol`): docs/DESIGN.md, "Honest
  evaluation"; one file per evaluation spec, named by its `spec_id` (docs/RESULTS.md). A task
  whose run died is kept as `"error"` with null metrics (never 0), and the command exits 1;
- resumable: every finished request goes to lm-eval's sqlite cache keyed by checkpoint
  identity, z-mode, k, seed and generation length;
- bad input is one line and exit 2 before any work (`validate_args`, also used by `make sweep
  EVAL=1` at plan time), and nothing is written.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import functools
import hashlib
import json
import logging
import math
import os
import re
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from common import benchmarks
from common.errors import ArgParser, UsageError, cli, positive_int
from common.io import atomic_write_json, unwritable
from common.paths import RunDir
from common.provenance import git_commit, versions
from common.records import (  # noqa: F401 - spec_id: tests import it from here
    Z_MODES,
    EvalFile,
    EvalRequest,
    EvalRuntime,
    RecordError,
    spec_id,
    suites_of,
)
from common.text import one_line
from experiments.eval.tasks import benchdata, grouped
from model.checkpoint import CheckpointError

DEFAULT_TASKS = benchmarks.tasks(default=True, order="run")
"""The default set (common.benchmarks): the lm-eval suite's, then evalplus's."""
ONLINE_EXTRA = benchmarks.tasks(default=False)
"""The rest of the paper's table, through stock task names; not in the default set. Each
runs offline too where its row has an offline copy (`offline_ready`); race has none."""
VERSIONED = ("lm_eval", "evalplus", "torch", "transformers", "datasets")
"""Packages whose versions an eval file records."""


def limit_lines(tasks: Sequence[str], limit: int | None) -> list[str]:
    """What `limit` means for the grouped tasks among `tasks`: per subject, and the questions
    and requests it comes to."""
    return [f"  limit {limit} is per subject in {t}: {k} subjects x {limit} = {k * limit:,} "
            f"questions, {k * limit * n:,} requests" for t in tasks
            if limit and (g := grouped(t)) for k, n in [g]]


# ---------------------------------------------------------------------------- helpers
def trained_context(run: RunDir | str | os.PathLike) -> int | None:
    """The window a run's model was trained at (its run record's train.seq_len); None without
    a run record (the model's max_seq_len is then used); UsageError for an unreadable one."""
    run = run if isinstance(run, RunDir) else RunDir.at(run)
    if not run.has_record:
        return None
    try:
        seq = run.record().train.get("seq_len")
    except (OSError, RecordError) as e:
        raise UsageError(f"run record {run.record_path} is unreadable: "
                            f"{one_line(e)[:200]}") from None
    if seq is None:
        return None
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 2:
        raise UsageError(f"run record {run.record_path}: train.seq_len={seq!r} is not a "
                            "window length")
    return seq


def checkpoint_of(run: RunDir | str | os.PathLike) -> Path:
    """The checkpoint of a run (`RunDir.checkpoint()`; a path is read as `RunDir.at(path)`);
    UsageError naming a missing one."""
    try:
        return (run if isinstance(run, RunDir) else RunDir.at(run)).checkpoint()
    except FileNotFoundError as e:
        raise UsageError(str(e)) from None


def ckpt_identity(ckpt: Path) -> str:
    st = ckpt.stat()
    return hashlib.sha256(f"{ckpt.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def suite_checksums(ddir: Path | None, suites: dict[str, list[str]]) -> dict[str, dict[str, str]]:
    """{suite: the verified sha256 of each offline file its tasks read} ({} online); UsageError
    (one line) naming every missing or altered file."""
    if ddir is None:
        return {}
    chk = benchdata.require(ddir, [t for names in suites.values() for t in names])
    return {suite: {r: chk.checksums[r] for r in benchdata.needed_files(ddir, names)}
            for suite, names in suites.items()}


# ---------------------------------------------------------------------------- lm-eval suite
def primary_metric(task: str) -> str:
    """The metric a task's entry marks primary: its benchmark row's (common.benchmarks); any
    other stock task: acc."""
    row = benchmarks.find(task)
    return row.primary if row is not None else "acc"


def _task_entry(name: str, res: dict, samples: list[dict], n: int, fewshot: int,
                lm: Any) -> dict:
    metrics: dict[str, dict] = {}
    for key, val in res.items():
        if "," not in key or "_stderr," in key or key == "alias":
            continue
        metric, filt = key.split(",", 1)
        mname = metric if filt == "none" else f"{metric},{filt}"
        metrics[mname] = {"value": _num(val), "stderr": _num(res.get(f"{metric}_stderr,{filt}")),
                          "n": n}
    primary = primary_metric(name)
    if primary not in metrics and metrics:
        primary = next(iter(metrics))
    items: dict[Any, dict] = {}
    for s in samples:
        did = (s.get("_subtask"), s["doc_id"]) if s.get("_subtask") else s["doc_id"]
        it = items.setdefault(did, {"doc_id": s["doc_id"]} | (
            {"subtask": s["_subtask"]} if s.get("_subtask") else {}))
        filt = s.get("filter", "none")
        for m in s.get("metrics", []):
            if m in s:
                it[m if filt == "none" else f"{m},{filt}"] = _num(s[m])
        if filt != "none" or "resps" in s:
            resp = s.get("filtered_resps")
            if isinstance(resp, list) and resp and isinstance(resp[0], str):
                it.setdefault("response", {})[filt] = resp[0]
    spread = _prior_k_spread(samples, lm)
    for m, sd in spread.items():
        if m in metrics:
            metrics[m]["spread"] = sd
    return {"primary": primary, "higher_is_better": True, "n": n, "fewshot": fewshot,
            "metrics": metrics, "items": list(items.values())}


def _checked(task: str, samples: list) -> list[dict]:
    """lm-eval's in-memory samples, in the form the entry reads (a dict per document and
    filter with its doc_id and `arguments`, the list of its requests' args); any other form
    fails the task with one line instead of a KeyError deep in the entry."""
    for s in samples:
        if not (isinstance(s, dict) and "doc_id" in s and isinstance(s.get("arguments"), list)
                and all(isinstance(a, (list, tuple)) for a in s["arguments"])):
            raise ValueError(f"{task}: lm-eval returned a sample of an unexpected form "
                             f"({one_line(repr(s))[:120]}); this lm-eval version is not "
                             "supported")
    return samples


def _prior_k_spread(samples: list[dict], lm: Any) -> dict[str, float]:
    """Std over the k draws of acc / acc_norm (multiple-choice tasks, prior-k only)."""
    if getattr(lm, "k", 1) <= 1 or not samples:
        return {}
    acc: dict[int, list[float]] = defaultdict(list)
    accn: dict[int, list[float]] = defaultdict(list)
    for s in samples:
        pairs = [tuple(a) for a in s["arguments"]]
        if not all(len(p) == 2 and isinstance(p[1], str) for p in pairs):
            return {}  # a generation task's (context, gen_kwargs): no choice to draw over
        draws = [lm.draw_logliks.get(p) for p in pairs]
        if any(d is None or len(d) != lm.k for d in draws) or not isinstance(s.get("target"),
                                                                             int):
            return {}  # some requests came from the cache: no per-draw values
        tgt = s["target"]
        for j in range(lm.k):
            lls = [d[j] for d in draws]
            acc[j].append(float(max(range(len(lls)), key=lls.__getitem__) == tgt))
            norm = [ll / max(1, len(p[1])) for ll, p in zip(lls, pairs, strict=True)]
            accn[j].append(float(max(range(len(norm)), key=norm.__getitem__) == tgt))
    out = {}
    for name, per in (("acc", acc), ("acc_norm", accn)):
        vals = [sum(v) / len(v) for v in per.values() if v]
        if len(vals) > 1:
            out[name] = statistics.pstdev(vals)
    return out


def _error_entry(name: str, err: BaseException | str, fewshot: int | None) -> dict:
    """A task whose run died: its metrics are missing (null), never 0."""
    if name.endswith(benchmarks.GOLD_BPB_SUFFIX):
        primary, hib = "bpb", False
    else:
        primary, hib = primary_metric(name), True
    msg = err if isinstance(err, str) else f"{type(err).__name__}: {err}"
    line = one_line(msg)[:300] or "unknown error"
    return {"primary": primary, "higher_is_better": hib, "n": None, "fewshot": fewshot,
            "metrics": {primary: {"value": None, "stderr": None, "n": None}}, "items": [],
            "error": line}


def _gen_args(samples: list[dict]) -> list[tuple[str, dict]]:
    """(context, gen_kwargs) of the generate_until requests in lm-eval's samples, each
    document once (a document has a sample per filter)."""
    docs = {(s.get("_subtask"), s["doc_id"]): s["arguments"] for s in samples}
    return [(a[0], a[1]) for args in docs.values() for a in args
            if len(a) == 2 and isinstance(a[0], str) and isinstance(a[1], dict)]


def run_lm_eval(lm: Any, tasks: list[str], limit: int | None, fewshot: int | None,
                data: Path | None, eval_dir: Path, cache: Path, seed: int,
                native_dir: Path | None = None, run_id: str = "model") -> dict[str, dict]:
    """Each task runs on its own, so one that dies is recorded as an error and the others
    still count. native_dir: where lm-eval's own results/samples files go (None: nowhere)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    native: list[dict] = []
    if data is not None:
        from experiments.eval.tasks import offline_task_manager

        # lm-eval warns once per task that uses `custom_dataset` (57 MMLU subjects offline)
        logging.getLogger("lm_eval.api.task").addFilter(
            lambda r: "Custom kwargs can be passed" not in r.getMessage())
        tm = offline_task_manager(data, eval_dir / ".tasks")
    else:
        tm = TaskManager()

    def one(t: str) -> dict[str, dict]:
        out = lm_eval.simple_evaluate(
            model=lm, tasks=[t], num_fewshot=fewshot, limit=limit, use_cache=str(cache),
            log_samples=True, task_manager=tm, bootstrap_iters=1000, random_seed=seed,
            numpy_random_seed=seed, torch_random_seed=seed)
        native.append(out)
        res, samples = out["results"], out["samples"]
        nsam, shots = out.get("n-samples", {}), out.get("n-shot", {})
        subs = _leaves(t, out.get("group_subtasks", {}))
        if subs != [t]:
            smp = [s | {"_subtask": st} for st in subs for s in _checked(t, samples.get(st, []))]
            n = sum(nsam.get(st, {}).get("effective", 0) for st in subs)
            fs = shots.get(subs[0], 0) if subs else 0
        else:
            smp = _checked(t, samples.get(t, []))
            n = nsam.get(t, {}).get("effective", len(smp))
            fs = shots.get(t, 0)
        e = _task_entry(t, res.get(t, {}), smp, n, int(fs), lm)
        partial = (row := benchmarks.find(t)) and row.partial
        if data is not None and partial:  # the offline copy is not the whole eval set
            e["partial"] = partial
        if gen := _gen_args(smp):
            e["truncation"] = lm.truncation_record(gen)
        return {t: e}

    def gold(t: str) -> dict[str, dict]:
        from experiments.eval.evalplus_suite import gold_bpb

        task = tm.load([t])["tasks"][t]
        docs = list(task.eval_docs)[: limit or None]
        delim = task.config.target_delimiter
        pairs = [(task.doc_to_text(d), delim + task.doc_to_target(d)) for d in docs]
        return {benchmarks.find(t).gold_task: gold_bpb(lm, pairs)}

    entries: dict[str, dict] = {}
    for t in tasks:
        entries |= _scored(lm, {t: fewshot}, lambda t=t: one(t))
    for t in tasks:  # the gold answers' bits per byte, for the rows that score them
        if g := (row := benchmarks.find(t)) and row.task == t and row.gold_task:
            entries |= _scored(lm, {g: 0}, lambda t=t: gold(t))
    if native_dir is not None and native:
        write_native(native, native_dir, run_id)
    return entries


def write_native(outs: list[dict], native_dir: Path, run_id: str) -> None:
    """lm-eval's own results JSON and per-sample JSONL, merged into one run, in the layout of
    `lm_eval --output_path <native_dir> --log_samples` (the model name is the run id)."""
    from lm_eval.loggers import EvaluationTracker

    merged: dict[str, Any] = {}
    samples: dict[str, list[dict]] = {}
    for out in outs:
        for key, val in out.items():
            if key == "samples":
                # the tracker rewrites each sample's fields: give it copies
                samples |= {t: [dict(x) for x in v] for t, v in val.items()}
            elif isinstance(val, dict) and isinstance(merged.get(key), dict):
                merged[key] = merged[key] | val
            else:
                merged[key] = val
    tracker = EvaluationTracker(output_path=str(native_dir))
    gc = tracker.general_config_tracker
    gc.log_experiment_args(model_source="ftbench", model_args=merged.get("config", {}).get(
        "model_args") or "", system_instruction=None, chat_template=None,
        fewshot_as_multiturn=False)
    gc.model_name, gc.model_name_sanitized = run_id, run_id
    tracker.save_results_aggregated(results=merged, samples=samples)
    for task, smp in samples.items():
        tracker.save_results_samples(task_name=task, samples=smp)


def _leaves(t: str, groups: dict[str, list[str]]) -> list[str]:
    return [x for s in groups[t] for x in _leaves(s, groups)] if t in groups else [t]


# ---------------------------------------------------------------------------- main entry
def run_eval(run: RunDir | str | os.PathLike, request: EvalRequest,
             runtime: EvalRuntime | None = None) -> dict[str, Path]:
    """Evaluate a run's checkpoint (`run.checkpoint()`) as `request` asks (what decides the
    numbers); `runtime` says how (nothing that changes a number). {suite: result JSON path}."""
    from experiments.eval.lm_adapter import DataParallel, FTBenchLM, local_device

    runtime = runtime or EvalRuntime()
    req = request if request.tasks else dataclasses.replace(request, tasks=DEFAULT_TASKS)
    tasks = list(req.tasks)
    z, k, fewshot, seed = req.z_mode, req.k, req.fewshot, req.seed
    ddir = benchdata.data_dir(req.data)
    check_tasks(tasks, ddir, fewshot)
    device = resolve_device(runtime.device)
    run = run if isinstance(run, RunDir) else RunDir.at(run)
    ck = checkpoint_of(run)
    run_id = run.run_id
    eval_dir = Path(runtime.out_dir) if runtime.out_dir is not None else run.eval_dir
    if (bad := unwritable(eval_dir)) is not None:  # before any work: it costs nothing
        raise UsageError(f"output directory {eval_dir.absolute()}: {bad}; give --out-dir a "
                         "writable directory")
    context = trained_context(run)
    # under torchrun every process loads the model; rank 0 runs lm-eval and writes every file,
    # the others score their share of each batch of requests (lm_adapter.DataParallel)
    device = local_device(device)
    dp = DataParallel.from_env(device)
    try:
        # the checkpoint loads before the data are hashed: a bad one costs no time
        lm = FTBenchLM(checkpoint=str(ck), z=z, k=k, seed=seed, batch_size=runtime.batch_size,
                       device=device, max_gen_toks=req.max_gen_toks,
                       progress=runtime.progress and (dp is None or dp.rank == 0),
                       max_length=context, data_parallel=dp)
        if dp is not None and dp.rank > 0:
            lm.serve()
            return {}
        try:
            return _run_suites(lm, ck, req, ddir, eval_dir, run_id, dp)
        finally:
            lm.stop_workers()
    finally:
        if dp is not None:
            dp.close()


def _run_suites(lm: Any, ck: Path, req: EvalRequest, ddir: Path | None, eval_dir: Path,
                run_id: str, dp: Any) -> dict[str, Path]:
    """Rank 0's part of `run_eval`: the data check, every suite, every file."""
    tasks = list(req.tasks)
    z, k, limit, fewshot, seed = req.z_mode, req.k, req.limit, req.fewshot, req.seed
    suites = req.suites()
    checks = suite_checksums(ddir, suites)
    if ddir is not None:
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        print(f"benchmark data {ddir}: {sum(map(len, checks.values()))} files verified",
              flush=True)
        from experiments.eval.evalplus_suite import set_override_env

        set_override_env(ddir)  # before anything imports evalplus
    gen_toks = lm.max_gen_toks
    specs = req.specs(gen_toks, checks, lm.max_length)
    cache_dir = eval_dir / ".cache"
    ident = ckpt_identity(ck)
    head = {"fewshot_override": fewshot, "max_gen_toks": gen_toks,
            "data_dir": str(ddir) if ddir else None, "versions": versions(*VERSIONED),
            "git_commit": git_commit(), "max_seq_len": lm.max_length,
            "protocol": lm.protocol(), "argv": sys.argv,
            # how it ran (not in the spec: neither changes what is asked)
            "precision": lm.precision, "world_size": dp.world if dp is not None else 1}
    written: dict[str, Path] = {}
    print(f"eval {run_id} step {lm.checkpoint_step} ({lm.arm.name}, z {z}): "
          f"{', '.join(tasks)}" + (f", limit {limit} per task" if limit else ""), flush=True)
    for line in limit_lines(tasks, limit):
        print(line, flush=True)
    for suite, names in suites.items():
        spec = specs[suite]
        cache_key = spec.cache_key(ident, seed, gen_toks)
        path = eval_dir / spec.file_name(lm.checkpoint_step)
        t0 = time.time()
        n0 = lm.n_requests
        with harness_output(path.with_suffix(".log")):
            entries = _run_suite(suite, names, lm, req, ddir, eval_dir,
                                 cache_dir / f"{suite}-{cache_key}", path, run_id, gen_toks)
        elapsed = time.time() - t0
        nreq = lm.n_requests - n0
        doc = EvalFile(
            suite=suite, spec=spec, spec_id=spec.id, run_id=run_id, checkpoint=str(ck),
            checkpoint_step=lm.checkpoint_step, arm=lm.arm.name,
            z_mode=z if lm.arm.latent else "prior", k=k, leaks=lm.leaks, seed=seed, limit=limit,
            tasks=entries,
            extra=head | {"data_checksums": dict(spec.data_checksums),
                          "elapsed_s": round(elapsed, 2), "requests": nreq,
                          "requests_per_s": nreq / elapsed if elapsed else None})
        atomic_write_json(path, doc.to_json(), default=_json_default)
        written[suite] = path
    return written


def _run_suite(suite: str, names: list[str], lm: Any, req: EvalRequest, ddir: Path | None,
               eval_dir: Path, cache: Path, path: Path, run_id: str,
               gen_toks: int) -> dict[str, dict]:
    """One suite's task entries (a dead task: its error, null metrics); `cache`: its request
    cache without the suffix."""
    if suite == "lm-eval":
        return run_lm_eval(lm, names, req.limit, req.fewshot, ddir, eval_dir, cache, req.seed,
                           native_dir=native_dir(path), run_id=run_id)
    from lm_eval.api.model import CachingLM

    from experiments.eval import evalplus_suite

    # generate_until through the sqlite cache; every other attribute passes through to lm
    cached = CachingLM(lm, f"{cache}.db")
    entries: dict[str, dict] = {}
    for t in names:  # one run scores a task and its gold
        entries |= _scored(lm, {t: 0, f"{t}{benchmarks.GOLD_BPB_SUFFIX}": 0},
                           lambda t=t: evalplus_suite.run_task(
                               cached, t, ddir, req.limit, eval_dir / ".evalplus" / path.stem,
                               gen_toks))
    return entries


def _scored(lm: Any, names: dict[str, int | None], body: Any) -> dict[str, dict]:
    """`body()`'s task entries; if it dies, an error entry (null metrics, never 0) for each of
    `names` (name -> few-shot count). One progress line per entry, the first with the time and
    requests the run took."""
    t0, n0 = time.time(), lm.n_requests
    try:
        got = body()
    except Exception as e:  # noqa: BLE001 - recorded as the task's error, never as 0
        logging.getLogger(__name__).exception("task %s failed", next(iter(names)))
        got = {n: _error_entry(n, e, fs) for n, fs in names.items()}
    for i, (name, e) in enumerate(got.items()):
        task_line(name, e, *((time.time() - t0, lm.n_requests - n0) if i == 0 else ()))
    return got


def task_line(task: str, e: dict, seconds: float | None = None, requests: int = 0) -> None:
    """A benchmark's one progress line (the harness's own bars go to the suite's log);
    `seconds` None: scored by the run of the task before it."""
    m = e.get("metrics", {}).get(e.get("primary"), {})
    score = f"error: {e['error']}" if e.get("error") else (
        f"{e.get('primary')} {_fmt(e)}" + (f" ± {m['stderr']:.3f}" if m.get("stderr") else ""))
    print(f"  {task}: {score}; {e.get('n') if e.get('n') is not None else '?'} items"
          + (f", {requests:,} requests, {seconds:.0f} s" if seconds is not None else ""),
          flush=True)


@contextlib.contextmanager
def harness_output(log: Path) -> Iterator[None]:
    """What the libraries write on stderr goes to `log` while a suite runs (the file descriptor
    itself, so their own handles are caught too); the console keeps one line per benchmark."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    keep = os.dup(2)
    try:
        with open(log, "ab") as f:
            os.dup2(f.fileno(), 2)
            print(f"  (progress bars and harness messages: {log})", flush=True)
            yield
    finally:
        sys.stderr.flush()
        os.dup2(keep, 2)
        os.close(keep)


def native_dir(eval_file: Path) -> Path:
    """Where lm-eval's own files for an eval file go: `<eval dir>/<its stem>.lm_eval/`."""
    return eval_file.with_name(eval_file.stem + ".lm_eval")


def resolve_device(device: str | None) -> str:
    """`None`/"auto": cuda if torch sees a GPU, else cpu. A device this machine lacks is an
    UsageError naming it (not a checkpoint error from loading onto it)."""
    import torch

    from common.gpus import no_silent_cpu

    if device in (None, "", "auto"):
        no_silent_cpu("--device cpu evaluates on the CPU anyway")  # common.gpus (issue 45)
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise UsageError(f"--device {device}: not a torch device (cpu, cuda, cuda:N, mps; "
                            "omit it to pick one automatically)") from None
    if dev.type == "cuda":
        n = torch.cuda.device_count()
        if n == 0 or (dev.index or 0) >= n:
            raise UsageError(f"--device {device}: this machine has {n} CUDA device(s); "
                                "omit --device to pick one automatically (cpu here)")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise UsageError(f"--device {device}: MPS is not available on this machine; omit "
                            "--device to pick one automatically")
    return device


def summary(paths: dict[str, Path]) -> tuple[list[str], list[str]]:
    """The command's last lines (each file written and its tasks' primary scores), and
    'task: reason' for every task entry that records an error."""
    lines, failed = [], []
    for p in paths.values():
        tasks = json.loads(p.read_text(encoding="utf-8")).get("tasks", {})
        lines += [f"wrote {p}", "  " + ", ".join(f"{t}={_fmt(e)}" for t, e in tasks.items())]
        failed += [f"{t}: {e['error']}" for t, e in tasks.items() if e.get("error")]
    return lines, failed


def _fmt(e: dict) -> str:
    if e.get("error"):
        return "error"
    v = e["metrics"].get(e["primary"], {}).get("value")
    return "null" if v is None else f"{v:.4f}"


def build_parser() -> argparse.ArgumentParser:
    ap = ArgParser(prog="python -m experiments.eval",
                   description="Evaluate a checkpoint (docs/RESULTS.md schema).")
    ap.add_argument("ckpt", help="run dir or checkpoint .pt")
    ap.add_argument("--tasks", default=",".join(DEFAULT_TASKS),
                    help=f"comma-separated; default {','.join(DEFAULT_TASKS)}; online also "
                         f"{','.join(ONLINE_EXTRA)}")
    ap.add_argument("--limit", type=positive_int, default=None, help="first n documents per task")
    ap.add_argument("--z", default="prior", choices=list(Z_MODES))
    ap.add_argument("--k", type=positive_int, default=4, help="draws of Z for --z prior-k")
    ap.add_argument("--fewshot", type=int, default=None, help="override the stock few-shot count")
    ap.add_argument("--data", default=None,
                    help=f"offline benchmark dir (else ${benchdata.ENV_VAR}, else online)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=positive_int, default=16)
    ap.add_argument("--max-gen-toks", type=positive_int, default=None,
                    help="generation budget in tokens (default 256, at most half the model's "
                         "window; a prompt never loses tokens to it unless it alone fills the "
                         "window)")
    ap.add_argument("--device", default=None,
                    help="cpu, cuda, cuda:N (default: cuda if available, else cpu)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch intra-op threads (0 = torch's default; 1 is faster on a busy CPU)")
    ap.add_argument("--out-dir", default=None, help="default <run dir>/eval")
    return ap


def check_tasks(tasks: list[str], ddir: Path | None, fewshot: int | None = None) -> None:
    """UsageError naming unknown tasks (with the close name for a typo), offline the known
    tasks that have no offline data, and offline a few-shot count the offline data cannot
    reproduce (`fewshot_error`)."""
    if not tasks:
        raise UsageError("--tasks: no task given")
    known = DEFAULT_TASKS + ONLINE_EXTRA
    unknown = [t for t in tasks if t not in known]
    if unknown and ddir is not None:
        unknown = [t for t in unknown if t not in benchmarks.tasks(offline_ready=True)]
    if unknown:  # maybe a stock lm-eval task: ask lm-eval's index (slow, so only now)
        every = _all_lm_eval_tasks()
        typos = [t for t in unknown if t not in every]
        if typos:
            sug = [m[0] for b in typos if (m := difflib.get_close_matches(b, known, n=1))]
            raise UsageError(f"--tasks: unknown task(s) {', '.join(typos)}"
                             + (f" (did you mean {', '.join(sug)}?)" if sug else "")
                             + f"; suite tasks: {', '.join(known)} (or any stock lm-eval "
                             "task name)")
    if ddir is None:
        return
    from experiments.eval.tasks import fewshot_error

    offline = benchmarks.tasks(offline_ready=True, order="run")
    online_only = [t for t in tasks if t not in offline]
    if online_only:
        raise UsageError(f"--tasks: no offline data for {', '.join(online_only)}: "
                            f"it runs online only (without --data / BENCH_DATA / "
                            f"${benchdata.ENV_VAR}); offline tasks: {', '.join(offline)}")
    line = fewshot_error(tasks, fewshot)
    if line:
        raise UsageError(f"--fewshot: {line}")


@functools.lru_cache(maxsize=1)
def _all_lm_eval_tasks() -> frozenset[str]:
    """Every task and group name lm-eval knows (indexing its YAMLs takes seconds)."""
    from lm_eval.tasks import TaskManager

    return frozenset(TaskManager().all_tasks)


def validate_args(argv: Sequence[str], ckpt: str | None = "<run>",
                  check_data: bool = True) -> argparse.Namespace:
    """Parse and check evaluation arguments before any compute (UsageError, one line); `ckpt`:
    the checkpoint to add, or None when argv holds it. Also `make sweep EVAL=1` at plan time."""
    argv = list(argv)
    if ckpt is not None and any(a.startswith("--out-dir") for a in argv):
        raise UsageError("--out-dir: not allowed here (each run's eval goes to its run dir)")
    a = build_parser().parse_args(argv if ckpt is None else [ckpt, *argv])
    if a.fewshot is not None and a.fewshot < 0:
        raise UsageError(f"--fewshot: {a.fewshot} must be >= 0")
    a.task_list = list(dict.fromkeys(t.strip() for t in a.tasks.split(",") if t.strip()))
    ddir = benchdata.data_dir(a.data)
    check_tasks(a.task_list, ddir, a.fewshot)
    if ddir is not None and check_data:
        benchdata.require(ddir, a.task_list)
    return a


def request_of(a: argparse.Namespace) -> EvalRequest:
    """The EvalRequest of `validate_args`'s arguments (the sweep's and `make eval`'s)."""
    return EvalRequest(tasks=tuple(a.task_list), limit=a.limit, z_mode=a.z, k=a.k,
                       fewshot=a.fewshot, data=a.data, seed=a.seed, max_gen_toks=a.max_gen_toks)


def planned_specs(a: argparse.Namespace, max_seq_len: int | None) -> dict[str, dict[str, Any]]:
    """{suite: spec} that `validate_args`'s arguments will produce on a model evaluated in this
    window (the run's train.seq_len), by the same `EvalRequest.specs` as `run_eval`'s."""
    from experiments.eval.lm_adapter import default_gen_toks

    req = request_of(a)
    ddir = benchdata.data_dir(req.data)
    gen = req.max_gen_toks if req.max_gen_toks is not None else (
        default_gen_toks(max_seq_len) if max_seq_len else None)
    specs = req.specs(gen, suite_checksums(ddir, req.suites()), max_seq_len)
    return {suite: sp.to_json() for suite, sp in specs.items()}


def _check_caches(tasks: list[str]) -> None:
    """UsageError (one line) when a cache outside the eval directory cannot be written (HF
    datasets', evalplus's ground truth)."""
    suites = suites_of(tasks)
    dirs = []
    if suites.get("lm-eval"):
        import datasets

        dirs.append(("HF datasets cache", Path(datasets.config.HF_DATASETS_CACHE),
                     "HF_DATASETS_CACHE"))
    if suites.get("evalplus"):
        from experiments.eval.evalplus_suite import gt_cache_dir

        dirs.append(("evalplus ground-truth cache", gt_cache_dir(), "XDG_CACHE_HOME"))
    for what, d, var in dirs:
        if (why := unwritable(d)) is not None:
            raise UsageError(f"{what} {d}: {why}; set {var} to a writable directory")


MAKE_VARS = {"--tasks": "TASKS", "--limit": "LIMIT", "--z": "Z", "--k": "K",
             "--fewshot": "FEWSHOT", "--data": "BENCH_DATA", "--seed": "SEED",
             "--max-gen-toks": "GEN", "--batch-size": "BS", "--threads": "THREADS"}
"""The make variable behind each flag of `make eval` (mk/eval.mk's EVAL_OPTS): a refusal names
what the user typed."""


def make_names(msg: str) -> str:
    """A refusal that opens on a flag opens on its make variable too: `argument --limit: ...`
    -> `LIMIT (--limit): ...`."""
    m = re.match(r"(?:argument )?(--[\w-]+):", msg)
    if m is None or m[1] not in MAKE_VARS:
        return msg
    return f"{MAKE_VARS[m[1]]} ({m[1]}):{msg[m.end():]}"


def _main(argv: Sequence[str]) -> int:
    try:
        a = validate_args(argv, ckpt=None, check_data=False)
    except UsageError as e:
        raise UsageError(make_names(one_line(e))) from None
    _check_caches(a.task_list)
    if a.threads > 0:
        import torch

        torch.set_num_threads(a.threads)
    try:
        written = run_eval(a.ckpt, request_of(a), EvalRuntime(
            device=a.device, batch_size=a.batch_size, threads=a.threads, out_dir=a.out_dir))
    except CheckpointError as e:  # a corrupt checkpoint: before the first file is written
        raise UsageError(str(e)) from None
    lines, bad = summary(written)
    print("\n".join(lines), flush=True)
    if bad:  # the file is written; the command still fails, so a sweep counts it as failed
        print(f"eval: error: {len(bad)} task(s) failed (recorded with null metrics): "
              + "; ".join(bad), file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return cli("eval", lambda: _main(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
