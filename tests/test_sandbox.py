"""Hostile model completions are contained, score as failures, and the evaluation ends on time."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

from experiments.sandbox import run_evalplus

DATA = Path(__file__).resolve().parents[2] / "shared" / "benchmarks"
HEP = DATA / "humanevalplus" / "HumanEvalPlus-v0.1.10.jsonl"


def _problems(n: int, path: Path) -> list[dict]:
    rows = []
    with open(HEP) as f:
        for line in f:
            rows.append(json.loads(line))
            if len(rows) == n:
                break
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return rows


def test_hostile_completions_are_contained(tmp_path: Path) -> None:
    canary_dir = tmp_path / "outside"
    canary_dir.mkdir()
    canary = canary_dir / "keep.txt"
    canary.write_text("precious")
    # a listener the hostile code tries to reach (it must never get a connection)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(0.5)
    port = srv.getsockname()[1]
    got: list[bytes] = []

    def accept() -> None:
        end = time.time() + 60
        while time.time() < end and not got:
            try:
                c, _ = srv.accept()
                got.append(c.recv(16) or b"connected")
            except OSError:
                pass

    th = threading.Thread(target=accept, daemon=True)
    th.start()

    probs = _problems(7, tmp_path / "problems.jsonl")
    hostile = {
        # deletes files outside its dir, three ways
        0: f"import os, shutil, posix\nshutil.rmtree({str(canary_dir)!r}, ignore_errors=True)\n"
           f"try:\n    posix.unlink({str(canary)!r})\nexcept Exception:\n    pass\n"
           f"open({str(canary)!r}, 'w').write('gone')\n",
        # fork bomb (posix.fork goes around reliability_guard's os.fork = None)
        1: "import posix\nwhile True:\n    posix.fork()\n",
        # infinite loop inside the function under test
        2: None,
        # 10 GB allocation
        3: "x = bytearray(10 * 2**30)\n",
        # opens a socket to the host
        4: f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
           "s.sendall(b'leak')\n",
        # ctypes around the audit hook
        5: f"import ctypes\nctypes.CDLL(None).unlink({str(canary).encode()!r})\n",
    }
    samples = []
    for i, p in enumerate(probs):
        if i == 2:
            sol = p["prompt"] + "    while True:\n        pass\n"
        elif i in hostile:
            sol = hostile[i] + p["prompt"] + p["canonical_solution"]
        else:  # the reference solution still passes: the sandbox does not break honest code
            sol = p["prompt"] + p["canonical_solution"]
        samples.append({"task_id": p["task_id"], "solution": sol})
    sp = tmp_path / "samples.jsonl"
    sp.write_text("".join(json.dumps(s) + "\n" for s in samples))

    t0 = time.time()
    result, rec = run_evalplus("humaneval", sp, tmp_path / "problems.jsonl", timeout_s=240)
    elapsed = time.time() - t0
    th.join(timeout=1)
    srv.close()

    assert not rec.timed_out, rec.stderr[-2000:]
    assert elapsed < 200
    assert canary.read_text() == "precious"
    assert got == []
    ev = result["eval"]
    status = {tid: (r[0]["base_status"], r[0]["plus_status"]) for tid, r in ev.items()}
    for i in range(6):
        assert status[probs[i]["task_id"]][0] != "pass", (i, status)
    assert status[probs[6]["task_id"]] == ("pass", "pass")
