"""Everyday mistakes with `python -m experiments.synthetic` (and `make synthetic`): one line
naming the value, exit 2, no traceback, no new file under the results root or the working
directory, and no training started (every case fails in the input checks)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import experiments.synthetic as syn

ROOT = Path(__file__).resolve().parents[1]

# (id, argv with {tmp} placeholders, FTBENCH_RESULTS with {tmp} or None for {tmp}/results,
#  what the line names)
CASES: list[tuple[str, list[str], str | None, list[str]]] = [
    ("setting-unknown", ["--setting", "nope"], None, ["--setting", "'nope'", "smoke"]),
    ("kappa-word", ["--kappa", "abc"], None, ["--kappa", "'abc'", ">= 0"]),
    ("kappa-negative", ["--kappa", "-1"], None, ["--kappa", "'-1'", ">= 0"]),
    ("kappa-div-zero", ["--kappa", "1/0"], None, ["--kappa", "'1/0'"]),
    ("kappa-overflow", ["--kappa", "1e999"], None, ["--kappa", "'1e999'"]),
    ("kappa-empty", ["--kappa", ""], None, ["--kappa", "holds no value"]),
    ("kappa-blank", ["--kappa", " , "], None, ["--kappa", "holds no value"]),
    ("kappa-twice", ["--kappa", "1/8 0.125"], None, ["--kappa", "1/8 given twice"]),
    ("override-unknown-section", ["--setting", "smoke", "nosuch.key=1"], None,
     ["'nosuch'", "allowed"]),
    ("override-unknown-key", ["--setting", "smoke", "model.nosuch=1"], None,
     ["'model.nosuch'", "allowed keys"]),
    ("override-not-key-value", ["--setting", "smoke", "model.dim"], None,
     ["'model.dim'", "key=value"]),
    ("override-bad-type", ["--setting", "smoke", "model.dim=abc"], None, ["model.dim", "abc"]),
    ("override-bad-tokens", ["--setting", "smoke", "train.tokens=lots"], None,
     ["train.tokens", "lots"]),
    ("override-data", ["data=tinystories"], None, ["'data=tinystories'", "set per arm"]),
    ("override-latent-bits", ["model.latent_bits=4"], None, ["model.latent_bits", "--latent-bits"]),
    ("unknown-flag", ["--kapa", "1"], None, ["--kapa"]),
    ("name-slash", ["--name", "a/b"], None, ["--name 'a/b'", "separator"]),
    ("name-empty", ["--name", ""], None, ["--name ''", "not empty"]),
    ("name-dotdot", ["--name", ".."], None, ["--name '..'"]),
    ("results-is-file", [], "{tmp}/afile", ["afile is a file", "FTBENCH_RESULTS"]),
    ("results-unwritable", [], "/proc/ftbench-syn", ["/proc is not writable",
                                                     "FTBENCH_RESULTS"]),
    ("runs-dir-unwritable", ["--setting", "smoke", "paths.results=/proc/ftbench-runs"], None,
     ["runs directory", "/proc is not writable"]),
    ("latent-bits-zero", ["--latent-bits", "0"], None, ["--latent-bits: 0 must be >= 1"]),
    ("group-size-zero", ["--group-size", "0"], None, ["--group-size: 0 must be >= 1"]),
    ("temperature-zero", ["--temperature", "0"], None, ["--temperature: 0.0 must be > 0"]),
    ("threads-negative", ["--threads", "-2"], None, ["--threads: -2 must be >= 0"]),
    ("reuse-malformed", ["--reuse", "somewhere"], None, ["--reuse 'somewhere'", "LABEL=RUN_DIR"]),
    ("reuse-unknown-arm", ["--reuse", "kappa=3={tmp}"], None, ["'kappa=3'", "no arm"]),
    ("reuse-no-run", ["--reuse", "kappa=1={tmp}/nowhere"], None,
     ["nowhere", "no finished run"]),
]


def _files(*roots: Path) -> set[Path]:
    return {p for r in roots if r.exists() for p in r.rglob("*")}


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*a: object, **k: object) -> None:
        raise AssertionError("training started on bad input")

    monkeypatch.setattr(syn, "train_with_experiments_train", refuse)


@pytest.mark.parametrize("argv, results, named", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_bad_input_one_line_exit_2_nothing_written(
        argv: list[str], results: str | None, named: list[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
        no_training: None) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    res = (results or "{tmp}/results").replace("{tmp}", str(tmp_path))
    monkeypatch.setenv("FTBENCH_RESULTS", res)
    before = _files(tmp_path)
    with pytest.raises(SystemExit) as ex:
        syn.main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    out, err = capsys.readouterr()
    assert ex.value.code == 2, err
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert all(n in lines[0] for n in named), lines[0]
    assert _files(tmp_path) == before


def test_module_entry_and_make_target(tmp_path: Path) -> None:
    """The real command lines: `python -m experiments.synthetic` and `make synthetic`."""
    env = {**os.environ, "FTBENCH_RESULTS": str(tmp_path / "results")}
    py = subprocess.run([sys.executable, "-m", "experiments.synthetic", "--kappa", "1/0"],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert py.returncode == 2 and py.stdout == "", py.stderr
    assert py.stderr.strip() == ("error: --kappa: '1/0' is not a number of bits >= 0 (e.g. 0.5 "
                                 "or 1/64)")  # common.kappa's message, the sweep's too
    mk = subprocess.run(["make", "-s", "synthetic", "SYN_NAME=a/b",
                         f"PY={sys.executable}"], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=120)
    assert mk.returncode == 2 and "Traceback" not in mk.stdout + mk.stderr, mk.stderr
    assert "error: --name 'a/b'" in mk.stderr
    assert _files(tmp_path) == set()


def test_report_of_missing_run_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "FTBENCH_RESULTS": str(tmp_path / "results")}
    r = subprocess.run([sys.executable, "-m", "analysis.synthetic", "--name", "nope"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "nope" in r.stderr.strip().splitlines()[-1]
    assert _files(tmp_path) == set()


def test_good_input_passes_the_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: valid flags and overrides pass every check (hydra composes each arm) and
    run() writes samples.jsonl; an untrained tiny model stands in for training."""
    from model import build_model, get_preset

    monkeypatch.setenv("FTBENCH_RESULTS", str(tmp_path))
    st = syn.parse_args(["--setting", "smoke", "--kappa", "1/8, 8", "--name", "ok",
                         "--n-prompts", "1", "--n-shared-groups", "1", "--group-size", "2",
                         "--n-eval", "4", "optim.lr=1e-3", "train.seed=1"])
    assert syn.check(st) == [(0, None), (8, 1 / 8), (8, 8.0)]

    def fake(label: str, h: int, k: float, st: syn.SyntheticSettings) -> syn.Trained:
        cfg = get_preset("1M", vocab_size=29, dim=16, n_layers=2, n_heads=2, n_kv_heads=1,
                         ffn_dim=32, latent_bits=h, kappa_bits=k)
        return syn.Trained(build_model(cfg), {"run_id": label})

    d = syn.run(st, train_fn=fake)
    assert sorted(p.name for p in d.iterdir()) == ["samples.jsonl"]
