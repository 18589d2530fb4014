"""Typed records for every file the suite writes, standard library only (analysis/ imports it
without torch); what each file holds and how schema versions read: docs/RESULTS.md, "Records
and schema versions". Every record reads and writes through `_Record`; keys no field types are
kept in `extra`. A manifest cell's state transitions are methods of `ManifestCell`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

from . import arms, benchmarks
from .errors import UsageError

SCHEMAS = {"run": "ftbench-run-v1", "eval": "ftbench-eval-v1",
           "likelihood": "ftbench-likelihood-v1", "manifest": "ftbench-manifest-v1",
           "metrics": "ftbench-metrics-v1"}
"""The schema each record writes (the newest this code reads)."""

Z_MODES = ("prior", "prior-k", "posterior")
EVALPLUS_TASKS = benchmarks.tasks(suite="evalplus")
LOGLIK_TASKS = benchmarks.tasks(scoring="loglik")
"""Stock tasks scored by log-likelihood only: no generation length in their spec."""
FLOPS_MATCHED_ARMS = arms.names(compute="flops")
"""Controls trained to the FLOPs of the FT with H = match_latent_bits (common.arms)."""


RecordError = UsageError
"""A result file this code cannot read (one line): the old name, which analysis/, experiments/
and common/paths.py import."""


def _version(d: Mapping[str, Any], kind: str, where: str = "") -> int:
    """The schema version of a file of this kind (1 when it records none); RecordError for a
    newer or foreign one."""
    s = d.get("schema")
    if s is None:
        return 1
    want = SCHEMAS[kind]
    stem = want.rsplit("-v", 1)[0]
    m = re.fullmatch(re.escape(stem) + r"-v(\d+)", str(s))
    if m is None:
        raise RecordError(f"{where or kind + ' file'}: schema {s!r} is not a {stem} schema")
    v = int(m.group(1))
    known = int(want.rsplit("-v", 1)[1])
    if v > known:
        raise RecordError(f"{where or kind + ' file'}: schema {s!r} is newer than this code "
                          f"reads ({want}); update the code")
    return v


def _obj(d: Any, what: str) -> dict[str, Any]:
    if not isinstance(d, Mapping):
        raise RecordError(f"{what}: not a JSON object (got {type(d).__name__})")
    return dict(d)


def _int_or_none(x: Any) -> int | None:
    if x is None or isinstance(x, bool):
        return None
    try:
        return int(x)
    except (TypeError, ValueError):
        return None


def _str(x: Any) -> str | None:
    return None if x is None else str(x)


def _or(default: Any) -> Callable[[Any], Any]:
    """A reader that takes a falsy value (0, "", None) for `default`."""
    return lambda v: v or default


def _mapping(v: Any) -> dict[str, Any]:
    return dict(v) if isinstance(v, Mapping) else {}


def _json_of(v: Any) -> Any:
    return None if v is None else v.to_json()


def _f(default: Any = MISSING, *, factory: Callable[[], Any] | None = None,
       load: Callable[[Any], Any] | None = None, dump: Callable[[Any], Any] | None = None,
       omit: Callable[[Any], bool] | None = None) -> Any:
    """A record field: how its JSON value reads (`load`, applied after a missing or null value
    became the field's default), how it writes (`dump`) and when it is left out (`omit`)."""
    md = {k: v for k, v in (("load", load), ("dump", dump), ("omit", omit)) if v is not None}
    if factory is not None:
        return field(default_factory=factory, metadata=md)
    return field(default=default, metadata=md)


R = TypeVar("R", bound="_Record")


class _Record:
    """to_json/from_json from the dataclass fields, the one path every file goes through: keys
    in declaration order, the keys no field types in the `EXTRA` field; `_f` says how a field
    reads, writes and is left out; `KIND` names the schema, checked on reading (`_version`)."""

    KIND: ClassVar[str | None] = None
    WHAT: ClassVar[str] = "record"
    """What a file that is not a JSON object is called in the error line."""
    EXTRA: ClassVar[str] = "extra"
    WRITES_SCHEMA: ClassVar[bool] = True

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"schema": SCHEMAS[self.KIND]} \
            if self.KIND and self.WRITES_SCHEMA else {}
        for f in fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if f.name == self.EXTRA:
                d.update(v)
            elif not ("omit" in f.metadata and f.metadata["omit"](v)):
                d[f.name] = f.metadata["dump"](v) if "dump" in f.metadata else v
        return d

    @classmethod
    def from_json(cls: type[R], d: Any, name: str = "", **given: Any) -> R:
        """The record of a file's content (`name`: the file, for error lines); `given`: fields
        the caller derived itself."""
        d = _obj(d, name or cls.WHAT)
        if cls.KIND:
            _version(d, cls.KIND, name)
        kw: dict[str, Any] = {}
        for f in fields(cls):  # type: ignore[arg-type]
            if f.name in given or f.name == cls.EXTRA:
                continue
            v = d.get(f.name)
            if v is None:  # a missing or null value is the field's default
                v = f.default_factory() if f.default_factory is not MISSING else (
                    None if f.default is MISSING else f.default)
            kw[f.name] = f.metadata["load"](v) if "load" in f.metadata else v
        own = {f.name for f in fields(cls)} | {"schema"}  # type: ignore[arg-type]
        return cls(**kw, **given, **{cls.EXTRA: {k: v for k, v in d.items() if k not in own}})


def spec_id(spec: Mapping[str, Any]) -> str:
    """First 12 hex of sha256 of the canonical JSON of a spec (docs/RESULTS.md)."""
    canon = json.dumps(spec, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()[:12]


def check_z(z: str) -> str:
    """The z-mode, checked (the one place this is written)."""
    if z not in Z_MODES:
        raise ValueError(f"z={z!r}: allowed {Z_MODES}")
    return z


def effective_k(z: str, k: int) -> int:
    """Draws per request: k under prior-k, else 1 (the one place this rule is written)."""
    return int(k) if z == "prior-k" else 1


def suites_of(tasks: list[str] | tuple[str, ...]) -> dict[str, list[str]]:
    """{suite: its tasks} for the suites the task list touches, in run order."""
    out = {"lm-eval": [t for t in tasks if t not in EVALPLUS_TASKS],
           "evalplus": [t for t in tasks if t in EVALPLUS_TASKS]}
    return {k: v for k, v in out.items() if v}


# ------------------------------------------------------------------------------ eval spec
@dataclass(frozen=True)
class EvalSpec(_Record):
    """What one suite's evaluation does, comparable across runs; hashes to `spec_id`. z_mode
    and k are the requested ones (a baseline has no Z); gen_tokens is None when the suite
    generates nothing; a union spec (suite "lm-eval+evalplus") holds each suite's in `suites`."""

    suite: str = _f(load=str)
    tasks: tuple[str, ...] = _f(load=lambda v: tuple(v or ()), dump=list)
    limit: int | None
    z_mode: str = _f(load=_or("prior"))
    k: int = _f(load=lambda v: 1 if v is None else v)
    fewshot: int | None
    gen_tokens: int | None
    data_checksums: Mapping[str, str] = _f(factory=dict, load=dict, dump=dict)
    context: int | None = _f(None, omit=lambda v: v is None)
    """The window the evaluation scored in, in tokens: the run's train.seq_len. None: a spec
    from before the field (the model's max_seq_len then); absent from its JSON, so its id is
    unchanged."""
    suites: Mapping[str, EvalSpec] | None = _f(
        None, omit=lambda v: v is None, dump=lambda v: {s: sp.to_json() for s, sp in v.items()},
        load=lambda v: {s: EvalSpec.from_json(x) for s, x in v.items() if isinstance(x, dict)}
        if isinstance(v, dict) else None)
    extra: Mapping[str, Any] = field(default_factory=dict)
    WHAT: ClassVar[str] = "eval spec"

    @classmethod
    def from_args(cls, suite: str, tasks: list[str] | tuple[str, ...], limit: int | None,
                  z_mode: str, k: int, fewshot: int | None, gen_tokens: int | None,
                  data_checksums: Mapping[str, str] | None = None,
                  context: int | None = None) -> EvalSpec:
        """The spec of an evaluation asked for with these arguments (the z, k and generation
        rules are applied here, once)."""
        check_z(z_mode)
        gen = suite == "evalplus" or any(t not in LOGLIK_TASKS for t in tasks)
        return cls(suite=suite, tasks=tuple(sorted(tasks)), limit=limit, z_mode=z_mode,
                   k=effective_k(z_mode, k), fewshot=fewshot,
                   gen_tokens=int(gen_tokens) if gen and gen_tokens is not None else None,
                   data_checksums=dict(sorted((data_checksums or {}).items())),
                   context=int(context) if context is not None else None)

    @classmethod
    def union(cls, specs: Mapping[str, EvalSpec]) -> EvalSpec:
        """The manifest's spec of a sweep evaluated on several suites."""
        first = next(iter(specs.values()))
        sums: dict[str, str] = {}
        for s in specs.values():
            sums.update(s.data_checksums)
        return cls(suite="+".join(specs), tasks=tuple(sorted(t for s in specs.values()
                                                                for t in s.tasks)),
                   limit=first.limit, z_mode=first.z_mode, k=first.k, fewshot=first.fewshot,
                   gen_tokens=next((s.gen_tokens for s in specs.values()
                                    if s.gen_tokens is not None), None),
                   data_checksums=dict(sorted(sums.items())), suites=dict(specs),
                   context=first.context)

    @property
    def id(self) -> str:
        """spec_id: the hash of the spec's canonical JSON (as written in the file)."""
        return spec_id(self.to_json())

    def file_name(self, step: int | None) -> str:
        """`<suite>[.<z>][.fewshot<n>][.limit<n>].<spec_id>.step<N>.json` (stepNA: unknown)."""
        parts = [self.suite, *([] if self.z_mode == "prior" else [
            self.z_mode if self.z_mode != "prior-k" else f"prior-k{self.k}"])]
        parts += [f"fewshot{self.fewshot}"] if self.fewshot is not None else []
        parts += [f"limit{self.limit}"] if self.limit is not None else []
        return ".".join([*parts, self.id, f"step{step if step is not None else 'NA'}", "json"])

    def cache_key(self, ckpt_identity: str, seed: int, gen_tokens: int) -> str:
        """The request cache's key: checkpoint identity, z-mode, k, seed, generation length
        (the model's budget, also for suites whose spec records none)."""
        return f"{ckpt_identity[:16]}-{self.z_mode}-k{self.k}-s{seed}-g{gen_tokens}"

    def text(self) -> str:
        """One line a reader can check: suite, tasks, limit, z-mode, k, few-shot, gen length."""
        fs, gen = self.fewshot, self.gen_tokens
        return (f"{self.suite}: tasks {','.join(self.tasks) or '?'}; "
                f"limit {self.limit if self.limit is not None else 'none (full)'}; "
                f"z {self.z_mode}, k {self.k}; few-shot "
                f"{'stock' if fs is None else fs}; gen tokens {gen if gen is not None else '?'}")


@dataclass(frozen=True)
class EvalRequest:
    """What `make eval` is asked for (before the model's window and the data are known): the
    arguments every spec of the run derives from. Things that change no result (device,
    threads, batch size, output folder) are `EvalRuntime`'s."""

    tasks: tuple[str, ...]
    limit: int | None = None
    z_mode: str = "prior"
    k: int = 1
    fewshot: int | None = None
    data: str | None = None
    seed: int = 0
    max_gen_toks: int | None = None
    """None: the adapter's default (256, at most half the model's window)."""

    def __post_init__(self) -> None:
        check_z(self.z_mode)
        object.__setattr__(self, "tasks", tuple(dict.fromkeys(self.tasks)))
        object.__setattr__(self, "k", effective_k(self.z_mode, self.k))

    def suites(self) -> dict[str, list[str]]:
        return suites_of(self.tasks)

    def specs(self, gen_tokens: int | None, checksums: Mapping[str, Mapping[str, str]],
              context: int | None = None) -> dict[str, EvalSpec]:
        """{suite: its spec} with this generation length, {suite: data checksums} and the
        model's evaluation window (its trained seq_len)."""
        return {s: EvalSpec.from_args(s, names, self.limit, self.z_mode, self.k, self.fewshot,
                                      gen_tokens, checksums.get(s, {}), context)
                for s, names in self.suites().items()}


@dataclass(frozen=True)
class EvalRuntime:
    """How an evaluation runs, none of which changes its numbers."""

    device: str | None = None
    batch_size: int = 16
    threads: int = 0
    progress: bool = True
    out_dir: str | None = None


# ------------------------------------------------------------------------------ eval file
@dataclass(frozen=True, kw_only=True)
class EvalFile(_Record):
    """<run>/eval/<suite>...json. `tasks` maps each task to its entry as written (metrics,
    items, truncation, sandbox, error)."""

    run_id: str | None = None
    checkpoint: str | None = None
    checkpoint_step: int | None = _f(None, load=_int_or_none)
    arm: str | None = None
    z_mode: str = _f("prior", load=_or("prior"))
    k: int = 1
    leaks: bool = False
    seed: int | None = None
    limit: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    suite: str
    spec: EvalSpec = _f(dump=_json_of)
    spec_id: str
    tasks: Mapping[str, Any] = _f(factory=dict, dump=dict,
                                  load=lambda v: v if isinstance(v, dict) else {})
    KIND: ClassVar[str] = "eval"
    WHAT: ClassVar[str] = "eval file"

    @classmethod
    def from_json(cls, d: Any, name: str = "", **given: Any) -> EvalFile:
        """An eval file's content; RecordError for one without its spec."""
        d = _obj(d, name or cls.WHAT)
        _version(d, cls.KIND, name)
        raw = d.get("spec")
        if not isinstance(raw, dict):
            raise RecordError(f"{name or cls.WHAT}: no eval spec (written before specs; "
                              "evaluate the checkpoint again)")
        z = d.get("z_mode") or "prior"
        return super().from_json(d, name, spec=EvalSpec.from_json(raw),
                                 spec_id=str(d.get("spec_id") or spec_id(raw)),
                                 leaks=bool(d.get("leaks", z == "posterior")), **given)

    def header(self) -> dict[str, Any]:
        """Everything but the tasks (the report's provenance footer)."""
        return {k: v for k, v in self.to_json().items() if k != "tasks"}


# ------------------------------------------------------------------------------ likelihood
@dataclass(frozen=True, kw_only=True)
class LikelihoodFile(_Record):
    """<run>/eval/likelihood.<spec_id>.step<N>.json: validation likelihood of a checkpoint;
    the bound's numbers are in `extra`, as `validation_likelihood` returns them."""

    spec: Mapping[str, Any] = _f(dump=dict)
    spec_id: str
    arm: str
    run_id: str | None = None
    checkpoint: str | None = None
    checkpoint_step: int | None = _f(None, load=_int_or_none)
    n_tokens: int | None = None
    n_bytes: int | None = None
    suite: str = _f("likelihood", load=lambda _: "likelihood")
    extra: Mapping[str, Any] = field(default_factory=dict)
    KIND: ClassVar[str] = "likelihood"
    WHAT: ClassVar[str] = "likelihood file"

    @staticmethod
    def spec_of(ks: list[int] | tuple[int, ...], max_rows: int | None,
                seed: int) -> dict[str, Any]:
        """What the measurement did (comparable across runs); its hash names the file."""
        return {"suite": "likelihood", "ks": sorted(ks), "max_rows": max_rows, "seed": seed,
                "rows": "corpus validation rows (val_x, val_y), the first max_rows of them"}

    @staticmethod
    def file_name(spec: Mapping[str, Any], step: int | None) -> str:
        return f"likelihood.{spec_id(spec)}.step{step if step is not None else 'NA'}.json"

    def to_json(self) -> dict[str, Any]:
        return dict(sorted(super().to_json().items()))

    @classmethod
    def from_json(cls, d: Any, name: str = "", **given: Any) -> LikelihoodFile:
        d = _obj(d, name or cls.WHAT)
        spec = d.get("spec") if isinstance(d.get("spec"), dict) else {}
        return super().from_json(d, name, spec=spec,
                                 spec_id=str(d.get("spec_id") or spec_id(spec)), **given)

    def bound_record(self) -> dict[str, Any]:
        """The record `compare_arms` takes (arm: "baseline" | "free", the model's kind)."""
        return {**self.extra, "n_tokens": self.n_tokens, "n_bytes": self.n_bytes,
                "arm": self.arm}


# ------------------------------------------------------------------------------ runs
def _section() -> Any:
    """A config.yaml section: a mapping ({} when absent or not one)."""
    return _f(factory=dict, load=_mapping, dump=dict)


@dataclass(frozen=True)
class RunRecord(_Record):
    """results/runs/<run-id>/config.yaml (written as YAML; JSON is YAML too)."""

    run_id: str = _f(load=str)
    arm: str
    model: Mapping[str, Any] = _section()
    data: Mapping[str, Any] = _section()
    optim: Mapping[str, Any] = _section()
    train: Mapping[str, Any] = _section()
    accounting: Mapping[str, Any] = _section()
    provenance: Mapping[str, Any] = _section()
    extra: Mapping[str, Any] = field(default_factory=dict)
    """logging, corpus and whatever else a writer adds (kept in the file's order)."""
    KIND: ClassVar[str] = "run"
    WHAT: ClassVar[str] = "config.yaml"

    @property
    def latent_bits(self) -> int:
        """The model's own H (0: a baseline)."""
        return int(self.model.get("latent_bits") or 0)

    @property
    def match_latent_bits(self) -> int | None:
        """The H whose FT's FLOPs this run was trained to (None unless compute_match: flops)."""
        if self.train.get("compute_match") != "flops":
            return None
        return _int_or_none(self.train.get("match_latent_bits"))


@dataclass(frozen=True)
class MetricsLine(_Record):
    """One line of metrics.jsonl: kind ("train" | "val" | "final"), step, tokens, flops and the
    kind's values (docs/RESULTS.md), in the order written."""

    kind: str
    step: int
    tokens: float | None = None
    flops: float | None = None
    values: Mapping[str, Any] = field(default_factory=dict)
    KIND: ClassVar[str] = "metrics"
    WHAT: ClassVar[str] = "metrics line"
    EXTRA: ClassVar[str] = "values"
    WRITES_SCHEMA: ClassVar[bool] = False  # lines carry no schema: ftbench-metrics-v1

    @classmethod
    def from_json(cls, d: Any, name: str = "", **given: Any) -> MetricsLine:
        line = super().from_json(d, name, **given)
        if line.kind not in ("train", "val", "final"):
            raise RecordError(f"metrics line: kind {line.kind!r} is not train/val/final")
        return line


# ------------------------------------------------------------------------------ manifest
STATES = ("pending", "running", "done", "failed")
"""A cell's training: done (its run directory holds its final checkpoint), running (its job is
alive), failed (its job raised; retried only on request), pending (not started, or interrupted:
a re-run resumes it from its newest checkpoint)."""
POINT_STATES = ("pending", "queued", "running", "done", "failed", "skipped")
"""A kept checkpoint's evaluation: queued (seen, waiting for a local slot), running (its point
job is alive), done (a file for every suite's spec_id), failed (its job ended without them),
skipped (the cell's training failed: never evaluated, never a value), pending (interrupted, or
the spec changed: the chain evaluates it on re-run)."""
TRAINING_FAILED = "skipped: training failed"


class JobProbe(Protocol):
    """What a manifest asks of the launcher that submitted a job (sweeps.launcher)."""

    def alive(self, job_id: str | None) -> bool: ...

    def failure(self, job_id: str | None) -> str | None: ...

    def succeeded(self, job_id: str | None) -> bool: ...


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _unset(v: Any) -> bool:
    return v is None


@dataclass
class PointState(_Record):
    """The evaluation of one kept checkpoint (a cell's `points["<step>"]`)."""

    state: str = _f("pending", load=_or("pending"))
    job_id: str | None = _f(None, load=_str)
    reason: str | None = None
    started: str | None = _f(None, omit=_unset)
    slot: int | None = _f(None, load=_int_or_none, omit=_unset)
    wall_s: float | None = _f(None, omit=_unset)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Any, name: str = "", **given: Any) -> PointState:
        return super().from_json(d if isinstance(d, Mapping) else {}, name, **given)


@dataclass
class EvalState(_Record):
    """A cell's chained evaluation (`eval`): its job, the spec it ran under, the files it left."""

    state: str = _f("pending", load=_or("pending"))
    job_id: str | None = _f(None, load=_str)
    slot: int | None = _f(None, load=_int_or_none, omit=_unset)
    spec_id: str | None = None
    reason: str | None = _f(None, omit=_unset)
    wall_s: float | None = _f(None, omit=_unset)
    files: dict[str, str | None] | None = _f(
        None, omit=_unset, load=lambda v: dict(v) if isinstance(v, Mapping) else None)
    """{suite: its eval file relative to the run dir, or None}: what settle_eval found."""
    file: str | None = _f(None, omit=_unset)
    """The one suite's file, when the spec has one suite."""
    points: list[int] | None = _f(None, omit=_unset,
                                  load=lambda v: list(v) if isinstance(v, list) else None)
    """With EVAL_POINTS: the steps with a file for every suite (the Table-3 points)."""
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Any, name: str = "", **given: Any) -> EvalState | None:
        return super().from_json(d, name, **given) if isinstance(d, Mapping) else None


@dataclass
class ManifestCell(_Record):
    """One cell of a sweep: the plan's identity and numbers, and its running state. Every state
    transition is a method here: the driver reports what its jobs did and `reconcile`,
    `reconcile_eval` and `settle_points` re-derive the rest from facts (the run directory `rd`,
    the job's liveness and result through the launcher)."""

    cell: str = _f(load=str)
    arm: str = _f(load=str)
    kappa_bits: float | None = None
    latent_bits: int = _f(0, load=lambda v: _int_or_none(v) or 0)
    """The model's own H (0 for every arm whose record has no latent: common.arms)."""
    match_latent_bits: int | None = _f(None, load=_int_or_none)
    """The H a FLOPs-matched control is matched to (None: not such a control)."""
    seed: int | None = _f(None, load=_int_or_none)
    run_id: str | None = None
    state: str = _f("pending", load=_or("pending"))
    reason: str | None = None
    job_id: str | None = _f(None, load=_str)
    """The training job (a local pid or a SLURM job id)."""
    eval: EvalState | None = _f(None, load=lambda v: EvalState.from_json(v), dump=_json_of)
    run_dir: str = _f("", load=str)
    overrides: list[str] = _f(factory=list, load=list, dump=list)
    tokens: float = _f(0.0, load=_or(0.0))
    flops: float = _f(0.0, load=_or(0.0))
    flops_per_token: float = _f(0.0, load=_or(0.0))
    step: int | None = _f(None, load=_int_or_none)
    """The step of the run's newest checkpoint, as last seen."""
    attempts: int = _f(0, load=lambda v: _int_or_none(v) or 0)
    """Training jobs submitted for the cell, over every run of the sweep."""
    slot: int | None = _f(None, load=_int_or_none)
    """The local driver's slot of the last training job."""
    started: str | None = None
    finished: str | None = None
    wall_s: float | None = None
    points: dict[int, PointState] = _f(
        factory=dict, omit=lambda v: not v,
        dump=lambda v: {str(s): p.to_json() for s, p in sorted(v.items())},
        load=lambda v: {int(s): PointState.from_json(p) for s, p in _mapping(v).items()
                        if str(s).lstrip("-").isdigit()})
    config: dict[str, Any] = _f(factory=dict, load=_or({}))
    """The resolved training config (the plan's)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Keys this version does not know, kept as they were."""

    def __post_init__(self) -> None:
        if isinstance(self.eval, Mapping):  # a planted file's {"state": ..., "file": ...}
            self.eval = EvalState.from_json(self.eval)

    WHAT: ClassVar[str] = "manifest cell"

    @property
    def run(self) -> Path:
        return Path(self.run_dir)

    # ---- transitions of the training -------------------------------------------------------
    def job_started(self, job_id: str, *, slot: int | None = None) -> None:
        """A training job was submitted for the cell (slot: the local driver's slot)."""
        self.state, self.job_id, self.reason = "running", str(job_id), None
        self.started = now()
        # attempts counts submissions across re-runs: a cell that keeps being resubmitted
        # without finishing shows it in the status table
        self.attempts += 1
        if slot is not None:  # SLURM has no slot: the last local one is left as it was
            self.slot = slot

    def job_ended(self, state: str, reason: str | None, wall_s: float, rd: Any) -> None:
        """The cell's training job ended with `state` (done | failed | pending) and `reason`."""
        self.state, self.reason = state, reason
        self.finished, self.wall_s = now(), round(wall_s, 1)
        # the newest checkpoint is where a pending cell resumes: the table shows it
        self.step = rd.latest_step() or self.step

    def reconcile(self, jobs: JobProbe, rd: Any, provenance: dict[str, Any], *,
                  watched: bool = False) -> None:
        """Re-derive the training state from facts: the run directory first, then the job's
        liveness and result. `watched`: the calling driver watches the job itself."""
        self.step = rd.latest_step() or self.step
        if rd.finished:
            if self.state != "done":
                self.state, self.reason = "done", None
            try:  # a finished run records its data and tokenizer: the report shows them
                provenance.update(rd.record().provenance)
            except (OSError, UsageError):
                pass  # an unreadable run record: the manifest simply lacks them
        elif watched:
            pass
        elif self.state == "done":
            # its run directory was removed since: train it again rather than report a result
            # that no longer exists
            self.state = "pending"
            self.reason = f"{rd.final_checkpoint} is gone; the cell runs again"
        elif self.state == "running" and not jobs.alive(self.job_id):
            why = jobs.failure(self.job_id)
            if why and "interrupted" not in why:  # the trainer raised: retried only on request
                self.state, self.reason = "failed", why
            else:  # killed, preempted, node lost: resumed from its checkpoint on re-run
                self.state = "pending"
                self.reason = (f"interrupted: job {self.job_id} ended before the run finished; "
                               f"resumes from step {self.step or 0} on re-run")

    # ---- transitions of the chained evaluation ---------------------------------------------
    def needs_eval(self, m: Manifest) -> bool:
        """Not evaluated yet, failed, or evaluated under another spec than the sweep's now."""
        ev = self.eval
        return ev is None or ev.state != "done" or ev.spec_id != m.eval_spec_id

    def eval_started(self, m: Manifest, job_id: str, *, slot: int | None = None) -> None:
        """An evaluation job was submitted for the cell, under the sweep's eval spec now (the
        spec_id it ran under decides later whether a new spec needs another run)."""
        # a fresh record: an earlier evaluation's files and reason belong to its own spec
        self.eval = EvalState(state="running", job_id=str(job_id), slot=slot,
                              spec_id=m.eval_spec_id)

    def eval_ended(self, m: Manifest, state: str, reason: str | None, wall_s: float,
                   rd: Any) -> tuple[str, str | None]:
        """The cell's evaluation job ended; done only if it wrote every suite's file
        (settle_eval). Returns the cell's eval (state, reason)."""
        ev = self.eval if self.eval is not None else EvalState()
        # an interrupted evaluation is a failure here: the driver saw it end without a result
        ev.state, ev.reason, ev.wall_s = ("failed" if state != "done" else "done"), reason, \
            round(wall_s, 1)
        self.eval = ev
        self.settle_eval(m, rd)
        return ev.state, ev.reason

    def settle_eval(self, m: Manifest, rd: Any) -> None:
        """A finished eval job counts as done only if it wrote a file for every suite of the
        sweep's eval spec (an exit status of 0 with no file is a failure, never a silent 0)."""
        ev, specs = self.eval, m.eval_specs or {}
        if ev is None or ev.state != "done" or not specs:
            return
        ev.files = eval_files(rd, specs)
        if len(ev.files) == 1:
            ev.file = next(iter(ev.files.values()))
        if m.eval_points:  # steps with a file for every suite (the Table-3 points)
            ids = m.spec_ids()
            kept = rd.eval_checkpoints() or rd.step_checkpoints()  # experiments.eval.chain's
            ev.points = sorted(step for step, _ in kept if rd.point_evaluated(step, ids))
        missing = [s for s, f in ev.files.items() if f is None]
        if missing:
            ev.state = "failed"
            ev.reason = ("the evaluation exited 0 but wrote no file for "
                         + ", ".join(f"{s} (spec_id {specs[s].id})" for s in missing))

    def reconcile_eval(self, m: Manifest, jobs: JobProbe, rd: Any, *,
                       watched: bool = False) -> None:
        """An evaluation job the manifest thinks is running, re-derived from its job: done (then
        settled against the files), failed with the job's reason, or pending (interrupted)."""
        ev = self.eval
        if ev is None or ev.state != "running" or watched or jobs.alive(ev.job_id):
            return
        why, ok = jobs.failure(ev.job_id), jobs.succeeded(ev.job_id)
        # a result says done or failed; no result means it was killed: run again, not failed
        ev.state = "done" if ok else "failed" if why else "pending"
        ev.reason = why or (None if ok else "interrupted: evaluation job ended without a "
                            "result; EVAL=1 runs it again")
        self.settle_eval(m, rd)

    # ---- transitions of the evaluation points ----------------------------------------------
    def point_started(self, step: int, job_id: str | None, *, slot: int | None = None) -> None:
        """Kept checkpoint `step` was seen: queued for a local slot (job_id None) or submitted."""
        # queued: the local driver saw it but its slots are full; it starts before the next
        # training (a point is short and the curve should be whole when training ends)
        self.points[step] = PointState(
            state="queued" if job_id is None else "running", job_id=_str(job_id),
            started=None if job_id is None else now(), slot=slot)

    def point_ended(self, m: Manifest, step: int, state: str, reason: str | None,
                    wall_s: float, rd: Any) -> tuple[str, str | None]:
        """A point job ended: done only if it left a file for every suite's spec_id. Returns the
        point's (state, reason)."""
        pt = self.points.setdefault(step, PointState())
        # an exit status of 0 is not enough: the files are what the report reads
        ok = state == "done" and rd.point_evaluated(step, m.spec_ids())
        pt.state, pt.wall_s = ("done" if ok else "failed"), round(wall_s, 1)
        pt.reason = None if ok else reason or ("the point's evaluation exited 0 but wrote no "
                                               "file for every suite")
        return pt.state, pt.reason

    def points_skipped(self, reason: str = TRAINING_FAILED, *, to: str = "skipped") -> list[int]:
        """The cell's seen points neither evaluated nor being evaluated become `to` (skipped: the
        training failed, so its checkpoints are never scored and never read as a value); their
        steps."""
        out = []
        for step, pt in self.points.items():
            if pt.state in ("queued", "pending") and pt.state != to:
                pt.state, pt.reason = to, reason
                out.append(step)
        return out

    def points_unstarted(self) -> list[int]:
        """The driver stopped with the cell's points still queued: pending, the chain's on
        re-run (the chained evaluation scores every kept checkpoint without a file)."""
        return self.points_skipped("interrupted: the driver stopped before its evaluation "
                                   "started; the chain evaluates it on re-run", to="pending")

    def settle_points(self, m: Manifest, rd: Any, submitted: Any, jobs: JobProbe,
                      live: frozenset[tuple[str, int]] | set[tuple[str, int]] = frozenset()
                      ) -> None:
        """Re-derive the cell's point states from facts: the jobs a SLURM watcher `submitted`,
        the eval files, the jobs' liveness, the training's failure. `live`: (cell, step) the
        calling driver watches itself."""
        ids = m.spec_ids()
        if not m.eval_points or not ids:
            return
        for key, rec in (submitted if isinstance(submitted, dict) else {}).items():
            if not str(key).isdigit() or not isinstance(rec, Mapping):
                continue
            step, pt = int(key), self.points.get(int(key))
            if rec.get("job_id") and (pt is None or (pt.job_id != rec["job_id"]
                                                     and pt.state != "done")):
                # a SLURM training job's watcher submitted it: its job is the point's now
                self.points[step] = PointState(state="running", job_id=str(rec["job_id"]),
                                               started=rec.get("submitted"))
            elif rec.get("reason") and pt is None:
                self.points[step] = PointState(state="pending", reason=rec["reason"])
        # the trainer's kept checkpoints only (rotated step_<N>.pt come and go)
        for step, _ in rd.eval_checkpoints():
            self.points.setdefault(step, PointState())
        for step, pt in self.points.items():
            if rd.point_evaluated(step, ids):
                if pt.state != "done":  # its files exist: done, whoever wrote them
                    pt.state, pt.reason = "done", None
                continue
            if pt.state == "done":  # evaluated under another spec: not under this one
                pt.state, pt.reason = "pending", "not evaluated under the sweep's eval spec now"
            elif pt.state == "skipped" and self.state != "failed":  # retried since
                pt.state, pt.reason = "pending", None
            elif pt.state == "running" and (self.cell, step) not in live and \
                    not jobs.alive(pt.job_id):
                why = jobs.failure(pt.job_id) if pt.job_id else None
                pt.state = "failed" if why else "pending"
                pt.reason = why or ("interrupted: the point's job ended without its files; "
                                    "the chain evaluates it on re-run")
        self.points = dict(sorted(self.points.items()))
        if self.state == "failed":
            self.points_skipped()


def eval_files(rd: Any, specs: Mapping[str, EvalSpec]) -> dict[str, str | None]:
    """{suite: its eval file relative to the run dir `rd` (common.paths.RunDir; the newest for
    that spec_id), or None}."""
    out: dict[str, str | None] = {}
    for suite, sp in specs.items():
        # the final checkpoint's file: the highest step (EVAL_POINTS writes earlier steps too,
        # possibly later in time); stepNA (unknown) last, then the newest
        hits = sorted(rd.eval_files(f"*.{sp.id}.step*.json"),
                      key=lambda q: (_step_of(q), q.stat().st_mtime_ns))
        out[suite] = str(hits[-1].relative_to(rd.path)) if hits else None
    return out


def _step_of(path: Path) -> int:
    tail = path.name.rsplit(".step", 1)[-1].removesuffix(".json")
    return int(tail) if tail.isdigit() else -1


@dataclass(kw_only=True)
class Manifest(_Record):
    """results/sweeps/<name>/manifest.json: the grid, the eval specs, the bookkeeping, the
    cells. The driver builds it from a plan, refreshes it from facts and writes it
    (sweeps.manifest: build, refresh, save); analysis reads it. Fields in the file's order."""

    name: str = _f(load=str)
    created: str | None = None
    updated: str | None = None
    git_commit: str | None = None
    git_dirty: bool | None = None
    launcher: str = "local"
    """The launcher of the jobs in the file (their ids mean something to it only)."""
    command: list[str] = field(default_factory=list)
    shared: dict[str, Any] = field(default_factory=dict)
    skipped_controls: dict[str, str] = field(default_factory=dict)
    eval_points: int | None = _f(None, load=_int_or_none)
    likelihood_rows: int | None = _f(None, load=_int_or_none)
    data_checksums: dict[str, Any] = field(default_factory=dict)
    tokenizer_sha256: str | None = None
    totals: dict[str, Any] = field(default_factory=dict)
    local: dict[str, Any] | None = _f(None, omit=_unset)
    """The local driver's jobs, threads and wall time (absent for SLURM)."""
    extra: dict[str, Any] = field(default_factory=dict)
    grid: dict[str, Any] = _f(factory=dict, load=dict)
    eval_spec: EvalSpec | None = _f(None, dump=_json_of, load=lambda v: EvalSpec.from_json(v)
                                    if isinstance(v, dict) else None)
    eval_spec_id: str | None = None
    eval_specs: dict[str, EvalSpec] | None = _f(
        None, dump=lambda v: None if v is None else {
            s: {"spec": sp.to_json(), "spec_id": sp.id} for s, sp in v.items()},
        load=lambda v: {s: EvalSpec.from_json(x["spec"]) for s, x in v.items()
                        if isinstance(x, dict) and isinstance(x.get("spec"), dict)}
        if isinstance(v, dict) else None)
    cells: list[ManifestCell] = _f(factory=list, dump=lambda v: [c.to_json() for c in v],
                                   load=lambda v: [ManifestCell.from_json(c) for c in v])
    KIND: ClassVar[str] = "manifest"
    WHAT: ClassVar[str] = "manifest"

    def __post_init__(self) -> None:
        self.cells = list(self.cells)

    # ---- reading -----------------------------------------------------------------------------
    def spec_ids(self) -> list[str]:
        """Every suite's spec_id: an eval file of a step counts only under one of these."""
        return [sp.id for sp in (self.eval_specs or {}).values()]

    def counts(self) -> dict[str, int]:
        c = dict.fromkeys(STATES, 0)
        for cell in self.cells:
            c[cell.state] = c.get(cell.state, 0) + 1
        return c

    def eval_counts(self) -> dict[str, int]:
        """States of the cells' chained evaluations ({} when none was ever started)."""
        c: dict[str, int] = {}
        for cell in self.cells:
            if cell.eval is not None and cell.eval.state:
                c[cell.eval.state] = c.get(cell.eval.state, 0) + 1
        return {s: c.get(s, 0) for s in STATES} if c else {}

    def select(self, retry_failed: bool) -> list[ManifestCell]:
        """The cells a run submits: neither done nor running, and failed ones only on request."""
        return [c for c in self.cells if c.state not in ("done", "running")
                and (c.state != "failed" or retry_failed)]


def nan_if_none(x: Any) -> float:
    """JSON number or null -> float (null, bool or junk -> NaN, never 0)."""
    if x is None or isinstance(x, bool):
        return math.nan
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan
