"""EVAL_POINTS evaluated while training continues (issue 27): each kept checkpoint
(eval_step_<N>.pt) gets a point job as soon as it appears, the final checkpoint's chained
evaluation runs after training as before, nothing is evaluated twice, a re-run does no work, and
a failed training leaves its points recorded as not evaluated (never a value).

A stand-in trainer (writes eval_step_2.pt, waits for that point's evaluation or 300 s, then
final.pt and the last kept checkpoint) and a stand-in evaluator (writes the eval file the real one
would name, with its start time) run as real submitit jobs; the point and chain commands are the
real `python -m sweeps eval-run`.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest
from test_sweep import _fake_to_dict, _FakeTrain, _use_fake  # noqa: F401 (autouse fixture)

from common.paths import RunDir, SweepDir
from common.records import TRAINING_FAILED, EvalSpec, Manifest, ManifestCell, PointState
from sweeps import backend
from sweeps import driver as D
from sweeps import manifest as SM

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT.parent / "shared" / "benchmarks"
STEPS = 4
"""The stand-in run's steps: EVAL_POINTS=2 keeps steps 2 and 4 (4 = final.pt's)."""

TRAIN = textwrap.dedent("""
    import json, os, pathlib, sys, time
    run, mode = pathlib.Path(sys.argv[1]), sys.argv[2]
    ck = run / "checkpoints"
    ck.mkdir(parents=True, exist_ok=True)
    (run / "config.yaml").write_text("{}")
    def line(**kw):
        with open(run / "metrics.jsonl", "a") as f:
            f.write(json.dumps({**kw, "time_unix": time.time()}) + "\\n")
    def keep(name):  # atomically, as the trainer writes its exports
        (ck / f".{name}.tmp").write_text("w")
        os.replace(ck / f".{name}.tmp", ck / name)
    line(kind="start")
    if mode != "fail-at-once":
        keep("eval_step_2.pt")
        line(kind="train", step=2)
    if mode.startswith("fail"):
        time.sleep(0.5)  # the driver sees the kept checkpoint first
        sys.exit("boom: the trainer failed")
    t0 = time.time()  # training goes on until step 2 is evaluated (at most 300 s: busy cores)
    while time.time() - t0 < 300 and not list((run / "eval").glob("*.step2.json")):
        time.sleep(0.2)
    line(kind="final", step=4)
    keep("final.pt")
    keep("eval_step_4.pt")  # the last kept checkpoint: final.pt's link
""")

EVAL = textwrap.dedent("""
    import json, os, pathlib, sys, time
    t = time.time()
    target, manifest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    run = target.parent.parent if target.suffix == ".pt" else target
    step = int(target.stem.split("_")[-1]) if target.name.startswith("eval_step_") else 4
    with open(run / "calls.log", "a") as f:
        f.write(f"{step}\\n")
    time.sleep(0.3)
    (run / "eval").mkdir(exist_ok=True)
    for v in json.loads(manifest.read_text())["eval_specs"].values():
        (run / "eval" / f"lm-eval.{v['spec_id']}.step{step}.json").write_text(
            json.dumps({"started_unix": t, "ended_unix": time.time(),
                        "slurm_array_job_id": os.environ.get("SLURM_ARRAY_JOB_ID")}))
""")


def _setup(tmp: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> _FakeTrain:
    monkeypatch.setenv("FTBENCH_RESULTS", str(tmp))
    monkeypatch.delenv("FTBENCH_DATA", raising=False)
    fake = _FakeTrain(tmp, logging=True)  # keep_eval_checkpoints from the overrides
    _use_fake(monkeypatch, fake)
    monkeypatch.setattr(D, "POLL_S", 0.2)
    monkeypatch.setattr(D, "_cold_cache", lambda c: False)
    (tmp / "train.py").write_text(TRAIN)
    (tmp / "eval.py").write_text(EVAL)
    monkeypatch.setattr(backend, "train_argv", lambda overrides: [
        sys.executable, str(tmp / "train.py"), str(fake.run_dir(fake.compose(list(overrides)))),
        mode])
    manifest = tmp / "sweeps" / "pts" / "manifest.json"
    monkeypatch.setattr(backend, "eval_argv", lambda run, extra=(): [
        sys.executable, str(tmp / "eval.py"), str(run), str(manifest), *extra])
    return fake


ARGS = ["run", "--kappa", "1", "--h", "4", "--seeds", "0", "--tokens", "1k", "--name", "pts",
        "--controls", "", "--eval", "1", "--eval-points", "2", "--likelihood-rows", "0",
        "--eval-args", f"--tasks arc_easy --limit 2 --data {BENCH}"]


def _only_free(monkeypatch: pytest.MonkeyPatch) -> None:
    """One cell: the Free Transformer (the baseline is dropped from the grid)."""
    from sweeps import grid

    expand = grid.expand
    monkeypatch.setattr("sweeps.plan.expand",
                        lambda spec: [c for c in expand(spec) if c.arm == "free"])


def _lines(run: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_points_evaluated_while_training_runs_once_and_resumably(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from sweeps.__main__ import main

    _setup(tmp_path, monkeypatch, "ok")
    _only_free(monkeypatch)
    assert main([*ARGS, "--jobs", "2"]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert "start point free-k1-H4-s0 step 2" in out and out.count("start point") == 1
    m = json.loads((tmp_path / "sweeps" / "pts" / "manifest.json").read_text())
    (c,) = m["cells"]
    run = Path(c["run_dir"])
    end = next(r["time_unix"] for r in _lines(run) if r["kind"] == "final")
    sid = m["eval_specs"]["lm-eval"]["spec_id"]
    p2 = json.loads((run / "eval" / f"lm-eval.{sid}.step2.json").read_text())
    # point 1 started (and ended) while the cell still trained
    assert p2["started_unix"] < end and p2["ended_unix"] < end
    # every point evaluated once: step 2 by its point job, step 4 (final.pt's) by the chain
    assert sorted((run / "calls.log").read_text().split()) == ["2", "4"]
    assert c["state"] == "done" and c["eval"]["state"] == "done"
    assert c["eval"]["points"] == [2, 4]
    assert {s: (p["state"], p["reason"]) for s, p in c["points"].items()} == {
        "2": ("done", None), "4": ("done", None)}
    assert c["points"]["2"]["job_id"] and c["points"]["2"]["job_id"] != c["job_id"]
    assert "(2/2 points)" in SM.table(Manifest.from_json(m))

    # the same command again: nothing trains, nothing is evaluated
    assert main([*ARGS, "--jobs", "2"]) == 0
    out = capsys.readouterr().out
    assert "start" not in out and "1 cells, 1 done, 0 to run" in out
    assert sorted((run / "calls.log").read_text().split()) == ["2", "4"]
    m2 = json.loads((tmp_path / "sweeps" / "pts" / "manifest.json").read_text())
    assert m2["cells"][0]["points"] == c["points"]

    # a point job for an evaluated point does nothing; for a missing checkpoint: exit 2
    tm = Manifest.from_json(m)
    argv = D._point_argv(tm.cells[0], tm, ["--limit", "2"], 2)
    assert argv[argv.index("--point") + 1] == "2"
    assert main(argv[3:]) == 0
    assert sorted((run / "calls.log").read_text().split()) == ["2", "4"]
    assert main(D._point_argv(tm.cells[0], tm, [], 3)[3:]) == 2


@pytest.mark.parametrize("mode, seen", [("fail", True), ("fail-at-once", False)])
def test_failed_training_leaves_points_not_evaluated(
        mode: str, seen: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """JOBS=1: the training holds the only slot, so a queued point cannot start before the
    training fails; it is then skipped, never evaluated, never a value."""
    from sweeps.__main__ import main

    _setup(tmp_path, monkeypatch, mode)
    _only_free(monkeypatch)
    assert main([*ARGS, "--jobs", "1"]) == 1
    m = json.loads((tmp_path / "sweeps" / "pts" / "manifest.json").read_text())
    (c,) = m["cells"]
    run = Path(c["run_dir"])
    assert c["state"] == "failed" and "boom" in c["reason"]
    assert not (run / "calls.log").exists() and not list(run.glob("eval/*.json"))
    assert c.get("eval") is None  # no chained evaluation of an unfinished run
    if seen:  # (queued points have no start time: the key is left out)
        assert c["points"] == {"2": {"state": "skipped", "job_id": None,
                                     "reason": TRAINING_FAILED}}
    else:
        assert "points" not in c
    # the status refresh keeps it so
    assert "(0/1 points)" in SM.table(SM.status("pts", tmp_path)) or not seen


def test_a_point_being_evaluated_holds_its_lock(tmp_path: Path) -> None:
    """The chain meets a point held by a point job: it waits, then skips what that job wrote.
    (points_ready itself: test_common_api.)"""
    import threading

    from common.io import LockHeld, flocked
    from experiments.eval.chain import eval_chain, point_lock

    run = tmp_path / "r"
    ck = run / "checkpoints"
    ck.mkdir(parents=True)
    for s in (2, 4):
        (ck / f"eval_step_{s}.pt").write_text("x")
    (ck / "final.pt").write_text("x")
    (run / "eval").mkdir()
    ids = ["a" * 12]
    script = tmp_path / "ev.py"
    script.write_text(EVAL.replace('json.loads(manifest.read_text())["eval_specs"].values()',
                                   f'[{{"spec_id": "{ids[0]}"}}]'))
    final = [sys.executable, str(script), str(run), "unused"]

    def holder() -> None:  # a point job evaluating step 2 until after the final evaluation
        with flocked(point_lock(run, 2)):
            t0 = time.time()
            while not (run / "calls.log").exists() and time.time() - t0 < 60:
                time.sleep(0.05)
            time.sleep(0.3)
            (run / "eval" / f"lm-eval.{ids[0]}.step2.json").write_text("{}")

    t = threading.Thread(target=holder)
    t.start()
    time.sleep(0.2)
    with pytest.raises(LockHeld):
        with flocked(point_lock(run, 2), wait=False):
            pass
    assert eval_chain(run, ids, True, None, final) == 0
    t.join()
    # the final evaluation (step 4, final.pt's point) only: step 2 was the holder's
    assert (run / "calls.log").read_text().split() == ["4"]


def test_slurm_training_job_submits_its_points(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The SLURM path: the training job's PointWatch (as pickled into the job array) submits
    each kept checkpoint's evaluation through the sweep's launcher in the eval role (one node)
    and lists it; the manifest reads that list. Submitted here to submitit's local executor."""
    import pickle

    from sweeps.cluster import load_cluster
    from sweeps.job import CellJob

    cl = tmp_path / "cluster.yaml"
    cl.write_text("partition: gpu\nnodes: 4\ngpus_per_node: 8\ncpus_per_task: 4\n")
    cluster = load_cluster(cl)
    fake = _setup(tmp_path, monkeypatch, "ok")
    _only_free(monkeypatch)
    monkeypatch.setattr(D, "POINT_CLUSTER", "local")
    monkeypatch.setattr(D, "_check_scratch", lambda p, c: None)
    submitted: list[CellJob] = []

    class Ex:  # records what the sweep submits; nothing runs
        def __init__(self, folder: Path) -> None:
            self.folder = folder

        def update_parameters(self, **_: object) -> None:
            pass

        def submit_array(self, jobs: list[CellJob]) -> list[object]:
            from types import SimpleNamespace as NS

            submitted.extend(jobs)
            return [NS(job_id=f"77_{i}") for i in range(len(jobs))]

        def submit(self, job: CellJob) -> object:
            from types import SimpleNamespace as NS

            submitted.append(job)
            return NS(job_id="78")

    from sweeps import plan as P
    from sweeps.__main__ import main  # noqa: F401  (the CLI's imports, as in a real run)
    from sweeps.grid import SweepSpec

    spec = SweepSpec.from_text(kappa="1", h="4", seeds="0", tokens="1k",
                               overrides="logging.keep_eval_checkpoints=2")
    p = P.plan(spec, "pts")
    p.eval_specs = P.eval_specs(backend.validate_eval_args(
        ["--tasks", "arc_easy", "--limit", "2", "--data", str(BENCH)]), p)
    p.eval_points = 2
    from sweeps.launcher import SlurmLauncher

    D.run(p, SlurmLauncher(p.folder / "jobs", cluster, executor_factory=Ex), evaluate=True,
          eval_args=["--limit", "2"], log=lambda s: None)
    train = [j for j in submitted if j.kind == "train"]
    assert len(train) == 1 and train[0].points is not None
    watch = pickle.loads(pickle.dumps(train[0])).points  # as the job array's pickle has it
    params = watch.launcher.parameters("eval")
    assert params["nodes"] == 1 and params["gpus_per_node"] == 8
    assert params["timeout_min"] and watch.launcher.cluster_name == "local"

    # the job runs (here, in this process): the stand-in trainer keeps step 2 and goes on until
    # it is evaluated; the job's watch submits that evaluation meanwhile
    monkeypatch.setattr("sweeps.job.WATCH_S", 0.2)
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "77")  # the training is an array task
    job = pickle.loads(pickle.dumps(train[0]))  # (the local executor takes no SLURM options:
    # the launcher gives a stand-in cluster the time limit only)
    run = Path(job.run_dir)
    assert run == fake.run_dir(fake.compose(list(p.cells[0].cell.overrides)))
    assert job()["state"] == "done"
    sid = EvalSpec.from_json(p.eval_specs["lm-eval"]).id
    end = next(r["time_unix"] for r in _lines(run) if r["kind"] == "final")
    p2 = json.loads((run / "eval" / f"lm-eval.{sid}.step2.json").read_text())
    assert p2["started_unix"] < end
    assert p2["slurm_array_job_id"] is None  # submitted without the array task's variables
    assert os.environ["SLURM_ARRAY_JOB_ID"] == "77"  # and they are back
    assert (run / "calls.log").read_text().split() == ["2"]  # step 4 is the chain's
    rec = json.loads(Path(watch.record).read_text())
    assert list(rec) == ["2"] and rec["2"]["job_id"]
    # listed: a requeued job's watch never submits it again, even with its files gone
    for f in ("final.pt", "eval_step_4.pt"):  # as before the end of training
        (run / "checkpoints" / f).unlink()
    (run / "eval" / f"lm-eval.{sid}.step2.json").unlink()
    assert watch.poll() == []
    (run / "eval" / f"lm-eval.{sid}.step2.json").write_text("{}")
    m = SweepDir(p.folder).manifest()
    m.launcher = "local"
    pts = SM.refresh(m, p.folder, SM.probe(m.launcher, p.folder)).cells[0].points
    assert pts[2].state == "done" and pts[2].job_id == rec["2"]["job_id"]
    assert set(pts) == {2}


def test_point_states_are_derived_from_facts(tmp_path: Path) -> None:
    """settle_points: done from files (whoever wrote them, every spec_id), pending once the
    spec changes, failed / pending for a job that ended without files, skipped while the
    training is failed and pending again once retried; rotated step_<N>.pt are no points."""
    from sweeps.launcher import LocalLauncher

    spec = EvalSpec.from_args("lm-eval", ["arc_easy"], 2, "prior", 1, None, None)
    other = EvalSpec.from_args("evalplus", ["humaneval_plus"], 2, "prior", 1, None, 8)
    run = tmp_path / "runs" / "r"
    ck = run / "checkpoints"
    ck.mkdir(parents=True)
    for name in ("eval_step_2.pt", "eval_step_4.pt", "step_3.pt"):
        (ck / name).write_text("x")
    (run / "eval").mkdir()
    (run / "eval" / f"lm-eval.{spec.id}.step2.json").write_text("{}")
    m = Manifest(name="m", eval_points=2, eval_specs={"lm-eval": spec})
    jobs = LocalLauncher(tmp_path / "jobs")
    c = ManifestCell(cell="x", arm="free", run_dir=str(run), state="running",
                     points={4: PointState(state="running", job_id="999999999")})
    c.settle_points(m, RunDir(run), {}, jobs)
    assert {s: p.state for s, p in c.points.items()} == {2: "done", 4: "pending"}
    assert c.points[4].reason.startswith("interrupted")
    c.state = "failed"
    c.settle_points(m, RunDir(run), {}, jobs)
    assert c.to_json()["points"]["4"] == {"state": "skipped", "job_id": "999999999",
                                          "reason": TRAINING_FAILED}
    assert c.points[2].state == "done"  # evaluated before the failure: kept
    c.state = "running"  # RETRY_FAILED=1
    c.settle_points(m, RunDir(run), {}, jobs)
    assert c.points[4].state == "pending"
    m.eval_specs = {"lm-eval": spec, "evalplus": other}  # another spec: not done under it
    c.settle_points(m, RunDir(run), {}, jobs)
    assert c.points[2].state == "pending"
    assert not any(isinstance(v, (int, float)) for p in c.to_json()["points"].values()
                   for v in p.values())
    # without EVAL_POINTS nothing is recorded
    c2 = ManifestCell(cell="y", arm="free", run_dir=str(run), state="done")
    c2.settle_points(Manifest(name="m", eval_specs=m.eval_specs), RunDir(run), {}, jobs)
    assert "points" not in c2.to_json()
