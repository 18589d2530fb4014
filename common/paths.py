"""Where runs and sweeps write: the results root, `RunDir` (results/runs/<run-id>/) and
`SweepDir` (results/sweeps/<name>/). The only code that spells the layout (what each file
holds: docs/RESULTS.md); everything else asks a RunDir or a SweepDir. Standard library only
(PyYAML is imported only when config.yaml is read or written).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .records import Manifest, MetricsLine, RecordError, RunRecord

RUN_RECORD = "config.yaml"
METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
FINAL_CHECKPOINT = "final.pt"
"""The last step's checkpoint; its presence marks a run finished."""
_MANIFEST = "manifest.json"
_STEP = re.compile(r"step_(\d+)\.pt")
_EVAL_STEP = re.compile(r"eval_step_(\d+)\.pt")


def results_root(root: str | os.PathLike | None = None) -> Path:
    if root is not None and str(root) != "":
        return Path(root)
    return Path(os.environ.get("FTBENCH_RESULTS") or "results")


MEASURED = Path(__file__).resolve().parent.parent / "measured"
"""The repository's measured inputs (measured/README.md): what a measurement wrote and the code
reads (a gpu-check's MFU, the recipes' per-GPU micro-batch records). docs/ is generated from
here and never read."""
GPU_CHECK = "gpu_check"
"""`make gpu-check`'s folder: <results root>/gpu_check/ (every run) and measured/gpu_check/ (the
committed measurements: a recipe check on a GPU writes there)."""


def gpu_check_dirs(root: str | os.PathLike | None = None) -> list[Path]:
    """Where `make gpu-check` files are read from, committed ones first: measured/gpu_check/
    and <results root>/gpu_check/."""
    return [MEASURED / GPU_CHECK, results_root(root) / GPU_CHECK]


def runs_dir(root: str | os.PathLike | None = None) -> Path:
    return results_root(root) / "runs"


def sweeps_dir(root: str | os.PathLike | None = None) -> Path:
    return results_root(root) / "sweeps"


def cache_dir(root: str | os.PathLike | None = None) -> Path:
    """$FTBENCH_CACHE, else <results root>/cache (tokenizers, tokenized corpora)."""
    env = os.environ.get("FTBENCH_CACHE")
    return Path(env) if env else results_root(root) / "cache"


def _numbered(ckdir: str | os.PathLike, pattern: re.Pattern[str]) -> list[tuple[int, Path]]:
    ckdir = Path(ckdir)
    if not ckdir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckdir.iterdir() if (m := pattern.fullmatch(p.name))]
    return sorted(found)


def checkpoint_step_of(path: str | os.PathLike) -> int | None:
    """The step a rotated checkpoint's file name holds (step_<N>.pt), else None (an eval or
    final checkpoint records its step inside)."""
    m = _STEP.fullmatch(Path(path).name)
    return int(m.group(1)) if m else None


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The JSON lines of a file; a line that does not parse (the truncated last line of a
    file still being written) is skipped, and so is a blank one."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


# ------------------------------------------------------------------------------ runs
@dataclass(frozen=True)
class RunDir:
    """results/runs/<run-id>/: a run's files, its typed records and its checkpoints.
    `RunDir.of(run_id)` names one under the results root; `RunDir.at(path)` takes what a user
    gives. Nothing here creates a directory; writers create what they write."""

    path: Path
    target: Path | None = None
    """The checkpoint file the user named (None: the directory itself was named)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))
        if self.target is not None:
            object.__setattr__(self, "target", Path(self.target))

    @classmethod
    def of(cls, run_id: str, root: str | os.PathLike | None = None) -> RunDir:
        return cls(runs_dir(root) / str(run_id))

    @classmethod
    def at(cls, where: str | os.PathLike) -> RunDir:
        """A run directory (or its checkpoints/ folder), or the run directory of a checkpoint
        file (a .pt outside a run: its folder), the file kept as `target`; a folder holding
        checkpoints itself targets its final.pt, else its newest step."""
        p = Path(where)
        if p.is_dir():
            if (p / CHECKPOINTS).is_dir():
                return cls(p)
            if p.name == CHECKPOINTS:  # a run's checkpoints/ folder names its run
                return cls(p.parent)
            # a folder of checkpoints that is not a run's: its final.pt, else its newest step
            loose = p / FINAL_CHECKPOINT
            steps = _numbered(p, _STEP)
            if loose.is_file() or steps:
                return cls(p, target=loose if loose.is_file() else steps[-1][1])
            return cls(p)
        run = p.parent.parent if p.parent.name == CHECKPOINTS else p.parent
        return cls(run, target=p)

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def root(self) -> Path:
        """The results root of a run under <root>/runs/<run-id> (where its cache lives)."""
        return self.path.parent.parent

    # ---- files (none of them need exist)
    @property
    def record_path(self) -> Path:
        return self.path / RUN_RECORD

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS

    @property
    def log_path(self) -> Path:
        return self.path / "train.log"

    @property
    def tensorboard_dir(self) -> Path:
        return self.path / "tb"

    @property
    def lock_path(self) -> Path:
        """Held by the one trainer of the run."""
        return self.path / ".lock"

    @property
    def checkpoints_dir(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def final_checkpoint(self) -> Path:
        return self.checkpoints_dir / FINAL_CHECKPOINT

    @property
    def eval_dir(self) -> Path:
        """Eval, likelihood and probe files, and the evaluators' work."""
        return self.path / "eval"

    def exists(self) -> bool:
        return self.path.is_dir()

    @property
    def has_record(self) -> bool:
        return self.record_path.is_file()

    @property
    def has_metrics(self) -> bool:
        return self.metrics_path.is_file()

    @property
    def finished(self) -> bool:
        return self.final_checkpoint.exists()

    # ---- typed records
    def record_json(self) -> dict[str, Any]:
        """config.yaml's content as a dict ({} for an empty file). FileNotFoundError when
        absent; RecordError (one line naming the file) when it is not YAML or not a mapping."""
        import yaml

        try:
            d = yaml.safe_load(self.record_path.read_text(encoding="utf-8")) or {}
        except FileNotFoundError:
            raise
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise RecordError(f"{self.record_path} is corrupt: {first}") from None
        if not isinstance(d, dict):
            raise RecordError(f"{self.record_path}: not a run record (top level is "
                              f"{type(d).__name__})")
        return d

    def record(self) -> RunRecord:
        return RunRecord.from_json(self.record_json(), str(self.record_path))

    def write_record(self, rec: RunRecord) -> Path:
        import yaml

        from .io import atomic_write_text

        return atomic_write_text(self.record_path,
                                 yaml.safe_dump(rec.to_json(), sort_keys=False))

    def metrics(self) -> list[MetricsLine]:
        """metrics.jsonl's lines, typed ([] when absent). A truncated last line is skipped;
        a line that is not a metrics line raises RecordError."""
        if not self.has_metrics:
            return []
        return [MetricsLine.from_json(x) for x in read_jsonl(self.metrics_path)]

    def metrics_json(self) -> list[dict[str, Any]]:
        """metrics.jsonl's lines as written ([] when absent; a truncated last line skipped)."""
        return read_jsonl(self.metrics_path) if self.has_metrics else []

    # ---- checkpoints
    def step_checkpoints(self) -> list[tuple[int, Path]]:
        """(step, path) of every `step_<N>.pt`, oldest first (temporaries ignored)."""
        return _numbered(self.checkpoints_dir, _STEP)

    def eval_checkpoints(self) -> list[tuple[int, Path]]:
        return _numbered(self.checkpoints_dir, _EVAL_STEP)

    def latest_step(self) -> int | None:
        found = self.step_checkpoints()
        return found[-1][0] if found else None

    def step_checkpoint(self, step: int) -> Path:
        return self.checkpoints_dir / f"step_{step}.pt"

    def eval_checkpoint(self, step: int) -> Path:
        """A checkpoint kept for evaluation outside the rotation (logging.keep_eval_checkpoints;
        it may not exist)."""
        return self.checkpoints_dir / f"eval_step_{step}.pt"

    def checkpoint(self) -> Path:
        """What an evaluator loads: `target` when a file was named, else final.pt, else the
        newest step_<N>.pt. FileNotFoundError (one line) when there is none."""
        if self.target is not None:
            if self.target.is_file():
                return self.target
            raise FileNotFoundError(f"no checkpoint at {self.target}")
        if self.final_checkpoint.is_file():
            return self.final_checkpoint
        steps = self.step_checkpoints()
        if steps:
            return steps[-1][1]
        raise FileNotFoundError(f"no checkpoint at {self.path} (looked for "
                                f"{CHECKPOINTS}/{FINAL_CHECKPOINT} and step_<N>.pt)")

    def final_or_target(self) -> Path:
        """`target` when a file was named, else final.pt (neither need exist): what the
        likelihood bound and the probe measure, a finished run's last weights only."""
        return self.target if self.target is not None else self.final_checkpoint

    # ---- eval files
    def eval_file(self, name: str) -> Path:
        return self.eval_dir / name

    def eval_files(self, pattern: str = "*.json") -> list[Path]:
        return sorted(self.eval_dir.glob(pattern)) if self.eval_dir.is_dir() else []

    def point_evaluated(self, step: int, spec_ids: Sequence[str]) -> bool:
        """Step `step` has an eval file (`eval/*.<spec_id>.step<N>.json`) for every spec_id."""
        return all(self.eval_files(f"*.{sid}.step{step}.json") for sid in spec_ids)

    def points_ready(self, spec_ids: Sequence[str]) -> list[tuple[int, Path]]:
        """Kept checkpoints without their eval files while the run trains (no final.pt),
        oldest first: what a point job may evaluate now (after final.pt, the chain's)."""
        if self.finished:
            return []
        return [(step, ck) for step, ck in self.eval_checkpoints()
                if not self.point_evaluated(step, spec_ids)]


# ------------------------------------------------------------------------------ sweeps
@dataclass(frozen=True)
class SweepDir:
    """results/sweeps/<name>/: a sweep's manifest, job folders and report."""

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @classmethod
    def of(cls, name: str, root: str | os.PathLike | None = None) -> SweepDir:
        return cls(sweeps_dir(root) / name)

    @staticmethod
    def names(root: str | os.PathLike | None = None) -> list[str]:
        return sorted(p.parent.name for p in sweeps_dir(root).glob(f"*/{_MANIFEST}"))

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def root(self) -> Path:
        return self.path.parent.parent

    @property
    def manifest_path(self) -> Path:
        return self.path / _MANIFEST

    @property
    def jobs_dir(self) -> Path:
        return self.path / "jobs"

    @property
    def lock_path(self) -> Path:
        """Held by the one driver of the sweep."""
        return self.path / ".lock"

    def points_record(self, cell: str) -> Path:
        return self.path / "points" / f"{cell}.json"

    @property
    def report_html(self) -> Path:
        return self.path / "report.html"

    @property
    def report_dir(self) -> Path:
        return self.path / "report"

    def exists(self) -> bool:
        return self.manifest_path.is_file()

    def manifest_json(self) -> dict[str, Any]:
        """manifest.json as written (FileNotFoundError when absent). The launcher replaces it
        atomically, so a running sweep's is always whole."""
        return json.loads(self.manifest_path.read_text(encoding="utf-8"))

    def manifest(self) -> Manifest:
        """manifest.json as a Manifest (FileNotFoundError when absent, RecordError when it
        is not a manifest this code reads)."""
        try:
            d = self.manifest_json()
        except json.JSONDecodeError as e:
            raise RecordError(f"{self.manifest_path}: not JSON ({e})") from None
        return Manifest.from_json(d, str(self.manifest_path))
