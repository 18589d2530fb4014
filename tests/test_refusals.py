"""Bad input to the entry points, through the one usage-error path (common.errors.cli): exit 2
with one line `<prog>: error: ...` naming the value, no traceback, nothing written (working
directory, results root, run directories). One table: a row per distinct way an entry point
refuses (a parser, a validator, a check after composing, a file or directory, the environment),
not per wording. Ctrl-C is one line with how to resume, exit 130."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml

pytestmark = pytest.mark.usefixtures("one_torch_thread")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
TINY = ["model=1M", "model.vocab_size=512", "train.seq_len=32", "train.batch_size=8",
        "data.max_bytes=150000", "data.val_tokens=512", "logging.progress=false"]
PROBE = ["--rows", "4", "--prompts", "2", "--prompt-len", "4", "--gen-tokens", "3",
         "--group-size", "2", "--groups", "2", "--draws", "1", "--n-boot", "100"]
V = ["--vocab-size", "300"]
BAD = "/proc/ftbench-unwritable"
"""/proc refuses new files even to root: it stands for an unwritable place."""


def _run_dir(root: Path, latent_bits: int, name: str) -> Path:
    """A finished run on the synthetic task (character tokens: no tokenizer to train)."""
    from experiments.train import synthetic_data as sd
    from model import ModelConfig, build_model
    from model.checkpoint import save_checkpoint

    cfg = ModelConfig(vocab_size=len(sd.ALPHABET), dim=32, n_layers=2, n_heads=2, n_kv_heads=1,
                      ffn_dim=48, max_seq_len=80, latent_bits=latent_bits, kappa_bits=0.5)
    rdir = root / "runs" / name
    rdir.mkdir(parents=True)
    (rdir / "config.yaml").write_text(yaml.safe_dump(
        {"run_id": name, "model": cfg.to_dict(), "data": {"source": "synthetic",
                                                          "val_tokens": 650},
         "train": {"seed": 0, "seq_len": sd.SEQ_LEN - 1}}))
    save_checkpoint(rdir / "checkpoints" / "final.pt", build_model(cfg), extra={"step": 5})
    return rdir


@pytest.fixture(scope="module")
def places(toy_checkpoint, bench_dir: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> dict[str, str]:
    """What the table's {placeholders} stand for: checkpoints, run dirs, data files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path_factory.mktemp("places")
    bad = d / "runs" / "bad" / "checkpoints" / "final.pt"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"not a checkpoint\n" * 10)
    (d / "r0.jsonl").write_text("".join(json.dumps({"text": f"record {i} " + "ab cd " * 20})
                                        + "\n" for i in range(40)))
    pq.write_table(pa.table({"text": [f"row {i} ef gh" for i in range(20)]}), d / "p.parquet")
    (d / "empty.txt").write_text("")
    (d / "hf.yaml").write_text(f"source: hf\nhf_sources:\n  - {{path: json, data_files: "
                               f"[{d / 'missing.jsonl'}]}}\n")
    (d / "cluster.yaml").write_text("partition: ci\nmax_num_timeouts: 3\n")
    (d / "field.yaml").write_text(f"source: hf\nhf_sources:\n  - {{path: json, field: body, "
                                  f"data_files: [{d / 'r0.jsonl'}]}}\n")
    return {"{base}": str(toy_checkpoint(d / "runs" / "base" / "checkpoints" / "final.pt")
                          .parent.parent),
            "{free}": str(toy_checkpoint(d / "runs" / "free" / "checkpoints" / "final.pt",
                                         free=True)),
            "{bad}": str(bad), "{bench}": str(bench_dir), "{d}": str(d),
            "{ft}": str(_run_dir(d, 4, "ft")), "{bl}": str(_run_dir(d, 0, "bl")),
            "{cache}": str(tmp_path_factory.mktemp("cache"))}


def _files(*roots: Path) -> set[Path]:
    return {p for r in roots if r.exists() for p in r.rglob("*")}


def _sweep_dir(root: Path, manifest: str) -> None:
    (root / "sweeps" / "bad").mkdir(parents=True)
    (root / "sweeps" / "bad" / "manifest.json").write_text(manifest, encoding="utf-8")


def _ok_sweep(root: Path) -> Path:
    from fake import write_fake_sweep

    write_fake_sweep(root, "ok", kappas=(2.0,), seeds=(0,), controls=())
    return root / "sweeps" / "ok"


ENTRY = {  # table key -> (the `python -m` module, prog, argv before the row's)
    "train": ("experiments.train", "train", TINY),
    "eval": ("experiments.eval", "eval", []),
    "lm-eval": ("experiments.eval.lm_eval_cli", "lm-eval", []),
    "hf-export": ("experiments.eval.hf_export", "hf-export", []),
    "tasks": ("experiments.eval.tasks", "tasks", []),
    "likelihood": ("experiments.eval.likelihood", "likelihood", []),
    "probe": ("experiments.eval.probe", "probe", []),
    "bench": ("experiments.bench", "python -m experiments.bench", []),
    "corpus": ("experiments.corpus", "corpus", ["--out", "{tmp}/out", "--quiet"]),
    "pipelines.corpus": ("pipelines.corpus", "corpus", ["--out", "{tmp}/o", "--quiet"]),
    "synthetic": ("experiments.synthetic", "synthetic", []),
    "report": ("analysis.report", "report", []),
    "sweep": ("sweeps", "sweep", []),
    "full-eval": ("pipelines.full_eval", "full-eval", ["--out", "{tmp}/fe"]),
}


def _main(module: str) -> Callable[[list[str]], int]:
    """The `main` that `python -m module` runs (a package's is in its __main__)."""
    import importlib.util

    package = importlib.util.find_spec(module).submodule_search_locations is not None
    return importlib.import_module(f"{module}.__main__" if package else module).main


SWEEP_RUN = ["run", "--name", "t1", "--kappa", "0.5", "--h", "4", "--seeds", "0",
             "--tokens", "4096"]
EVAL_ARC = ["{base}", "--limit", "1", "--data", "{bench}", "--tasks"]


def C(key: str, argv: list[str], phrase: str, env: dict[str, str] | None = None,
      setup: Callable[[Path], object] | None = None, results: str = "{tmp}/results",
      slow: bool = False, cuda: bool = False) -> object:
    """A row: `env` on top of the test's, `setup(results root)` before, the results root;
    `cuda`: a device the host lacks (only where it has none)."""
    marks = [pytest.mark.slow] * slow + [pytest.mark.skipif(
        cuda and torch.cuda.is_available(), reason="CUDA is available")]
    label = " ".join([*(f"{k}={v}" for k, v in (env or {}).items()), *argv])
    return pytest.param(key, argv, phrase, env, setup, results, marks=marks,
                        id=f"{key}: {label}")


CASES = [
    # train: the override validator, a dataclass check, a check after composing, a data file,
    # the built tokenizer, the dry run's budget, an optional package, the device, the environment
    C("train", ["train.sed=1"], "unknown key 'train.sed'; allowed keys in train: ["),
    C("train", ["optim.lr=-1"], "optim.lr=-1.0: must be a finite number > 0"),
    C("train", ["+train.foo=1"], "adding or deleting keys is not allowed"),
    C("train", ["model.dim"], "is not key=value"),
    C("train", ["data=web"], "unknown data source 'web'"),
    C("train", ["data=files"], "data=files needs data.paths"),
    C("train", ["train.seq_len=512"], "exceeds model.max_seq_len=256"),
    C("train", ["data=files", "data.paths=[/nonexistent/*.txt]"], "no file matches"),
    C("train", ["model.vocab_size=100000", "data.max_bytes=20000"], "but the tokenizer has"),
    C("train", ["train.tokens=1e12", "train.dry_run=true"], "passes over the stdlib corpus"),
    C("train", ["logging.tracker=wandb"], "but the wandb package is not installed"),
    C("train", ["train.device=cuda"], "CUDA is not available", cuda=True),
    C("train", [], "FTBENCH_RESULTS", env={"FTBENCH_RESULTS": BAD}),
    C("train", [], f"cache directory {BAD}", env={"FTBENCH_CACHE": BAD + "/cache"}),
    # eval, lm-eval, hf-export, tasks, likelihood, probe, full-eval: the checkpoint (missing,
    # corrupt, the wrong kind), the parser, the task list, the data, the output, the environment
    C("eval", ["{tmp}/nowhere", "--tasks", "arc_easy"], "no checkpoint at"),
    C("eval", ["{bad}", "--tasks", "arc_easy", "--data", "{bench}"], "corrupt"),
    C("eval", ["{base}", "--limit", "0"], "LIMIT (--limit): 0 must be >= 1"),
    C("eval", ["{base}", "--tasks", "arc_eazy", "--data", "{bench}"], "did you mean arc_easy?"),
    C("eval", ["{base}", "--tasks", "arc_easy", "--data", "{tmp}/nodata"], "benchmark data"),
    C("eval", ["{base}", "--tasks", "arc_easy", "--data", "{bench}", "--out-dir",
               "{tmp}/afile/e"], "afile is a file"),
    C("eval", ["{base}", "--tasks", "arc_easy", "--device", "cuda"], "0 CUDA device", cuda=True),
    C("eval", [*EVAL_ARC, "arc_easy"], "HF_DATASETS_CACHE", env={"HF_DATASETS_CACHE": BAD}),
    C("eval", [*EVAL_ARC, "humaneval_plus"], "XDG_CACHE_HOME", env={"XDG_CACHE_HOME": BAD}),
    C("lm-eval", ["--ckpt", "{tmp}/nowhere", "--tasks", "arc_easy"], "no checkpoint at"),
    C("lm-eval", ["--ckpt", "{bad}", "--tasks", "arc_easy", "--limit", "1"], "corrupt",
      slow=True),  # lm-eval indexes its whole task registry first (~10 s)
    C("hf-export", ["{free}", "{tmp}/hf"], "Free Transformer", slow=True),  # imports
    # transformers first (seconds); test_hf_export refuses a Free Transformer in the fast tier
    C("tasks", ["{bench}", "{tmp}/afile"], "afile is a file"),
    C("tasks", ["{tmp}/nodata", "{tmp}/tasks"], "no offline task's files"),
    C("likelihood", ["{tmp}/nowhere"], "no such run directory or checkpoint"),
    C("likelihood", ["{ft}", "--k", "1,x"], "--k: '1,x' is not a comma-separated list"),
    C("likelihood", ["{ft}", "--device", "nodevice"], "--device nodevice: not a torch device"),
    C("probe", ["{bl}", *PROBE], "is a baseline"),
    C("probe", ["{ft}", *PROBE, "--rows", "0"], "--rows"),
    C("probe", ["{ft}", *PROBE, "--rows", "100000"], "validation rows"),
    C("probe", ["{ft}", *PROBE, "--out", "{tmp}/afile"], "--out"),
    C("full-eval", ["{tmp}/nope.pt", "--data", "{bench}"], "no checkpoint at"),
    C("full-eval", ["{base}", "--data", "{bench}", "--workers", "0"], "--workers: 0 must be >= 1"),
    C("bench", ["--sections", "train,nope"], "nope"),
    C("bench", ["--reps", "4"], "--reps 4: every figure is a median of at least 5 reps"),
    C("bench", ["--md", "{tmp}/afile/out.md"], "afile"),
    C("bench", [], "huge", env={"BENCH_SIZE": "huge"}),
    # corpus: a source that cannot be read, a file's columns, OmegaConf's key check, the
    # parser, a missing setting, nothing to verify, an unwritable output; pipelines.corpus
    # shares the parser and build, its launcher flags are its own
    C("corpus", ["--data", "{d}/hf.yaml", *V], "cannot stream 'json'"),
    C("corpus", ["--data", "files", "paths=[{d}/p.parquet]", "text_field=body", *V],
      "no column 'body'"),
    C("corpus", ["--data", "stdlib", "nope=1", *V], "Key 'nope' not in 'DataConfig'"),
    C("corpus", ["--data", "nope", *V], "--data 'nope': no such file or config"),
    C("corpus", ["--data", "files", "paths=[{d}/empty.txt]", *V], "holds no (non-empty) document"),
    C("corpus", ["--data", "synthetic", *V], "generated on the fly"),
    C("corpus", ["--data", "stdlib", "--workers", "0", *V], "--workers: 0 must be >= 1"),
    C("corpus", ["--data", "stdlib"], "give --vocab-size"),
    C("corpus", ["--verify"], "no corpus.json to verify"),
    C("corpus", ["--data", "stdlib", *V, "--out", "/proc/ftbench"], "is not writable"),
    C("corpus", ["--data", "stdlib", "max_bytes=20000", *V], f"tokenizer cache {BAD}",
      env={"FTBENCH_CACHE": BAD}),
    C("pipelines.corpus", ["--data", "{d}/field.yaml", *V], "no field 'body'"),
    C("pipelines.corpus", ["--launcher", "slurm", "--cluster", "{tmp}/none.yaml"], "none.yaml"),
    C("pipelines.corpus", ["--launcher", "slurm", "--cluster", "{d}/cluster.yaml", *V],
      "unknown key 'max_num_timeouts'"),
    # synthetic: its parser, the kappa rule, hydra's validator, its own override rules, names,
    # the grid, --reuse, the results root
    C("synthetic", ["--setting", "nope"], "--setting: invalid choice: 'nope'"),
    C("synthetic", ["--kappa", "1/0"], "--kappa: '1/0' is not a number of bits >= 0"),
    C("synthetic", ["--setting", "smoke", "nosuch.key=1"], "unknown config section 'nosuch'"),
    C("synthetic", ["data=tinystories"], "'data=tinystories': data is set per arm"),
    C("synthetic", ["model.latent_bits=4"], "use --latent-bits"),
    C("synthetic", ["--reuse", "kappa=3={tmp}"], "'kappa=3' is no arm here"),
    C("synthetic", ["--name", "a/b"], "--name 'a/b': must be a plain directory name"),
    C("synthetic", ["--high-latent-bits", "4"], "must exceed --latent-bits 8"),
    C("synthetic", ["--no-baseline", "--kappa", ""], "holds no value"),
    C("synthetic", ["--reuse", "somewhere"], "--reuse 'somewhere': give LABEL=RUN_DIR"),
    C("synthetic", ["--reuse", "kappa=1={tmp}/nowhere"], "no finished run there"),
    C("synthetic", ["paths.results=/proc/ftbench"], "runs directory"),
    C("synthetic", [], "afile is a file", results="{tmp}/afile"),
    # report and sweep status: what the results root holds, the name, the report's outputs
    C("report", ["--name", "nope"], "no sweep 'nope'",
      setup=lambda r: (r / "sweeps").mkdir(parents=True)),
    C("report", ["--name", "bad"], "sweeps/bad/manifest.json is corrupt (JSONDecodeError",
      setup=lambda r: _sweep_dir(r, '{"name": "bad", "cells": [')),
    C("report", ["--name", "bad"], "newer than this code reads", setup=lambda r: _sweep_dir(
        r, '{"schema": "ftbench-manifest-v7", "name": "bad", "cells": []}')),
    C("report", ["--name", "bad"], "is not a sweep manifest",
      setup=lambda r: _sweep_dir(r, "[1, 2]")),
    C("report", ["--name", "ok"], "report.html is not a writable file",
      setup=lambda r: (_ok_sweep(r) / "report.html").mkdir()),
    C("report", ["--name", "ok"], "sweeps/ok/report is not a writable directory",
      setup=lambda r: (_ok_sweep(r) / "report").write_text("x")),
    C("report", ["--name", "../x"], "NAME '../x' is not a sweep name"),
    C("report", ["--name", "t1"], "t1", env={"FTBENCH_RESULTS": BAD}),
    C("sweep", ["status", "nope"], "no sweep 'nope'",
      setup=lambda r: (r / "sweeps").mkdir(parents=True)),
    C("sweep", SWEEP_RUN, BAD, env={"FTBENCH_RESULTS": BAD}),
    C("sweep", SWEEP_RUN, f"cache directory {BAD}", env={"FTBENCH_CACHE": BAD}),
]


@pytest.mark.parametrize("key, argv, phrase, env, setup, results", CASES)
def test_refused(key, argv, phrase, env, setup, results, places, tmp_path, capsys,
                 monkeypatch) -> None:
    """The row's command ({placeholders} filled; {tmp}: this test's directory, the working
    directory, holding a file `afile`) exits 2 with the one line, writing nothing."""
    import importlib.util

    import experiments.eval.run as run
    import experiments.synthetic as syn

    def refuse(*a: object, **k: object) -> None:
        raise AssertionError("training started on bad input")

    real = importlib.util.find_spec  # wandb counts as not installed
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: None if n == "wandb" else real(n, *a))
    monkeypatch.setattr(syn, "train_with_experiments_train", refuse)
    # lm-eval's index of its own tasks (~10 s to build) is not what a typo's row checks
    monkeypatch.setattr(run, "_all_lm_eval_tasks", frozenset)
    sub = {**places, "{tmp}": str(tmp_path)}
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FTBENCH_RESULTS", results.replace("{tmp}", str(tmp_path)))
    monkeypatch.setenv("FTBENCH_CACHE", places["{cache}"])
    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    if env and "HF_DATASETS_CACHE" in env:  # datasets reads it once, at import
        import datasets.config

        monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", env["HF_DATASETS_CACHE"])
    if setup is not None:
        setup(tmp_path / "results")
    (tmp_path / "afile").write_text("x")
    module, prog, before = ENTRY[key]
    args = []
    for a in [*before, *argv]:
        for k, v in sub.items():
            a = a.replace(k, v)
        args.append(a)
    watched = [tmp_path, Path(places["{d}"]) / "runs"]
    files = _files(*watched)
    try:
        rc = _main(module)(args)
    except SystemExit as e:  # only lm-eval's own CLI may exit by itself
        rc = e.code
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2, err[-3000:]
    # one line; lm-eval logs before it builds the model (a corrupt checkpoint fails there)
    assert (len(lines) == 1 or prog == "lm-eval") and "Traceback" not in err, err[-3000:]
    assert lines[-1].startswith(f"{prog}: error: ") and phrase in lines[-1], lines[-1]
    assert _files(*watched) == files


def test_synthetic_good_input_passes_the_checks(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The table's control: valid flags and overrides pass every check (hydra composes each
    arm) and run() writes samples.jsonl; an untrained tiny model stands in for training."""
    import experiments.synthetic as syn
    from model import build_model, get_preset

    monkeypatch.setenv("FTBENCH_RESULTS", str(tmp_path))
    st = syn.parse_args(["--setting", "smoke", "--kappa", "1/8, 8", "--name", "ok",
                         "--n-prompts", "1", "--n-shared-groups", "1", "--group-size", "2",
                         "--n-eval", "4", "optim.lr=1e-3", "train.seed=1"])
    assert st.overrides == ["optim.lr=1e-3", "train.seed=1"] and st.baseline
    assert syn.check(st) == [(0, None), (8, 1 / 8), (8, 8.0)]

    def fake(label: str, h: int, k: float, st: syn.SyntheticSettings) -> syn.Trained:
        cfg = get_preset("1M", vocab_size=29, dim=16, n_layers=2, n_heads=2, n_kv_heads=1,
                         ffn_dim=32, latent_bits=h, kappa_bits=k)
        return syn.Trained(build_model(cfg), {"run_id": label})

    d = syn.run(st, train_fn=fake)
    assert sorted(p.name for p in d.iterdir()) == ["samples.jsonl"]


@pytest.mark.parametrize("module, prog, where, argv", [
    ("experiments.train.trainer", "train", "compose", ["model=1M"]),
    ("experiments.eval.run", "eval", "run_eval", ["{base}", "--tasks", "arc_easy"]),
    ("experiments.eval.likelihood", "likelihood", "measure_run", ["{ft}"]),
    ("experiments.corpus.__main__", "corpus", "load_data_config", ["--out", "{tmp}/o"]),
    ("experiments.synthetic", "synthetic", "run", []),
])
def test_ctrl_c_is_one_line_saying_how_to_resume(module, prog, where, argv, places, tmp_path,
                                                 capsys, monkeypatch) -> None:
    def interrupted(*a: object, **k: object) -> None:
        raise KeyboardInterrupt

    mod = importlib.import_module(module)
    monkeypatch.setattr(mod, where, interrupted)
    monkeypatch.setenv("FTBENCH_RESULTS", str(tmp_path / "results"))
    args = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    args = [places.get(a, a) for a in args]
    assert mod.main(args) == 130
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"{prog}: interrupted; re-run the "
                                                         "same command"), err


WRONG = {"train": ["foo=1"], "lm-eval": ["--ckpt"],
         # argparse's own parser (usage line first) in these: a value their body refuses
         "report": ["--name", "nope"], "sweep": ["status", "nope"]}
ENTRY_POINTS = [(m, prog, WRONG.get(k, ["--no-such-flag"])) for k, (m, prog, _) in ENTRY.items()]
ENTRY_POINTS.append(("analysis.synthetic", "synthetic", ["--name", "nope"]))
RUN_AS_MAIN = """
import contextlib, io, json, runpy, sys
out = []
for module, args in json.loads(sys.argv[1]):
    sys.argv, so, se, code = [module, *args], io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as e:
            code = e.code
    out.append([code, so.getvalue(), se.getvalue()])
print(json.dumps(out))
"""


@pytest.mark.slow  # imports every entry point (one process for all: a torch import, not 15)
def test_the_module_entry_points_exit_2(tmp_path: Path) -> None:
    """`python -m ...` passes main's status on: exit 2 and the one line, nothing written. Each
    module runs as __main__ the way `python -m` runs it (runpy), in one process."""
    env = {**os.environ, "FTBENCH_RESULTS": str(tmp_path / "results"), "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", RUN_AS_MAIN, json.dumps(
        [(m, a) for m, _, a in ENTRY_POINTS])], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=600)
    assert r.returncode == 0 and r.stderr == "", r.stderr[-3000:]
    for (module, prog, _), (code, out, err) in zip(ENTRY_POINTS, json.loads(r.stdout),
                                                   strict=True):
        assert code == 2 and out == "", (module, code, err[-2000:])
        assert err.startswith(f"{prog}: error: ") and err.count("\n") == 1, (module, err)
    assert list(tmp_path.iterdir()) == []
