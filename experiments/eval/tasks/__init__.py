"""Offline lm-eval tasks (docs/BENCHMARKS.md): `build_offline_tasks(data_dir, out_dir)` writes one
YAML per task that `include:`s the stock YAML and overrides only where the data comes from, so
names, prompts, few-shot settings and metrics stay stock. The offline copies hold only the
split each stock task evaluates: `fewshot_error` refuses a few-shot request for a task in
NO_FEWSHOT_SOURCE. Each task's facts are its row in common/benchmarks.py.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import yaml

from common import benchmarks
from common.io import atomic_write_text

STOCK = Path(importlib.util.find_spec("lm_eval").origin).parent / "tasks"
"""lm-eval's stock task YAMLs (found without importing lm-eval: `benchdata`, in this package,
is read at a sweep's plan time)."""
OFFLINE_TASKS = benchmarks.tasks(suite="lm-eval", offline_ready=True)
"""The lm-eval tasks with an offline copy (common.benchmarks), in the paper's order."""
NO_FEWSHOT_SOURCE = benchmarks.tasks(suite="lm-eval", offline_ready=True, fewshot_source=False)
"""Stock few-shot examples come from a train split these offline copies do not have (ARC's
train split is missing too); MMLU (dev), GSM8K and CommonsenseQA (train) have theirs."""
_U = "experiments.eval.tasks.offline_utils"


class _Fn(str):
    """A `!function` tag in the written YAML."""


yaml.SafeDumper.add_representer(_Fn, lambda d, v: d.represent_scalar("!function", str(v)))


def stock_yaml(task: str) -> Path:
    """The stock lm-eval YAML of a task (its benchmark row's `stock`)."""
    return STOCK / str(benchmarks.benchmark(task).stock)


def fewshot_error(tasks: list[str], fewshot: int | None) -> str | None:
    """One line naming the offline tasks a few-shot request cannot reproduce (None if fine)."""
    bad = [t for t in tasks if t in NO_FEWSHOT_SOURCE]
    if not fewshot or not bad:
        return None
    return (f"offline data has no few-shot source (train split) for {', '.join(bad)}: "
            f"fewshot={fewshot} would draw examples from the evaluation split; run them at "
            "their stock 0 shots, or online")


def mmlu_subjects() -> list[str]:
    d = STOCK / "mmlu" / "default"
    return sorted(p.stem[len("mmlu_"):] for p in d.glob("mmlu_*.yaml"))


def grouped(task: str) -> tuple[int, int] | None:
    """(subjects, choices per question) of a task that is a group of subjects (`--limit n`
    takes n questions of each), else None."""
    return (len(mmlu_subjects()), 4) if task == "mmlu" else None


def task_configs(data_dir: str | os.PathLike) -> dict[str, dict]:
    """file name -> YAML content for every offline task."""
    d = Path(data_dir).resolve()

    def local(task: str, files: dict[str, str], **kw: object) -> dict:
        return {"include": str(stock_yaml(task)), "dataset_path": "json", "dataset_name": None,
                "dataset_kwargs": {"data_files": {s: str(d / r) for s, r in files.items()}}, **kw}

    out: dict[str, dict] = {
        "gsm8k.yaml": local("gsm8k", {"train": "gsm8k/train.jsonl", "test": "gsm8k/test.jsonl"}),
        "commonsense_qa.yaml": local("commonsense_qa", {
            "train": "commonsenseqa/train_rand_split.jsonl",
            "validation": "commonsenseqa/dev_rand_split.jsonl"},
            process_docs=_Fn(f"{_U}.csqa_docs"))}
    for name in ("arc_easy", "arc_challenge"):
        # only the test split exists offline (README: train/dev missing); ARC is 0-shot
        out[f"{name}.yaml"] = local(name, {"test": f"arc/{name}_test.llmfoundry.jsonl"},
                                    training_split=None, validation_split=None,
                                    test_split="test", process_docs=_Fn(f"{_U}.arc_docs"))
    # the rest of the paper's table: only the split the stock task evaluates exists offline
    def custom(task: str, fn: str, **kw: object) -> dict:
        return {"include": str(stock_yaml(task)), "dataset_path": None, "dataset_name": None,
                "custom_dataset": _Fn(f"{_U}.{fn}"), "dataset_kwargs": {"data_dir": str(d), **kw},
                "training_split": None}

    out["hellaswag.yaml"] = custom("hellaswag", "arrow_dataset",
                                   splits={"validation": "hellaswag/validation"})
    out["winogrande.yaml"] = custom("winogrande", "arrow_dataset",
                                    splits={"validation": "winogrande/validation"})
    out["openbookqa.yaml"] = custom("openbookqa", "openbookqa_dataset",
                                    test="openbookqa/test.tsv") | {"validation_split": None}
    out["piqa.yaml"] = custom("piqa", "piqa_dataset", questions="piqa/valid.jsonl",
                              labels="piqa/valid-labels.lst")
    out["boolq.yaml"] = custom("boolq", "boolq_dataset", validation="boolq/val.jsonl")
    out["triviaqa.yaml"] = custom("triviaqa", "arrow_dataset", splits={
        "validation": "triviaqa/rc.wikipedia.nocontext_validation"}) | {
        "task_alias": f"triviaqa, {benchmarks.benchmark('triviaqa').partial}"}
    out["nq_open.yaml"] = local("nq_open", {"validation": "nq_open/NQ-open.dev.jsonl"},
                                training_split=None)
    for subj in mmlu_subjects():
        out[f"mmlu/mmlu_{subj}.yaml"] = {
            "include": str(STOCK / "mmlu" / "default" / f"mmlu_{subj}.yaml"),
            "dataset_path": None, "dataset_name": None,
            "custom_dataset": _Fn(f"{_U}.mmlu_dataset"),
            "dataset_kwargs": {"data_dir": str(d), "subject": subj, "folder": "mmlu"}}
    for grp in ("_mmlu", "_mmlu_stem", "_mmlu_other", "_mmlu_social_sciences",
                "_mmlu_humanities"):
        out[f"mmlu/{grp}.yaml"] = yaml.safe_load(
            (STOCK / "mmlu" / "default" / f"{grp}.yaml").read_text())
    return out


def build_offline_tasks(data_dir: str | os.PathLike, out_dir: str | os.PathLike,
                        tasks: list[str] | None = None) -> Path:
    """Write the offline task YAMLs for data_dir into out_dir (only `tasks`' when given);
    returns out_dir."""
    out = Path(out_dir)
    for rel, cfg in task_configs(data_dir).items():
        if tasks is not None and rel.split("/")[0].removesuffix(".yaml") not in tasks:
            continue
        p = out / rel
        text = yaml.safe_dump(cfg, sort_keys=False, width=1000)
        if not p.is_file() or p.read_text() != text:
            atomic_write_text(p, text)
    return out


def default_tasks_dir() -> Path:
    """Where `make tasks` writes the offline task YAMLs: <results root>/lm_eval_tasks."""
    from common.paths import results_root

    return results_root() / "lm_eval_tasks"


def write_task_dir(data_dir: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Write to out_dir the YAMLs of every offline task whose files data_dir holds, each
    verified against its sha256 pin; UsageError (before anything is written) on an altered
    file, no task's files, or out_dir a file."""
    from common.errors import UsageError
    from common.io import unwritable
    from experiments.eval.tasks import benchdata

    out = Path(out_dir)
    if (bad := unwritable(out)) is not None:
        raise UsageError(f"tasks dir {out}: {bad}; give a writable directory")
    present = []
    for t in OFFLINE_TASKS:
        chk = benchdata.verify(data_dir, [t])
        if chk.altered:
            raise UsageError(chk.line())
        if chk.ok:
            present.append(t)
    if not present:
        raise UsageError(f"benchmark data {Path(data_dir).resolve()}: no offline "
                         f"task's files are there ({', '.join(OFFLINE_TASKS)})")
    return build_offline_tasks(data_dir, out, present).resolve()


def offline_task_manager(data_dir: str | os.PathLike, out_dir: str | os.PathLike):
    """A TaskManager that knows only the offline tasks (stock names, local files)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(build_offline_tasks(data_dir, out_dir)),
                       include_defaults=False)
