"""The honest likelihood comparison between the arms, from the likelihood files
(experiments/eval/likelihood.py writes them; docs/RESULTS.md): plain arithmetic on their dicts,
no model and no torch, so analysis reads results without importing the code that made them.

`compare_arms` pairs a Free Transformer's record with its seed's baseline record over the same
validation rows: the gap in nats per token per IWAE k, the tightest estimate, and bryanvine's
"KL spend recovered" fraction (`kl_spend_recovered`).
"""

from __future__ import annotations

from typing import Any

from common.arms import BASELINE, FREE


def kl_spend_recovered(ce_baseline: float | None, ce_posterior: float | None,
                       kl_nats: float | None) -> float | None:
    """bryanvine/free-transformer's "recovery rate": the fraction of the KL paid that comes back
    as NLL, (CE_baseline - CE_posterior) / KL, all in nats per token on the same validation set.

    As defined in that replication's research log (paper/RESEARCH_LOG.md, "The recovery-rate
    curve": "fraction of the KL spend the model earns back in posterior-CE, vs the
    params-matched-ish baseline", tabulated as "CE drop / KL spend", e.g. 0.492 / 0.692 = 71% at
    124M, kappa = 1 bit): CE_baseline is the baseline arm's (exact) validation CE, CE_posterior the
    Free Transformer's CE with Z from the encoder, KL its mean KL to the uniform prior per token.
    Equivalently 1 - (ELBO - CE_baseline) / KL with ELBO = CE_posterior + KL: 1 means the latent
    costs nothing on the ELBO, 0 means it costs its whole KL. None (not 0) when an input is
    missing or KL is 0 (a collapsed latent spends nothing, so nothing can be recovered).
    """
    if ce_baseline is None or ce_posterior is None or kl_nats is None or kl_nats <= 0:
        return None
    return (ce_baseline - ce_posterior) / kl_nats


def compare_arms(baseline: dict[str, Any], free: dict[str, Any]) -> dict[str, Any]:
    """Two likelihood records (`validation_likelihood`, same validation rows) -> the comparison.

    "gap_nats_per_token" per k: FT IWAE-k NLL - baseline NLL (an upper bound on the true gap:
    the FT's true NLL is at most its bound). "tightest": the estimate (IWAE at some k, or the
    prior-Z CE) with the lowest NLL and its gap; with a poorly fitted encoder the prior bound can
    be the tighter one. Picking the lowest of a few estimates biases it down by at most a few
    of their standard errors (listed per estimate). "kl_spend_recovered": bryanvine's figure
    (ELBO based). "kl_spend_recovered_iwae": the same with the ELBO replaced by the IWAE NLL at
    the largest k, 1 - (NLL_iwae - CE_baseline) / KL = (CE_baseline - (NLL_iwae - KL)) / KL.
    """
    if baseline.get("arm") != BASELINE.name or free.get("arm") != FREE.name:
        raise ValueError("compare_arms takes (baseline record, free transformer record)")
    if (baseline["n_tokens"], baseline["n_bytes"]) != (free["n_tokens"], free["n_bytes"]):
        raise ValueError("the two records are not over the same validation rows "
                         f"(tokens/bytes {baseline['n_tokens']}/{baseline['n_bytes']} vs "
                         f"{free['n_tokens']}/{free['n_bytes']})")
    base = baseline["nll_nats_per_token"]
    gaps = {k: r["nll_nats_per_token"] - base for k, r in free["iwae"].items()}
    kmax = max(free["iwae"], key=int)
    post = free["posterior"]
    kl = post["kl_nats_per_token"]
    iw = free["iwae"][kmax]["nll_nats_per_token"]
    cands = {f"iwae_k{k}": r["nll_nats_per_token"] for k, r in free["iwae"].items()}
    cands["prior_k1"] = free["prior_k1"]["nll_nats_per_token"]
    best = min(cands, key=cands.__getitem__)
    return {
        "gap_nats_per_token": gaps, "gap_k": int(kmax),
        "tightest": {"estimate": best, "nll_nats_per_token": cands[best],
                     "gap_nats_per_token": cands[best] - base},
        "baseline_bpb": baseline["bpb"],
        "free_bpb": {k: r["bpb"] for k, r in free["iwae"].items()},
        "kl_spend_recovered": kl_spend_recovered(base, post["ce_nats_per_token"], kl),
        "kl_spend_recovered_iwae": kl_spend_recovered(base, iw - kl, kl),
        "kl_nats_per_token": kl, "n_tokens": free["n_tokens"],
    }
