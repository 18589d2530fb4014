"""Offline lm-eval tasks: the stock task YAMLs, pointed at a local data directory.

`build_offline_tasks(data_dir, out_dir)` writes one YAML per task into out_dir. Each one
`include:`s the stock lm-eval YAML by absolute path (so the prompt template, few-shot settings,
filters and metrics are the stock ones) and overrides only where the data comes from:
`dataset_path: json` + absolute `data_files` (and a `process_docs` mapping to the stock schema
for ARC and CommonsenseQA), or a `custom_dataset` for MMLU's csvs (see offline_utils). The task
names stay the stock names (gsm8k, arc_easy, ..., mmlu_<subject>, groups mmlu, mmlu_stem, ...),
so a TaskManager built with `include_defaults=False` on out_dir resolves them offline, and the
results are comparable with any stock run.
"""

from __future__ import annotations

import os
from pathlib import Path

import lm_eval
import yaml

from common.io import atomic_write_text

STOCK = Path(lm_eval.__file__).parent / "tasks"
OFFLINE_TASKS = ("gsm8k", "arc_easy", "arc_challenge", "commonsense_qa", "mmlu")
_U = "experiments.eval.tasks.offline_utils"


class _Fn(str):
    """A `!function` tag in the written YAML."""


yaml.SafeDumper.add_representer(_Fn, lambda d, v: d.represent_scalar("!function", str(v)))


def stock_yaml(task: str) -> Path:
    return {"gsm8k": STOCK / "gsm8k" / "gsm8k.yaml",
            "arc_easy": STOCK / "arc" / "arc_easy.yaml",
            "arc_challenge": STOCK / "arc" / "arc_challenge.yaml",
            "commonsense_qa": STOCK / "commonsense_qa" / "default.yaml"}[task]


def mmlu_subjects() -> list[str]:
    d = STOCK / "mmlu" / "default"
    return sorted(p.stem[len("mmlu_"):] for p in d.glob("mmlu_*.yaml"))


def task_configs(data_dir: str | os.PathLike) -> dict[str, dict]:
    """file name -> YAML content for every offline task."""
    d = Path(data_dir).resolve()
    jf = lambda rel: str(d / rel)  # noqa: E731
    out: dict[str, dict] = {
        "gsm8k.yaml": {"include": str(stock_yaml("gsm8k")), "dataset_path": "json",
                       "dataset_name": None,
                       "dataset_kwargs": {"data_files": {"train": jf("gsm8k/train.jsonl"),
                                                         "test": jf("gsm8k/test.jsonl")}}},
        "commonsense_qa.yaml": {
            "include": str(stock_yaml("commonsense_qa")), "dataset_path": "json",
            "dataset_name": None,
            "dataset_kwargs": {"data_files": {
                "train": jf("commonsenseqa/train_rand_split.jsonl"),
                "validation": jf("commonsenseqa/dev_rand_split.jsonl")}},
            "process_docs": _Fn(f"{_U}.csqa_docs")},
    }
    for name in ("arc_easy", "arc_challenge"):
        # only the test split exists offline (README: train/dev missing); ARC is 0-shot
        out[f"{name}.yaml"] = {
            "include": str(stock_yaml(name)), "dataset_path": "json", "dataset_name": None,
            "dataset_kwargs": {"data_files": {"test": jf(f"arc/{name}_test.llmfoundry.jsonl")}},
            "training_split": None, "validation_split": None, "test_split": "test",
            "process_docs": _Fn(f"{_U}.arc_docs")}
    for subj in mmlu_subjects():
        out[f"mmlu/mmlu_{subj}.yaml"] = {
            "include": str(STOCK / "mmlu" / "default" / f"mmlu_{subj}.yaml"),
            "dataset_path": None, "dataset_name": None,
            "custom_dataset": _Fn(f"{_U}.mmlu_dataset"),
            "dataset_kwargs": {"data_dir": str(d), "subject": subj}}
    for grp in ("_mmlu", "_mmlu_stem", "_mmlu_other", "_mmlu_social_sciences",
                "_mmlu_humanities"):
        out[f"mmlu/{grp}.yaml"] = yaml.safe_load(
            (STOCK / "mmlu" / "default" / f"{grp}.yaml").read_text())
    return out


def build_offline_tasks(data_dir: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Write the offline task YAMLs for data_dir into out_dir; returns out_dir."""
    out = Path(out_dir)
    for rel, cfg in task_configs(data_dir).items():
        p = out / rel
        text = yaml.safe_dump(cfg, sort_keys=False, width=1000)
        if not p.is_file() or p.read_text() != text:
            atomic_write_text(p, text)
    return out


def offline_task_manager(data_dir: str | os.PathLike, out_dir: str | os.PathLike):
    """A TaskManager that knows only the offline tasks (stock names, local files)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(build_offline_tasks(data_dir, out_dir)),
                       include_defaults=False)
