"""Recipes: the paper's protocol (or a small stand-in) as one data file, every value sourced.

A recipe is `sweeps/recipes/<name>.yaml` (or a user's file): an experiment of the suite's hydra
config. Every leaf is written as

    key: {value: <the value>, basis: paper | reference | ours, source: "<where it comes from>"}

so a value cannot enter a recipe without saying where it comes from (docs/RECIPES.md prints the
tables). The file's shape and the grid's and evaluation's value types are OmegaConf's
structured check of `SCHEMA` (every section and key written, nothing else); the training keys
(model, train, optim, corpus: `TRAIN_KEYS` names the `make train` key of each) compose through
experiments/train/config.py, the one config schema `make train` uses; the grid is the sweep's
(sweeps.grid.SweepSpec, kappa by common.kappa); the tasks are the evaluator's. The micro-batch
per GPU type is what `python -m sweeps.recipe measure` measured (MEASURED_RECORDS); a GPU type
it did not measure is refused, never guessed. Gradient accumulation keeps the global batch, so
it never changes what is trained.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, make_dataclass
from enum import Enum
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from omegaconf import MISSING, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from common import arms
from common.errors import UsageError, cli
from common.io import read_yaml_mapping
from common.kappa import kappa_label, parse_kappas
from common.text import one_line

if TYPE_CHECKING:
    from .grid import SweepSpec

RECIPES_DIR = Path(__file__).resolve().parent / "recipes"
MEASURED_RECORDS = Path(__file__).resolve().parents[1] / "measured" / "memory" / "recipes.json"
"""`measure`'s records: each recipe's measured peaks per phase and GPU type,
and the micro-batch it chose by them (`Recipe.micro_batches`)."""
GPU_TYPES: dict[str, float] = {"H100-80GB": 80.0, "A100-40GB": 40.0, "A100-80GB": 80.0,
                               "H200-141GB": 141.0}
"""GPU memory in decimal GB as the vendors quote it (NVIDIA data sheets)."""
Z_MODES = ("prior", "prior-k")
"""How Z is drawn when scoring; `posterior` leaks the scored tokens and is no protocol."""
ZMode = Enum("ZMode", {z: z for z in Z_MODES}, type=str)  # type: ignore[misc]


class Schedule(str, Enum):
    """Schedules the trainer implements (experiments/train/trainer.py: linear warmup, cosine
    decay to lr x optim.min_lr_ratio). Another one needs a config key first."""

    cosine = "cosine"


class Basis(str, Enum):
    """paper: stated by Fleuret 2025 (arXiv 2510.17558); reference: filled from a named public
    report or config; ours: our choice, the source says why."""

    paper = "paper"
    reference = "reference"
    ours = "ours"


BASES = tuple(b.value for b in Basis)
A = Any  # a training value: experiments/train/config.py's schema types it (`_checked`)
SECTIONS: dict[str, dict[str, Any]] = {
    "model": {"preset": A, "mapper_bf16": A},
    "train": dict.fromkeys(("tokens", "seq_len", "batch_size", "precision", "gpus", "compile"),
                           A),
    "optim": {"lr": A, "schedule": Schedule, **dict.fromkeys((
        "min_lr_ratio", "warmup_steps", "weight_decay", "grad_clip", "beta1", "beta2", "eps"),
        A)},
    "grid": {"kappa_bits": list[str], "latent_bits": list[int], "seeds": list[int],
             "controls": list[str] | None},
    "corpus": {"data": A, "sources": list[Any] | None, "paths": list[str] | None,
               **dict.fromkeys(("vocab_size", "tokenizer", "bytes_per_token", "max_bytes",
                                "val_tokens", "val_fraction"), A)},
    "eval": {"tasks": list[str], "fewshot": dict[str, int] | None, "points": int,
             "average_last": A, "z": ZMode},
}
"""Every key a recipe writes, in its table's order, with the type of its value as OmegaConf
checks it."""
TRAIN_KEYS: dict[str, str] = {
    "model.preset": "model", "corpus.data": "data", "corpus.vocab_size": "model.vocab_size",
    "model.mapper_bf16": "model.mapper_bf16", "corpus.tokenizer": "data.tokenizer",
    "corpus.sources": "data.hf_sources", "corpus.paths": "data.paths",
    "corpus.max_bytes": "data.max_bytes", "corpus.val_tokens": "data.val_tokens",
    "corpus.val_fraction": "data.val_fraction", "train.seq_len": "train.seq_len",
    "train.batch_size": "train.batch_size", "train.tokens": "train.tokens",
    "train.precision": "train.precision", "train.gpus": "train.plan_world_size",
    "train.compile": "train.compile",
    **{f"optim.{k}": f"optim.{k}" for k in SECTIONS["optim"] if k != "schedule"}}
"""The `make train` key each training value of a recipe sets, in the overrides' order (a null
value sets none: the trainer's default). optim.schedule and corpus.bytes_per_token have none
(the one schedule the trainer has; the text to stream per token, data.hf_max_bytes's factor)."""
QUOTED = ("data.tokenizer", "data.paths")
"""Keys whose text is quoted in an override, so ',', ':', '=' or spaces cannot split it."""


SCHEMA = make_dataclass("RecipeFile", [("description", str, ""), *(
    (s, make_dataclass(s, [(k, make_dataclass(f"{s}.{k}", [
        ("value", typ, MISSING), ("basis", Basis, MISSING), ("source", str, MISSING)]), MISSING)
        for k, typ in keys.items()]), MISSING)
    for s, keys in SECTIONS.items())])
"""The file's shape, for OmegaConf: every section and key written as {value, basis, source},
nothing else, each value of its SECTIONS type."""


@dataclass(frozen=True)
class Provenance:
    basis: str
    source: str


@dataclass(frozen=True)
class MicroBatch:
    """What one GPU type runs for a recipe: the largest micro-batch whose fake-tensor peaks of
    training, validation and save fit experiments.memory.USABLE_FRACTION of the GPU (without
    activation checkpointing when possible), as `measure` measured it."""

    gpu: str
    memory_gb: float
    parallel: str
    micro_batch_size: int
    grad_accum: int
    activation_checkpointing: bool
    measured_gb: float
    """The largest measured peak of those phases, decimal GB."""


def gpu_overrides(mb: MicroBatch) -> list[str]:
    """The trainer's overrides of a GPU type's micro-batch, parallelism and checkpointing."""
    from .backend import gpu_peak_tflops

    name = mb.gpu.split("-")[0]  # "A100-40GB" -> A100: its device names contain it
    peak, _ = gpu_peak_tflops(name)
    return [f"train.micro_batch_size={mb.micro_batch_size}", f"train.gpu_name={name}",
            *([f"train.gpu_peak_tflops={_fmt(float(peak))}"] if peak else []),
            f"train.gpu_memory_gb={_fmt(mb.memory_gb)}",
            # one GPU runs no parallelism: the trainer's choices are ddp and fsdp
            *([f"train.parallel={mb.parallel}"] if mb.parallel != "none" else []),
            f"train.activation_checkpointing={_fmt(mb.activation_checkpointing)}"]


def _quote(text: str) -> str:
    """A string as a quoted hydra override value."""
    # hydra's rule: inside quotes only a quote, and backslashes right before one (or before
    # the closing quote), are escaped
    body = re.sub(r"(\\*)('|$)",
                  lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), text)
    return f"'{body}'"


def _fmt(v: Any) -> str:
    """A value as override text: 2.0 -> '2', 4e-4 -> '0.0004', True -> 'true'."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() else repr(v)
    return str(v)


@dataclass
class Recipe:
    """A loaded recipe: its values as typed by the checks above (`values`, key -> value), each
    value's basis and source (`provenance`), and views by section (`r.train.batch_size`,
    `r.grid.kappa_bits`, `r.corpus.sources`, `r.eval.points`, ...)."""

    name: str
    path: str
    description: str
    values: dict[str, Any]
    provenance: Mapping[str, Provenance] = field(default_factory=dict)
    """'<section>.<key>' -> where the value comes from (every key has one)."""

    def __getattr__(self, section: str) -> SimpleNamespace:
        if section not in SECTIONS:
            raise AttributeError(section)
        return SimpleNamespace(**{k: self.values[f"{section}.{k}"] for k in SECTIONS[section]})

    @property
    def preset(self) -> str:
        return self.values["model.preset"]

    # ------------------------------------------------------------------ derived values
    @property
    def tokens_per_step(self) -> int:
        return self.train.batch_size * self.train.seq_len

    @property
    def steps(self) -> int:
        """Optimizer steps of an equal-tokens arm (experiments.train.plan's rule: whole steps,
        rounded up)."""
        return max(1, math.ceil(self.train.tokens / self.tokens_per_step - 1e-9))

    @property
    def budget_tokens(self) -> int:
        """The most training tokens any cell of the grid reads: the equal-tokens arms' whole
        steps, or a FLOPs-matched control's (train.compute_match=flops: the matching Free
        Transformer's FLOPs over the control's own FLOPs per token, in whole steps), by
        experiments.train.plan.plan's rule; tests/test_recipes.py checks it against the
        sweep's planned cells."""
        from model import PRESETS, train_flops_per_token

        T, tps = self.train.seq_len, self.tokens_per_step
        mc = PRESETS[self.preset].replace(vocab_size=self.corpus.vocab_size)
        steps, L = self.steps, mc.n_layers
        for arm in map(arms.by_control, self.grid.controls):
            if not arm.flops_matched:
                continue  # an equal-tokens control trains the equal tokens
            fa = train_flops_per_token(mc.replace(latent_bits=0,
                                                  n_layers=L + int(arm.extra_layer)), T).total
            for h in self.grid.latent_bits:
                ff = train_flops_per_token(mc.replace(latent_bits=h, n_layers=L), T).total
                steps = max(steps, math.ceil(self.steps * tps * ff / (fa * tps) - 1e-9))
        return steps * tps

    def data_config(self) -> Any:
        """The corpus's data section (experiments' DataConfig) before the byte cap and the
        passes are filled in: what the budget is planned on."""
        from . import backend as C

        c = self.corpus
        kw: dict[str, Any] = {"source": c.data}
        if c.val_fraction is not None:
            kw["val_fraction"] = c.val_fraction
        if c.max_bytes is not None:
            kw["max_bytes"] = c.max_bytes
        if c.data == "hf":
            kw["hf_sources"] = [C.HFSource(path=s.path, name=s.name, split=s.split,
                                           field=s.field, weight=s.weight) for s in c.sources]
        if c.data == "files":
            kw["paths"] = list(c.paths)
        return C.DataConfig(**kw)

    @property
    def source_passes(self) -> tuple[int, ...]:
        """hf: per source, the passes its share of the budget needs (at least 1), from the
        sources' known sizes (experiments/corpus/budget.py SOURCE_SIZES): written into
        data.hf_sources[].passes, so a source repeats only where the plan says it must."""
        from . import backend as C

        if self.corpus.data != "hf":
            return ()
        return tuple(C.corpus_budget.passes_for(self.data_config(), self.budget_tokens))

    @property
    def hf_max_bytes(self) -> int | None:
        """hf: text to stream for the costliest cell's training tokens (`budget_tokens`) plus
        the held-out share (val_fraction), at bytes_per_token."""
        if self.corpus.data != "hf" or self.corpus.bytes_per_token is None:
            return None
        from . import backend as C

        total = C.corpus_budget.stream_tokens(self.budget_tokens,
                                              self.data_config().val_fraction)
        return math.ceil(total * self.corpus.bytes_per_token)

    def table3_points(self) -> tuple[int, ...]:
        """The evaluation points k = 1..points (checkpoint at ceil(k x steps / points)) that lie
        in the last `average_last` of training, which Table 3 averages over."""
        n, start = self.eval.points, 1 - self.eval.average_last
        return tuple(k for k in range(1, n + 1) if Fraction(k, n) > start)

    # ------------------------------------------------------------------ outputs
    def _overrides(self, keys: Sequence[str], derived: bool = True) -> list[str]:
        """The `make train` overrides of these recipe keys (TRAIN_KEYS), in TRAIN_KEYS' order;
        `derived`: hf sources with their passes and data.hf_max_bytes (the budget's)."""
        out = []
        for key, train_key in TRAIN_KEYS.items():
            v = self.values[key]
            if key not in keys or v is None or v in ((), []):
                continue
            if key == "corpus.sources":
                out += self._hf_overrides(derived)
            elif train_key in QUOTED:
                out.append(f"{train_key}=" + (_quote(v) if isinstance(v, str) else
                                               f"[{','.join(_quote(p) for p in v)}]"))
            else:
                out.append(f"{train_key}={_fmt(v)}")
        return out

    def _hf_overrides(self, derived: bool) -> list[str]:
        passes = self.source_passes if derived else (1,) * len(self.corpus.sources)
        items = []
        for s, n in zip(self.corpus.sources, passes, strict=True):
            d = {"path": _quote(s.path), "name": s.name and _quote(s.name),
                 "split": _quote(s.split), "field": _quote(s.field), "weight": _fmt(s.weight),
                 "passes": str(n)}
            items.append("{" + ",".join(f"{k}:{v}" for k, v in d.items() if v is not None) + "}")
        return [f"data.hf_sources=[{','.join(items)}]",
                *([f"data.hf_max_bytes={self.hf_max_bytes}"] if derived else [])]

    def training_overrides(self, *, groups: bool = True, budget: bool = True,
                           gpu: str | None = None) -> tuple[str, ...]:
        """Hydra overrides for experiments.train (either arm: the grid adds latent_bits, kappa).

        groups: lead with `model=<preset>` and `data=<source>` (False for SweepSpec, which
        writes them itself); budget: include train.tokens (False for SweepSpec); gpu: a key of
        GPU_TYPES whose micro-batch, parallelism and checkpointing are added."""
        keys = [k for k in TRAIN_KEYS if (groups or "." in TRAIN_KEYS[k])
                and (budget or k != "train.tokens")]
        ov = self._overrides(keys)
        if gpu is not None:
            if gpu not in GPU_TYPES:
                raise UsageError(f"{self.path}: unknown GPU type {gpu!r}; known: "
                                 f"{list(GPU_TYPES)}")
            if gpu not in (table := self.micro_batches()):
                raise UsageError(f"{self.path}: recipe {self.name}: {self.not_measured(gpu)}")
            ov += gpu_overrides(table[gpu])
        return tuple(ov)

    def corpus_overrides(self) -> list[str]:
        """The data.* overrides of the corpus settings (without `data=<source>`)."""
        return [o for o in self._overrides([k for k in TRAIN_KEYS if k.startswith("corpus.")])
                if o.startswith("data.")]

    def sweep_spec(self, *, seeds: Sequence[int] | None = None, gpu: str | None = None,
                   extra: Sequence[str] = ()) -> SweepSpec:
        """The recipe's grid as a sweeps.grid.SweepSpec. seeds: replace the recipe's; gpu: a key
        of GPU_TYPES whose micro-batch settings are added; extra: overrides that win over the
        recipe's own for the same key (e.g. train.plan_world_size=256, a user's OVERRIDES)."""
        from .grid import SweepSpec, parse_controls

        g = self.grid
        return SweepSpec(
            kappa_bits=g.kappa_bits, latent_bits=g.latent_bits,
            seeds=tuple(seeds) if seeds is not None else g.seeds, preset=self.preset,
            data=self.corpus.data, tokens=float(self.train.tokens),
            controls=parse_controls(g.controls),
            overrides=merge_overrides(self.training_overrides(groups=False, budget=False,
                                                              gpu=gpu), extra))

    def eval_runs(self) -> list[list[str]]:
        """Arguments for experiments.eval (or sweeps' EVAL_ARGS), one list per few-shot count:
        the tasks at their stock count first, then each explicit count."""
        e = self.eval
        groups: dict[int | None, list[str]] = {}
        for task in e.tasks:
            groups.setdefault(e.fewshot.get(task), []).append(task)
        runs = []
        for n in sorted(groups, key=lambda x: -1 if x is None else x):
            runs.append(["--tasks", ",".join(groups[n]), "--z", e.z,
                         *(["--fewshot", str(n)] if n is not None else [])])
        return runs

    def cell_config(self, gpu: str | MicroBatch, overrides: Sequence[str] = (),
                    gpus: int | None = None) -> Any:
        """The TrainConfig of the costliest cell (the Free Transformer at the grid's largest H)
        at the measured micro-batch for GPU type `gpu`, or at a MicroBatch being measured
        (`overrides` win over the recipe's): what `make paper DRY=1` measures on fake tensors
        (pipelines/paper.py) and `measure` measured into MEASURED_RECORDS."""
        from .backend import compose_overrides

        ov = [f"model.latent_bits={max(self.grid.latent_bits)}",
              f"model.kappa_bits={float(self.grid.kappa_bits[0])}", *overrides,
              *([f"train.plan_world_size={gpus}"] if gpus else [])]
        base = (self.training_overrides(gpu=gpu) if isinstance(gpu, str)
                else (*self.training_overrides(), *gpu_overrides(gpu)))
        return compose_overrides(list(merge_overrides(base, ov)))

    def memory_key(self) -> str:
        """What the measured micro-batches were measured for: a hash of every training override
        but the micro-batch settings (a changed recipe is not the one measured)."""
        ov = self.training_overrides(budget=False)
        return hashlib.sha256(json.dumps(list(ov)).encode()).hexdigest()[:16]

    def not_measured(self, gpu: str) -> str:
        return (f"no measured micro-batch that fits a {gpu} (measured/memory/recipes.json); "
                f"`python -m sweeps.recipe measure {self.name} --gpus {gpu}` measures it")

    def micro_batches(self) -> dict[str, MicroBatch]:
        """The micro-batch per GPU type that `measure` chose by measurement
        (MEASURED_RECORDS), for this recipe as it is now (`memory_key`); a GPU type it did not
        measure, one where nothing fits, or a changed recipe is absent."""
        try:
            entries = json.loads(MEASURED_RECORDS.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        key, out = self.memory_key(), {}
        for e in entries if isinstance(entries, list) else []:
            if not isinstance(e, dict) or e.get("recipe") != self.name \
                    or e.get("recipe_key") != key or e.get("basis") != "measured":
                continue
            gpu = e.get("gpu")
            if gpu in GPU_TYPES and e.get("fits") is True:
                out[gpu] = MicroBatch(gpu, GPU_TYPES[gpu], str(e["parallel"]),
                                      int(e["micro_batch_size"]), int(e["grad_accum"]),
                                      bool(e["activation_checkpointing"]), e["measured_gb"])
        return out

    def filled(self) -> list[tuple[str, str, str, str]]:
        """(key, value, basis, source) of every value the paper does not state (basis reference
        or ours): what a reviewer must know was chosen for it."""
        return [(key, _show(key, self.values[key]), p.basis, p.source)
                for key, p in self.provenance.items() if p.basis != Basis.paper]

    def table(self) -> str:
        """Markdown: every value with its basis and source, then the derived values."""
        rows = ["| key | value | basis | source |", "|---|---|---|---|"]
        rows += [f"| {key} | {_show(key, self.values[key])} | {p.basis} | {p.source} |"
                 for key, p in self.provenance.items()]
        gbt, t = self.tokens_per_step, self.train
        rows += ["", "| derived | value |", "|---|---|",
                 f"| global batch | {t.batch_size:,} sequences x {t.seq_len:,} = {gbt:,} tokens |",
                 f"| steps (equal-tokens arms) | {self.steps:,} ({self.steps * gbt:,} tokens) |",
                 f"| warmup share | {self.optim.warmup_steps:,} steps = "
                 f"{min(1.0, self.optim.warmup_steps / self.steps):.1%} of the steps |",
                 f"| per-GPU batch | {t.batch_size // t.gpus} sequences on {t.gpus} GPU(s) |",
                 f"| Table 3 points | {list(self.table3_points())} of 1..{self.eval.points} |"]
        if self.budget_tokens != self.steps * gbt:
            rows.append(f"| training tokens of the costliest cell | {self.budget_tokens:,} "
                        "(an equal-FLOPs control) |")
        if self.hf_max_bytes is not None:
            rows.append(f"| data.hf_max_bytes | {self.hf_max_bytes:,} |")
            for s, n in zip(self.corpus.sources, self.source_passes, strict=True):
                if n > 1:
                    rows.append(f"| data.hf_sources passes of {s.path}"
                                + (f" ({s.name})" if s.name else "") + f" | {n} |")
        return "\n".join(rows)


def _show(key: str, v: Any) -> str:
    """A value as the tables print it (kappa by common.kappa's label)."""
    if key == "grid.kappa_bits":
        return "[" + ", ".join(map(kappa_label, v)) + "]"
    if key == "corpus.sources" and v:
        return "<br>".join(f"{s.path}" + (f" ({s.name})" if s.name else "")
                           + f", field {s.field}, weight {s.weight:g}"
                           + (f" [{s.category}]" if s.category else "") for s in v)
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(_show("", x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{k}: {x}" for k, x in v.items()) + "}" if v else "{} (stock)"
    if isinstance(v, bool):
        return str(v).lower()  # as the YAML and the overrides write it
    if isinstance(v, float):
        return f"{v:g}"
    return "null" if v is None else str(v)


# ---------------------------------------------------------------------- loading
def merge_overrides(base: Sequence[str], extra: Sequence[str]) -> tuple[str, ...]:
    """base, less every override whose key `extra` sets again, then extra: hydra refuses a key
    given twice, and a user's value must win over the recipe's."""
    keys = {o.partition("=")[0].lstrip("+~") for o in extra}
    return (*(o for o in base if o.partition("=")[0].lstrip("+~") not in keys), *extra)


def known() -> list[str]:
    """Names of the recipes shipped in sweeps/recipes/."""
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def resolve(name_or_path: str | Path) -> Path:
    """A recipe name (sweeps/recipes/<name>.yaml) or a path to a file; UsageError if neither."""
    s = str(name_or_path).strip()
    if not s:
        raise UsageError(f"RECIPE is empty; known recipes: {', '.join(known())}")
    p = Path(s)
    if p.suffix in (".yaml", ".yml") or "/" in s:
        if not p.is_file():
            raise UsageError(f"{s}: no such recipe file")
        return p
    named = RECIPES_DIR / f"{s}.yaml"
    if not named.is_file():
        raise UsageError(f"recipe {s!r}: unknown; known recipes: {', '.join(known())} "
                         "(or give a path to a .yaml file)")
    return named


def load(name_or_path: str | Path) -> Recipe:
    """The checked Recipe of a shipped name or a file path (UsageError: one line naming the
    file and the key)."""
    path = resolve(name_or_path)
    try:
        shown = str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        shown = str(path)
    raw = read_yaml_mapping(path, UsageError, "recipe sections")
    try:
        f = OmegaConf.merge(OmegaConf.structured(SCHEMA), raw)
        missing = sorted(OmegaConf.missing_keys(f))
        plain: dict[str, Any] = OmegaConf.to_container(  # type: ignore[assignment]
            f, resolve=False, enum_to_str=True)
    except OmegaConfBaseException as e:
        where = getattr(e, "full_key", None)
        raise UsageError(f"{shown}: {where + ': ' if where else ''}"
                         f"{str(e).splitlines()[0]}") from None
    if missing:
        raise UsageError(f"{shown}: {missing[0]}: missing (every key is written, with its basis "
                         "and source)")
    leaves = {f"{s}.{k}": plain[s][k] for s, keys in SECTIONS.items() for k in keys}
    prov = {key: Provenance(leaf["basis"], " ".join(str(leaf["source"]).split()))
            for key, leaf in leaves.items()}
    for key, p in prov.items():
        if not p.source:
            raise UsageError(f"{shown}: {key}: source must be a non-empty string")
    values = {key: leaf["value"] for key, leaf in leaves.items()}
    return _checked(Recipe(path.stem, shown, " ".join(str(plain["description"]).split()),
                           values, prov))


def _checked(r: Recipe) -> Recipe:
    """Each value through its one check, its `values` typed by it: the training keys compose
    through experiments/train/config.py (and plan on the recipe's world: the batch splits),
    the grid is the sweep's SweepSpec (kappa by common.kappa), the tasks the evaluator's."""
    from . import backend
    from .grid import parse_amount, parse_controls

    v, at = r.values, r.path

    def bad(key: str, problem: str) -> UsageError:
        return UsageError(f"{at}: {key}={v[key]!r}: {problem}")

    try:
        v["train.tokens"] = parse_amount(v["train.tokens"], "train.tokens")
        v["grid.kappa_bits"] = tuple(parse_kappas(v["grid.kappa_bits"], "grid.kappa_bits"))
        for key in ("grid.latent_bits", "grid.seeds", "grid.controls", "eval.tasks",
                    "corpus.paths"):
            v[key] = tuple(v[key] or ())
        parse_controls(v["grid.controls"])
        v["eval.average_last"] = Fraction(str(v["eval.average_last"]))
    except (UsageError, ValueError, ZeroDivisionError) as e:
        raise UsageError(f"{at}: {one_line(e)}") from None
    hf = v["corpus.data"] == "hf"
    for key, want, why in (("corpus.sources", hf, "only data=hf takes a mixture"),
                           ("corpus.bytes_per_token", hf, "only data=hf streams text by the "
                                                          "byte"),
                           ("corpus.paths", v["corpus.data"] == "files",
                            "only data=files takes glob patterns")):
        if bool(v[key]) != want:  # a value no setting reads would be a source for nothing
            raise bad(key, why if not want else f"data={v['corpus.data']} needs it")
    v["corpus.sources"] = tuple(_source(s, at) for s in v["corpus.sources"] or ())
    try:  # the training keys: the trainer's own config schema and plan
        cfg = backend.compose_overrides(r._overrides(list(TRAIN_KEYS), derived=False))
        backend.run_plan(cfg, world_size=cfg.train.plan_world_size)
        r.sweep_spec()  # the grid: the sweep's SweepSpec
    except ValueError as e:  # UsageError is one
        raise UsageError(f"{at}: {one_line(e)}") from None
    for key, train_key in TRAIN_KEYS.items():  # typed as the trainer reads them
        if v[key] is not None and key not in ("corpus.sources", "corpus.paths"):
            got = cfg
            for part in {"model": "model.preset", "data": "data.source"}.get(
                    train_key, train_key).split("."):
                got = getattr(got, part)
            v[key] = str(got) if isinstance(got, Enum) else got
    e = r.eval
    v["eval.fewshot"] = fewshot = e.fewshot or {}
    if not all(t in e.tasks and n >= 0 for t, n in fewshot.items()):
        raise bad("eval.fewshot", "must map tasks of eval.tasks to shots >= 0")
    try:
        backend.check_eval_tasks(e.tasks)
    except UsageError as err:
        raise bad("eval.tasks", one_line(err)) from None
    if e.points < 2:
        raise bad("eval.points", "must be an integer >= 2 (a curve needs two points)")
    if not 0 < e.average_last <= 1:
        raise bad("eval.average_last", "must be a fraction in (0, 1]")
    if not r.table3_points():
        raise bad("eval.points", f"no evaluation point falls in the last {e.average_last} of "
                                 "training that Table 3 averages")
    return r


def _source(s: Any, at: str) -> SimpleNamespace:
    """One corpus.sources entry: the trainer's data.hf_sources[] fields (its schema checks
    them) and the share it stands for (`category`: documentation only)."""
    from . import backend

    if not isinstance(s, dict):
        raise UsageError(f"{at}: corpus.sources: {s!r}: each source is a mapping")
    s = dict(s)
    category = s.pop("category", "")
    try:
        hf = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(backend.HFSource), s))
    except (OmegaConfBaseException, ValueError) as e:
        raise UsageError(f"{at}: corpus.sources: {str(e).splitlines()[0]}") from None
    return SimpleNamespace(**dataclasses.asdict(hf), category=str(category or ""))


# ---------------------------------------------------------------------- CLI
def show(r: Recipe) -> str:
    """What `python -m sweeps.recipe show NAME` prints: overrides, grid, eval and micro-batches."""
    lines = [f"recipe      {r.name} ({r.path})", f"            {r.description}",
             "overrides   " + " ".join(r.training_overrides()),
             f"grid        kappa {list(r.grid.kappa_bits)} H {list(r.grid.latent_bits)} seeds "
             f"{list(r.grid.seeds)} controls {list(r.grid.controls) or 'none'}",
             f"steps       {r.steps:,} x {r.tokens_per_step:,} tokens",
             f"eval        {r.eval.points} points, Table 3 averages points "
             f"{list(r.table3_points())}; runs: "
             + " | ".join(" ".join(a) for a in r.eval_runs()),
             "micro-batch (per GPU type; gradient accumulation keeps the global batch)"]
    table = r.micro_batches()
    for gpu in GPU_TYPES:
        mb = table.get(gpu)
        if mb is None:
            lines.append(f"  {gpu:<11} {r.not_measured(gpu)}")
        else:
            ck = ", activation checkpointing" if mb.activation_checkpointing else ""
            lines.append(f"  {gpu:<11} {mb.parallel}, micro {mb.micro_batch_size} x accum "
                         f"{mb.grad_accum}{ck} ({mb.measured_gb:.1f} GB measured)")
    return "\n".join(lines)


def micro_table(r: Recipe) -> str:
    """Markdown table of micro_batches() for docs/RECIPES.md."""
    rows = ["| GPU | parallel | micro-batch | grad accum | act. ckpt | peak (measured) |",
            "|---|---|---|---|---|---|"]
    rows += [f"| {mb.gpu} | {mb.parallel} | {mb.micro_batch_size} | {mb.grad_accum} | "
             f"{'yes' if mb.activation_checkpointing else 'no'} | {mb.measured_gb:.1f} GB |"
             for mb in r.micro_batches().values()]
    return "\n".join(rows)


def measure(rec: Recipe, gpus: Sequence[str]) -> list[dict[str, Any]]:
    """MEASURED_RECORDS' entries for `rec` on each GPU type: `experiments.memory.fit` from the
    whole per-GPU batch down (the largest micro-batch whose measured training, validation and
    save peaks fit, then each with activation checkpointing), with every try and the measured
    phases of the choice (backend.fit_memory says how the parallelism is chosen). Fake tensors:
    minutes on a CPU, no GPU."""
    from .backend import fit_memory

    out: list[dict[str, Any]] = []
    per_gpu = rec.train.batch_size // rec.train.gpus
    for gpu in gpus:
        mb = MicroBatch(gpu, GPU_TYPES[gpu], "ddp", per_gpu, 1, False, 0.0)
        f = fit_memory(lambda par, mb=mb: rec.cell_config(dataclasses.replace(mb, parallel=par)),
                       rec.train.gpus, mb.memory_gb)
        print(f"recipe: {rec.name} {gpu}: {f.line()}", file=sys.stderr, flush=True)
        entry: dict[str, Any] = {
            "recipe": rec.name, "gpu": gpu, "memory_gb": GPU_TYPES[gpu],
            "recipe_key": rec.memory_key(), "basis": "measured",
            "fits": f.micro_batch_size is not None,
            "tries": [{"micro_batch_size": m, "activation_checkpointing": ck,
                       "measured_gb": b / 1e9} for m, ck, b in f.tries]}
        if f.micro_batch_size is not None:
            entry.update(parallel=f.records[0].parallel, micro_batch_size=f.micro_batch_size,
                         grad_accum=f.records[0].grad_accum,
                         activation_checkpointing=f.activation_checkpointing,
                         measured_gb=f.tries[-1][2] / 1e9,
                         phases=[r.to_json() for r in f.records])
        out.append(entry)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m sweeps.recipe", description=__doc__.split(
        "\n")[0])
    ap.add_argument("command", choices=["show", "table", "micro", "list", "measure"])
    ap.add_argument("recipe", nargs="?", default="")
    ap.add_argument("--gpus", default=",".join(GPU_TYPES),
                    help=f"measure: comma-separated GPU types (default: all, {list(GPU_TYPES)})")
    a = ap.parse_args(argv)

    def body() -> int:
        if a.command == "list":
            print("\n".join(known()))
        elif a.command == "measure":
            gpus = [g for g in a.gpus.split(",") if g]
            if not gpus or any(g not in GPU_TYPES for g in gpus):
                raise UsageError(f"--gpus {a.gpus}: GPU types are {', '.join(GPU_TYPES)}")
            from common.io import atomic_write_text

            new = {(e["recipe"], e["gpu"]): e for e in measure(load(a.recipe), gpus)}
            old = (json.loads(MEASURED_RECORDS.read_text(encoding="utf-8"))
                   if MEASURED_RECORDS.exists() else [])
            # a re-measured record replaces its old one in place; the others stay as they are
            entries = [new.pop((e["recipe"], e["gpu"]), e) for e in old] + list(new.values())
            atomic_write_text(MEASURED_RECORDS, json.dumps(entries, indent=1) + "\n")
            print(f"{MEASURED_RECORDS}: {len(gpus)} record(s) measured; docs/RECIPES.md's "
                  "table: python -m dev.recipe_memory")
        else:
            print({"show": show, "table": Recipe.table, "micro": micro_table}[a.command](
                load(a.recipe)))
        return 0

    return cli("recipe", body)


if __name__ == "__main__":
    sys.exit(main())
