"""SLURM settings for every job the suite submits (`make sweep|paper|corpus LAUNCHER=slurm`): the
one cluster schema, a typed structured config. sweeps/launcher.py translates it to submitit's
parameters (`slurm_parameters`), in that one place.

The file is sweeps/cluster.yaml (git-ignored), or the path in CLUSTER=... / FTBENCH_CLUSTER;
sweeps/cluster.example.yaml shows every key. The main settings are a training cell's; the `eval`
and `corpus` sections say what evaluation jobs and corpus units ask for instead (`for_role`).
The file is read through OmegaConf's structured merge onto `ClusterConfig`, so an unknown key
or a value of the wrong type is one line naming the file and the key (UsageError). `setup` and
`additional` stay free-form: they are kept out of OmegaConf, whose `${...}` interpolation would
otherwise claim the shell's `${VAR}`.

Cluster settings never enter the training config: they do not change a run's id.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import Any

from omegaconf import MISSING, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from common.errors import UsageError
from common.io import read_yaml_mapping

CLUSTER_FILE = Path(__file__).with_name("cluster.yaml")
FREE_FORM = ("setup", "additional")
"""Keys whose values pass through untyped (shell lines; any other sbatch option)."""
SECTIONS = ("eval", "corpus", "report")
"""The per-role sections (JobOverrides) beside the main settings."""
ROLES = ("train", "eval", "corpus", "report")
"""What a job is, for the cluster: a training cell (also a synthetic seed: it trains), an
evaluation (a chained evaluation or an evaluation point), a corpus unit, the report of a
`make paper` sweep."""
CORPUS_DEFAULTS: dict[str, Any] = {"gpus_per_node": 0, "cpus_per_task": 1, "timeout_min": 240,
                                   "mem_gb": None}
"""A corpus unit before the file's `corpus` section: it tokenizes one shard in one process, so
no GPU, one core and the partition's default memory (a training cell's 400 GB would idle), and
4 hours (the old corpus array's limit; a unit of the default size takes minutes)."""
REPORT_DEFAULTS: dict[str, Any] = {"gpus_per_node": 0, "cpus_per_task": 1, "timeout_min": 60,
                                   "mem_gb": None}
"""The report job before the file's `report` section: tables, figures and bootstrap intervals
from result files in one process (no GPU; minutes for the paper's sweeps)."""
ROLE_DEFAULTS = {"corpus": CORPUS_DEFAULTS, "report": REPORT_DEFAULTS}
ONE_NODE = {"eval": "an evaluation job", "corpus": "a corpus unit", "report": "the report job"}
"""Roles whose job is one process group on one node: more nodes would only repeat it."""
_COUNTS = ("gpus_per_node", "nodes", "cpus_per_task", "timeout_min", "array_parallelism",
           "signal_delay_s", "max_num_timeout", "nofile", "max_map_count")


@dataclass
class JobSettings:
    """What a SLURM job asks for: sbatch parameters. For the integer settings, null or 0 means
    the built-in default (the field's default)."""

    partition: str | None = None
    """Required: sbatch --partition."""
    account: str | None = None
    """sbatch --account (null if your cluster has none)."""
    qos: str | None = None
    """sbatch --qos."""
    gpus_per_node: int | None = 0
    """GPUs per node; one task per GPU (train.py runs DDP/FSDP from the torchrun variables that
    sweeps/job.py derives from submitit's JobEnvironment). 0: a CPU job with one task."""
    nodes: int | None = 1
    """Nodes per cell (multi-node DDP works the same way)."""
    cpus_per_task: int | None = 8
    """CPU cores per task."""
    mem_gb: float | None = None
    """Memory per node in GB (null or 0: the partition's default)."""
    timeout_min: int | None = 24 * 60
    """Time limit of one attempt, minutes; on timeout or preemption the job checkpoints and
    requeues."""
    signal_delay_s: int | None = 300
    """USR2 this many seconds before the time limit: the trainer gets this less
    sweeps.job.GRACE_MARGIN_S to write its checkpoint and exit (checked against the planned
    save time before submitting)."""
    array_parallelism: int | None = 64
    """Cells of the job array running at once."""
    constraint: str | None = None
    """sbatch --constraint, e.g. "a100|h100"."""
    exclude: str | None = None
    """sbatch --exclude."""
    setup: Any = None
    """Shell lines run before the job (modules, venv): a free-form list."""
    additional: Any = None
    """Any other sbatch option, e.g. {reservation: myres, mail-type: END}: a free-form mapping."""

    def __post_init__(self) -> None:
        _check(self, required_partition=isinstance(self, ClusterConfig))

    def given(self) -> dict[str, Any]:
        """The keys the file sets (null included), with their values."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if not _missing(getattr(self, f.name))}


JobOverrides = make_dataclass(
    "JobOverrides", [(f.name, t, field(default=MISSING))
                     for f, t in zip(dataclasses.fields(JobSettings),
                                     typing.get_type_hints(JobSettings).values(), strict=True)],
    bases=(JobSettings,), namespace={"__module__": __name__, "__doc__": (
        "What one role's jobs (the `eval`, `corpus` or `report` section) ask for instead of the "
        "main settings (JobSettings' keys). A key left out inherits the main value (for corpus "
        "units and the report: ROLE_DEFAULTS first); a key set to null falls back to the "
        "built-in default, as it would at the top level.")})


@dataclass
class ClusterConfig(JobSettings):
    """SLURM settings for one sweep: the sbatch parameters of a training cell (JobSettings),
    submitit's requeue budget, the scratch file system, and what the other roles ask for."""

    max_num_timeout: int | None = 20
    """Requeues allowed per cell."""
    results: str | None = None
    """The results root on the cluster's scratch file system (runs, checkpoints, corpora): the
    sweep's jobs write there, and its free space is checked against the plan's checkpoint and
    corpus sizes before anything is submitted. null: the sweep's own results root."""
    write_gbps: float | None = 2.0
    """Write bandwidth in GB/s one job gets from that file system: the dry run's checkpoint
    save-time estimate."""
    nofile: int | None = None
    """Open files a process may hold on the compute nodes (`ulimit -n` there); null: the
    submitting host's limit. Checked against the corpus shards each rank opens."""
    max_map_count: int | None = None
    """Memory maps a process may hold on the compute nodes (`sysctl vm.max_map_count`);
    null: the submitting host's. Checked against the shards each rank maps."""
    eval: JobOverrides = field(default_factory=JobOverrides)
    """What EVAL=1 jobs (chained evaluations, evaluation points) ask for instead (keys as
    above but max_num_timeout)."""
    corpus: JobOverrides = field(default_factory=JobOverrides)
    """What corpus units (`make corpus|paper LAUNCHER=slurm`) ask for instead (keys as above but
    max_num_timeout; before this section: no GPU, one core, 240 minutes)."""
    report: JobOverrides = field(default_factory=JobOverrides)
    """What `make paper`'s report job asks for instead (keys as eval's; before this section:
    no GPU, one core, 60 minutes)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for role, what in ONE_NODE.items():
            n = getattr(getattr(self, role, None), "nodes", None)
            if isinstance(n, int) and not isinstance(n, bool) and n > 1:
                raise ValueError(f"{role}.nodes={n}: {what} takes one node")

    def or_default(self, name: str) -> Any:
        """The setting, or its field's default when it is null or 0."""
        return getattr(self, name) or _DEFAULTS[name]

    def for_role(self, role: str) -> ClusterConfig:
        """The settings of one role's jobs (ROLES): a training cell's are the main settings;
        an evaluation's the eval section over them; a corpus unit's (the report's)
        CORPUS_DEFAULTS (REPORT_DEFAULTS), then its section, over them. Every role but
        training takes one node always."""
        if role == "train":
            return self
        if role not in ONE_NODE:
            raise ValueError(f"role {role!r}: not one of {', '.join(ROLES)}")
        base = ROLE_DEFAULTS.get(role, {})
        section: JobOverrides = getattr(self, role)
        return dataclasses.replace(self, **{**base, **section.given(), "nodes": 1},
                                   **{s: JobOverrides() for s in SECTIONS})

    @property
    def tasks(self) -> int:
        """Tasks (= ranks) of one training job: nodes x GPUs per node, one task on a CPU node
        (what slurm_parameters asks for)."""
        return int(self.or_default("nodes")) * max(1, int(self.or_default("gpus_per_node")))


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ClusterConfig)
             if f.default is not dataclasses.MISSING}


def _missing(v: Any) -> bool:
    return isinstance(v, str) and v == MISSING


def _check(c: JobSettings, *, required_partition: bool) -> None:
    """ValueError (one line, naming the key) for a value the types cannot rule out."""
    if required_partition and not c.partition:
        raise ValueError("'partition' is required")
    for k in _COUNTS:
        v = getattr(c, k, None)  # the eval section has no max_num_timeout
        if v is None or _missing(v):
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{k} must be a non-negative integer, got {v!r}")
    wb = getattr(c, "write_gbps", None)
    if wb is not None and not (isinstance(wb, (int, float)) and wb >= 0):
        raise ValueError(f"write_gbps must be a non-negative number, got {wb!r}")
    if not (c.setup is None or _missing(c.setup) or isinstance(c.setup, list)):
        raise ValueError(f"setup must be a list of shell lines, got {c.setup!r}")
    if not (c.additional is None or _missing(c.additional) or isinstance(c.additional, dict)):
        raise ValueError(f"additional must be a mapping of sbatch options, got {c.additional!r}")


def _allowed(cls: type) -> list[str]:
    return sorted(f.name for f in dataclasses.fields(cls))


def load_cluster(path: Path | None = None) -> ClusterConfig:
    """Read and check the cluster file: `path`, else FTBENCH_CLUSTER, else sweeps/cluster.yaml.
    UsageError (one line naming the file and the key) on any problem."""
    path = Path(path or os.environ.get("FTBENCH_CLUSTER") or CLUSTER_FILE)
    if not path.is_file():
        raise UsageError(f"LAUNCHER=slurm needs {path}: copy sweeps/cluster.example.yaml there "
                         f"and set partition/account/GPUs/time")
    raw = dict(read_yaml_mapping(path, UsageError))
    sections: dict[str, dict[str, Any]] = {}
    sections_free: dict[str, dict[str, Any]] = {}
    for s in SECTIONS:
        sec = raw.pop(s, None)
        if sec is None:  # `eval:` with nothing under it: no overrides
            sec = {}
        if not isinstance(sec, dict):
            raise UsageError(f"{path}: {s} must be a mapping of settings, got {sec!r}")
        sec = dict(sec)
        sections_free[s] = {k: sec.pop(k) for k in FREE_FORM if k in sec}
        sections[s] = sec
    free = {k: raw.pop(k) for k in FREE_FORM if k in raw}
    try:
        merged = OmegaConf.merge(OmegaConf.structured(ClusterConfig),
                                 OmegaConf.create({**raw, **sections}))
        data: dict[str, Any] = OmegaConf.to_container(merged, throw_on_missing=False)  # type: ignore[assignment]
    except ConfigKeyError as e:
        key = str(e.full_key)
        sec_key = key.split(".")[0] in SECTIONS and "." in key
        allowed = _allowed(JobOverrides if sec_key else ClusterConfig)
        raise UsageError(f"{path}: unknown key {key!r}; allowed: {allowed}") from None
    except OmegaConfBaseException as e:
        where = getattr(e, "full_key", None)
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UsageError(f"{path}: {where + ': ' if where else ''}{msg}") from None
    overrides: dict[str, JobOverrides] = {}
    for s in SECTIONS:
        try:
            overrides[s] = JobOverrides(**{**data.pop(s), **sections_free[s]})
        except ValueError as e:
            raise UsageError(f"{path}: {s}.{e}") from None
    try:
        cfg = ClusterConfig(**{**data, **free}, **overrides)
    except ValueError as e:
        raise UsageError(f"{path}: {e}") from None
    for s in SECTIONS:
        try:
            cfg.for_role(s)  # the merged settings are checked now, not at submission
        except ValueError as e:
            raise UsageError(f"{path}: {s}: {e}") from None
    return cfg
