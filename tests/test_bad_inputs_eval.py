"""Everyday mistakes with the evaluation commands (`python -m experiments.eval`, hf_export,
`make lm-eval`, `make tasks`): one line naming the value, exit 2, no traceback, and no new
file anywhere (the run dir, the results root, the working directory)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.usefixtures("one_torch_thread")

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
NO_CUDA = not torch.cuda.is_available()


def _eval(*a: str) -> None:
    from experiments.eval.run import main

    main(list(a))


def _export(*a: str) -> None:
    from experiments.eval.hf_export import main

    main(list(a))


def _lm_eval(*a: str) -> None:
    from experiments.eval.lm_eval_cli import main

    main(list(a))


def _tasks(*a: str) -> None:
    from experiments.eval.tasks.__main__ import main

    main(list(a))


# (id, command, argv with {base} {free} {bad} {tmp} {bench} placeholders, what the line names)
CASES: list[tuple[str, Callable[..., None], list[str], list[str]]] = [
    ("eval-missing-ckpt", _eval, ["{tmp}/nowhere", "--tasks", "arc_easy"],
     ["no checkpoint at", "nowhere"]),
    ("eval-corrupt-ckpt", _eval, ["{bad}", "--tasks", "arc_easy", "--data", "{bench}"],
     ["corrupt", "final.pt"]),
    ("eval-limit-neg", _eval, ["{base}", "--limit", "-1"], ["--limit: -1 must be >= 1"]),
    ("eval-limit-zero", _eval, ["{base}", "--limit", "0"], ["--limit: 0 must be >= 1"]),
    ("eval-k-zero", _eval, ["{base}", "--z", "prior-k", "--k", "0"], ["--k: 0 must be >= 1"]),
    ("eval-fewshot-neg", _eval, ["{base}", "--fewshot", "-1"], ["--fewshot: -1 must be >= 0"]),
    ("eval-unknown-task-online", _eval, ["{base}", "--tasks", "nosuchbench"],
     ["unknown task(s) nosuchbench"]),
    ("eval-typo-online", _eval, ["{base}", "--tasks", "hellaswg"],
     ["unknown task(s) hellaswg", "did you mean hellaswag?"]),
    ("eval-typo-offline", _eval, ["{base}", "--tasks", "arc_eazy", "--data", "{bench}"],
     ["unknown task(s) arc_eazy", "did you mean arc_easy?"]),
    ("eval-online-only-offline", _eval, ["{base}", "--tasks", "race", "--data", "{bench}"],
     ["no offline data for race", "online"]),
    ("eval-fewshot-offline", _eval,
     ["{base}", "--tasks", "arc_easy", "--fewshot", "5", "--data", "{bench}"],
     ["--fewshot", "arc_easy", "fewshot=5"]),
    ("eval-out-dir-is-file", _eval,
     ["{base}", "--tasks", "arc_easy", "--data", "{bench}", "--out-dir", "{tmp}/afile/eval"],
     ["afile is a file"]),
    ("eval-out-dir-unwritable", _eval,
     ["{base}", "--tasks", "arc_easy", "--data", "{bench}", "--out-dir", "/proc/ftbench-eval"],
     ["/proc is not writable"]),
    ("eval-data-missing", _eval, ["{base}", "--tasks", "arc_easy", "--data", "{tmp}/nodata"],
     ["benchmark data", "nodata"]),
    ("export-free", _export, ["{free}", "{tmp}/hf"], ["Free Transformer"]),
    ("export-out-is-file", _export, ["{base}", "{tmp}/afile"], ["OUT=", "afile is a file"]),
    ("export-missing-ckpt", _export, ["{tmp}/nowhere", "{tmp}/hf"], ["no checkpoint at"]),
    ("export-corrupt-ckpt", _export, ["{bad}", "{tmp}/hf"], ["corrupt"]),
    ("lm-eval-missing-ckpt", _lm_eval, ["--ckpt", "{tmp}/nowhere", "--tasks", "arc_easy"],
     ["no checkpoint at"]),
    ("lm-eval-corrupt-ckpt", _lm_eval, ["--ckpt", "{bad}", "--tasks", "arc_easy", "--limit", "1"],
     ["corrupt"]),
    ("tasks-out-is-file", _tasks, ["{bench}", "{tmp}/afile"], ["afile is a file"]),
    ("tasks-data-missing", _tasks, ["{tmp}/nodata", "{tmp}/tasks"], ["nodata"]),
]
if NO_CUDA:
    CASES += [
        ("eval-device-cuda", _eval, ["{base}", "--tasks", "arc_easy", "--device", "cuda"],
         ["--device cuda", "0 CUDA device"]),
        ("lm-eval-device-cuda", _lm_eval,
         ["--ckpt", "{base}", "--tasks", "arc_easy", "--device", "cuda"],
         ["--device cuda", "0 CUDA device"]),
    ]


@pytest.fixture(scope="module")
def ckpts(toy_checkpoint, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("ck")
    bad = d / "runs" / "bad" / "checkpoints" / "final.pt"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"not a checkpoint\n" * 10)
    return {"base": toy_checkpoint(d / "runs" / "base" / "checkpoints" / "final.pt"),
            "free": toy_checkpoint(d / "runs" / "free" / "checkpoints" / "final.pt", free=True),
            "bad": bad}


def _files(*roots: Path) -> set[Path]:
    return {p for r in roots if r.exists() for p in r.rglob("*")}


@pytest.mark.parametrize("cmd, argv, named", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_one_line_exit_2_nothing_written(
        cmd: Callable[..., None], argv: list[str], named: list[str], ckpts: dict[str, Path],
        bench_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FTBENCH_RESULTS", str(tmp_path / "results"))
    (tmp_path / "afile").write_text("x")
    sub = {"{base}": str(ckpts["base"].parent.parent), "{free}": str(ckpts["free"]),
           "{bad}": str(ckpts["bad"]), "{tmp}": str(tmp_path), "{bench}": str(bench_dir)}
    args = []
    for a in argv:
        for k, v in sub.items():
            a = a.replace(k, v)
        args.append(a)
    runs = ckpts["base"].parents[2]
    before = _files(tmp_path, runs)
    with pytest.raises(SystemExit) as ex:
        cmd(*args)
    err = capsys.readouterr().err.strip()
    assert ex.value.code == 2, err
    assert "Traceback" not in err
    line = err.splitlines()[-1]
    assert line.startswith("error: ") and all(n in line for n in named), line
    if "did you mean" in line:
        assert "online" not in line  # a typo is not an online-only task
    assert _files(tmp_path, runs) == before
