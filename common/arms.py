"""The arms a sweep trains, one typed record each: the one place that says what an arm is
(docs/DESIGN.md, "Adding an arm"). Code asks an arm's record instead of testing its name, and
each record makes its own cells of a grid (`Arm.cells`). A run's own files record the *model
kind* as `arm` ("baseline" or "free", `of_model`), not the cell's arm. Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .errors import UsageError
from .kappa import kappa_id

MODEL_CLASSES = ("Transformer", "FreeTransformer")
"""The model classes of model/ an arm may train (model.build picks one from latent_bits)."""
COMPUTE = ("tokens", "flops")
"""What an arm's training horizon is matched on: the grid's tokens (or FLOPs budget), or the
FLOPs of the Free Transformer of its H (`train.compute_match=flops`)."""


@dataclass(frozen=True)
class Arm:
    """One arm of a sweep."""

    name: str
    """The cell's `arm` in manifests, frames and tables."""
    latent: bool
    """The model has a latent Z (a Free Transformer: encoder, KL, binary mapper,
    post-sampler); False for a plain decoder."""
    model_class: str
    """The class of model/ it trains (one of MODEL_CLASSES)."""
    matched_to: str
    """What it is matched to, in words (the report's and the docs' phrase)."""
    compute: str = "tokens"
    """'flops': trained to the FLOPs of the Free Transformer of its H (a FLOPs-matched
    control, `train.compute_match=flops`); 'tokens': the grid's own horizon."""
    extra_layer: bool = False
    """One layer more than the arms' resolved layer count (the +1-layer parameter control)."""
    z_cut: bool = False
    """Z is cut from the decoder (`model.z_cut=true`): the encoder, its KL and the FLOPs are
    kept, nothing of Z reaches the decoder."""
    control: str | None = None
    """The user-facing CONTROLS name that adds it (None: a main arm, always trained)."""
    axes: tuple[str, ...] = ("seed",)
    """The grid axes it gets one cell per (its cell-name order): 'kappa', 'H', 'seed'."""

    def __post_init__(self) -> None:
        if self.model_class not in MODEL_CLASSES:
            raise UsageError(f"arm {self.name}: model_class {self.model_class!r} is not one of "
                           f"{MODEL_CLASSES}")
        if self.latent != (self.model_class == "FreeTransformer"):
            raise UsageError(f"arm {self.name}: latent={self.latent} disagrees with model_class "
                           f"{self.model_class}")
        if self.compute not in COMPUTE:
            raise UsageError(f"arm {self.name}: compute {self.compute!r} is not one of {COMPUTE}")
        if self.z_cut and not self.latent:
            raise UsageError(f"arm {self.name}: z_cut needs a latent (a baseline has no Z)")
        if (self.latent or self.flops_matched) and "H" not in self.axes:
            raise UsageError(f"arm {self.name}: a latent or FLOPs-matched arm needs the H axis")

    @property
    def flops_matched(self) -> bool:
        """Trained to the FLOPs of the Free Transformer of its H (its cells carry
        `match_latent_bits`)."""
        return self.compute == "flops"

    @property
    def is_treatment(self) -> bool:
        """The arm the suite measures (the Free Transformer with Z reaching the decoder): the
        one every other arm is a reference or a control for."""
        return self.latent and not self.z_cut

    @property
    def model_kind(self) -> str:
        """What the run's own files record as `arm` (`of_model(self.latent).name`)."""
        return of_model(self.latent).name

    def cells(self, kappas: Sequence[float], hs: Sequence[int], seeds: Sequence[int],
              layers: int) -> list[Cell]:
        """This arm's cells of a grid, in the grid's order (H, then kappa, then seed). A latent
        arm without the kappa axis trains at the grid's smallest kappa (the Z-cut control).
        `layers`: the arms' resolved layer count."""
        ks: Sequence[float | None] = kappas if "kappa" in self.axes else (
            [min(kappas)] if self.latent else [None])
        out = []
        for h in hs if "H" in self.axes else [None]:
            for k in ks:
                ov = [f"model.latent_bits={h if self.latent else 0}"]
                if k is not None:
                    ov.append(f"model.kappa_bits={kappa_id(k)}")
                if self.z_cut:
                    ov.append("model.z_cut=true")
                if self.extra_layer:
                    ov.append(f"model.n_layers={layers + 1}")
                if self.flops_matched:
                    ov += ["train.compute_match=flops", f"train.match_latent_bits={h}"]
                    if self.extra_layer:  # matched to the FT of the arms' own layers
                        ov.append(f"train.match_n_layers={layers}")
                head = "-".join([self.name, *([f"k{kappa_id(k)}"] if k is not None
                                              and "kappa" in self.axes else []),
                                 *([f"H{h}"] if h is not None else [])])
                out += [Cell(f"{head}-s{s}", self.name, s, tuple(ov), k, h) for s in seeds]
        return out


@dataclass(frozen=True)
class Cell:
    """One cell of a grid."""

    name: str
    """`<arm>[-k<kappa>][-H<H>]-s<seed>`: the cell's name in the manifest."""
    arm: str
    seed: int
    overrides: tuple[str, ...]
    """Its hydra overrides: as the arm makes it, what the arm sets of the training config;
    as the grid expands it (sweeps.grid.expand), the shared ones, those and the seed."""
    kappa_bits: float | None = None
    latent_bits: int | None = None
    """The cell's H: the model's own for a latent arm, the matched one for a FLOPs-matched
    control, None for an arm without the H axis."""


BASELINE = Arm("baseline", latent=False, model_class="Transformer",
               matched_to="every Free Transformer of its seed, at equal tokens (the paper's "
                          "reference)")
FREE = Arm("free", latent=True, model_class="FreeTransformer",
           matched_to="the baseline of its seed (the arm under test)",
           axes=("kappa", "H", "seed"))
BASELINE_FLOPS = Arm("baseline_flops", latent=False, model_class="Transformer",
                     matched_to="the FLOPs of the Free Transformer of its H and seed (more "
                                "tokens)",
                     compute="flops", control="flops", axes=("H", "seed"))
BASELINE_PLUS1 = Arm("baseline_plus1", latent=False, model_class="Transformer",
                     matched_to="the Free Transformers of its seed at equal tokens, with one "
                                "layer more than the arms (a parameter control)",
                     extra_layer=True, control="plus1")
BASELINE_PLUS1_FLOPS = Arm("baseline_plus1_flops", latent=False, model_class="Transformer",
                           matched_to="the FLOPs of the Free Transformer of its H and seed, "
                                      "with one layer more than the arms",
                           compute="flops", extra_layer=True, control="plus1_flops",
                           axes=("H", "seed"))
FREE_ZCUT = Arm("free_zcut", latent=True, model_class="FreeTransformer",
                matched_to="the Free Transformers of its H and seed (same FLOPs, Z cut from "
                           "the decoder), at the grid's smallest kappa",
                z_cut=True, control="zcut", axes=("H", "seed"))

ARMS: tuple[Arm, ...] = (BASELINE, FREE, BASELINE_FLOPS, BASELINE_PLUS1, BASELINE_PLUS1_FLOPS,
                         FREE_ZCUT)
"""Every arm, in the grid's cell order (baselines, Free Transformers, then the controls)."""
_BY_NAME = {a.name: a for a in ARMS}


def arm(name: str) -> Arm:
    """The record of an arm name; UsageError (one line) for a name no record has."""
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        raise UsageError(f"arm {name!r}: not a known arm (known: "
                       f"{', '.join(_BY_NAME)})") from None


def find(name: object) -> Arm | None:
    """The record of an arm name, or None (an unknown name, None or NaN in a frame)."""
    return _BY_NAME.get(name) if isinstance(name, str) else None


def names(*, latent: bool | None = None, compute: str | None = None,
          extra_layer: bool | None = None, control: bool | None = None,
          treatment: bool | None = None) -> tuple[str, ...]:
    """The names of the arms with the given properties, in ARMS order (None: any).
    `control=True`: arms added by CONTROLS; `treatment=True`: the arm under test."""
    return tuple(a.name for a in ARMS
                 if (latent is None or a.latent == latent)
                 and (compute is None or a.compute == compute)
                 and (extra_layer is None or a.extra_layer == extra_layer)
                 and (control is None or (a.control is not None) == control)
                 and (treatment is None or a.is_treatment == treatment))


def by_control(control: str) -> Arm:
    """The arm a CONTROLS name adds ('flops' -> baseline_flops); UsageError for another."""
    for a in ARMS:
        if a.control == control:
            return a
    known = ", ".join(a.control for a in ARMS if a.control)
    raise UsageError(f"control {control!r}: not a known control (known: {known})")


def of_model(latent_bits: int | bool) -> Arm:
    """The model kind a run's own files record as `arm`, from its model alone: FREE with a
    latent (latent_bits > 0), else BASELINE, whatever the cell's arm."""
    return FREE if latent_bits else BASELINE
