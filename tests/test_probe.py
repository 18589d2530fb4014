"""The probes (experiments/eval/probe.py) on tiny Free Transformers whose latent is planted.

- `ignores_z`: the post-sampler is zero, so the decoder cannot see Z: every ablation changes
  nothing (to float tolerance) and steering sits exactly at its null.
- `one_bit`: the encoder block's weights are zero, so its output is zeta at every token; zeta
  and the readout are set so that bit 0 has logit logit(p) and every other bit logit 0: the KL
  per bit is ln 2 - H_b(p) nats on bit 0 and 0 elsewhere, with one active bit.
- `uses_z`: a strong post-sampler; the ablations' CE is recomputed through the full forward
  (an independent path) and steering must move.
The CLI runs on a run directory whose data are the synthetic task (character tokens, no
tokenizer to train): a baseline is refused in one line; the same spec again does no work.
"""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path

import pytest
import torch
import yaml

from experiments.eval import probe as P
from experiments.train import synthetic_data as sd
from model import ModelConfig, build_model
from model.checkpoint import save_checkpoint

pytestmark = pytest.mark.usefixtures("one_torch_thread")

V = len(sd.ALPHABET)
CFG = ModelConfig(vocab_size=V, dim=32, n_layers=2, n_heads=2, n_kv_heads=1, ffn_dim=48,
                  max_seq_len=80, latent_bits=4, kappa_bits=0.5, init_std=0.2)
N, T = 6, 24
SMALL = {"draws": 2, "n_boot": 200, "prompts": 3, "prompt_len": 6, "gen_tokens": 5,
         "group_size": 3, "groups": 2, "seed": 7}


def _rows(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.randint(0, V, (N, T + 1), generator=torch.Generator().manual_seed(seed))
    return a[:, :-1], a[:, 1:]


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(CFG).eval()


def _ignores_z() -> torch.nn.Module:
    m = _model()
    with torch.no_grad():
        m.enc_readout.weight.normal_(0, 1.0)  # the encoder still spends KL: Z exists, unused
        m.post_sampler.weight.zero_()
    return m


def _one_bit(p: float) -> torch.nn.Module:
    m = _model()
    with torch.no_grad():
        for w in m.encoder.parameters():
            if w.dim() >= 2:
                w.zero_()  # attention and MLP add 0: the encoder block outputs its query, zeta
        m.zeta.zero_()
        m.zeta[0] = 1.0
        v = m.enc_norm(m.zeta)[0]  # what the readout sees at every token
        m.enc_readout.weight.zero_()
        m.enc_readout.weight[0, 0] = math.log(p / (1 - p)) / v
    return m


def _uses_z() -> torch.nn.Module:
    m = _model(1)
    with torch.no_grad():
        m.post_sampler.weight.normal_(0, 3.0)
        m.enc_readout.weight.normal_(0, 1.0)
    return m


def _steers() -> torch.nn.Module:
    """Z drives the output: block 0 and block 1's MLP add nothing, block 1 attends uniformly
    (zero queries and keys) to value vectors dominated by the post-sampler's columns, with a
    large output projection, and peaked logits (final norm gain x5)."""
    m = _uses_z()
    with torch.no_grad():
        for w in m.blocks[0].parameters():
            if w.dim() >= 2:
                w.zero_()
        for w in m.blocks[1].mlp.parameters():
            w.zero_()
        m.blocks[1].attn.wq.weight.zero_()
        m.blocks[1].attn.wk.weight.zero_()
        m.blocks[1].attn.wo.weight.mul_(10)
        m.norm.weight.mul_(5)
    return m


def _hb(p: float) -> float:
    return -(p * math.log(p) + (1 - p) * math.log(1 - p))


# ------------------------------------------------------------------------ KL
@pytest.mark.parametrize("p", [0.9, 0.3, 0.999])
def test_kl_recovers_a_planted_bit(p: float) -> None:
    m = _one_bit(p)
    x, y = _rows()
    rec = P.probe_model(m, x, y, SMALL)
    kl = rec["kl"]
    want = (math.log(2) - _hb(p)) / math.log(2)  # bits
    assert kl["per_bit_bits"][0] == pytest.approx(want, abs=1e-5)
    assert kl["per_bit_bits"][1:] == pytest.approx([0.0] * (CFG.latent_bits - 1), abs=1e-9)
    assert kl["per_position_bits"] == pytest.approx([want] * T, abs=1e-5)
    assert kl["mean_bits_per_token"] == pytest.approx(want, abs=1e-5)
    assert kl["active_bits"] == [0] and kl["n_active"] == 1
    assert kl["per_bit_p1"][0] == pytest.approx(p, abs=1e-5)
    # every token's KL is `want`: all at or under kappa, or none
    assert kl["frac_tokens_kl_le_kappa"] == (1.0 if want <= CFG.kappa_bits else 0.0)
    assert kl["active_threshold_bits"] == P.ACTIVE_THRESHOLD_BITS


def test_active_threshold_is_strict_and_per_bit() -> None:
    # bit 0 just under the threshold, bit 2 above: computed by hand from the logits
    o = torch.zeros(2, 3, 4, dtype=torch.float64)
    def logit_for(kl_bits: float) -> float:  # invert KL(p) = ln2 - H_b(p) by bisection
        lo, hi = 0.5, 1.0 - 1e-12
        for _ in range(200):
            mid = (lo + hi) / 2
            if (math.log(2) - _hb(mid)) / math.log(2) < kl_bits:
                lo = mid
            else:
                hi = mid
        return math.log(lo / (1 - lo))
    o[..., 0] = logit_for(0.009)
    o[..., 2] = logit_for(0.011)
    kl = P.kl_probe(o, kappa_bits=0.0)
    assert kl["active_bits"] == [2]
    assert kl["per_bit_bits"][0] == pytest.approx(0.009, abs=1e-9)
    assert kl["frac_tokens_kl_le_kappa"] == 0.0
    assert P.kl_probe(torch.zeros(2, 3, 4), 0.0)["frac_tokens_kl_le_kappa"] == 1.0


# ------------------------------------------------------------------------ collapse rule
def test_collapse_rule_both_conditions() -> None:
    ln2 = math.log(2)
    # 4 bits at kappa 0.5 (over budget), the decoder cashes 3 bits of it in: collapse
    c = P.collapse_rule(4.0, 0.5, ce_prior=3.0, ce_posterior=3.0 - 3 * ln2, n_active=8)
    assert c["flag"] is True and c["latent_unused"] is False and "kappa" in c["rule"]
    # over budget but the decoder gains little: the encoder wastes bits, no collapse
    assert P.collapse_rule(4.0, 0.5, 3.0, 3.0 - 0.1, 8)["flag"] is False
    # at the budget with a large gain (what free bits allow): no collapse
    assert P.collapse_rule(0.55, 0.5, 3.0, 2.0, 8)["flag"] is False
    # the margin: kappa 2 needs KL > 3 bits
    assert P.collapse_rule(2.9, 2.0, 5.0, 1.0, 8)["flag"] is False
    assert P.collapse_rule(3.1, 2.0, 5.0, 1.0, 8)["flag"] is True
    # missing CE: missing flag, never False
    assert P.collapse_rule(4.0, 0.5, None, 1.0, 8)["flag"] is None
    assert P.collapse_rule(0.0, 0.5, 3.0, 3.0, 0)["latent_unused"] is True


# ------------------------------------------------------------------------ ablations
def test_decoder_that_ignores_z_every_ablation_is_zero() -> None:
    m = _ignores_z()
    x, y = _rows()
    rec = P.probe_model(m, x, y, SMALL)
    assert rec["kl"]["mean_bits_per_token"] > 0.1  # the encoder spends bits the decoder ignores
    for mode, r in rec["ablations"]["modes"].items():
        d = r["delta_vs_prior"]
        assert d["n"] == N
        for k in ("mean", "lo", "hi"):
            assert abs(d[k]) <= 1e-6, (mode, k, d)
    assert rec["collapse"]["flag"] is False  # KL over budget, but nothing is cashed in
    assert rec["latent_use"]["state"] == "dead"  # the decoder recovers none of the KL
    s = rec["steering"]
    assert s["per_prompt"]["shared_z"] == s["per_prompt"]["independent_z"]
    assert s["difference"]["mean"] == 0.0 and s["difference"]["lo"] == 0.0 \
        and s["difference"]["hi"] == 0.0


def test_ablations_match_an_independent_full_forward() -> None:
    m = _uses_z()
    x, y = _rows(2)
    low = m.forward_lower(x)
    g = torch.Generator().manual_seed(3)
    for mode in ("prior", "fixed_per_sequence", "posterior"):
        codes = P.ablation_codes(mode, low.bit_logits, CFG.latent_bits, g)
        if mode == "fixed_per_sequence":
            assert bool((codes == codes[:, :1]).all())
            assert len(set(codes[:, 0].tolist())) > 1  # rows draw their own code
        got = P.row_ce(m, low.hidden, codes, y, batch_size=4)
        want = torch.stack([m(x[i:i + 1], targets=y[i:i + 1], z=codes[i:i + 1]).ce
                            for i in range(N)]).double()
        assert torch.allclose(got, want, atol=1e-5), mode
    # zeroed: a copy whose post-sampler is zero, through the full forward with any prior Z
    z0 = copy.deepcopy(m)
    with torch.no_grad():
        z0.post_sampler.weight.zero_()
    want = torch.stack([z0(x[i:i + 1], targets=y[i:i + 1], z="prior").ce
                        for i in range(N)]).double()
    w_before = m.post_sampler.weight.clone()
    ces = P.ablation_ces(m, low.hidden, low.bit_logits, y, draws=2, seed=0, batch_size=4)
    assert torch.allclose(ces["zeroed"], want, atol=1e-5)
    assert torch.equal(m.post_sampler.weight, w_before)  # restored
    # a Z the decoder uses: zeroing it or fixing it moves the CE
    rec = P.probe_model(m, x, y, SMALL)
    assert abs(rec["ablations"]["modes"]["zeroed"]["delta_vs_prior"]["mean"]) > 1e-3


def test_latent_zeroed_restores_on_error() -> None:
    m = _uses_z()
    w = m.post_sampler.weight.clone()
    with pytest.raises(RuntimeError), P.latent_zeroed(m):
        assert float(m.post_sampler.weight.detach().abs().sum()) == 0.0
        raise RuntimeError("boom")
    assert torch.equal(m.post_sampler.weight, w)


def test_paired_interval_against_hand_computation() -> None:
    d = torch.tensor([1.0, 2.0, 3.0, 6.0])
    r = P.paired_interval(d, 4000, 0)
    assert r["mean"] == 3.0 and r["n"] == 4
    assert r["se"] == pytest.approx(math.sqrt(((4 + 1 + 0 + 9) / 3) / 4))
    assert 1.0 <= r["lo"] < 3.0 < r["hi"] <= 6.0
    assert P.paired_interval(d, 4000, 0) == r  # seeded
    one = P.paired_interval(torch.tensor([2.0]), 100, 0)
    assert one["lo"] is None and one["se"] is None and "n=1" in one["why_no_interval"]


# ------------------------------------------------------------------------ steering
def test_group_agreement_by_hand() -> None:
    toks = torch.tensor([[1, 2], [1, 3], [1, 4],   # group 0: all agree at 0, none at 1
                         [5, 6], [5, 6], [7, 6]])  # group 1: 1 pair of 3 at 0, all at 1
    a = P.group_agreement(toks, 3)
    assert a.tolist() == [[1.0, 0.0], [pytest.approx(1 / 3), 1.0]]


def test_steering_moves_when_the_decoder_uses_z() -> None:
    m = _steers()
    x, _ = _rows(4)
    s = P.steering_probe(m, x[:6, :6], gen_tokens=6, group_size=4, groups=3, temperature=1.0,
                         seed=0, n_boot=500)
    assert s["difference"]["mean"] > 0.1 and s["difference"]["lo"] > 0
    assert s["effect"]["mean"] == pytest.approx(s["null"]["mean"] + s["difference"]["mean"])
    assert len(s["per_position"]["shared_z"]) == 6


# ------------------------------------------------------------------------ the CLI on run dirs
def _run_dir(root: Path, model: torch.nn.Module, name: str) -> Path:
    rdir = root / "runs" / name
    cfg = {"run_id": name, "arm": "free" if model.cfg.is_free else "baseline",
           "model": model.cfg.to_dict(), "data": {"source": "synthetic", "val_tokens": 650},
           "train": {"seed": 0, "seq_len": sd.SEQ_LEN - 1}}
    rdir.mkdir(parents=True)
    (rdir / "config.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    save_checkpoint(rdir / "checkpoints" / "final.pt", model, extra={"step": 5})
    return rdir


ARGS = ["--rows", "4", "--prompts", "2", "--prompt-len", "4", "--gen-tokens", "3",
        "--group-size", "2", "--groups", "2", "--draws", "1", "--n-boot", "100"]


def test_cli_writes_then_reuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("FTBENCH_CACHE", str(tmp_path / "cache"))
    rdir = _run_dir(tmp_path, _uses_z(), "ft0")
    assert P.main([str(rdir), *ARGS]) == 0
    files = sorted((rdir / "eval").glob("probe.*.json"))
    assert len(files) == 1 and files[0].name.endswith(".step5.json")
    doc = json.loads(files[0].read_text())
    assert doc["spec"]["rows"] == 4 and doc["n_rows"] == 4 and doc["seq_len"] == sd.SEQ_LEN - 1
    assert doc["spec_id"] == files[0].name.split(".")[1]
    assert doc["checkpoint_step"] == 5 and doc["run_id"] == "ft0"
    assert {"git_commit", "host", "argv", "versions", "created"} <= set(doc["provenance"])
    post = doc["ablations"]["modes"]["posterior"]
    assert post["leaks"] is True and post["label"].startswith("LEAKING")
    assert doc["collapse"]["rule"] and doc["kl"]["active_threshold_bits"] == 0.01
    mtime = files[0].stat().st_mtime_ns
    capsys.readouterr()

    def boom(*a: object, **k: object) -> None:
        raise AssertionError("a reused spec must not load the checkpoint")

    monkeypatch.setattr("model.checkpoint.load_checkpoint", boom)
    assert P.main([str(rdir), *ARGS]) == 0
    assert "reused" in capsys.readouterr().out
    assert files[0].stat().st_mtime_ns == mtime
    assert sorted((rdir / "eval").glob("probe.*.json")) == files
    # the checkpoint given as a .pt is the same checkpoint: reused too
    assert P.main([str(rdir / "checkpoints" / "final.pt"), *ARGS]) == 0
    assert "reused" in capsys.readouterr().out
    # another spec is another file
    monkeypatch.undo()
    monkeypatch.setenv("FTBENCH_CACHE", str(tmp_path / "cache"))
    assert P.main([str(rdir), *ARGS, "--seed", "8"]) == 0
    assert len(list((rdir / "eval").glob("probe.*.json"))) == 2
    # a rewritten checkpoint (same step, same spec) is probed again, never reused
    ck = rdir / "checkpoints" / "final.pt"
    os.utime(ck, ns=(ck.stat().st_atime_ns, ck.stat().st_mtime_ns + 10**9))
    capsys.readouterr()
    assert P.main([str(rdir), *ARGS]) == 0
    assert "reused" not in capsys.readouterr().out
    assert json.loads(files[0].read_text())["checkpoint_identity"] != doc["checkpoint_identity"]


def test_non_finite_values_are_written_as_null() -> None:
    rec = P.finite_or_null({"a": math.nan, "b": [1.0, math.inf], "c": {"d": -math.inf}, "e": 2})
    assert rec == {"a": None, "b": [1.0, None], "c": {"d": None}, "e": 2}


# ------------------------------------------------------------------------ analysis/probe.py
def test_analysis_reads_the_file_table_figures_section(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture) -> None:
    from analysis import probe as A

    monkeypatch.setenv("FTBENCH_CACHE", str(tmp_path / "cache"))
    rdir = _run_dir(tmp_path, _uses_z(), "ft2")
    assert P.main([str(rdir), *ARGS]) == 0
    (f,) = A.probe_files([rdir])
    doc = json.loads(f.read_text())
    row = A.probe_table([A.read_probe(f)]).iloc[0]
    assert row["kl_bits"] == doc["kl"]["mean_bits_per_token"]
    assert row["d_zeroed"] == doc["ablations"]["modes"]["zeroed"]["delta_vs_prior"]["mean"]
    assert row["d_posterior_LEAKING"] == \
        doc["ablations"]["modes"]["posterior"]["delta_vs_prior"]["mean"]
    assert row["steer_diff"] == doc["steering"]["difference"]["mean"]
    # a null in the file is missing (NaN), never 0
    doc2 = {**doc, "file": "x", "kl": {**doc["kl"], "mean_bits_per_token": None}}
    assert math.isnan(A.probe_table([doc2]).iloc[0]["kl_bits"])
    # figures beside the file
    assert A.main([str(f)]) == 0
    for name in A.FIGURES:
        png = f.with_name(f"{f.stem}.{name}.png")
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from analysis.latent import latent_section

    # each run's four figures are the ones just written: the section embeds stand-ins
    monkeypatch.setattr(A, "figure_pngs", lambda doc: dict.fromkeys(A.FIGURES, b"png"))
    html = latent_section([rdir], tmp_path / "report")
    assert "LEAKING" in html and html.count("data:image/png;base64,") >= len(A.FIGURES)
    assert (tmp_path / "report" / "probe.csv").is_file()
    assert "no probe files" in latent_section([tmp_path / "empty"])
    # a bad file: one line, exit 2, no figure written for the good one either
    bad = tmp_path / "probe.bad.json"
    bad.write_text("{}")
    for p in f.parent.glob("*.png"):
        p.unlink()
    capsys.readouterr()
    assert A.main([str(f), str(bad)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not list(f.parent.glob("*.png"))


def test_benchmark_reader_skips_probe_files(tmp_path: Path) -> None:
    # analysis.frame reads every eval/*.json of a run as a benchmark file; a probe file is not one
    from analysis.frame import _read_evals
    from common.paths import RunDir

    ev = tmp_path / "runs" / "r" / "eval"
    ev.mkdir(parents=True)
    (ev / "probe.0123456789ab.step5.json").write_text(json.dumps(
        {"schema": P.SCHEMA, "suite": "probe", "spec": {"suite": "probe"}, "spec_id": "x"}))
    warnings: list[str] = []
    assert _read_evals(tmp_path, RunDir(ev.parent), warnings) == [] and warnings == []


def test_a_value_without_an_interval_says_so() -> None:
    """A single-seed (or interval-less) cell must not read like an interval's centre."""
    from analysis import latent, probe

    nan = float("nan")
    assert probe._ci(0.5, nan, nan) == "+0.5 (no interval)"
    assert probe._ci(0.5, 0.25, 0.75) == "+0.5 [+0.25, +0.75]"
    assert latent._ci(0.123, nan, nan, pct=True) == "12.3% (no interval)"
    assert latent._ci(0.123, 0.1, 0.2, pct=True) == "12.3% [10, 20]"
