"""Training on a built corpus: 2 processes read disjoint samples and equal 1; passes over the corpus
are explicit (refused beyond data.max_epochs in one line, shown in the dry run and recorded)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import experiments.train.trainer as T
from experiments.corpus.__main__ import main as make_corpus
from experiments.train.config import compose
from experiments.train.plan import plan, run_id

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("one_torch_thread")

# logs every read of the training stream (rank, first sample, count), then runs the trainer
_LOGGING_TRAINER = """
import json, os, sys
import experiments.train.data as D
log = open(os.environ["READS_LOG"] + "." + os.environ.get("RANK", "0"), "a")
get = D.PackedData.get
def logged(self, start, count):
    log.write(json.dumps([int(os.environ.get("RANK", 0)), start, count]) + "\\n"); log.flush()
    return get(self, start, count)
D.PackedData.get = logged
from experiments.train.trainer import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory) -> Path:
    rng = random.Random(1)
    src = tmp_path_factory.mktemp("src")
    for i in range(30):
        words = " ".join("".join(rng.choice("abcdefgh") for _ in range(rng.randint(2, 6)))
                         for _ in range(120))
        (src / f"d{i:02d}.txt").write_text(f"doc {i}: {words}\n")
    out = tmp_path_factory.mktemp("corpus") / "c"
    assert make_corpus(["--data", "files", "--out", str(out), "--vocab-size", "300",
                        "--workers", "1", "--quiet", f"paths=[{src}/*.txt]", "shard_bytes=3000",
                        "val_fraction=0.15"]) == 0  # in process: the shards need no workers
    return out


def _args(corpus: Path, *extra: str) -> list[str]:
    return ["model=1M", "model.vocab_size=300", "model.dim=64", "model.ffn_dim=128",
            "model.n_layers=2", "train.seq_len=32", "train.batch_size=8",
            "train.micro_batch_size=2", f"data.corpus={corpus}", "data.val_tokens=128",
            "logging.progress=false", "logging.log_every=1", "optim.warmup_steps=1", *extra]


@pytest.mark.slow  # end to end, 6-15 s: the slow tier (CI runs it)
def test_two_processes_read_disjoint_samples_and_equal_one(corpus_dir, tmp_path):
    args = _args(corpus_dir, f"train.tokens={3 * 8 * 32}")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "READS_LOG": str(tmp_path / "reads")}
    script = tmp_path / "logging_trainer.py"
    script.write_text(_LOGGING_TRAINER)
    r1 = subprocess.run([sys.executable, str(script), *args, f"paths.results={tmp_path}/one"],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r1.returncode == 0, r1.stderr[-3000:]
    one = [json.loads(x) for x in (tmp_path / "reads.0").read_text().splitlines()]
    (tmp_path / "reads.0").unlink()
    r2 = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                         "--nproc_per_node", "2", str(script), *args,
                         f"paths.results={tmp_path}/two"],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r2.returncode == 0, r2.stderr[-3000:]
    reads = {rk: [json.loads(x) for x in (tmp_path / f"reads.{rk}").read_text().splitlines()]
             for rk in (0, 1)}
    samples = {rk: [s for _, st, n in rs for s in range(st, st + n)] for rk, rs in reads.items()}
    assert not set(samples[0]) & set(samples[1])  # disjoint
    assert len(samples[0]) == len(samples[1]) == 12  # 3 steps x 8 / 2 ranks
    # together, exactly the samples one process reads
    assert sorted(samples[0] + samples[1]) == sorted(s for _, st, n in one
                                                     for s in range(st, st + n)) == list(range(24))
    rid = run_id(compose(args))
    a = torch.load(tmp_path / "one" / "runs" / rid / "checkpoints" / "final.pt",
                   weights_only=True)["model"]
    b = torch.load(tmp_path / "two" / "runs" / rid / "checkpoints" / "final.pt",
                   weights_only=True)["model"]
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    conf = yaml.safe_load((tmp_path / "one" / "runs" / rid / "config.yaml").read_text())
    n = conf["corpus"]["train_tokens"]
    assert conf["corpus"]["epochs"] == pytest.approx(24 / ((n - 1) // 32), abs=1e-6)
    assert conf["corpus"]["max_epochs"] == 1.0 and conf["corpus"]["dir"] == str(corpus_dir)


def test_tokens_beyond_max_epochs_are_refused_in_one_line_dry_run_included(corpus_dir,
                                                                          tmp_path, capsys):
    man = json.loads((corpus_dir / "corpus.json").read_text())
    n_tok = man["tokens"]["train"]
    n = (n_tok - 1) // 32
    too_many = (n + 8) * 32  # one step (8 sequences) beyond a single pass
    for dry in ("true", "false"):
        rc = T.main(_args(corpus_dir, f"train.tokens={too_many}", f"train.dry_run={dry}",
                          f"paths.results={tmp_path}"))
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and err.startswith("train: error: "), err
        assert f"{n_tok:,} training tokens" in err and "data.max_epochs=1" in err
        assert "passes over the corpus" in err
    assert not (tmp_path / "runs").exists()
    # allowed with max_epochs raised; the dry run shows the passes
    cfg = compose(_args(corpus_dir, f"train.tokens={too_many}", "data.max_epochs=2",
                        "train.dry_run=true", f"paths.results={tmp_path}"))
    T.train(cfg)
    out = capsys.readouterr().out
    p = plan(cfg, 1)
    want = (p.tokens // 32) / n
    line = next(x for x in out.splitlines() if x.startswith("epochs"))
    assert f"{want:.4g} passes over the corpus ({n_tok:,} training tokens" in line, line
    assert 1.0 < want <= 2.0
