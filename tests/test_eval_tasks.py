"""The offline tasks render exactly the stock lm-eval prompts on the same documents.

The stock tasks are built from lm-eval's own registry, with `datasets.load_dataset` answering
from the local files in the Hugging Face schema (the network is not needed); our offline tasks
are built from the YAMLs `experiments.eval.tasks` writes. Every request (few-shot context,
description, target delimiter, choices, generation arguments) must be identical.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable
from pathlib import Path

import datasets
import pytest

from experiments.eval.tasks import STOCK, offline_task_manager

pytestmark = pytest.mark.usefixtures("one_torch_thread")

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
TASKS = ["gsm8k", "arc_easy", "arc_challenge", "commonsense_qa", "mmlu_anatomy",
         "mmlu_elementary_mathematics"]


def _jsonl(p: Path) -> list[dict]:
    return [json.loads(x) for x in p.read_text(encoding="utf-8").splitlines() if x.strip()]


def _hf_schema(bench_dir, path: str, name: str | None) -> datasets.DatasetDict:
    """What the Hub would return for the stock dataset, from the offline copies."""
    D = datasets.Dataset.from_list
    if path == "openai/gsm8k":
        return datasets.DatasetDict({s: D(_jsonl(bench_dir / "gsm8k" / f"{s}.jsonl"))
                                     for s in ("train", "test")})
    if path == "allenai/ai2_arc":
        f = {"ARC-Easy": "arc_easy", "ARC-Challenge": "arc_challenge"}[name]
        rows = []
        for i, r in enumerate(_jsonl(bench_dir / "arc" / f"{f}_test.llmfoundry.jsonl")):
            labels = "ABCDE"[: len(r["choices"])]
            rows.append({"id": str(i), "question": r["query"].removeprefix("Question: "),
                         "choices": {"text": r["choices"], "label": list(labels)},
                         "answerKey": labels[r["gold"]]})
        return datasets.DatasetDict({s: D(rows) for s in ("train", "validation", "test")})
    if path == "tau/commonsense_qa":
        def conv(r: dict) -> dict:
            q = r["question"]
            return {"id": r["id"], "question": q["stem"], "question_concept": q["question_concept"],
                    "choices": {"label": [c["label"] for c in q["choices"]],
                                "text": [c["text"] for c in q["choices"]]},
                    "answerKey": r["answerKey"]}
        return datasets.DatasetDict({
            s: D([conv(r) for r in _jsonl(bench_dir / "commonsenseqa" / f"{f}_rand_split.jsonl")])
            for s, f in (("train", "train"), ("validation", "dev"))})
    if path == "cais/mmlu":
        out = {}
        for split in ("test", "dev"):
            with open(bench_dir / "mmlu" / split / f"{name}_{split}.csv", newline="") as f:
                out[split] = D([{"question": r["question"], "subject": name,
                                 "choices": [r[f"choice{i}"] for i in range(4)],
                                 "answer": int(r["answer"])} for r in csv.DictReader(f)])
        return datasets.DatasetDict(out)
    raise AssertionError(f"unexpected dataset {path}/{name}")


def _requests(task: object, limit: int) -> list[tuple]:
    task.set_fewshot_seed(seed=1234)  # as simple_evaluate does (fewshot_random_seed)
    task.build_all_requests(limit=limit, rank=0, world_size=1)
    return [(i.doc_id, i.request_type, json.dumps(i.args, default=str)) for i in task.instances]


def ours_and_stock(bench_dir: Path, tasks_dir: Path, names: list[str], stock_dirs: list[str],
                   schema: Callable = _hf_schema) -> tuple[dict, dict]:
    """Our offline tasks, and lm-eval's stock ones from their own YAMLs (indexing only their
    folders, not all ~10k stock tasks) with the Hub answered by `schema` from the offline files."""
    from lm_eval.tasks import TaskManager, get_task_dict

    ours = get_task_dict(names, offline_task_manager(bench_dir, tasks_dir))
    real_load = datasets.load_dataset

    def fake_load(path: str, name: str | None = None, **kw: object) -> datasets.DatasetDict:
        if path in ("json", "csv", "arrow"):
            return real_load(path, name, **kw)
        return schema(bench_dir, path, name)

    mp = pytest.MonkeyPatch()
    mp.setattr(datasets, "load_dataset", fake_load)
    try:
        stock = get_task_dict(names, TaskManager(include_path=[str(STOCK / d) for d in stock_dirs],
                                                 include_defaults=False))
    finally:
        mp.undo()
    return ours, stock


def test_offline_prompts_match_stock(bench_dir, tmp_path: Path) -> None:
    ours, stock = ours_and_stock(bench_dir, tmp_path / "tasks", TASKS,
                                 ["gsm8k", "arc", "commonsense_qa", "mmlu/default"])
    for t in TASKS:
        a, b = _requests(ours[t], 6), _requests(stock[t], 6)
        assert a == b, t
        assert len(a) >= 6
        assert ours[t].config.num_fewshot == stock[t].config.num_fewshot
        assert [m["metric"] for m in ours[t].config.metric_list] == \
            [m["metric"] for m in stock[t].config.metric_list]
    # the stock defaults the issue names
    assert ours["gsm8k"].config.num_fewshot == 5
    ctx = json.loads(_requests(ours["gsm8k"], 1)[0][2])[0]
    assert ctx.count("Question:") == 6 and ctx.endswith("Answer:")
    # MMLU answer options stay exact strings (a pandas csv reader would re-type "0.50" etc.)
    docs = list(ours["mmlu_elementary_mathematics"].eval_docs)
    assert all(isinstance(c, str) for d in docs for c in d["choices"])
