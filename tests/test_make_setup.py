"""`make setup` on offline nodes and GPU hosts (issue 45; mk/setup.mk, mk/venv.py).

pip runs only when the environment misses a declared requirement, never because of a file's date;
PYTHON= is checked and never installed into; where GPUs are visible, torch must see them. Setup
runs against a stand-in venv whose python is this interpreter with `-m pip` logged and never run,
so nothing here installs anything. The helper's questions to that python (`check`, `gpu`) are
answered in this process, the interpreter the stand-in would exec: a process each would only
import torch and the project again.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HELPER = ROOT / "mk" / "venv.py"
PINS = ["--torch", "torch==2.13.0", "--evalplus", "evalplus==0.3.1"]
BUNDLE = ["hydra-core==1.3.8", "omegaconf==2.3.1", "lm_eval==0.4.13", "dill==0.4.1",
          "antlr4-python3-runtime==4.9.3"]
GPU_VARS = ("CUDA_VISIBLE_DEVICES", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS",
            "SLURM_GPUS", "SLURM_GPUS_PER_NODE", "SLURM_GPUS_PER_TASK")


def _helper():
    """mk/venv.py as a module (not on sys.path: the name would be the standard library's)."""
    spec = importlib.util.spec_from_file_location("mk_venv", HELPER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _env(tmp_path: Path, gpu: dict[str, str] | None = None) -> dict[str, str]:
    """No GPU anywhere unless `gpu` says so (a fake nvidia-smi first on PATH, or variables)."""
    env = {k: v for k, v in os.environ.items()
           if k not in (*GPU_VARS, "MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    path = [p for p in env["PATH"].split(os.pathsep)
            if not (Path(p) / "nvidia-smi").exists()]  # a real driver tool would answer
    env["PATH"] = os.pathsep.join([str(tmp_path / "bin"), *path])
    return {**env, **(gpu or {})}


def _isolate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
             gpu: dict[str, str] | None = None) -> None:
    """`_env` in this process."""
    env = _env(tmp_path, gpu)
    for k in set(os.environ) - set(env):
        monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    """A venv whose python is this one; every call is logged, pip's never run."""
    v = tmp_path / "v"
    (v / "bin").mkdir(parents=True)
    py = v / "bin" / "python"
    py.write_text(f'#!/bin/sh\necho "$*" >> {v}/calls.log\n[ "$1 $2" = "-m pip" ] && exit 0\n'
                  f'exec {sys.executable} "$@"\n')
    py.chmod(0o755)
    return v


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """`setup(*args)`: mk/venv.py's `setup` with the pins, in this process, on a host without
    GPUs unless tmp_path/bin holds an nvidia-smi; its status (output: capsys)."""
    mod = _helper()
    asked: list[str] = []  # the interpreters setup asked (the venv's, or PYTHON=)

    def ask(py: str, *args: str, capture: bool = True) -> subprocess.CompletedProcess:
        asked.append(str(py))
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = mod.main(list(args))
        if not capture:
            print(out.getvalue(), end="")
            print(err.getvalue(), end="", file=sys.stderr)
        return subprocess.CompletedProcess(args, rc, out.getvalue(), err.getvalue())

    monkeypatch.setattr(mod, "_ask", ask)

    def run(*args: str) -> int:
        _isolate(monkeypatch, tmp_path)
        return mod.main(["setup", *PINS, "--bundle", *BUNDLE, *args])

    run.helper = mod
    run.asked = asked
    return run


def _pip(v: Path) -> list[str]:
    log = v / "calls.log"
    return [ln for ln in log.read_text().splitlines() if ln.startswith("-m pip")] \
        if log.is_file() else []


def test_a_venv_that_meets_the_requirements_gets_no_pip_and_then_no_interpreter(
        venv: Path, tmp_path: Path, setup, capsys: pytest.CaptureFixture) -> None:
    """A stamp from before (empty, or a checkout newer than it) is not a reason to call pip."""
    (venv / ".setup-stamp").write_text("")
    assert setup("--venv", str(venv)) == 0, capsys.readouterr()
    assert "already meets pyproject.toml's requirements; nothing installed" in \
        capsys.readouterr().out
    assert _pip(venv) == [] and len((venv / ".setup-stamp").read_text().strip()) == 16
    os.utime(venv / ".setup-stamp", (0, 0))  # older than pyproject.toml: dates do not count
    r = subprocess.run(["make", "-s", "setup", f"VENV={venv}"], cwd=ROOT, capture_output=True,
                       text=True, env=_env(tmp_path), check=False)
    assert r.returncode == 0 and r.stdout == "", r.stdout + r.stderr
    assert not (venv / "calls.log").exists()  # the fast path starts no interpreter of the venv


def test_a_missing_requirement_runs_pip_in_order_then_says_what_still_misses(
        venv: Path, tmp_path: Path, setup, capsys: pytest.CaptureFixture) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text((ROOT / "pyproject.toml").read_text().replace(
        '"tabulate",', '"tabulate", "no-such-package-xyz>=1",'))
    assert setup("--venv", str(venv), "--pyproject", str(pyproject)) == 1
    out, err = capsys.readouterr()
    assert "misses no-such-package-xyz (not installed); installing" in out
    assert _pip(venv) == ["-m pip install -q --upgrade pip", "-m pip install -q torch==2.13.0",
                          "-m pip install -q -e .[dev,bench]",
                          "-m pip install -q --no-deps evalplus==0.3.1"]
    assert err.strip().splitlines() == [
        f"setup: after installing, {venv} still misses no-such-package-xyz (not installed)"]
    assert setup.asked and set(setup.asked) == {str(venv / "bin" / "python")}


def test_torch_index_reinstalls_torch_only_when_the_installed_build_is_another(
        venv: Path, setup, capsys: pytest.CaptureFixture) -> None:
    import importlib.metadata

    tag = importlib.metadata.version("torch").partition("+")[2]
    same = f"https://download.pytorch.org/whl/{tag or 'cpu'}"
    other = "https://download.pytorch.org/whl/" + ("cu126" if tag != "cu126" else "cpu")
    assert setup("--venv", str(venv), "--torch-index", other) == 0, capsys.readouterr()
    assert "-m pip uninstall -q -y torch" in _pip(venv)
    assert f"-m pip install -q torch==2.13.0 --index-url {other}" in _pip(venv)
    if tag:  # PyPI's own wheel has no local tag: no index names it
        (venv / "calls.log").unlink()
        assert setup("--venv", str(venv), "--torch-index", same) == 0
        assert _pip(venv) == []


def test_python_is_checked_never_installed_into(venv: Path, tmp_path: Path, setup,
                                                capsys: pytest.CaptureFixture) -> None:
    py = str(venv / "bin" / "python")
    assert setup("--venv", "unused", "--python", py) == 0, capsys.readouterr()
    capsys.readouterr()
    assert setup("--venv", "unused", "--python", py, "--bundle", "no-such-package-xyz==1") == 2
    out, err = capsys.readouterr()
    assert out == "" and _pip(venv) == []
    assert err.strip() == (f"setup: PYTHON={py} lacks no-such-package-xyz (not installed); "
                           "carry them in with make offline-bundle (docs/MAKE.md)")
    assert setup.asked and set(setup.asked) == {py}
    assert setup("--venv", "unused", "--python", str(tmp_path / "nope")) == 2
    assert "not an executable python" in capsys.readouterr().err


def test_where_gpus_are_visible_setup_wants_torch_to_see_them(
        venv: Path, tmp_path: Path, setup, capsys: pytest.CaptureFixture) -> None:
    (venv / ".setup-stamp").write_text(setup.helper.requirements_hash(
        ROOT / "pyproject.toml", ["dev", "bench"], ["torch==2.13.0", "evalplus==0.3.1"]))
    (tmp_path / "bin").mkdir()
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.write_text('#!/bin/sh\nif [ "$1" = -L ]; then echo "GPU 0: NVIDIA H100 80GB HBM3 '
                   '(UUID: GPU-0)"; exit 0; fi\necho "| Driver Version: 535.104.05   CUDA '
                   'Version: 12.2 |"\n')
    smi.chmod(0o755)
    rc = setup("--venv", str(venv), "--gpu")  # `make setup`: checked on the fast path
    out, err = capsys.readouterr()
    if rc == 0:
        pytest.skip("torch sees a GPU here: the refusal cannot be shown")
    assert rc == 2 and out == "" and _pip(venv) == [], out + err
    line, = err.strip().splitlines()
    assert re.fullmatch(
        r"setup: GPUs are visible \(nvidia-smi lists 1 GPU; driver 535\.104\.05, CUDA <= 12\.2\) "
        r"but torch 2\.13\.0\S* \((built for CUDA \S+|a CPU-only build)\) sees none; install a "
        r"torch built for this driver, e\.g\. make clean setup "
        r"TORCH_INDEX=https://download\.pytorch\.org/whl/cu126 \(docs/MAKE\.md\)", line), line


@pytest.mark.parametrize("env, why", [
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, "CUDA_VISIBLE_DEVICES=0,1"),
    ({"CUDA_VISIBLE_DEVICES": ""}, None),  # hidden on purpose, even where nvidia-smi lists some
    ({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, None),  # SLURM's word for none
    ({"SLURM_GPUS_ON_NODE": "4"}, "SLURM_GPUS_ON_NODE=4"),
    ({"SLURM_JOB_GPUS": "0"}, "SLURM_JOB_GPUS=0"),  # GPU index 0
    ({"SLURM_GPUS_ON_NODE": "0"}, None),
    ({}, None),
])
def test_which_hosts_count_as_having_gpus(env: dict[str, str], why: str | None,
                                          monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _isolate(monkeypatch, tmp_path, env)
    assert _helper().gpus_expected() == why


def test_the_bundle_pins_meet_what_pyproject_declares() -> None:
    """The bundle and pyproject name one version of each package."""
    from packaging.requirements import Requirement

    declared = {Requirement(r).name.replace("_", "-").lower(): Requirement(r)
                for r in _helper().declared(ROOT / "pyproject.toml", [])}
    for pin in BUNDLE:
        name, version = pin.split("==")
        req = declared.get(name.replace("_", "-").lower())
        assert req is None or req.specifier.contains(version), (pin, str(req))
    mk = (ROOT / "mk" / "setup.mk").read_text()
    assert all(p in mk for p in BUNDLE)
