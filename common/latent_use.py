"""The latent-use rule (issue 44), written once: whether a Free Transformer's decoder uses Z, from
the recovered share of the KL. experiments/eval/probe.py measures the share and writes the state;
analysis/study.py re-reads the committed tables with the same rule."""

from __future__ import annotations

import math

USED_SHARE, USED_SHARE_LO, USED_KL_BITS = 0.25, 0.10, 0.1
"""Used: the recovered share at least USED_SHARE, its 95% lower end at least USED_SHARE_LO and the
KL at least USED_KL_BITS bit/token (docs/alive/PREREGISTERED.md's "alive", fixed before its runs;
the kappa study applies the same numbers, docs/alive/kappa/PREREGISTERED.md)."""
DEAD_SHARE = 0.05
"""Dead: the upper end of the recovered share's interval under this, or the encoder sends under
DEAD_INFO_BITS of information. ALIVE's live latents recover 0.35-2.3 of their KL, the committed
study's dead ones under 0.01."""
DEAD_INFO_BITS = 0.01
"""Below this mutual information (bits/token) the encoder's codes do not depend on the text:
nothing is there for the decoder to use (the same 1% of a bit as the probe's active bit)."""
UNDETERMINED = "undetermined"
RULE = (f"dead = the upper end of the recovered share's 95% interval under {DEAD_SHARE}, or "
        f"information under {DEAD_INFO_BITS} bit/token; used = share >= {USED_SHARE}, its lower "
        f"end >= {USED_SHARE_LO:.2f}, KL >= {USED_KL_BITS} bit/token; otherwise {UNDETERMINED}")
"""The rule in words, once: every probe file writes it (`latent_use.rule`) and docs/STUDY.md
states it."""


def use_state(share: float | None, lo: float | None, hi: float | None, kl_bits: float | None,
              info: float | None) -> str | None:
    """`used`, `dead` or `undetermined` by RULE; None when the share is missing (a reader of a
    table shows that as UNDETERMINED); a missing interval end, KL or information (None or NaN)
    never satisfies a rule."""
    def num(x: float | None) -> float:
        return math.nan if x is None else float(x)

    share_, lo_, hi_, kl_, info_ = num(share), num(lo), num(hi), num(kl_bits), num(info)
    if math.isnan(share_):
        return None
    top = hi_ if not math.isnan(hi_) else share_
    if top < DEAD_SHARE or info_ < DEAD_INFO_BITS:  # NaN compares False
        return "dead"
    if share_ >= USED_SHARE and lo_ >= USED_SHARE_LO and kl_ >= USED_KL_BITS:
        return "used"
    return UNDETERMINED
