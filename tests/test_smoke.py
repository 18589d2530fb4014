"""`make smoke`, end to end: both arms trained, evaluated on the shipped sample, report built."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_make_smoke_end_to_end(tmp_path: Path) -> None:
    env = {**os.environ, "FTBENCH_RESULTS": str(tmp_path)}
    env.pop("FTBENCH_DATA", None)  # nothing from outside the repository
    r = subprocess.run(["make", "-W", ".venv/.setup-stamp", "-o", "setup", "smoke"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=900, check=False)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    report = tmp_path / "sweeps" / "smoke" / "report.html"
    assert report.is_file() and f"report: {report.resolve()}" in r.stdout
    man = json.loads((tmp_path / "sweeps" / "smoke" / "manifest.json").read_text())
    assert {c["arm"] for c in man["cells"]} == {"baseline", "free"}
    assert all(c["state"] == "done" and c["eval"]["state"] == "done" for c in man["cells"])
    for c in man["cells"]:
        files = list((tmp_path / "runs" / c["run_id"] / "eval").glob("lm-eval*.json"))
        assert files, c
        ev = json.loads(files[0].read_text())
        assert set(ev["tasks"]) >= {"arc_easy", "gsm8k"}
        assert "smoke_data" not in json.dumps(ev["data_checksums"]) or ev["data_checksums"]
