"""The likelihood bound reads the run's validation rows (issue 27): from a built corpus' val
shards when the run's corpus is on disk ("shards": only the scored rows, nothing tokenized or
built), else from its data section built again ("rebuilt"); either way byte-identical to the
rows the trainer validated on, and the file says which path it took."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch
import yaml

import experiments.eval.likelihood as L
import experiments.train.data as D
import experiments.train.trainer as T
from common.paths import RunDir
from experiments.corpus.build import build
from experiments.corpus.shards import TokenStream
from experiments.train.config import DataConfig, compose
from model.checkpoint import load_weights

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SEQ = 16


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A built corpus whose validation stream spans several shards."""
    rng = random.Random(2)
    src = tmp_path_factory.mktemp("src")
    for i in range(30):
        words = " ".join("".join(rng.choice("abcdefgh") for _ in range(rng.randint(2, 6)))
                         for _ in range(100))
        (src / f"d{i:02d}.txt").write_text(f"doc {i}: {words}\n")
    out = tmp_path_factory.mktemp("corpus") / "c"
    build(DataConfig(source="files", paths=[f"{src}/*.txt"], shard_bytes=1500,
                     val_fraction=0.3), out, vocab_size=300)
    return out


def _args(root: Path, *extra: str) -> list[str]:
    return ["model=1M", "model.vocab_size=300", "model.dim=32", "model.ffn_dim=64",
            "model.n_layers=2", "model.n_heads=2", "model.n_kv_heads=1",
            f"train.seq_len={SEQ}", "train.batch_size=4", f"train.tokens={2 * 4 * SEQ}",
            "data.val_tokens=200", "logging.progress=false", "logging.val_every=0",
            "optim.warmup_steps=1", f"paths.results={root}", *extra]


@pytest.fixture(scope="module")
def run(corpus, tmp_path_factory) -> tuple[Path, list[str]]:
    """A tiny Free Transformer trained on the built corpus (data.corpus=<dir>)."""
    args = _args(tmp_path_factory.mktemp("res"), f"data.corpus={corpus}",
                 "model.latent_bits=2")
    return T.train(compose(args)), args


def _cfg(rd: Path) -> dict:
    return yaml.safe_load((rd / "config.yaml").read_text())


def test_shard_rows_are_the_trainers_rows(run):
    rd, args = run
    trainer = T._corpus(compose(args))  # what the trainer validated on
    assert len(trainer.val_x) >= 4
    vx, vy, tb, how = L.validation_rows(RunDir(rd), None)
    assert how["path"] == "shards" and how["rows"] == len(trainer.val_x)
    assert torch.equal(vx, trainer.val_x) and torch.equal(vy, trainer.val_y)
    assert torch.equal(tb, trainer.token_bytes)
    vx3, vy3, _, how3 = L.validation_rows(RunDir(rd), 3)
    assert how3["rows"] == 3 and how3["val_sequences"] == len(trainer.val_x)
    assert torch.equal(vx3, trainer.val_x[:3]) and torch.equal(vy3, trainer.val_y[:3])


def test_the_val_stream_spans_shards_and_only_the_scored_rows_are_read(corpus, monkeypatch):
    man = json.loads((corpus / "corpus.json").read_text())
    assert sum(s["split"] == "val" and s["tokens"] > 0 for s in man["shards"]) >= 2
    reads = []
    get = TokenStream.__getitem__
    monkeypatch.setattr(TokenStream, "__getitem__",
                        lambda self, sl: reads.append((sl.start, sl.stop)) or get(self, sl))
    monkeypatch.setattr(D, "build", lambda *a, **k: pytest.fail("built a corpus"))
    vx, vy, _ = D.open_val_rows(corpus, 10_000, SEQ, max_rows=2)
    assert reads == [(0, 2 * SEQ + 1)] and vx.shape == (2, SEQ)
    # independently: the val shards' tokens concatenated, as files
    dt = man["dtype"]
    import numpy as np

    va = np.concatenate([np.fromfile(corpus / s["file"], dtype=dt) for s in man["shards"]
                         if s["split"] == "val" and s["tokens"] > 0]).astype(np.int64)
    assert vx.flatten().tolist() == va[:2 * SEQ].tolist()
    assert vy.flatten().tolist() == va[1:2 * SEQ + 1].tolist()


def test_likelihood_values_unchanged_and_the_path_recorded(run):
    rd, _ = run
    out = Path(L.measure_run(rd, ks=[1, 2], max_rows=3, batch_size=2, device="cpu"))
    doc = json.loads(out.read_text())
    assert doc["rows_read"]["path"] == "shards" and doc["rows_read"]["rows"] == 3
    # the old path: the corpus rebuilt (here: reopened) through build_corpus
    old = L.run_corpus(RunDir(rd))
    m = load_weights(rd / "checkpoints" / "final.pt").model
    want = L.validation_likelihood(m, old.val_x[:3], old.val_y[:3], old.token_bytes,
                                   ks=[1, 2], batch_size=2)
    for k in ("n_tokens", "n_bytes", "iwae", "prior_k1", "posterior", "spread_bpb"):
        assert doc[k] == json.loads(json.dumps(want[k])), k


def test_a_corpus_that_is_not_the_runs_is_refused_in_one_line(run, tmp_path, capsys):
    rd, _ = run
    fake = tmp_path / rd.name
    (fake / "checkpoints").mkdir(parents=True)
    (fake / "checkpoints" / "final.pt").symlink_to(rd / "checkpoints" / "final.pt")
    cfg = _cfg(rd)
    cfg["corpus"]["manifest_sha256"] = "0" * 64
    cfg["corpus"]["tokenizer_sha256"] = "1" * 64
    (fake / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert L.main([str(fake), "--k", "1", "--max-rows", "2", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not the corpus run" in err and "tokenizer" in err
    assert not (fake / "eval").exists()


@pytest.mark.slow  # builds a stdlib corpus three times; the fast tier keeps both paths
# (test_likelihood_values_unchanged_and_the_path_recorded, test_synthetic_runs_are_rebuilt)
def test_a_cache_built_run_reads_shards_then_rebuilds_once_the_cache_is_gone(tmp_path):
    """data=stdlib: the trainer built its corpus under paths.cache; with that deleted the
    corpus is built again, with the same rows and the same likelihood."""
    args = _args(tmp_path, "data=stdlib", "data.max_bytes=60000", "model.latent_bits=0")
    rd = T.train(compose(args))
    trainer = T._corpus(compose(args))
    vx, vy, _, how = L.validation_rows(RunDir(rd), None)
    assert how["path"] == "shards" and torch.equal(vx, trainer.val_x)
    kw = {"ks": [1], "max_rows": 4, "batch_size": 2, "device": "cpu"}
    a = json.loads(Path(L.measure_run(rd, **kw)).read_text())
    shutil.rmtree(Path(_cfg(rd)["corpus"]["dir"]))
    vx2, vy2, _, how2 = L.validation_rows(RunDir(rd), None)
    assert how2["path"] == "rebuilt"
    assert torch.equal(vx2, trainer.val_x) and torch.equal(vy2, trainer.val_y)
    assert Path(_cfg(rd)["corpus"]["dir"]).is_dir()  # built again where the trainer had it
    shutil.rmtree(Path(_cfg(rd)["corpus"]["dir"]))
    b = json.loads(Path(L.measure_run(rd, **kw)).read_text())
    assert (a["rows_read"]["path"], b["rows_read"]["path"]) == ("shards", "rebuilt")
    for k in ("nll_nats_per_token", "bpb", "n_tokens", "n_bytes", "exact"):
        assert a[k] == b[k], k


def test_synthetic_runs_are_rebuilt(tmp_path):
    args = ["data=synthetic", "model=1M", "model.dim=32", "model.ffn_dim=64",
            "model.n_layers=2", "model.n_heads=2", "model.n_kv_heads=1", "train.batch_size=4",
            "data.val_tokens=260", "logging.progress=false", "logging.val_every=0",
            "optim.warmup_steps=1", "train.tokens=520", f"paths.results={tmp_path}"]
    rd = T.train(compose(args))
    vx, _, _, how = L.validation_rows(RunDir(rd), 2)
    assert how == {"path": "rebuilt", "corpus_dir": None, "rows": 2, "val_sequences": 4}
    assert torch.equal(vx, T._corpus(compose(args)).val_x[:2])
