"""A short demo-like pipeline on the smallest preset: sweep (baseline + one Free Transformer) ->
chained evaluation on offline benchmark files -> report -> headless Chromium check.

`make demo` runs the same targets at a larger size (about 30 minutes); this keeps the wiring
between the parts under test in about a minute.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT.parent / "shared" / "benchmarks"
TINY = ("train.seq_len=64 train.batch_size=4 data.max_bytes=300000 data.val_tokens=1024 "
        "logging.val_every=4 logging.ckpt_every=4 logging.log_every=2")


@pytest.mark.slow
def test_sweep_eval_report_pipeline(tmp_path, monkeypatch):
    from sweeps.__main__ import main as sweep_main

    res = tmp_path / "results"
    monkeypatch.setenv("FTBENCH_RESULTS", str(res))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = ["run", "--kappa", "2", "--h", "4", "--seeds", "0", "--preset", "1M",
            "--tokens", "6144", "--overrides", TINY, "--name", "pipe", "--jobs", "2",
            "--eval", "1", "--eval-args",
            f"--tasks arc_easy,gsm8k --limit 3 --max-gen-toks 16 --data {BENCH} --threads 1"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        rc = sweep_main(argv)
    assert rc == 0, buf.getvalue()[-3000:]

    manifest = json.loads((res / "sweeps" / "pipe" / "manifest.json").read_text())
    cells = {c["arm"]: c for c in manifest["cells"]}
    assert set(cells) == {"baseline", "free"}
    for c in cells.values():
        assert c["state"] == "done" and c["eval"]["state"] == "done", c
        evals = list((res / "runs" / c["run_id"] / "eval").glob("lm-eval*.json"))
        assert len(evals) == 1, evals
        e = json.loads(evals[0].read_text())
        assert e["run_id"] == c["run_id"] and e["leaks"] is False
        assert e["z_mode"] == "prior"
        assert e["tasks"]["arc_easy"]["n"] == 3 and len(e["tasks"]["arc_easy"]["items"]) == 3
        assert e["data_checksums"]  # offline files were verified and recorded

    from analysis.frame import load_sweep
    from analysis.report import main as report_main

    data = load_sweep("pipe", res)
    acc = data.scores[(data.scores.task == "arc_easy") & (data.scores.metric == "acc")]
    assert sorted(acc.arm) == ["baseline", "free"]
    assert acc.value.between(0, 1).all()

    shot = tmp_path / "report.png"
    report_main(["--name", "pipe", "--root", str(res), "--n-boot", "200", "--check",
                 "--screenshot", str(shot)])
    html = (res / "sweeps" / "pipe" / "report.html").read_text()
    for rid in (c["run_id"] for c in cells.values()):
        assert rid in html  # the provenance footer names every run
    assert shot.is_file() and shot.stat().st_size > 10_000
