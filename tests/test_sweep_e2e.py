"""Sweeps end to end with the real trainer (issue 4): a 3-cell local sweep on the smallest preset
completes and its manifest is right; a job killed mid-way leaves only its cell to redo, and the
re-run resumes that cell from its checkpoint while the finished cells are left alone.

Tiny settings (seq 64, batch 4, H=4, a 300 kB slice of the stdlib corpus) keep it to about a
minute on two busy cores; the grid logic is the one `make sweep` runs.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from sweeps import backend

ROOT = Path(__file__).resolve().parents[1]
TINY = ("train.seq_len=64 train.batch_size=4 data.max_bytes=300000 data.val_tokens=1024 "
        "logging.val_every=0 logging.ckpt_every=4 logging.log_every=4")
ARGS = ["--kappa", "0.5 2", "--h", "4", "--seeds", "0", "--preset", "1M", "--tokens", "6144",
        "--overrides", TINY, "--name", "e2e", "--jobs", "2"]


def _run(argv: list[str]) -> tuple[int, str]:
    """`python -m sweeps <argv>` in this process (saves a torch import per call on busy cores);
    its jobs are real submitit subprocesses all the same."""
    import contextlib
    import io

    from sweeps.__main__ import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        rc = main(argv)
    return rc, buf.getvalue()


def _manifest(tmp: Path) -> dict:
    return json.loads((tmp / "results" / "sweeps" / "e2e" / "manifest.json").read_text())


def _kill_tree(pid: int) -> None:
    """Kill a local submitit job the hard way: its controller, the task and the trainer."""
    root = psutil.Process(pid)
    procs = [root, *root.children(recursive=True)]
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)


@pytest.mark.slow
def test_local_sweep_kill_and_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTBENCH_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("FTBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FTBENCH_DATA", raising=False)
    result: dict[str, object] = {}
    driver = threading.Thread(target=lambda: result.update(
        zip(("rc", "out"), _run(["run", *ARGS]), strict=True)))
    driver.start()
    mpath = tmp_path / "results" / "sweeps" / "e2e" / "manifest.json"
    victim = None
    t0 = time.time()
    while victim is None and time.time() - t0 < 120 and driver.is_alive():
        time.sleep(0.2)
        if not mpath.exists():
            continue
        try:
            m = _manifest(tmp_path)
        except json.JSONDecodeError:
            continue
        for c in m["cells"]:  # the first running cell with a checkpoint written mid-way
            ck = Path(c["run_dir"]) / "checkpoints"
            if (c["state"] == "running" and list(ck.glob("step_*.pt"))
                    and not (ck / "final.pt").exists()):
                victim = c
                _kill_tree(int(c["job_id"]))
                break
    driver.join(timeout=240)
    out = str(result.get("out"))
    print(out)
    assert victim is not None, out
    assert result["rc"] == 1, out  # not every cell is done

    m = _manifest(tmp_path)
    states = {c["cell"]: c["state"] for c in m["cells"]}
    assert states.pop(victim["cell"]) == "pending", out
    assert set(states.values()) == {"done"}, out
    v = next(c for c in m["cells"] if c["cell"] == victim["cell"])
    assert v["reason"].startswith("interrupted"), v["reason"]
    finals = {c["cell"]: (Path(c["run_dir"]) / "checkpoints" / "final.pt").stat().st_mtime_ns
              for c in m["cells"] if c["state"] == "done"}

    # status sees the same thing
    from sweeps.manifest import status, table

    assert "3 cells: 1 pending, 0 running, 2 done, 0 failed" in table(status("e2e"))

    # the same command again: only the killed cell runs, and it resumes from its checkpoint.
    # With EVAL=1, each final checkpoint gets an evaluation job (a stand-in for experiments.eval,
    # which is tested on its own) once its training is done, including the cells done before.
    # The stand-in writes the files the real one would name (the sweep checks they exist).
    monkeypatch.setattr(backend, "eval_argv", lambda run, extra=(): [
        sys.executable, "-c", "import pathlib, sys; p = pathlib.Path(sys.argv[1]) / 'eval'; "
        "p.mkdir(exist_ok=True); (p / 'standin.json').write_text(' '.join(sys.argv[2:])); "
        "from experiments.eval.run import eval_file_name, planned_specs, trained_context, "
        "validate_args; w = trained_context(p.parent / 'checkpoints' / 'final.pt'); "
        "[(p / eval_file_name(s, 6)).write_text('{}') for s in "
        "planned_specs(validate_args(sys.argv[2:]), w).values()]",  # the trained window
        str(run), *extra])
    # the chained likelihood runs for real on 2 validation rows
    rc, out = _run(["run", *ARGS, "--eval", "1", "--likelihood-rows", "2",
                    "--eval-args=--limit 2"])
    print(out)
    assert rc == 0, out
    assert "3 cells, 2 done, 1 to run" in out
    assert out.count("start train") == 1 and f"start train {victim['cell']}" in out
    log = (Path(victim["run_dir"]) / "train.log").read_text()
    assert "resumed from step_" in log, log
    m = _manifest(tmp_path)
    assert {c["state"] for c in m["cells"]} == {"done"}
    for c in m["cells"]:
        assert c["eval"]["state"] == "done" and c["eval"]["job_id"], c["eval"]
        assert (Path(c["run_dir"]) / "eval" / "standin.json").read_text() == "--limit 2"
        assert c["eval"]["spec_id"] == m["eval_spec_id"]
        assert c["eval"]["files"]["lm-eval"].startswith("eval/lm-eval.limit2.")
        lik = list((Path(c["run_dir"]) / "eval").glob("likelihood.*.step*.json"))
        assert len(lik) == 1, c["cell"]
        rec = json.loads(lik[0].read_text())
        assert rec["spec"]["max_rows"] == 2 and rec["n_sequences"] == 2
        assert ("iwae" in rec) == (c["arm"] == "free")
    assert out.count("start eval") == 3
    for c in m["cells"]:
        if c["cell"] in finals:  # untouched
            final = Path(c["run_dir"]) / "checkpoints" / "final.pt"
            assert final.stat().st_mtime_ns == finals[c["cell"]]
            assert c["attempts"] == 1
        else:
            assert c["attempts"] == 2
    _check_manifest(m)


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
    sums = m["data_checksums"]  # what the runs recorded (corpus sha256 + the slice taken)
    assert any(len(str(v)) == 64 for v in sums.values()), sums
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
