"""Map the offline benchmark files to the document schema the stock lm-eval tasks expect, so
the stock templates apply unchanged.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

import datasets

ARC_LABELS = ["A", "B", "C", "D", "E"]
_Q = "Question: "


def arc_doc(d: dict[str, Any], idx: int) -> dict[str, Any]:
    """llm-foundry {query, choices, gold} -> allenai/ai2_arc {id, question, choices, answerKey}
    (the "Question: " prefix stripped: the stock template adds it)."""
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


def load_arrow_dir(path: str | Path) -> datasets.Dataset:
    """A `save_to_disk` copy, read into memory: a memory-mapped one would make the stock
    tasks' `.map()` write cache files into the (read-only) data directory."""
    return datasets.load_from_disk(str(path), keep_in_memory=True)


def read_mmlu_csv(path: str | Path, subject: str) -> list[dict[str, Any]]:
    """Converted MMLU csv (question,choice0..3,answer) -> cais/mmlu rows; the csv module keeps
    every field the exact string (pandas would turn "0.50" into a float, "None" into NaN)."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return [{"question": r["question"], "subject": subject,
             "choices": [r[f"choice{i}"] for i in range(4)], "answer": int(r["answer"])}
            for r in rows]


def mmlu_dataset(data_dir: str, subject: str, folder: str, validation: bool = False,
                 **_: Any) -> datasets.DatasetDict:
    """`custom_dataset` for one MMLU subject: test and dev from the offline csvs under `folder`,
    and with `validation=True` the validation split from the `save_to_disk` copy."""
    root = Path(data_dir) / folder
    out = {split: datasets.Dataset.from_list(
        read_mmlu_csv(root / split / f"{subject}_{split}.csv", subject))
        for split in ("test", "dev")}
    if validation:
        out["validation"] = load_arrow_dir(root / "validation" / subject)
    return datasets.DatasetDict(out)


# ---------------------------------------------------------------- the rest of the paper's table
def arrow_dataset(data_dir: str, splits: dict[str, str], **_: Any) -> datasets.DatasetDict:
    """`custom_dataset` for Hugging Face `save_to_disk` directories (HellaSwag, WinoGrande,
    TriviaQA): split name -> directory relative to data_dir. They are copies of the very HF
    datasets the stock tasks load, so no conversion."""
    root = Path(data_dir)
    return datasets.DatasetDict({s: load_arrow_dir(root / rel) for s, rel in splits.items()})


_OBQA_LABELS = ["A", "B", "C", "D"]
_OBQA_CHOICE = re.compile(r"\(([A-D])\) ")


def openbookqa_row(r: dict[str, str]) -> dict[str, Any]:
    """One OBQA-V1 Main TSV row -> allenai/openbookqa "main" {id, question_stem,
    choices {text, label}, answerKey}. Choices come as "(A) .. (B) .. (C) .. (D) .."."""
    parts = _OBQA_CHOICE.split(r["Choices"])
    labels, texts = parts[1::2], [t.strip() for t in parts[2::2]]
    if parts[0].strip() or labels != _OBQA_LABELS or r["Answer Key"] not in _OBQA_LABELS:
        raise ValueError(f"OpenBookQA row {r.get('ID')!r}: choices are not '(A) .. (D) ..' "
                         f"or the answer key is not A-D")
    return {"id": r["ID"], "question_stem": r["Question Stem"],
            "choices": {"text": texts, "label": labels}, "answerKey": r["Answer Key"]}


def openbookqa_dataset(data_dir: str, test: str, **_: Any) -> datasets.DatasetDict:
    """`custom_dataset` for OpenBookQA: the test split (the stock eval split) from the TSV."""
    with open(Path(data_dir) / test, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return datasets.DatasetDict(
        {"test": datasets.Dataset.from_list([openbookqa_row(r) for r in rows])})


def _jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def piqa_dataset(data_dir: str, questions: str, labels: str,
                 **_: Any) -> datasets.DatasetDict:
    """`custom_dataset` for PIQA: valid.jsonl {goal, sol1, sol2} + valid-labels.lst (one 0/1 per
    line, aligned by line) -> baber/piqa validation {goal, sol1, sol2, label}."""
    root = Path(data_dir)
    docs = _jsonl(root / questions)
    labels = [x.strip() for x in (root / labels).read_text().splitlines() if x.strip()]
    if len(labels) != len(docs) or set(labels) - {"0", "1"}:
        raise ValueError(f"PIQA: {len(docs)} questions but {len(labels)} labels, or a label "
                         "other than 0/1")
    return datasets.DatasetDict({"validation": datasets.Dataset.from_list(
        [{"goal": d["goal"], "sol1": d["sol1"], "sol2": d["sol2"], "label": int(y)}
         for d, y in zip(docs, labels, strict=True)])})


_BOOL = {"false": 0, "true": 1, False: 0, True: 1}


def boolq_dataset(data_dir: str, validation: str, **_: Any) -> datasets.DatasetDict:
    """`custom_dataset` for BoolQ: SuperGLUE val.jsonl (label the string "true"/"false") ->
    aps/super_glue boolq validation {question, passage, idx, label 0/1}."""
    rows = []
    for d in _jsonl(Path(data_dir) / validation):
        if d["label"] not in _BOOL:
            raise ValueError(f"BoolQ row {d.get('idx')}: label {d['label']!r} is not true/false")
        rows.append({"question": d["question"], "passage": d["passage"], "idx": int(d["idx"]),
                     "label": _BOOL[d["label"]]})
    return datasets.DatasetDict({"validation": datasets.Dataset.from_list(rows)})
