"""The likelihood bounds against exact enumeration on a tiny Free Transformer.

H=2 bits, 6 tokens: the model runs on 5 positions, so there are 4^5 = 1024 code assignments;
log p(x) = logsumexp_z [log p(x|z) + log p(z)] is computed through the model with pinned codes.
The encoder is first fitted to the exact ELBO (as training would), so it is a good proposal; an
untrained encoder is kept as the adversary (still a bound, not necessarily tighter than the prior).
Monte Carlo claims are checked against the standard error of the mean over repeated draws.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from analysis.likelihood import compare_arms, kl_spend_recovered
from experiments.eval.likelihood import (
    POSTERIOR_LABEL,
    _code_log_q,
    _upper_logp,
    log_likelihood_bound,
    validation_likelihood,
)
from model import ModelConfig, build_model
from model.free_transformer import kl_to_uniform

H, T, B, V = 2, 6, 4, 11
P = T - 1  # positions the model runs on
pytestmark = pytest.mark.usefixtures("one_torch_thread")
CFG = ModelConfig(vocab_size=V, dim=16, n_layers=2, n_heads=2, n_kv_heads=1, ffn_dim=32,
                  max_seq_len=8, latent_bits=H, init_std=0.3)
ALL = torch.cartesian_prod(*[torch.arange(1 << H)] * P)  # (1024, P) every code assignment


def _exact_table(m: torch.nn.Module, tok: torch.Tensor) -> torch.Tensor:
    """(B, 1024) log p(x | z) for every code assignment z."""
    with torch.no_grad():
        x_mid = m.forward_lower(tok[:, :-1]).hidden
        n = len(ALL)
        return torch.stack([_upper_logp(m, x_mid[b:b + 1].expand(n, -1, -1), ALL,
                                        tok[b:b + 1, 1:].expand(n, -1)) for b in range(len(tok))])


def _exact(table: torch.Tensor) -> torch.Tensor:
    return torch.logsumexp(table, 1) - P * H * math.log(2)


@pytest.fixture(scope="module")
def setup() -> dict:
    torch.manual_seed(0)
    m = build_model(CFG).eval()
    with torch.no_grad():
        m.post_sampler.weight.mul_(10)  # make p(x|z) depend strongly on z
    tok = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(3))
    table = _exact_table(m, tok)
    untrained = copy.deepcopy(m)
    # fit the encoder to the exact ELBO = sum_z q(z) [log p(x|z) + log p(z) - log q(z)]
    params = [m.zeta, *m.encoder.parameters(), *m.enc_norm.parameters(),
              *m.enc_readout.parameters()]
    opt = torch.optim.Adam(params, lr=0.05)
    codes = ALL[None].expand(B, -1, -1)
    for _ in range(120):
        bl = m.forward_lower(tok[:, :-1]).bit_logits  # only the encoder's parameters step
        lq = _code_log_q(bl[:, None].expand(B, len(ALL), P, H), codes)
        elbo = (lq.exp() * (table - P * H * math.log(2) - lq)).sum(1)
        opt.zero_grad()
        (-elbo.sum()).backward()
        opt.step()
    return {"m": m, "untrained": untrained, "tok": tok, "exact": _exact(table)}


def _draws(m: torch.nn.Module, tok: torch.Tensor, method: str, k: int, reps: int,
           seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and standard error, per row, of `reps` independent bounds."""
    g = torch.Generator().manual_seed(seed)
    v = log_likelihood_bound(m, tok.repeat(reps, 1), method, k, g).view(reps, -1).double()
    return v.mean(0), v.std(0) / math.sqrt(reps)


def test_exact_by_enumeration_is_consistent(setup: dict) -> None:
    """The enumeration path (forward_lower/_upper_logp) is the model's own forward with pinned
    codes, and the encoder logits are the ones the model's posterior path uses."""
    m, tok = setup["m"], setup["tok"]
    inp, tgt = tok[:, :-1], tok[:, 1:]
    codes = ALL[torch.tensor([0, 77, 500, 1023])]
    with torch.no_grad():
        low = m.forward_lower(inp)
        x_mid, bl = low.hidden, low.bit_logits
        ours = _upper_logp(m, x_mid, codes, tgt)
        ref = m(inp, targets=tgt, z=codes)
        post = m(inp, z="posterior")
    assert torch.allclose(ours.sum() / tgt.numel(), -ref.ce, atol=1e-5)
    assert torch.allclose(kl_to_uniform(bl), post.kl_tokens, atol=1e-6)
    # a model whose Z matters (else the comparisons below say nothing)
    table = _exact_table(m, tok)
    assert float((table.max(1).values - table.min(1).values).min()) > 2.0


@pytest.mark.parametrize("method,k", [("prior", 1), ("prior", 8), ("iwae", 1), ("iwae", 8),
                                      ("iwae", 64)])
def test_bounds_below_exact_in_expectation(setup: dict, method: str, k: int) -> None:
    mean, se = _draws(setup["m"], setup["tok"], method, k, reps=300 if k < 64 else 60, seed=k)
    assert bool((mean <= setup["exact"] + 4 * se + 1e-6).all()), (mean - setup["exact"], se)


def test_iwae_converges_to_exact(setup: dict) -> None:
    gaps, ses = [], []
    for k, reps in ((1, 300), (8, 300), (64, 60), (512, 8)):
        mean, se = _draws(setup["m"], setup["tok"], "iwae", k, reps, seed=100 + k)
        gaps.append(float((mean - setup["exact"]).mean()))
        ses.append(float(se.pow(2).mean().sqrt() / math.sqrt(B)))
    for a, b, sa, sb in zip(gaps, gaps[1:], ses, ses[1:], strict=False):
        assert a < b + 3 * math.hypot(sa, sb), gaps  # tighter (or equal) as k grows
    assert gaps[0] < -0.05  # k=1 is visibly loose here, so convergence means something
    assert abs(gaps[-1]) < max(0.01, 4 * ses[-1]), gaps


@pytest.mark.parametrize("k", [1, 8])
def test_iwae_tighter_than_prior_at_equal_k(setup: dict, k: int) -> None:
    ip, ise = _draws(setup["m"], setup["tok"], "iwae", k, 300, seed=200 + k)
    pp, pse = _draws(setup["m"], setup["tok"], "prior", k, 300, seed=300 + k)
    diff = float((ip - pp).sum())
    se = float((ise.pow(2) + pse.pow(2)).sum().sqrt())
    assert diff > 4 * se, (diff, se)


def test_untrained_encoder_is_still_a_bound(setup: dict) -> None:
    """The adversary: a random encoder is a poor proposal. The IWAE bound stays below log p(x),
    and here it is looser than the prior bound, so 'tighter' is a property of a fitted encoder,
    not of the estimator."""
    m = setup["untrained"]
    mean, se = _draws(m, setup["tok"], "iwae", 8, 300, seed=7)
    exact = _exact(_exact_table(m, setup["tok"]))
    assert bool((mean <= exact + 4 * se + 1e-6).all())
    pmean, _ = _draws(m, setup["tok"], "prior", 8, 300, seed=8)
    assert float(mean.sum()) < float(pmean.sum())


def test_chunking_does_not_change_the_bound(setup: dict) -> None:
    tok = setup["tok"]
    a = log_likelihood_bound(setup["m"], tok, "iwae", 5, torch.Generator().manual_seed(1))
    b = log_likelihood_bound(setup["m"], tok, "iwae", 5, torch.Generator().manual_seed(1),
                             chunk_elems=3 * P * V)  # 3 draw-rows per pass, across draws
    assert torch.allclose(a, b, atol=1e-5)


def test_baseline_is_exact_for_both_methods() -> None:
    torch.manual_seed(1)
    m = build_model(CFG.replace(latent_bits=0)).eval()
    tok = torch.randint(0, V, (3, T))
    with torch.no_grad():
        ce = m(tok[:, :-1], targets=tok[:, 1:]).ce
    for method in ("prior", "iwae"):
        for k in (1, 16):
            v = log_likelihood_bound(m, tok, method, k)
            assert v.shape == (3,)
            assert torch.allclose(v.sum() / (3 * P), -ce, atol=1e-5)


def test_an_unknown_method_and_a_row_past_the_window_are_refused(setup: dict) -> None:
    with pytest.raises(ValueError, match="method must be one of"):
        log_likelihood_bound(setup["m"], setup["tok"], "posterior", 2)
    with pytest.raises(ValueError, match="max_seq_len"):  # the model's own check
        log_likelihood_bound(setup["m"], torch.zeros(2, 20).long(), "iwae", 2)


def test_validation_likelihood_and_compare_arms(setup: dict) -> None:
    seqs = torch.randint(0, V, (5, T), generator=torch.Generator().manual_seed(9))
    vx, vy = seqs[:, :-1], seqs[:, 1:]
    tb = torch.arange(V) % 3 + 1  # 1..3 bytes per token
    nbytes = int(tb[vy].sum())
    base_m = build_model(CFG.replace(latent_bits=0)).eval()
    base = validation_likelihood(base_m, vx, vy, tb, batch_size=2)
    free = validation_likelihood(setup["m"], vx, vy, tb, ks=(1, 8, 64), batch_size=2)
    assert base["exact"] and base["n_bytes"] == nbytes == free["n_bytes"]
    assert base["bpb"] == pytest.approx(base["nll_nats_per_token"] * 5 * P / (math.log(2) * nbytes))
    assert set(free["iwae"]) == {"1", "8", "64"}
    assert free["spread_bpb"] == pytest.approx(free["iwae"]["1"]["bpb"] - free["iwae"]["64"]["bpb"])
    assert free["posterior"]["label"] == POSTERIOR_LABEL and "leaking" in POSTERIOR_LABEL
    # the records are what compare_arms reads (its arithmetic: the test on hand-made dicts)
    assert compare_arms(base, free)["gap_k"] == 64
    with pytest.raises(ValueError, match="same validation rows"):
        compare_arms(base, validation_likelihood(setup["m"], vx[:3], vy[:3], tb, ks=(1,)))
    with pytest.raises(ValueError, match="shifted"):
        validation_likelihood(base_m, vx, vx, tb)


def test_kl_spend_recovered_definition() -> None:
    # bryanvine's 124M kappa=1 row: CE drop 0.492 nats over a KL of 0.692 nats -> 71%
    assert kl_spend_recovered(3.2, 3.2 - 0.492, 0.692) == pytest.approx(0.711, abs=1e-3)
    assert kl_spend_recovered(3.2, 3.0, 0.0) is None  # collapsed latent: undefined, not 0
    assert kl_spend_recovered(None, 3.0, 0.5) is None


REF_CFG = ModelConfig(vocab_size=V, dim=16, n_layers=4, n_heads=2, n_kv_heads=1, ffn_dim=32,
                      max_seq_len=8, latent_bits=3, init_std=0.3)
# log_likelihood_bound on REF_CFG (seed 5, post-sampler x10), tokens from seed 4, draws from
# seed k + 17, chunk_elems=4*6*11; computed by the code before the split forward existed
# (which re-ran the trunk through the model's private names), as float.hex of float32 values.
REF_BOUNDS = {
    "free/prior/1": ('-0x1.3742bc0000000p+4', '-0x1.0fdab20000000p+4', '-0x1.31502e0000000p+4'),
    "free/prior/5": ('-0x1.2d49ee0000000p+4', '-0x1.020d7c0000000p+4', '-0x1.32538e0000000p+4'),
    "free/iwae/1": ('-0x1.4406640000000p+4', '-0x1.082f580000000p+4', '-0x1.2732bc0000000p+4'),
    "free/iwae/5": ('-0x1.38a3f60000000p+4', '-0x1.19d5ec0000000p+4', '-0x1.090acc0000000p+4'),
    "baseline/prior/1": ('-0x1.2333c80000000p+4', '-0x1.0bd0540000000p+4', '-0x1.3ad8c40000000p+4'),
}
# validation_likelihood(ks=(1, 4), batch_size=2, seed=7) on rows from seed 9, the models built
# from seed 5 as they are (no x10), same code.
REF_VALIDATION = {
    "baseline": 2.7452048937479656,
    "iwae_1": 3.071654955546061,
    "iwae_4": 2.779478136698405,
    "prior_k1": 2.7173935890197756,
    "posterior_ce": 2.777476596832275,
    "posterior_kl": 0.1759298284848531,
}


def _ref_model(latent_bits: int, boost: bool = True) -> torch.nn.Module:
    torch.manual_seed(5)
    m = build_model(REF_CFG.replace(latent_bits=latent_bits)).eval()
    if latent_bits and boost:
        with torch.no_grad():
            m.post_sampler.weight.mul_(10)
    return m


def test_bound_values_unchanged_by_the_split_forward() -> None:
    """The bound runs on the model's public split forward now; its values are the ones the
    earlier code (which drove the trunk through private names) gave: bit for bit on the machine
    that recorded them; a few float32 ulps are allowed for other CPUs' kernels."""
    tok = torch.randint(0, V, (3, 7), generator=torch.Generator().manual_seed(4))
    for key, want in REF_BOUNDS.items():
        arm, method, k = key.split("/")
        got = log_likelihood_bound(_ref_model(3 if arm == "free" else 0), tok, method, int(k),
                                   torch.Generator().manual_seed(int(k) + 17),
                                   chunk_elems=4 * 6 * V)
        assert got.dtype == torch.float32
        assert got.double().tolist() == pytest.approx([float.fromhex(h) for h in want],
                                                      rel=1e-6, abs=0), key


def test_validation_values_unchanged_by_the_split_forward() -> None:
    seqs = torch.randint(0, V, (5, 7), generator=torch.Generator().manual_seed(9))
    vx, vy, tb = seqs[:, :-1], seqs[:, 1:], torch.arange(V) % 3 + 1
    kw = dict(ks=(1, 4), batch_size=2, seed=7)
    base = validation_likelihood(_ref_model(0), vx, vy, tb, **kw)
    free = validation_likelihood(_ref_model(3, boost=False), vx, vy, tb, **kw)
    got = {"baseline": base["nll_nats_per_token"],
           "prior_k1": free["prior_k1"]["nll_nats_per_token"],
           "posterior_ce": free["posterior"]["ce_nats_per_token"],
           "posterior_kl": free["posterior"]["kl_nats_per_token"],
           **{f"iwae_{k}": free["iwae"][k]["nll_nats_per_token"] for k in ("1", "4")}}
    assert got == pytest.approx(REF_VALIDATION, rel=1e-6, abs=0)


def test_compare_arms_is_arithmetic_on_the_files_dicts() -> None:
    """analysis.likelihood needs no model: two records as a likelihood file holds them."""
    base = {"arm": "baseline", "n_tokens": 100, "n_bytes": 300, "nll_nats_per_token": 3.0,
            "bpb": 1.0}
    free = {"arm": "free", "n_tokens": 100, "n_bytes": 300,
            "iwae": {"1": {"nll_nats_per_token": 3.4, "bpb": 1.2},
                     "64": {"nll_nats_per_token": 3.1, "bpb": 1.05}},
            "prior_k1": {"nll_nats_per_token": 3.05},
            "posterior": {"ce_nats_per_token": 2.8, "kl_nats_per_token": 0.5}}
    c = compare_arms(base, free)
    assert c["gap_k"] == 64 and c["gap_nats_per_token"] == pytest.approx({"1": 0.4, "64": 0.1})
    assert c["tightest"]["estimate"] == "prior_k1"  # the prior bound can be the tighter one
    assert c["tightest"]["gap_nats_per_token"] == pytest.approx(0.05)
    assert c["kl_spend_recovered"] == pytest.approx((3.0 - 2.8) / 0.5)
    assert c["kl_spend_recovered_iwae"] == pytest.approx((3.0 - (3.1 - 0.5)) / 0.5)
    assert c["free_bpb"] == {"1": 1.2, "64": 1.05} and c["baseline_bpb"] == 1.0
    with pytest.raises(ValueError, match="takes \\(baseline record"):
        compare_arms(free, base)
