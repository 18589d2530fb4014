"""experiments/train/trainer.py end to end on tiny runs: learning, resume after kill -9 and SIGTERM,
NaN handling, dry-run FLOPs, bad input (DDP == one process: tests/test_train_loop.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from trainrun import ROOT, SYNTH, env1, weights
from trainrun import rows as metrics

import experiments.train.trainer as T
from common.io import flocked
from experiments.corpus.tokenizer import tokenizer_from_ref
from experiments.train.config import CONF_DIR, compose
from experiments.train.plan import plan, run_dir, run_id
from model import load_checkpoint, train_flops_per_token

# 1M preset with a small vocabulary and short sequences: a step takes tens of milliseconds.
TINY = ["model=1M", "model.vocab_size=512", "train.seq_len=32", "train.batch_size=8",
        "data.max_bytes=150000", "data.val_tokens=512", "logging.progress=false",
        "logging.log_every=1", "optim.lr=3e-3", "optim.warmup_steps=2"]
TRAIN_KEYS = {"kind", "step", "tokens", "flops", "ce", "kl_nats", "kl_bits", "loss", "lr",
              "grad_norm", "tokens_per_s", "time"}
FT_VAL_KEYS = {"val_ce", "val_bpb", "val_ce_prior", "val_ce_posterior", "val_kl_nats",
               "val_kl_bits", "val_elbo", "frac_kl_above_kappa"}


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # one thread: bitwise-equal runs


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ftbench-cache")  # tokenizer + corpus, shared by the runs



def ov(results: Path, cache: Path, *extra: str) -> list[str]:
    return [*TINY, f"paths.results={results}", f"paths.cache={cache}", *extra]


# ---------------------------------------------------------------- learning + run directory
@pytest.mark.parametrize("arm", ["baseline", "free"])
def test_tiny_run_lowers_val_loss_and_writes_the_contract(tmp_path, cache, arm):
    extra = ["model.latent_bits=8", "model.kappa_bits=0.5"] if arm == "free" else []
    cfg = compose(ov(tmp_path, cache, "train.tokens=7680", "logging.val_every=15",
                       "logging.ckpt_every=10", *extra))
    run = T.train(cfg, argv=["train.py", "test"])
    assert run == tmp_path / "runs" / run_id(cfg)
    rows = metrics(run)
    tr = [r for r in rows if r["kind"] == "train"]
    val = [r for r in rows if r["kind"] == "val"]
    assert [r["step"] for r in tr] == list(range(1, 31))
    assert [r["step"] for r in val] == [0, 15, 30] and rows[-1]["kind"] == "final"
    assert val[-1]["val_ce"] < val[0]["val_ce"] - 0.7  # from ~ln(512) = 6.24 nats
    assert all(set(r) == TRAIN_KEYS for r in tr)
    assert tr[-1]["tokens"] == 30 * 8 * 32
    p = plan(cfg)
    assert tr[-1]["flops"] == pytest.approx(30 * 256 * p.flops_per_token)
    assert 0 < val[-1]["val_bpb"] < val[-1]["val_ce"]  # a token is more than one byte
    if arm == "free":
        v = val[-1]
        assert FT_VAL_KEYS <= set(v) and v["val_ce"] == v["val_ce_prior"]
        assert v["val_elbo"] == pytest.approx(v["val_ce_posterior"] + v["val_kl_nats"])
        assert 0 <= v["frac_kl_above_kappa"] <= 1 and v["val_kl_nats"] > 0
        assert any(r["kl_nats"] > 0 for r in tr)
    else:
        assert all(r["kl_nats"] == 0 for r in tr) and "val_ce_prior" not in val[-1]
    conf = yaml.safe_load((run / "config.yaml").read_text())
    assert conf["run_id"] == run.name and conf["arm"] == arm
    assert conf["model"]["vocab_size"] == 512 and conf["train"]["seq_len"] == 32
    assert conf["accounting"]["flops_per_token"] == p.flops_per_token
    prov = conf["provenance"]
    assert len(prov["git_commit"]) == 40 and prov["versions"]["torch"] == torch.__version__
    assert len(prov["tokenizer_sha256"]) == 64 and list(prov["data_checksums"])[0].startswith(
        "stdlib:")
    assert (run / "train.log").read_text().splitlines()[0].endswith("argv: train.py test")
    ck = load_checkpoint(run / "checkpoints" / "final.pt")
    assert ck.config.latent_bits == (8 if arm == "free" else 0)
    tok = tokenizer_from_ref(ck.tokenizer)
    assert tok.vocab_size == 512 and tok.decode(tok.encode("import os\n")) == "import os\n"
    # final.pt is a weights-only export (issue 26): the training state, no optimizer
    assert ck.extra["step"] == 30 and "optimizer" not in ck.extra and "rng" in ck.extra
    assert ck.extra["weights_only"] is True
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "final.pt", "step_20.dcp", "step_20.pt", "step_30.dcp", "step_30.pt"]  # keep=2
    # the last step's sharded checkpoint loads (weights only) to final.pt's weights
    last = load_checkpoint(run / "checkpoints" / "step_30.pt")
    assert all(torch.equal(v, ck.model.state_dict()[k]) for k, v in last.model.state_dict().items())

    # a finished run is not retrained ...
    mtime = (run / "checkpoints" / "final.pt").stat().st_mtime_ns
    t0 = time.time()
    assert T.train(cfg) == run and time.time() - t0 < 2
    assert (run / "checkpoints" / "final.pt").stat().st_mtime_ns == mtime
    assert len(metrics(run)) == len(rows)
    if arm == "baseline":  # ... unless asked; the retrained run is bitwise the same
        cfg.train.force = True
        assert run_id(cfg) == run.name
        T.train(cfg)
        assert (run / "checkpoints" / "final.pt").stat().st_mtime_ns != mtime
        assert [r["ce"] for r in metrics(run) if r["kind"] == "train"] == [r["ce"] for r in tr]


# ---------------------------------------------------------------- faults
def _wait(pred, proc, timeout=120.0):
    t0 = time.time()
    while not pred():
        if proc.poll() is not None:
            raise AssertionError(f"run exited early with {proc.returncode}: "
                                 f"{proc.stderr.read()[-2000:]}")
        if time.time() - t0 > timeout:
            proc.kill()
            raise AssertionError("timed out")
        time.sleep(0.01)


@pytest.mark.slow  # multi-process or end to end: the CI tier (make test-all)
def test_kill9_and_sigterm_then_resume_equal_an_uninterrupted_run(tmp_path, cache):
    extra = ["model.dim=64", "model.ffn_dim=128", "model.latent_bits=4", "model.kappa_bits=0.25",
             "train.tokens=6144",
             "logging.ckpt_every=4", "logging.val_every=10", "logging.keep_checkpoints=50"]
    ref_cfg = compose(ov(tmp_path / "ref", cache, *extra))
    ref = T.train(ref_cfg)  # 24 steps, never interrupted
    args = ov(tmp_path / "cut", cache, *extra)
    run = run_dir(compose(args))
    cmd = [sys.executable, "-m", "experiments.train", *args]
    ck = run / "checkpoints"

    # 1. kill -9 as soon as the first checkpoint is there (mid-run, maybe mid-write of the next)
    p = subprocess.Popen(cmd, cwd=ROOT, env=env1(), stderr=subprocess.PIPE, text=True)
    _wait(lambda: (ck / "step_4.pt").exists(), p)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=60)
    assert p.returncode == -signal.SIGKILL and not (ck / "final.pt").exists()

    # 2. restart; SIGTERM once it has gone past its resume point: checkpoint + exit code 75
    p = subprocess.Popen(cmd, cwd=ROOT, env=env1(), stderr=subprocess.PIPE, text=True)
    n0 = max(int(x.stem.split("_")[1]) for x in ck.glob("step_*.pt"))
    # the kill may have come while later steps' lines were written (the save is asynchronous):
    # wait for the resume to cut them back, then for it to step past its resume point
    _wait(lambda: "resumed from" in (run / "train.log").read_text(), p)
    _wait(lambda: len(metrics(run, "train")) > n0 + 1, p)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == T.EXIT_PREEMPTED == 75, err[-2000:]
    assert "SIGTERM" in err and not (ck / "final.pt").exists()
    stepped = max(int(x.stem.split("_")[1]) for x in ck.glob("step_*.pt"))
    assert n0 < stepped < 24  # a checkpoint at the step the signal arrived, off the schedule
    assert torch.load(ck / f"step_{stepped}.pt", weights_only=True)["extra"]["step"] == stepped

    # 3. resume to the end (in process): same weights and same metrics as the reference
    T.train(compose(args))
    a, b = weights(ref / "checkpoints" / "final.pt"), weights(ck / "final.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert metrics(run, wall=False) == metrics(ref, wall=False)
    log = (run / "train.log").read_text()
    assert log.count("argv:") == 3 and "resumed from step_" in log


def _poison_forwards(monkeypatch, bad: set[int]) -> None:
    """The n-th training forward (1-based) in `bad` returns a NaN loss."""
    real_build = T.build_model

    def poisoned(mc):
        m = real_build(mc)
        fwd, calls = m.forward, {"n": 0}

        def forward(*a, **k):
            out = fwd(*a, **k)
            if m.training:
                calls["n"] += 1
                if calls["n"] in bad:
                    out.loss = out.loss * float("nan")
            return out

        m.forward = forward
        return m

    monkeypatch.setattr(T, "build_model", poisoned)


def _dcp_state(marker: Path, tmp: Path) -> dict:
    """A sharded step checkpoint's full state ({"model", "optim"}), through DCP's own converter."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp / f"{marker.stem}.full.pt"
    dcp_to_torch_save(marker.with_suffix(".dcp"), out)
    return torch.load(out, weights_only=False)


NAN = [*SYNTH, "train.batch_size=8", f"train.tokens={10 * 8 * 65}"]
"""10 steps of the small synthetic-task model: ten sharded checkpoints in a few seconds."""


def test_k_nan_losses_in_a_row_stop_naming_the_steps_and_keep_the_last_good_checkpoint(
        tmp_path, monkeypatch, capsys):
    """Issue 26: a non-finite step is skipped (no update) and recorded; train.
    max_nonfinite_steps (3) in a row stop the run with exit 1 (divergence) and one line.
    Was: the first NaN stopped the run."""
    _poison_forwards(monkeypatch, {5, 6, 7})
    args = [*NAN, f"paths.results={tmp_path}", "logging.ckpt_every=2",
            "logging.keep_checkpoints=50"]
    assert T.main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("train: error: 3 non-finite steps in a row (steps 5-7, all skipped")
    assert err[-1].endswith("step_6.pt")
    run = run_dir(compose(args))
    ck = run / "checkpoints"
    assert sorted(x.name for x in ck.iterdir()) == [
        "step_2.dcp", "step_2.pt", "step_4.dcp", "step_4.pt", "step_6.dcp", "step_6.pt"]
    # steps 5 and 6 made no update: step_6's weights and AdamW moments are step_4's
    a, b = _dcp_state(ck / "step_4.pt", tmp_path), _dcp_state(ck / "step_6.pt", tmp_path)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    sa, sb = a["optim"]["state"], b["optim"]["state"]
    assert sa and all(torch.equal(sa[i]["exp_avg"], sb[i]["exp_avg"])
                      and float(sa[i]["step"]) == float(sb[i]["step"]) == 4 for i in sa)
    lines = metrics(run, "train")
    assert [r["step"] for r in lines] == [1, 2, 3, 4, 5, 6, 7]
    assert [r["loss"] for r in lines[4:]] == [None, None, None]  # missing, never 0 or NaN
    assert [r.get("nonfinite_steps") for r in lines[4:]] == [[[5, [0]]], [[6, [0]]],
                                                             [[7, [0]]]]


def test_a_nan_loss_skips_that_step_only(tmp_path, monkeypatch):
    """Two NaN steps apart: both skipped and recorded, the run finishes (exit 0)."""
    _poison_forwards(monkeypatch, {3, 5})
    args = [*NAN, f"paths.results={tmp_path}", "logging.ckpt_every=1",
            "logging.keep_checkpoints=50", "logging.log_every=2"]
    assert T.main(args) == 0
    run = run_dir(compose(args))
    lines = metrics(run, "train")
    rec = [(r["step"], r.get("nonfinite_steps"), r.get("skipped_steps")) for r in lines]
    assert rec[:3] == [(2, None, None), (4, [[3, [0]]], 1), (6, [[5, [0]]], 2)]
    ck = run / "checkpoints"
    for s in (3, 5):
        a, b, c = (_dcp_state(ck / f"step_{t}.pt", tmp_path)["model"] for t in (s - 1, s, s + 1))
        assert all(torch.equal(a[k], b[k]) for k in a)  # skipped
        assert not all(torch.equal(b[k], c[k]) for k in a)  # the next step trains
    assert (ck / "final.pt").exists()


# ---------------------------------------------------------------- dry run and budgets
@pytest.mark.parametrize("latent_bits", [0, 8])
def test_dry_run_prints_the_plans_flops_and_writes_nothing(tmp_path, latent_bits, capsys):
    """The plan's FLOPs/token are model.train_flops_per_token's at the run's sequence length
    (tests/test_model.py checks those against torch's FlopCounterMode)."""
    cfg = compose(["model=1M", f"model.latent_bits={latent_bits}", "train.seq_len=64",
                     f"paths.results={tmp_path}"])
    p = plan(cfg)
    assert p.flops_per_token == train_flops_per_token(p.model, 64).total
    assert T.main(["model=1M", f"model.latent_bits={latent_bits}", "train.seq_len=64",
                   f"paths.results={tmp_path}", "train.dry_run=true"]) == 0
    out = capsys.readouterr().out
    assert f"FLOPs/token this run {p.flops_per_token:.4g}" in out
    assert "FT overhead" in out and "paper's 1/L = 25.00%" in out
    assert f"{p.steps:,} steps" in out and "accum 1" in out
    assert "tokens/s (measured: 3 steps of this model" in out  # nothing stated: timed here
    assert not (tmp_path / "runs").exists()  # nothing computed, nothing written


def test_compute_match_flops_gives_the_baseline_the_free_transformers_flops(tmp_path):
    base = ["model=1M", "train.seq_len=64", "train.tokens=1000000", f"paths.results={tmp_path}"]
    ft = plan(compose([*base, "model.latent_bits=16"]))
    bl = plan(compose(base))
    bm = plan(compose([*base, "train.compute_match=flops", "train.match_latent_bits=16"]))
    assert bm.arm == "baseline" and bm.steps > bl.steps == ft.steps
    assert bm.budget_flops == ft.flops  # what the FT really trains for
    assert 0 <= bm.flops - ft.flops < bm.tokens_per_step * bm.flops_per_token
    assert plan(compose([*base, "train.flops=1e12"])).flops >= 1e12


# ---------------------------------------------------------------- config and bad input
def test_every_config_composes_and_run_id_is_content_addressed(tmp_path):
    import model as M

    for preset in M.PRESETS:
        cfg = compose([f"model={preset}", "train.seq_len=128"])
        assert cfg.model.dim == M.PRESETS[preset].dim and cfg.model.preset == preset
    for data in ("stdlib", "synthetic"):
        assert compose([f"data={data}"]).data.source == data
    assert compose(["data=files", "data.paths=[a.txt]"]).data.paths == ["a.txt"]
    hf = compose(["data=hf", "data.hf_sources=[{path:json,weight:2}]"]).data.hf_sources
    assert hf[0].path == "json" and hf[0].weight == 2 and hf[0].field == "text"
    syn = compose(["data=synthetic"])
    assert syn.model.vocab_size == 29 and syn.train.seq_len == 65
    a = compose([f"paths.results={tmp_path}"])
    assert run_id(a) == run_id(compose(["logging.val_every=7", "train.force=true"]))
    assert len(run_id(a)) == 12 and int(run_id(a), 16) >= 0
    assert run_id(a) != run_id(compose(["train.seed=1"]))
    assert run_id(a) != run_id(compose(["model.kappa_bits=0.25"]))
    assert run_dir(a) == tmp_path / "runs" / run_id(a)
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):  # a caller's app
        assert compose(["model=16M"]).model.dim == 384
        assert GlobalHydra.instance().is_initialized()  # restored after compose
    os.environ["FTBENCH_RESULTS"], old = str(tmp_path / "env"), os.environ.get("FTBENCH_RESULTS")
    try:
        assert compose([]).paths.results == str(tmp_path / "env")
    finally:
        if old is None:
            del os.environ["FTBENCH_RESULTS"]
        else:
            os.environ["FTBENCH_RESULTS"] = old


def test_a_second_trainer_on_the_same_run_is_refused(tmp_path, cache, capsys):
    args = ov(tmp_path, cache, "train.tokens=512")
    with flocked(run_dir(compose(args)) / ".lock"):  # as a live job would hold it
        assert T.main(args) == 2
        assert "is being trained by another process" in capsys.readouterr().err
    assert T.main(args) == 0  # released: the run goes ahead


def test_trainer_records_the_launcher_host_and_threads_in_config_provenance(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """config.yaml's provenance holds FTBENCH_LAUNCHER (else "direct"), host and threads: the
    analysis compares wall-clock only when all three agree."""
    import socket
    from types import SimpleNamespace as NS

    from experiments.train.plan import plan

    cfg = compose(["model=1M", "model.vocab_size=512", "train.seq_len=32", "train.tokens=1000"])
    p = plan(cfg)
    monkeypatch.setattr(T, "tokenizer_sha256", lambda tok: "t" * 64)
    corpus = NS(info={}, checksums={}, tokenizer=None)
    for env, want in (("slurm", "slurm"), (None, "direct")):
        if env is None:
            monkeypatch.delenv("FTBENCH_LAUNCHER", raising=False)
        else:
            monkeypatch.setenv("FTBENCH_LAUNCHER", env)
        d = tmp_path / want
        d.mkdir()
        T._write_config(cfg, p, corpus, d, ["train.py"])
        prov = yaml.safe_load((d / "config.yaml").read_text())["provenance"]
        assert prov["launcher"] == want
        assert prov["host"] == socket.gethostname()
        assert prov["threads"] == torch.get_num_threads()
