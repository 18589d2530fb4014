"""Issue 24, item 3, reproduced on planted sweeps (it failed before the fix): a task evaluated
only under a spec the sweep does not use read as "not evaluated in this sweep"; the cell says it
was evaluated under another spec and names the file. (Item 2, the upgrade of legacy evalplus
files whose sandbox was killed, went with the upgrade: issue 43.)
"""

from __future__ import annotations

import json

from fake import write_fake_sweep

from analysis.frame import load_sweep
from analysis.tables import paper_table


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
