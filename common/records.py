"""Typed records for every file the suite writes (docs/RESULTS.md), standard library only, so
that `analysis/` can import it without torch.

Each record is a dataclass with `to_json()` (a JSON-able dict, the file's content) and
`from_json(d)` (a classmethod). The fields a reader relies on are typed; everything else a writer
records rides in `extra` untouched ("writers add fields freely"). One name per concept: `arm`
("baseline" | "free" | a control), `latent_bits` (a model's own H: 0 for every baseline and
baseline control, common.arms), `match_latent_bits` (the H a FLOPs-matched control is matched
to; None otherwise) and `z_mode` (never null). One upgrade is left, at this edge: an eval file
without `spec` (written before specs; analysis/ and tests/fake.py still plant them) gets its
spec derived from its fields and name (`EvalFile.legacy`).

The sweep's manifest is one schema, `Manifest` and `ManifestCell`, written by the sweep driver
and read by analysis: a cell's running state is typed fields, and every state transition is a
method of the cell (sweeps/manifest.py builds, locks, saves and prints it).

Schema versions: each file carries `"schema": "<name>-v<N>"` (SCHEMAS); a file without one is
read as version 1 (they were all written before versioning, in today's layout or an older one).
A version newer than this code knows is one UsageError naming the file's and the known one.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Protocol

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


def _rest(d: Mapping[str, Any], cls: type) -> dict[str, Any]:
    """The keys of d that are not typed fields of cls (kept verbatim in `extra`)."""
    own = {f.name for f in fields(cls)} | {"schema"}
    return {k: v for k, v in d.items() if k not in own}


def _int_or_none(x: Any) -> int | None:
    if x is None or isinstance(x, bool):
        return None
    try:
        return int(x)
    except (TypeError, ValueError):
        return None


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


def suite_file(suite: str, z: str, limit: int | None, fewshot: int | None, k: int) -> str:
    """The readable part of an eval file's name (all of it in files written before specs)."""
    parts = [suite]
    if z != "prior":
        parts.append(z if z != "prior-k" else f"prior-k{k}")
    if fewshot is not None:
        parts.append(f"fewshot{fewshot}")
    if limit is not None:
        parts.append(f"limit{limit}")
    return ".".join(parts) + ".json"


def _argv_int(argv: Any, flag: str) -> int | None:
    """The integer value of `flag` in a recorded argv (None: absent or not an integer)."""
    if not isinstance(argv, list):
        return None
    for i, a in enumerate(argv):
        a = str(a)
        val = argv[i + 1] if a == flag and i + 1 < len(argv) else (
            a.split("=", 1)[1] if a.startswith(flag + "=") else None)
        if val is not None:
            try:
                return int(val)
            except (TypeError, ValueError):
                return None
    return None


# ------------------------------------------------------------------------------ eval spec
@dataclass(frozen=True)
class EvalSpec:
    """What one suite's evaluation does, comparable across runs; hashes to `spec_id`.

    z_mode and k are the *requested* ones (the same for every arm of a sweep, though a baseline
    has no Z); gen_tokens is None when the suite generates nothing; data_checksums are the
    verified offline files the suite read ({} online). A union spec (the manifest's, for a sweep
    evaluated on several suites) has suite "lm-eval+evalplus" and each suite's spec in `suites`.
    """

    suite: str
    tasks: tuple[str, ...]
    limit: int | None
    z_mode: str
    k: int
    fewshot: int | None
    gen_tokens: int | None
    data_checksums: Mapping[str, str] = field(default_factory=dict)
    suites: Mapping[str, EvalSpec] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    context: int | None = None
    """The window the evaluation scored in, in tokens: the run's train.seq_len. None: a spec
    from before the field (the model's max_seq_len then); absent from its JSON, so its id is
    unchanged."""

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

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"suite": self.suite, "tasks": list(self.tasks), "limit": self.limit,
                             "z_mode": self.z_mode, "k": self.k, "fewshot": self.fewshot,
                             "gen_tokens": self.gen_tokens,
                             "data_checksums": dict(self.data_checksums)}
        if self.context is not None:
            d["context"] = self.context
        if self.suites is not None:
            d["suites"] = {s: sp.to_json() for s, sp in self.suites.items()}
        return {**d, **self.extra}

    @classmethod
    def from_json(cls, d: Any) -> EvalSpec:
        d = _obj(d, "eval spec")
        inner = d.get("suites")
        return cls(suite=str(d.get("suite")), tasks=tuple(d.get("tasks") or ()),
                   limit=d.get("limit"), z_mode=d.get("z_mode") or "prior",
                   k=d.get("k", 1), fewshot=d.get("fewshot"), gen_tokens=d.get("gen_tokens"),
                   data_checksums=dict(d.get("data_checksums") or {}),
                   suites={s: cls.from_json(v) for s, v in inner.items() if isinstance(v, dict)}
                   if isinstance(inner, dict) else None,
                   context=d.get("context"),
                   extra={k: v for k, v in d.items() if k not in (
                       "suite", "tasks", "limit", "z_mode", "k", "fewshot", "gen_tokens",
                       "data_checksums", "suites", "context")})

    @property
    def id(self) -> str:
        """spec_id: the hash of the spec's canonical JSON (as written in the file)."""
        return spec_id(self.to_json())

    def file_name(self, step: int | None) -> str:
        """`<suite>[.<z>][.fewshot<n>][.limit<n>].<spec_id>.step<N>.json` (stepNA: unknown)."""
        head = suite_file(self.suite, self.z_mode, self.limit, self.fewshot,
                          self.k)[:-len(".json")]
        return f"{head}.{self.id}.step{step if step is not None else 'NA'}.json"

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
@dataclass(frozen=True)
class EvalFile:
    """<run>/eval/<suite>...json. `tasks` maps each task to its entry as written (metrics,
    items, truncation, sandbox, error); `legacy` is True for a file written before specs (its
    spec derived from its fields and name)."""

    suite: str
    spec: EvalSpec
    spec_id: str
    run_id: str | None = None
    checkpoint: str | None = None
    checkpoint_step: int | None = None
    arm: str | None = None
    z_mode: str = "prior"
    k: int = 1
    leaks: bool = False
    seed: int | None = None
    limit: int | None = None
    tasks: Mapping[str, Any] = field(default_factory=dict)
    legacy: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)
    KIND: ClassVar[str] = "eval"

    def to_json(self) -> dict[str, Any]:
        head = {"schema": SCHEMAS["eval"], "run_id": self.run_id, "checkpoint": self.checkpoint,
                "checkpoint_step": self.checkpoint_step, "arm": self.arm,
                "z_mode": self.z_mode, "k": self.k, "leaks": self.leaks, "seed": self.seed,
                "limit": self.limit}
        body = {"suite": self.suite, "spec": None if self.legacy else self.spec.to_json(),
                "spec_id": None if self.legacy else self.spec_id}
        if self.legacy:  # written before specs: no spec keys (from_json derives them again)
            body = {"suite": self.suite}
        return {**head, **self.extra, **body, "tasks": dict(self.tasks)}

    @classmethod
    def from_json(cls, d: Any, name: str = "") -> EvalFile:
        """An eval file's content; `name` (the file's name) completes a legacy spec."""
        d = _obj(d, name or "eval file")
        _version(d, "eval", name)
        suite = d.get("suite") or name.split(".")[0]
        raw = d.get("spec")
        legacy = not isinstance(raw, dict)
        tasks = d.get("tasks") if isinstance(d.get("tasks"), dict) else {}
        if legacy:
            spec = EvalSpec(suite=suite, tasks=tuple(sorted(tasks)), limit=d.get("limit"),
                            z_mode=d.get("z_mode") or "prior", k=d.get("k", 1),
                            fewshot=d.get("fewshot_override"),
                            gen_tokens=_argv_int(d.get("argv"), "--max-gen-toks"),
                            data_checksums=d.get("data_checksums") or {})
            sid = spec.id
        else:
            spec = EvalSpec.from_json(raw)
            sid = str(d.get("spec_id") or spec_id(raw))
        z = d.get("z_mode") or "prior"
        return cls(suite=suite, spec=spec, spec_id=sid, run_id=d.get("run_id"),
                   checkpoint=d.get("checkpoint"),
                   checkpoint_step=_int_or_none(d.get("checkpoint_step")), arm=d.get("arm"),
                   z_mode=z, k=d.get("k", 1), leaks=bool(d.get("leaks", z == "posterior")),
                   seed=d.get("seed"), limit=d.get("limit"), tasks=tasks, legacy=legacy,
                   extra=_rest(d, cls) | {})

    def header(self) -> dict[str, Any]:
        """Everything but the tasks (the report's provenance footer)."""
        return {k: v for k, v in self.to_json().items() if k != "tasks"}


# ------------------------------------------------------------------------------ likelihood
@dataclass(frozen=True)
class LikelihoodFile:
    """<run>/eval/likelihood.<spec_id>.step<N>.json: validation likelihood of a checkpoint.
    `arm` is "baseline" or "free"; the bound's
    numbers (nll_nats_per_token, bpb, exact, iwae, spread_bpb, prior_k1, posterior, ...) are in
    `extra`, as `validation_likelihood` returns them."""

    spec: Mapping[str, Any]
    spec_id: str
    arm: str
    run_id: str | None = None
    checkpoint: str | None = None
    checkpoint_step: int | None = None
    n_tokens: int | None = None
    n_bytes: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

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
        d = {"schema": SCHEMAS["likelihood"], "suite": "likelihood", "spec": dict(self.spec),
             "spec_id": self.spec_id, "checkpoint_step": self.checkpoint_step,
             "run_id": self.run_id, "checkpoint": self.checkpoint, "arm": self.arm,
             "n_tokens": self.n_tokens, "n_bytes": self.n_bytes, **self.extra}
        return dict(sorted(d.items()))

    @classmethod
    def from_json(cls, d: Any, name: str = "") -> LikelihoodFile:
        d = _obj(d, name or "likelihood file")
        _version(d, "likelihood", name)
        spec = d.get("spec") if isinstance(d.get("spec"), dict) else {}
        arm = d.get("arm")
        return cls(spec=spec, spec_id=str(d.get("spec_id") or spec_id(spec)),
                   arm=arm, run_id=d.get("run_id"),
                   checkpoint=d.get("checkpoint"),
                   checkpoint_step=_int_or_none(d.get("checkpoint_step")),
                   n_tokens=d.get("n_tokens"), n_bytes=d.get("n_bytes"),
                   extra={k: v for k, v in _rest(d, cls).items() if k != "suite"})

    def bound_record(self) -> dict[str, Any]:
        """The record `compare_arms` takes (arm: "baseline" | "free", the model's kind)."""
        return {**self.extra, "n_tokens": self.n_tokens, "n_bytes": self.n_bytes,
                "arm": self.arm}


# ------------------------------------------------------------------------------ runs
@dataclass(frozen=True)
class RunRecord:
    """results/runs/<run-id>/config.yaml (written as YAML; JSON is YAML too)."""

    run_id: str
    arm: str
    model: Mapping[str, Any] = field(default_factory=dict)
    data: Mapping[str, Any] = field(default_factory=dict)
    optim: Mapping[str, Any] = field(default_factory=dict)
    train: Mapping[str, Any] = field(default_factory=dict)
    accounting: Mapping[str, Any] = field(default_factory=dict)
    provenance: Mapping[str, Any] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)
    """logging, corpus and whatever else a writer adds (kept in the file's order)."""

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMAS["run"], "run_id": self.run_id, "arm": self.arm,
                "model": dict(self.model), "data": dict(self.data), "optim": dict(self.optim),
                "train": dict(self.train), "accounting": dict(self.accounting),
                "provenance": dict(self.provenance), **self.extra}

    @classmethod
    def from_json(cls, d: Any, name: str = "") -> RunRecord:
        d = _obj(d, name or "config.yaml")
        _version(d, "run", name)

        def sub(k: str) -> dict[str, Any]:
            return dict(d.get(k)) if isinstance(d.get(k), Mapping) else {}

        return cls(run_id=str(d.get("run_id")), arm=d.get("arm"), model=sub("model"),
                   data=sub("data"), optim=sub("optim"), train=sub("train"),
                   accounting=sub("accounting"), provenance=sub("provenance"),
                   extra=_rest(d, cls))

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
class MetricsLine:
    """One line of metrics.jsonl: kind ("train" | "val" | "final"), step, tokens, flops and the
    kind's values (docs/RESULTS.md), in the order written."""

    kind: str
    step: int
    tokens: float | None = None
    flops: float | None = None
    values: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "step": self.step, "tokens": self.tokens,
                "flops": self.flops, **self.values}

    @classmethod
    def from_json(cls, d: Any) -> MetricsLine:
        d = _obj(d, "metrics line")
        _version(d, "metrics")
        if d.get("kind") not in ("train", "val", "final"):
            raise RecordError(f"metrics line: kind {d.get('kind')!r} is not train/val/final")
        return cls(kind=d["kind"], step=d.get("step"), tokens=d.get("tokens"),
                   flops=d.get("flops"),
                   values={k: v for k, v in d.items()
                           if k not in ("kind", "step", "tokens", "flops", "schema")})


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


def _opt(d: dict[str, Any], **kv: Any) -> dict[str, Any]:
    """d with the keys whose value is not None (optional keys are left out, as written)."""
    return {**d, **{k: v for k, v in kv.items() if v is not None}}


@dataclass
class PointState:
    """The evaluation of one kept checkpoint (a cell's `points["<step>"]`)."""

    state: str = "pending"
    job_id: str | None = None
    reason: str | None = None
    started: str | None = None
    slot: int | None = None
    wall_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return _opt({"state": self.state, "job_id": self.job_id, "reason": self.reason},
                    started=self.started, slot=self.slot, wall_s=self.wall_s) | self.extra

    @classmethod
    def from_json(cls, d: Any) -> PointState:
        d = dict(d) if isinstance(d, Mapping) else {}
        return cls(state=d.pop("state", None) or "pending", job_id=_str(d.pop("job_id", None)),
                   reason=d.pop("reason", None), started=d.pop("started", None),
                   slot=_int_or_none(d.pop("slot", None)), wall_s=d.pop("wall_s", None),
                   extra=d)


@dataclass
class EvalState:
    """A cell's chained evaluation (`eval`): its job, the spec it ran under, the files it left."""

    state: str = "pending"
    job_id: str | None = None
    spec_id: str | None = None
    slot: int | None = None
    reason: str | None = None
    wall_s: float | None = None
    files: dict[str, str | None] | None = None
    """{suite: its eval file relative to the run dir, or None}: what settle_eval found."""
    file: str | None = None
    """The one suite's file, when the spec has one suite."""
    points: list[int] | None = None
    """With EVAL_POINTS: the steps with a file for every suite (the Table-3 points)."""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return _opt({"state": self.state, "job_id": self.job_id}, slot=self.slot) | {
            "spec_id": self.spec_id} | _opt({}, reason=self.reason, wall_s=self.wall_s,
                                            files=self.files, file=self.file,
                                            points=self.points) | self.extra

    @classmethod
    def from_json(cls, d: Any) -> EvalState | None:
        if not isinstance(d, Mapping):
            return None
        d = dict(d)
        files, points = d.pop("files", None), d.pop("points", None)
        return cls(state=d.pop("state", None) or "pending", job_id=_str(d.pop("job_id", None)),
                   spec_id=d.pop("spec_id", None), slot=_int_or_none(d.pop("slot", None)),
                   reason=d.pop("reason", None), wall_s=d.pop("wall_s", None),
                   files=dict(files) if isinstance(files, Mapping) else None,
                   file=d.pop("file", None),
                   points=list(points) if isinstance(points, list) else None, extra=d)

    def get(self, key: str, default: Any = None) -> Any:
        """The file's value of `key` (analysis/frame.py reads `eval` as the file's mapping)."""
        return self.to_json().get(key, default)


def _str(x: Any) -> str | None:
    return None if x is None else str(x)


@dataclass
class ManifestCell:
    """One cell of a sweep: the plan's identity and numbers, and its running state. Every state
    transition is a method here, and nothing else assigns a state: the driver reports what its
    jobs did (started, ended with an outcome) and `reconcile`, `reconcile_eval` and
    `settle_points` re-derive the rest from facts (the run directory, the job's liveness and
    result, read through the launcher that submitted it). The run directory is the caller's to
    hand in (`rd`: the cell's common.paths.RunDir; common.paths reads these records)."""

    cell: str
    arm: str
    kappa_bits: float | None = None
    latent_bits: int = 0
    """The model's own H (0 for every arm whose record has no latent: common.arms)."""
    match_latent_bits: int | None = None
    """The H a FLOPs-matched control is matched to (None: not such a control)."""
    seed: int | None = None
    run_id: str | None = None
    state: str = "pending"
    reason: str | None = None
    job_id: str | None = None
    """The training job (a local pid or a SLURM job id)."""
    eval: EvalState | None = None
    run_dir: str = ""
    overrides: list[str] = field(default_factory=list)
    tokens: float = 0.0
    flops: float = 0.0
    flops_per_token: float = 0.0
    step: int | None = None
    """The step of the run's newest checkpoint, as last seen."""
    attempts: int = 0
    """Training jobs submitted for the cell, over every run of the sweep."""
    slot: int | None = None
    """The local driver's slot of the last training job."""
    started: str | None = None
    finished: str | None = None
    wall_s: float | None = None
    points: dict[int, PointState] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    """The resolved training config (the plan's)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Keys this version does not know, kept as they were."""

    def __post_init__(self) -> None:
        if isinstance(self.eval, Mapping):  # a planted file's {"state": ..., "file": ...}
            self.eval = EvalState.from_json(self.eval)

    # ---- the file ----------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)
             if f.name not in ("points", "config", "extra")}
        d["eval"] = self.eval.to_json() if self.eval is not None else None
        d["overrides"] = list(self.overrides)
        if self.points:
            d["points"] = {str(s): p.to_json() for s, p in sorted(self.points.items())}
        return d | {"config": self.config} | self.extra

    @classmethod
    def from_json(cls, d: Any) -> ManifestCell:
        d = _obj(d, "manifest cell")
        pts = d.get("points") if isinstance(d.get("points"), Mapping) else {}
        own = {f.name for f in fields(cls)}
        known = arms.find(d.get("arm"))  # a baseline or baseline control has no latent: 0
        lb = 0 if known is not None and not known.latent else _int_or_none(d.get("latent_bits"))
        return cls(cell=str(d.get("cell")), arm=str(d.get("arm")), kappa_bits=d.get("kappa_bits"),
                   latent_bits=lb or 0,
                   match_latent_bits=_int_or_none(d.get("match_latent_bits")),
                   seed=_int_or_none(d.get("seed")), run_id=d.get("run_id"),
                   state=d.get("state") or "pending", reason=d.get("reason"),
                   job_id=_str(d.get("job_id")), eval=EvalState.from_json(d.get("eval")),
                   run_dir=str(d.get("run_dir") or ""), overrides=list(d.get("overrides") or []),
                   tokens=d.get("tokens") or 0.0, flops=d.get("flops") or 0.0,
                   flops_per_token=d.get("flops_per_token") or 0.0,
                   step=_int_or_none(d.get("step")),
                   attempts=_int_or_none(d.get("attempts")) or 0,
                   slot=_int_or_none(d.get("slot")), started=d.get("started"),
                   finished=d.get("finished"), wall_s=d.get("wall_s"),
                   points={int(s): PointState.from_json(p) for s, p in pts.items()
                           if str(s).lstrip("-").isdigit()},
                   config=dict(d.get("config") or {}),
                   extra={k: v for k, v in d.items() if k not in own})

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
        """Re-derive the training state from facts: the run directory first (a finished run
        is done whoever finished it), then the job's liveness and result. `watched`: the
        calling driver watches the job itself (its outcome is reported by `job_ended`);
        `provenance` receives a finished run's recorded provenance."""
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
        """Re-derive the cell's point states from facts: the jobs a SLURM watcher `submitted`
        (its record: {"<step>": {"job_id", "submitted"} | {"reason"}}), the eval files (done,
        whoever wrote them), the jobs' liveness, the cell's training failure. `live`:
        (cell, step) the calling driver is watching itself."""
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


@dataclass
class Manifest:
    """results/sweeps/<name>/manifest.json: the grid, the eval specs, the bookkeeping, the
    cells. The driver builds it from a plan, refreshes it from facts and writes it
    (sweeps.manifest: build, refresh, save); analysis reads it."""

    name: str
    cells: list[ManifestCell] = field(default_factory=list)
    grid: dict[str, Any] = field(default_factory=dict)
    eval_spec: EvalSpec | None = None
    eval_spec_id: str | None = None
    eval_specs: dict[str, EvalSpec] | None = None
    created: str | None = None
    updated: str | None = None
    git_commit: str | None = None
    git_dirty: bool | None = None
    launcher: str = "local"
    """The launcher of the jobs in the file (their ids mean something to it only)."""
    command: list[str] = field(default_factory=list)
    shared: dict[str, Any] = field(default_factory=dict)
    skipped_controls: dict[str, str] = field(default_factory=dict)
    eval_points: int | None = None
    likelihood_rows: int | None = None
    data_checksums: dict[str, Any] = field(default_factory=dict)
    tokenizer_sha256: str | None = None
    totals: dict[str, Any] = field(default_factory=dict)
    local: dict[str, Any] | None = None
    """The local driver's jobs, threads and wall time (absent for SLURM)."""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.cells = list(self.cells)

    # ---- the file ----------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        especs = None if self.eval_specs is None else {
            s: {"spec": sp.to_json(), "spec_id": sp.id} for s, sp in self.eval_specs.items()}
        head = {k: getattr(self, k) for k in _HEADER}
        return {"schema": SCHEMAS["manifest"], "name": self.name, **head,
                **_opt({}, local=self.local), **self.extra, "grid": self.grid,
                "eval_spec": self.eval_spec.to_json() if self.eval_spec is not None else None,
                "eval_spec_id": self.eval_spec_id, "eval_specs": especs,
                "cells": [c.to_json() for c in self.cells]}

    @classmethod
    def from_json(cls, d: Any, name: str = "") -> Manifest:
        d = _obj(d, name or "manifest")
        _version(d, "manifest", name)
        es, ess = d.get("eval_spec"), d.get("eval_specs")
        head = {k: d[k] for k in _HEADER if d.get(k) is not None}
        for k in ("eval_points", "likelihood_rows"):
            head[k] = _int_or_none(head.get(k))
        return cls(name=str(d.get("name")),
                   cells=[ManifestCell.from_json(c) for c in d.get("cells") or []],
                   grid=dict(d.get("grid") or {}),
                   eval_spec=EvalSpec.from_json(es) if isinstance(es, dict) else None,
                   eval_spec_id=d.get("eval_spec_id"),
                   eval_specs={s: EvalSpec.from_json(v.get("spec")) for s, v in ess.items()
                               if isinstance(v, dict) and isinstance(v.get("spec"), dict)}
                   if isinstance(ess, dict) else None,
                   local=d.get("local"), **head,
                   extra={k: v for k, v in d.items() if k not in (
                       "schema", "name", "cells", "grid", "eval_spec", "eval_spec_id",
                       "eval_specs", "local", *_HEADER)})

    # ---- reading -----------------------------------------------------------------------------
    def cell(self, name: str) -> ManifestCell:
        return next(c for c in self.cells if c.cell == name)

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


_HEADER = ("created", "updated", "git_commit", "git_dirty", "launcher", "command", "shared",
           "skipped_controls", "eval_points", "likelihood_rows", "data_checksums",
           "tokenizer_sha256", "totals")
"""The bookkeeping keys of the file, in its order (`local` follows them for a local sweep)."""


def nan_if_none(x: Any) -> float:
    """JSON number or null -> float (null, bool or junk -> NaN, never 0)."""
    if x is None or isinstance(x, bool):
        return math.nan
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan
