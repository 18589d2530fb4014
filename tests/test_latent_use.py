"""Decoder-side latent use (experiments/eval/probe.py: issue 38's record, issue 44's states and
the exact-model reference), float32 "identical" paired differences (analysis/stats.py,
analysis/tables.py), and the dirty-tree refusal (pipelines/shared.py).

Each part is checked against an independent computation: the information / marginal-bias split
by enumerating every code with itertools, the rules on hand-set numbers, the committed tables
against their own rendered sentences.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from analysis.stats import F32_ULPS, identical
from common.errors import UsageError
from experiments.eval.probe import (
    DEAD_INFO_BITS,
    DEAD_SHARE,
    USED_SHARE,
    code_marginal_kl,
    exact_model_share,
    latent_use,
)

ROOT = Path(__file__).resolve().parents[1]
LN2 = math.log(2.0)


def _split_by_hand(logits: np.ndarray) -> tuple[float, float, float]:
    """(mean KL to uniform, information, marginal bias) in bits, every code enumerated."""
    o = logits.reshape(-1, logits.shape[-1])
    p1 = 1 / (1 + np.exp(-o))
    H = o.shape[1]
    codes = list(itertools.product((0, 1), repeat=H))
    q = np.array([[np.prod([p1[t, h] if c[h] else 1 - p1[t, h] for h in range(H)])
                   for c in codes] for t in range(len(o))])  # (tokens, 2^H)
    qbar = q.mean(0)
    u = 1 / len(codes)
    kl_u = np.mean([np.sum(qt * np.log(qt / u)) for qt in q]) / LN2
    info = np.mean([np.sum(qt * np.log(qt / qbar)) for qt in q]) / LN2
    bias = np.sum(qbar * np.log(qbar / u)) / LN2
    return kl_u, info, bias


@pytest.mark.parametrize("seed", [0, 1])
def test_information_and_marginal_bias_match_enumeration(seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, 5, 3, generator=g) * 2 + torch.tensor([1.5, -0.5, 0.0])
    got = code_marginal_kl(logits, chunk=3)  # chunks smaller than 2^H: the chunking is tested
    kl_u, info, bias = _split_by_hand(logits.double().numpy())
    assert got["mean_kl_bits"] == pytest.approx(kl_u, rel=1e-9, abs=1e-12)
    assert got["information_bits"] == pytest.approx(info, rel=1e-9, abs=1e-12)
    assert got["marginal_bias_bits"] == pytest.approx(bias, rel=1e-9, abs=1e-12)
    # the identity the split rests on, and the per-bit split's bound (sum_h I_h >= I)
    assert got["information_bits"] + got["marginal_bias_bits"] == pytest.approx(kl_u)
    assert sum(got["per_bit_information_bits"]) >= got["information_bits"] - 1e-12


def test_a_bias_shared_by_every_token_is_not_information():
    logits = torch.full((3, 4, 2), 2.0)  # every token the same: all of the KL is bias
    got = code_marginal_kl(logits)
    assert got["information_bits"] == pytest.approx(0.0, abs=1e-12)
    assert got["marginal_bias_bits"] == pytest.approx(got["mean_kl_bits"])
    assert got["marginal_bias_bits"] > 0.5


def _use(kl_bits, gap, lo, hi, info=0.5):
    prior = 5.0
    return latent_use(kl_bits, 1.0, prior, prior - gap, {"lo": -hi, "hi": -lo},
                      {"information_bits": info, "marginal_bias_bits": kl_bits - info})


def test_latent_states_follow_their_written_rule():
    kl = 1.0  # bits: KL in nats is ln 2
    share = lambda s: s * kl * LN2  # noqa: E731 - a gap in nats recovering share s of the KL
    dead = _use(kl, share(0.004), share(-0.003), share(0.01))
    assert dead["state"] == "dead" and dead["dead"] and not dead["used"]
    assert dead["recovered_share"] == pytest.approx(0.004)
    assert dead["recovered_share_hi"] == pytest.approx(0.01)
    # the upper end of the interval decides, not the point estimate
    assert _use(kl, share(0.004), share(0.0), share(DEAD_SHARE + 0.01))["state"] == \
        "undetermined"
    used = _use(kl, share(0.3), share(0.2), share(0.4))
    assert used["state"] == "used" and used["used"]
    assert _use(kl, share(0.2), share(0.15), share(0.25))["state"] == "undetermined"  # < 0.25
    assert _use(kl, share(0.3), share(0.05), share(0.5))["state"] == "undetermined"  # lo < 0.1
    assert _use(0.05, 0.3 * 0.05 * LN2, 0.2 * 0.05 * LN2, 0.4 * 0.05 * LN2,
                info=0.04)["state"] == "undetermined"  # KL under 0.1 bit
    # an encoder that sends no information is dead whatever the CE says
    assert _use(kl, share(0.3), share(0.2), share(0.4), info=DEAD_INFO_BITS / 2)["state"] == \
        "dead"
    # docs/ALIVE.md's latents (share 1.5-2.1): used, and no state says more from the share
    over = _use(kl, share(1.5), share(1.45), share(1.55))
    assert over["state"] == "used" and "leaking" not in over
    assert str(USED_SHARE) in over["rule"] and "samples" in over["rule"]
    missing = latent_use(1.0, 1.0, None, None, None, {"information_bits": 0.5})
    assert missing["state"] is None and missing["dead"] is None  # missing is never a state


@pytest.mark.parametrize("d", [(0.05, 0.2, 0.45), (0.3, 0.0, 0.1)])
def test_an_exact_latent_model_is_used_with_share_at_least_two(d):
    """A latent model that leaks nothing: x in {0,1}^H uniform, the encoder q(z_h = 1 | x) =
    1/2 + d_h (2 x_h - 1) (aggregate posterior uniform), the decoder Bayes-consistent with it,
    p(x | z) = p(x) q(z | x) / u(z). Every CE is enumerated over all x and z; the share is
    1 + KL(u||q) / KL(q||u) >= 2, which the probe states beside the share
    (`exact_model_share` of the same encoder) and calls used: never leaking."""
    H = len(d)
    xs = list(itertools.product((0, 1), repeat=H))
    p1 = np.array([[0.5 + d[h] * (2 * x[h] - 1) for h in range(H)] for x in xs])  # (|X|, H)
    q = np.array([[np.prod([p1[i, h] if z[h] else 1 - p1[i, h] for h in range(H)])
                   for z in xs] for i in range(len(xs))])  # q(z | x), rows x, columns z
    u, px = 1 / len(xs), 1 / len(xs)
    assert np.allclose(px * q.sum(0), u)  # the aggregate posterior is the prior
    nll = -np.log(px * q / u)  # -log p(x | z)
    ce_prior = np.mean([np.sum(u * nll[i]) for i in range(len(xs))])
    ce_post = np.mean([np.sum(q[i] * nll[i]) for i in range(len(xs))])
    kl_qu = np.mean([np.sum(q[i] * np.log(q[i] / u))
                     for i in range(len(xs))])
    logits = torch.tensor(np.log(p1 / (1 - p1)))[:, None, :]  # (|X| rows, 1 token, H)
    share = (ce_prior - ce_post) / kl_qu
    kl_uq = np.mean([np.sum(u * np.log(u / q[i])) for i in range(len(xs))])
    assert share == pytest.approx(1 + kl_uq / kl_qu, rel=1e-9)
    assert share >= 2
    assert exact_model_share(logits) == pytest.approx(share, rel=1e-9)
    split = code_marginal_kl(logits)
    assert split["mean_kl_bits"] == pytest.approx(kl_qu / LN2, rel=1e-9)
    gap = ce_prior - ce_post
    got = latent_use(kl_qu / LN2, 1.0, ce_prior, ce_post, {"lo": -gap * 1.01, "hi": -gap * 0.99},
                     split, exact_model_share(logits))
    assert got["state"] == "used" and got["recovered_share"] == pytest.approx(share)
    assert got["exact_model_share"] == pytest.approx(share) and "leaking" not in got


def test_identical_is_float32_rounding_in_every_seed():
    scale = 5.3
    ulp = float(np.finfo(np.float32).eps) * scale
    assert identical([0.0, 1.2e-7, -2.4e-7, 0.0], scale)  # the Z-cut's own differences
    assert identical([0.0, 0.0], scale)
    assert not identical([0.0, (F32_ULPS + 1) * ulp], scale)
    assert not identical([0.0], scale)  # one seed says nothing about every seed
    assert not identical([0.0, math.nan], scale)
    # the committed study: the Z-cut control against the baseline reads identical, no p
    t = pd.read_csv(ROOT / "docs" / "study" / "table_tokens.csv")
    z = t[(t["comparison"] == "tokens:baseline:controls") & (t["column"] == "free_zcut")
          & pd.to_numeric(t["delta"], errors="coerce").notna()]
    assert len(z) >= 5 and z["identical"].astype(str).str.lower().eq("true").all()
    assert z["p"].isna().all() and z["delta_lo"].isna().all()
    assert (z["equivalence"] == "identical").all()


def test_committed_study_flags_agree_with_probe_numbers():
    """Every Free Transformer of the committed study carries a decoder-side state that its own
    numbers give under the dead rule (unchanged since its files were written); none is used."""
    lat = pd.read_csv(ROOT / "docs" / "study" / "latent.csv")
    fin = lat[lat["final"].astype(str).str.lower() == "true"]
    ft = fin[fin["arm"] == "free"]
    assert len(ft) == 21 and (ft["latent_state"] == "dead").all()
    for _, r in fin.iterrows():
        hi = r["recovered_share_hi"] if math.isfinite(r["recovered_share_hi"]) else \
            r["recovered_share"]
        assert hi < DEAD_SHARE or r["information_bits"] < DEAD_INFO_BITS
        assert r["recovered_nats"] == pytest.approx(
            r["recovered_share"] * r["kl_bits"] * LN2, rel=1e-9, abs=1e-12)


def test_refuses_to_train_from_uncommitted_source(monkeypatch, tmp_path):
    import pipelines.shared as sh

    monkeypatch.setenv("FTBENCH_RESULTS", str(tmp_path / "r"))
    monkeypatch.delenv(sh.ALLOW_DIRTY_ENV, raising=False)
    monkeypatch.setattr(sh, "dirty_source_diff", lambda: None)
    assert sh.refuse_dirty("study") is None  # clean: nothing to say
    monkeypatch.setattr(sh, "dirty_source_diff", lambda: "abc123def456")
    with pytest.raises(UsageError, match="abc123def456.*--allow-dirty"):
        sh.refuse_dirty("study", name="s", run_ids=["r1"])
    with pytest.raises(SystemExit) as e:
        sh.refuse_dirty("paper", name="s", exit_code=2)
    assert e.value.code == 2
    assert sh.refuse_dirty("study", True, "s", ["r2", "r1"]) == "abc123def456"
    monkeypatch.setenv(sh.ALLOW_DIRTY_ENV, "1")
    assert sh.refuse_dirty("paper", name="s", exit_code=2) == "abc123def456"
    import json

    marks = json.loads((tmp_path / "r" / "sweeps" / "s" / "dirty.json").read_text())
    assert marks[0] == {"diff_sha256": "abc123def456", "run_ids": ["r1", "r2"]}
    assert len(marks) == 2


def test_every_seed_estimand_delta_recomputes_from_per_seed_csv():
    """STUDY.md's promise: any Δ of a validation or bits-per-byte row is the mean over seeds of
    (column - reference) in docs/study/per_seed.csv, to float precision."""
    ps = pd.read_csv(ROOT / "docs" / "study" / "per_seed.csv")
    n = 0
    for name in ("table_tokens.csv", "table_flops.csv"):
        t = pd.read_csv(ROOT / "docs" / "study" / name)
        for _, r in t[pd.to_numeric(t["delta"], errors="coerce").notna()].iterrows():
            if r["task"] != "val" and not str(r["metric"]).endswith("bpb"):
                continue
            sel = ps[(ps["task"] == r["task"]) & (ps["metric"] == r["metric"])]
            a = sel[sel["column"] == r["column"]].set_index("seed")["value"]
            b = sel[sel["column"] == r["reference"]].set_index("seed")["value"]
            assert (a - b).dropna().mean() == pytest.approx(r["delta"], abs=1e-12), \
                (name, r["comparison"], r["column"], r["task"])
            n += 1
    assert n >= 55
