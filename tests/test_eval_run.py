"""End to end: a small-LIMIT run of the six benchmarks from the offline benchmark files writes
the result schema of docs/RESULTS.md; a re-run resumes from the request cache; one file per
evaluation spec; a task whose run died is null with its reason, never 0."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from common.records import EvalRequest, EvalRuntime
from experiments.eval.run import DEFAULT_TASKS, run_eval, spec_id

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _eval(ck, tasks=None, *, z="prior", progress=True, **kw):
    """run_eval(ckpt, EvalRequest, EvalRuntime) from the keyword arguments the tests use."""
    return run_eval(ck, EvalRequest(tasks=tuple(tasks or ()), z_mode=z, **kw),
                    EvalRuntime(progress=progress))

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _check_entry(name: str, e: dict, n: int) -> None:
    assert e["n"] == n, name
    assert len(e["items"]) == n, name
    m = e["metrics"][e["primary"]]
    assert m["value"] is not None and m["n"] == n, name
    assert isinstance(e["higher_is_better"], bool) and isinstance(e["fewshot"], int)


@pytest.mark.slow
def test_six_benchmarks_write_the_schema(bench_dir, toy_checkpoint, tmp_path: Path) -> None:
    ck = toy_checkpoint(tmp_path / "runs" / "toyrun" / "checkpoints" / "final.pt")
    out = _eval(ck, list(DEFAULT_TASKS), limit=2, data=bench_dir, max_gen_toks=24,
                progress=False)
    assert set(out) == {"lm-eval", "evalplus"}
    lm = json.loads(out["lm-eval"].read_text())
    ep = json.loads(out["evalplus"].read_text())
    for doc, suite in ((lm, "lm-eval"), (ep, "evalplus")):
        # one file per spec: its identity is in the name
        assert out[suite] == tmp_path / "runs" / "toyrun" / "eval" / (
            f"{suite}.limit2.{doc['spec_id']}.stepNA.json")
        assert doc["spec_id"] == spec_id(doc["spec"]) and doc["checkpoint_step"] is None
        sp = doc["spec"]
        assert (sp["suite"], sp["limit"], sp["z_mode"], sp["k"], sp["fewshot"]) == (
            suite, 2, "prior", 1, None)
        assert sp["gen_tokens"] == 24 and sp["data_checksums"] == doc["data_checksums"]
        assert set(doc["protocol"]) == {"loglikelihood", "loglikelihood_rolling",
                                        "generate_until", "long_continuation"}
        assert doc["schema"] == "ftbench-eval-v1" and doc["suite"] == suite
        assert doc["run_id"] == "toyrun" and doc["arm"] == "baseline"
        assert doc["z_mode"] == "prior" and doc["k"] == 1 and doc["leaks"] is False
        assert doc["seed"] == 0 and doc["limit"] == 2
        assert doc["versions"]["lm_eval"] == "0.4.13" and doc["versions"]["torch"]
        assert doc["versions"]["evalplus"] == "0.3.1"
        assert doc["elapsed_s"] > 0 and doc["requests_per_s"] > 0
    assert lm["spec"]["tasks"] == sorted(["gsm8k", "mmlu", "arc_easy", "arc_challenge",
                                          "commonsense_qa"])
    assert ep["spec"]["tasks"] == ["humaneval_plus", "mbpp_plus"]
    assert not any(k.startswith("mbpp") for k in lm["data_checksums"])  # per suite
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
    # 5-shot GSM8K prompts fill the toy model's 256-token window: cut, and the cut recorded
    tr = t["gsm8k"]["truncation"]
    assert tr["n_requests"] == 2 and tr["n_truncated"] == 2 and tr["max_tokens_cut"] > 1000
    assert tr["min_prompt_tokens_kept"] == 256 - 24 and tr["gen_budget_min"] == 24
    assert "truncation" not in t["arc_easy"]
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
    for name in ("humaneval_plus", "mbpp_plus"):  # prompts fit: kept whole
        tr = e[name]["truncation"]
        assert tr["n_requests"] == 2 and tr["n_truncated"] == 0 and tr["max_tokens_cut"] == 0


def test_free_transformer_modes_and_resume(bench_dir, toy_checkpoint, tmp_path: Path) -> None:
    """Also: the window is the run's trained seq_len (64 here, the preset's is 256), recorded
    in the spec exactly as a sweep plans it; without a run record, the model's own window."""
    from experiments.eval.run import planned_specs, trained_context, validate_args

    ck = toy_checkpoint(tmp_path / "runs" / "ft" / "checkpoints" / "final.pt", free=True)
    (ck.parent.parent / "config.yaml").write_text("run_id: ft\ntrain: {seq_len: 64, seed: 0}\n")
    assert trained_context(ck) == 64
    kw = dict(tasks=["arc_easy"], limit=2, data=bench_dir, progress=False)
    first = json.loads(_eval(ck, z="prior-k", k=2, **kw)["lm-eval"].read_text())
    assert first["spec"]["context"] == 64 and first["max_seq_len"] == 64
    a = validate_args(["--tasks", "arc_easy", "--limit", "2", "--data", str(bench_dir), "--z",
                       "prior-k", "--k", "2"])
    assert planned_specs(a, 64)["lm-eval"] == first["spec"]
    assert first["precision"] == "fp32" and first["world_size"] == 1
    bare = tmp_path / "bare.pt"
    bare.write_bytes(ck.read_bytes())
    assert trained_context(bare) is None
    assert first["arm"] == "free" and first["z_mode"] == "prior-k" and first["k"] == 2
    assert first["leaks"] is False and first["requests"] > 0
    acc = first["tasks"]["arc_easy"]["metrics"]["acc"]
    assert acc["spread"] is not None and acc["spread"] >= 0.0
    # posterior is labelled as leaking, in a file of its own
    post = _eval(ck, z="posterior", **kw)["lm-eval"]
    assert post.name.startswith("lm-eval.posterior.limit2.") and post.name.endswith(".stepNA.json")
    p1 = json.loads(post.read_text())
    assert p1["leaks"] is True and p1["requests"] > 0
    # the same command again: every request comes from the cache, same numbers
    again = _eval(ck, z="posterior", **kw)["lm-eval"]
    p2 = json.loads(again.read_text())
    assert again == post and p2["requests"] == 0  # into the same file
    assert p2["tasks"]["arc_easy"]["items"] == p1["tasks"]["arc_easy"]["items"]


@pytest.mark.slow
def test_one_file_per_spec_and_resume(bench_dir, toy_checkpoint, tmp_path: Path) -> None:
    """Another task set, generation length or checkpoint step never overwrites a file."""
    import torch

    from model import load_checkpoint, save_checkpoint

    ck = toy_checkpoint(tmp_path / "runs" / "r" / "checkpoints" / "final.pt")
    m = load_checkpoint(ck)
    save_checkpoint(ck, m.model, tokenizer=m.tokenizer, extra={"step": 7})
    kw = dict(limit=1, data=bench_dir, progress=False)
    a = _eval(ck, ["arc_easy"], **kw)["lm-eval"]
    b = _eval(ck, ["arc_easy", "commonsense_qa"], **kw)["lm-eval"]
    c = _eval(ck, ["arc_easy", "gsm8k"], max_gen_toks=8, **kw)["lm-eval"]
    d = _eval(ck, ["arc_easy", "gsm8k"], max_gen_toks=16, **kw)["lm-eval"]
    assert len({a, b, c, d}) == 4 and all(p.is_file() for p in (a, b, c, d))
    assert a.name.endswith(".step7.json")
    da = json.loads(a.read_text())
    assert da["checkpoint_step"] == 7 and da["spec"]["gen_tokens"] is None  # no generation
    assert json.loads(c.read_text())["spec"]["gen_tokens"] == 8
    # what a sweep plans (EVAL_ARGS, the model's window) is exactly what the file records
    from experiments.eval.run import planned_specs, validate_args

    for path, args in ((c, ["--max-gen-toks", "8"]), (a, [])):
        doc = json.loads(path.read_text())
        got = planned_specs(validate_args(["--tasks", ",".join(doc["spec"]["tasks"]), "--limit",
                                           "1", "--data", str(bench_dir), *args]), 256)
        assert got["lm-eval"] == doc["spec"] and spec_id(got["lm-eval"]) == doc["spec_id"]
    assert set(json.loads(b.read_text())["tasks"]) == {"arc_easy", "commonsense_qa"}
    assert set(json.loads(a.read_text())["tasks"]) == {"arc_easy"}  # not overwritten
    # the same spec again resumes into the same file: test_free_transformer_modes_and_resume
    # a later checkpoint of the same run: a file of its own
    save_checkpoint(ck, m.model, tokenizer=m.tokenizer, extra={"step": 9})
    e = _eval(ck, ["arc_easy"], **kw)["lm-eval"]
    assert e.name == a.name.replace(".step7.", ".step9.") and a.is_file()
    assert torch.get_num_threads() >= 1


def test_a_dead_task_is_null_and_native_files_sit_beside_ours(
        bench_dir, toy_checkpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture) -> None:
    """A task whose run died is null with its reason (never 0) and the command exits 1, the
    others still count; lm-eval's own results JSON and per-sample JSONL sit beside our file (the
    layout of `lm_eval --output_path <dir> --log_samples`); triviaqa offline is labelled
    partial; each paper row's metric is the primary."""
    import lm_eval
    from lm_eval.utils import (
        get_latest_filename,
        get_results_filenames,
        get_sample_results_filenames,
    )

    from experiments.eval.run import main, native_dir

    ck = toy_checkpoint(tmp_path / "runs" / "nat" / "checkpoints" / "final.pt")
    real = lm_eval.simple_evaluate

    def flaky(*a: object, tasks: list[str], **kw: object) -> dict:
        if tasks == ["arc_challenge"]:
            raise RuntimeError("dataset went away\nsecond line")
        return real(*a, tasks=tasks, **kw)

    monkeypatch.setattr(lm_eval, "simple_evaluate", flaky)
    assert main([str(ck), "--tasks", "arc_easy,arc_challenge,triviaqa", "--limit", "2",
                 "--data", str(bench_dir), "--max-gen-toks", "4"]) == 1
    assert "1 task(s) failed" in capsys.readouterr().err
    (path,) = (tmp_path / "runs" / "nat" / "eval").glob("lm-eval*.json")
    t = json.loads(path.read_text())["tasks"]
    dead = t["arc_challenge"]
    assert dead["error"] == "RuntimeError: dataset went away second line"
    # arc_challenge's row shows acc_norm (analysis/paper_groups.py)
    assert dead["metrics"] == {"acc_norm": {"value": None, "stderr": None, "n": None}}
    assert t["arc_easy"]["metrics"]["acc_norm"]["value"] is not None  # the others still count
    assert t["triviaqa"]["partial"] == "partial (7,993 of 17,944)"
    assert "partial" not in t["arc_easy"]
    assert t["arc_easy"]["primary"] == "acc_norm"
    assert t["triviaqa"]["primary"] == "exact_match,remove_whitespace"
    nd = native_dir(path)
    assert nd == path.parent / (path.stem + ".lm_eval") and (nd / "nat").is_dir()
    files = [str(f) for f in (nd / "nat").iterdir()]
    res = json.loads(Path(get_latest_filename(get_results_filenames(files))).read_text())
    assert set(res["results"]) == {"arc_easy", "triviaqa"}
    assert res["results"]["arc_easy"]["acc_norm,none"] == \
        t["arc_easy"]["metrics"]["acc_norm"]["value"]
    assert res["n-samples"]["triviaqa"]["effective"] == 2 and "configs" in res
    assert set(res["task_hashes"]) == {"arc_easy", "triviaqa"}
    sam = get_sample_results_filenames(files)
    assert len(sam) == 2
    for f in sam:
        rows = [json.loads(x) for x in Path(f).read_text().splitlines()]
        assert [r["doc_id"] for r in rows] == [0, 1] and "arguments" in rows[0]


def test_samples_never_fail_deep_in_the_entry() -> None:
    """A sample of an unexpected form fails its task in one line; a generation task's samples
    under prior-k get no spread (their args hold a dict: this was a TypeError that nulled
    every prior-k generation task)."""
    from types import SimpleNamespace

    from experiments.eval.run import _checked, _prior_k_spread

    with pytest.raises(ValueError, match=r"^arc_easy: lm-eval returned a sample of an unexp"):
        _checked("arc_easy", [{"doc_id": 0, "arguments": {"gen_args_0": {"arg_0": "ctx"}}}])
    gen = [{"doc_id": 0, "target": "4", "arguments": [("Q: 2 + 2?", {"until": ["\n"]})]}]
    assert _prior_k_spread(_checked("gsm8k", gen), SimpleNamespace(k=2, draw_logliks={})) == {}
