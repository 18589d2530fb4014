"""Typed records for every file the suite writes (docs/RESULTS.md), standard library only, so
that `analysis/` can import it without torch.

Each record is a frozen dataclass with `to_json()` (a JSON-able dict, the file's content) and
`from_json(d)` (a classmethod). The fields a reader relies on are typed; everything else a writer
records rides in `extra` untouched ("writers add fields freely"). Legacy formats are upgraded in
`from_json` and nowhere else, so readers never see them:

- one name per concept: `arm` ("baseline" | "free" | a control; never "free_transformer"),
  `latent_bits` (a model's own H: 0 for every baseline and baseline control, common.arms),
  `match_latent_bits` (the H a FLOPs-matched control is matched to, explicit; None otherwise)
  and `z_mode` (never null);
- an eval file without `spec` (written before specs) gets its spec derived from its fields and
  name, and an evalplus entry of such a file whose own `sandbox` record says the evaluation was
  killed, timed out or scored nothing is missing (null metrics, `error` says why), whatever its
  metrics say (it wrote 0 for unscored items then);
- a manifest cell of a FLOPs-matched control recorded the matched H as `latent_bits` (or 0 in
  older manifests: then `match_latent_bits` is None here and the reader takes it from the run's
  config.yaml, `RunRecord.match_latent_bits`).

Schema versions: each file carries `"schema": "<name>-v<N>"` (SCHEMAS); a file without one is
read as version 1 (they were all written before versioning, in today's layout or an older one).
A version newer than this code knows is one RecordError naming the file's and the known one.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from . import arms, benchmarks
from .errors import UsageError

SCHEMAS = {"run": "ftbench-run-v1", "eval": "ftbench-eval-v1",
           "likelihood": "ftbench-likelihood-v1", "manifest": "ftbench-manifest-v1",
           "metrics": "ftbench-metrics-v1"}
"""The schema each record writes (the newest this code reads)."""

Z_MODES = ("prior", "prior-k", "posterior")
LM_EVAL_TASKS = benchmarks.tasks(suite="lm-eval", default=True)
"""The default lm-eval tasks (common.benchmarks)."""
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
_SANDBOX_KILLED = "the evaluation was killed"


def sandbox_failure(t: Mapping[str, Any]) -> str | None:
    """Why an evalplus task entry's own `sandbox` record says it has no real score (killed,
    timed out, nothing scored), or None."""
    sb = t.get("sandbox")
    if not isinstance(sb, Mapping):
        return None
    why = []
    rc = sb.get("returncode")
    if isinstance(rc, int) and not isinstance(rc, bool) and rc < 0:
        why.append(f"{_SANDBOX_KILLED} (returncode {rc})")
    if sb.get("timed_out") is True:
        why.append("its time budget ran out"
                   + (f" ({sb['budget_s']} s)" if sb.get("budget_s") is not None else ""))
    if sb.get("scored") == 0 and not isinstance(sb.get("scored"), bool):
        why.append("it scored nothing")
    return "; ".join(why) or None


def _upgrade_legacy_task(name: str, t: Any) -> Any:
    """An evalplus entry of a file from before specs whose sandbox failed: its metrics (then 0
    for unscored items) become null, with the reason in `error`."""
    if not isinstance(t, dict):
        return t
    why = sandbox_failure(t)
    if why is None:
        return t
    reason = f"sandbox: {why} (legacy file: its scores were written as 0; read as missing)"
    metrics = {m: ({**v, "value": None} if isinstance(v, dict) else {"value": None})
               for m, v in (t.get("metrics") or {}).items()}
    items = [{**it, **{k: None for k in ("base", "plus") if k in it},
              "reason": it.get("reason") or reason} if isinstance(it, dict) else it
             for it in t.get("items") or []]
    return {**t, "metrics": metrics, "items": items, "error": t.get("error") or reason}


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
            # evalplus entries (the only ones with a sandbox block; very old files kept them
            # in an lm-eval suite file)
            tasks = {n: _upgrade_legacy_task(n, t) for n, t in tasks.items()}
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
LEGACY_LIKELIHOOD_ARMS = {"free_transformer": "free"}


@dataclass(frozen=True)
class LikelihoodFile:
    """<run>/eval/likelihood.<spec_id>.step<N>.json: validation likelihood of a checkpoint.
    `arm` is "baseline" or "free" (files before records wrote "free_transformer"); the bound's
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
                   arm=LEGACY_LIKELIHOOD_ARMS.get(arm, arm), run_id=d.get("run_id"),
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
CELL_KEYS = ("cell", "arm", "kappa_bits", "latent_bits", "match_latent_bits", "seed", "run_id")


@dataclass(frozen=True)
class ManifestCell:
    """One cell of a sweep. `latent_bits` is the model's own H (0 for every arm whose record has
    no latent: the baseline and its controls); `match_latent_bits` the H a FLOPs-matched control
    is matched to (None: not such a control, or an old manifest that did not record it: see
    RunRecord.match_latent_bits)."""

    cell: str
    arm: str
    kappa_bits: float | None
    latent_bits: int
    seed: int | None
    run_id: str | None
    match_latent_bits: int | None = None
    state: str = "unknown"
    reason: str | None = None
    job_id: str | None = None
    eval: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"cell": self.cell, "arm": self.arm, "kappa_bits": self.kappa_bits,
                "latent_bits": self.latent_bits, "match_latent_bits": self.match_latent_bits,
                "seed": self.seed, "run_id": self.run_id, "state": self.state,
                "reason": self.reason, "job_id": self.job_id,
                "eval": dict(self.eval) if self.eval is not None else None, **self.extra}

    @classmethod
    def from_json(cls, d: Any) -> ManifestCell:
        d = _obj(d, "manifest cell")
        arm = d.get("arm")
        lb = _int_or_none(d.get("latent_bits")) or 0
        if "match_latent_bits" in d:
            match = _int_or_none(d.get("match_latent_bits"))
        elif arm in FLOPS_MATCHED_ARMS:  # legacy: latent_bits held the matched H (or 0)
            match, lb = (lb or None), 0
        else:
            match = None
        known = arms.find(arm)
        if known is not None and not known.latent:
            lb = 0  # a baseline or a baseline control has no latent
        return cls(cell=d.get("cell"), arm=arm, kappa_bits=d.get("kappa_bits"), latent_bits=lb,
                   seed=d.get("seed"), run_id=d.get("run_id"), match_latent_bits=match,
                   state=d.get("state", "unknown"), reason=d.get("reason"),
                   job_id=d.get("job_id"),
                   eval=d.get("eval") if isinstance(d.get("eval"), Mapping) else None,
                   extra={k: v for k, v in d.items() if k not in (
                       *CELL_KEYS, "state", "reason", "job_id", "eval")})


@dataclass(frozen=True)
class Manifest:
    """results/sweeps/<name>/manifest.json."""

    name: str
    cells: tuple[ManifestCell, ...] = ()
    grid: Mapping[str, Any] = field(default_factory=dict)
    eval_spec: EvalSpec | None = None
    eval_spec_id: str | None = None
    eval_specs: Mapping[str, EvalSpec] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    """created, git_commit, launcher, shared, data_checksums, totals, ... as written."""

    def to_json(self) -> dict[str, Any]:
        especs = None if self.eval_specs is None else {
            s: {"spec": sp.to_json(), "spec_id": sp.id} for s, sp in self.eval_specs.items()}
        return {"schema": SCHEMAS["manifest"], "name": self.name, **self.extra,
                "grid": dict(self.grid),
                "eval_spec": self.eval_spec.to_json() if self.eval_spec is not None else None,
                "eval_spec_id": self.eval_spec_id, "eval_specs": especs,
                "cells": [c.to_json() for c in self.cells]}

    @classmethod
    def from_json(cls, d: Any, name: str = "") -> Manifest:
        d = _obj(d, name or "manifest")
        _version(d, "manifest", name)
        es = d.get("eval_spec")
        ess = d.get("eval_specs")
        return cls(name=str(d.get("name")),
                   cells=tuple(ManifestCell.from_json(c) for c in d.get("cells") or []),
                   grid=dict(d.get("grid") or {}),
                   eval_spec=EvalSpec.from_json(es) if isinstance(es, dict) else None,
                   eval_spec_id=d.get("eval_spec_id"),
                   eval_specs={s: EvalSpec.from_json(v.get("spec")) for s, v in ess.items()
                               if isinstance(v, dict) and isinstance(v.get("spec"), dict)}
                   if isinstance(ess, dict) else None,
                   extra={k: v for k, v in d.items() if k not in (
                       "schema", "name", "cells", "grid", "eval_spec", "eval_spec_id",
                       "eval_specs")})


def nan_if_none(x: Any) -> float:
    """JSON number or null -> float (null, bool or junk -> NaN, never 0)."""
    if x is None or isinstance(x, bool):
        return math.nan
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan
