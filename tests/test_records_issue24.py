"""Issue 24, items 2 and 3, reproduced on planted sweeps (both failed before the fix):

2. a legacy evalplus entry whose own sandbox record says the evaluation was killed (timed out,
   returncode -9, scored 0) was read as pass@1 = 0.0 and showed a significant delta of -0.41;
   it is missing, with the sandbox's reason, and its items never reach the bootstrap;
3. a task evaluated only under a spec the sweep does not use read as "not evaluated in this
   sweep"; the cell says it was evaluated under another spec and names the file.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from fake import write_fake_sweep

from analysis.frame import load_sweep
from analysis.tables import paper_table

N = 100
HITS = 41  # the baseline's pass@1 on the planted MBPP+: 0.41


def _evalplus(rid: str, arm: str, killed: bool) -> dict:
    """A legacy evalplus file (no spec) as the suite wrote them before: a killed sandbox left
    0 for every item and pass@1 = 0.0."""
    if killed:
        items = [{"doc_id": i, "base": 0.0, "plus": 0.0} for i in range(N)]
        sandbox = {"isolation": "namespaces", "scored": 0, "n_missing": 0, "timed_out": True,
                   "returncode": -9, "budget_s": 600, "elapsed_s": 600.4, "sandboxes": 1,
                   "leftovers_killed": 3}
    else:
        items = [{"doc_id": i, "base": float(i < HITS), "plus": float(i < HITS)}
                 for i in range(N)]
        sandbox = {"isolation": "namespaces", "scored": N, "n_missing": 0, "timed_out": False,
                   "returncode": 0, "budget_s": 600, "elapsed_s": 50.0, "sandboxes": N,
                   "leftovers_killed": 0}
    v = float(np.mean([it["plus"] for it in items]))
    return {"schema": "ftbench-eval-v1", "run_id": rid, "suite": "evalplus", "arm": arm,
            "z_mode": "prior", "k": 1, "leaks": False, "seed": 0, "limit": None,
            "tasks": {"mbpp_plus": {
                "primary": "pass@1_plus", "higher_is_better": True, "n": N,
                "metrics": {"pass@1_base": {"value": v, "stderr": 0.0, "n": N},
                            "pass@1_plus": {"value": v, "stderr": 0.0, "n": N}},
                "items": items, "sandbox": sandbox}}}


@pytest.fixture()
def killed_sweep(tmp_path):
    write_fake_sweep(tmp_path, "sb", kappas=(0.5,), seeds=(0, 1, 2), controls=())
    man = json.loads((tmp_path / "sweeps" / "sb" / "manifest.json").read_text())
    for c in man["cells"]:
        ev = _evalplus(c["run_id"], c["arm"], killed=c["arm"] == "free")
        (tmp_path / "runs" / c["run_id"] / "eval" / "evalplus.json").write_text(json.dumps(ev))
    return tmp_path


def test_item2_killed_sandbox_in_a_legacy_file_is_missing_with_its_reason(killed_sweep):
    data = load_sweep("sb", killed_sweep)
    sc = data.scores[(data.scores["task"] == "mbpp_plus")]
    free, base = sc[sc["arm"] == "free"], sc[sc["arm"] == "baseline"]
    assert len(free) == 6 and free["value"].isna().all()  # 3 seeds x 2 metrics, never 0
    assert all("returncode -9" in e and "time budget" in e and "scored nothing" in e
               for e in free["error"])
    assert (base["value"] == HITS / N).all() and base["error"].isna().all()
    it = data.items[(data.items["task"] == "mbpp_plus") & (data.items["arm"] == "free")]
    assert it["value"].isna().all()  # no planted 0 reaches the paired bootstrap
    t = paper_table(data, "tokens", n_boot=200)
    row = t[(t["task"] == "mbpp_plus") & (t["column"] != "")]
    ft = row[row["arm"] == "free"].iloc[0]
    ref = row[row["arm"] == "baseline"].iloc[0]
    assert ref["mean"] == pytest.approx(HITS / N)
    assert math.isnan(ft["mean"]) and math.isnan(ft["delta"]) and not ft["significant_holm"]
    assert "sandbox" in ft["status"] and "returncode -9" in ft["status"]
    tasks = data.tasks[(data.tasks["task"] == "mbpp_plus") & (data.tasks["arm"] == "free")]
    assert tasks["error"].str.contains("sandbox").all()  # the completeness section lists it


def test_item2_a_sound_sandbox_record_is_left_alone(killed_sweep):
    """The adversary: a legacy entry whose sandbox scored everything keeps its real 0.41; a
    legacy entry with one unscored item whose sandbox finished keeps its value; a file with a
    spec (pass@1 over scored items, unscored ones null) keeps its value even when its time
    budget ran out part way; only the legacy upgrade marks anything missing."""
    from common.records import EvalFile

    data = load_sweep("sb", killed_sweep)
    b = data.scores[(data.scores["task"] == "mbpp_plus") & (data.scores["arm"] == "baseline")]
    assert b["value"].notna().all()
    ev = _evalplus("r", "free", killed=False)
    t = ev["tasks"]["mbpp_plus"]
    t["sandbox"].update(scored=N - 1, n_missing=1)
    t["items"][0].update(base=None, plus=None, reason="sandbox timeout")
    got = EvalFile.from_json(ev, "evalplus.json").tasks["mbpp_plus"]
    assert got["metrics"]["pass@1_plus"]["value"] == HITS / N and "error" not in got
    new = _evalplus("r", "free", killed=False)
    new["tasks"]["mbpp_plus"]["sandbox"].update(timed_out=True, scored=60, n_missing=40)
    new["spec"] = {"suite": "evalplus", "tasks": ["mbpp_plus"], "limit": None,
                   "z_mode": "prior", "k": 1, "fewshot": None, "gen_tokens": 256,
                   "data_checksums": {}}
    rec = EvalFile.from_json(new, "x.json")
    assert not rec.legacy and rec.tasks["mbpp_plus"] == new["tasks"]["mbpp_plus"]


def _split_eval(root, rid: str, arc_limit: int | None) -> None:
    """Replace a run's lm-eval file with a full gsm8k file and an arc_easy file at arc_limit."""
    ed = root / "runs" / rid / "eval"
    ev = json.loads((ed / "lm-eval.json").read_text())
    (ed / "lm-eval.json").unlink()
    g = dict(ev, tasks={"gsm8k": ev["tasks"]["gsm8k"]})
    (ed / "lm-eval.json").write_text(json.dumps(g))
    a = dict(ev, limit=arc_limit, tasks={"arc_easy": ev["tasks"]["arc_easy"]})
    name = "lm-eval.json" if arc_limit is None else f"lm-eval.limit{arc_limit}.json"
    if arc_limit is None:  # the same spec as gsm8k's: one file with both tasks
        g["tasks"]["arc_easy"] = ev["tasks"]["arc_easy"]
        (ed / name).write_text(json.dumps(g))
    else:
        (ed / name).write_text(json.dumps(a))


def test_item3_every_cell_under_another_spec_names_the_file(tmp_path):
    write_fake_sweep(tmp_path, "sp", kappas=(0.5,), seeds=(0,), controls=())
    man = json.loads((tmp_path / "sweeps" / "sp" / "manifest.json").read_text())
    for c in man["cells"]:
        _split_eval(tmp_path, c["run_id"], arc_limit=2)
    data = load_sweep("sp", tmp_path)
    t = paper_table(data, "tokens", n_boot=100)
    arc = t[t["task"] == "arc_easy"]
    assert len(arc) and not arc["status"].str.contains("not evaluated in this sweep").any()
    text = " ".join(arc["status"])
    assert "another spec" in text and "lm-eval.limit2.json" in text
    assert arc["mean"].isna().all()  # refusing to mix specs stays right
    g = t[(t["task"] == "gsm8k") & (t["column"] != "")]
    assert g["mean"].notna().all()


def test_item3_one_cell_under_another_spec_names_its_file(tmp_path):
    write_fake_sweep(tmp_path, "sp1", kappas=(0.5,), seeds=(0, 1), controls=())
    man = json.loads((tmp_path / "sweeps" / "sp1" / "manifest.json").read_text())
    odd = next(c for c in man["cells"] if c["cell"] == "free-k0.5-H16-s1")
    for c in man["cells"]:
        _split_eval(tmp_path, c["run_id"], arc_limit=2 if c is odd else None)
    data = load_sweep("sp1", tmp_path)
    t = paper_table(data, "tokens", n_boot=100)
    ft = t[(t["task"] == "arc_easy") & (t["arm"] == "free")].iloc[0]
    assert ft["n_seeds"] == 1
    assert "another spec" in ft["status"] and "lm-eval.limit2.json" in ft["status"]
    assert "trained, not evaluated" not in ft["status"]
    base = t[(t["task"] == "arc_easy") & (t["arm"] == "baseline")].iloc[0]
    assert base["n_seeds"] == 2 and not base["status"]


def test_a_manifest_from_a_newer_suite_is_one_line_exit_2_nothing_written(tmp_path, capsys):
    from analysis.report import main

    man = write_fake_sweep(tmp_path, "new", kappas=(0.5,), seeds=(0,), controls=())
    m = json.loads(man.read_text())
    m["schema"] = "ftbench-manifest-v7"
    man.write_text(json.dumps(m))
    assert main(["--name", "new", "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "ftbench-manifest-v7" in err and "newer than this code reads" in err
    assert not (man.parent / "report").exists() and not (man.parent / "report.html").exists()
