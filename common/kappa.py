"""The free-bits threshold kappa (bits per token), read and written one way everywhere.
`parse_kappas`: the one parser (decimals or fractions, finite, >= 0, a repeated value is an
error). `kappa_label`: the one label (a decimal of at most two places, else a fraction of
denominator <= 1024, else the shortest decimal), which reads back to the same float.
`kappa_id`: the plain decimal identifiers and hydra overrides keep ("0.015625" for 1/64).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

from .errors import UsageError

MAX_DENOMINATOR = 1024


def parse_kappa(token: str, name: str = "kappa") -> float:
    """One value: '1/64' -> 0.015625, '8' -> 8.0. UsageError naming `name` and the token."""
    tok = str(token).strip()
    try:
        v = float(Fraction(tok)) if "/" in tok else float(tok)
    except (ValueError, ZeroDivisionError, OverflowError):
        raise UsageError(f"{name}: {tok!r} is not a number of bits >= 0 (e.g. 0.5 or 1/64)"
                         ) from None
    if not math.isfinite(v) or v < 0:
        raise UsageError(f"{name}: {tok!r} must be a finite number >= 0 (bits per token)")
    return v


def parse_kappas(text: str | Iterable[Any], name: str = "kappa") -> list[float]:
    """'0.5 2 4', '1/64,1/8' or an iterable of values -> floats in the given order; [] for no
    value (the caller says what an empty list means). UsageError on a bad or repeated value."""
    toks = [t for t in re.split(r"[\s,]+", text.strip()) if t] if isinstance(text, str) \
        else [str(t) for t in text]
    out: list[float] = []
    for tok in toks:
        v = parse_kappa(tok, name)
        if v in out:
            shown = text if isinstance(text, str) else " ".join(toks)
            raise UsageError(f"{name}: {kappa_label(v)} given twice in {shown!r}; give each "
                             "threshold once")
        out.append(v)
    return out


def kappa_label(k: float) -> str:
    """The label of a threshold in bits: 0.5 -> '0.5', 0.015625 -> '1/64', 8.0 -> '8'."""
    k = float(k)
    if not math.isfinite(k):
        return repr(k)
    if k.is_integer():
        return str(int(k))
    short = repr(k)  # the shortest decimal that reads back to k
    if "e" not in short and len(short.partition(".")[2]) <= 2:
        return short
    fr = Fraction(k)  # exact: a float is a dyadic rational
    if fr.denominator <= MAX_DENOMINATOR:
        return f"{fr.numerator}/{fr.denominator}"
    return short


def kappa_id(k: float) -> str:
    """A threshold in identifiers (cell names, hydra overrides): the shortest plain decimal that
    reads back to it: 2.0 -> '2', 0.5 -> '0.5', 1/64 -> '0.015625'."""
    return str(int(k)) if float(k).is_integer() else repr(float(k))
