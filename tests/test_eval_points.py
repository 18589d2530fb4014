"""EVAL_POINTS (issue 16): the sweep evaluates every kept checkpoint, resumably, and the report
shows the paper's curves (Figs 5-7) and Table-3 pair (final, mean over the last third) with
intervals over seeds."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from fake import fake_spec, spec_id, write_fake_sweep

from analysis.checkpoints import table3
from analysis.frame import load_sweep
from analysis.report import UNCHECKED, build_report

STEPS = (33, 66, 98)
VALUE = {33: 0.2, 66: 0.4, 98: 0.6}


def _points_sweep(root: Path) -> None:
    """A fake sweep (2 seeds) whose every run has eval files at three checkpoint steps."""
    write_fake_sweep(root, "pts", kappas=(2.0,), seeds=(0, 1), controls=(),
                     checkpoint_step=10)
    for ev_path in root.glob("runs/*/eval/lm-eval.json"):
        ev = json.loads(ev_path.read_text())
        ev_path.unlink()
        for step in STEPS:
            ev["checkpoint_step"] = step
            t = ev["tasks"]["arc_easy"]
            t["items"] = []  # per-step numbers only
            t["metrics"]["acc"]["value"] = VALUE[step]
            t["metrics"]["acc_norm"]["value"] = VALUE[step] + (0.1 if ev["arm"] == "free" else 0)
            name = f"lm-eval.{ev['spec_id']}.step{step}.json"
            (ev_path.parent / name).write_text(json.dumps(ev))


def test_table3_final_and_last_third_with_seed_intervals(tmp_path: Path) -> None:
    _points_sweep(tmp_path)
    data = load_sweep("pts", tmp_path)
    assert sorted(data.points["step"].unique()) == list(STEPS)
    t = table3(data)
    row = t[(t["task"] == "arc_easy") & (t["column"] == "baseline")].iloc[0]
    # the paper's row and metric: ARC-E in acc_norm (the stock stand-in for acc_completion)
    assert row["benchmark"] == "ARC-E" and row["metric"] == "acc_norm"
    # final = step 98; the last third of training (tokens >= 2/3 of the final's) = 66 and 98
    assert row["final"] == pytest.approx(0.6) and row["last_third"] == pytest.approx(0.5)
    assert row["n_seeds"] == 2 and row["n_points"] == 2 and row["steps"] == "66,98"
    ft = t[(t["task"] == "arc_easy") & (t["column"].str.startswith("FT"))].iloc[0]
    assert ft["final"] == pytest.approx(0.7) and ft["last_third"] == pytest.approx(0.6)
    # identical seeds: no interval (said so), never a fake zero-width one
    assert row["ci_method"].startswith("no variation") and math.isnan(row["final_lo"])


def test_table3_interval_over_seeds(tmp_path: Path) -> None:
    _points_sweep(tmp_path)
    # make the two seeds differ at the final step: the interval is a t over 2 seeds
    for p in tmp_path.glob("runs/*/eval/*.step98.json"):
        ev = json.loads(p.read_text())
        cfg = (p.parent.parent / "config.yaml").read_text()
        seed = 1 if "seed: 1" in cfg else 0
        ev["tasks"]["arc_easy"]["metrics"]["acc_norm"]["value"] += 0.05 * seed
        p.write_text(json.dumps(ev))
    t = table3(load_sweep("pts", tmp_path))
    row = t[(t["task"] == "arc_easy") & (t["column"] == "baseline")].iloc[0]
    assert row["final"] == pytest.approx(0.625)
    assert row["final_lo"] < 0.625 < row["final_hi"] and "t over 2 seeds" in row["ci_method"]
    assert row["last_third_lo"] < row["last_third"] < row["last_third_hi"]


def test_report_has_curves_and_last_third_column(tmp_path: Path) -> None:
    _points_sweep(tmp_path)
    html = build_report("pts", tmp_path, n_boot=50).read_text()
    sec = html[html.index('<section id="table3">'):]
    sec = sec[:sec.index("</section>")]
    assert "last third [95% CI over seeds]" in sec
    assert f"ARC-E (acc_norm; paper acc_completion{UNCHECKED})" in sec  # marked while unchecked
    assert '<img alt="benchmark curves vs training tokens" src="data:image/png;base64,' in sec
    assert (tmp_path / "sweeps/pts/report/benchmark_curves.png").stat().st_size > 1000
    # the main tables use the final checkpoint only
    assert "0.600" in html


# ------------------------------------------------------------------ the sweep side
FAKE_EVAL = ("import json, pathlib, sys; a = sys.argv[1:]; p = pathlib.Path(a[0]); "
             "run = p.parent.parent if p.suffix == '.pt' else p; "
             "step = int(p.stem.split('_')[-1]) if p.suffix == '.pt' else 99; "
             "open(run / 'calls.log', 'a').write(f'{step}\\n'); "
             "(run / 'eval').mkdir(exist_ok=True); "
             "[(run / 'eval' / f'lm-eval.{sid}.step{step}.json').write_text('{}') "
             "for sid in a[1].split(',')]")


def _run_dir(tmp_path: Path, eval_steps: tuple = (4, 8, 12)) -> Path:
    """A run with the trainer's kept eval_step_<N>.pt files (and rotating step_<N>.pt ones)."""
    run = tmp_path / "runs" / "r1"
    (run / "checkpoints").mkdir(parents=True)
    for s in eval_steps:
        (run / "checkpoints" / f"eval_step_{s}.pt").write_bytes(b"x")
    (run / "checkpoints" / "step_11.pt").write_bytes(b"x")
    (run / "checkpoints" / "step_12.pt").write_bytes(b"x")
    (run / "checkpoints" / "final.pt").write_bytes(b"x")
    return run


def test_kept_checkpoints_prefers_the_trainers_eval_steps(tmp_path: Path) -> None:
    from experiments.eval.chain import kept_checkpoints

    assert [s for s, _ in kept_checkpoints(_run_dir(tmp_path))] == [4, 8, 12]
    old = _run_dir(tmp_path / "old", eval_steps=())  # trained before the key existed
    assert [s for s, _ in kept_checkpoints(old)] == [11, 12]


def test_eval_chain_scores_each_kept_checkpoint_resumably(tmp_path: Path) -> None:
    """Through `python -m sweeps eval-run RUN --spec-ids .. --points -- <eval argv>`, as the
    job runs it; then resumed."""
    from experiments.eval.chain import checkpoint_evals_missing, eval_chain
    from sweeps.__main__ import main

    run = _run_dir(tmp_path)
    ids = ["aaaaaaaaaaaa", "bbbbbbbbbbbb"]
    final = [sys.executable, "-c", FAKE_EVAL, str(run), ",".join(ids)]
    assert [s for s, _ in checkpoint_evals_missing(run, ids)] == [4, 8, 12]
    assert main(["eval-run", str(run), "--spec-ids", ",".join(ids), "--points", "--",
                 *final]) == 0
    assert (run / "calls.log").read_text().split() == ["99", "4", "8", "12"]
    assert checkpoint_evals_missing(run, ids) == []
    # resumed: one spec's file of step 8 lost -> only step 8 is evaluated again
    (run / "eval" / f"lm-eval.{ids[1]}.step8.json").unlink()
    (run / "calls.log").unlink()
    assert eval_chain(run, ids, True, None, final) == 0
    assert (run / "calls.log").read_text().split() == ["99", "8"]


def test_eval_chain_failure_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from experiments.eval.chain import eval_chain

    run = _run_dir(tmp_path)
    assert eval_chain(run, ["a" * 12], True, None,
                      [sys.executable, "-c", "raise SystemExit(3)", str(run)]) == 3
    assert "exited with code 3" in capsys.readouterr().err


def test_chain_argv_and_manifest_fields(tmp_path: Path) -> None:
    from common.records import EvalSpec, Manifest, ManifestCell
    from sweeps.driver import _eval_job

    c = ManifestCell(cell="x", arm="free", run_dir=str(tmp_path))
    m = Manifest(name="m", eval_points=3, likelihood_rows=16,
                      eval_specs={"lm-eval": EvalSpec.from_json(fake_spec())})
    assert m.spec_ids() == [spec_id(fake_spec())]
    argv = _eval_job(c, ["--limit", "2"], None, m=m).argv
    i = argv.index("--")
    assert argv[1:4] == ["-m", "sweeps", "eval-run"] and "--points" in argv[:i]
    assert argv[argv.index("--likelihood-rows") + 1] == "16"
    assert argv[i + 1:][-3:] == [str(tmp_path), "--limit", "2"]
    # without points or likelihood: the plain eval command, as before
    assert _eval_job(c, [], None, m=Manifest(name="m")).argv[1:3] == [
        "-m", "experiments.eval"]
