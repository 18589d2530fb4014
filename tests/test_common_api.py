"""common/'s typed currency: RunDir and SweepDir (the layout, spelled once), the Arm registry and
the benchmark registry, each checked against an independent statement of what it must say (the
layout of docs/RESULTS.md, the grid's arms, and the lists the suite kept in parallel before the
registry, copied here as they were)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common import arms, benchmarks
from common.errors import UsageError
from common.paths import RunDir, SweepDir
from common.records import (
    EVALPLUS_TASKS,
    FLOPS_MATCHED_ARMS,
    LOGLIK_TASKS,
    Manifest,
    ManifestCell,
    MetricsLine,
    RecordError,
    RunRecord,
)


# ------------------------------------------------------------------------------ RunDir
def _run(tmp_path: Path, rid: str = "abc123") -> Path:
    """A run directory laid out as docs/RESULTS.md says, written by hand."""
    rd = tmp_path / "runs" / rid
    (rd / "checkpoints").mkdir(parents=True)
    (rd / "eval").mkdir()
    (rd / "config.yaml").write_text(
        "run_id: abc123\narm: free\nmodel: {latent_bits: 4, n_layers: 2}\n"
        "train: {seq_len: 64, compute_match: flops, match_latent_bits: 8}\n")
    (rd / "metrics.jsonl").write_text(
        '{"kind": "train", "step": 1, "tokens": 10, "flops": 5, "ce": 3.0}\n'
        '{"kind": "final", "step": 2, "tokens": 20, "flops": 10, "wall_s": 1}\n{"kind": "va')
    for n in ("step_2.pt", "step_10.pt", "eval_step_4.pt", ".step_12.pt.tmp"):
        (rd / "checkpoints" / n).write_bytes(b"x")
    return rd


def test_run_dir_spells_the_layout_and_hands_out_typed_records(tmp_path):
    path = _run(tmp_path)
    rd = RunDir.of("abc123", tmp_path)
    assert rd.path == path and rd.run_id == "abc123" and rd.target is None
    assert rd.record_path == path / "config.yaml" and rd.metrics_path == path / "metrics.jsonl"
    assert rd.final_checkpoint == path / "checkpoints" / "final.pt"
    assert rd.eval_dir == path / "eval" and rd.log_path == path / "train.log"
    assert rd.has_record and rd.has_metrics and not rd.finished
    rec = rd.record()
    assert isinstance(rec, RunRecord) and rec.arm == "free" and rec.latent_bits == 4
    assert rec.match_latent_bits == 8 and rec.train["seq_len"] == 64
    lines = rd.metrics()  # the truncated last line (a run still writing) is skipped
    assert [type(x) for x in lines] == [MetricsLine] * 2 and lines[-1].kind == "final"
    assert [s for s, _ in rd.step_checkpoints()] == [2, 10] and rd.latest_step() == 10
    assert [s for s, _ in rd.eval_checkpoints()] == [4]
    assert rd.step_checkpoint(3).name == "step_3.pt"
    assert rd.eval_checkpoint(3).name == "eval_step_3.pt"
    # no final.pt: the evaluators' checkpoint is the newest step; then final.pt
    assert rd.checkpoint() == path / "checkpoints" / "step_10.pt"
    (path / "checkpoints" / "final.pt").write_bytes(b"x")
    assert rd.finished and rd.checkpoint() == path / "checkpoints" / "final.pt"


def test_run_dir_at_resolves_a_run_or_a_checkpoint_one_way(tmp_path):
    path = _run(tmp_path)
    ck = path / "checkpoints" / "step_2.pt"
    assert RunDir.at(path) == RunDir(path) == RunDir.at(path / "checkpoints")
    by_file = RunDir.at(ck)
    assert by_file.path == path and by_file.target == ck and by_file.checkpoint() == ck
    assert by_file.final_or_target() == ck
    assert RunDir.at(path).final_or_target() == path / "checkpoints" / "final.pt"
    lone = tmp_path / "copied.pt"
    lone.write_bytes(b"x")
    other = RunDir.at(lone)  # a .pt outside any run: its folder, which has no record
    assert other.path == tmp_path and other.target == lone and not other.has_record
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        RunDir.at(tmp_path / "missing.pt").checkpoint()
    loose = tmp_path / "copies"  # checkpoints in a folder that is no run's
    loose.mkdir()
    for n in ("step_3.pt", "step_12.pt"):
        (loose / n).write_bytes(b"x")
    assert RunDir.at(loose).checkpoint() == loose / "step_12.pt"
    (loose / "final.pt").write_bytes(b"x")
    assert RunDir.at(loose) == RunDir(loose, target=loose / "final.pt")
    with pytest.raises(FileNotFoundError, match="final.pt and step_<N>.pt"):
        RunDir(tmp_path / "empty").checkpoint()


def test_run_dir_record_errors_are_one_line(tmp_path):
    rd = RunDir(tmp_path)
    with pytest.raises(FileNotFoundError):
        rd.record()
    (tmp_path / "config.yaml").write_text("model: [unclosed\n")
    with pytest.raises(RecordError, match="is corrupt") as e:
        rd.record()
    assert "\n" not in str(e.value)
    (tmp_path / "config.yaml").write_text("- a list\n")
    with pytest.raises(RecordError, match="not a run record"):
        rd.record_json()


def test_run_dir_writes_the_record_it_reads(tmp_path):
    rd = RunDir(tmp_path / "r1")
    rec = RunRecord(run_id="r1", arm="baseline", model={"latent_bits": 0}, extra={"x": [1]})
    rd.write_record(rec)
    assert rd.record() == RunRecord.from_json(rec.to_json())


def test_points_ready_and_evaluated(tmp_path):
    rd = RunDir(_run(tmp_path))
    ids = ["a" * 12]
    assert [s for s, _ in rd.points_ready(ids)] == [4]
    (rd.eval_dir / f"lm-eval.{'a' * 12}.step4.json").write_text("{}")
    assert rd.point_evaluated(4, ids) and not rd.point_evaluated(4, ids + ["b" * 12])
    assert rd.points_ready(ids) == []
    assert rd.eval_files() == [rd.eval_dir / f"lm-eval.{'a' * 12}.step4.json"]
    (rd.eval_dir / f"lm-eval.{'a' * 12}.step4.json").unlink()
    (rd.path / "checkpoints" / "final.pt").write_bytes(b"x")
    assert rd.points_ready(ids) == []  # once final.pt exists the points are the chain's
    assert RunDir(tmp_path / "none").eval_files() == []


# ------------------------------------------------------------------------------ SweepDir
def test_sweep_dir_reads_its_manifest_typed(tmp_path):
    sd = SweepDir.of("main", tmp_path)
    assert sd.path == tmp_path / "sweeps" / "main" and sd.name == "main"
    assert sd.root == tmp_path and not sd.exists() and SweepDir.names(tmp_path) == []
    assert sd.manifest_path.name == "manifest.json" and sd.report_html.name == "report.html"
    assert sd.report_dir == sd.path / "report" and sd.jobs_dir == sd.path / "jobs"
    assert sd.points_record("c1") == sd.path / "points" / "c1.json"
    man = Manifest(name="main", cells=(
        ManifestCell(cell="baseline-s0", arm="baseline", kappa_bits=None, latent_bits=0,
                     seed=0, run_id="r0"),
        ManifestCell(cell="x", arm="free", kappa_bits=1.0, latent_bits=4, seed=0,
                     run_id=None)))
    sd.path.mkdir(parents=True)
    sd.manifest_path.write_text(json.dumps(man.to_json()))
    assert sd.exists() and SweepDir.names(tmp_path) == ["main"]
    assert sd.manifest() == Manifest.from_json(man.to_json())
    sd.manifest_path.write_text("{not json")
    with pytest.raises(RecordError, match="not JSON"):
        sd.manifest()


# ------------------------------------------------------------------------------ arms
GRID_ARMS = ("baseline", "free", "baseline_flops", "baseline_plus1", "baseline_plus1_flops",
             "free_zcut")
"""sweeps/grid.py's ARMS as of the Z-cut control (issue 38)."""


def test_every_grid_arm_has_one_record():
    assert tuple(a.name for a in arms.ARMS) == GRID_ARMS
    assert {a.control for a in arms.ARMS if a.control} == {"flops", "plus1", "plus1_flops",
                                                           "zcut"}
    for a in arms.ARMS:
        assert arms.arm(a.name) is a and arms.find(a.name) is a
        assert a.model_class == ("FreeTransformer" if a.latent else "Transformer")
        assert a.matched_to
    assert arms.find("nope") is None and arms.find(None) is None and arms.find(float("nan")) \
        is None
    with pytest.raises(UsageError, match="'nope': not a known arm"):
        arms.arm("nope")
    assert arms.by_control("zcut") is arms.FREE_ZCUT
    with pytest.raises(UsageError, match="not a known control"):
        arms.by_control("plus2")


def test_the_z_cut_control_is_a_latent_arm_but_not_the_one_under_test():
    z = arms.arm("free_zcut")
    assert z.latent and z.z_cut and z.model_class == "FreeTransformer"
    assert not z.is_treatment and not z.flops_matched and z.axes == ("H", "seed")
    assert z.model_kind == "free"  # its run files record the model's kind
    assert arms.names(treatment=True) == ("free",)
    assert arms.names(latent=True) == ("free", "free_zcut")
    assert "free_zcut" in arms.names(control=True)


def test_arm_properties_match_the_grid():
    assert FLOPS_MATCHED_ARMS == ("baseline_flops", "baseline_plus1_flops")
    assert arms.names(compute="flops") == FLOPS_MATCHED_ARMS
    assert arms.names(extra_layer=True) == ("baseline_plus1", "baseline_plus1_flops")
    assert arms.names(latent=False) == ("baseline", "baseline_flops", "baseline_plus1",
                                        "baseline_plus1_flops")
    assert arms.names(control=False) == ("baseline", "free")
    assert arms.of_model(0) is arms.BASELINE and arms.of_model(16) is arms.FREE
    assert arms.arm("baseline_flops").model_kind == "baseline"


def test_an_inconsistent_arm_is_refused():
    with pytest.raises(UsageError, match="disagrees with model_class"):
        arms.Arm("x", latent=True, model_class="Transformer", matched_to="-")
    with pytest.raises(UsageError, match="z_cut needs a latent"):
        arms.Arm("x", latent=False, model_class="Transformer", matched_to="-", z_cut=True)
    with pytest.raises(UsageError, match="compute"):
        arms.Arm("x", latent=False, model_class="Transformer", matched_to="-", compute="bits")


# ------------------------------------------------------------------------------ benchmarks
# the lists the suite kept in parallel before the registry, as they were (issue 35)
OLD_DEFAULT = ("gsm8k", "mmlu", "arc_easy", "arc_challenge", "commonsense_qa",
               "humaneval_plus", "mbpp_plus")
OLD_ONLINE_EXTRA = ("hellaswag", "winogrande", "openbookqa", "piqa", "race", "boolq",
                    "nq_open", "triviaqa")
OLD_LOGLIK = ("mmlu", "arc_easy", "arc_challenge", "commonsense_qa", "hellaswag",
              "winogrande", "openbookqa", "piqa", "race", "boolq")
OLD_OFFLINE = ("gsm8k", "arc_easy", "arc_challenge", "commonsense_qa", "mmlu", "hellaswag",
               "winogrande", "openbookqa", "piqa", "boolq", "nq_open", "triviaqa")
OLD_NO_FEWSHOT = ("arc_easy", "arc_challenge", "hellaswag", "winogrande", "openbookqa",
                  "piqa", "boolq", "nq_open", "triviaqa")
OLD_REQUESTS = {"mmlu": 56168, "gsm8k": 2638, "mbpp_plus": 756, "humaneval_plus": 328,
                "arc_easy": 9504, "arc_challenge": 4688, "commonsense_qa": 6105,
                "hellaswag": 40168, "boolq": 6540, "piqa": 3676, "winogrande": 2534,
                "nq_open": 3610, "openbookqa": 2000}
OLD_COST = {"mmlu": 14.0, "gsm8k": 12.0, "hellaswag": 10.0, "triviaqa": 8.0, "nq_open": 4.0,
            "mbpp_plus": 5.0, "humaneval_plus": 3.0, "boolq": 3.0, "arc_easy": 2.0,
            "piqa": 2.0, "commonsense_qa": 1.5, "winogrande": 1.0, "arc_challenge": 1.0,
            "openbookqa": 0.5}
OLD_CHANCE = {"mmlu": 0.25, "arc_easy": 0.25, "arc_challenge": 0.25, "commonsense_qa": 0.2,
              "gsm8k": 0.0, "humaneval_plus": 0.0, "mbpp_plus": 0.0}
OLD_PRIMARY = {"gsm8k": "exact_match,strict-match", "mmlu": "acc",
               "nq_open": "exact_match,remove_whitespace",
               "triviaqa": "exact_match,remove_whitespace", "hellaswag": "acc_norm",
               "piqa": "acc_norm", "openbookqa": "acc_norm", "arc_easy": "acc_norm",
               "arc_challenge": "acc_norm", "humaneval_plus": "pass@1_plus",
               "mbpp_plus": "pass@1_plus"}
_ARROW = ("data-00000-of-00001.arrow", "dataset_info.json", "state.json")
OLD_NEEDED = {
    "gsm8k": ["gsm8k/test.jsonl", "gsm8k/train.jsonl"],
    "arc_easy": ["arc/arc_easy_test.llmfoundry.jsonl"],
    "arc_challenge": ["arc/arc_challenge_test.llmfoundry.jsonl"],
    "commonsense_qa": ["commonsenseqa/train_rand_split.jsonl",
                       "commonsenseqa/dev_rand_split.jsonl"],
    "hellaswag": [f"hellaswag/validation/{f}" for f in _ARROW],
    "winogrande": [f"winogrande/validation/{f}" for f in _ARROW],
    "openbookqa": ["openbookqa/test.tsv"],
    "piqa": ["piqa/valid.jsonl", "piqa/valid-labels.lst"],
    "boolq": ["boolq/val.jsonl"],
    "nq_open": ["nq_open/NQ-open.dev.jsonl"],
    "triviaqa": [f"triviaqa/rc.wikipedia.nocontext_validation/{f}" for f in _ARROW],
    "humaneval_plus": ["humanevalplus/HumanEvalPlus-v0.1.10.jsonl"],
    "mbpp_plus": ["mbppplus/MbppPlus-v0.2.0.jsonl"],
}


def test_the_registry_says_what_the_parallel_lists_said():
    b = benchmarks
    assert set(b.tasks(default=True)) == set(OLD_DEFAULT)
    assert b.tasks(default=True, order="run")[-2:] == ("humaneval_plus", "mbpp_plus")
    assert set(b.tasks(default=False)) == set(OLD_ONLINE_EXTRA)
    assert set(LOGLIK_TASKS) == set(OLD_LOGLIK) and EVALPLUS_TASKS == ("humaneval_plus",
                                                                       "mbpp_plus")
    assert set(b.tasks(suite="lm-eval", offline_ready=True)) == set(OLD_OFFLINE)
    assert set(b.tasks(offline_ready=True)) == set(OLD_OFFLINE) | set(EVALPLUS_TASKS)
    assert set(b.tasks(offline_ready=True, fewshot_source=False)) == set(OLD_NO_FEWSHOT)
    rows = {x.task: x for x in b.BENCHMARKS if x.task}
    assert {t: r.requests for t, r in rows.items() if r.requests is not None} == OLD_REQUESTS
    assert {t: r.cost_min for t, r in rows.items() if r.cost_min is not None} == OLD_COST
    assert {t: r.chance for t, r in rows.items() if r.chance is not None} == OLD_CHANCE
    for t, r in rows.items():
        assert r.primary == OLD_PRIMARY.get(t, "acc"), t
        assert list(r.offline) == OLD_NEEDED.get(t, []), t
    assert rows["mmlu"].offline_sums == "mmlu/SHA256SUMS"
    assert b.EXTRA_DATA == {"mmlu_validation": "mmlu/validation/SHA256SUMS"}
    assert {t: r.partial for t, r in rows.items() if r.partial} == {
        "triviaqa": "partial (7,993 of 17,944)"}
    assert b.gold_tasks() == ("humaneval_plus_gold_bpb", "mbpp_plus_gold_bpb",
                              "gsm8k_gold_bpb")
    assert b.gold_tasks(["gsm8k", "mmlu"]) == ("gsm8k_gold_bpb",)


def test_every_stock_yaml_the_registry_names_exists():
    from experiments.eval.tasks import STOCK as stock  # found without importing lm-eval

    for r in benchmarks.BENCHMARKS:
        if r.suite == "lm-eval":
            assert (stock / str(r.stock)).exists(), r.stock


def test_the_paper_table_rows_in_the_papers_order():
    groups = benchmarks.by_group()
    assert list(groups) == list(benchmarks.GROUPS)
    assert [r.label for r in groups["Generative code/math"]] == ["HumanEval+", "MBPP", "GSM8K"]
    assert [r.label for r in groups["Culture"]] == ["NQ", "TriviaQA"]
    assert sum(map(len, groups.values())) == 16  # the paper's 16 benchmarks
    mid = next(r for r in benchmarks.BENCHMARKS if r.label == "RACE-middle")
    assert mid.task is None and mid.paper_row()["task"] is None


def test_a_task_finds_its_row_and_an_unknown_one_is_one_line():
    assert benchmarks.benchmark("gsm8k").label == "GSM8K"
    assert benchmarks.benchmark("gsm8k_gold_bpb").task == "gsm8k"
    assert benchmarks.find("mmlu_gold_bpb") is None  # MMLU scores no gold answer
    assert benchmarks.find(None) is None
    with pytest.raises(benchmarks.BenchmarkError, match="'xyz': no benchmark row"):
        benchmarks.benchmark("xyz")
    with pytest.raises(ValueError, match="order"):
        benchmarks.tasks(order="alpha")


def test_every_file_a_task_yaml_names_is_one_its_row_pins(tmp_path):
    """The loader (experiments/eval/tasks) and the registry never drift apart: each path an
    offline task YAML reads is one of its row's offline files (or the folder of a
    save_to_disk copy the row pins; MMLU's folder holds what its sums file lists)."""
    from experiments.eval.tasks import task_configs

    d = tmp_path.resolve()
    seen = set()
    for name, cfg in task_configs(d).items():
        task = name.split("/")[0].removesuffix(".yaml")
        row = benchmarks.benchmark(task)
        kw = dict(cfg.get("dataset_kwargs") or {})
        paths = list((kw.pop("data_files", None) or {}).values())
        paths += [v for k, v in kw.items() if k in ("test", "questions", "labels", "validation")]
        paths += list((kw.get("splits") or {}).values())
        if "folder" in kw:
            paths.append(kw["folder"])
        for p in paths:
            rel = str(Path(p).relative_to(d)) if Path(p).is_absolute() else str(p)
            pinned = set(row.offline) | {str(Path(f).parent) for f in row.offline}
            if row.offline_sums:
                pinned.add(str(Path(row.offline_sums).parent))
            assert rel in pinned, (task, rel)
            seen.add(task)
    assert seen == set(benchmarks.tasks(suite="lm-eval", offline_ready=True))
