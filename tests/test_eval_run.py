"""End to end: a small-LIMIT run of the six benchmarks from ../shared/benchmarks writes the
result schema of docs/RESULTS.md; a re-run resumes from the request cache."""

from __future__ import annotations

import json
import os
from pathlib import Path

from test_eval_fixtures import BENCH, one_torch_thread, toy_checkpoint  # noqa: F401

from experiments.eval import DEFAULT_TASKS, run_eval

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _check_entry(name: str, e: dict, n: int) -> None:
    assert e["n"] == n, name
    assert len(e["items"]) == n, name
    m = e["metrics"][e["primary"]]
    assert m["value"] is not None and m["n"] == n, name
    assert isinstance(e["higher_is_better"], bool) and isinstance(e["fewshot"], int)


def test_six_benchmarks_write_the_schema(tmp_path: Path) -> None:
    ck = toy_checkpoint(tmp_path / "runs" / "toyrun" / "checkpoints" / "final.pt")
    out = run_eval(ck, list(DEFAULT_TASKS), limit=2, data=BENCH, max_gen_toks=24,
                   progress=False)
    assert set(out) == {"lm-eval", "evalplus"}
    lm = json.loads(out["lm-eval"].read_text())
    ep = json.loads(out["evalplus"].read_text())
    assert out["lm-eval"] == tmp_path / "runs" / "toyrun" / "eval" / "lm-eval.limit2.json"
    for doc, suite in ((lm, "lm-eval"), (ep, "evalplus")):
        assert doc["schema"] == "ftbench-eval-v1" and doc["suite"] == suite
        assert doc["run_id"] == "toyrun" and doc["arm"] == "baseline"
        assert doc["z_mode"] == "prior" and doc["k"] == 1 and doc["leaks"] is False
        assert doc["seed"] == 0 and doc["limit"] == 2
        assert doc["versions"]["lm_eval"] == "0.4.13" and doc["versions"]["torch"]
        assert doc["versions"]["evalplus"] == "0.3.1"
        assert doc["elapsed_s"] > 0 and doc["requests_per_s"] > 0
    assert lm["data_checksums"]["gsm8k/test.jsonl"].startswith("3730d312")
    assert len([k for k in lm["data_checksums"] if k.startswith("mmlu/")]) == 114
    assert ep["data_checksums"]["mbppplus/MbppPlus-v0.2.0.jsonl"].startswith("b54e7627")

    t = lm["tasks"]
    assert set(t) == {"gsm8k", "mmlu", "arc_easy", "arc_challenge", "commonsense_qa",
                      "gsm8k_gold_bpb"}
    for name in ("arc_easy", "arc_challenge", "commonsense_qa", "gsm8k", "gsm8k_gold_bpb"):
        _check_entry(name, t[name], 2)
    _check_entry("mmlu", t["mmlu"], 57 * 2)  # 2 per subject
    assert t["gsm8k"]["fewshot"] == 5 and t["arc_easy"]["fewshot"] == 0
    assert t["gsm8k"]["primary"] == "exact_match,strict-match"
    assert "exact_match,flexible-extract" in t["gsm8k"]["metrics"]
    assert set(t["arc_easy"]["metrics"]) == {"acc", "acc_norm"}
    assert all(it["acc"] in (0.0, 1.0) for it in t["mmlu"]["items"])
    assert {it["subtask"] for it in t["mmlu"]["items"]} >= {"mmlu_anatomy", "mmlu_virology"}
    gb = t["gsm8k_gold_bpb"]
    assert gb["primary"] == "bpb" and gb["higher_is_better"] is False
    assert 1.0 < gb["metrics"]["bpb"]["value"] < 20.0  # random init: ~log2(V)/bytes-per-token

    e = ep["tasks"]
    assert set(e) == {"humaneval_plus", "mbpp_plus", "humaneval_plus_gold_bpb",
                      "mbpp_plus_gold_bpb"}
    for name in e:
        _check_entry(name, e[name], 2)
    for name in ("humaneval_plus", "mbpp_plus"):
        assert set(e[name]["metrics"]) == {"pass@1_base", "pass@1_plus"}
        assert e[name]["sandbox"]["scored"] == 2 and not e[name]["sandbox"]["timed_out"]
        assert all(it["base"] == 0.0 and it["plus"] == 0.0 for it in e[name]["items"])
    assert e["humaneval_plus"]["items"][0]["task_id"] == "HumanEval/0"


def test_free_transformer_modes_and_resume(tmp_path: Path) -> None:
    ck = toy_checkpoint(tmp_path / "runs" / "ft" / "checkpoints" / "final.pt", free=True)
    kw = dict(tasks=["arc_easy"], limit=6, data=BENCH, progress=False)
    first = json.loads(run_eval(ck, z="prior-k", k=3, **kw)["lm-eval"].read_text())
    assert first["arm"] == "free" and first["z_mode"] == "prior-k" and first["k"] == 3
    assert first["leaks"] is False and first["requests"] > 0
    acc = first["tasks"]["arc_easy"]["metrics"]["acc"]
    assert acc["spread"] is not None and acc["spread"] >= 0.0
    # posterior is labelled as leaking, in a file of its own
    post = run_eval(ck, z="posterior", **kw)["lm-eval"]
    assert post.name == "lm-eval.posterior.limit6.json"
    p1 = json.loads(post.read_text())
    assert p1["leaks"] is True and p1["requests"] > 0
    # the same command again: every request comes from the cache, same numbers
    p2 = json.loads(run_eval(ck, z="posterior", **kw)["lm-eval"].read_text())
    assert p2["requests"] == 0
    assert p2["tasks"]["arc_easy"]["items"] == p1["tasks"]["arc_easy"]["items"]
