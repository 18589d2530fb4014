# tests/test_eval_tasks_paper.py
"""The rest of the paper's benchmark table offline: every new task renders exactly the stock
lm-eval prompt on the same documents, and its files are checksum-verified.

As in test_eval_tasks.py, the stock tasks come from lm-eval's own YAMLs with
`datasets.load_dataset` answering from the offline files in the Hugging Face schema; the
conversions here are written independently of experiments/eval/tasks/offline_utils.py, and the first
document of each converted dataset is also checked against hand-written stock renderings.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import datasets
import pytest
from test_eval_tasks import _hf_schema as stock_schema
from test_eval_tasks import _jsonl, _requests, ours_and_stock

from common import benchmarks
from experiments.eval.tasks import (
    NO_FEWSHOT_SOURCE,
    OFFLINE_TASKS,
    fewshot_error,
)
from experiments.eval.tasks import offline_utils as ou

pytestmark = pytest.mark.usefixtures("one_torch_thread")

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
NEW = ["hellaswag", "winogrande", "openbookqa", "piqa", "boolq", "nq_open", "triviaqa"]
STOCK_DIRS = ["hellaswag", "winogrande", "openbookqa", "piqa", "super_glue/boolq", "nq_open",
              "triviaqa", "mmlu/default"]


def _obqa_stock_rows(bench: Path) -> list[dict]:
    rows = []
    with open(bench / "openbookqa" / "test.tsv", newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            c = r["Choices"]
            cut = [c.index(f"({x}) ") for x in "ABCD"]
            texts = [c[a + 4:b].strip() for a, b in zip(cut, cut[1:] + [len(c)], strict=True)]
            rows.append({"id": r["ID"], "question_stem": r["Question Stem"],
                         "choices": {"text": texts, "label": list("ABCD")},
                         "answerKey": r["Answer Key"]})
    return rows


def _hf_schema(bench: Path, path: str, name: str | None) -> datasets.DatasetDict:
    """What the Hub would return for the stock dataset, from the offline copies. The stock task
    opens its train split too; at 0 shots nothing is read from it, so it gets one row."""
    D = datasets.Dataset.from_list

    def same(ds: datasets.Dataset, *splits: str) -> datasets.DatasetDict:
        return datasets.DatasetDict({s: ds if s != "train" else ds.select(range(1))
                                     for s in splits})

    # in memory: a memory-mapped copy would make the stock process_docs write its cache-*.arrow
    # into the shared benchmark data (which is read-only to the suite)
    disk = lambda rel: datasets.load_from_disk(str(bench / rel), keep_in_memory=True)  # noqa: E731
    if path == "Rowan/hellaswag":
        return same(disk("hellaswag/validation"), "train", "validation")
    if path == "allenai/winogrande" and name == "winogrande_xl":
        return same(disk("winogrande/validation"), "train", "validation")
    if path == "allenai/openbookqa" and name == "main":
        return same(D(_obqa_stock_rows(bench)), "train", "validation", "test")
    if path == "baber/piqa":
        labels = (bench / "piqa" / "valid-labels.lst").read_text().split()
        rows = [d | {"label": int(y)} for d, y in
                zip(_jsonl(bench / "piqa" / "valid.jsonl"), labels, strict=True)]
        return same(D(rows), "train", "validation")
    if path == "aps/super_glue" and name == "boolq":
        rows = [d | {"label": int(d["label"] == "true")}
                for d in _jsonl(bench / "boolq" / "val.jsonl")]
        return same(D(rows), "train", "validation")
    if path == "google-research-datasets/nq_open":
        return same(D(_jsonl(bench / "nq_open" / "NQ-open.dev.jsonl")), "train", "validation")
    if path == "mandarjoshi/trivia_qa" and name == "rc.nocontext":
        return same(disk("triviaqa/rc.wikipedia.nocontext_validation"), "train", "validation")
    return stock_schema(bench, path, name)  # mmlu's


@pytest.fixture(scope="module")
def tasks(bench_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    return ours_and_stock(bench_dir, tmp_path_factory.mktemp("tasks"), NEW + ["mmlu_anatomy"],
                          STOCK_DIRS, _hf_schema)


@pytest.mark.parametrize("name", NEW)  # mmlu_anatomy: test_eval_tasks.py
@pytest.mark.slow  # every paper task through stock lm-eval: the CI tier (make test-all)
def test_offline_prompts_match_stock(tasks: tuple[dict, dict], name: str) -> None:
    ours, stock = tasks
    a, b = _requests(ours[name], 6), _requests(stock[name], 6)
    assert a == b and len(a) >= 6, name
    oc, sc = ours[name].config, stock[name].config
    assert oc.num_fewshot == sc.num_fewshot
    for field in ("doc_to_text", "doc_to_target", "doc_to_choice", "description",
                  "target_delimiter", "fewshot_delimiter", "generation_kwargs", "filter_list",
                  "output_type", "test_split"):
        assert str(getattr(oc, field)) == str(getattr(sc, field)), (name, field)
    # the split evaluated is the stock one (offline, the other splits are absent)
    assert (oc.test_split or oc.validation_split) == (sc.test_split or sc.validation_split)
    assert [m["metric"] for m in oc.metric_list] == [m["metric"] for m in sc.metric_list]
    assert len(ours[name].eval_docs) == len(stock[name].eval_docs)


# hand-written stock renderings of document 0 (what the stock task sends for the Hub's data)
FIRST = {
    "openbookqa": ("A person wants to start saving money so that they can afford a nice vacation "
                   "at the end of the year. After looking over their budget and expenses, they "
                   "decide the best way to save money is to", " quit eating lunch out", 4),
    "piqa": ("Question: How do I ready a guinea pig cage for it's new occupants?\nAnswer:",
             " Provide the guinea pig with a cage full of a few inches of bedding made of ripped "
             "paper strips, you will also need to supply it with a water bottle and a food dish.",
             2),
    "boolq": (None, " no", 2),
    "winogrande": ("Sarah was a much better surgeon than Maria so Maria",
                   " always got the easier cases.", 2),
}


@pytest.mark.parametrize("name", sorted(FIRST))
@pytest.mark.slow  # the `tasks` fixture (6 s); the fast tier: the tests below, test_eval_tasks
def test_first_document_rendering(tasks: tuple[dict, dict], name: str) -> None:
    ours, _ = tasks
    reqs = [json.loads(r[2]) for r in _requests(ours[name], 1)]
    ctx, gold, n = FIRST[name]
    assert len(reqs) == n
    doc = ours[name].eval_docs[0]
    if name == "winogrande":  # partial evaluation: the options fill the blank in the context
        gold_idx = ours[name].doc_to_text(doc)  # stock: the gold option's index
        assert gold_idx == 1 and reqs[gold_idx] == [ctx, gold]
        return
    target = ours[name].doc_to_target(doc)
    if name == "boolq":
        assert reqs[0][0].startswith("Ethanol fuel -- All biomass goes through")
        assert reqs[0][0].endswith(
            "\nQuestion: does ethanol take more energy make that produces?\nAnswer:")
    else:
        assert reqs[0][0] == ctx
    assert reqs[target][1] == gold


@pytest.mark.slow  # as above
def test_generative_tasks_and_partial_label(tasks: tuple[dict, dict], bench_dir: Path) -> None:
    ours, _ = tasks
    nq = json.loads(_requests(ours["nq_open"], 1)[0][2])
    assert nq[0] == ("Answer these questions:\n\n"
                     "Q: when was the last time anyone was on the moon?\nA:")
    assert ours["nq_open"].doc_to_target(ours["nq_open"].eval_docs[0]) == \
        ["14 December 1972 UTC", "December 1972"]  # every gold answer counts
    tq = ours["triviaqa"]
    partial = benchmarks.benchmark("triviaqa").partial
    assert len(tq.eval_docs) == 7993 and partial == "partial (7,993 of 17,944)"
    assert tq.config.task == "triviaqa" and partial in tq.config.task_alias
    # "??": the stock template appends "?" to questions that already end with one
    assert json.loads(_requests(tq, 1)[0][2])[0] == \
        "Question: Which Lloyd Webber musical premiered in the US on 10th December 1993??\nAnswer:"
    # the stock mmlu tasks read test/dev only; validation is there on request (own checksums)
    assert set(ours["mmlu_anatomy"].dataset) == {"test", "dev"}
    val = ou.mmlu_dataset(str(bench_dir), "anatomy", "mmlu", validation=True)["validation"]
    assert len(val) == 14


def test_new_tasks_are_offline_and_fewshot_guarded() -> None:
    assert set(NEW) <= set(OFFLINE_TASKS) and "race" not in OFFLINE_TASKS
    assert fewshot_error(NEW, None) is None and fewshot_error(["gsm8k", "mmlu"], 5) is None
    line = fewshot_error(["gsm8k", "piqa", "triviaqa"], 5)
    assert line is not None and "piqa, triviaqa" in line and "\n" not in line
    assert set(NO_FEWSHOT_SOURCE) >= set(NEW)


def test_conversions_refuse_malformed_rows(tmp_path: Path) -> None:
    good = {"ID": "1", "Question Stem": "q", "Choices": "(A) a (B) b (C) c (D) d",
            "Answer Key": "C"}
    assert ou.openbookqa_row(good)["choices"] == {"text": list("abcd"), "label": list("ABCD")}
    for bad in ({"Choices": "(A) a (C) c (B) b (D) d"}, {"Choices": "x (A) a (B) b (C) c (D) d"},
                {"Answer Key": "E"}):
        with pytest.raises(ValueError, match="OpenBookQA row '1'"):
            ou.openbookqa_row(good | bad)
    (tmp_path / "piqa").mkdir()
    (tmp_path / "piqa/valid.jsonl").write_text('{"goal": "g", "sol1": "a", "sol2": "b"}\n' * 2)
    (tmp_path / "piqa/valid-labels.lst").write_text("0\n")
    with pytest.raises(ValueError, match="2 questions but 1 labels"):
        ou.piqa_dataset(str(tmp_path), "piqa/valid.jsonl", "piqa/valid-labels.lst")
    (tmp_path / "boolq").mkdir()
    (tmp_path / "boolq/val.jsonl").write_text(
        '{"question": "q", "passage": "p", "idx": 0, "label": "maybe"}\n')
    with pytest.raises(ValueError, match="not true/false"):
        ou.boolq_dataset(str(tmp_path), "boolq/val.jsonl")
