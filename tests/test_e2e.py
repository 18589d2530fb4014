"""The local pipeline end to end, once (its SLURM twin is tests/test_slurm.py): what `make smoke`
and `make demo` run, at the smallest size, with the real trainer and evaluator.

A 3-cell sweep (baseline, Free Transformers at kappa 1/2 and 2 bits, H=4) on a 300 kB slice of
the stdlib corpus; one job is killed mid-way and the run ends with that cell pending. The same
command with EVAL=1 then trains only that cell, resuming it from its checkpoint (the finished
cells are left alone), evaluates every final checkpoint on the offline benchmark files (arc_easy
and gsm8k, 3 items each, Z from the prior) and runs the chained likelihood on 2 validation rows;
the report renders and passes the headless-Chromium check; a third run does no work.
"""

from __future__ import annotations

import contextlib
import io
import json
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest
from conftest import BENCH

from common.paths import RunDir

TINY = ("train.seq_len=64 train.batch_size=4 data.max_bytes=300000 data.val_tokens=1024 "
        "logging.val_every=0 logging.ckpt_every=4 logging.log_every=4")
ARGS = ["--kappa", "0.5 2", "--h", "4", "--seeds", "0", "--preset", "1M", "--tokens", "6144",
        "--overrides", TINY, "--name", "e2e", "--jobs", "2"]
EVAL = ["--eval", "1", "--likelihood-rows", "2", "--eval-args",
        f"--tasks arc_easy,gsm8k --limit 3 --max-gen-toks 16 --data {BENCH} --threads 1"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _sweep(argv: list[str]) -> tuple[int, str]:
    """`python -m sweeps run <argv>` in this process (a torch import less per call); its jobs
    are real submitit subprocesses all the same."""
    from sweeps.__main__ import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        rc = main(["run", *argv])
    return rc, buf.getvalue()


def _kill_tree(pid: int) -> None:
    """Kill a local submitit job the hard way: its controller, the task and the trainer."""
    root = psutil.Process(pid)
    procs = [root, *root.children(recursive=True)]
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGKILL)
    psutil.wait_procs(procs, timeout=10)


def _run_and_kill_one(mpath: Path) -> tuple[int, str, dict]:
    """The sweep, with the first running cell that wrote a step checkpoint killed mid-way."""
    result: dict[str, object] = {}
    driver = threading.Thread(target=lambda: result.update(
        zip(("rc", "out"), _sweep(ARGS), strict=True)))
    driver.start()
    victim, t0 = None, time.time()
    while victim is None and time.time() - t0 < 300 and driver.is_alive():
        time.sleep(0.2)
        try:
            cells = json.loads(mpath.read_text())["cells"]
        except (FileNotFoundError, json.JSONDecodeError):
            continue
        for c in cells:
            ck = Path(c["run_dir"]) / "checkpoints"
            if (c["state"] == "running" and list(ck.glob("step_*.pt"))
                    and not (ck / "final.pt").exists()):
                victim = c
                _kill_tree(int(c["job_id"]))
                break
    driver.join(timeout=300)
    assert not driver.is_alive(), "the sweep still runs after 300 s"
    assert victim is not None, result.get("out")
    return int(result["rc"]), str(result["out"]), victim  # type: ignore[call-overload]


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted((root / "runs").rglob("*")) if p.is_file()}


def test_local_pipeline_kill_resume_eval_report_then_no_work(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    res = tmp_path / "results"
    monkeypatch.setenv("FTBENCH_RESULTS", str(res))
    monkeypatch.setenv("FTBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("FTBENCH_DATA", raising=False)
    mpath = res / "sweeps" / "e2e" / "manifest.json"

    rc, out, victim = _run_and_kill_one(mpath)
    assert rc == 1, out  # not every cell is done
    m = json.loads(mpath.read_text())
    states = {c["cell"]: c["state"] for c in m["cells"]}
    assert states.pop(victim["cell"]) == "pending" and set(states.values()) == {"done"}, out
    v = next(c for c in m["cells"] if c["cell"] == victim["cell"])
    assert v["reason"].startswith("interrupted"), v["reason"]
    finals = {c["cell"]: (Path(c["run_dir"]) / "checkpoints" / "final.pt").stat().st_mtime_ns
              for c in m["cells"] if c["state"] == "done"}
    from sweeps.manifest import status, table

    assert "3 cells: 1 pending, 0 running, 2 done, 0 failed" in table(status("e2e"))

    # the same command with EVAL=1: only the killed cell trains, resuming from its checkpoint;
    # every final checkpoint is evaluated, the cells done before included
    rc, out = _sweep([*ARGS, *EVAL])
    assert rc == 0, out[-3000:]
    assert "3 cells, 2 done, 1 to run" in out
    assert out.count("start train") == 1 and f"start train {victim['cell']}" in out
    assert out.count("start eval") == 3
    assert "resumed from step_" in (Path(victim["run_dir"]) / "train.log").read_text()
    m = json.loads(mpath.read_text())
    _check_manifest(m)
    for c in m["cells"]:
        run = Path(c["run_dir"])
        if c["cell"] in finals:  # untouched
            assert (run / "checkpoints" / "final.pt").stat().st_mtime_ns == finals[c["cell"]]
        assert c["attempts"] == (1 if c["cell"] in finals else 2)
        assert c["eval"]["state"] == "done" and c["eval"]["spec_id"] == m["eval_spec_id"]
        # the trainer records how it was launched: the analysis compares wall-clock only then
        assert RunDir(run).record().provenance["launcher"] == "local"
        evals = list((run / "eval").glob("lm-eval*.json"))
        assert len(evals) == 1, evals
        e = json.loads(evals[0].read_text())
        # the protocol: Z from the prior, never from the encoder over the scored tokens
        assert e["run_id"] == c["run_id"] and e["leaks"] is False and e["z_mode"] == "prior"
        assert e["tasks"]["arc_easy"]["n"] == 3 and len(e["tasks"]["arc_easy"]["items"]) == 3
        assert set(e["tasks"]) >= {"arc_easy", "gsm8k"} and e["data_checksums"]
        lik = list((run / "eval").glob("likelihood.*.step*.json"))
        assert len(lik) == 1, c["cell"]
        rec = json.loads(lik[0].read_text())
        assert rec["spec"]["max_rows"] == 2 and rec["n_sequences"] == 2
        assert ("iwae" in rec) == (c["arm"] == "free")

    from analysis.frame import load_sweep
    from analysis.report import main as report_main

    data = load_sweep("e2e", res)
    acc = data.scores[(data.scores.task == "arc_easy") & (data.scores.metric == "acc")]
    assert sorted(acc.arm) == ["baseline", "free", "free"] and acc.value.between(0, 1).all()

    # a third run has nothing to do and touches no run file
    before = _snapshot(res)
    rc, out = _sweep([*ARGS, *EVAL])
    assert rc == 0 and "3 cells, 3 done, 0 to run" in out, out[-3000:]
    assert "start train" not in out and "start eval" not in out, out[-3000:]
    assert _snapshot(res) == before

    shot = tmp_path / "report.png"
    assert report_main(["--name", "e2e", "--n-boot", "200", "--check", "--screenshot",
                        str(shot)]) == 0
    html = (res / "sweeps" / "e2e" / "report.html").read_text()
    assert all(c["run_id"] in html for c in m["cells"])  # the provenance footer names every run
    assert shot.is_file() and shot.stat().st_size > 10_000


def _check_manifest(m: dict) -> None:
    """docs/RESULTS.md's schema, with the values this grid must have."""
    assert m["name"] == "e2e" and m["launcher"] == "local"
    assert m["grid"]["kappa_bits"] == [0.5, 2.0] and m["grid"]["latent_bits"] == [4]
    assert m["grid"]["seeds"] == [0] and m["grid"]["preset"] == "1M"
    assert m["grid"]["tokens"] == 6144 and m["grid"]["flops"] is None
    assert m["grid"]["controls"] == []
    assert m["git_commit"] and len(m["git_commit"]) == 40
    # shared settings: recorded, identical across arms, no architecture knob among them
    sh = m["shared"]
    assert sh["optim.lr"] == 1e-3 and sh["train.seq_len"] == 64 and sh["model.dim"] == 128
    assert "model.latent_bits" not in sh and "model.kappa_bits" not in sh
    for c in m["cells"]:
        flat = {f"{a}.{k}": v for a, d in c["config"].items() if isinstance(d, dict)
                for k, v in d.items()}
        assert all(flat[k] == v for k, v in sh.items() if k in flat), c["cell"]
    assert any(len(str(v)) == 64 for v in m["data_checksums"].values()), m["data_checksums"]
    cells = {c["cell"]: c for c in m["cells"]}
    assert set(cells) == {"baseline-s0", "free-k0.5-H4-s0", "free-k2-H4-s0"}
    assert cells["baseline-s0"]["arm"] == "baseline"
    ft = cells["free-k2-H4-s0"]
    assert (ft["arm"], ft["kappa_bits"], ft["latent_bits"], ft["seed"]) == ("free", 2.0, 4, 0)
    assert "model.kappa_bits=2" in ft["overrides"] and "model.latent_bits=4" in ft["overrides"]
    for c in m["cells"]:
        run = Path(c["run_dir"])
        assert run.name == c["run_id"] and (run / "checkpoints" / "final.pt").exists()
        assert c["job_id"] and c["reason"] is None and c["state"] == "done"
        assert c["config"]["model"]["latent_bits"] == (c["latent_bits"] or 0)
        assert c["flops"] > 0 and c["tokens"] == 6144
        final = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()
                 if '"final"' in ln]
        assert final and final[-1]["tokens"] == 6144
    assert len({c["run_id"] for c in m["cells"]}) == 3
