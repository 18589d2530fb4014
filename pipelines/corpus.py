"""`make corpus` / `python -m pipelines.corpus`: `python -m experiments.corpus` with its
tokenizing units submitted through the one launcher (docs/DATA.md): `--launcher local`, WORKERS
processes of this machine; `slurm`, a job array with the cluster file's `corpus` section. Bad
input (a bad cluster file too, before the scan starts): one line, exit 2, nothing written.
"""

from __future__ import annotations

import sys
from pathlib import Path

from common.errors import cli
from experiments.corpus.__main__ import parser
from experiments.corpus.__main__ import run as build_here
from sweeps.launcher import Launcher, make_launcher

JOBS = "slurm"
"""The corpus's submitit folder, inside the output directory (the job array's scripts and
logs; the build's own files never use this name)."""


def launcher_for(kind: str, out: str | Path, *, workers: int,
                 cluster: str | Path | None = None) -> Launcher:
    """The launcher a corpus build's units go through: WORKERS at once on this machine, or a
    SLURM job array with the cluster file's corpus settings. UsageError on a bad kind or file."""
    return make_launcher(kind, Path(out).expanduser().resolve() / JOBS, jobs=workers,
                         cluster_file=cluster or None, job_name="corpus")


def _main(argv: list[str] | None) -> int:
    ap = parser("python -m pipelines.corpus")
    ap.description = __doc__
    ap.add_argument("--launcher", choices=["local", "slurm"], default="local",
                    help="where the units run: local processes, or a SLURM job array")
    ap.add_argument("--cluster", default=None,
                    help="slurm: the cluster file (sweeps/cluster.example.yaml; default "
                         "FTBENCH_CLUSTER or sweeps/cluster.yaml)")
    a = ap.parse_args(argv)
    # a bad cluster file is refused here, before the scan starts
    return build_here(a, launcher_for(a.launcher, a.out, workers=a.workers, cluster=a.cluster))


def main(argv: list[str] | None = None) -> int:
    return cli("corpus", lambda: _main(argv))


if __name__ == "__main__":
    sys.exit(main())
