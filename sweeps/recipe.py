"""Recipes: the paper's protocol (or a small stand-in) as one data file, every value sourced.

A recipe is `sweeps/recipes/<name>.yaml` (or a user's file). Every leaf is written as

    key: {value: <the value>, basis: paper | reference | ours, source: "<where it comes from>"}

so a value cannot enter a recipe without saying where it comes from (docs/RECIPES.md prints the
tables). Sections: model, train, optim, grid, corpus, eval; unknown or missing keys are refused.

`load(name_or_path) -> Recipe` and the Recipe's methods turn it into what the suite's parts take:

- `training_overrides()`: hydra overrides for `python -m experiments.train` (real keys of
  experiments/train/config.py only; a value with no key there is refused with "needs key");
- `sweep_spec()`: a `sweeps.grid.SweepSpec` (kappa, H, seeds, controls; the overrides above);
- `corpus()`: the corpus settings (data source, mixture, vocabulary or tokenizer.json path);
- `eval_runs()`, `eval.points`, `table3_points()`: the evaluation (suite task names, few-shot
  groups, the evenly spaced checkpoints and the ones Table 3 averages);
- `micro_batches()`: the micro-batch per GPU type from experiments.train.plan.memory_estimate
  (gradient accumulation keeps the global batch, so it never changes what is trained).

Bad input raises RecipeError: one line naming the file and the key. `python -m sweeps.recipe
show|table NAME` prints a recipe (exit 2 and one line on bad input).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from common.errors import UsageError, cli
from common.text import one_line

if TYPE_CHECKING:
    from .grid import SweepSpec

RECIPES_DIR = Path(__file__).resolve().parent / "recipes"
BASES = ("paper", "reference", "ours")
"""paper: stated by Fleuret 2025 (arXiv 2510.17558); reference: filled from a named public
report or config; ours: our choice, the source says why."""
SCHEDULES = ("cosine",)
"""Schedules the trainer implements (experiments/train/trainer.py: linear warmup, cosine decay
to lr x optim.min_lr_ratio). Another one needs a config key first."""
Z_MODES = ("prior", "prior-k")
"""How Z is drawn when scoring; `posterior` leaks the scored tokens and is no protocol."""

MEASURED_RECORDS = Path(__file__).resolve().parents[1] / "docs" / "memory" / "recipes.json"
"""pipelines/recipe_memory.py's records: each recipe's measured peaks per phase and GPU type,
and the micro-batch it chose by them (`Recipe.measured_micro_batches`)."""
GPU_TYPES: dict[str, float] = {"H100-80GB": 80.0, "A100-40GB": 40.0, "A100-80GB": 80.0,
                               "H200-141GB": 141.0}
"""GPU memory in decimal GB as the vendors quote it (NVIDIA data sheets)."""
USABLE_FRACTION = 0.9
"""Share of a GPU's memory a micro-batch may fill by memory_estimate: that estimate leaves out
the CUDA context, NCCL buffers and allocator fragmentation (a few GB), so 10% stays free."""

_SECTIONS: dict[str, tuple[str, ...]] = {
    "model": ("preset", "mapper_bf16"),
    "train": ("tokens", "seq_len", "batch_size", "precision", "gpus", "compile"),
    "optim": ("lr", "schedule", "min_lr_ratio", "warmup_steps", "weight_decay", "grad_clip",
              "beta1", "beta2", "eps"),
    "grid": ("kappa_bits", "latent_bits", "seeds", "controls"),
    "corpus": ("data", "sources", "paths", "vocab_size", "tokenizer", "bytes_per_token",
               "max_bytes", "val_tokens", "val_fraction"),
    "eval": ("tasks", "fewshot", "points", "average_last", "z"),
}
_TOP = ("description", *_SECTIONS)


RecipeError = UsageError
"""The old name, while pipelines/gpu_check.py imports it."""


@dataclass(frozen=True)
class Provenance:
    basis: str
    source: str


@dataclass(frozen=True)
class HFSourceSpec:
    """One entry of an `hf` mixture (the trainer's data.hf_sources[] fields)."""

    path: str
    weight: float
    name: str | None = None
    split: str = "train"
    field: str = "text"
    category: str = ""
    """What share of the mixture it stands for (general, math, code): documentation only."""


@dataclass(frozen=True)
class TrainSpec:
    tokens: float
    seq_len: int
    batch_size: int
    """Global batch in sequences per optimizer step."""
    precision: str
    gpus: int
    """The world size the recipe is planned for (train.plan_world_size; non-semantic)."""
    compile: bool
    """train.compile: torch.compile each block (inductor; non-semantic, same results)."""


@dataclass(frozen=True)
class OptimSpec:
    lr: float
    schedule: str
    min_lr_ratio: float
    warmup_steps: int
    weight_decay: float
    grad_clip: float
    beta1: float
    beta2: float
    eps: float


@dataclass(frozen=True)
class GridSpec:
    kappa_bits: tuple[float, ...]
    latent_bits: tuple[int, ...]
    seeds: tuple[int, ...]
    controls: tuple[str, ...]
    """User-facing control names of sweeps.grid.CONTROLS: flops, plus1, plus1_flops."""


@dataclass(frozen=True)
class CorpusSpec:
    data: str
    """A data source of experiments/train/config.py (stdlib | files | hf | synthetic)."""
    sources: tuple[HFSourceSpec, ...]
    paths: tuple[str, ...]
    vocab_size: int
    tokenizer: str | None
    """A tokenizer.json path to use instead of training a BPE (data.tokenizer)."""
    bytes_per_token: float | None
    """hf: text bytes per token, to stream enough text for one pass over the token budget."""
    max_bytes: int | None
    val_tokens: int | None
    val_fraction: float | None = None
    """data.val_fraction (null: the trainer's default): the held-out share, sized to what
    validation reads (data.val_tokens) rather than 5% of a 47B-token corpus."""


@dataclass(frozen=True)
class RecipeEval:
    """A recipe's evaluation section: which tasks, how many shots, at how many points. Not an
    eval file's spec (common.records.EvalSpec): experiments.eval derives that from these."""

    tasks: tuple[str, ...]
    fewshot: Mapping[str, int]
    """task -> shots, for the tasks whose count is set; absent: the stock task's own count."""
    points: int
    """Evenly spaced checkpoints evaluated (sweeps' EVAL_POINTS)."""
    average_last: float
    """Table 3 averages the benchmarks over this last fraction of training."""
    z: str


@dataclass(frozen=True)
class MicroBatch:
    """What one GPU type runs for a recipe: the largest micro-batch whose estimated memory fits
    USABLE_FRACTION of the GPU (without activation checkpointing when possible)."""

    gpu: str
    memory_gb: float
    parallel: str
    micro_batch_size: int | None
    """None: not even one sequence fits, with activation checkpointing."""
    grad_accum: int | None
    activation_checkpointing: bool
    estimate_gb: float | None
    """The estimate (decimal GB) of the costliest arm at this micro-batch."""
    basis: str = "hand estimate"
    """How it was chosen: "hand estimate" (memory_estimate, not measured at this recipe's
    present settings) or "measured" (the largest whose fake-tensor peaks of training,
    validation and save fit USABLE_FRACTION, pipelines/recipe_memory.py, MEASURED_RECORDS)."""
    measured_gb: float | None = None
    """With basis "measured": the largest measured peak of those phases, decimal GB."""


def _quote(text: str) -> str:
    """A string as a quoted hydra override value, so ',', ':', '=' or spaces in a path or a
    dataset name cannot split it."""
    # hydra's rule: inside quotes only a quote, and backslashes right before one (or before
    # the closing quote), are escaped
    body = re.sub(r"(\\*)('|$)",
                  lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), text)
    return f"'{body}'"


def _fmt(v: float) -> str:
    """Shortest exact text of a number for an override: 2.0 -> '2', 4e-4 -> '0.0004'."""
    return str(int(v)) if float(v).is_integer() else repr(float(v))


@dataclass(frozen=True)
class Recipe:
    name: str
    path: str
    description: str
    preset: str
    mapper_bf16: bool
    """model.mapper_bf16: the binary mapper's dense backward matmul from bf16 inputs (part of
    the run-id when on)."""
    train: TrainSpec
    optim: OptimSpec
    grid: GridSpec
    corpus: CorpusSpec
    eval: RecipeEval
    provenance: Mapping[str, Provenance] = field(default_factory=dict)
    """'<section>.<key>' -> where the value comes from (every key has one)."""

    # ------------------------------------------------------------------ validation
    def _bad(self, key: str, value: Any, problem: str) -> UsageError:
        return UsageError(f"{self.path}: {key}={value!r}: {problem}")

    def _int(self, key: str, v: Any, lo: int = 1) -> None:
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            raise self._bad(key, v, f"must be an integer >= {lo}")

    def _num(self, key: str, v: Any, lo: float = 0.0, hi: float | None = None,
             lo_open: bool = False, hi_open: bool = False) -> None:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        ok = ok and (v > lo if lo_open else v >= lo)
        if ok and hi is not None:
            ok = v < hi if hi_open else v <= hi
        if not ok:
            rng = f"{'(' if lo_open else '['}{lo:g}, {'inf' if hi is None else f'{hi:g}'}" \
                  f"{')' if hi_open or hi is None else ']'}"
            raise self._bad(key, v, f"must be a finite number in {rng}")

    def _str(self, key: str, v: Any, allowed: Sequence[str] | None = None) -> None:
        if not isinstance(v, str) or not v.strip():
            raise self._bad(key, v, "must be a non-empty string")
        if allowed is not None and v not in allowed:
            raise self._bad(key, v, f"allowed values {list(allowed)}")

    def _bool(self, key: str, v: Any) -> None:
        if not isinstance(v, bool):
            raise self._bad(key, v, "must be true or false")

    def _seq(self, key: str, v: Any) -> None:
        if not isinstance(v, tuple) or not v:
            raise self._bad(key, v, "must be a non-empty list")
        if not all(isinstance(x, (str, int, float, HFSourceSpec)) for x in v):
            raise self._bad(key, list(v), "must be a list of plain values")
        if len(set(v)) != len(v):
            raise self._bad(key, v, "has a repeated value")

    def __post_init__(self) -> None:
        from model import PRESETS
        from model.config import MAX_LATENT_BITS

        from .backend import DATA_SOURCES, PRECISIONS
        from .grid import CONTROLS

        self._str("model.preset", self.preset, list(PRESETS))
        self._bool("model.mapper_bf16", self.mapper_bf16)
        t = self.train
        self._num("train.tokens", t.tokens, lo_open=True)
        self._int("train.seq_len", t.seq_len)
        self._int("train.batch_size", t.batch_size)
        self._str("train.precision", t.precision, [str(p) for p in PRECISIONS])
        self._int("train.gpus", t.gpus)
        self._bool("train.compile", t.compile)
        if t.batch_size % t.gpus:
            raise self._bad("train.batch_size", t.batch_size,
                            f"must be a multiple of train.gpus={t.gpus}")
        if t.seq_len > PRESETS[self.preset].max_seq_len:
            raise self._bad("train.seq_len", t.seq_len, f"exceeds the {self.preset} preset's "
                            f"max_seq_len={PRESETS[self.preset].max_seq_len}")
        o = self.optim
        self._num("optim.lr", o.lr, lo_open=True)
        self._str("optim.schedule", o.schedule)
        if o.schedule not in SCHEDULES:
            raise self._bad("optim.schedule", o.schedule, f"needs key optim.schedule: the "
                            f"trainer implements {list(SCHEDULES)} only")
        self._num("optim.min_lr_ratio", o.min_lr_ratio, hi=1.0)
        self._int("optim.warmup_steps", o.warmup_steps, lo=0)
        self._num("optim.weight_decay", o.weight_decay)
        self._num("optim.grad_clip", o.grad_clip)
        self._num("optim.beta1", o.beta1, hi=1.0, hi_open=True)
        self._num("optim.beta2", o.beta2, hi=1.0, hi_open=True)
        self._num("optim.eps", o.eps, lo_open=True)
        g = self.grid
        for key, vals in (("grid.kappa_bits", g.kappa_bits), ("grid.latent_bits", g.latent_bits),
                          ("grid.seeds", g.seeds)):
            self._seq(key, vals)
        for k in g.kappa_bits:
            self._num("grid.kappa_bits", k)
        for h in g.latent_bits:
            self._int("grid.latent_bits", h)
            if h > MAX_LATENT_BITS:
                raise self._bad("grid.latent_bits", h, f"must be <= {MAX_LATENT_BITS}")
        for s in g.seeds:
            self._int("grid.seeds", s, lo=0)
        if not isinstance(g.controls, tuple) or len(set(g.controls)) != len(g.controls):
            raise self._bad("grid.controls", g.controls, "must be a list without repeats")
        for c in g.controls:
            self._str("grid.controls", c, list(CONTROLS))
        if PRESETS[self.preset].n_layers % 2:
            raise self._bad("model.preset", self.preset, "a Free Transformer needs an even "
                            "layer count")
        c = self.corpus
        self._str("corpus.data", c.data, [str(s) for s in DATA_SOURCES])
        self._int("corpus.vocab_size", c.vocab_size, lo=258)  # byte-level BPE: 256 + eos + 1
        if c.tokenizer is not None:
            self._str("corpus.tokenizer", c.tokenizer)
        if c.data == "hf":
            self._seq("corpus.sources", c.sources)
            for s in c.sources:
                self._str("corpus.sources[].path", s.path)
                self._num("corpus.sources[].weight", s.weight, lo_open=True)
            if c.bytes_per_token is None:
                raise self._bad("corpus.bytes_per_token", None, "data=hf needs it (how much "
                                "text one pass over train.tokens streams)")
            self._num("corpus.bytes_per_token", c.bytes_per_token, lo_open=True)
        else:
            if c.sources:
                raise self._bad("corpus.sources", "[...]", f"only data=hf takes a mixture "
                                f"(data={c.data})")
            if c.bytes_per_token is not None:
                raise self._bad("corpus.bytes_per_token", c.bytes_per_token,
                                f"only data=hf streams text by the byte (data={c.data})")
        if c.data == "files" and not c.paths:
            raise self._bad("corpus.paths", list(c.paths), "data=files needs glob patterns")
        if c.data != "files" and c.paths:
            raise self._bad("corpus.paths", list(c.paths), "only data=files takes paths")
        if c.max_bytes is not None:
            self._int("corpus.max_bytes", c.max_bytes)
        if c.val_tokens is not None:
            self._int("corpus.val_tokens", c.val_tokens)
        if c.val_fraction is not None:
            self._num("corpus.val_fraction", c.val_fraction, lo_open=True, hi=1.0, hi_open=True)
        e = self.eval
        from .backend import eval_task_names

        known = eval_task_names()
        self._seq("eval.tasks", e.tasks)
        for task in e.tasks:
            self._str("eval.tasks", task, list(known))
        for task, n in e.fewshot.items():
            if task not in e.tasks:
                raise self._bad("eval.fewshot", task, "names a task not in eval.tasks")
            self._int(f"eval.fewshot.{task}", n, lo=0)
        self._int("eval.points", e.points, lo=2)  # a curve needs two points (as EVAL_POINTS)
        self._num("eval.average_last", e.average_last, lo_open=True, hi=1.0)
        self._str("eval.z", e.z, list(Z_MODES))
        if not self.table3_points():
            raise self._bad("eval.points", e.points, f"no evaluation point falls in the last "
                            f"{e.average_last:g} of training that Table 3 averages")
        for key in _leaf_keys(self):
            p = self.provenance.get(key)
            if p is None or p.basis not in BASES or not p.source.strip():
                raise self._bad(key, "(provenance)", f"needs basis in {list(BASES)} and a "
                                "non-empty source")

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
        steps = self.steps
        L = mc.n_layers
        for c in self.grid.controls:
            if not c.endswith("flops"):
                continue  # the +1-layer control trains the equal tokens
            arm = mc.replace(latent_bits=0, n_layers=L + 1 if c.startswith("plus1") else L)
            fa = train_flops_per_token(arm, T).total
            for h in self.grid.latent_bits:
                ff = train_flops_per_token(mc.replace(latent_bits=h, n_layers=L), T).total
                budget = self.steps * tps * ff
                steps = max(steps, math.ceil(budget / (fa * tps) - 1e-9))
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
        n = self.eval.points
        start = Fraction(1) - Fraction(self.eval.average_last).limit_denominator(1000)
        return tuple(k for k in range(1, n + 1) if Fraction(k, n) > start)

    # ------------------------------------------------------------------ outputs
    def training_overrides(self, *, groups: bool = True, budget: bool = True,
                           gpu: str | None = None) -> tuple[str, ...]:
        """Hydra overrides for experiments.train (either arm: the grid adds latent_bits, kappa).

        groups: lead with `model=<preset>` and `data=<source>` (False for SweepSpec, which
        writes them itself); budget: include train.tokens (False for SweepSpec); gpu: a key of
        GPU_TYPES whose micro-batch, parallelism and checkpointing are added."""
        t, o, c = self.train, self.optim, self.corpus
        ov: list[str] = [f"model={self.preset}", f"data={c.data}"] if groups else []
        ov += [f"model.vocab_size={c.vocab_size}",
               f"model.mapper_bf16={str(self.mapper_bf16).lower()}"]
        ov += self.corpus_overrides()
        ov += [f"train.seq_len={t.seq_len}", f"train.batch_size={t.batch_size}"]
        if budget:
            ov.append(f"train.tokens={_fmt(t.tokens)}")
        ov += [f"train.precision={t.precision}", f"train.plan_world_size={t.gpus}",
               f"train.compile={str(t.compile).lower()}",
               f"optim.lr={_fmt(o.lr)}", f"optim.min_lr_ratio={_fmt(o.min_lr_ratio)}",
               f"optim.warmup_steps={o.warmup_steps}",
               f"optim.weight_decay={_fmt(o.weight_decay)}",
               f"optim.grad_clip={_fmt(o.grad_clip)}", f"optim.beta1={_fmt(o.beta1)}",
               f"optim.beta2={_fmt(o.beta2)}", f"optim.eps={_fmt(o.eps)}"]
        if gpu is not None:
            table = self.micro_batches()
            if gpu not in table:
                raise UsageError(f"{self.path}: unknown GPU type {gpu!r}; known: "
                                  f"{list(GPU_TYPES)}")
            mb = table[gpu]
            if mb.micro_batch_size is None:
                raise UsageError(f"{self.path}: recipe {self.name} does not fit a {gpu} even "
                                  "at micro-batch 1 with activation checkpointing")
            from .backend import gpu_peak_tflops

            name = gpu.split("-")[0]  # "A100-40GB" -> A100: its device names contain it
            peak, _ = gpu_peak_tflops(name)
            ov += [f"train.micro_batch_size={mb.micro_batch_size}", f"train.gpu_name={name}",
                   *([f"train.gpu_peak_tflops={_fmt(peak)}"] if peak else []),
                   f"train.gpu_memory_gb={_fmt(mb.memory_gb)}", f"train.parallel={mb.parallel}",
                   f"train.activation_checkpointing={str(mb.activation_checkpointing).lower()}"]
        return tuple(ov)

    def corpus_overrides(self) -> list[str]:
        """The data.* overrides of the corpus settings (without `data=<source>`)."""
        from . import backend as C  # C.DataConfig: the trainer's data keys

        c = self.corpus
        ov: list[str] = []
        if c.tokenizer is not None:
            if "tokenizer" not in {f.name for f in dataclasses.fields(C.DataConfig)}:
                raise UsageError(f"{self.path}: corpus.tokenizer={c.tokenizer!r}: needs key "
                                  "data.tokenizer (experiments/train/config.py has none yet)")
            ov.append(f"data.tokenizer={_quote(c.tokenizer)}")
        if c.data == "hf":
            items = []
            for s, passes in zip(c.sources, self.source_passes, strict=True):
                d = {"path": _quote(s.path), "name": s.name and _quote(s.name),
                     "split": _quote(s.split), "field": _quote(s.field),
                     "weight": _fmt(s.weight), "passes": str(passes)}
                items.append("{" + ",".join(f"{k}:{v}" for k, v in d.items() if v is not None)
                             + "}")
            ov.append(f"data.hf_sources=[{','.join(items)}]")
            ov.append(f"data.hf_max_bytes={self.hf_max_bytes}")
        if c.paths:
            ov.append(f"data.paths=[{','.join(_quote(p) for p in c.paths)}]")
        if c.max_bytes is not None:
            ov.append(f"data.max_bytes={c.max_bytes}")
        if c.val_tokens is not None:
            ov.append(f"data.val_tokens={c.val_tokens}")
        if c.val_fraction is not None:
            ov.append(f"data.val_fraction={_fmt(c.val_fraction)}")
        return ov

    def sweep_spec(self, *, seeds: Sequence[int] | None = None, gpu: str | None = None,
                   extra: Sequence[str] = ()) -> SweepSpec:
        """The recipe's grid as a sweeps.grid.SweepSpec. seeds: replace the recipe's; gpu: a key
        of GPU_TYPES whose micro-batch settings are added; extra: overrides that win over the
        recipe's own for the same key (e.g. train.plan_world_size=256, a user's OVERRIDES)."""
        from .grid import CONTROLS, SweepSpec

        return SweepSpec(
            kappa_bits=tuple(float(k) for k in self.grid.kappa_bits),
            latent_bits=self.grid.latent_bits,
            seeds=tuple(seeds) if seeds is not None else self.grid.seeds,
            preset=self.preset, data=self.corpus.data, tokens=float(self.train.tokens),
            controls=tuple(CONTROLS[c] for c in self.grid.controls),
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
            argv = ["--tasks", ",".join(groups[n]), "--z", e.z]
            if n is not None:
                argv += ["--fewshot", str(n)]
            runs.append(argv)
        return runs

    def memory_key(self) -> str:
        """What the measured micro-batches were measured for: a hash of every training override
        but the micro-batch settings (a changed recipe is not the one measured)."""
        ov = self.training_overrides(budget=False)
        return hashlib.sha256(json.dumps(list(ov)).encode()).hexdigest()[:16]

    def micro_batches(self) -> dict[str, MicroBatch]:
        """Per GPU type: the measured choice (`measured_micro_batches`) where the committed
        records hold one for this recipe as it is now, else the hand estimate's
        (`hand_micro_batches`)."""
        out = self.hand_micro_batches()
        out.update(self.measured_micro_batches())
        return out

    def measured_micro_batches(self) -> dict[str, MicroBatch]:
        """The micro-batch per GPU type that pipelines/recipe_memory.py chose by measurement
        (MEASURED_RECORDS), for this recipe as it is now (`memory_key`); a GPU type it did not
        measure, or a changed recipe, is absent."""
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
                                      bool(e["activation_checkpointing"]), e.get("estimate_gb"),
                                      basis="measured", measured_gb=e.get("measured_gb"))
        return out

    def hand_micro_batches(self) -> dict[str, MicroBatch]:
        """Per GPU type: parallelism (experiments.train.parallel's auto rule), the largest
        micro-batch dividing the per-GPU batch whose memory_estimate fits USABLE_FRACTION of the
        GPU, for the costliest arm of the grid (the H=max Free Transformer, and the +1-layer
        baseline when that control is on), without activation checkpointing when possible."""
        import model as M

        from .backend import compose_overrides as compose
        from .backend import ddp_fit_rule, memory_estimate
        from .backend import run_plan as plan

        DDP_BYTES_PER_PARAM, FIT_FRACTION = ddp_fit_rule()

        cfg = compose(list(self.training_overrides()))
        base = plan(cfg, world_size=self.train.gpus)
        mc = base.model
        arms = [mc.replace(latent_bits=max(self.grid.latent_bits),
                           kappa_bits=float(self.grid.kappa_bits[0]))]
        if any(c.startswith("plus1") for c in self.grid.controls):
            arms.append(mc.replace(n_layers=mc.n_layers + 1))
        per_gpu = self.train.batch_size // self.train.gpus
        out: dict[str, MicroBatch] = {}
        for gpu, gb in GPU_TYPES.items():
            cap = USABLE_FRACTION * gb * 1e9
            biggest = max(M.param_count(a)["total"] for a in arms)
            par = "none" if self.train.gpus == 1 else (
                "fsdp" if DDP_BYTES_PER_PARAM * biggest > FIT_FRACTION * gb * 1e9 else "ddp")
            choice: MicroBatch | None = None
            for ckpt in (False, True):
                for m in (d for d in range(per_gpu, 0, -1) if per_gpu % d == 0):
                    worst = 0.0
                    for a in arms:
                        p = dataclasses.replace(base, model=a, micro_batch_size=m,
                                                grad_accum=per_gpu // m)
                        est = memory_estimate(p, par)
                        worst = max(worst, est["total_checkpointed" if ckpt else "total"])
                    if worst <= cap:
                        choice = MicroBatch(gpu, gb, par, m, per_gpu // m, ckpt, worst / 1e9)
                        break
                if choice is not None:
                    break
            out[gpu] = choice or MicroBatch(gpu, gb, par, None, None, True, None)
        return out

    def filled(self) -> list[tuple[str, str, str, str]]:
        """(key, value, basis, source) of every value the paper does not state (basis reference
        or ours): what a reviewer must know was chosen for it."""
        out = []
        for key in _leaf_keys(self):
            p = self.provenance[key]
            if p.basis != "paper":
                v = _value_of(self, key)
                out.append((key, _show(_fraction(v)) if key in _FRACTION_KEYS else _show(v),
                            p.basis, p.source))
        return out

    def table(self) -> str:
        """Markdown: every value with its basis and source, then the derived values."""
        rows = ["| key | value | basis | source |", "|---|---|---|---|"]
        for key in _leaf_keys(self):
            p = self.provenance[key]
            v = _value_of(self, key)
            shown = _show(_fraction(v)) if key in _FRACTION_KEYS else _show(v)
            rows.append(f"| {key} | {shown} | {p.basis} | {p.source} |")
        gbt = self.tokens_per_step
        rows += ["", "| derived | value |", "|---|---|",
                 f"| global batch | {self.train.batch_size:,} sequences x {self.train.seq_len:,}"
                 f" = {gbt:,} tokens |",
                 f"| steps (equal-tokens arms) | {self.steps:,} "
                 f"({self.steps * gbt:,} tokens) |",
                 f"| warmup share | {self.optim.warmup_steps:,} steps = "
                 f"{min(1.0, self.optim.warmup_steps / self.steps):.1%} of the steps |",
                 f"| per-GPU batch | {self.train.batch_size // self.train.gpus} sequences on "
                 f"{self.train.gpus} GPU(s) |",
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


def _leaf_keys(r: Recipe) -> list[str]:
    return [f"{s}.{k}" for s, keys in _SECTIONS.items() for k in keys]


def _value_of(r: Recipe, key: str) -> Any:
    section, k = key.split(".")
    if section == "model":
        return getattr(r, k)
    return getattr(getattr(r, section), k)


_FRACTION_KEYS = ("grid.kappa_bits", "eval.average_last")
"""Shown as the paper writes them (1/4, 1/3)."""


def _fraction(v: Any) -> Any:
    if isinstance(v, tuple):
        return tuple(_fraction(x) for x in v)
    f = Fraction(v).limit_denominator(64)
    return str(f) if abs(float(f) - v) < 1e-9 else v


def _show(v: Any) -> str:
    if isinstance(v, tuple) and v and isinstance(v[0], HFSourceSpec):
        return "<br>".join(f"{s.path}" + (f" ({s.name})" if s.name else "")
                           + f", field {s.field}, weight {s.weight:g}"
                           + (f" [{s.category}]" if s.category else "") for s in v)
    if isinstance(v, tuple):
        return "[" + ", ".join(_show(x) for x in v) + "]" if v else "[]"
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
    """A recipe name (sweeps/recipes/<name>.yaml) or a path to a file; RecipeError if neither."""
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
    """The validated Recipe of a shipped name or a file path (RecipeError: one line)."""
    path = resolve(name_or_path)
    shown = _display(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{shown}: cannot read: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise UsageError(f"{shown}: not valid YAML{where}") from None
    return from_dict(raw, path=shown, name=path.stem)


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def from_dict(raw: Any, *, path: str, name: str) -> Recipe:
    """A Recipe from the parsed YAML (RecipeError naming `path` and the key)."""
    from .backend import parse_amount

    def bad(key: str, problem: str) -> UsageError:
        return UsageError(f"{path}: {key}: {problem}")

    if not isinstance(raw, dict):
        raise bad("(top)", "must be a mapping of sections "
                  f"{list(_SECTIONS)}")
    unknown = sorted(set(map(str, raw)) - set(_TOP))
    if unknown:
        raise bad(unknown[0], f"unknown key; allowed: {list(_TOP)}")
    values: dict[str, Any] = {}
    prov: dict[str, Provenance] = {}
    for section, keys in _SECTIONS.items():
        sec = raw.get(section)
        if not isinstance(sec, dict):
            raise bad(section, "missing section" if sec is None else "must be a mapping")
        extra = sorted(set(map(str, sec)) - set(keys))
        if extra:
            raise bad(f"{section}.{extra[0]}", f"unknown key; allowed: {list(keys)}")
        for k in keys:
            full = f"{section}.{k}"
            if k not in sec:
                raise bad(full, "missing (every key is written, with its basis and source)")
            leaf = sec[k]
            if not isinstance(leaf, dict) or set(leaf) != {"value", "basis", "source"}:
                raise bad(full, "must be {value: ..., basis: paper|reference|ours, "
                          "source: '...'}")
            if leaf["basis"] not in BASES:
                raise bad(full, f"basis {leaf['basis']!r}: allowed {list(BASES)}")
            if not isinstance(leaf["source"], str) or not leaf["source"].strip():
                raise bad(full, "source must be a non-empty string")
            prov[full] = Provenance(leaf["basis"], " ".join(leaf["source"].split()))
            values[full] = leaf["value"]
    desc = raw.get("description", "")
    if not isinstance(desc, str):
        raise bad("description", "must be a string")

    def seq(key: str, conv: Any = None) -> tuple:
        v = values[key]
        if v is None:
            return ()
        if not isinstance(v, list):
            raise bad(key, f"{v!r} must be a list")
        return tuple(conv(key, x) if conv else x for x in v)

    def kappa(key: str, x: Any) -> float:
        if isinstance(x, str) and "/" in x:  # 1/4, as the paper writes it
            try:
                return float(Fraction(x))
            except (ValueError, ZeroDivisionError):
                raise bad(key, f"{x!r} is not a number") from None
        if not isinstance(x, (int, float)) or isinstance(x, bool):
            raise bad(key, f"{x!r} is not a number")
        return float(x)

    tokens = values["train.tokens"]
    if isinstance(tokens, str):
        try:
            tokens = parse_amount(tokens, "train.tokens")
        except ValueError as e:
            raise bad("train.tokens", str(e)) from None

    def source(key: str, x: Any) -> HFSourceSpec:
        allowed = {f.name for f in dataclasses.fields(HFSourceSpec)}
        if not isinstance(x, dict):
            raise bad(key, f"{x!r}: each source is a mapping with keys {sorted(allowed)}")
        extra = sorted(set(map(str, x)) - allowed)
        if extra:
            raise bad(key, f"unknown key {extra[0]!r}; allowed: {sorted(allowed)}")
        for k in ("path", "weight"):
            if k not in x:
                raise bad(key, f"a source needs {k!r}")
        for k in ("path", "name", "split", "field", "category"):
            if k in x and x[k] is not None and not isinstance(x[k], str):
                raise bad(key, f"{k}={x[k]!r} must be a string")
        return HFSourceSpec(**x)

    fewshot = values["eval.fewshot"]
    if fewshot is None:
        fewshot = {}
    if not isinstance(fewshot, dict):
        raise bad("eval.fewshot", f"{fewshot!r} must be a mapping task -> shots")
    try:
        return Recipe(
            name=name, path=path, description=" ".join(desc.split()),
            preset=values["model.preset"], mapper_bf16=values["model.mapper_bf16"],
            train=TrainSpec(tokens=tokens, seq_len=values["train.seq_len"],
                            batch_size=values["train.batch_size"],
                            precision=values["train.precision"], gpus=values["train.gpus"],
                            compile=values["train.compile"]),
            optim=OptimSpec(**{k: values[f"optim.{k}"] for k in _SECTIONS["optim"]}),
            grid=GridSpec(kappa_bits=seq("grid.kappa_bits", kappa),
                          latent_bits=seq("grid.latent_bits"), seeds=seq("grid.seeds"),
                          controls=seq("grid.controls")),
            corpus=CorpusSpec(data=values["corpus.data"],
                              sources=seq("corpus.sources", source),
                              paths=seq("corpus.paths"),
                              vocab_size=values["corpus.vocab_size"],
                              tokenizer=values["corpus.tokenizer"],
                              bytes_per_token=values["corpus.bytes_per_token"],
                              max_bytes=values["corpus.max_bytes"],
                              val_tokens=values["corpus.val_tokens"],
                              val_fraction=values["corpus.val_fraction"]),
            eval=RecipeEval(tasks=seq("eval.tasks"), fewshot=dict(fewshot),
                            points=values["eval.points"],
                            average_last=kappa("eval.average_last",
                                               values["eval.average_last"]),
                            z=values["eval.z"]),
            provenance=prov)
    except TypeError as e:  # a value of a type the dataclasses cannot even hold
        raise UsageError(f"{path}: {one_line(e)}") from None


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
    for mb in r.micro_batches().values():
        if mb.micro_batch_size is None:
            lines.append(f"  {mb.gpu:<11} does not fit, even at 1 with activation checkpointing")
        else:
            ck = ", activation checkpointing" if mb.activation_checkpointing else ""
            how = (f"{mb.measured_gb:.1f} GB measured" if mb.basis == "measured"
                   and mb.measured_gb is not None else f"{mb.estimate_gb:.1f} GB estimated")
            lines.append(f"  {mb.gpu:<11} {mb.parallel}, micro {mb.micro_batch_size} x accum "
                         f"{mb.grad_accum}{ck} ({how})")
    return "\n".join(lines)


def micro_table(r: Recipe) -> str:
    """Markdown table of micro_batches() for docs/RECIPES.md."""
    rows = ["| GPU | parallel | micro-batch | grad accum | act. ckpt | chosen by | peak |",
            "|---|---|---|---|---|---|---|"]
    for mb in r.micro_batches().values():
        if mb.micro_batch_size is None:
            rows.append(f"| {mb.gpu} | {mb.parallel} | does not fit | - | - | {mb.basis} | - |")
        else:
            peak = (f"{mb.measured_gb:.1f} GB measured" if mb.basis == "measured"
                    and mb.measured_gb is not None else f"{mb.estimate_gb:.1f} GB estimated")
            rows.append(f"| {mb.gpu} | {mb.parallel} | {mb.micro_batch_size} | {mb.grad_accum}"
                        f" | {'yes' if mb.activation_checkpointing else 'no'} | {mb.basis} | "
                        f"{peak} |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m sweeps.recipe", description=__doc__.split(
        "\n")[0])
    ap.add_argument("command", choices=["show", "table", "micro", "list"])
    ap.add_argument("recipe", nargs="?", default="")
    a = ap.parse_args(argv)

    def body() -> int:
        if a.command == "list":
            print("\n".join(known()))
            return 0
        try:
            r = load(a.recipe)
            print({"show": show, "table": Recipe.table, "micro": micro_table}[a.command](r))
        except UsageError:
            raise
        except ValueError as e:  # ConfigError from composing: bad input too
            raise UsageError(one_line(e)) from None
        return 0

    return cli("recipe", body)


if __name__ == "__main__":
    sys.exit(main())
