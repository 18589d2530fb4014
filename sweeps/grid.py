"""The grid: the typed values of a sweep (SweepSpec), checked, expanded into cells, and the
guard that the arms share every setting but their own.

Each arm makes its own cells (common.arms: `Arm.cells`, one per value of its axes, with what it
sets of the training config); the grid adds the shared overrides (preset, data, budget, the
user's OVERRIDES), the seed, and asks every arm the CONTROLS name. With a FLOPs budget
(FLOPS=...) every arm already trains to the same FLOPs, so the FLOPs-matched controls would
duplicate the plain baselines under another run-id: they are not made (`skipped_controls`).

A text value (what make passes: KAPPA="0.5 2") is parsed once, where a request is made
(sweeps.api.SweepRequest, `SweepSpec.from_text`): kappa by common.kappa, the rest here. Every
check runs before anything is submitted and fails with one UsageError line naming the input.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from common import arms, kappa
from common.arms import Cell
from common.errors import UsageError
from model import PRESETS
from model.config import MAX_LATENT_BITS

from .backend import parse_amount as config_parse_amount

CONTROLS = {a.control: a.name for a in arms.ARMS if a.control}
"""User-facing control names (CONTROLS="flops plus1 plus1_flops zcut") -> arm names."""
FLOPS_MATCHED = arms.names(compute="flops")

ARCH_KNOBS = ("model.latent_bits", "model.kappa_bits", "model.n_layers", "model.z_cut")
"""The only settings arms may differ in (besides the seed, a grid axis)."""
GRID_AXES = ("train.seed",)
COMPUTE_KNOBS = ("train.compute_match", "train.match_latent_bits", "train.match_n_layers",
                 "train.tokens", "train.flops")
"""What the equal-FLOPs control changes on purpose: its training horizon, nothing else."""


# ------------------------------------------------------------------------------- text
def _tokens(text: str | Iterable[Any]) -> list[str]:
    if isinstance(text, str):
        return [t for t in re.split(r"[\s,]+", text.strip()) if t]
    return [str(t) for t in text]


def parse_kappas(text: str | Iterable[Any]) -> list[float]:
    """KAPPA through the project's one kappa parser (common.kappa)."""
    return kappa.parse_kappas(text, "KAPPA")


def parse_ints(text: str | Iterable[Any], var: str) -> list[int]:
    """'8 16' -> [8, 16] (a value given twice counts once); the range is SweepSpec's check."""
    out: list[int] = []
    for tok in _tokens(text):
        if not re.fullmatch(r"[+-]?\d+", tok):
            raise UsageError(f"{var}: {tok!r} is not an integer")
        if int(tok) not in out:
            out.append(int(tok))
    return out


def parse_count(var: str, text: str, minimum: int) -> int | None:
    """'' -> None; an integer >= minimum; else UsageError naming the variable."""
    t = str(text or "").strip()
    if not t:
        return None
    if not t.isdigit() or int(t) < minimum:
        raise UsageError(f"{var}: {t!r} must be an integer >= {minimum}")
    return int(t)


def parse_amount(text: str | float | int | None, var: str) -> float | None:
    """'2e6', '500k', '3M', '1.5G' -> a positive number; '' or None -> None (the trainer's own
    parser, so TOKENS= and train.tokens= accept the same text)."""
    try:
        return config_parse_amount(text, var)
    except ValueError as e:
        raise UsageError(str(e)) from None


def parse_controls(text: str | Iterable[str]) -> tuple[str, ...]:
    """CONTROLS="flops plus1" -> their arm names (an arm name is taken too; none/0/no: none)."""
    out: list[str] = []
    for c in _tokens(text):
        if c.lower() in ("none", "0", "no"):
            continue
        if c not in CONTROLS and c not in CONTROLS.values():
            raise UsageError(f"CONTROLS: unknown control {c!r}; allowed: {' '.join(CONTROLS)} "
                             "(or none)")
        if CONTROLS.get(c, c) not in out:
            out.append(CONTROLS.get(c, c))
    return tuple(out)


def split_overrides(text: str | Iterable[Any]) -> tuple[str, ...]:
    """OVERRIDES as a shell splits them: on whitespace, quotes kept together, never on commas
    (hydra's `data.data_files=[a.txt,b.txt]` is one override, and so is `key='a b'`)."""
    if not isinstance(text, str):
        return tuple(str(t) for t in text)
    try:
        return tuple(shlex.split(text))
    except ValueError as e:  # an unclosed quote
        raise UsageError(f"OVERRIDES: {e} in {text!r}") from None


# ------------------------------------------------------------------------------- the grid
@dataclass(frozen=True)
class SweepSpec:
    """What a sweep trains: typed values, checked here (the make variables' and a recipe's)."""

    kappa_bits: tuple[float, ...]
    latent_bits: tuple[int, ...]
    seeds: tuple[int, ...]
    preset: str = "1M"
    data: str = "stdlib"
    tokens: float | None = None
    flops: float | None = None
    controls: tuple[str, ...] = ()
    """Arm names of the controls (common.arms)."""
    overrides: tuple[str, ...] = ()
    """Extra hydra overrides applied to every cell (OVERRIDES="optim.lr=1e-3 ...")."""

    def __post_init__(self) -> None:
        for var, vals in (("KAPPA", self.kappa_bits), ("H", self.latent_bits),
                          ("SEEDS", self.seeds)):
            if not vals:
                raise UsageError(f"empty grid: {var} has no values")
            if len(set(vals)) != len(vals):
                raise UsageError(f"{var}: a value is given twice in {list(vals)}")
        parse_kappas(self.kappa_bits)  # finite, >= 0 (common.kappa's one rule)
        for var, vals, lo, hi in (("H", self.latent_bits, 1, MAX_LATENT_BITS),
                                  ("SEEDS", self.seeds, 0, None)):
            for v in vals:
                if not isinstance(v, int) or isinstance(v, bool) or v < lo or (
                        hi is not None and v > hi):
                    rng = f"{lo}..{hi}" if hi is not None else f">= {lo}"
                    raise UsageError(f"{var}: {v!r} is outside {rng}")
        if self.preset not in PRESETS:
            raise UsageError(f"PRESET: unknown preset {self.preset!r}; allowed: "
                             f"{' '.join(PRESETS)}")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", self.data):
            raise UsageError(f"DATA: {self.data!r} is not a data config name")
        if self.tokens is not None and self.flops is not None:
            raise UsageError("give TOKENS or FLOPS, not both")
        for c in self.controls:
            if c not in CONTROLS.values():
                raise UsageError(f"CONTROLS: unknown control {c!r}")
        for o in self.overrides:
            if "=" not in o or o.startswith("="):
                raise UsageError(f"OVERRIDES: {o!r} is not a hydra override key=value")

    @classmethod
    def from_text(cls, *, kappa: str | Iterable[Any], h: str | Iterable[Any],
                  seeds: str | Iterable[Any], preset: str = "1M", data: str = "stdlib",
                  tokens: str | float | None = None, flops: str | float | None = None,
                  controls: str | Iterable[str] = "", overrides: str | Iterable[str] = ""
                  ) -> SweepSpec:
        """The spec of make's text values (KAPPA="0.5 2", H="8 16", TOKENS="2M", ...)."""
        return cls(kappa_bits=tuple(parse_kappas(kappa)), latent_bits=tuple(parse_ints(h, "H")),
                   seeds=tuple(parse_ints(seeds, "SEEDS")), preset=preset.strip(),
                   data=data.strip(), tokens=parse_amount(tokens, "TOKENS"),
                   flops=parse_amount(flops, "FLOPS"), controls=parse_controls(controls),
                   overrides=split_overrides(overrides))

    def to_manifest(self) -> dict[str, Any]:
        return {"kappa_bits": list(self.kappa_bits), "latent_bits": list(self.latent_bits),
                "seeds": list(self.seeds), "preset": self.preset, "data": self.data,
                "tokens": int(self.tokens) if self.tokens is not None
                and float(self.tokens).is_integer() else self.tokens, "flops": self.flops,
                "controls": list(self.controls), "overrides": list(self.overrides),
                # always empty (per-arm overrides went): kept so that default names and the
                # grids of existing manifests stay the same
                "arm_overrides": {}}

    def default_name(self) -> str:
        """Named by content (dora-style), never by time: the same command -> the same sweep."""
        h = hashlib.sha256(json.dumps(self.to_manifest(), sort_keys=True).encode()).hexdigest()
        return f"{self.preset}-{self.data}-{h[:8]}"


def resolved_layers(spec: SweepSpec) -> int:
    """The layer count the arms really train with: the preset's, then every `model=<preset>` and
    `model.n_layers=N` among the overrides, in order (the last wins, as in hydra)."""
    n = PRESETS[spec.preset].n_layers
    for o in spec.overrides:
        key, _, val = o.partition("=")
        key = key.lstrip("+~")
        if key == "model" and val in PRESETS:
            n = PRESETS[val].n_layers
        elif key == "model.n_layers":
            try:
                n = int(val)
            except ValueError:
                raise UsageError(f"OVERRIDES: {o!r}: model.n_layers must be an integer") from None
    return n


def duplicated_by(name: str) -> str:
    """The arm a FLOPs-matched control becomes under a FLOPs budget: the plain decoder with the
    same layers, trained to the grid's horizon (baseline_flops -> baseline)."""
    a = arms.arm(name)
    return next(b.name for b in arms.ARMS if not b.latent and b.compute == "tokens"
                and b.extra_layer == a.extra_layer)


def skipped_controls(spec: SweepSpec) -> dict[str, str]:
    """Controls asked for but not made, with the reason (one line each)."""
    if spec.flops is None:
        return {}
    return {arm: (f"{arm}: not trained: with FLOPS={spec.flops:g} every arm already trains to "
                  f"the same FLOPs, so it would duplicate {duplicated_by(arm)}")
            for arm in spec.controls if arm in FLOPS_MATCHED}


def expand(spec: SweepSpec) -> list[Cell]:
    """The grid's cells in the arms' order (common.arms.ARMS): the main arms, then the
    controls asked for and not skipped, each arm's cells as the arm makes them."""
    base = [f"model={spec.preset}", f"data={spec.data}"]
    if spec.tokens is not None:
        base.append(f"train.tokens={int(spec.tokens)}")
    if spec.flops is not None:
        base.append(f"train.flops={spec.flops:.6g}")
    base += list(spec.overrides)
    skip = skipped_controls(spec)
    layers = resolved_layers(spec)  # the arms' layers, overrides applied
    return [replace(c, overrides=(*base, *c.overrides, f"train.seed={c.seed}"))
            for a in arms.ARMS if a.control is None or (a.name in spec.controls
                                                         and a.name not in skip)
            for c in a.cells(spec.kappa_bits, spec.latent_bits, spec.seeds, layers)]


# ------------------------------------------------------------------------------- the guard
def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _may_differ(arm: str, key: str) -> bool:
    if key in ARCH_KNOBS or key in GRID_AXES:
        return True
    return arm in FLOPS_MATCHED and key in COMPUTE_KNOBS


def shared_settings(cells: Sequence[Cell], configs: Sequence[Mapping[str, Any]],
                    ignore: Iterable[str] = ()) -> dict[str, Any]:
    """The settings every arm shares (flat dotted keys). Raises UsageError if arms differ in
    anything but the architecture knobs (and, for the equal-FLOPs control, its horizon).

    `configs` are the resolved training configs (nested dicts), one per cell; keys under the
    `ignore` prefixes (bookkeeping such as paths or logging) are left out of the comparison.
    """
    ign = tuple(ignore)
    flat = [{k: v for k, v in flatten(c).items() if not k.startswith(ign)} for c in configs]
    keys = sorted(set().union(*flat)) if flat else []
    shared: dict[str, Any] = {}
    for key in keys:
        if key in ARCH_KNOBS or key in GRID_AXES:
            continue
        vals = [(c, f.get(key, "<missing>")) for c, f in zip(cells, flat, strict=True)]
        strict = [(c, v) for c, v in vals if not _may_differ(c.arm, key)]
        if not strict:
            continue
        c0, v0 = strict[0]
        for c, v in strict[1:]:
            if v != v0:
                raise UsageError(
                    f"arms must share every setting but {', '.join(ARCH_KNOBS)}: {key} is "
                    f"{v0!r} in {c0.name} but {v!r} in {c.name}")
        if len(strict) == len(vals) or key not in COMPUTE_KNOBS:
            shared[key] = v0
    _check_plus1(cells, flat)
    return shared


def _check_plus1(cells: Sequence[Cell], flat: Sequence[Mapping[str, Any]]) -> None:
    """The +1-layer controls must have exactly one layer more than the arms, as resolved."""
    main = {f.get("model.n_layers") for c, f in zip(cells, flat, strict=True)
            if (a := arms.find(c.arm)) is not None and a.control is None}  # the main arms
    main.discard(None)
    if len(main) != 1:
        return
    want = next(iter(main)) + 1
    for c, f in zip(cells, flat, strict=True):
        got = f.get("model.n_layers")
        a = arms.find(c.arm)
        if a is not None and a.extra_layer and got is not None and got != want:
            raise UsageError(f"{c.name}: model.n_layers is {got} but the arms have {want - 1} "
                             f"layers; the +1-layer control must have {want}")
