"""Bad input to every entry point of experiments/ and of pipelines' corpus and full-eval, through
the one usage-error path (common.errors.cli): exit 2 with one line `<prog>: error: ...` naming
the value, no traceback, nothing written (working directory, results root, run directories).
One table per entry point: argv -> a phrase the line must hold. Ctrl-C is one line with how to
resume, exit 130."""

from __future__ import annotations

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
NO_CUDA = not torch.cuda.is_available()
TINY = ["model=1M", "model.vocab_size=512", "train.seq_len=32", "train.batch_size=8",
        "data.max_bytes=150000", "data.val_tokens=512", "logging.progress=false"]
PROBE = ["--rows", "4", "--prompts", "2", "--prompt-len", "4", "--gen-tokens", "3",
         "--group-size", "2", "--groups", "2", "--draws", "1", "--n-boot", "100"]


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
    """What the tables' {placeholders} stand for: checkpoints, run dirs, data files."""
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


def refused(main: Callable[[list[str]], int], prog: str, argv: list[str], phrase: str,
            places: dict[str, str], tmp: Path, capsys: pytest.CaptureFixture,
            monkeypatch: pytest.MonkeyPatch, results: str = "{tmp}/results",
            env: dict[str, str] | None = None) -> None:
    """`main(argv)` ({placeholders} filled, {tmp}: this test's directory, the working
    directory, holding a file `afile`; `env` set on top) exits 2 with the one line, writing
    nothing."""
    sub = {**places, "{tmp}": str(tmp)}
    monkeypatch.chdir(tmp)
    monkeypatch.setenv("FTBENCH_RESULTS", results.replace("{tmp}", str(tmp)))
    monkeypatch.setenv("FTBENCH_CACHE", places["{cache}"])
    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v.replace("{tmp}", str(tmp)))
    (tmp / "afile").write_text("x")
    args = []
    for a in argv:
        for k, v in sub.items():
            a = a.replace(k, v)
        args.append(a)
    watched = [tmp, Path(places["{d}"]) / "runs"]
    before = _files(*watched)
    try:
        rc = main(args)
    except SystemExit as e:  # only lm-eval's own CLI may exit by itself
        rc = e.code
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2, err[-3000:]
    # one line; lm-eval logs before it builds the model (a corrupt checkpoint fails there)
    assert (len(lines) == 1 or prog == "lm-eval") and "Traceback" not in err, err[-3000:]
    assert lines[-1].startswith(f"{prog}: error: ") and phrase in lines[-1], lines[-1]
    assert _files(*watched) == before


INDEX = pytest.mark.slow
"""A case lm-eval refuses only after indexing its whole task registry (~10 s on CI): the slow
tier's, as the index is not what the case checks."""


def _cases(*rows: tuple, cuda: tuple | None = None) -> list:
    """(argv, phrase[, marks]) rows as pytest params named by their argv."""
    return [pytest.param(*r[:2], marks=r[2:], id=" ".join(r[0]))
            for r in [*rows, *([cuda] if cuda is not None and NO_CUDA else [])]]


# ---------------------------------------------------------------------- python -m experiments.train
TRAIN = _cases(
    (["model=17M"], "unknown model preset '17M'; allowed: ['1M', '16M', '1.5B', '8B']"),
    (["data=web"], "unknown data source 'web'"),
    (["foo.bar=1"], "unknown config section 'foo'"),
    (["train.sed=1"], "unknown key 'train.sed'; allowed keys in train: ["),
    (["+train.foo=1"], "adding or deleting keys is not allowed"),
    (["model.dim"], "is not key=value"),
    (["optim.lr=-1"], "optim.lr=-1.0: must be a finite number > 0"),
    (["train.tokens=lots"], "train.tokens='lots' is not a positive number"),
    (["train.compute_match=tokens"], "allowed values ['none', 'flops']"),
    (["model.latent_bits=4", "model.n_layers=3"], "must be even for a Free Transformer"),
    (["train.seq_len=512"], "exceeds model.max_seq_len=256"),
    (["data=files"], "data=files needs data.paths"),
    (["data=files", "data.paths=[/nonexistent/*.txt]"], "no file matches '/nonexistent/*.txt'"),
    (["model.vocab_size=100000", "data.max_bytes=20000"], "but the tokenizer has"),
    (["train.tokens=1e12", "train.dry_run=true"], "passes over the stdlib corpus"),
    (["paths.results=/proc/ftbench"], "/proc is not writable"),
    (["logging.tracker=wandb"], "logging.tracker=wandb but the wandb package is not installed"),
    cuda=(["train.device=cuda"], "CUDA is not available"))


@pytest.mark.parametrize("argv, phrase", TRAIN)
def test_train(argv, phrase, places, tmp_path, capsys, monkeypatch) -> None:
    import importlib.util

    import experiments.train.trainer as T

    real = importlib.util.find_spec  # wandb counts as not installed
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: None if n == "wandb" else real(n, *a))
    refused(T.main, "train", [*TINY, "paths.cache={cache}", *argv], phrase, places,
            tmp_path, capsys, monkeypatch)


# ---------------------------------------------------------------------- python -m experiments.eval
EVAL = _cases(
    (["{tmp}/nowhere", "--tasks", "arc_easy"], "no checkpoint at"),
    (["{bad}", "--tasks", "arc_easy", "--data", "{bench}"], "corrupt"),
    (["{base}", "--limit", "0"], "LIMIT (--limit): 0 must be >= 1"),
    (["{base}", "--z", "prior-k", "--k", "0"], "K (--k): 0 must be >= 1"),
    (["{base}", "--limt", "2"], "unrecognized arguments: --limt 2"),
    (["{base}", "--tasks", "nosuchbench"], "unknown task(s) nosuchbench", INDEX),
    (["{base}", "--tasks", "arc_eazy", "--data", "{bench}"], "did you mean arc_easy?"),
    (["{base}", "--tasks", "race", "--data", "{bench}"], "no offline data for race"),
    (["{base}", "--tasks", "arc_easy", "--fewshot", "5", "--data", "{bench}"], "fewshot=5"),
    (["{base}", "--tasks", "arc_easy", "--data", "{bench}", "--out-dir", "{tmp}/afile/e"],
     "afile is a file"),
    (["{base}", "--tasks", "arc_easy", "--data", "{tmp}/nodata"], "benchmark data"),
    cuda=(["{base}", "--tasks", "arc_easy", "--device", "cuda"], "0 CUDA device"))


@pytest.mark.parametrize("argv, phrase", EVAL)
def test_eval(argv, phrase, places, tmp_path, capsys, monkeypatch) -> None:
    from experiments.eval.run import main

    refused(main, "eval", argv, phrase, places, tmp_path, capsys, monkeypatch)


# ------------------------------------------------- lm-eval, hf-export, tasks, likelihood, probe
LM_EVAL = _cases(
    (["--ckpt", "{tmp}/nowhere", "--tasks", "arc_easy"], "no checkpoint at"),
    (["--ckpt", "{bad}", "--tasks", "arc_easy", "--limit", "1"], "corrupt", INDEX),
    cuda=(["--ckpt", "{base}", "--tasks", "arc_easy", "--device", "cuda"], "0 CUDA device"))
HF_EXPORT = _cases(
    (["{free}", "{tmp}/hf"], "Free Transformer"),
    (["{base}", "{tmp}/afile"], "afile is a file"),
    (["{tmp}/nowhere", "{tmp}/hf"], "no checkpoint at"),
    (["{bad}", "{tmp}/hf"], "corrupt"))
TASKS = _cases(
    (["{bench}", "{tmp}/afile"], "afile is a file"),
    (["{tmp}/nodata", "{tmp}/tasks"], "no offline task's files"))
LIKELIHOOD = _cases(
    (["{tmp}/nowhere"], "no such run directory or checkpoint"),
    (["{d}"], "no checkpoint at"),
    (["{ft}", "--k", "1,x"], "--k: '1,x' is not a comma-separated list"),
    (["{ft}", "--device", "nodevice"], "--device nodevice: not a torch device"),
    cuda=(["{ft}", "--device", "cuda"], "0 CUDA device"))
PROBE_CASES = _cases(
    (["{tmp}/nowhere"], "no such run directory or checkpoint"),
    (["{bl}", *PROBE], "is a baseline"),
    (["{ft}", *PROBE, "--rows", "0"], "--rows"),
    (["{ft}", *PROBE, "--group-size", "1"], "--group-size"),
    (["{ft}", *PROBE, "--rows", "2", "--prompts", "3"], "--prompts"),
    (["{ft}", *PROBE, "--rows", "100000"], "validation rows"),
    (["{ft}", *PROBE, "--prompt-len", "70"], "--prompt-len"),
    (["{ft}", *PROBE, "--out", "{tmp}/afile"], "--out"))
BENCH = _cases(
    (["--sections", "train,nope"], "nope"),
    (["--reps", "4"], "--reps 4: every figure is a median of at least 5 reps"),
    (["--md", "{tmp}/afile/out.md"], "afile"))
TOOLS = [("experiments.bench.__main__", "python -m experiments.bench", BENCH),
         ("analysis.synthetic", "synthetic", _cases((["--name", "nope"], "nope"))),
         ("experiments.eval.lm_eval_cli", "lm-eval", LM_EVAL),
         ("experiments.eval.hf_export", "hf-export", HF_EXPORT),
         ("experiments.eval.tasks.__main__", "tasks", TASKS),
         ("experiments.eval.likelihood", "likelihood", LIKELIHOOD),
         ("experiments.eval.probe", "probe", PROBE_CASES)]


@pytest.mark.parametrize("module, prog, argv, phrase",
                         [pytest.param(m, p, *c.values, marks=c.marks, id=f"{p}: {c.id}")
                          for m, p, cs in TOOLS for c in cs])
def test_eval_tools(module, prog, argv, phrase, places, tmp_path, capsys, monkeypatch) -> None:
    import importlib

    refused(importlib.import_module(module).main, prog, argv, phrase, places, tmp_path, capsys,
            monkeypatch)


# ------------------------------------------------ python -m experiments.corpus / pipelines.corpus
CORPUS = _cases(
    (["--data", "{d}/hf.yaml"], "cannot stream 'json'"),
    (["--data", "{d}/field.yaml"], "no field 'body'"),
    (["--data", "files", "paths=[{d}/p.parquet]", "text_field=body"], "no column 'body'"),
    (["--data", "files", "paths=[{d}/empty.txt]"], "holds no (non-empty) document"),
    (["--data", "stdlib", "nope=1"], "Key 'nope' not in 'DataConfig'"),
    (["--data", "stdlib", "val_fraction=2"], "data.val_fraction=2.0: must be in (0, 1)"),
    (["--data", "nope"], "--data 'nope': no such file or config"),
    (["--data", "synthetic"], "generated on the fly"),
    (["--data", "stdlib", "tokenizer={tmp}/none.json"], "no such file"),
    (["--data", "stdlib", "--workers", "0"], "--workers: 0 must be >= 1"),
    (["--data", "stdlib"], "give --vocab-size"),
    (["--verify"], "no corpus.json to verify"))


@pytest.mark.parametrize("argv, phrase", CORPUS)
def test_corpus(argv, phrase, places, tmp_path, capsys, monkeypatch) -> None:
    from experiments.corpus.__main__ import main

    vocab = [] if "--vocab-size" in phrase or "--verify" in argv else ["--vocab-size", "300"]
    refused(main, "corpus", [*argv, *vocab, "--out", "{tmp}/out", "--quiet"], phrase, places,
            tmp_path, capsys, monkeypatch)


def test_corpus_unwritable_out_and_the_pipeline_s_own_checks(places, tmp_path, capsys,
                                                             monkeypatch) -> None:
    """pipelines.corpus shares experiments.corpus's parser and build (one case of the table
    through it); its launcher flags are its own."""
    from experiments.corpus.__main__ import main
    from pipelines.corpus import main as pmain

    refused(main, "corpus", ["--data", "stdlib", "--out", "/proc/ftbench", "--vocab-size",
                             "300"], "is not writable", places, tmp_path, capsys, monkeypatch)
    refused(pmain, "corpus", ["--data", "{d}/field.yaml", "--vocab-size", "300", "--out",
                              "{tmp}/o", "--quiet"], "no field 'body'", places, tmp_path,
            capsys, monkeypatch)
    refused(pmain, "corpus", ["--out", "{tmp}/o", "--launcher", "pbs"],
            "--launcher: invalid choice: 'pbs'", places, tmp_path, capsys, monkeypatch)
    refused(pmain, "corpus", ["--out", "{tmp}/o", "--launcher", "slurm", "--cluster",
                              "{tmp}/none.yaml"], "none.yaml", places, tmp_path, capsys,
            monkeypatch)


# ---------------------------------------------------------------- python -m experiments.synthetic
SYNTHETIC = _cases(
    (["--setting", "nope"], "--setting: invalid choice: 'nope'"),
    (["--kappa", "1/0"], "--kappa: '1/0' is not a number of bits >= 0"),
    (["--setting", "smoke", "nosuch.key=1"], "unknown config section 'nosuch'"),
    (["--setting", "smoke", "train.tokens=lots"], "train.tokens='lots'"),
    (["data=tinystories"], "'data=tinystories': data is set per arm"),
    (["model.latent_bits=4"], "use --latent-bits"),
    (["--name", "a/b"], "--name 'a/b': must be a plain directory name"),
    (["paths.results=/proc/ftbench"], "runs directory"),
    (["--latent-bits", "0"], "--latent-bits: 0 must be >= 1"),
    (["--high-latent-bits", "4"], "--high-latent-bits 4: must exceed --latent-bits 8"),
    (["--no-baseline", "--kappa", ""], "holds no value"),
    (["--reuse", "somewhere"], "--reuse 'somewhere': give LABEL=RUN_DIR"),
    (["--reuse", "kappa=3={tmp}"], "'kappa=3' is no arm here"),
    (["--reuse", "kappa=1={tmp}/nowhere"], "no finished run there"))


@pytest.mark.parametrize("argv, phrase", SYNTHETIC)
def test_synthetic(argv, phrase, places, tmp_path, capsys, monkeypatch) -> None:
    import experiments.synthetic as syn

    def refuse(*a: object, **k: object) -> None:
        raise AssertionError("training started on bad input")

    monkeypatch.setattr(syn, "train_with_experiments_train", refuse)
    refused(syn.main, "synthetic", argv, phrase, places, tmp_path, capsys, monkeypatch)


@pytest.mark.parametrize("results, phrase", [("{tmp}/afile", "afile is a file"),
                                             ("/proc/ftbench", "/proc is not writable")])
def test_synthetic_results_root_unwritable(results, phrase, places, tmp_path, capsys,
                                           monkeypatch) -> None:
    import experiments.synthetic as syn

    refused(syn.main, "synthetic", [], phrase, places, tmp_path, capsys, monkeypatch,
            results=results)


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
    assert syn.check(st) == [(0, None), (8, 1 / 8), (8, 8.0)]

    def fake(label: str, h: int, k: float, st: syn.SyntheticSettings) -> syn.Trained:
        cfg = get_preset("1M", vocab_size=29, dim=16, n_layers=2, n_heads=2, n_kv_heads=1,
                         ffn_dim=32, latent_bits=h, kappa_bits=k)
        return syn.Trained(build_model(cfg), {"run_id": label})

    d = syn.run(st, train_fn=fake)
    assert sorted(p.name for p in d.iterdir()) == ["samples.jsonl"]


# ----------------------------------------------- python -m analysis.report, python -m sweeps status
def _sweep_dir(root: Path, manifest: str | None = None) -> Path:
    d = root / "sweeps" / "bad"
    d.mkdir(parents=True)
    if manifest is not None:
        (d / "manifest.json").write_text(manifest, encoding="utf-8")
    return d


def _ok_sweep(root: Path) -> Path:
    from fake import write_fake_sweep

    write_fake_sweep(root, "ok", kappas=(2.0,), seeds=(0,), controls=())
    return root / "sweeps" / "ok"


RESULTS_ROOT: list[tuple[str, Callable[[Path], object], list[str], str]] = [
    # id, what the results root holds, argv (report's unless it starts with "status"), phrase
    ("no-sweep", lambda r: (r / "sweeps").mkdir(parents=True), ["--name", "nope"],
     "no sweep 'nope'"),
    ("no-results-root", lambda r: None, ["--name", "nope"], "does not exist"),
    ("corrupt-manifest", lambda r: _sweep_dir(r, '{"name": "bad", "cells": ['),
     ["--name", "bad"], "sweeps/bad/manifest.json is corrupt (JSONDecodeError"),
    ("manifest-not-an-object", lambda r: _sweep_dir(r, "[1, 2]"), ["--name", "bad"],
     "is not a sweep manifest"),
    ("manifest-of-a-newer-suite", lambda r: _sweep_dir(r, '{"schema": "ftbench-manifest-v7", '
     '"name": "bad", "cells": []}'), ["--name", "bad"], "newer than this code reads"),
    ("report-dir-is-a-file", lambda r: (_ok_sweep(r) / "report").write_text("x"),
     ["--name", "ok"], "sweeps/ok/report is not a writable directory"),
    ("report-html-is-a-dir", lambda r: (_ok_sweep(r) / "report.html").mkdir(),
     ["--name", "ok"], "report.html is not a writable file"),
    ("n-boot-0", lambda r: None, ["--name", "nope", "--n-boot", "0"],
     "--n-boot: 0 must be >= 1"),
    ("name-with-slash", lambda r: None, ["--name", "../x"], "NAME '../x' is not a sweep name"),
    ("status-no-sweep", lambda r: (r / "sweeps").mkdir(parents=True), ["status", "nope"],
     "no sweep 'nope'"),
]


@pytest.mark.parametrize("setup, argv, phrase", [c[1:] for c in RESULTS_ROOT],
                         ids=[c[0] for c in RESULTS_ROOT])
def test_report_and_status(setup, argv, phrase, places, tmp_path, capsys, monkeypatch) -> None:
    from analysis.report import main as report
    from sweeps.__main__ import main as sweep

    setup(tmp_path / "results")
    main, prog = (sweep, "sweep") if argv[0] == "status" else (report, "report")
    refused(main, prog, argv, phrase, places, tmp_path, capsys, monkeypatch)


# ------------------------------------- an unwritable results root, cache or output, by environment
BAD = "/proc/ftbench-unwritable"
"""/proc refuses new files even to root: it stands for an unwritable place."""
SWEEP_RUN = ["run", "--name", "t1", "--kappa", "0.5", "--h", "4", "--seeds", "0",
             "--tokens", "4096"]
EVAL_ARC = ["{base}", "--limit", "1", "--data", "{bench}", "--tasks"]
ENVIRONMENT = [  # module, prog, argv, environment, phrase
    ("experiments.train.trainer", "train", TINY, {"FTBENCH_RESULTS": BAD}, "FTBENCH_RESULTS"),
    ("experiments.train.trainer", "train", TINY, {"FTBENCH_CACHE": BAD + "/cache"},
     f"cache directory {BAD}"),
    ("sweeps.__main__", "sweep", SWEEP_RUN, {"FTBENCH_RESULTS": BAD}, BAD),
    ("sweeps.__main__", "sweep", SWEEP_RUN, {"FTBENCH_CACHE": BAD}, f"cache directory {BAD}"),
    ("experiments.eval.run", "eval", [*EVAL_ARC, "arc_easy"], {"HF_DATASETS_CACHE": BAD},
     "HF_DATASETS_CACHE"),
    ("experiments.eval.run", "eval", [*EVAL_ARC, "humaneval_plus"], {"XDG_CACHE_HOME": BAD},
     "XDG_CACHE_HOME"),
    ("analysis.report", "report", ["--name", "t1"], {"FTBENCH_RESULTS": BAD}, "t1"),
    ("experiments.bench.__main__", "python -m experiments.bench", [],
     {"FTBENCH_RESULTS": "{tmp}/afile/res"}, "afile"),
    ("experiments.bench.__main__", "python -m experiments.bench", [], {"BENCH_SIZE": "huge"},
     "huge"),
]


@pytest.mark.parametrize("module, prog, argv, env, phrase", ENVIRONMENT,
                         ids=[f"{c[1]}: {' '.join(f'{k}={v}' for k, v in c[3].items())}"
                              for c in ENVIRONMENT])
def test_environment(module, prog, argv, env, phrase, places, tmp_path, capsys,
                     monkeypatch) -> None:
    import importlib

    if "HF_DATASETS_CACHE" in env:  # datasets reads it once, at import: as a new process would
        import datasets.config

        monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", env["HF_DATASETS_CACHE"])
    refused(importlib.import_module(module).main, prog, argv, phrase, places, tmp_path, capsys,
            monkeypatch, env=env)


def test_unwritable_probe_creates_nothing(tmp_path: Path) -> None:
    from common.io import unwritable

    assert unwritable(tmp_path / "a" / "b") is None
    assert not (tmp_path / "a").exists()
    assert "/proc" in str(unwritable(BAD)) and "not writable" in str(unwritable(BAD))
    (tmp_path / "f").write_text("x")
    assert str(unwritable(tmp_path / "f" / "sub")) == f"{tmp_path / 'f'} is a file"
    assert list(tmp_path.iterdir()) == [tmp_path / "f"]


def test_tokenizer_cache_error_is_a_usage_error() -> None:
    from common.errors import UsageError
    from experiments.corpus.tokenizer import train_bpe

    with pytest.raises(UsageError, match="tokenizer cache .*not writable"):
        train_bpe(["some text " * 50], 300, cache_dir=BAD)


def test_report_into_a_read_only_results_root(tmp_path: Path) -> None:
    """An existing sweep in a read-only results root: root ignores chmod, so a read-only bind
    mount in a private mount namespace where possible (a process of its own), else chmod."""
    from conftest import can_mount_ro
    from fake import write_fake_sweep

    root = tmp_path / "results"
    write_fake_sweep(root, "ro", kappas=(0.5,), controls=())
    before = sorted(root.rglob("*"))
    cmd = [sys.executable, "-m", "analysis.report", "--name", "ro", "--n-boot", "20"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FTBENCH_RESULTS": str(root),
           "OMP_NUM_THREADS": "1"}
    if can_mount_ro(tmp_path):
        cmd = ["unshare", "-m", "sh", "-c", 'mount --bind -o ro "$0" "$0" && exec "$@"',
               str(root), *cmd]
    elif os.geteuid() == 0:
        pytest.skip("root without a private mount namespace: cannot make a read-only dir")
    else:
        (root / "sweeps" / "ro").chmod(0o555)
    try:
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    finally:
        (root / "sweeps" / "ro").chmod(0o755)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert "cannot write the report" in lines[0] and "not writable" in lines[0], lines[0]
    assert sorted(root.rglob("*")) == before


# ------------------------------------------------------------- python -m pipelines.full_eval
FULL_EVAL = _cases(
    (["{tmp}/nope.pt", "--data", "{bench}"], "no checkpoint at"),
    (["{base}", "--data", "{bench}", "--workers", "0"], "--workers: 0 must be >= 1"),
    (["{base}", "--data", "{bench}", "--tasks", "arc_eazy"], "did you mean arc_easy?"))


@pytest.mark.parametrize("argv, phrase", FULL_EVAL)
def test_full_eval(argv, phrase, places, tmp_path, capsys, monkeypatch) -> None:
    from pipelines.full_eval import main

    refused(main, "full-eval", [*argv, "--out", "{tmp}/fe"], phrase, places, tmp_path, capsys,
            monkeypatch)


# ---------------------------------------------------------------------------------- Ctrl-C
@pytest.mark.parametrize("module, prog, where, argv", [
    ("experiments.train.trainer", "train", "compose", ["model=1M"]),
    ("experiments.eval.run", "eval", "run_eval", ["{base}", "--tasks", "arc_easy"]),
    ("experiments.eval.likelihood", "likelihood", "measure_run", ["{ft}"]),
    ("experiments.corpus.__main__", "corpus", "load_data_config", ["--out", "{tmp}/o"]),
    ("experiments.synthetic", "synthetic", "run", []),
])
def test_ctrl_c_is_one_line_saying_how_to_resume(module, prog, where, argv, places, tmp_path,
                                                 capsys, monkeypatch) -> None:
    import importlib

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


ENTRY_POINTS = [  # module, prog, argv its main refuses
    ("experiments.train", "train", ["foo=1"]), ("experiments.eval", "eval", ["--no-such-flag"]),
    ("experiments.eval.lm_eval_cli", "lm-eval", ["--ckpt"]),
    ("experiments.eval.hf_export", "hf-export", ["--no-such-flag"]),
    ("experiments.eval.tasks", "tasks", ["--no-such-flag"]),
    ("experiments.eval.likelihood", "likelihood", ["--no-such-flag"]),
    ("experiments.eval.probe", "probe", ["--no-such-flag"]),
    ("experiments.corpus", "corpus", ["--no-such-flag"]),
    ("experiments.synthetic", "synthetic", ["--no-such-flag"]),
    ("pipelines.corpus", "corpus", ["--no-such-flag"]),
    ("pipelines.full_eval", "full-eval", ["--no-such-flag"]),
    ("experiments.bench", "python -m experiments.bench", ["--no-such-flag"]),
    # argparse's own parser (usage line first) in these: a value their body refuses
    ("analysis.report", "report", ["--name", "nope"]),
    ("analysis.synthetic", "synthetic", ["--name", "nope"]),
    ("sweeps", "sweep", ["status", "nope"])]
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
