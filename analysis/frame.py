"""Result files -> pandas frames. Reads only the files docs/RESULTS.md lists, under the results
root (`$FTBENCH_RESULTS`, default `results/`), each through its typed record in
common/records.py (so nothing here knows an old layout).

`load_sweep` returns a `SweepData` whose `scores` is THE tidy frame: one row per (cell, source,
task, metric, z_mode) with the value, its stderr and n and the cell's identity (arm, kappa_bits,
latent_bits, match_h: the H of the FT a FLOPs-matched control matches, seed, run_id). Sources are
`eval` (eval/<suite>.json) and `val` (the last validation line of metrics.jsonl). Per-item scores,
training curves, evaluated checkpoints and likelihood files are frames beside it; `cells` keeps
one row per manifest cell with its state, so tables say "missing" instead of inventing a number.

One eval spec is used per (suite, z_mode): the manifest's `eval_spec_id` when it has one, else
the spec covering the most cells (full runs before LIMIT runs); files under any other spec are
listed with the reason and never reach a table. Missing is never zero: a task whose run died and
any null value read as NaN with the reason kept (`tasks`: errors, unscored items, truncation).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from common import arms
from common.io import sha256_file
from common.paths import RunDir, SweepDir, read_jsonl, results_root
from common.records import (
    EvalFile,
    LikelihoodFile,
    Manifest,
    ManifestCell,
    MetricsLine,
    RecordError,
    RunRecord,
    nan_if_none,
    spec_id,
)
from common.text import one_line

CELL_COLS = ["cell", "arm", "kappa_bits", "latent_bits", "match_h", "seed", "run_id"]
TRUNCATION_KEYS = ("n_requests", "n_truncated", "max_tokens_cut", "min_prompt_tokens_kept",
                   "gen_budget_min", "n_budget_shrunk", "gen_budget_requested")
"""A generation task's `truncation` record in an eval file (docs/RESULTS.md)."""
TASK_COLS = CELL_COLS + ["suite", "task", "file", "spec_id", "n", "error", "n_missing",
                         "missing_reasons", "has_truncation", *TRUNCATION_KEYS]
OTHER_SPEC_COLS = CELL_COLS + ["task", "file", "spec_id", "reason"]
POINT_COLS = CELL_COLS + ["task", "metric", "z_mode", "leaks", "higher_is_better", "step",
                          "tokens", "value", "spec_id", "file"]
SPEC_KEYS = ("suite", "limit", "z_mode", "k", "fewshot", "gen_tokens")
"""What makes two evaluations comparable (the spec minus its task list and data checksums)."""


_num = nan_if_none
"""JSON number or null -> float (null -> NaN, never 0)."""


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
    tasks: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=TASK_COLS))
    """One row per (cell, used eval file, task): error, unscored items, truncation record."""
    points: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=POINT_COLS))
    """Every evaluated checkpoint (EVAL_POINTS): cell identity + task, metric, z_mode, step,
    tokens (step x the run's tokens_per_step), value, from every used eval file (all steps)."""
    likelihood: list[dict] = field(default_factory=list)
    """<run>/eval/likelihood.*.json records (experiments/eval/likelihood.py), with cell identity."""
    other_specs: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(columns=OTHER_SPEC_COLS))
    """One row per (cell, task) of every eval file NOT used (another spec than the sweep's):
    so a cell with no number can say it was evaluated under another spec and name the file."""


def other_spec_files(data: SweepData, task: str) -> dict[str, str]:
    """{run_id: its eval files holding `task` under a spec the sweep does not use}, each as
    "<file> (spec <id>)" (several joined by ", ")."""
    o = data.other_specs
    if o.empty:
        return {}
    o = o[o["task"] == task]
    return {str(rid): ", ".join(f"{f} (spec {sid})" for f, sid in zip(g["file"], g["spec_id"],
                                                                       strict=True))
            for rid, g in o.groupby("run_id", sort=True)}


def other_spec_status(data: SweepData, task: str) -> str:
    """The status of a task no cell has under the sweep's spec but some under another, or ""."""
    files = other_spec_files(data, task)
    if not files:
        return ""
    names = sorted({x for v in files.values() for x in v.split(", ")})
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return ("evaluated only under another spec (never mixed into this table): "
            + ", ".join(names[:3]) + more)


def spec_key(spec: dict) -> str:
    """The comparability key of a spec: SPEC_KEYS only (task lists may differ between files)."""
    return json.dumps({k: spec.get(k) for k in SPEC_KEYS}, sort_keys=True, default=str)


def _file_rank(spec: dict) -> tuple:
    """Sort key of a spec: stock few-shot first, then full runs, then larger LIMITs."""
    limit = spec.get("limit")
    return (spec.get("fewshot") is not None, limit is not None, -(limit or 0))


def _matches_manifest(spec: dict, sid: str, man_spec: dict | None, man_id: str) -> bool:
    """A file is in the sweep's eval spec when its spec_id is the manifest's `eval_spec_id`,
    or, for a sweep evaluated on several suites (the manifest then records their union, suite
    "lm-eval+evalplus"), when it is one of those suites' specs: its suite is listed, limit,
    z-mode, k and few-shot agree, its tasks are among the union's, its generation length is
    the union's (or none: a log-likelihood-only suite) and its data checksums agree."""
    if sid == man_id:
        return True
    if not isinstance(man_spec, dict):
        return False
    inner = man_spec.get("suites")
    if isinstance(inner, dict) and any(isinstance(v, dict) and spec_id(v) == sid
                                       for v in inner.values()):
        return True
    suites = str(man_spec.get("suite") or "").split("+")
    if spec.get("suite") not in suites:
        return False
    if any(spec.get(k) != man_spec.get(k) for k in ("limit", "z_mode", "k", "fewshot")
           if k in man_spec):
        return False
    if spec.get("gen_tokens") not in (None, man_spec.get("gen_tokens")):
        return False
    tasks = man_spec.get("tasks")
    if tasks and not set(spec.get("tasks") or []) <= set(tasks):
        return False
    ms, fs = man_spec.get("data_checksums") or {}, spec.get("data_checksums") or {}
    return all(ms[k] == v for k, v in fs.items() if k in ms)


def _doc_id(item: dict, i: int) -> Any:
    """Pairing key of an item: doc_id, qualified by the subtask for groups such as MMLU."""
    did = item.get("doc_id", i)
    return f"{item['subtask']}/{did}" if item.get("subtask") else did


def _item_key(metric: str, item: dict) -> str | None:
    if metric in item:
        return metric
    short = metric.removeprefix("pass@1_")
    return short if short in item else None


def _task_row(ident: dict, suite: str, task: str, t: dict, fname: str, sid: str) -> dict:
    """The completeness record of one task of one eval file: its error, how many items were not
    scored (and why), and its generation truncation record."""
    metrics = [m for m in (t.get("metrics") or {}).values() if isinstance(m, dict)]
    miss = [_num(m.get("n_missing")) for m in metrics]
    miss = [x for x in miss if math.isfinite(x)]
    sandbox = t.get("sandbox") if isinstance(t.get("sandbox"), dict) else {}
    if not miss and math.isfinite(_num(sandbox.get("n_missing"))):
        miss = [_num(sandbox.get("n_missing"))]
    reasons: dict[str, int] = {}
    for it in t.get("items") or []:
        if isinstance(it, dict) and it.get("reason"):
            r = one_line(it["reason"])[:80]
            reasons[r] = reasons.get(r, 0) + 1
    trunc = t.get("truncation") if isinstance(t.get("truncation"), dict) else None
    err = t.get("error")
    return {**ident, "suite": suite, "task": task, "file": fname, "spec_id": sid,
            "n": _num(t.get("n")), "error": str(err) if err else None,
            "n_missing": max(miss) if miss else math.nan,
            "missing_reasons": "; ".join(f"{n}x {r}" for r, n in
                                         sorted(reasons.items(), key=lambda x: -x[1])) or None,
            "has_truncation": trunc is not None,
            **{k: _num((trunc or {}).get(k)) for k in TRUNCATION_KEYS}}


def _cell_row(root: Path, cell: ManifestCell,
              warnings: list[str]) -> tuple[dict, RunRecord | None]:
    run_id = cell.run_id
    row: dict[str, Any] = {
        "cell": cell.cell, "arm": cell.arm,
        "kappa_bits": _num(cell.kappa_bits), "latent_bits": float(cell.latent_bits),
        "seed": cell.seed, "run_id": run_id, "state": cell.state,
        "reason": cell.reason, "job_id": cell.job_id,
        "eval_state": cell.eval.state if cell.eval is not None else None,
    }
    row["match_h"] = _num(cell.match_latent_bits)
    known = arms.find(row["arm"])
    if known is not None and not known.latent:  # kappa means nothing without a latent
        row["kappa_bits"] = math.nan
    cfg = None
    run = RunDir.of(str(run_id), root) if run_id else None
    cfg_path = run.record_path if run else None
    row["has_config"] = bool(run and run.has_record)
    if run is not None and row["has_config"]:
        try:
            cfg = run.record()
        except RecordError as e:
            warnings.append(f"{cfg_path}: unreadable {cfg_path.name} ({e})")
            cfg = None
    if cfg is not None:
        model, acc, prov, train = cfg.model, cfg.accounting, cfg.provenance, cfg.train
        row.update({
            "config_sha256": sha256_file(cfg_path),
            "n_layers": _num(model.get("n_layers")), "dim": _num(model.get("dim")),
            "vocab_size": _num(model.get("vocab_size")),
            "flops_per_token": _num(acc.get("flops_per_token")),
            "flops_per_token_baseline_part": _num(acc.get("flops_per_token_baseline_part")),
            "flops_overhead": _num(acc.get("flops_overhead")),
            "params_total": _num((acc.get("params") or {}).get("total")),
            "train_tokens": _num(train.get("tokens")),
            "budget_flops_cfg": _num(train.get("flops")),
            "compute_match": train.get("compute_match"),
            "planned_tokens": _num(acc.get("tokens")), "planned_flops": _num(acc.get("flops")),
            "tokens_per_step": _num(acc.get("tokens_per_step") or (
                _num(train.get("batch_size")) * _num(train.get("seq_len")))),
            "host": prov.get("host"), "threads": _num(prov.get("threads")),
            "launcher": prov.get("launcher"),
            "git_commit": prov.get("git_commit"), "git_dirty": prov.get("git_dirty"),
            "versions": prov.get("versions") or {},
            "data_checksums": prov.get("data_checksums") or {},
            "tokenizer_sha256": prov.get("tokenizer_sha256"),
            # for the protocol check: what must not differ between arms
            "optim_json": json.dumps(dict(cfg.optim), sort_keys=True),
            "train_json": json.dumps({k: v for k, v in train.items() if k not in
                                      ("seed", "tokens", "flops", "compute_match",
                                       "match_latent_bits")},
                                     sort_keys=True),
        })
    return row, cfg


def _read_record(path: Path, cls: Any, warnings: list[str], skip: tuple[str, ...] = ()) -> Any:
    """The typed record of one JSON result file, or None with the reason in `warnings` (a file
    whose `suite` is in `skip`, another reader's, is None without one)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(raw, dict) and raw.get("suite") in skip:
            return None
        return cls.from_json(raw, path.name)
    except (json.JSONDecodeError, UnicodeDecodeError, RecordError) as e:
        warnings.append(f"{path}: unreadable ({e})")
        return None


def _read_evals(root: Path, run: RunDir, warnings: list[str]) -> list[dict]:
    """Every eval/*.json of a run with its spec (no selection yet)."""
    out = []
    for epath in run.eval_files():
        # eval/likelihood.py's and eval/probe.py's files are read elsewhere
        rec = _read_record(epath, EvalFile, warnings, skip=("likelihood", "probe"))
        if rec is None:
            continue
        spec = rec.spec.to_json()
        out.append({"path": epath, "ev": rec, "spec": spec, "spec_id": rec.spec_id,
                    "key": spec_key(spec),
                    "group": (rec.spec.suite, rec.spec.z_mode)})
    return out


def _choose_specs(per_cell: list[list[dict]], manifest: Manifest) -> tuple[dict, dict]:
    """The spec used per (suite, z_mode): (chosen key per group, reason per excluded spec_id)."""
    man_id = manifest.eval_spec_id
    man_spec = manifest.eval_spec.to_json() if manifest.eval_spec is not None else None
    excluded: dict[str, str] = {}
    cover: dict[tuple, dict[str, set]] = {}
    rank: dict[str, tuple] = {}
    for i, files in enumerate(per_cell):
        for f in files:
            if man_id and not _matches_manifest(f["spec"], f["spec_id"], man_spec, man_id):
                excluded[f["spec_id"]] = (f"spec {f['spec_id']} is not the sweep's eval spec "
                                          f"{man_id} (manifest eval_spec_id)")
                continue
            cover.setdefault(f["group"], {}).setdefault(f["key"], set()).add(i)
            rank[f["key"]] = _file_rank(f["spec"])
    chosen = {}
    for group, keys in cover.items():
        best = sorted(keys, key=lambda k: (-len(keys[k]), rank[k]))[0]
        chosen[group] = best
    for files in per_cell:
        for f in files:
            if f["spec_id"] in excluded:
                continue
            if chosen.get(f["group"]) != f["key"]:
                good = json.loads(chosen[f["group"]])
                excluded[f["spec_id"]] = (
                    f"spec {f['spec_id']} differs from the spec the sweep's other "
                    f"{f['group'][0]} cells use (limit {good.get('limit')}, few-shot "
                    f"{good.get('fewshot')}, gen tokens {good.get('gen_tokens')}, k "
                    f"{good.get('k')}); specs are never mixed in a table")
    return chosen, excluded


def load_sweep(name: str, root: str | os.PathLike | None = None) -> SweepData:
    """Read results/sweeps/<name>/manifest.json and every file its cells point to."""
    root = results_root(root)
    sweep = SweepDir.of(name, root)
    if not sweep.exists():
        raise FileNotFoundError(f"no manifest at {sweep.manifest_path} (sweeps here: "
                                f"{SweepDir.names(root)})")
    # the launcher replaces the manifest atomically, so a running sweep's is always whole
    manifest = sweep.manifest_json()
    man = Manifest.from_json(manifest, str(sweep.manifest_path))
    warnings: list[str] = []
    cell_rows, score_rows, item_frames, curve_frames, evals = [], [], [], [], []
    task_rows: list[dict] = []
    per_cell_evals: list[list[dict]] = []
    for cell in man.cells:
        row, cfg = _cell_row(root, cell, warnings)
        row["tokens_per_step"] = _num(cfg.accounting.get("tokens_per_step")) if cfg else math.nan
        ident = {k: row[k] for k in CELL_COLS}
        run = RunDir.of(str(row["run_id"]), root)
        # metrics.jsonl: curves, the last val line, the final line
        mpath = run.metrics_path
        row["has_metrics"] = run.has_metrics
        row["final_tokens"] = row["final_flops"] = row["wall_s"] = math.nan
        row["tokens_per_s"] = math.nan
        if row["has_metrics"]:
            lines = []
            for x in read_jsonl(mpath):
                try:
                    lines.append(MetricsLine.from_json(x).to_json())
                except RecordError as e:
                    warnings.append(f"{mpath}: line skipped ({e})")
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
                                       "step": last.get("step"), "tokens": last.get("tokens"),
                                       "spec_id": "", "spec_key": "",
                                       "file": mpath.name})
        row["eval_files"] = [p.name for p in run.eval_files()]
        per_cell_evals.append(_read_evals(root, run, warnings))
        cell_rows.append((row, ident))
    chosen, excluded = _choose_specs(per_cell_evals, man)
    point_rows: list[dict] = []
    other_rows: list[dict] = []
    likelihood: list[dict] = []
    for (row, ident), files in zip(cell_rows, per_cell_evals, strict=True):
        run = RunDir.of(str(row["run_id"]), root)
        for lp in run.eval_files("likelihood.*.json"):
            if (lik := _read_record(lp, LikelihoodFile, warnings)) is None:
                continue
            # model_arm: the model's kind ("baseline" | "free", compare_arms' arm); arm: the cell's
            rec = {k: v for k, v in lik.to_json().items() if k != "schema"}
            likelihood.append({**rec, **ident, "model_arm": lik.bound_record()["arm"],
                               "file": str(lp.relative_to(root))})
        for f in files:  # every checkpoint step of the used spec (curves, Table 3)
            if f["spec_id"] in excluded or f["ev"].checkpoint_step is None:
                continue
            ev = f["ev"]
            step = _num(ev.checkpoint_step)
            z_mode = ev.z_mode
            for task, t in ev.tasks.items():
                if not isinstance(t, dict):
                    continue
                for metric, m in (t.get("metrics") or {}).items():
                    m = m if isinstance(m, dict) else {"value": m}
                    point_rows.append({
                        **ident, "task": task, "metric": metric, "z_mode": z_mode,
                        "leaks": ev.leaks,
                        "higher_is_better": bool(t.get("higher_is_better", True)),
                        "step": step, "tokens": step * row["tokens_per_step"],
                        "value": _num(m.get("value")), "spec_id": f["spec_id"],
                        "file": f["path"].name})
    for (row, ident), files in zip(cell_rows, per_cell_evals, strict=True):
        taken: set[tuple[str, str]] = set()
        row["eval_excluded"] = ""
        notes = []
        # same spec twice (re-evaluated checkpoints): the latest checkpoint step wins
        for f in sorted(files, key=lambda f: (_file_rank(f["spec"]),
                                              -_num(f["ev"].checkpoint_step or -1))):
            epath, ev = f["path"], f["ev"]
            head = ev.header()
            head.update(file=str(epath.relative_to(root)), file_sha256=sha256_file(epath),
                        cell=row["cell"], spec=f["spec"], spec_id=f["spec_id"],
                        used=f["spec_id"] not in excluded,
                        excluded_reason=excluded.get(f["spec_id"], ""))
            evals.append(head)
            if f["spec_id"] in excluded:
                notes.append(f"{epath.name}: {excluded[f['spec_id']]}")
                other_rows += [{**ident, "task": task, "file": epath.name,
                                "spec_id": f["spec_id"], "reason": excluded[f["spec_id"]]}
                               for task in ev.tasks]
                continue
            z_mode, leaks = ev.z_mode, ev.leaks
            for task, t in ev.tasks.items():
                if (task, z_mode) in taken or not isinstance(t, dict):
                    continue
                taken.add((task, z_mode))
                primary = t.get("primary")
                hib = t.get("higher_is_better", True)
                info = _task_row(ident, ev.suite, task, t, epath.name, f["spec_id"])
                task_rows.append(info)
                for metric, m in (t.get("metrics") or {}).items():
                    m = m if isinstance(m, dict) else {"value": m}
                    score_rows.append({
                        **ident, "source": "eval", "suite": ev.suite,
                        "task": task, "metric": metric, "z_mode": z_mode, "leaks": leaks,
                        "value": _num(m.get("value")), "stderr": _num(m.get("stderr")),
                        "n": _num(m.get("n", t.get("n"))), "primary": metric == primary,
                        "higher_is_better": bool(hib), "spread": _num(m.get("spread")),
                        "n_missing": _num(m.get("n_missing")), "error": info["error"],
                        "n_truncated": info["n_truncated"], "n_requests": info["n_requests"],
                        "eval_seed": _num(ev.seed), "limit": _num(ev.limit),
                        "file": epath.name, "spec_id": f["spec_id"],
                        "spec_key": spec_id(json.loads(f["key"])),
                        "step": math.nan, "tokens": math.nan})
                items = t.get("items") or []
                if items:
                    for metric in t.get("metrics") or {}:
                        key = next((k for k in (_item_key(metric, it) for it in items) if k),
                                   None)
                        if key is None:
                            continue
                        item_frames.append(pd.DataFrame({
                            **{k: [v] * len(items) for k, v in ident.items()},
                            "task": task, "metric": metric, "z_mode": z_mode, "leaks": leaks,
                            "doc_id": [_doc_id(it, i) for i, it in enumerate(items)],
                            "value": [_num(it.get(key)) for it in items],
                            "spec_id": f["spec_id"]}))
        if notes:
            row["eval_excluded"] = "; ".join(notes)
            warnings.append(f"{row['cell']}: eval file(s) not used: " + "; ".join(notes))
    cells = pd.DataFrame([r for r, _ in cell_rows])
    if cells.empty:
        cells = pd.DataFrame(columns=CELL_COLS + ["state"])
    scores = pd.DataFrame(score_rows)
    if scores.empty:
        scores = pd.DataFrame(columns=CELL_COLS + ["source", "suite", "task", "metric", "z_mode",
                                                   "leaks", "value", "stderr", "n", "primary",
                                                   "higher_is_better", "spread", "spec_id",
                                                   "spec_key", "file", "n_missing", "error",
                                                   "n_truncated", "n_requests"])
    items = pd.concat(item_frames, ignore_index=True) if item_frames else pd.DataFrame(
        columns=CELL_COLS + ["task", "metric", "z_mode", "leaks", "doc_id", "value", "spec_id"])
    curves = pd.concat(curve_frames, ignore_index=True) if curve_frames else pd.DataFrame(
        columns=CELL_COLS + ["kind", "step", "tokens", "flops"])
    tasks = pd.DataFrame(task_rows, columns=TASK_COLS)
    points = pd.DataFrame(point_rows, columns=POINT_COLS).drop_duplicates(
        ["run_id", "task", "metric", "z_mode", "step"])
    return SweepData(name=name, root=root, manifest=manifest, cells=cells, scores=scores,
                     items=items, curves=curves, evals=evals, warnings=warnings, tasks=tasks,
                     points=points, likelihood=likelihood,
                     other_specs=pd.DataFrame(other_rows, columns=OTHER_SPEC_COLS))
