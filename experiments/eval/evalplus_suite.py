"""HumanEval+ and MBPP+ through evalplus: greedy completions, pass@1 (base, plus), gold bpb.
Completion is direct (a base model continues the prompt) with evalplus's base-model and the
Codex paper's stop strings; each sample runs in its own sandbox and evalplus's comparison
decides in a process that never ran model code (`codecheck`); a check that could not be made
is null with a reason, never 0. Gold bpb: bits per byte of the canonical solution.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import statistics
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from common import benchmarks
from experiments.eval import codecheck

DATASETS = {b.task: (str(b.stock), b.offline[0]) for b in benchmarks.BENCHMARKS
            if b.suite == "evalplus" and b.task}
"""task -> (evalplus's dataset name, its offline file): each row of common.benchmarks."""
OVERRIDE_VARS = {"humaneval": "HUMANEVAL_OVERRIDE_PATH", "mbpp": "MBPP_OVERRIDE_PATH"}
"""evalplus's dataset name -> the variable that points evalplus at a local copy."""
# evalplus's stop strings for base models, and the Codex paper's for a new top-level statement
STOP = ["<|endoftext|>", "<|endofmask|>", "</s>", "\nif __name__", "\ndef main(", "\nprint(",
        "\nclass ", "\ndef ", "\n#", "\nassert ", '\n"""', "\n```"]


def load_problems(task: str, data_dir: Path | None, limit: int | None) -> list[dict[str, Any]]:
    """The first `limit` problems of a task's evalplus dataset (its offline copy, else
    evalplus's download)."""
    name, rel = DATASETS[task]
    if data_dir is not None:
        path = data_dir / rel
    else:
        from evalplus.data import humaneval, mbpp  # downloads into evalplus's cache

        path = Path(humaneval._ready_human_eval_plus_path() if name == "humaneval"
                    else mbpp._ready_mbpp_plus_path())
    with open(path, encoding="utf-8") as f:
        return list(itertools.islice((json.loads(x) for x in f if x.strip()), limit))


def run_task(lm: Any, task: str, data_dir: Path | None, limit: int | None, workdir: Path,
             max_gen_toks: int = 384, timeout_s: float | None = None,
             parallel: int = 2) -> dict[str, dict]:
    """Score one evalplus task; returns {task: task_entry, task_gold_bpb: task_entry}."""
    name, _ = DATASETS[task]
    workdir.mkdir(parents=True, exist_ok=True)
    probs = load_problems(task, data_dir, limit)
    gen_kw = {"until": STOP, "max_gen_toks": max_gen_toks, "do_sample": False}
    reqs = [SimpleNamespace(args=(p["prompt"], gen_kw)) for p in probs]
    completions = lm.generate_until(reqs)
    samples = workdir / f"{task}_samples.jsonl"
    samples.write_text("".join(
        json.dumps({"task_id": p["task_id"], "solution": p["prompt"] + c}) + "\n"
        for p, c in zip(probs, completions, strict=True)), encoding="utf-8")
    budget = timeout_s or 120 + 20 * len(probs)
    rep = codecheck.evaluate(name, probs, {p["task_id"]: p["prompt"] + c
                                           for p, c in zip(probs, completions, strict=True)},
                             parallel=parallel, budget_s=budget, cache_dir=gt_cache_dir())
    items = []
    for i, p in enumerate(probs):
        o = rep.outcomes[p["task_id"]]
        base = None if o.base.status is None else float(o.base.status == "pass")
        # plus counts only on top of base, as evalplus's pass@1 (base+extra) does
        plus = 0.0 if base == 0.0 else (None if o.plus.status is None
                                        else float(o.plus.status == "pass"))
        it = {"doc_id": i, "task_id": p["task_id"], "base": base, "plus": plus,
              "base_status": o.base.status, "plus_status": o.plus.status,
              "completion": completions[i]}
        reason = o.base.reason or (o.plus.reason if plus is None else None)
        if reason:
            it["reason"] = reason
        items.append(it)
    n = len(items)
    metrics = {m: pass_metric([it[k] for it in items])
               for m, k in (("pass@1_base", "base"), ("pass@1_plus", "plus"))}
    scored = sum(it["base"] is not None for it in items)
    entry = {"primary": "pass@1_plus", "higher_is_better": True, "n": n, "fewshot": 0,
             "metrics": metrics, "items": items,
             "sandbox": {"isolation": rep.isolation, "scored": scored, "n_missing": n - scored,
                         "timed_out": rep.budget_exhausted, "budget_s": round(budget, 1),
                         "elapsed_s": round(rep.elapsed_s, 2), "sandboxes": rep.sandboxes,
                         "leftovers_killed": rep.leftovers_killed},
             # from the rule alone, so it covers requests answered from the cache too
             "truncation": lm.truncation_record([r.args for r in reqs])}
    gold = gold_bpb(lm, [(p["prompt"], p["canonical_solution"]) for p in probs])
    return {task: entry, f"{task}_gold_bpb": gold}


def gt_cache_dir() -> Path:
    """Where expected outputs (canonical solutions run in the sandbox) are cached, as evalplus
    caches its ground truth; model code never sees this directory."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ftbench" / "evalplus-gt"


def pass_metric(xs: list[float | None]) -> dict[str, Any]:
    """Mean over scored items only; missing items (None) are counted, never read as 0."""
    scored = [x for x in xs if x is not None]
    m = _mean_metric(scored)
    m["n_missing"] = len(xs) - len(scored)
    return m


def _mean_metric(xs: list[float]) -> dict[str, Any]:
    n = len(xs)
    if n == 0:
        return {"value": None, "stderr": None, "n": 0}
    se = statistics.stdev(xs) / math.sqrt(n) if n > 1 else None
    return {"value": sum(xs) / n, "stderr": se, "n": n}


def gold_bpb(lm: Any, pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """Bits per UTF-8 byte of each gold continuation given its context: total bits / total
    bytes (as nanochat's evaluate_bpb); stderr of the per-item mean; prior-k: `spread`."""
    scores = lm.loglikelihood_pairs(pairs)
    items, bits, nbytes = [], 0.0, 0
    per_draw: list[float] | None = None
    for i, ((ctx, cont), (ll, _)) in enumerate(zip(pairs, scores, strict=True)):
        # lm-eval moves the context's trailing whitespace into the scored continuation
        nb = len((ctx[len(ctx.rstrip()):] + cont).encode("utf-8"))
        b = -ll / math.log(2)
        items.append({"doc_id": i, "bpb": b / nb, "bits": b, "bytes": nb})
        bits += b
        nbytes += nb
        draws = lm.draw_logliks.get((ctx, cont))  # the key the adapter stores draws under
        if draws is not None and len(draws) > 1:
            per_draw = [0.0] * len(draws) if per_draw is None else per_draw
            for j, d in enumerate(draws):
                per_draw[j] += -d / math.log(2)
    m = _mean_metric([it["bpb"] for it in items])
    m["value"] = bits / nbytes if nbytes else None
    if per_draw is not None and nbytes:
        m["spread"] = statistics.pstdev([x / nbytes for x in per_draw])
    return {"primary": "bpb", "higher_is_better": False, "n": len(items), "fewshot": 0,
            "metrics": {"bpb": m}, "items": items}


def set_override_env(data_dir: Path | None) -> None:
    """Point evalplus at the offline files; must run before evalplus is imported."""
    if data_dir is None:
        return
    for name, rel in DATASETS.values():
        os.environ.setdefault(OVERRIDE_VARS[name], str(data_dir / rel))
