"""Does the decoder use Z, and how? `python -m experiments.eval.probe <run dir or .pt>` writes
`<run>/eval/probe.<spec_id>.step<N>.json`: the KL per latent bit and position, latent use (the
decoder's recovered share of the KL, by common.latent_use.RULE), the encoder-side over-budget
flag, Z ablations and steering; docs/PROBE.md says what each measures, its null and how to read
it. Honest: Z never sees the tokens scored, except in the posterior ablation (LEAKING: a
diagnostic, never a score). The lower half of the model runs once per row (`forward_lower`),
only the upper half per draw of Z.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from common import arms
from common.errors import ArgParser, UsageError, cli
from common.latent_use import (
    DEAD_INFO_BITS,
    DEAD_SHARE,
    RULE,
    USED_KL_BITS,
    USED_SHARE,
    USED_SHARE_LO,
    use_state,
)
from common.paths import RunDir
from common.records import spec_id
from model.free_transformer import FreeTransformer, kl_to_uniform, sample_codes, uniform_codes

SCHEMA = "ftbench-probe-v1"
LN2 = math.log(2.0)
ACTIVE_THRESHOLD_BITS = 0.01
"""A latent bit is active when its KL to the uniform prior, averaged over tokens, exceeds this."""
COLLAPSE_MARGIN_FRAC = 0.5
COLLAPSE_MARGIN_MIN_BITS = 0.1
COLLAPSE_RECOVERED_FRAC = 0.5
LATENT_USE_VERSION = 2
"""Written into the spec (so into the file's spec id): a file of an older rule is never reused.
2 (issue 44): no "leaking" state from the share (an exact latent model has share >= 2, see
`exact_model_share`); used/dead by the thresholds above."""
MI_CODE_CHUNK = 4096
"""Codes per chunk of the (tokens x 2^H) code probabilities: H = 16 never builds the whole."""
LEAKING = ("LEAKING: Z from the encoder, which reads the scored tokens; a diagnostic of how much "
           "the decoder can use Z, never a score of the model")
DEFAULTS: dict[str, Any] = {"rows": 16, "seed": 12345, "draws": 4, "n_boot": 2000,
                            "prompts": 8, "prompt_len": 16, "gen_tokens": 16, "group_size": 4,
                            "groups": 4, "temperature": 1.0}


# ------------------------------------------------------------------------ statistics
def paired_interval(d: torch.Tensor, n_boot: int, seed: int,
                    level: float = 0.95) -> dict[str, Any]:
    """Mean of per-unit values d (n,) with its standard error and a seeded percentile
    bootstrap interval over the units. n < 2: no interval (null, with the reason)."""
    d = d.double().cpu()
    n = int(d.numel())
    out: dict[str, Any] = {"mean": float(d.mean()) if n else None, "n": n,
                           "se": None, "lo": None, "hi": None}
    if n < 2:
        out["why_no_interval"] = f"n={n}: an interval needs at least 2 units"
        return out
    out["se"] = float(d.std() / math.sqrt(n))
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, n, (n_boot, n), generator=g)
    means = d[idx].mean(1)
    a = (1.0 - level) / 2
    out["lo"], out["hi"] = (float(torch.quantile(means, a)), float(torch.quantile(means, 1 - a)))
    return out


# ------------------------------------------------------------------------ KL
def kl_probe(bit_logits: torch.Tensor, kappa_bits: float,
             threshold_bits: float = ACTIVE_THRESHOLD_BITS) -> dict[str, Any]:
    """Encoder bit logits (N, T, H) -> KL to the uniform prior, in bits: per bit (mean over
    tokens), per position (summed over bits, mean over rows), active bits, and the share of
    tokens whose KL is at or under kappa."""
    o = bit_logits.double()
    per = kl_to_uniform(o.unsqueeze(-1)) / LN2  # (N, T, H): the bits are independent under q
    tok = per.sum(-1)  # (N, T) KL per token
    per_bit = per.mean((0, 1))
    active = [h for h, v in enumerate(per_bit.tolist()) if v > threshold_bits]
    row = tok.mean(1)
    return {
        "unit": "bits",
        "mean_bits_per_token": float(tok.mean()),
        "se_over_rows": float(row.std() / math.sqrt(len(row))) if len(row) > 1 else None,
        "per_bit_bits": per_bit.tolist(),
        "per_bit_p1": torch.sigmoid(o).mean((0, 1)).tolist(),
        "per_position_bits": tok.mean(0).tolist(),
        "active_threshold_bits": threshold_bits,
        "active_rule": f"bit h is active when its KL, averaged over all tokens, exceeds "
                       f"{threshold_bits} bit",
        "active_bits": active,
        "n_active": len(active),
        "kappa_bits": kappa_bits,
        "frac_tokens_kl_le_kappa": float((tok <= kappa_bits).double().mean()),
        "encoder_reads": "the whole row (as in training): these are the posterior's KLs",
    }


def collapse_rule(kl_bits: float, kappa_bits: float, ce_prior: float | None,
                  ce_posterior: float | None, n_active: int) -> dict[str, Any]:
    """The encoder-side over-budget flag (the paper's collapse signature at kappa = 4 bits), by
    the rule the record states; missing CE gives a missing flag, never False."""
    margin = max(COLLAPSE_MARGIN_FRAC * kappa_bits, COLLAPSE_MARGIN_MIN_BITS)
    gap = None if ce_prior is None or ce_posterior is None else ce_prior - ce_posterior
    over = kl_bits > kappa_bits + margin
    cashed = None if gap is None else gap > COLLAPSE_RECOVERED_FRAC * kl_bits * LN2
    flag = None if cashed is None else bool(over and cashed)
    return {
        "flag": flag, "latent_unused": n_active == 0,
        "kind": "KL over its budget and cashed in by the decoder (encoder side; whether prior "
                "generation breaks is judged from samples only)",
        "rule": (f"over budget when mean KL > kappa + max({COLLAPSE_MARGIN_FRAC} x kappa, "
                 f"{COLLAPSE_MARGIN_MIN_BITS} bit) AND CE_prior - CE_posterior > "
                 f"{COLLAPSE_RECOVERED_FRAC} x mean KL (nats); latent_unused when no bit is "
                 "active"),
        "kl_bits": kl_bits, "kappa_bits": kappa_bits, "margin_bits": margin,
        "kl_over_budget": bool(over), "ce_gap_prior_minus_posterior_nats": gap,
        "gap_over_kl": None if gap is None or kl_bits <= 0 else gap / (kl_bits * LN2),
    }


def exact_model_share(bit_logits: torch.Tensor) -> float | None:
    """The recovered share an exact latent model with this encoder would have: its decoder
    Bayes-consistent with the encoder (p(x|z) = p(x) q(z|x) / u(z), aggregate posterior uniform)
    gives CE_prior = -log p(x) + KL(u||q) and CE_posterior = -log p(x) - KL(q||u), so

        share = 1 + E KL(u||q) / E KL(q||u)   (>= 2 for Bernoulli bits, term by term)

    over the probed tokens (both KLs add over independent bits). None when KL(q||u) is 0.
    docs/alive/kappa/PREREGISTERED.md derives it; a share above 1 is what a model that leaks
    nothing gives, so the share alone never says "leaking"."""
    o = bit_logits.double()
    lp1, lp0 = F.logsigmoid(o), F.logsigmoid(-o)
    kl_qu = (torch.sigmoid(o) * lp1 + torch.sigmoid(-o) * lp0 + LN2).sum(-1).mean()
    kl_uq = (-LN2 - 0.5 * (lp1 + lp0)).sum(-1).mean()
    return None if float(kl_qu) <= 0 else 1.0 + float(kl_uq) / float(kl_qu)


# ------------------------------------------------------------------------ latent use
@torch.no_grad()
def code_marginal_kl(bit_logits: torch.Tensor, chunk: int = MI_CODE_CHUNK) -> dict[str, Any]:
    """Encoder bit logits (N, T, H) -> the mean code distribution q_bar(d) = mean over tokens of
    q(d | token) over all 2^H codes, and its KL to the uniform prior, in bits, with the KL split
    into information and marginal bias:

        mean_t KL(q_t || u) = mean_t KL(q_t || q_bar) + KL(q_bar || u)
                            =  I(Z; token)           +  marginal bias

    I is the mutual information between a token's code and which token it is (its text), over
    the probed tokens (a plug-in estimate: at most log2 of the number of tokens). A bit biased
    the same way on every token pays KL to the uniform prior but carries no information; the
    decoder can only use I. The per-bit split (independent bits, q_bar's bit marginals) is given
    beside it: sum_h I_h >= I because the joint q_bar may correlate bits."""
    o = bit_logits.double().flatten(0, 1)  # (M, H)
    M, H = o.shape
    lp1, lp0 = F.logsigmoid(o), F.logsigmoid(-o)  # log p(bit = 1), log p(bit = 0)
    qbar = torch.empty(2 ** H, dtype=torch.float64)
    shifts = torch.arange(H)
    for s in range(0, 2 ** H, chunk):  # the code d's bit h is (d >> h) & 1, as the mapper reads it
        d = torch.arange(s, min(s + chunk, 2 ** H))
        bits = ((d[:, None] >> shifts) & 1).double()  # (C, H)
        logq = lp1.to("cpu") @ bits.T + lp0.to("cpu") @ (1 - bits).T  # (M, C)
        qbar[s:s + len(d)] = logq.exp().mean(0)
    qbar = qbar / qbar.sum()  # float rounding only: each row of q sums to 1
    nz = qbar > 0
    bias = float((qbar[nz] * (qbar[nz].log() + H * LN2)).sum()) / LN2
    per = kl_to_uniform(o.unsqueeze(-1)) / LN2  # (M, H)
    mean_kl = float(per.sum(-1).mean())
    p1 = torch.sigmoid(o).mean(0)
    hb = -(p1 * p1.clamp_min(1e-300).log() + (1 - p1) * (1 - p1).clamp_min(1e-300).log())
    bias_bit = (1.0 - hb / LN2).clamp_min(0.0)
    info_bit = per.mean(0) - bias_bit
    return {"unit": "bits per token", "mean_kl_bits": mean_kl,
            "information_bits": max(0.0, mean_kl - bias), "marginal_bias_bits": bias,
            "per_bit_information_bits": info_bit.tolist(),
            "per_bit_marginal_bias_bits": bias_bit.tolist(),
            "n_tokens": M, "max_information_bits": math.log2(M) if M else None,
            "what": "mean KL(q_t || uniform) = I(Z; token) + KL(q_bar || uniform), q_bar the "
                    "mean code distribution over the probed tokens (all 2^H codes)"}


def latent_use(kl_bits: float, kappa_bits: float, ce_prior: float | None,
               ce_posterior: float | None, posterior_delta: dict[str, Any] | None,
               split: dict[str, Any], exact_share: float | None = None) -> dict[str, Any]:
    """Latent use measured on the decoder's side: the recovered share of the KL (its interval
    from the posterior ablation's bootstrap over rows), its state by common.latent_use and the
    rule in words (`rule_text`); missing CE gives null, never a state."""
    kl_nats = kl_bits * LN2
    gap = None if ce_prior is None or ce_posterior is None else ce_prior - ce_posterior
    share = None if gap is None or kl_nats <= 0 else gap / kl_nats
    pd_ = posterior_delta or {}
    lo = hi = None
    if kl_nats > 0 and pd_.get("lo") is not None and pd_.get("hi") is not None:
        lo, hi = -float(pd_["hi"]) / kl_nats, -float(pd_["lo"]) / kl_nats
    info = split.get("information_bits")
    state = use_state(share, lo, hi, kl_bits, info)
    return {
        "recovered_share": share, "recovered_share_lo": lo, "recovered_share_hi": hi,
        "recovered_nats_per_token": gap, "kl_nats_per_token": kl_nats,
        "kappa_bits": kappa_bits, **{k: split.get(k) for k in
                                     ("information_bits", "marginal_bias_bits",
                                      "max_information_bits")},
        "recovered_over_information": None if gap is None or not info else gap / (info * LN2),
        "exact_model_share": exact_share,
        "state": state, "dead": None if state is None else state == "dead",
        "used": None if state is None else state == "used",
        "rule": rule_text(), "split": split,
    }


def rule_text() -> str:
    """The state rule as every probe file writes it (`latent_use.rule`): common.latent_use.RULE
    with the share's definition and the exact-model reference."""
    return (f"recovered_share = (CE_prior - CE_posterior) / KL (nats/token; interval from the "
            f"posterior ablation's bootstrap over rows). {RULE}. Reference: an exact latent "
            "model (decoder Bayes-consistent with the encoder, aggregate posterior uniform) has "
            "share 1 + KL(u||q)/KL(q||u) >= 2 (exact_model_share: this encoder's), so a share "
            "above 1 is no sign of leaking; whether prior generation breaks is judged from "
            f"samples only (experiments/eval/samples.py). Rule version {LATENT_USE_VERSION}.")


# ------------------------------------------------------------------------ ablations
@contextlib.contextmanager
def latent_zeroed(m: FreeTransformer) -> Iterator[FreeTransformer]:
    """The post-sampler's output replaced by 0: every code adds a zero vector to block L/2's
    key/value input (x + 0 = x). The weight is restored on exit, whatever happens."""
    w = m.post_sampler.weight
    saved = w.detach().clone()
    try:
        with torch.no_grad():
            w.zero_()
        yield m
    finally:
        with torch.no_grad():
            w.copy_(saved)


def row_ce(m: FreeTransformer, hidden: torch.Tensor, codes: torch.Tensor,
           targets: torch.Tensor, batch_size: int = 8) -> torch.Tensor:
    """Upper half from pinned codes -> (N,) cross-entropy per row, nats per token."""
    out = []
    for s in range(0, len(hidden), batch_size):
        tg = targets[s:s + batch_size]
        # the readout over chunks of tokens: no (rows, T, V) logits (model/readout.py)
        ce = -m.score_upper(hidden[s:s + batch_size], tg, codes[s:s + batch_size]).logprob
        out.append(ce.mean(1))
    return torch.cat(out).double().cpu()


def ablation_codes(mode: str, bit_logits: torch.Tensor, H: int,
                   g: torch.Generator) -> torch.Tensor:
    """(N, T) codes of one draw. prior: uniform per token; fixed_per_sequence: one uniform code
    per row at every position; posterior: sampled from the encoder's bits (LEAKING); zeroed:
    any codes (the post-sampler is zeroed), uniform ones."""
    N, T = bit_logits.shape[:2]
    dev = bit_logits.device
    if mode in ("prior", "zeroed"):
        return uniform_codes((N, T), H, g, dev)
    if mode == "fixed_per_sequence":
        return uniform_codes((N, 1), H, g, dev).expand(N, T).contiguous()
    if mode == "posterior":
        return sample_codes(bit_logits, g)
    raise ValueError(f"unknown ablation mode {mode!r}")


ABLATIONS = {
    "fixed_per_sequence": "one uniform code per sequence, the same at every position (honest)",
    "zeroed": "the post-sampler's output replaced by 0 in block L/2's key/value input "
              "(honest; an input the decoder never saw in training)",
    "posterior": LEAKING,
}


@torch.no_grad()
def ablation_ces(m: FreeTransformer, hidden: torch.Tensor, bit_logits: torch.Tensor,
                 targets: torch.Tensor, draws: int, seed: int,
                 batch_size: int = 8) -> dict[str, torch.Tensor]:
    """{mode: (N,) CE per row, nats per token, averaged over `draws` draws of Z} for the prior
    and every ablation (zeroed is deterministic: one pass)."""
    H = m.cfg.latent_bits
    g = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for mode in ("prior", "fixed_per_sequence", "posterior"):
        out[mode] = torch.stack([row_ce(m, hidden, ablation_codes(mode, bit_logits, H, g),
                                        targets, batch_size) for _ in range(draws)]).mean(0)
    with latent_zeroed(m):
        out["zeroed"] = row_ce(m, hidden, ablation_codes("zeroed", bit_logits, H, g), targets,
                               batch_size)
    return out


def ablation_summary(ces: dict[str, torch.Tensor], n_boot: int, seed: int,
                     draws: int) -> dict[str, Any]:
    prior = ces["prior"]
    modes = {}
    for i, (mode, what) in enumerate(ABLATIONS.items()):
        d = paired_interval(ces[mode] - prior, n_boot, seed + 1000 + i)
        modes[mode] = {"what": what, "ce_nats_per_token": float(ces[mode].mean()),
                       "delta_vs_prior": d, "leaks": mode == "posterior",
                       **({"label": LEAKING} if mode == "posterior" else {}),
                       "draws": 1 if mode == "zeroed" else draws}
    return {"unit": "nats per token", "reference": "prior: a fresh uniform code per token "
            "(the model as specified), averaged over the draws",
            "prior_ce_nats_per_token": float(prior.mean()), "draws": draws,
            "interval": f"95% percentile bootstrap over rows ({n_boot} resamples, seeded), "
                        "paired: each row's CE under the ablation minus its CE under the prior",
            "modes": modes, "per_row": {k: v.tolist() for k, v in ces.items()}}


# ------------------------------------------------------------------------ steering
def group_agreement(tokens: torch.Tensor, group_size: int) -> torch.Tensor:
    """(M x G, L) generated tokens, G consecutive rows per group -> (M, L): per group and
    position, the share of the G(G-1) ordered pairs of samples holding the same token."""
    ML, L = tokens.shape
    G = group_size
    t = tokens.view(ML // G, G, L)
    same = (t[:, :, None, :] == t[:, None, :, :]).double().sum((1, 2)) - G  # drop a == b
    return same / (G * (G - 1))


@torch.no_grad()
def steering_probe(m: FreeTransformer, prompts: torch.Tensor, gen_tokens: int, group_size: int,
                   groups: int, temperature: float, seed: int, n_boot: int) -> dict[str, Any]:
    """prompts (P, Lp) -> the steering record (group_size >= 2: probe_run checks it)."""
    H = m.cfg.latent_bits
    n_p, Lp = prompts.shape
    B = groups * group_size
    gc = torch.Generator().manual_seed(seed)
    fixed, indep = [], []
    for i in range(n_p):
        p = prompts[i:i + 1].to(m.device)
        bl = m.forward_lower(p).bit_logits  # the encoder reads the prompt only
        # shared: one prompt draw + one new-token code sequence per group, repeated G times
        shared = torch.cat([sample_codes(bl.expand(groups, Lp, H), gc),
                            uniform_codes((groups, gen_tokens), H, gc, m.device)], 1)
        shared = shared.repeat_interleave(group_size, 0)
        own = torch.cat([sample_codes(bl.expand(B, Lp, H), gc),
                         uniform_codes((B, gen_tokens), H, gc, m.device)], 1)
        res = []
        for codes in (shared, own):
            gt = torch.Generator().manual_seed(seed * 7919 + i)  # the same stream in both
            gen = m.generate(p.expand(B, Lp), gen_tokens, temperature=temperature, z=codes,
                             generator=gt)
            res.append(group_agreement(torch.tensor(gen.tokens, dtype=torch.long), group_size))
        fixed.append(res[0])
        indep.append(res[1])
    fx, nd = torch.stack(fixed), torch.stack(indep)  # (P, M, L)
    fp, np_ = fx.mean((1, 2)), nd.mean((1, 2))  # per prompt
    return {
        "metric": "within-group agreement: per group and generated position, the share of "
                  "pairs of samples holding the same token; averaged over positions, groups, "
                  "then prompts",
        "effect": paired_interval(fp, n_boot, seed + 1),
        "null": paired_interval(np_, n_boot, seed + 2),
        "difference": paired_interval(fp - np_, n_boot, seed + 3),
        "per_position": {"shared_z": fx.mean((0, 1)).tolist(),
                         "independent_z": nd.mean((0, 1)).tolist()},
        "per_prompt": {"shared_z": fp.tolist(), "independent_z": np_.tolist()},
        "n_prompts": n_p, "prompt_len": Lp, "gen_tokens": gen_tokens,
        "group_size": group_size, "groups_per_condition": groups, "temperature": temperature,
        "interval": f"95% percentile bootstrap over prompts ({n_boot} resamples, seeded)",
        "z_shared": "per group: the prompt's codes drawn once from the encoder (which reads "
                    "the prompt only) and one uniform code per new position, the same for the "
                    "group's samples",
        "z_independent": "per sample: its own encoder draw for the prompt and its own uniform "
                         "codes",
        "sampling": "token sampling from one seeded stream per prompt, the same in both "
                    "conditions (common random numbers)",
    }


# ------------------------------------------------------------------------ all probes
@torch.no_grad()
def probe_model(model: torch.nn.Module, val_x: torch.Tensor, val_y: torch.Tensor,
                opts: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every probe on a Free Transformer and validation rows (N, T) -> the record (no I/O).
    opts: DEFAULTS' keys (rows is ignored here: the caller slices the rows); probe_run has
    checked them and refused a baseline."""
    o = {**DEFAULTS, **(opts or {})}
    m = getattr(model, "module", model)
    if val_x.shape != val_y.shape or val_x.dim() != 2:
        raise ValueError("val_x and val_y must both be (N, T)")
    was = m.training
    m.eval()
    try:
        bs, seed = 8, int(o["seed"])
        clock = [time.perf_counter()]
        timings: dict[str, float] = {}

        def lap(name: str) -> None:
            clock.append(time.perf_counter())
            timings[name] = round(clock[-1] - clock[-2], 3)

        x, y = val_x.to(m.device), val_y.to(m.device)
        lows = [m.forward_lower(x[s:s + bs]) for s in range(0, len(x), bs)]
        hidden = torch.cat([lw.hidden for lw in lows])
        bit_logits = torch.cat([lw.bit_logits for lw in lows])
        kappa = float(m.cfg.kappa_bits)
        kl = kl_probe(bit_logits, kappa)
        lap("lower_half_and_kl_s")
        ces = ablation_ces(m, hidden, bit_logits, y, int(o["draws"]), seed, bs)
        lap("ablations_s")
        abl = ablation_summary(ces, int(o["n_boot"]), seed, int(o["draws"]))
        coll = collapse_rule(kl["mean_bits_per_token"], kappa, abl["prior_ce_nats_per_token"],
                             abl["modes"]["posterior"]["ce_nats_per_token"], kl["n_active"])
        use = latent_use(kl["mean_bits_per_token"], kappa, abl["prior_ce_nats_per_token"],
                         abl["modes"]["posterior"]["ce_nats_per_token"],
                         abl["modes"]["posterior"]["delta_vs_prior"],
                         code_marginal_kl(bit_logits), exact_model_share(bit_logits))
        n_p, lp = int(o["prompts"]), int(o["prompt_len"])
        steer = steering_probe(m, val_x[:n_p, :lp], int(o["gen_tokens"]), int(o["group_size"]),
                               int(o["groups"]), float(o["temperature"]), seed,
                               int(o["n_boot"]))
        lap("steering_s")
        return {"arm": arms.of_model(m.cfg.latent_bits).name, "latent_bits": m.cfg.latent_bits,
                "z_cut": bool(getattr(m.cfg, "z_cut", False)),  # the Z-cut control: Z * 0
                "kappa_bits": kappa, "n_rows": int(val_x.shape[0]),
                "seq_len": int(val_x.shape[1]), "n_tokens": int(val_y.numel()),
                "kl": kl, "collapse": coll, "latent_use": use, "ablations": abl,
                "steering": steer,
                "timings": timings}
    finally:
        m.train(was)


# ------------------------------------------------------------------------ files
def spec_of(o: dict[str, Any]) -> dict[str, Any]:
    """What the probe did (its hash names the file); same spec on the same checkpoint = reuse."""
    return {"suite": "probe", **{k: o[k] for k in DEFAULTS},
            "active_threshold_bits": ACTIVE_THRESHOLD_BITS,
            "collapse": [COLLAPSE_MARGIN_FRAC, COLLAPSE_MARGIN_MIN_BITS, COLLAPSE_RECOVERED_FRAC],
            "latent_use": [LATENT_USE_VERSION, USED_SHARE, USED_SHARE_LO, USED_KL_BITS,
                           DEAD_SHARE, DEAD_INFO_BITS],
            "rows_source": "corpus validation rows (val_x, val_y), the first `rows`; prompts: "
                           "the first `prompt_len` tokens of the first `prompts` of them"}


def probe_file(out_dir: Path, spec: dict[str, Any], step: int | None) -> Path:
    """<out dir>/probe.<spec_id>.step<N>.json (stepNA when the checkpoint records no step)."""
    return out_dir / f"probe.{spec_id(spec)}.step{step if step is not None else 'NA'}.json"


def finite_or_null(obj: Any) -> Any:
    """The record with every non-finite float as None: JSON has no NaN, and missing is null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_null(v) for v in obj]
    return obj


def _check_opts(o: dict[str, Any]) -> None:
    if not isinstance(o["seed"], int) or isinstance(o["seed"], bool) or o["seed"] < 0:
        raise UsageError(f"--seed: {o['seed']!r} must be an integer >= 0")
    for k in ("rows", "draws", "n_boot", "prompts", "prompt_len", "gen_tokens", "groups"):
        v = o[k]
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise UsageError(f"--{k.replace('_', '-')}: {v!r} must be an integer >= 1")
    if not isinstance(o["group_size"], int) or o["group_size"] < 2:
        raise UsageError(f"--group-size: {o['group_size']!r} must be an integer >= 2 (agreement "
                         "needs pairs)")
    t = o["temperature"]
    if not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
        raise UsageError(f"--temperature: {t!r} must be a finite number > 0 (0 is greedy: Z "
                         "could only act through the argmax)")
    if o["prompts"] > o["rows"]:
        raise UsageError(f"--prompts: {o['prompts']} exceeds --rows {o['rows']} (prompts are "
                         "prefixes of the probed rows)")


def _reusable(path: Path, sid: str, ident: str) -> bool:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("spec_id") == sid \
        and doc.get("checkpoint_identity") == ident


def probe_run(run: RunDir | str | Path, opts: dict[str, Any] | None = None,
              out_dir: Path | None = None, device: str | None = None) -> tuple[Path, bool]:
    """Probe a run's final checkpoint (or the .pt it was given as: `RunDir.at`) -> (file,
    reused). Raises UsageError on bad input."""
    from common.io import atomic_write_text, unwritable
    from common.provenance import git_state, loadavg, peak_rss_mb, versions
    from experiments.eval.likelihood import open_run, run_corpus
    from experiments.eval.run import ckpt_identity, resolve_device
    from model.checkpoint import CheckpointError, load_checkpoint

    o = {**DEFAULTS, **(opts or {})}
    _check_opts(o)
    run, ck, rec = open_run(run)
    if not rec.model:
        raise UsageError(f"{run.record_path} has no model section: not a run's config")
    if not arms.of_model(rec.latent_bits).latent:
        raise UsageError(f"{run.run_id} is a baseline (latent_bits=0): the probes measure a "
                         "Free Transformer's latent Z; give a Free Transformer run")
    out_dir = Path(out_dir) if out_dir is not None else run.eval_dir
    bad = unwritable(out_dir)
    if bad is not None:
        raise UsageError(f"--out: {bad}")
    ident = ckpt_identity(ck)
    spec = spec_of(o)
    sid = spec_id(spec)
    # the step is read cheaply from an existing file of this spec: reuse loads nothing
    for old in sorted(out_dir.glob(f"probe.{sid}.step*.json")):
        if _reusable(old, sid, ident):
            return old, True
    try:
        loaded = load_checkpoint(ck)
    except CheckpointError as e:
        raise UsageError(str(e)) from None
    step = loaded.extra.get("step")
    step = int(step) if isinstance(step, int) else None
    dev = resolve_device(device)
    model = loaded.model.to(dev)
    corpus = run_corpus(run, rec)
    n_avail, T = corpus.val_x.shape
    if o["rows"] > n_avail:
        raise UsageError(f"--rows: {o['rows']} exceeds the run's {n_avail} validation rows")
    if o["prompt_len"] >= T or o["prompt_len"] + o["gen_tokens"] > model.cfg.max_seq_len:
        raise UsageError(f"--prompt-len {o['prompt_len']} + --gen-tokens {o['gen_tokens']}: the "
                         f"prompt must be shorter than a row ({T}) and both must fit the "
                         f"window ({model.cfg.max_seq_len})")
    t0, load0 = time.time(), loadavg()  # a wall time means something only at a known load
    rec = probe_model(model, corpus.val_x[:o["rows"]], corpus.val_y[:o["rows"]], o)
    commit, dirty = git_state()
    doc = {"schema": SCHEMA, "suite": "probe", "spec": spec, "spec_id": sid,
           "run_id": run.run_id, "checkpoint": str(ck), "checkpoint_step": step,
           "checkpoint_identity": ident, **rec,
           "elapsed_s": round(time.time() - t0, 2),
           "provenance": {"git_commit": commit, "git_dirty": dirty,
                          "host": socket.gethostname(), "argv": sys.argv,
                          "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                          "versions": versions("torch"), "threads": torch.get_num_threads(),
                          "device": dev, "cpu_count": os.cpu_count(),
                          "loadavg_start": load0, "loadavg_end": loadavg(),
                          "n_params": sum(p.numel() for p in model.parameters()),
                          "peak_rss_mb": peak_rss_mb()}}
    path = probe_file(out_dir, spec, step)
    atomic_write_text(path, json.dumps(finite_or_null(doc), indent=1, sort_keys=True,
                                       allow_nan=False) + "\n")
    return path, False



def _main(argv: Sequence[str] | None) -> int:
    ap = ArgParser(
        prog="python -m experiments.eval.probe",
        description="Does the decoder use Z? KL per bit and position, Z ablations, steering -> "
                    "<run>/eval/probe.<spec_id>.step<N>.json (docs/PROBE.md)")
    ap.add_argument("run", help="run dir (its final checkpoint) or a checkpoint .pt in it")
    helps = {"rows": "validation rows probed (the first N)",
             "draws": "draws of Z per row for the prior, fixed and posterior CE",
             "groups": "groups per prompt and condition"}
    for k, v in DEFAULTS.items():  # every option of the spec, typed as its default
        ap.add_argument(f"--{k.replace('_', '-')}", type=type(v), default=v, help=helps.get(k))
    ap.add_argument("--out", default=None, help="directory for the file (default <run>/eval)")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    a = ap.parse_args(argv)
    path, reused = probe_run(a.run, {k: getattr(a, k) for k in DEFAULTS},
                             Path(a.out) if a.out else None, a.device)
    print(f"probe: {'reused (same spec, same checkpoint) ' if reused else ''}{path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return cli("probe", lambda: _main(argv))


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    raise SystemExit(main())
