"""Map the offline benchmark files to the document schema the stock lm-eval tasks expect.

Each function turns one file format into the exact fields the stock task's Jinja templates read,
so the stock `doc_to_text` / `doc_to_choice` / `doc_to_target` apply unchanged.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import datasets

ARC_LABELS = ["A", "B", "C", "D", "E"]
_Q = "Question: "


def arc_doc(d: dict[str, Any], idx: int) -> dict[str, Any]:
    """llm-foundry {query, choices, gold} -> allenai/ai2_arc {id, question, choices, answerKey}.

    The llm-foundry query is "Question: <question>" (no answer cue); the stock template adds
    "Question: ... \\nAnswer:" itself, so the prefix is stripped here.
    """
    q = d["query"]
    if not q.startswith(_Q):
        raise ValueError(f"ARC llm-foundry row {idx}: query does not start with {_Q!r}")
    labels = ARC_LABELS[: len(d["choices"])]
    return {"id": f"test-{idx}", "question": q[len(_Q):],
            "choices": {"text": list(d["choices"]), "label": labels},
            "answerKey": labels[int(d["gold"])]}


def arc_docs(dataset: datasets.Dataset) -> datasets.Dataset:
    rows = [arc_doc(d, i) for i, d in enumerate(dataset)]
    return datasets.Dataset.from_list(rows)


def csqa_doc(d: dict[str, Any]) -> dict[str, Any]:
    """Official CommonsenseQA jsonl -> tau/commonsense_qa {id, question, question_concept,
    choices {label, text}, answerKey}."""
    q = d["question"]
    return {"id": d["id"], "question": q["stem"], "question_concept": q["question_concept"],
            "choices": {"label": [c["label"] for c in q["choices"]],
                        "text": [c["text"] for c in q["choices"]]},
            "answerKey": d.get("answerKey", "")}


def csqa_docs(dataset: datasets.Dataset) -> datasets.Dataset:
    return datasets.Dataset.from_list([csqa_doc(d) for d in dataset])


def read_mmlu_csv(path: str | Path, subject: str) -> list[dict[str, Any]]:
    """Converted MMLU csv (header question,choice0..3,answer 0-3) -> cais/mmlu rows.

    Read with the csv module so every field stays the exact string (a pandas reader would turn
    numeric answer options such as "0.50" into floats and "None" into NaN).
    """
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return [{"question": r["question"], "subject": subject,
             "choices": [r[f"choice{i}"] for i in range(4)], "answer": int(r["answer"])}
            for r in rows]


def mmlu_dataset(data_dir: str, subject: str, **_: Any) -> datasets.DatasetDict:
    """`custom_dataset` for one MMLU subject: test and dev splits from the offline csvs."""
    root = Path(data_dir) / "mmlu"
    return datasets.DatasetDict({
        split: datasets.Dataset.from_list(
            read_mmlu_csv(root / split / f"{subject}_{split}.csv", subject))
        for split in ("test", "dev")})
