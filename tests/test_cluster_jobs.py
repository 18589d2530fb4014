"""Jobs that must not multiply (issue 37): a training job of 8 tasks submits each evaluation
point once (only its global rank 0 watches for kept checkpoints); every attempt of a requeued
cell logs to one W&B run; the local launcher gives each concurrent cell its own GPU set; a
dependent SLURM job is cancelled when its dependency can no longer be met; the report role.

The 8 tasks are 8 processes with the variables SLURM sets for the tasks of one job (submitit's
JobEnvironment reads them); the trainer is a stand-in that keeps two checkpoints; the point
jobs go to a launcher that only records them. W&B is a stand-in module that reads what
wandb.init reads when it is given no id (WANDB_RUN_ID, WANDB_RESUME): nothing reaches a network.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sweeps.cluster import load_cluster
from sweeps.job import GRACE_MARGIN_S, CellJob, grace_for
from sweeps.launcher import LocalLauncher, SlurmLauncher, gpu_sets

ROOT = Path(__file__).resolve().parents[1]

TRAIN = textwrap.dedent("""
    import os, pathlib, sys, time
    run = pathlib.Path(sys.argv[1])
    ck = run / "checkpoints"
    ck.mkdir(parents=True, exist_ok=True)
    def keep(name):  # atomically, as the trainer writes its exports
        (ck / f".{name}.{os.getpid()}").write_text("w")
        os.replace(ck / f".{name}.{os.getpid()}", ck / name)
    if os.environ.get("RANK", "0") == "0":
        keep("eval_step_2.pt")
        keep("eval_step_4.pt")
    time.sleep(3)  # every task's watch has looked several times
    if os.environ.get("RANK", "0") == "0":
        keep("final.pt")
    while not (ck / "final.pt").exists():  # the other ranks end with rank 0
        time.sleep(0.1)
""")

TASK = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, os.environ["ROOT"])
    import sweeps.job as J

    J.WATCH_S = 0.2

    TASK = os.environ["SLURM_PROCID"]  # (submitting clears SLURM_*: read it now)

    class Recorder:  # a launcher that records what it is asked to submit
        def submit(self, job, role="train", **_):
            with open(os.environ["SUBMITTED"], "a") as f:  # O_APPEND: one line per call
                f.write(json.dumps({"rank": TASK, "role": role, "argv": job.argv}) + "\\n")
            class H: job_id = "9" + TASK
            return H()

    run, tmp = os.environ["RUN"], os.environ["TMP"]
    watch = J.PointWatch("free-s0", run, ["abc"], ["eval-run", run, "--point"], ["--", "x"],
                         launcher=Recorder(), record=os.path.join(tmp, "points.json"))
    job = J.CellJob("free-s0", [sys.executable, os.path.join(tmp, "train.py"), run],
                    run_dir=run, points=watch)
    print(json.dumps(job()))
""")


def _task_env(i: int, n: int) -> dict[str, str]:
    """What SLURM sets for task i of an n-task job on one node (submitit reads these)."""
    return {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "4242", "SLURM_PROCID": str(i),
            "SLURM_NTASKS": str(n), "SLURM_LOCALID": str(i), "SLURM_NODEID": "0",
            "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "localhost",
            "SLURM_STEP_NODELIST": "localhost"}


@pytest.mark.slow
def test_an_8_task_training_job_submits_each_evaluation_point_once(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "abc123"
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "task.py").write_text(TASK)
    submitted = tmp_path / "submitted.jsonl"
    base = {**os.environ, "ROOT": str(ROOT), "RUN": str(run), "TMP": str(tmp_path),
            "SUBMITTED": str(submitted), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    for k in [k for k in base if k.startswith(("SLURM_", "SUBMITIT_"))]:
        del base[k]
    procs = [subprocess.Popen([sys.executable, str(tmp_path / "task.py")],
                              env={**base, **_task_env(i, 8)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(8)]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
        assert json.loads(out.strip().splitlines()[-1])["state"] == "done"
    rows = [json.loads(ln) for ln in submitted.read_text().splitlines()]
    # one submission per kept checkpoint, all from global rank 0, in the eval role
    assert sorted(r["argv"][3] for r in rows) == ["2", "4"], rows
    assert {r["rank"] for r in rows} == {"0"} and {r["role"] for r in rows} == {"eval"}
    assert sorted(json.loads((tmp_path / "points.json").read_text())) == ["2", "4"]


WANDB = textwrap.dedent('''
    """A stand-in for wandb: init() resolves the run id and resume mode as wandb.init does when
    it is given neither (from WANDB_RUN_ID and WANDB_RESUME) and records them."""
    import json, os

    def init(project=None, name=None, config=None, id=None, resume=None, **_):
        rec = {"id": id or os.environ.get("WANDB_RUN_ID"),
               "resume": resume or os.environ.get("WANDB_RESUME"), "name": name}
        with open(os.environ["WANDB_LOG"], "a") as f:
            f.write(json.dumps(rec) + "\\n")

    def log(*a, **k):
        pass

    def finish():
        pass
''')

ATTEMPT = textwrap.dedent("""
    import pathlib, sys
    import wandb
    run = pathlib.Path(sys.argv[1])
    wandb.init(project="p", name=run.name)
    ck = run / "checkpoints"
    ck.mkdir(parents=True, exist_ok=True)
    if not (ck / "step_1").exists():  # the first attempt: checkpoint, then preempted
        (ck / "step_1").mkdir()
        sys.exit(75)
    (ck / "final.pt").write_text("w")
""")


def test_a_requeued_cell_logs_every_attempt_to_one_wandb_run(tmp_path: Path,
                                                            monkeypatch) -> None:
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "wandb.py").write_text(WANDB)
    (tmp_path / "attempt.py").write_text(ATTEMPT)
    log = tmp_path / "wandb.jsonl"
    monkeypatch.setenv("WANDB_LOG", str(log))
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    run = tmp_path / "runs" / "5f3e9a0c1d2b"
    job = CellJob("free-s0", [sys.executable, str(tmp_path / "attempt.py"), str(run)],
                  run_dir=str(run), env={"PYTHONPATH": str(tmp_path / "mods")})
    first = job()
    assert first["state"] == "interrupted"
    assert job.fresh()()["state"] == "done"  # the requeued attempt
    recs = [json.loads(ln) for ln in log.read_text().splitlines()]
    assert [r["id"] for r in recs] == [run.name, run.name]
    assert {r["resume"] for r in recs} == {"allow"}
    # an evaluation job is not a training run: no W&B id of its own
    assert "WANDB_RUN_ID" not in CellJob("e", ["true"], kind="eval")._tracker_env()


def test_the_local_launcher_binds_one_gpu_set_per_concurrent_cell(tmp_path: Path) -> None:
    assert gpu_sets(["0", "1", "2", "3", "4", "5", "6", "7"], 4) == ["0,1", "2,3", "4,5", "6,7"]
    assert gpu_sets(["0", "1", "2"], 2) == ["0", "1"]  # equal sets: the third GPU idles
    assert gpu_sets(["0", "1"], 3) == ["0", "1", "0"]  # more cells than GPUs: they share
    assert gpu_sets([], 2) == [None, None]
    got = []

    class Ex:
        def submit(self, job):
            got.append(dict(job.env))
            return job

    la = LocalLauncher(tmp_path, gpus=["0", "1", "2", "3"], executor_factory=lambda f: Ex())
    assert la.slots == 4  # one cell per GPU by default on a GPU machine
    la2 = LocalLauncher(tmp_path, jobs=2, gpus=["0", "1", "2", "3"],
                        executor_factory=lambda f: Ex())
    for slot in (0, 1):
        la2.submit(CellJob("c", ["true"]), slot=slot)
    assert [g["CUDA_VISIBLE_DEVICES"] for g in got] == ["0,1", "2,3"]
    la3 = LocalLauncher(tmp_path, jobs=2, gpus=[], executor_factory=lambda f: Ex())
    la3.submit(CellJob("c", ["true"]), slot=0)
    assert "CUDA_VISIBLE_DEVICES" not in got[-1]  # a CPU machine: nothing to bind


def test_visible_gpus_follow_cuda_visible_devices(monkeypatch) -> None:
    from sweeps.launcher import visible_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert visible_gpus() == ["3", "5"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert visible_gpus() == []


def test_dependent_slurm_jobs_and_the_report_role(tmp_path: Path, monkeypatch) -> None:
    from submitit.slurm.slurm import SlurmExecutor

    # submitit 1.5.4 refuses a SLURM executor where no `srun` is on PATH: pretend, as
    # test_cluster_config does (nothing is submitted here)
    monkeypatch.setattr(SlurmExecutor, "affinity", classmethod(lambda cls: 2))
    cl = tmp_path / "cluster.yaml"
    cl.write_text("partition: gpu\ngpus_per_node: 8\nnodes: 3\nsignal_delay_s: null\n"
                  "report:\n  timeout_min: 30\n")
    c = load_cluster(cl)
    assert c.tasks == 24
    rep = c.for_role("report")
    assert (rep.gpus_per_node, rep.cpus_per_task, rep.nodes, rep.timeout_min) == (0, 1, 1, 30)
    ex = SlurmLauncher(tmp_path, c).executor("report", after_any=["12_0", "13"])
    extra = ex._executor.parameters["additional_parameters"]
    assert extra["dependency"] == "afterany:12_0:13" and extra["kill_on_invalid_dep"] == "yes"
    ex = SlurmLauncher(tmp_path, c).executor("eval", after="12_1")
    assert ex._executor.parameters["additional_parameters"]["dependency"] == "afterok:12_1"
    # the trainer's grace lies inside the signal's lead (the default lead: 300 s)
    lead = c.or_default("signal_delay_s")
    assert lead == 300 and grace_for(lead) == lead - GRACE_MARGIN_S
