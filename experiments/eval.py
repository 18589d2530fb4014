"""`make eval CKPT=...`: score a checkpoint on GSM8K, MMLU, ARC-E/C, CSQA (lm-eval) and
HumanEval+, MBPP+ (evalplus), plus gold-answer bits per byte, offline or online.

Design choices:
- the model is wrapped natively for lm-eval (`experiments.lm_adapter.FTBenchLM`); the stock task
  names and their prompts, few-shot defaults and metrics are used as they are. Offline, the same
  stock YAMLs are pointed at local files (`experiments.tasks`), after the files are checked
  against the pinned sha256 sums (`experiments.benchdata`);
- Free Transformer modes (DESIGN.md §6): `prior` (default; one draw of Z, seed recorded),
  `prior-k` (likelihood averaged over k draws, spread reported), `posterior` (leaks; the result
  file says `"leaks": true`);
- results go to `<run dir>/eval/<suite>.json` (docs/RESULTS.md), suites `lm-eval` and
  `evalplus`. A run that is not the default full one gets a suffix, so a quick LIMIT or
  diagnostic run never overwrites it: `lm-eval.json`, `lm-eval.posterior.json`,
  `lm-eval.limit20.json`;
- resumable: every finished request is written to a sqlite cache (lm-eval's CachingLM) keyed by
  checkpoint identity, z-mode, k and seed, so a re-run after an interruption skips what is done.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from experiments import benchdata
from model.checkpoint import atomic_write_text

LM_EVAL_TASKS = ("gsm8k", "mmlu", "arc_easy", "arc_challenge", "commonsense_qa")
EVALPLUS_TASKS = ("humaneval_plus", "mbpp_plus")
DEFAULT_TASKS = LM_EVAL_TASKS + EVALPLUS_TASKS
# The rest of the paper's table, through stock task names; they need the network (their data is
# not in ../shared/benchmarks), so they are not in the default set.
ONLINE_EXTRA = ("hellaswag", "winogrande", "openbookqa", "piqa", "race", "boolq",
                "nq_open", "triviaqa")
SCHEMA = "ftbench-eval-v1"


# ---------------------------------------------------------------------------- helpers
def results_root() -> Path:
    return Path(os.environ.get("FTBENCH_RESULTS", "results"))


def run_paths(ckpt: Path) -> tuple[str, Path]:
    """(run_id, eval dir) for a checkpoint at <run dir>/checkpoints/<name>.pt."""
    run_dir = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent
    return run_dir.name, run_dir / "eval"


def ckpt_identity(ckpt: Path) -> str:
    st = ckpt.stat()
    return hashlib.sha256(f"{ckpt.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, cwd=Path(__file__).parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {"python": platform.python_version()}
    for pkg in ("lm_eval", "evalplus", "torch", "transformers", "datasets"):
        try:
            out[pkg] = version(pkg.replace("_", "-"))
        except PackageNotFoundError:
            out[pkg] = None
    return out


def _atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1, default=_json_default))


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


def suite_file(suite: str, z: str, limit: int | None, fewshot: int | None, k: int) -> str:
    parts = [suite]
    if z != "prior":
        parts.append(z if z != "prior-k" else f"prior-k{k}")
    if fewshot is not None:
        parts.append(f"fewshot{fewshot}")
    if limit is not None:
        parts.append(f"limit{limit}")
    return ".".join(parts) + ".json"


# ---------------------------------------------------------------------------- lm-eval suite
_PRIMARY = {"gsm8k": ("exact_match,strict-match", True), "mmlu": ("acc,none", True)}


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
    primary = _PRIMARY.get(name, ("acc,none", True))[0].replace(",none", "")
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


def _prior_k_spread(samples: list[dict], lm: Any) -> dict[str, float]:
    """Std over the k draws of acc / acc_norm (multiple-choice tasks, prior-k only)."""
    if getattr(lm, "k", 1) <= 1 or not samples:
        return {}
    acc: dict[int, list[float]] = defaultdict(list)
    accn: dict[int, list[float]] = defaultdict(list)
    for s in samples:
        args = s.get("arguments")
        if not isinstance(args, (list, dict)):
            return {}
        pairs = [tuple(a) for a in args] if isinstance(args, list) else \
            [(a["arg_0"], a["arg_1"]) for a in args.values()]
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


class _DropCustomDatasetNotice(logging.Filter):
    """lm-eval warns once per task that uses `custom_dataset` (57 MMLU subjects offline)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Custom kwargs can be passed" not in record.getMessage()


def run_lm_eval(lm: Any, tasks: list[str], limit: int | None, fewshot: int | None,
                data: Path | None, eval_dir: Path, cache: Path, seed: int) -> dict[str, dict]:
    import lm_eval
    from lm_eval.tasks import TaskManager, get_task_dict

    if data is not None:
        from experiments.tasks import offline_task_manager

        logging.getLogger("lm_eval.api.task").addFilter(_DropCustomDatasetNotice())
        tm = offline_task_manager(data, eval_dir / ".tasks")
    else:
        tm = TaskManager()
    out = lm_eval.simple_evaluate(
        model=lm, tasks=tasks, num_fewshot=fewshot, limit=limit, use_cache=str(cache),
        log_samples=True, task_manager=tm, bootstrap_iters=1000, random_seed=seed,
        numpy_random_seed=seed, torch_random_seed=seed)
    res, samples = out["results"], out["samples"]
    nsam = out.get("n-samples", {})
    shots = out.get("n-shot", {})
    groups = out.get("group_subtasks", {})
    entries: dict[str, dict] = {}
    for t in tasks:
        subs = _leaves(t, groups)
        if subs != [t]:
            smp = [s | {"_subtask": st} for st in subs for s in samples.get(st, [])]
            n = sum(nsam.get(st, {}).get("effective", 0) for st in subs)
            fs = shots.get(subs[0], 0) if subs else 0
        else:
            smp = samples.get(t, [])
            n = nsam.get(t, {}).get("effective", len(smp))
            fs = shots.get(t, 0)
        entries[t] = _task_entry(t, res.get(t, {}), smp, n, int(fs), lm)
    if "gsm8k" in tasks:
        task = get_task_dict(["gsm8k"], tm)["gsm8k"]
        docs = list(task.eval_docs)[: limit or None]
        delim = task.config.target_delimiter
        pairs = [(task.doc_to_text(d), delim + task.doc_to_target(d)) for d in docs]
        from experiments.evalplus_run import gold_bpb

        entries["gsm8k_gold_bpb"] = gold_bpb(lm, pairs)
    return entries


def _leaves(t: str, groups: dict[str, list[str]]) -> list[str]:
    if t not in groups:
        return [t]
    out: list[str] = []
    for s in groups[t]:
        out += _leaves(s, groups)
    return out


# ---------------------------------------------------------------------------- main entry
def run_eval(ckpt: str | os.PathLike, tasks: list[str] | None = None, limit: int | None = None,
             z: str = "prior", k: int = 1, fewshot: int | None = None,
             data: str | os.PathLike | None = None, seed: int = 0, batch_size: int = 16,
             device: str = "cpu", max_gen_toks: int = 256, progress: bool = True,
             out_dir: str | os.PathLike | None = None) -> dict[str, Path]:
    """Evaluate a checkpoint; returns {suite: path of the result JSON}."""
    from experiments.lm_adapter import Z_MODES, FTBenchLM, resolve_checkpoint

    tasks = list(tasks or DEFAULT_TASKS)
    if z not in Z_MODES:
        raise ValueError(f"z={z!r}: allowed {Z_MODES}")
    k = int(k) if z == "prior-k" else 1
    ck = resolve_checkpoint(ckpt)
    run_id, eval_dir = run_paths(ck)
    if out_dir is not None:
        eval_dir = Path(out_dir)
    ddir = benchdata.data_dir(data)
    checks: dict[str, str] = {}
    if ddir is not None:
        from experiments.tasks import OFFLINE_TASKS

        no_data = [t for t in tasks if t not in OFFLINE_TASKS + EVALPLUS_TASKS]
        if no_data:
            raise benchdata.DataError(f"no offline data for {', '.join(no_data)}: run them "
                                      "online (without DATA / $FTBENCH_DATA)")
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        chk = benchdata.verify(ddir, tasks)
        print(chk.line(), flush=True)
        if not chk.ok:
            raise benchdata.DataError(chk.line())
        checks = chk.checksums
        from experiments.evalplus_run import set_override_env

        set_override_env(ddir)  # before anything imports evalplus
    lm = FTBenchLM(checkpoint=str(ck), z=z, k=k, seed=seed, batch_size=batch_size,
                   device=device, max_gen_toks=max_gen_toks, progress=progress)
    cache_dir = eval_dir / ".cache"
    cache_key = f"{ckpt_identity(ck)[:16]}-{z}-k{k}-s{seed}-g{max_gen_toks}"
    head = {"schema": SCHEMA, "run_id": run_id, "checkpoint": str(ck),
            "arm": "free" if lm.is_free else "baseline", "z_mode": z if lm.is_free else "prior",
            "k": k, "leaks": lm.leaks, "seed": seed, "limit": limit, "fewshot_override": fewshot,
            "data_dir": str(ddir) if ddir else None, "versions": versions(),
            "data_checksums": checks, "git_commit": git_commit(),
            "max_seq_len": lm.max_length, "argv": sys.argv}
    written: dict[str, Path] = {}
    suites = [("lm-eval", [t for t in tasks if t not in EVALPLUS_TASKS]),
              ("evalplus", [t for t in tasks if t in EVALPLUS_TASKS])]
    for suite, names in suites:
        if not names:
            continue
        t0 = time.time()
        n0 = _request_count(lm)
        if suite == "lm-eval":
            entries = run_lm_eval(lm, names, limit, fewshot, ddir, eval_dir,
                                  cache_dir / f"lm-eval-{cache_key}", seed)
        else:
            from lm_eval.api.model import CachingLM

            from experiments.evalplus_run import run_task

            cached = CachingLM(lm, str(cache_dir / f"evalplus-{cache_key}.db"))
            entries = {}
            for t in names:
                entries |= run_task(_GenVia(cached, lm), t, ddir, limit,
                                    eval_dir / ".evalplus" / cache_key, max_gen_toks)
        elapsed = time.time() - t0
        nreq = _request_count(lm) - n0
        doc = head | {"suite": suite, "elapsed_s": round(elapsed, 2),
                      "requests": nreq, "requests_per_s": nreq / elapsed if elapsed else None,
                      "tasks": entries}
        path = eval_dir / suite_file(suite, doc["z_mode"], limit, fewshot, k)
        _atomic_write_json(path, doc)
        print(f"wrote {path}: " + ", ".join(
            f"{t}={_fmt(e)}" for t, e in entries.items()), flush=True)
        written[suite] = path
    return written


class _GenVia:
    """generate_until through the sqlite cache; everything else straight to the adapter."""

    def __init__(self, cached: Any, lm: Any) -> None:
        self._cached, self._lm = cached, lm

    def generate_until(self, reqs: list) -> list[str]:
        return self._cached.generate_until(reqs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lm, name)


def _request_count(lm: Any) -> int:
    return getattr(lm, "n_requests", 0)


def _fmt(e: dict) -> str:
    v = e["metrics"].get(e["primary"], {}).get("value")
    return "null" if v is None else f"{v:.4f}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Evaluate a checkpoint (docs/RESULTS.md schema).")
    ap.add_argument("ckpt", help="run dir or checkpoint .pt")
    ap.add_argument("--tasks", default=",".join(DEFAULT_TASKS),
                    help=f"comma-separated; default {','.join(DEFAULT_TASKS)}; online also "
                         f"{','.join(ONLINE_EXTRA)}")
    ap.add_argument("--limit", type=int, default=None, help="first n documents per task")
    ap.add_argument("--z", default="prior", choices=["prior", "prior-k", "posterior"])
    ap.add_argument("--k", type=int, default=4, help="draws of Z for --z prior-k")
    ap.add_argument("--fewshot", type=int, default=None, help="override the stock few-shot count")
    ap.add_argument("--data", default=None,
                    help=f"offline benchmark dir (else ${benchdata.ENV_VAR}, else online)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-gen-toks", type=int, default=256)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch intra-op threads (0 = torch's default; 1 is faster on a busy CPU)")
    ap.add_argument("--out-dir", default=None, help="default <run dir>/eval")
    a = ap.parse_args(argv)
    tasks = [t.strip() for t in a.tasks.split(",") if t.strip()]
    if a.threads > 0:
        import torch

        torch.set_num_threads(a.threads)
    try:
        run_eval(a.ckpt, tasks, a.limit, a.z, a.k, a.fewshot, a.data, a.seed, a.batch_size,
                 a.device, a.max_gen_toks, out_dir=a.out_dir)
    except benchdata.DataError as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
