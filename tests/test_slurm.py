# tests/test_slurm.py
"""Sweeps on a real single-node SLURM cluster (ci/slurm/start.sh), the SLURM twin of the local
end-to-end test (tests/test_e2e.py): a cell preempted through
submitit (SIGUSR2) checkpoints, is requeued, resumes and ends with the weights of an
uninterrupted run; a cell whose trainer fails is reported failed with its reason; `make paper
RECIPE=<cpu-mini, cut to its baseline and one Free Transformer> LAUNCHER=slurm`, corpus not
prebuilt, submits the corpus units, the sweep (one job array), its evaluation points, chained
evaluations and the report through the one launcher, and a second run does no work.

Runs when FTBENCH_SLURM_TEST=1, or by default as root where slurmctld is installed
(FTBENCH_SLURM_TEST=0 skips it). The cluster is started once for the module and its daemons are
stopped by PID at the end; an already running controller is used and left running.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

import experiments.train.trainer as T
from experiments.train.config import compose

ROOT = Path(__file__).resolve().parent.parent
TINY = ("train.seq_len=64 train.batch_size=4 data.max_bytes=300000 data.val_tokens=1024 "
        "logging.val_every=0 logging.log_every=1")
CLUSTER = """partition: ci
gpus_per_node: 0
cpus_per_task: 1
mem_gb: 2
timeout_min: 20
signal_delay_s: 60
max_num_timeout: 3
array_parallelism: 4
setup: []
"""


def _enabled() -> str | None:
    """None when the test should run, else why it is skipped."""
    flag = os.environ.get("FTBENCH_SLURM_TEST", "")
    if flag == "0":
        return "FTBENCH_SLURM_TEST=0"
    if flag == "1":
        return None
    if os.geteuid() != 0:
        return "needs root to start SLURM's daemons (or FTBENCH_SLURM_TEST=1)"
    if not shutil.which("slurmctld"):
        return "slurmctld is not installed (FTBENCH_SLURM_TEST=1 installs it)"
    return None


# the first test also starts the cluster (installing SLURM's packages where they are missing)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800),
              pytest.mark.skipif(_enabled() is not None, reason=_enabled() or "")]


def _up() -> bool:
    r = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, check=False)
    return "UP" in r.stdout


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    work = tmp_path_factory.mktemp("slurm")
    env = {**os.environ, "FTBENCH_SLURM_DIR": str(work / "state")}
    ours = not (shutil.which("scontrol") and _up())
    try:
        if ours:
            t0 = time.time()
            r = subprocess.run(["bash", str(ROOT / "ci" / "slurm" / "start.sh")], env=env,
                               capture_output=True, text=True, timeout=600, check=False)
            assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
            print(f"slurm up in {time.time() - t0:.1f} s")
        (work / "cluster.yaml").write_text(CLUSTER)
        yield work
    finally:
        if ours:  # stop.sh kills exactly the recorded PIDs, also after a failed start
            piddir = work / "state" / "pids"
            pids = [f.read_text().strip() for f in piddir.glob("*.pid")] if piddir.is_dir() \
                else []
            subprocess.run(["bash", str(ROOT / "ci" / "slurm" / "stop.sh")], env=env,
                           timeout=180, check=False)
            alive = [p for p in pids if Path(f"/proc/{p}").exists()]
            assert not alive, f"daemons still running after stop.sh: {alive}"


def _env(cluster: Path, name: str) -> dict[str, str]:
    # one thread per trainer: the preemption test compares against an in-process run
    return {**os.environ, "FTBENCH_RESULTS": str(cluster / name),
            "FTBENCH_CACHE": str(cluster / "cache"), "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(ROOT)}


def _make(target: str, env: dict[str, str], **kv: str) -> subprocess.CompletedProcess:
    args = ["make", "-s", "-C", str(ROOT), target, *(f"{k}={v}" for k, v in kv.items())]
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=300,
                          check=False)


def _manifest(env: dict[str, str], name: str) -> dict:
    _make("sweep-status", env, NAME=name)  # refreshes the states from the run dirs and jobs
    return json.loads((Path(env["FTBENCH_RESULTS"]) / "sweeps" / name / "manifest.json")
                      .read_text())


def _wait(env: dict[str, str], name: str, done, timeout: float = 480) -> dict:
    t0 = time.time()
    while True:
        m = _manifest(env, name)
        if done(m):
            return m
        if time.time() - t0 > timeout:
            q = subprocess.run(["squeue"], capture_output=True, text=True, check=False).stdout
            pytest.fail(f"sweep {name} not finished after {timeout:.0f} s: "
                        f"{[(c['cell'], c['state'], c['reason']) for c in m['cells']]}\n{q}")
        time.sleep(3)


def _sweep(cluster: Path, env: dict[str, str], name: str, **kv: str) -> None:
    r = _make("sweep", env, LAUNCHER="slurm", CLUSTER=str(cluster / "cluster.yaml"),
              PRESET="1M", KAPPA="0.5", H="4", SEEDS="0", NAME=name, **kv)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "slurm: submitted array" in r.stdout


def test_preempted_cell_is_requeued_resumes_and_equals_an_uninterrupted_run(cluster):
    env = _env(cluster, "preempt")
    over = TINY + " logging.ckpt_every=25"
    _sweep(cluster, env, "preempt", TOKENS=str(64 * 4 * 150), OVERRIDES=over)  # 150 steps
    m = _manifest(env, "preempt")
    ft = next(c for c in m["cells"] if c["arm"] == "free")
    run = Path(ft["run_dir"])
    t0 = time.time()
    while not (run / "metrics.jsonl").exists() or sum(
            '"train"' in x for x in (run / "metrics.jsonl").read_text().splitlines()) < 10:
        assert time.time() - t0 < 300 and not (run / "checkpoints" / "final.pt").exists()
        time.sleep(0.2)
    # what SLURM sends before a time limit or a preemption; submitit acts on it
    subprocess.run(["scancel", "--signal=USR2", ft["job_id"]], check=True)
    m = _wait(env, "preempt", lambda m: all(c["state"] in ("done", "failed")
                                            for c in m["cells"]))
    assert [c["state"] for c in m["cells"]] == ["done", "done"], m["cells"]
    log = (run / "train.log").read_text()
    assert "signal SIGTERM at step" in log and "resumed from step_" in log
    t0 = time.time()
    while True:  # final.pt is there a moment before the job itself ends
        hist = subprocess.run(["sacct", "-D", "-X", "-n", "-P", "-j", ft["job_id"], "-o",
                               "State"], capture_output=True, text=True, check=True).stdout.split()
        if hist[-1] != "RUNNING" or time.time() - t0 > 60:
            break
        time.sleep(1)
    assert hist[0] == "REQUEUED" and hist[-1] == "COMPLETED", hist

    torch.set_num_threads(1)
    cfg = compose([*ft["overrides"], f"paths.results={cluster / 'preempt-ref'}",
                     f"paths.cache={cluster / 'cache'}", "logging.progress=false"])
    ref = T.train(cfg)
    assert ref.name == run.name
    a = torch.load(ref / "checkpoints" / "final.pt", weights_only=True)["model"]
    b = torch.load(run / "checkpoints" / "final.pt", weights_only=True)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_failing_cell_is_reported_failed_with_its_reason(cluster):
    env = _env(cluster, "fail")
    # composes fine, fails in the trainer: a validation set shorter than one sequence
    _sweep(cluster, env, "fail", TOKENS="2048", OVERRIDES=TINY + " data.val_tokens=1")
    m = _wait(env, "fail", lambda m: all(c["state"] in ("done", "failed") for c in m["cells"]))
    for c in m["cells"]:
        assert c["state"] == "failed" and "exited with code 2" in (c["reason"] or ""), c
        assert "validation split" in c["reason"], c["reason"]
        assert "\n" not in c["reason"]


def _jobs() -> list[tuple[str, str, str]]:
    """(id, name, state) of every job this cluster has run (its ids restart at each start)."""
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID,JobName,State"],
                         capture_output=True, text=True, check=True).stdout
    return [tuple(ln.split("|")) for ln in out.splitlines() if ln.strip()]  # type: ignore[misc]


def _jobs_once(done: Any, timeout: float = 60) -> list[tuple[str, str, str]]:
    """sacct's jobs once `done(jobs)` holds, or as they are after `timeout` seconds."""
    t0 = time.time()
    while not done(jobs := _jobs()) and time.time() - t0 < timeout:
        time.sleep(1)
    return jobs


def _settled_jobs(timeout: float = 30) -> list[tuple[str, str, str]]:
    """sacct's jobs once nothing is queued or running and its list has not changed for 3 s."""
    t0, last, same = time.time(), None, 0
    while time.time() - t0 < timeout:
        queued = subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout.strip()
        jobs = _jobs()
        same = same + 1 if jobs == last and not queued else 0
        if same >= 3:
            break
        last = jobs
        time.sleep(1)
    return _jobs()


def _mini_recipe(cluster: Path) -> Path:
    """cpu-mini with one kappa and no controls: 2 cells instead of 5 (each arm kind's cells
    are the grid's business, tests/test_recipes.py; here the jobs are what is tested)."""
    raw = yaml.safe_load((ROOT / "sweeps" / "recipes" / "cpu-mini.yaml").read_text())
    raw["grid"]["kappa_bits"]["value"], raw["grid"]["controls"]["value"] = ["1/2"], []
    path = cluster / "slurm-mini.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_make_paper_end_to_end_then_a_second_run_does_no_work(cluster):
    env = _env(cluster, "paper")
    env["FTBENCH_CACHE"] = str(cluster / "paper-cache")  # the corpus is not built yet
    kv = {"RECIPE": str(_mini_recipe(cluster)), "LAUNCHER": "slurm",
          "CLUSTER": str(cluster / "cluster.yaml"),
          "BENCH_DATA": str(ROOT / "experiments" / "eval" / "smoke_data"),
          "EVAL_ARGS": "--limit 2"}
    before = {j[0] for j in _settled_jobs()}  # the earlier tests' jobs, every one recorded
    r = _make("paper", env, **kv)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "corpus: building" in out and "slurm: submitted array" in out, out[-3000:]
    assert "report job" in out and "submitted" in out, out[-3000:]
    def units(jobs: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
        return [j for j in jobs if j[0] not in before and j[1] == "corpus"]

    # slurmdbd records a job a moment after slurmctld ends it: CI once read none here
    corpus = units(_jobs_once(lambda js: bool(units(js)) and all(
        j[2] == "COMPLETED" for j in units(js))))
    assert corpus and all(j[2] == "COMPLETED" for j in corpus), corpus  # its units' array
    html = cluster / "paper" / "sweeps" / "slurm-mini" / "report.html"
    t0 = time.time()
    while not html.is_file():  # the report job runs once every cell and evaluation ended
        if time.time() - t0 > 600:
            q = subprocess.run(["squeue"], capture_output=True, text=True).stdout
            pytest.fail(f"no report after 600 s: {_manifest(env, 'slurm-mini')['cells']}\n{q}")
        time.sleep(3)
    m = _manifest(env, "slurm-mini")
    assert len(m["cells"]) == 2 and all(
        c["state"] == "done" and c["eval"]["state"] == "done" for c in m["cells"]), m["cells"]
    assert all(len(c["eval"]["points"]) == 2 for c in m["cells"]), m["cells"]  # EVAL_POINTS
    t3 = (html.parent / "report" / "table3.csv").read_text().splitlines()
    assert len(t3) > 1 and "last_third" in t3[0]  # Table 3 from the evaluated points
    array = {c["job_id"].split("_")[0] for c in m["cells"]}
    assert len(array) == 1 and all("_" in c["job_id"] for c in m["cells"])  # one job array
    ran = [j for j in _jobs() if j[0] not in before]
    names = {j[1] for j in ran}
    assert {"corpus", "sweep-slurm-mini", "sweep-slurm-mini-eval", "paper-slurm-mini-report"} \
        <= names, ran
    t0 = time.time()
    while any(j[2] in ("PENDING", "RUNNING", "COMPLETING") for j in _jobs()):
        assert time.time() - t0 < 60, _jobs()
        time.sleep(1)
    assert all(j[2] == "COMPLETED" for j in _jobs() if j[0] not in before), _jobs()
    n_jobs, stamp = len(_jobs()), html.stat().st_mtime_ns

    r = _make("paper", env, **kv)  # everything is done: nothing built, submitted or rewritten
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "built; nothing to do" in out and "2 done, 0 to run" in out, out[-3000:]
    assert "report up to date" in out, out[-3000:]
    assert len(_jobs()) == n_jobs and html.stat().st_mtime_ns == stamp


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
