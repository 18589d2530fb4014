"""`python -m pipelines.synthetic_seeds` (make synthetic-seeds): seeds at once through the local
launcher, progress from the runs' records, and what a bad option or a failing seed does."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pipelines import synthetic_seeds as R


def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path: Path, monkeypatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FTBENCH_RESULTS", str(tmp_path / "res"))
    for argv, msg in ((["--seed", "1"], "--seed is set per seed"),
                      (["--name=x/y"], "plain directory name"),
                      (["--seeds", "0 a"], "integers >= 0"), (["--seeds", "1 1"], "twice"),
                      (["--jobs", "-1"], "--jobs -1"), (["--kappa", "x"], "kappa"),
                      (["--setting", "tpu"], "setting")):
        assert R.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("synthetic-seeds: error:"), (argv, err)
        assert msg in err, (argv, err)
    assert not (tmp_path / "res").exists()


def test_progress_reads_the_runs_records(tmp_path: Path) -> None:
    """Arms done from their runs' final checkpoints, the training arm's share of its steps from
    its run's last training record: the seed's log is never read."""
    runs = [R.ArmRun(label, tmp_path / label, steps)
            for label, steps in (("baseline", 100), ("kappa=1/8", 200), ("kappa=8", 200))]
    s = R.Seed(0, "x", tmp_path / "x.log", [], arms=3, runs=runs)
    assert s.progress() == (0, None, 0.0)
    (tmp_path / "x.log").write_text("[synthetic] kappa=8: training\n")  # a log says nothing
    assert s.progress() == (0, None, 0.0)
    ck = tmp_path / "baseline" / "checkpoints"
    ck.mkdir(parents=True)
    (ck / "final.pt").write_text("x")
    assert s.progress() == (1, None, 1.0)  # the next arm has logged no training step yet
    run = tmp_path / "kappa=1/8"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"kind": "train", "step": 50, "ce": 1.0}\n'
                                       '{"kind": "val", "step": 60}\n')
    assert s.progress() == (1, "kappa=1/8", 1.25)
    s.job = object()
    line = R.status_line([s], t0=0.0)
    assert "s0: 1/3 training kappa=1/8" in line and "1/3 arms done, 42% of all steps" in line
    reused = R.Seed(1, "y", tmp_path / "y.log", [], arms=1,
                    runs=[R.ArmRun("baseline", tmp_path / "none", 0, reused=True)])
    assert reused.progress() == (1, None, 1.0)


def test_the_plan_names_each_arms_run_before_it_starts(tmp_path: Path, monkeypatch) -> None:
    """Each arm's run directory and step count come from the trainer's own config and plan."""
    from experiments import synthetic as S
    from experiments.train.config import compose
    from experiments.train.plan import plan, run_dir

    monkeypatch.setenv("FTBENCH_RESULTS", str(tmp_path))
    a, rest = R.parse(["--name", "t", "--seeds", "3", "--setting", "smoke", "--kappa", "8"])
    (seed,) = R.plan(a, rest)
    assert [r.label for r in seed.runs] == ["baseline", "kappa=8"] and seed.arms == 2
    st = S.parse_args(seed.argv)
    cfg = compose(S.arm_overrides(st, st.latent_bits, 8.0))
    assert seed.runs[1].run_dir == run_dir(cfg) and seed.runs[1].steps == plan(cfg, 1).steps
    assert not (tmp_path / "runs").exists()  # nothing written


def test_a_failing_seed_is_reported_and_the_others_finish(tmp_path: Path, monkeypatch,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    # a stand-in for experiments.synthetic refusing an option (no torch import to wait for)
    monkeypatch.setattr(R, "COMMAND", [sys.executable, "-c",
                                       "import sys; print(sys.argv[1:]); sys.exit(2)"])
    bad = R.Seed(1, "x-s1", tmp_path / "x-s1.log", ["--no-such-flag"], arms=1)
    assert R.run([bad], jobs=0, interval=0.2) == 1
    out = capsys.readouterr().out
    assert "seed 1: FAILED (exit 2)" in out and "--no-such-flag" in out
    assert "0/1 seeds done" in out and "failed: [1]" in out


@pytest.mark.slow
def test_two_seeds_at_once_then_a_rerun_trains_nothing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FTBENCH_RESULTS", str(tmp_path))
    argv = ["--name", "t", "--seeds", "0 1", "--interval", "1", "--setting", "smoke",
            "--kappa", "8", "--n-eval", "16", "--n-prompts", "1", "--n-shared-groups", "1",
            "--group-size", "2"]
    assert R.main(argv) == 0
    for s in (0, 1):
        lines = [json.loads(x) for x in
                 (tmp_path / "synthetic" / f"t-s{s}" / "samples.jsonl").read_text().splitlines()]
        assert lines[0]["settings"]["seed"] == s
        assert [r["model"] for r in lines if r["kind"] == "model"] == ["baseline", "kappa=8"]
    runs = sorted((tmp_path / "runs").iterdir())
    mtimes = {p: (p / "checkpoints" / "final.pt").stat().st_mtime for p in runs}
    assert len(runs) == 4
    assert R.main(argv) == 0  # finished runs are not retrained
    assert {p: (p / "checkpoints" / "final.pt").stat().st_mtime for p in runs} == mtimes
