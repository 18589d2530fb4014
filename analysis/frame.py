"""Result files -> pandas frames. Reads only the files docs/RESULTS.md lists, under the results
root (`$FTBENCH_RESULTS`, default `results/`).

`load_sweep` returns a `SweepData` whose `scores` is THE tidy frame: one row per
(cell, source, task, metric, z_mode) with the value, its stderr and n, and the cell's identity
(arm, kappa_bits, latent_bits, seed, run_id). Sources are `eval` (eval/<suite>.json) and `val`
(the last `kind: val` line of metrics.jsonl). Per-item scores (for the paired bootstrap) and
training curves are long frames beside it. A cell whose run has not written a file simply has
no rows there; `cells` keeps one row per manifest cell with its state, so tables can say
"missing" instead of inventing a number.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

ARMS = ("baseline", "free", "baseline_flops", "baseline_plus1")
CELL_COLS = ["cell", "arm", "kappa_bits", "latent_bits", "seed", "run_id"]


def results_root(root: str | os.PathLike | None = None) -> Path:
    """The results root: the argument, else $FTBENCH_RESULTS, else ./results."""
    return Path(root if root is not None else os.environ.get("FTBENCH_RESULTS", "results"))


def list_sweeps(root: str | os.PathLike | None = None) -> list[str]:
    base = results_root(root) / "sweeps"
    return sorted(p.parent.name for p in base.glob("*/manifest.json"))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _num(x: Any) -> float:
    """JSON number or null -> float (null -> NaN, never 0)."""
    if x is None or isinstance(x, bool):
        return math.nan
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def read_jsonl(path: Path) -> list[dict]:
    """Lines of a JSONL file; a truncated last line (a run still writing) is skipped."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


@dataclass
class SweepData:
    name: str
    root: Path
    manifest: dict
    cells: pd.DataFrame
    """One row per manifest cell: identity, state, what files exist, accounting, provenance."""
    scores: pd.DataFrame
    """The tidy frame: cell identity + source, suite, task, metric, z_mode, leaks, value..."""
    items: pd.DataFrame
    """Per-item scores: cell identity + task, metric, z_mode, doc_id, value."""
    curves: pd.DataFrame
    """metrics.jsonl lines (train and val) with the cell identity."""
    evals: list[dict] = field(default_factory=list)
    """Eval-file headers (no tasks) for the provenance footer."""
    warnings: list[str] = field(default_factory=list)


def _file_rank(ev: dict) -> tuple:
    """Sort key of an eval file: full runs first, then larger LIMITs; stock few-shot first."""
    limit = ev.get("limit")
    return (ev.get("fewshot_override") is not None, limit is not None, -(limit or 0))


def _doc_id(item: dict, i: int) -> Any:
    """Pairing key of an item: doc_id, qualified by the subtask for groups such as MMLU."""
    did = item.get("doc_id", i)
    return f"{item['subtask']}/{did}" if item.get("subtask") else did


def _item_key(metric: str, item: dict) -> str | None:
    if metric in item:
        return metric
    short = metric.removeprefix("pass@1_")
    return short if short in item else None


def _cell_row(root: Path, cell: dict, warnings: list[str]) -> tuple[dict, dict | None]:
    run_id = cell.get("run_id")
    row: dict[str, Any] = {
        "cell": cell.get("cell"), "arm": cell.get("arm"),
        "kappa_bits": _num(cell.get("kappa_bits")), "latent_bits": _num(cell.get("latent_bits")),
        "seed": cell.get("seed"), "run_id": run_id, "state": cell.get("state", "unknown"),
        "reason": cell.get("reason"), "job_id": cell.get("job_id"),
        "eval_state": (cell.get("eval") or {}).get("state"),
    }
    if row["arm"] in ("baseline", "baseline_flops", "baseline_plus1"):
        row["kappa_bits"], row["latent_bits"] = math.nan, 0.0
    cfg = None
    run_dir = root / "runs" / str(run_id) if run_id else None
    cfg_path = run_dir / "config.yaml" if run_dir else None
    row["has_config"] = bool(cfg_path and cfg_path.is_file())
    if row["has_config"]:
        try:
            cfg = yaml.safe_load(cfg_path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as e:
            warnings.append(f"{cfg_path}: unreadable config.yaml ({e})")
            cfg = None
    if cfg is not None:
        model = cfg.get("model") or {}
        acc = cfg.get("accounting") or {}
        prov = cfg.get("provenance") or {}
        train = cfg.get("train") or {}
        row.update({
            "config_sha256": _sha256(cfg_path),
            "n_layers": _num(model.get("n_layers")), "dim": _num(model.get("dim")),
            "vocab_size": _num(model.get("vocab_size")),
            "flops_per_token": _num(acc.get("flops_per_token")),
            "flops_per_token_baseline_part": _num(acc.get("flops_per_token_baseline_part")),
            "flops_overhead": _num(acc.get("flops_overhead")),
            "params_total": _num((acc.get("params") or {}).get("total")),
            "train_tokens": _num(train.get("tokens")),
            "git_commit": prov.get("git_commit"), "git_dirty": prov.get("git_dirty"),
            "versions": prov.get("versions") or {},
            "data_checksums": prov.get("data_checksums") or {},
            "tokenizer_sha256": prov.get("tokenizer_sha256"),
            # for the protocol check: what must not differ between arms
            "optim_json": json.dumps(cfg.get("optim") or {}, sort_keys=True),
            "train_json": json.dumps({k: v for k, v in train.items() if k not in
                                      ("seed", "tokens", "flops", "compute_match",
                                       "match_latent_bits")},
                                     sort_keys=True),
        })
        if row["arm"] is None:
            row["arm"] = cfg.get("arm")
    return row, cfg


def load_sweep(name: str, root: str | os.PathLike | None = None) -> SweepData:
    """Read results/sweeps/<name>/manifest.json and every file its cells point to."""
    root = results_root(root)
    man_path = root / "sweeps" / name / "manifest.json"
    if not man_path.is_file():
        raise FileNotFoundError(f"no manifest at {man_path} (sweeps here: {list_sweeps(root)})")
    for attempt in range(3):  # a running sweep rewrites its manifest; read a complete one
        try:
            manifest = json.loads(man_path.read_text(encoding="utf-8"))
            break
        except json.JSONDecodeError:
            if attempt == 2:
                raise
            time.sleep(0.5)
    warnings: list[str] = []
    cell_rows, score_rows, item_frames, curve_frames, evals = [], [], [], [], []
    for cell in manifest.get("cells", []):
        row, _ = _cell_row(root, cell, warnings)
        ident = {k: row[k] for k in CELL_COLS}
        run_dir = root / "runs" / str(row["run_id"])
        # metrics.jsonl: curves, the last val line, the final line
        mpath = run_dir / "metrics.jsonl"
        row["has_metrics"] = mpath.is_file()
        row["final_tokens"] = row["final_flops"] = row["wall_s"] = math.nan
        row["tokens_per_s"] = math.nan
        if row["has_metrics"]:
            lines = read_jsonl(mpath)
            if lines:
                cf = pd.DataFrame(lines)
                for k, v in ident.items():
                    cf[k] = v
                curve_frames.append(cf)
            train = [x for x in lines if x.get("kind") == "train"]
            tps = [_num(x.get("tokens_per_s")) for x in train]
            tps = [t for t in tps[len(tps) // 5:] if math.isfinite(t)]  # skip warm-up steps
            if tps:
                row["tokens_per_s"] = float(pd.Series(tps).median())
            final = [x for x in lines if x.get("kind") == "final"]
            if final:
                row["final_tokens"] = _num(final[-1].get("tokens"))
                row["final_flops"] = _num(final[-1].get("flops"))
                row["wall_s"] = _num(final[-1].get("wall_s"))
            vals = [x for x in lines if x.get("kind") == "val"]
            if vals:
                last = vals[-1]
                for k, v in last.items():
                    if k in ("kind", "step", "tokens", "flops") or not isinstance(
                            v, (int, float, type(None))) or isinstance(v, bool):
                        continue
                    score_rows.append({**ident, "source": "val", "suite": "val", "task": "val",
                                       "metric": k, "z_mode": "prior", "leaks": False,
                                       "value": _num(v), "stderr": math.nan, "n": math.nan,
                                       "primary": k == "val_ce", "higher_is_better": False,
                                       "spread": math.nan, "eval_seed": math.nan,
                                       "step": last.get("step"), "tokens": last.get("tokens")})
        # eval/<suite>.json
        eval_dir = run_dir / "eval"
        row["eval_files"] = sorted(p.name for p in eval_dir.glob("*.json")) \
            if eval_dir.is_dir() else []
        loaded = []
        for epath in sorted(eval_dir.glob("*.json")) if eval_dir.is_dir() else []:
            try:
                loaded.append((epath, json.loads(epath.read_text(encoding="utf-8"))))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                warnings.append(f"{epath}: unreadable ({e})")
        # several files may score the same task (lm-eval.json, lm-eval.limit20.json, ...): the
        # full run wins, else the largest LIMIT; a few-shot override never beats the stock one
        loaded.sort(key=lambda x: _file_rank(x[1]))
        taken: set[tuple[str, str]] = set()
        for epath, ev in loaded:
            head = {k: v for k, v in ev.items() if k != "tasks"}
            head["file"] = str(epath.relative_to(root))
            head["file_sha256"] = _sha256(epath)
            head["cell"] = row["cell"]
            evals.append(head)
            z_mode = ev.get("z_mode") or "prior"
            leaks = bool(ev.get("leaks", z_mode == "posterior"))
            for task, t in (ev.get("tasks") or {}).items():
                if (task, z_mode) in taken:
                    continue
                taken.add((task, z_mode))
                primary = t.get("primary")
                hib = t.get("higher_is_better", True)
                for metric, m in (t.get("metrics") or {}).items():
                    m = m if isinstance(m, dict) else {"value": m}
                    score_rows.append({
                        **ident, "source": "eval", "suite": ev.get("suite", epath.stem),
                        "task": task, "metric": metric, "z_mode": z_mode, "leaks": leaks,
                        "value": _num(m.get("value")), "stderr": _num(m.get("stderr")),
                        "n": _num(m.get("n", t.get("n"))), "primary": metric == primary,
                        "higher_is_better": bool(hib), "spread": _num(m.get("spread")),
                        "eval_seed": _num(ev.get("seed")), "limit": _num(ev.get("limit")),
                        "file": epath.name, "step": math.nan, "tokens": math.nan})
                items = t.get("items") or []
                if items:
                    for metric in t.get("metrics") or {}:
                        key = _item_key(metric, items[0])
                        if key is None:
                            continue
                        item_frames.append(pd.DataFrame({
                            **{k: [v] * len(items) for k, v in ident.items()},
                            "task": task, "metric": metric, "z_mode": z_mode, "leaks": leaks,
                            "doc_id": [_doc_id(it, i) for i, it in enumerate(items)],
                            "value": [_num(it.get(key)) for it in items]}))
        cell_rows.append(row)
    cells = pd.DataFrame(cell_rows)
    if cells.empty:
        cells = pd.DataFrame(columns=CELL_COLS + ["state"])
    scores = pd.DataFrame(score_rows)
    if scores.empty:
        scores = pd.DataFrame(columns=CELL_COLS + ["source", "suite", "task", "metric", "z_mode",
                                                   "leaks", "value", "stderr", "n", "primary",
                                                   "higher_is_better", "spread"])
    items = pd.concat(item_frames, ignore_index=True) if item_frames else pd.DataFrame(
        columns=CELL_COLS + ["task", "metric", "z_mode", "leaks", "doc_id", "value"])
    curves = pd.concat(curve_frames, ignore_index=True) if curve_frames else pd.DataFrame(
        columns=CELL_COLS + ["kind", "step", "tokens", "flops"])
    return SweepData(name=name, root=root, manifest=manifest, cells=cells, scores=scores,
                     items=items, curves=curves, evals=evals, warnings=warnings)


def tidy_frame(name: str, root: str | os.PathLike | None = None) -> pd.DataFrame:
    """The one tidy frame of a sweep (see `SweepData.scores`)."""
    return load_sweep(name, root).scores
